#include "gpuopt/monitor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <iterator>
#include <mutex>
#include <utility>

#include "gpuopt/errors.h"

namespace gpuopt {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

DeviceReading NvmlProbe::read() {
  DeviceReading r;
  r.sm_mhz = device_.sm_clock_mhz();
  if (!max_sm_mhz_) max_sm_mhz_ = device_.max_sm_clock_mhz();
  r.max_sm_mhz = max_sm_mhz_;
  r.clock_event_reasons = device_.clock_event_reasons();
  r.compute_processes = device_.compute_processes();
  r.power_mw = device_.power_mw();
  return r;
}

// Shared by the monitor and its thread, so that a thread detached by a timed-out stop() still has it.
struct Monitor::State {
  std::shared_ptr<Probe> probe;
  Clock::duration interval{};
  Clock::time_point t0;
  mutable std::mutex mutex;
  std::condition_variable cv;
  bool stop_requested = false;  // guarded by mutex, like everything below
  bool done = false;
  std::vector<TimedReading> readings;
  std::string error;

  // The thread: a reading at once, then one per interval until stop() or the probe throws.
  // Exceptions never leave the thread.
  void sample_until_stopped() {
    Clock::time_point next = Clock::now();
    std::unique_lock<std::mutex> lock(mutex);
    while (!stop_requested) {
      lock.unlock();
      TimedReading r;
      r.t_s = std::chrono::duration<double>(Clock::now() - t0).count();
      std::string failure;
      try {
        r.reading = probe->read();
      } catch (const std::exception& e) {
        failure = e.what();
      } catch (...) {
        failure = "the probe threw a non-standard exception";
      }
      lock.lock();
      if (!failure.empty()) {
        error = failure;
        break;
      }
      readings.push_back(r);
      // Keep the cadence; a probe slower than the interval is read again one interval later.
      next += interval;
      if (next < Clock::now()) next = Clock::now() + interval;
      cv.wait_until(lock, next, [this] { return stop_requested; });
    }
    done = true;
    cv.notify_all();
  }
};

Monitor::Monitor(std::shared_ptr<Probe> probe, double interval_ms, double stop_timeout_ms)
    : state_(std::make_shared<State>()), stop_timeout_ms_(stop_timeout_ms) {
  GPUOPT_CHECK_VALUE(probe != nullptr, "a monitor needs a probe, got none");
  GPUOPT_CHECK_VALUE(std::isfinite(interval_ms) && interval_ms > 0.0,
                     "interval_ms must be a finite number of milliseconds > 0, got ", interval_ms);
  GPUOPT_CHECK_VALUE(std::isfinite(stop_timeout_ms) && stop_timeout_ms > 0.0,
                     "stop_timeout_ms must be a finite number of milliseconds > 0, got ", stop_timeout_ms);
  state_->probe = std::move(probe);
  state_->interval =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(interval_ms));
}

Monitor::~Monitor() { stop(); }

void Monitor::start() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  GPUOPT_CHECK(!thread_.joinable() && !state_->stop_requested, "a monitor can be started once only");
  state_->t0 = Clock::now();
  thread_ = std::thread([s = state_] { s->sample_until_stopped(); });
}

bool Monitor::stop() {
  std::unique_lock<std::mutex> lock(state_->mutex);
  state_->stop_requested = true;
  if (!thread_.joinable()) return true;
  state_->cv.notify_all();
  const bool done = state_->cv.wait_for(lock, std::chrono::duration<double, std::milli>(stop_timeout_ms_),
                                        [this] { return state_->done; });
  lock.unlock();
  if (done) {
    thread_.join();  // the thread has nothing left to do but return
  } else {
    thread_.detach();
  }
  return done;
}

std::vector<TimedReading> Monitor::readings() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->readings;
}

std::string Monitor::error() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->error;
}

std::optional<MonitorSummary> summarize_readings(const std::vector<TimedReading>& all, double skip_s) {
  if (all.empty()) return std::nullopt;
  std::vector<TimedReading> kept;
  std::copy_if(all.begin(), all.end(), std::back_inserter(kept),
               [skip_s](const TimedReading& r) { return r.t_s >= skip_s; });
  if (kept.empty()) kept.push_back(all.back());
  MonitorSummary out;
  out.samples = kept.size();
  std::vector<std::uint32_t> mhz;
  for (const TimedReading& t : kept) {
    const DeviceReading& r = t.reading;
    if (r.sm_mhz) mhz.push_back(*r.sm_mhz);
    if (r.max_sm_mhz) out.max_sm_mhz = std::max(out.max_sm_mhz.value_or(0), *r.max_sm_mhz);
    out.clock_event_reasons |= r.clock_event_reasons.value_or(0);
    out.compute_processes = std::max(out.compute_processes, r.compute_processes.value_or(0));
  }
  if (!mhz.empty()) {
    std::sort(mhz.begin(), mhz.end());
    out.sm_mhz_median = mhz[mhz.size() / 2];
    out.sm_mhz_min = mhz.front();
  }
  out.throttle_reasons = nvml::clock_event_reason_names(out.clock_event_reasons);
  std::vector<std::pair<double, double>> power;  // (t_s, W)
  for (const TimedReading& t : kept) {
    if (t.reading.power_mw) power.emplace_back(t.t_s, *t.reading.power_mw / 1e3);
  }
  out.power_samples = power.size();
  if (!power.empty()) {
    double sum = 0;
    for (const auto& p : power) sum += p.second;
    out.power_w_mean = sum / static_cast<double>(power.size());
  }
  if (power.size() >= 2) {
    double joules = 0;
    for (std::size_t i = 1; i < power.size(); ++i) {
      joules += 0.5 * (power[i].second + power[i - 1].second) * (power[i].first - power[i - 1].first);
    }
    out.power_energy_j = joules;
    out.power_span_s = power.back().first - power.front().first;
  }
  return out;
}

}  // namespace gpuopt
