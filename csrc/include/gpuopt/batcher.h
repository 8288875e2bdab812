// The dynamic batcher's queue and batch former, after Triton's dynamic batcher: requests enter one at
// a time from any number of threads; executors take batches formed by max_batch_size,
// max_queue_delay_us and preferred_batch_sizes, one bucket (padded sequence length) per batch;
// priority levels, a maximum queue size and per-request timeouts with reject-or-delay.
//
// Pull model: an executor asks for a batch when it is free, so requests accumulate while every
// executor is busy and the batch size follows the load. No CUDA, no torch, no Python here: a request
// is an id, a length, a priority and times; what it carries is the caller's (keyed by id).
//
// Every wait is bounded (next_batch takes a timeout); close() wakes every waiter.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace gpuopt::serve {

using Clock = std::chrono::steady_clock;

enum class TimeoutAction { kReject, kDelay };

struct BatcherOptions {
  std::int64_t max_batch_size = 8;               // >= 1
  std::int64_t max_queue_delay_us = 0;           // >= 0: how long the oldest request may wait for company
  std::vector<std::int64_t> preferred_batch_sizes;  // each in [1, max_batch_size], strictly increasing
  std::vector<std::int64_t> buckets;             // padded lengths, strictly increasing, > 0; empty: none
  std::int64_t max_queue_size = 0;               // requests waiting (all levels); 0: unbounded
  std::int64_t priority_levels = 1;              // >= 1; level 0 is served first
  std::int64_t default_timeout_us = 0;           // 0: none; a request's own timeout overrides it
  TimeoutAction timeout_action = TimeoutAction::kReject;
  // An idle next_batch() polls for a new request this long before it sleeps on the condition variable
  // (one waiter at a time; the others sleep at once): a request that arrives soon after a batch is picked
  // up without the sleeping thread's wake-up latency. 0: never poll. In [0, 100000].
  std::int64_t idle_spin_us = 200;
};

// Throws gpuopt::Error (kValue) naming the field, the value and what is allowed.
void validate(const BatcherOptions& options);

// The bucket index for a request of `length` (the smallest bucket >= length); -1 when buckets are
// empty. kValue error naming `length` and the largest bucket when no bucket covers it.
std::int64_t bucket_for(const BatcherOptions& options, std::int64_t length);

struct QueuedRequest {
  std::uint64_t id = 0;
  std::int64_t length = 0;    // sequence length (bucketing); 0 when inputs have no sequence axis
  std::int64_t bucket = -1;   // set by enqueue()
  std::int64_t priority = 0;  // 0 .. priority_levels-1
  std::int64_t timeout_us = -1;  // -1: the default; 0: none
  Clock::time_point enqueued{};  // set by enqueue()
  bool delayed = false;          // timed out under kDelay: served after the level's others
};

struct Batch {
  std::vector<QueuedRequest> requests;  // same bucket, in service order
  std::int64_t bucket = -1;             // index into buckets, -1 without buckets
  std::int64_t padded_length = 0;       // buckets[bucket], or the longest request's length without buckets
  Clock::time_point formed{};
  // Why it left the queue: "full" (max_batch_size), "preferred" (a preferred size reached), "delay"
  // (the oldest request waited max_queue_delay_us), "drain" (closing with drain).
  const char* reason = "";
};

enum class EnqueueStatus { kAccepted, kQueueFull, kClosed };

struct BatcherStats {
  std::int64_t enqueued = 0;
  std::int64_t rejected_full = 0;  // enqueue() refused: max_queue_size reached
  std::int64_t timed_out = 0;      // removed by a kReject timeout
  std::int64_t delayed = 0;        // demoted by a kDelay timeout
  std::int64_t cancelled = 0;      // handed back by cancel()
  std::int64_t batches = 0;
  std::int64_t batched_requests = 0;
  std::int64_t waiting = 0;        // now
  std::int64_t max_waiting = 0;    // high-water mark
  std::vector<std::int64_t> batch_size_counts;  // [b] = batches of size b, b in 0..max_batch_size
};

class BatchQueue {
 public:
  explicit BatchQueue(BatcherOptions options);  // validate()s
  BatchQueue(const BatchQueue&) = delete;
  BatchQueue& operator=(const BatchQueue&) = delete;

  // Adds `request` (id, length, priority, timeout_us are the caller's). kValue error for a priority
  // outside the levels or a length no bucket covers (naming it). Never blocks on capacity: a full
  // queue answers kQueueFull, a closed one kClosed.
  EnqueueStatus enqueue(QueuedRequest request);

  // The next batch by the policy, waiting up to timeout_s for one to be due; nullopt on timeout or
  // when the queue is closed and empty. Requests that timed out under kReject while waiting are
  // appended to `expired` (when given; counted either way) for the caller to fail; the call then
  // returns at once (nullopt when no batch is due) so that they are failed on time.
  std::optional<Batch> next_batch(double timeout_s, std::vector<QueuedRequest>* expired = nullptr);

  // Closing: no more enqueues. drain=true: waiting requests still leave in batches, at once (no
  // delay), until the queue is empty. drain=false: nothing more leaves; cancel() hands them back.
  void close(bool drain);
  std::vector<QueuedRequest> cancel();  // every waiting request, removed (for the caller to fail)

  bool closed() const;
  std::int64_t waiting() const;
  BatcherStats stats() const;
  const BatcherOptions& options() const { return options_; }

 private:
  // One FIFO per (priority level, bucket); delayed requests in their own FIFO per level.
  struct Level {
    std::vector<std::deque<QueuedRequest>> by_bucket;
    std::vector<std::deque<QueuedRequest>> delayed_by_bucket;
    std::int64_t waiting = 0;  // both kinds, all buckets
  };
  // A pending timeout, in a min-heap on `deadline`. Entries of requests that left in a batch stay
  // until their deadline passes (lazy deletion): a lookup finds nothing then.
  struct Expiry {
    Clock::time_point deadline;
    Clock::time_point enqueued;  // with id: finds the request in its FIFO (sorted by enqueued)
    std::uint64_t id;
    std::int32_t level;
    std::int32_t slot;  // bucket index, 0 without buckets
  };
  std::optional<Batch> try_form_locked(Clock::time_point now, Clock::time_point* wake);
  void expire_locked(Clock::time_point now, std::vector<QueuedRequest>* expired, Clock::time_point* wake);

  const BatcherOptions options_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  // Bumped by every push() and close(): next_batch() polls it while it spins before sleeping.
  std::atomic<std::uint64_t> version_{0};
  // Whether a next_batch() is polling now: at most one does (more would only burn the host's cores).
  std::atomic<bool> spinning_{false};
  std::vector<Level> levels_;
  std::vector<Expiry> expiries_;
  bool closed_ = false;
  bool draining_ = false;
  BatcherStats stats_;
};

}  // namespace gpuopt::serve
