#include "gpuopt/batcher.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <thread>
#include <utility>

#include "gpuopt/errors.h"

namespace gpuopt::serve {
namespace {

constexpr std::int64_t kMaxPriorityLevels = 64;
// A longer next_batch() timeout waits this long (about three years): it keeps the deadline's
// arithmetic far from the clock's range.
constexpr double kMaxWaitS = 1e8;
// The largest idle_spin_us: polling longer than 0.1 s gains nothing over the condition variable.
constexpr std::int64_t kMaxIdleSpinUs = 100000;

// t + us, saturating at the clock's end (a delay or timeout of years must not wrap around).
Clock::time_point after_us(Clock::time_point t, std::int64_t us) {
  using std::chrono::microseconds;
  const auto room = std::chrono::duration_cast<microseconds>(Clock::time_point::max() - t).count();
  if (us >= room) return Clock::time_point::max();
  return t + std::chrono::duration_cast<Clock::duration>(microseconds(us));
}

// The request's timeout in microseconds, 0 for none.
std::int64_t timeout_us_of(const QueuedRequest& r, std::int64_t default_timeout_us) {
  return r.timeout_us == -1 ? default_timeout_us : r.timeout_us;
}

// Min-heap on the deadline.
template <typename E>
bool later(const E& a, const E& b) {
  return a.deadline > b.deadline;
}

void check_strictly_increasing(const std::vector<std::int64_t>& v, const char* field) {
  for (std::size_t i = 1; i < v.size(); ++i) {
    GPUOPT_CHECK_VALUE(v[i] > v[i - 1], field, " must be strictly increasing, got ", v[i], " after ", v[i - 1],
                       " at index ", i);
  }
}

}  // namespace

void validate(const BatcherOptions& o) {
  GPUOPT_CHECK_VALUE(o.max_batch_size >= 1, "max_batch_size must be >= 1, got ", o.max_batch_size);
  GPUOPT_CHECK_VALUE(o.max_queue_delay_us >= 0, "max_queue_delay_us must be >= 0, got ", o.max_queue_delay_us);
  for (std::size_t i = 0; i < o.preferred_batch_sizes.size(); ++i) {
    const std::int64_t p = o.preferred_batch_sizes[i];
    GPUOPT_CHECK_VALUE(p >= 1 && p <= o.max_batch_size, "preferred_batch_sizes[", i,
                       "] must be in [1, max_batch_size=", o.max_batch_size, "], got ", p);
  }
  check_strictly_increasing(o.preferred_batch_sizes, "preferred_batch_sizes");
  for (std::size_t i = 0; i < o.buckets.size(); ++i) {
    GPUOPT_CHECK_VALUE(o.buckets[i] > 0, "buckets[", i, "] must be > 0, got ", o.buckets[i]);
  }
  check_strictly_increasing(o.buckets, "buckets");
  GPUOPT_CHECK_VALUE(o.max_queue_size >= 0, "max_queue_size must be >= 0 (0: unbounded), got ", o.max_queue_size);
  GPUOPT_CHECK_VALUE(o.priority_levels >= 1 && o.priority_levels <= kMaxPriorityLevels,
                     "priority_levels must be in [1, ", kMaxPriorityLevels, "], got ", o.priority_levels);
  GPUOPT_CHECK_VALUE(o.default_timeout_us >= 0, "default_timeout_us must be >= 0 (0: none), got ",
                     o.default_timeout_us);
  GPUOPT_CHECK_VALUE(o.idle_spin_us >= 0 && o.idle_spin_us <= kMaxIdleSpinUs, "idle_spin_us must be in [0, ",
                     kMaxIdleSpinUs, "] (0: never poll), got ", o.idle_spin_us);
  GPUOPT_CHECK_VALUE(o.timeout_action == TimeoutAction::kReject || o.timeout_action == TimeoutAction::kDelay,
                     "timeout_action must be kReject or kDelay, got ", static_cast<int>(o.timeout_action));
}

std::int64_t bucket_for(const BatcherOptions& options, std::int64_t length) {
  GPUOPT_CHECK_VALUE(length >= 0, "length must be >= 0, got ", length);
  const auto& b = options.buckets;
  if (b.empty()) return -1;
  const auto it = std::lower_bound(b.begin(), b.end(), length);
  GPUOPT_CHECK_VALUE(it != b.end(), "length must be <= the largest bucket (", b.back(), "), got ", length);
  return static_cast<std::int64_t>(it - b.begin());
}

BatchQueue::BatchQueue(BatcherOptions options) : options_(std::move(options)) {
  validate(options_);
  const std::size_t slots = std::max<std::size_t>(1, options_.buckets.size());
  levels_.resize(static_cast<std::size_t>(options_.priority_levels));
  for (Level& level : levels_) {
    level.by_bucket.resize(slots);
    level.delayed_by_bucket.resize(slots);
  }
  stats_.batch_size_counts.assign(static_cast<std::size_t>(options_.max_batch_size) + 1, 0);
}

EnqueueStatus BatchQueue::enqueue(QueuedRequest request) {
  GPUOPT_CHECK_VALUE(request.priority >= 0 && request.priority < options_.priority_levels,
                     "priority must be in [0, priority_levels=", options_.priority_levels, "), got ",
                     request.priority);
  GPUOPT_CHECK_VALUE(request.timeout_us >= -1, "timeout_us must be >= -1 (-1: the default, 0: none), got ",
                     request.timeout_us);
  request.bucket = bucket_for(options_, request.length);
  request.delayed = false;
  const std::int64_t timeout_us = timeout_us_of(request, options_.default_timeout_us);
  const auto slot = static_cast<std::int32_t>(std::max<std::int64_t>(request.bucket, 0));
  const auto level = static_cast<std::int32_t>(request.priority);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return EnqueueStatus::kClosed;
    if (options_.max_queue_size > 0 && stats_.waiting >= options_.max_queue_size) {
      ++stats_.rejected_full;
      return EnqueueStatus::kQueueFull;
    }
    // Stamped under the lock, so every FIFO is sorted by `enqueued` (the expiry lookup relies on it).
    request.enqueued = Clock::now();
    if (timeout_us > 0) {
      expiries_.push_back(Expiry{after_us(request.enqueued, timeout_us), request.enqueued, request.id, level, slot});
      std::push_heap(expiries_.begin(), expiries_.end(), later<Expiry>);
    }
    Level& l = levels_[static_cast<std::size_t>(level)];
    l.by_bucket[static_cast<std::size_t>(slot)].push_back(std::move(request));
    ++l.waiting;
    ++stats_.enqueued;
    stats_.max_waiting = std::max(stats_.max_waiting, ++stats_.waiting);
    version_.fetch_add(1, std::memory_order_release);
  }
  // One waiter re-evaluates (a batch may be due, or its wake-up time changed); a waiter that leaves
  // next_batch() with requests still queued passes the wake-up on, so none is lost.
  changed_.notify_one();
  return EnqueueStatus::kAccepted;
}

