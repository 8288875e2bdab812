#include "gpuopt/busy.h"

#include <algorithm>

#include "gpuopt/errors.h"

namespace gpuopt::serve {

std::vector<std::int64_t> executor_devices(const std::vector<std::int64_t>& devices, std::int64_t instances) {
  GPUOPT_CHECK_VALUE(!devices.empty(), "devices must name at least one device, got none");
  GPUOPT_CHECK_VALUE(instances >= 1, "instances must be >= 1 per device, got ", instances);
  for (std::size_t i = 0; i < devices.size(); ++i) {
    GPUOPT_CHECK_VALUE(devices[i] >= 0, "devices must be device indices >= 0, got ", devices[i]);
    GPUOPT_CHECK_VALUE(std::find(devices.begin(), devices.begin() + static_cast<std::ptrdiff_t>(i), devices[i]) ==
                           devices.begin() + static_cast<std::ptrdiff_t>(i),
                       "devices must be distinct, got ", devices[i], " twice");
  }
  std::vector<std::int64_t> out;
  out.reserve(devices.size() * static_cast<std::size_t>(instances));
  for (std::int64_t k = 0; k < instances; ++k) out.insert(out.end(), devices.begin(), devices.end());
  return out;
}

BusyClock::BusyClock(std::size_t devices)
    : active_(devices, 0), since_(devices), device_s_(devices, 0.0), batches_(devices, 0) {
  GPUOPT_CHECK_VALUE(devices >= 1, "BusyClock: devices must be >= 1, got ", devices);
}

void BusyClock::begin(std::size_t slot) {
  const Clock::time_point now = Clock::now();
  const std::lock_guard<std::mutex> lock(mu_);
  GPUOPT_CHECK(slot < active_.size(), "BusyClock: slot ", slot, " out of ", active_.size());
  if (active_any_++ == 0) since_any_ = now;
  if (active_[slot]++ == 0) since_[slot] = now;
}

void BusyClock::end(std::size_t slot) {
  const Clock::time_point now = Clock::now();
  const std::lock_guard<std::mutex> lock(mu_);
  GPUOPT_CHECK(slot < active_.size() && active_[slot] > 0, "BusyClock: end(", slot, ") without begin");
  if (--active_any_ == 0) any_s_ += std::chrono::duration<double>(now - since_any_).count();
  if (--active_[slot] == 0) device_s_[slot] += std::chrono::duration<double>(now - since_[slot]).count();
  ++batches_[slot];
}

BusyClock::Reading BusyClock::read() const {
  const Clock::time_point now = Clock::now();
  const std::lock_guard<std::mutex> lock(mu_);
  Reading r;
  r.any_s = any_s_ + (active_any_ > 0 ? std::chrono::duration<double>(now - since_any_).count() : 0.0);
  r.device_s = device_s_;
  for (std::size_t i = 0; i < active_.size(); ++i) {
    if (active_[i] > 0) r.device_s[i] += std::chrono::duration<double>(now - since_[i]).count();
  }
  r.batches = batches_;
  return r;
}

}  // namespace gpuopt::serve
