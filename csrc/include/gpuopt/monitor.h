// A device monitor: a C++ thread that reads a probe (the GPU's SM clock, clock-event reasons, compute
// processes) every interval_ms while a measurement runs. It is a C++ thread, not a Python one, so it
// never competes with the timed loop for the GIL.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gpuopt/nvml.h"
#include "gpuopt/sampler.h"

namespace gpuopt {

// What a probe reads at one instant; a field stays empty where the query failed or is unsupported.
// A new quantity (e.g. NVML's total energy counter) is one more field here, read in NvmlProbe::read
// and summarised in Monitor::summary.
struct DeviceReading {
  std::optional<std::uint32_t> sm_mhz;
  std::optional<std::uint32_t> max_sm_mhz;
  std::optional<std::uint64_t> clock_event_reasons;  // nvml::kClockEventReasons bits
  std::optional<std::uint32_t> compute_processes;
  std::optional<std::uint32_t> power_mw;  // the power draw
};

class Probe {
 public:
  virtual ~Probe() = default;
  // Called from the monitor's thread only, one call at a time.
  virtual DeviceReading read() = 0;
};

// Reads one NVML device. The max SM clock is a fixed property: asked until it answers, then cached.
class NvmlProbe final : public Probe {
 public:
  explicit NvmlProbe(nvml::Device device) : device_(std::move(device)) {}
  DeviceReading read() override;

 private:
  nvml::Device device_;
  std::optional<std::uint32_t> max_sm_mhz_;
};

// NVML's total energy counter of one device, for run_sampler's timed region.
class NvmlEnergyMeter final : public EnergyMeter {
 public:
  explicit NvmlEnergyMeter(nvml::Device device) : device_(std::move(device)) {}
  std::optional<double> read_j() override {
    const std::optional<std::uint64_t> mj = device_.total_energy_mj();
    if (!mj) return std::nullopt;
    return static_cast<double>(*mj) / 1e3;
  }
  const nvml::Device& device() const { return device_; }

 private:
  nvml::Device device_;
};

struct TimedReading {
  double t_s = 0;  // when the read began, in seconds since Monitor::start()
  DeviceReading reading;
};

struct MonitorSummary {
  std::size_t samples = 0;  // readings summarised
  // A clock the GPU really ran at (the upper middle reading), and the lowest; empty without readings
  // of the SM clock.
  std::optional<std::uint32_t> sm_mhz_median, sm_mhz_min;
  std::optional<std::uint32_t> max_sm_mhz;
  std::uint64_t clock_event_reasons = 0;      // every bit seen
  std::vector<std::string> throttle_reasons;  // the bits worth naming, by name
  std::uint32_t compute_processes = 0;        // most seen at once
  // Power: the mean of the readings, and their integral over time (trapezoids between readings) with
  // the span it covers -- the energy estimate where a GPU has no energy counter. Empty without at
  // least one (mean) or two (integral) power readings.
  std::optional<double> power_w_mean;
  std::optional<double> power_energy_j;
  double power_span_s = 0;
  std::size_t power_samples = 0;
};

// Summary of the readings taken at t_s >= skip_s (the warm-up skipped), or of the last reading when
// none was; empty without readings.
std::optional<MonitorSummary> summarize_readings(const std::vector<TimedReading>& readings, double skip_s);

class Monitor {
 public:
  // interval_ms > 0 between reads; stop() waits at most stop_timeout_ms for the thread.
  explicit Monitor(std::shared_ptr<Probe> probe, double interval_ms = 100.0, double stop_timeout_ms = 2000.0);
  ~Monitor();  // stop()
  Monitor(const Monitor&) = delete;
  Monitor& operator=(const Monitor&) = delete;

  // Starts the thread, which reads at once and then every interval_ms. Once per monitor.
  void start();
  // Stops the thread and joins it. Idempotent. Returns false when the thread did not end within
  // stop_timeout_ms (a probe stuck in the driver): it is then detached and keeps the probe and the
  // readings alive until its read in progress, the last one, returns.
  bool stop();

  std::vector<TimedReading> readings() const;
  std::optional<MonitorSummary> summary(double skip_s) const {
    return summarize_readings(readings(), skip_s);
  }
  // What the probe threw, which ended the readings; empty when it threw nothing.
  std::string error() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
  std::thread thread_;
  double stop_timeout_ms_;
};

}  // namespace gpuopt
