// The sampling loop shared by every timing mode: warm-up by count and by time, then samples until the
// confidence interval of the median is tight enough, a fixed count is reached, or the time budget
// runs out. What one sample is (CUDA events, a block of pipelined calls, a graph replay, the host
// clock) is the SampleSource's business; the loop knows only clocks and statistics.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gpuopt/stats.h"

namespace gpuopt {

// The defaults below are gpuopt's measure() defaults, defined nowhere else (_C.measure_defaults()).
struct SamplerOptions {
  std::int64_t warmup_iters = 3;  // at least this many warm-up calls ...
  double warmup_s = 0.05;         // ... and at least this long (capped by warmup_max_iters)
  std::int64_t warmup_max_iters = 1000;
  std::int64_t iters = 0;         // > 0: exactly this many samples, no adaptive stop
  std::int64_t min_iters = 10;
  std::int64_t max_iters = 100000;
  double min_time_s = 0.1;        // adaptive stops only after sampling this long (spans drift)
  double max_time_s = 10.0;       // budget for sampling (warm-up not included)
  // Stop when the CI of the median is within +-this of the median (stats::meets_target).
  double target_rel_ci = stats::kDefaultTargetRelCi;
  double confidence = stats::kDefaultConfidence;
};

// Throws gpuopt::Error(kValue) naming the offending option and what is allowed.
void validate(const SamplerOptions& options);

struct Sample {
  double ms = 0;          // the timed quantity, per call
  double enqueue_ms = 0;  // host time spent issuing the call(s), per call
};

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  // One warm-up call (results ignored). Returns the host time it took, in ms.
  virtual double warmup() = 0;
  // Called once between warm-up and sampling, e.g. to size blocks from what warm-up saw.
  virtual void calibrate() {}
  virtual Sample sample() = 0;
  // Called once after the last sample, also when sampling stopped by an exception.
  virtual void finish() noexcept {}
};

// An energy counter read at the edges of the timed region (NVML's total energy on a GPU). The counter
// advances in steps (every 10-100 ms, by GPU); see run_sampler for how the region is aligned to them.
class EnergyMeter {
 public:
  virtual ~EnergyMeter() = default;
  // Joules since some fixed origin; empty when the counter cannot be read.
  virtual std::optional<double> read_j() = 0;
};

// The energy of a timed region, as measured by an EnergyMeter.
struct EnergyReading {
  std::optional<double> joules;  // empty: not measured (reason says why)
  double window_s = 0;           // the span the joules cover
  bool aligned = false;          // both ends at a step of the counter (exact up to the polling interval)
  std::string reason;            // why empty, or what limits the figure
};

struct SamplerResult {
  std::vector<double> ms;
  std::vector<double> enqueue_ms;
  std::int64_t warmup_iters = 0;
  double warmup_s = 0;
  double sampling_s = 0;
  bool target_met = false;
  std::string stop_reason;  // "target", "iters", "max_time", "max_iters"
  std::optional<EnergyReading> energy;  // with a meter only
};

// With a meter: before sampling, the meter is polled until its counter steps (at most kEnergyEdgeWaitS),
// and sampling starts at that step; an adaptive run samples at least min_energy_s (options: the longer
// of it and min_time_s, within max_time_s) and, once it would stop, samples on until the counter steps
// again (at most kEnergyEdgeWaitS more), so that the counter's difference is the energy of exactly the
// sampled span. A fixed-iteration run (iters > 0) is not extended: its end is not aligned, which the
// reading says. A counter that did not advance over a span longer than kEnergyEdgeWaitS gives no joules
// (never 0 J), with the reason.
inline constexpr double kEnergyEdgeWaitS = 0.25;
SamplerResult run_sampler(SampleSource& source, const SamplerOptions& options, EnergyMeter* meter = nullptr,
                          double min_energy_s = 0.0);

}  // namespace gpuopt
