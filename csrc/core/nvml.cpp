#include "gpuopt/nvml.h"

#include <dlfcn.h>

#include <utility>

namespace gpuopt::nvml {
namespace {

template <typename Fn>
void assign(Fn& fn, void* symbol) {
  fn = reinterpret_cast<Fn>(symbol);
}

// The first of `names` that `resolve` finds.
void* first_of(const Library::Resolver& resolve, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (void* p = resolve(name)) return p;
  }
  return nullptr;
}

}  // namespace

std::vector<std::string> clock_event_reason_names(std::uint64_t mask) {
  std::vector<std::string> out;
  for (const ReasonName& r : kClockEventReasons) {
    if (mask & r.bit) out.emplace_back(r.name);
  }
  return out;
}

Library::Library(const Resolver& resolve, std::string origin) {
  struct Required {
    const char* name;
    void* symbol;
  };
  const Required required[] = {
      {"nvmlInit_v2", resolve("nvmlInit_v2")},
      {"nvmlDeviceGetHandleByUUID", resolve("nvmlDeviceGetHandleByUUID")},
      {"nvmlDeviceGetHandleByIndex_v2", resolve("nvmlDeviceGetHandleByIndex_v2")},
      {"nvmlDeviceGetClockInfo", resolve("nvmlDeviceGetClockInfo")},
      {"nvmlDeviceGetMaxClockInfo", resolve("nvmlDeviceGetMaxClockInfo")},
  };
  for (const Required& r : required) {
    if (r.symbol == nullptr) {
      reason_ = origin + " has no " + r.name + " (not NVML, or a driver too old)";
      return;
    }
  }
  assign(fns_.init_v2, required[0].symbol);
  assign(fns_.handle_by_uuid, required[1].symbol);
  assign(fns_.handle_by_index_v2, required[2].symbol);
  assign(fns_.clock_info, required[3].symbol);
  assign(fns_.max_clock_info, required[4].symbol);
  assign(fns_.error_string, resolve("nvmlErrorString"));
  assign(fns_.clock_event_reasons, first_of(resolve, {"nvmlDeviceGetCurrentClocksEventReasons",
                                                    "nvmlDeviceGetCurrentClocksThrottleReasons"}));
  assign(fns_.compute_processes,
       first_of(resolve, {"nvmlDeviceGetComputeRunningProcesses_v3",
                          "nvmlDeviceGetComputeRunningProcesses_v2",
                          "nvmlDeviceGetComputeRunningProcesses"}));
  assign(fns_.total_energy, resolve("nvmlDeviceGetTotalEnergyConsumption"));
  assign(fns_.power_usage, resolve("nvmlDeviceGetPowerUsage"));
  assign(fns_.power_limit, resolve("nvmlDeviceGetEnforcedPowerLimit"));
  const Return status = fns_.init_v2();
  if (status != kSuccess) {
    reason_ = "nvmlInit_v2 failed in " + origin + ": " + describe(status);
    fns_ = Functions{};
  }
}

std::shared_ptr<const Library> Library::open(const std::string& path) {
  dlerror();  // clear a stale message
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    return std::shared_ptr<const Library>(
        new Library("cannot load " + path + ": " + (why != nullptr ? why : "dlopen failed")));
  }
  // Never dlclose'd: a loaded NVML stays for the life of the process.
  return std::make_shared<const Library>([lib](const char* symbol) { return dlsym(lib, symbol); }, path);
}

std::shared_ptr<const Library> Library::system() {
  static const std::shared_ptr<const Library> instance = open("libnvidia-ml.so.1");
  return instance;
}

std::string Library::describe(Return status) const {
  const char* text = fns_.error_string != nullptr ? fns_.error_string(status) : nullptr;
  return text != nullptr ? std::string(text) + " (" + std::to_string(status) + ")"
                         : "NVML status " + std::to_string(status);
}

Device Device::open(std::shared_ptr<const Library> library, const std::string& uuid, std::int64_t index) {
  Device d;
  d.library_ = std::move(library);
  if (!d.library_ || !d.library_->active()) {
    d.reason_ = d.library_ ? d.library_->reason() : "no NVML library";
    return d;
  }
  const Functions& f = d.library_->functions();
  std::string why;
  if (!uuid.empty()) {
    const Return status = f.handle_by_uuid(uuid.c_str(), &d.handle_);
    if (status == kSuccess && d.handle_ != nullptr) return d;
    d.handle_ = nullptr;
    why = "no device with UUID " + uuid + " (" + d.library_->describe(status) + ")";
  }
  if (index >= 0) {
    const Return status = f.handle_by_index_v2(static_cast<unsigned>(index), &d.handle_);
    if (status == kSuccess && d.handle_ != nullptr) return d;
    d.handle_ = nullptr;
    why += (why.empty() ? "" : "; ") + std::string("no device with index ") + std::to_string(index) + " (" +
           d.library_->describe(status) + ")";
  }
  d.reason_ = why.empty() ? "neither a UUID nor an index was given" : why;
  return d;
}

std::optional<std::uint32_t> Device::sm_clock_mhz() const {
  unsigned mhz = 0;
  if (!active() || library_->functions().clock_info(handle_, kClockSm, &mhz) != kSuccess) {
    return std::nullopt;
  }
  return mhz;
}

std::optional<std::uint32_t> Device::max_sm_clock_mhz() const {
  unsigned mhz = 0;
  if (!active() || library_->functions().max_clock_info(handle_, kClockSm, &mhz) != kSuccess) {
    return std::nullopt;
  }
  return mhz;
}

std::optional<std::uint64_t> Device::clock_event_reasons() const {
  if (!active() || library_->functions().clock_event_reasons == nullptr) return std::nullopt;
  unsigned long long mask = 0;
  if (library_->functions().clock_event_reasons(handle_, &mask) != kSuccess) return std::nullopt;
  return static_cast<std::uint64_t>(mask);
}

std::optional<std::uint32_t> Device::compute_processes() const {
  if (!active() || library_->functions().compute_processes == nullptr) return std::nullopt;
  unsigned count = 0;
  const Return status = library_->functions().compute_processes(handle_, &count, nullptr);
  // Success: none (count stays 0); insufficient size: count is how many there are.
  if (status != kSuccess && status != kErrorInsufficientSize) return std::nullopt;
  return count;
}

std::optional<std::uint64_t> Device::total_energy_mj() const {
  if (!active() || library_->functions().total_energy == nullptr) return std::nullopt;
  unsigned long long mj = 0;
  if (library_->functions().total_energy(handle_, &mj) != kSuccess) return std::nullopt;
  return static_cast<std::uint64_t>(mj);
}

std::optional<std::uint32_t> Device::power_mw() const {
  if (!active() || library_->functions().power_usage == nullptr) return std::nullopt;
  unsigned mw = 0;
  if (library_->functions().power_usage(handle_, &mw) != kSuccess) return std::nullopt;
  return mw;
}

std::optional<std::uint32_t> Device::power_limit_mw() const {
  if (!active() || library_->functions().power_limit == nullptr) return std::nullopt;
  unsigned mw = 0;
  if (library_->functions().power_limit(handle_, &mw) != kSuccess) return std::nullopt;
  return mw;
}

}  // namespace gpuopt::nvml