void BatchQueue::expire_locked(Clock::time_point now, std::vector<QueuedRequest>* expired, Clock::time_point* wake) {
  if (stats_.waiting == 0) {
    expiries_.clear();  // every entry is stale
    return;
  }
  const std::int64_t default_timeout_us = options_.default_timeout_us;
  if (expiries_.size() > 1024 + 2 * static_cast<std::size_t>(stats_.waiting)) {
    // Mostly stale entries of requests that already left: rebuild from the queue (amortised O(1)).
    expiries_.clear();
    for (std::size_t li = 0; li < levels_.size(); ++li) {
      for (std::size_t s = 0; s < levels_[li].by_bucket.size(); ++s) {
        for (const QueuedRequest& r : levels_[li].by_bucket[s]) {
          const std::int64_t t = timeout_us_of(r, default_timeout_us);
          if (t > 0) {
            expiries_.push_back(Expiry{after_us(r.enqueued, t), r.enqueued, r.id, static_cast<std::int32_t>(li),
                                       static_cast<std::int32_t>(s)});
          }
        }
      }
    }
    std::make_heap(expiries_.begin(), expiries_.end(), later<Expiry>);
  }
  while (!expiries_.empty() && expiries_.front().deadline <= now) {
    const Expiry e = expiries_.front();
    std::pop_heap(expiries_.begin(), expiries_.end(), later<Expiry>);
    expiries_.pop_back();
    Level& level = levels_[static_cast<std::size_t>(e.level)];
    auto& fifo = level.by_bucket[static_cast<std::size_t>(e.slot)];
    auto it = std::lower_bound(fifo.begin(), fifo.end(), e.enqueued,
                               [](const QueuedRequest& r, Clock::time_point t) { return r.enqueued < t; });
    while (it != fifo.end() && it->enqueued == e.enqueued && it->id != e.id) ++it;
    if (it == fifo.end() || it->enqueued != e.enqueued) continue;  // left in a batch (or was cancelled)
    QueuedRequest r = std::move(*it);
    fifo.erase(it);  // near the front, where the old requests are: cheap for a deque
    if (options_.timeout_action == TimeoutAction::kReject) {
      --level.waiting;
      --stats_.waiting;
      ++stats_.timed_out;
      if (expired != nullptr) expired->push_back(std::move(r));
    } else {
      r.delayed = true;
      ++stats_.delayed;
      level.delayed_by_bucket[static_cast<std::size_t>(e.slot)].push_back(std::move(r));
    }
  }
  if (!expiries_.empty()) *wake = std::min(*wake, expiries_.front().deadline);
}

