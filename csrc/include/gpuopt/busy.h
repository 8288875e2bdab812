// Which device each executor of a server serves, and busy time per device: a server over several
// devices has `instances` executors per device pulling from one BatchQueue, so a batch goes to the
// first executor that is free -- least-loaded dispatch, a slow or loaded device takes fewer batches.
//
// A device is busy while at least one of its executors has a batch in service; the server is busy
// while any device is. One mutex for both, taken once when a batch starts and once when it ends (the
// same as a single-device server's one busy counter). No CUDA, no torch here.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <vector>

namespace gpuopt::serve {

// The device of each executor: `instances` (>= 1) per device of `devices` (distinct, non-empty),
// interleaved -- executor i serves devices[i % devices.size()] -- so the executors that start first
// cover every device. kValue error naming the argument otherwise.
std::vector<std::int64_t> executor_devices(const std::vector<std::int64_t>& devices, std::int64_t instances);

class BusyClock {
 public:
  using Clock = std::chrono::steady_clock;

  explicit BusyClock(std::size_t devices);  // devices >= 1: slots 0 .. devices-1

  void begin(std::size_t slot);  // a batch starts on the device in `slot`
  void end(std::size_t slot);    // it ended (counted as one batch of that device)

  struct Reading {
    double any_s = 0;                  // time with a batch in service on any device
    std::vector<double> device_s;      // per slot: time with a batch in service there
    std::vector<std::int64_t> batches;  // per slot: batches ended
  };
  Reading read() const;  // batches in service now count up to now
  std::size_t devices() const { return active_.size(); }

 private:
  mutable std::mutex mu_;
  std::int64_t active_any_ = 0;
  Clock::time_point since_any_{};
  double any_s_ = 0;
  std::vector<std::int64_t> active_;
  std::vector<Clock::time_point> since_;
  std::vector<double> device_s_;
  std::vector<std::int64_t> batches_;
};

}  // namespace gpuopt::serve
