// NVML, loaded at run time: dlopen("libnvidia-ml.so.1") with our own minimal declarations (no nvml.h,
// no link-time dependency), so gpuopt builds without the driver's headers and runs where the driver
// is missing. Nothing here throws for an absent library, driver or device: they make the library or
// the device inactive, with a reason. Every query is thread-safe (NVML's own guarantee) and returns
// nullopt where the device or driver does not support it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace gpuopt::nvml {

// NVML's C ABI as far as we use it: nvmlReturn_t and nvmlClockType_t are C enums (int), nvmlDevice_t
// an opaque pointer.
using Return = int;
using Handle = void*;
inline constexpr Return kSuccess = 0;
inline constexpr Return kErrorInsufficientSize = 7;
inline constexpr int kClockSm = 1;  // NVML_CLOCK_SM

// The clock-event (throttle) reasons worth naming; idle, application-clock and display settings are
// not problems of a measurement.
struct ReasonName {
  std::uint64_t bit;
  const char* name;
};
inline constexpr ReasonName kClockEventReasons[] = {
    {0x4, "sw_power_cap"}, {0x8, "hw_slowdown"}, {0x20, "sw_thermal"}, {0x40, "hw_thermal"},
    {0x80, "hw_power_brake"}};
// Names of the bits of `mask` listed in kClockEventReasons, in that order.
std::vector<std::string> clock_event_reason_names(std::uint64_t mask);

// The NVML entry points gpuopt calls. Optional ones (absent in old drivers) may be null.
struct Functions {
  Return (*init_v2)() = nullptr;
  const char* (*error_string)(Return) = nullptr;
  Return (*handle_by_uuid)(const char* uuid, Handle* device) = nullptr;
  Return (*handle_by_index_v2)(unsigned index, Handle* device) = nullptr;
  Return (*clock_info)(Handle device, int clock_type, unsigned* mhz) = nullptr;
  Return (*max_clock_info)(Handle device, int clock_type, unsigned* mhz) = nullptr;
  // nvmlDeviceGetCurrentClocksEventReasons (driver >= 535), else ...ClocksThrottleReasons.
  Return (*clock_event_reasons)(Handle device, unsigned long long* mask) = nullptr;
  // nvmlDeviceGetComputeRunningProcesses_v3, _v2 or unversioned: called with a count of 0 and a null
  // array only, so the process-info struct (whose layout changed between versions) is never touched.
  Return (*compute_processes)(Handle device, unsigned* count, void* infos) = nullptr;
  // Energy and power (Volta and later; older GPUs answer NotSupported): the energy used since the driver
  // loaded, in millijoules; the current power draw and the enforced power limit, in milliwatts.
  Return (*total_energy)(Handle device, unsigned long long* mj) = nullptr;
  Return (*power_usage)(Handle device, unsigned* mw) = nullptr;
  Return (*power_limit)(Handle device, unsigned* mw) = nullptr;
};

class Library {
 public:
  using Resolver = std::function<void*(const char* symbol)>;

  // The process's NVML: libnvidia-ml.so.1 loaded and initialised on first use, never unloaded (NVML
  // reference-counts nvmlInit, so other users in the process, e.g. pynvml, are unaffected).
  static std::shared_ptr<const Library> system();
  // Loads `path` with dlopen; for tests and for a library outside the loader's search path.
  static std::shared_ptr<const Library> open(const std::string& path);
  // Entry points looked up through `resolve` (tests inject fakes); `origin` names them in reasons.
  Library(const Resolver& resolve, std::string origin);

  bool active() const { return reason_.empty(); }
  const std::string& reason() const { return reason_; }  // why inactive; empty when active
  const Functions& functions() const { return fns_; }
  // "NVML_ERROR_..." text of a status, or its number.
  std::string describe(Return status) const;

 private:
  explicit Library(std::string reason) : reason_(std::move(reason)) {}
  Functions fns_;
  std::string reason_;
};

// One GPU as NVML sees it.
class Device {
 public:
  // By UUID ("GPU-<uuid>", as torch reports it with the prefix added; empty to skip), else by NVML
  // index (skipped when < 0). NVML indexes ignore CUDA_VISIBLE_DEVICES, hence the UUID first.
  static Device open(std::shared_ptr<const Library> library, const std::string& uuid, std::int64_t index);

  bool active() const { return handle_ != nullptr; }
  const std::string& reason() const { return reason_; }  // why inactive; empty when active

  std::optional<std::uint32_t> sm_clock_mhz() const;
  std::optional<std::uint32_t> max_sm_clock_mhz() const;
  std::optional<std::uint64_t> clock_event_reasons() const;  // bitmask, see kClockEventReasons
  std::optional<std::uint32_t> compute_processes() const;    // processes with a compute context
  std::optional<std::uint64_t> total_energy_mj() const;      // energy counter since the driver loaded
  std::optional<std::uint32_t> power_mw() const;             // power draw now (NVML averages ~1 s on some GPUs)
  std::optional<std::uint32_t> power_limit_mw() const;       // the enforced power limit

 private:
  std::shared_ptr<const Library> library_;
  Handle handle_ = nullptr;
  std::string reason_;
};

}  // namespace gpuopt::nvml