// Batch policy. Candidates come from the highest-priority level that has a request; the batch's
// bucket is that of the level's oldest non-delayed request (its oldest delayed one when it has
// only delayed ones). A batch takes that bucket's requests in service order: level by level from
// the top, each level's non-delayed ones before its delayed ones, FIFO within each. Lower levels
// fill up what the higher ones leave free, after all of them: a batch never leaves half-empty while
// requests of its bucket wait, and a low-priority request rides along instead of waiting behind
// every later high-priority batch. n (what is available) counts all of them.
std::optional<Batch> BatchQueue::try_form_locked(Clock::time_point now, Clock::time_point* wake) {
  if (stats_.waiting == 0) return std::nullopt;
  std::size_t top = 0;
  while (levels_[top].waiting == 0) ++top;
  const std::size_t slots = levels_[top].by_bucket.size();
  std::size_t slot = slots;
  for (const auto* fifos : {&levels_[top].by_bucket, &levels_[top].delayed_by_bucket}) {
    Clock::time_point oldest = Clock::time_point::max();
    for (std::size_t s = 0; s < slots; ++s) {
      const auto& fifo = (*fifos)[s];
      if (!fifo.empty() && (slot == slots || fifo.front().enqueued < oldest)) {
        oldest = fifo.front().enqueued;
        slot = s;
      }
    }
    if (slot != slots) break;
  }

  std::int64_t n = 0;
  Clock::time_point oldest = Clock::time_point::max();
  for (std::size_t li = top; li < levels_.size(); ++li) {
    if (levels_[li].waiting == 0) continue;
    for (const auto* fifo : {&levels_[li].by_bucket[slot], &levels_[li].delayed_by_bucket[slot]}) {
      n += static_cast<std::int64_t>(fifo->size());
      if (!fifo->empty()) oldest = std::min(oldest, fifo->front().enqueued);
    }
  }

  const std::int64_t max_size = options_.max_batch_size;
  const auto& preferred = options_.preferred_batch_sizes;
  std::int64_t take = 0;
  const char* reason = nullptr;
  if (draining_) {
    take = std::min(n, max_size);
    reason = "drain";
  } else if (n >= max_size) {
    take = max_size;
    reason = "full";
  } else if (!preferred.empty() && n >= preferred.back()) {
    take = preferred.back();
    reason = "preferred";
  } else {
    const Clock::time_point due = after_us(oldest, options_.max_queue_delay_us);
    if (now < due) {
      *wake = std::min(*wake, due);
      return std::nullopt;
    }
    // The largest preferred size that n covers, or all n.
    const auto fit = std::upper_bound(preferred.begin(), preferred.end(), n);
    take = fit == preferred.begin() ? n : *(fit - 1);
    reason = "delay";
  }

  Batch batch;
  batch.requests.reserve(static_cast<std::size_t>(take));
  std::int64_t left = take;
  for (std::size_t li = top; li < levels_.size() && left > 0; ++li) {
    Level& level = levels_[li];
    for (auto* fifo : {&level.by_bucket[slot], &level.delayed_by_bucket[slot]}) {
      while (left > 0 && !fifo->empty()) {
        batch.requests.push_back(std::move(fifo->front()));
        fifo->pop_front();
        --level.waiting;
        --left;
      }
    }
  }
  const bool bucketed = !options_.buckets.empty();
  batch.bucket = bucketed ? static_cast<std::int64_t>(slot) : -1;
  if (bucketed) {
    batch.padded_length = options_.buckets[slot];
  } else {
    for (const QueuedRequest& r : batch.requests) batch.padded_length = std::max(batch.padded_length, r.length);
  }
  batch.formed = now;
  batch.reason = reason;
  stats_.waiting -= take;
  ++stats_.batches;
  stats_.batched_requests += take;
  ++stats_.batch_size_counts[static_cast<std::size_t>(take)];
  return batch;
}

