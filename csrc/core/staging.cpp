#include "gpuopt/staging.h"

#include <chrono>
#include <cmath>
#include <utility>
#include <vector>

#include "gpuopt/errors.h"

namespace gpuopt {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

Clock::time_point deadline_after(double timeout_s) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
}

}  // namespace

StagingWorker::StagingWorker(std::string name, std::int64_t depth) : name_(std::move(name)), depth_(depth) {
  GPUOPT_CHECK_VALUE(depth >= 1 && depth <= kMaxStagingDepth, name_, ": depth must be in [1, ", kMaxStagingDepth,
                     "], got ", depth);
  thread_ = std::thread([this] { run(); });
}

StagingWorker::~StagingWorker() { close(); }

void StagingWorker::check_timeout(double timeout_s, const char* call) const {
  GPUOPT_CHECK_VALUE(timeout_s > 0 && timeout_s <= kMaxStagingTimeoutS, name_, ".", call,
                     ": timeout_s must be > 0 and <= ", kMaxStagingTimeoutS, " seconds, got ", timeout_s);
}

std::int64_t StagingWorker::in_flight_locked() const {
  return static_cast<std::int64_t>(pending_.size() + ready_.size()) + (staging_ ? 1 : 0);
}

void StagingWorker::submit(std::unique_ptr<StagingJob> job, double timeout_s) {
  check_timeout(timeout_s, "submit");
  GPUOPT_CHECK(job != nullptr, name_, ".submit: no job");
  std::unique_lock<std::mutex> lock(mu_);
  const bool room = changed_.wait_until(lock, deadline_after(timeout_s),
                                        [this] { return closed_ || in_flight_locked() < depth_; });
  GPUOPT_CHECK_VALUE(!closed_, name_, " is closed; create a new one");
  GPUOPT_CHECK(room, name_, ".submit: no room within timeout_s=", timeout_s, ": depth=", depth_,
               " batches are in flight and none was taken. Call next() (from this or another thread) before "
               "submitting more, or raise timeout_s");
  pending_.push_back(Entry{std::move(job), nullptr});
  ++stats_.submitted;
  lock.unlock();
  changed_.notify_all();
}

std::unique_ptr<StagingJob> StagingWorker::next(double timeout_s) {
  check_timeout(timeout_s, "next");
  const auto t0 = Clock::now();
  Entry e;
  {
    std::unique_lock<std::mutex> lock(mu_);
    GPUOPT_CHECK_VALUE(!closed_, name_, " is closed; create a new one");
    GPUOPT_CHECK_VALUE(in_flight_locked() > 0, name_, ".next: nothing was submitted (submit a batch first)");
    const bool staged =
        changed_.wait_until(lock, deadline_after(timeout_s), [this] { return closed_ || !ready_.empty(); });
    stats_.wait_ms += ms_since(t0);
    GPUOPT_CHECK_VALUE(!closed_, name_, " was closed while next() waited");
    GPUOPT_CHECK(staged, name_, ".next: no batch was staged within timeout_s=", timeout_s, " (", in_flight_locked(),
                 " in flight, the oldest still ", staging_ ? "being staged" : "queued",
                 "). Raise timeout_s if staging a batch legitimately takes this long");
    e = std::move(ready_.front());
    ready_.pop_front();
    ++stats_.delivered;
  }
  changed_.notify_all();
  if (e.error) std::rethrow_exception(e.error);  // e.job is destroyed here, on the consumer's thread
  return std::move(e.job);
}

void StagingWorker::close() noexcept {
  std::lock_guard<std::mutex> closing(close_mu_);
  std::vector<Entry> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    for (auto* queue : {&pending_, &ready_}) {
      for (Entry& e : *queue) dropped.push_back(std::move(e));
      queue->clear();
    }
  }
  changed_.notify_all();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) {
    try {
      thread_.join();
    } catch (...) {
      // join fails only for a thread that is not joinable, which was checked.
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Entry& e : ready_) dropped.push_back(std::move(e));  // staged while closing
    ready_.clear();
    stats_.cancelled += static_cast<std::int64_t>(dropped.size());
  }
  // `dropped` is destroyed here, on the closing thread, outside the lock.
}

void StagingWorker::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    changed_.wait(lock, [this] { return closed_ || !pending_.empty(); });
    if (closed_) return;
    Entry e = std::move(pending_.front());
    pending_.pop_front();
    staging_ = true;
    lock.unlock();
    const auto t0 = Clock::now();
    try {
      e.job->stage();
    } catch (...) {
      e.error = std::current_exception();
    }
    lock.lock();
    staging_ = false;
    stats_.stage_ms += ms_since(t0);
    if (e.error) ++stats_.failed;
    ready_.push_back(std::move(e));  // handed to the consumer side, never destroyed here
    changed_.notify_all();
  }
}

bool StagingWorker::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

std::int64_t StagingWorker::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_flight_locked();
}

StagingStats StagingWorker::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace gpuopt