std::optional<Batch> BatchQueue::next_batch(double timeout_s, std::vector<QueuedRequest>* expired) {
  GPUOPT_CHECK_VALUE(std::isfinite(timeout_s) && timeout_s >= 0, "timeout_s must be >= 0 and finite, got ",
                     timeout_s);
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(std::min(timeout_s, kMaxWaitS)));
  const std::size_t expired_before = expired != nullptr ? expired->size() : 0;
  std::optional<Batch> batch;
  std::unique_lock<std::mutex> lock(mu_);
  bool spun = false;
  for (;;) {
    if (closed_ && !draining_) return std::nullopt;  // cancel() hands the rest back
    const auto now = Clock::now();
    auto wake = deadline;
    expire_locked(now, expired, &wake);
    batch = try_form_locked(now, &wake);
    // Leave with a batch; with rejected requests for the caller to fail on time; when drained; or
    // on timeout.
    if (batch || (expired != nullptr && expired->size() > expired_before) || closed_ || now >= deadline) break;
    // Once per call, and by one waiter at a time: poll briefly for a push, then sleep. The version is
    // read under the lock, so a push after this evaluation changes it.
    if (!spun && options_.idle_spin_us > 0 && !spinning_.exchange(true, std::memory_order_acq_rel)) {
      spun = true;
      const std::uint64_t seen = version_.load(std::memory_order_acquire);
      const auto until = std::min(wake, after_us(now, options_.idle_spin_us));
      lock.unlock();
      while (Clock::now() < until && version_.load(std::memory_order_acquire) == seen) std::this_thread::yield();
      spinning_.store(false, std::memory_order_release);
      lock.lock();
      continue;
    }
    changed_.wait_until(lock, wake);  // a spurious wake-up only re-evaluates
  }
  const bool more = stats_.waiting > 0;
  lock.unlock();
  if (more) changed_.notify_one();  // pass on a wake-up this call may have consumed
  return batch;
}

void BatchQueue::close(bool drain) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;  // the first call decides whether to drain
    closed_ = true;
    draining_ = drain;
    version_.fetch_add(1, std::memory_order_release);
  }
  changed_.notify_all();
}

std::vector<QueuedRequest> BatchQueue::cancel() {
  std::vector<QueuedRequest> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out.reserve(static_cast<std::size_t>(stats_.waiting));
    for (Level& level : levels_) {
      for (auto* fifos : {&level.by_bucket, &level.delayed_by_bucket}) {
        for (auto& fifo : *fifos) {
          for (QueuedRequest& r : fifo) out.push_back(std::move(r));
          fifo.clear();
        }
      }
      level.waiting = 0;
    }
    expiries_.clear();
    stats_.cancelled += static_cast<std::int64_t>(out.size());
    stats_.waiting = 0;
  }
  changed_.notify_all();
  return out;
}

bool BatchQueue::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

std::int64_t BatchQueue::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_.waiting;
}

BatcherStats BatchQueue::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace gpuopt::serve
