#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gpuopt/batcher.h"
#include "gpuopt/errors.h"

namespace {

using gpuopt::serve::Batch;
using gpuopt::serve::BatcherOptions;
using gpuopt::serve::BatchQueue;
using gpuopt::serve::Clock;
using gpuopt::serve::EnqueueStatus;
using gpuopt::serve::QueuedRequest;
using gpuopt::serve::TimeoutAction;
using std::chrono::milliseconds;

constexpr std::int64_t kLongDelayUs = 60'000'000;  // a batch never leaves by its delay within a test

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

QueuedRequest req(std::uint64_t id, std::int64_t length = 0, std::int64_t priority = 0, std::int64_t timeout_us = -1) {
  QueuedRequest r;
  r.id = id;
  r.length = length;
  r.priority = priority;
  r.timeout_us = timeout_us;
  return r;
}

std::vector<std::uint64_t> ids(const std::vector<QueuedRequest>& requests) {
  std::vector<std::uint64_t> out;
  for (const auto& r : requests) out.push_back(r.id);
  return out;
}
std::vector<std::uint64_t> ids(const Batch& b) { return ids(b.requests); }

void enqueue_all(BatchQueue& q, const std::vector<QueuedRequest>& requests) {
  for (const auto& r : requests) ASSERT_EQ(q.enqueue(r), EnqueueStatus::kAccepted) << "id " << r.id;
}

template <typename F>
std::string error_of(F&& f, gpuopt::ErrorKind want = gpuopt::ErrorKind::kValue) {
  try {
    f();
  } catch (const gpuopt::Error& e) {
    EXPECT_EQ(static_cast<int>(e.kind()), static_cast<int>(want)) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected a gpuopt::Error";
  return "";
}

#define EXPECT_CONTAINS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

BatcherOptions opts(std::int64_t max_batch_size, std::int64_t max_queue_delay_us) {
  BatcherOptions o;
  o.max_batch_size = max_batch_size;
  o.max_queue_delay_us = max_queue_delay_us;
  return o;
}

TEST(BatcherOptions, ValidationNamesTheFieldAndTheValue) {
  const auto bad = [](auto change) {
    BatcherOptions o;
    change(o);
    return error_of([&] { gpuopt::serve::validate(o); });
  };
  EXPECT_EQ(bad([](BatcherOptions& o) { o.max_batch_size = 0; }), "max_batch_size must be >= 1, got 0");
  EXPECT_EQ(bad([](BatcherOptions& o) { o.max_queue_delay_us = -5; }), "max_queue_delay_us must be >= 0, got -5");
  EXPECT_EQ(bad([](BatcherOptions& o) { o.preferred_batch_sizes = {2, 9}; }),
            "preferred_batch_sizes[1] must be in [1, max_batch_size=8], got 9");
  EXPECT_EQ(bad([](BatcherOptions& o) { o.preferred_batch_sizes = {0}; }),
            "preferred_batch_sizes[0] must be in [1, max_batch_size=8], got 0");
  EXPECT_EQ(bad([](BatcherOptions& o) { o.preferred_batch_sizes = {2, 4, 4}; }),
            "preferred_batch_sizes must be strictly increasing, got 4 after 4 at index 2");
  EXPECT_EQ(bad([](BatcherOptions& o) { o.buckets = {16, 0}; }), "buckets[1] must be > 0, got 0");
  EXPECT_EQ(bad([](BatcherOptions& o) { o.buckets = {64, 32}; }),
            "buckets must be strictly increasing, got 32 after 64 at index 1");
  EXPECT_CONTAINS(bad([](BatcherOptions& o) { o.max_queue_size = -1; }), "max_queue_size must be >= 0");
  EXPECT_EQ(bad([](BatcherOptions& o) { o.priority_levels = 0; }), "priority_levels must be in [1, 64], got 0");
  EXPECT_EQ(bad([](BatcherOptions& o) { o.priority_levels = 65; }), "priority_levels must be in [1, 64], got 65");
  EXPECT_CONTAINS(bad([](BatcherOptions& o) { o.default_timeout_us = -1; }),
                  "default_timeout_us must be >= 0 (0: none), got -1");
  EXPECT_EQ(bad([](BatcherOptions& o) { o.idle_spin_us = -1; }),
            "idle_spin_us must be in [0, 100000] (0: never poll), got -1");
  EXPECT_EQ(bad([](BatcherOptions& o) { o.idle_spin_us = 100001; }),
            "idle_spin_us must be in [0, 100000] (0: never poll), got 100001");
  // The constructor validates too; the limits themselves are allowed.
  BatcherOptions o = opts(0, 0);
  EXPECT_EQ(error_of([&] { BatchQueue q(o); }), "max_batch_size must be >= 1, got 0");
  o = opts(4, 0);
  o.preferred_batch_sizes = {1, 4};
  o.buckets = {1, 2};
  o.priority_levels = 64;
  EXPECT_NO_THROW(gpuopt::serve::validate(o));
  BatchQueue q(o);
  EXPECT_EQ(q.stats().batch_size_counts.size(), 5u);
}

TEST(BatcherOptions, BucketForIsTheSmallestBucketThatCoversTheLength) {
  BatcherOptions o;
  EXPECT_EQ(gpuopt::serve::bucket_for(o, 0), -1);
  EXPECT_EQ(gpuopt::serve::bucket_for(o, 100000), -1);
  o.buckets = {16, 64, 256};
  const std::vector<std::pair<std::int64_t, std::int64_t>> cases = {{0, 0},  {1, 0},   {16, 0},  {17, 1},
                                                                    {64, 1}, {65, 2}, {256, 2}};
  for (const auto& [length, bucket] : cases) EXPECT_EQ(gpuopt::serve::bucket_for(o, length), bucket) << length;
  EXPECT_EQ(error_of([&] { gpuopt::serve::bucket_for(o, 257); }),
            "length must be <= the largest bucket (256), got 257");
  EXPECT_EQ(error_of([&] { gpuopt::serve::bucket_for(o, -1); }), "length must be >= 0, got -1");
}

TEST(BatcherQueue, EnqueueRejectsBadRequestsAndSetsBucketAndTime) {
  BatcherOptions o = opts(4, kLongDelayUs);
  o.buckets = {8, 32};
  o.priority_levels = 2;
  BatchQueue q(o);
  EXPECT_EQ(error_of([&] { q.enqueue(req(1, 4, 2)); }), "priority must be in [0, priority_levels=2), got 2");
  EXPECT_CONTAINS(error_of([&] { q.enqueue(req(1, 4, -1)); }), "priority must be in [0, priority_levels=2), got -1");
  EXPECT_EQ(error_of([&] { q.enqueue(req(1, 4, 0, -2)); }),
            "timeout_us must be >= -1 (-1: the default, 0: none), got -2");
  EXPECT_EQ(error_of([&] { q.enqueue(req(1, 33)); }), "length must be <= the largest bucket (32), got 33");
  EXPECT_EQ(q.stats().enqueued, 0);
  EXPECT_EQ(q.waiting(), 0);

  const auto before = Clock::now();
  QueuedRequest r = req(7, 20, 1);
  r.bucket = 99;  // overwritten
  r.delayed = true;
  enqueue_all(q, {r});
  q.close(true);
  auto b = q.next_batch(1.0);
  ASSERT_TRUE(b);
  ASSERT_EQ(b->requests.size(), 1u);
  EXPECT_EQ(b->requests[0].bucket, 1);
  EXPECT_FALSE(b->requests[0].delayed);
  EXPECT_GE(b->requests[0].enqueued, before);
  EXPECT_LE(b->requests[0].enqueued, b->formed);
}

TEST(BatcherReasons, FullBatchesLeaveAtMaxBatchSizeInFifoOrder) {
  BatchQueue q(opts(4, kLongDelayUs));
  for (std::uint64_t i = 0; i < 10; ++i) enqueue_all(q, {req(i)});
  auto b1 = q.next_batch(0);
  auto b2 = q.next_batch(0);
  ASSERT_TRUE(b1 && b2);
  EXPECT_STREQ(b1->reason, "full");
  EXPECT_STREQ(b2->reason, "full");
  EXPECT_EQ(ids(*b1), (std::vector<std::uint64_t>{0, 1, 2, 3}));
  EXPECT_EQ(ids(*b2), (std::vector<std::uint64_t>{4, 5, 6, 7}));
  EXPECT_EQ(b1->bucket, -1);
  EXPECT_FALSE(q.next_batch(0));  // 2 left, not due
  const auto s = q.stats();
  EXPECT_EQ(s.enqueued, 10);
  EXPECT_EQ(s.batches, 2);
  EXPECT_EQ(s.batched_requests, 8);
  EXPECT_EQ(s.waiting, 2);
  EXPECT_EQ(s.max_waiting, 10);
  EXPECT_EQ(s.batch_size_counts, (std::vector<std::int64_t>{0, 0, 0, 0, 2}));
}

TEST(BatcherReasons, PreferredSizeLeavesOnceTheLargestIsReached) {
  BatcherOptions o = opts(8, kLongDelayUs);
  o.preferred_batch_sizes = {2, 4};
  BatchQueue q(o);
  for (std::uint64_t i = 0; i < 3; ++i) enqueue_all(q, {req(i)});
  EXPECT_FALSE(q.next_batch(0));  // 3: past the smaller preferred size, below the largest
  enqueue_all(q, {req(3)});
  auto b = q.next_batch(0);
  ASSERT_TRUE(b);
  EXPECT_STREQ(b->reason, "preferred");
  EXPECT_EQ(ids(*b), (std::vector<std::uint64_t>{0, 1, 2, 3}));
  for (std::uint64_t i = 4; i < 11; ++i) enqueue_all(q, {req(i)});  // 7 waiting
  b = q.next_batch(0);
  ASSERT_TRUE(b);
  EXPECT_STREQ(b->reason, "preferred");
  EXPECT_EQ(ids(*b), (std::vector<std::uint64_t>{4, 5, 6, 7}));
  EXPECT_FALSE(q.next_batch(0));  // 3 left
  for (std::uint64_t i = 11; i < 16; ++i) enqueue_all(q, {req(i)});  // 8 waiting: full beats preferred
  b = q.next_batch(0);
  ASSERT_TRUE(b);
  EXPECT_STREQ(b->reason, "full");
  EXPECT_EQ(b->requests.size(), 8u);
}

TEST(BatcherReasons, DelayTakesTheLargestPreferredSizeThatFitsThenTheRest) {
  BatcherOptions o = opts(8, 30'000);
  o.preferred_batch_sizes = {2, 4};
  BatchQueue q(o);
  for (std::uint64_t i = 0; i < 3; ++i) enqueue_all(q, {req(i)});
  const auto t0 = Clock::now();
  auto b = q.next_batch(5.0);
  ASSERT_TRUE(b);
  EXPECT_GE(seconds_since(t0), 0.025);
  EXPECT_STREQ(b->reason, "delay");
  EXPECT_EQ(ids(*b), (std::vector<std::uint64_t>{0, 1}));
  b = q.next_batch(0);  // the one left waited as long: due at once, no preferred size fits
  ASSERT_TRUE(b);
  EXPECT_STREQ(b->reason, "delay");
  EXPECT_EQ(ids(*b), (std::vector<std::uint64_t>{2}));
  EXPECT_EQ(q.stats().batch_size_counts, (std::vector<std::int64_t>{0, 1, 1, 0, 0, 0, 0, 0, 0}));
}

TEST(BatcherDelay, ALoneRequestLeavesAfterTheDelayAndNotBefore) {
  constexpr std::int64_t kDelayUs = 60'000;
  BatchQueue q(opts(8, kDelayUs));
  enqueue_all(q, {req(1)});
  EXPECT_FALSE(q.next_batch(0));
  EXPECT_FALSE(q.next_batch(0.01));  // 10 ms < 60 ms
  const auto t0 = Clock::now();
  auto b = q.next_batch(5.0);
  ASSERT_TRUE(b);
  EXPECT_STREQ(b->reason, "delay");
  ASSERT_EQ(b->requests.size(), 1u);
  const double waited_ms = ms_between(b->requests[0].enqueued, b->formed);
  EXPECT_GE(waited_ms, kDelayUs / 1000.0);
  EXPECT_LT(waited_ms, 1000.0);
  EXPECT_LT(seconds_since(t0), 1.0);  // woken by the delay, not by the 5 s timeout
}

TEST(BatcherDelay, ZeroDelayDispatchesWhateverIsThereAtOnce) {
  BatchQueue q(opts(8, 0));
  for (std::uint64_t i = 0; i < 3; ++i) enqueue_all(q, {req(i)});
  auto b = q.next_batch(0);
  ASSERT_TRUE(b);
  EXPECT_STREQ(b->reason, "delay");
  EXPECT_EQ(ids(*b), (std::vector<std::uint64_t>{0, 1, 2}));
  // A waiter on an empty queue is woken by the enqueue.
  std::optional<Batch> got;
  std::thread consumer([&] { got = q.next_batch(5.0); });
  std::this_thread::sleep_for(milliseconds(50));
  enqueue_all(q, {req(9)});
  consumer.join();
  ASSERT_TRUE(got);
  EXPECT_EQ(ids(*got), (std::vector<std::uint64_t>{9}));
  EXPECT_LT(ms_between(got->requests[0].enqueued, got->formed), 500.0);
}

TEST(BatcherBuckets, BatchesNeverMixBucketsAndPadToTheBucket) {
  BatcherOptions o = opts(4, 0);
  o.buckets = {8, 32, 128};
  BatchQueue q(o);
  const std::vector<std::int64_t> lengths = {5, 30, 7, 100, 8, 31, 0};
  for (std::size_t i = 0; i < lengths.size(); ++i) enqueue_all(q, {req(i, lengths[i])});
  // Each batch takes the bucket of the oldest request, and every waiting request of that bucket.
  const std::vector<std::vector<std::uint64_t>> want = {{0, 2, 4, 6}, {1, 5}, {3}};
  const std::vector<std::int64_t> want_bucket = {0, 1, 2}, want_padded = {8, 32, 128};
  for (std::size_t k = 0; k < want.size(); ++k) {
    auto b = q.next_batch(0);
    ASSERT_TRUE(b) << k;
    EXPECT_EQ(ids(*b), want[k]);
    EXPECT_EQ(b->bucket, want_bucket[k]);
    EXPECT_EQ(b->padded_length, want_padded[k]);
    for (const auto& r : b->requests) EXPECT_EQ(r.bucket, b->bucket);
  }
  EXPECT_EQ(q.stats().batches, 3);
  EXPECT_FALSE(q.next_batch(0));

  BatchQueue plain(opts(4, 0));  // no buckets: one FIFO, padded to the longest request
  enqueue_all(plain, {req(1, 5), req(2, 300), req(3, 17)});
  auto b = plain.next_batch(0);
  ASSERT_TRUE(b);
  EXPECT_EQ(ids(*b), (std::vector<std::uint64_t>{1, 2, 3}));
  EXPECT_EQ(b->bucket, -1);
  EXPECT_EQ(b->padded_length, 300);
}

TEST(BatcherPriority, AHigherLevelLeavesFirstAndLowerLevelsFillUp) {
  BatcherOptions o = opts(2, 0);
  o.priority_levels = 3;
  BatchQueue q(o);
  enqueue_all(q, {req(1, 0, 1), req(2, 0, 1), req(3, 0, 2), req(4, 0, 1), req(10, 0, 0)});
  const std::vector<std::vector<std::uint64_t>> want = {{10, 1}, {2, 4}, {3}};
  for (const auto& w : want) {
    auto b = q.next_batch(0);
    ASSERT_TRUE(b);
    EXPECT_EQ(ids(*b), w);
  }
  // With buckets: the top level decides the bucket even when another bucket's requests are older.
  o = opts(4, 0);
  o.priority_levels = 2;
  o.buckets = {8, 64};
  BatchQueue qb(o);
  enqueue_all(qb, {req(1, 50, 1), req(2, 60, 1), req(3, 4, 1), req(4, 5, 0)});
  auto b = qb.next_batch(0);
  ASSERT_TRUE(b);
  EXPECT_EQ(ids(*b), (std::vector<std::uint64_t>{4, 3}));  // level 0's bucket, filled up by level 1
  EXPECT_EQ(b->padded_length, 8);
  b = qb.next_batch(0);
  ASSERT_TRUE(b);
  EXPECT_EQ(ids(*b), (std::vector<std::uint64_t>{1, 2}));
  EXPECT_EQ(b->padded_length, 64);
}

TEST(BatcherPriority, ATopLevelBatchThatIsNotDueHoldsBackLowerLevels) {
  BatcherOptions o = opts(4, kLongDelayUs);
  o.priority_levels = 2;
  o.buckets = {8, 64};
  BatchQueue q(o);
  // Level 1 has a full batch of the other bucket; level 0's lone request is not due: strict priority.
  enqueue_all(q, {req(1, 50, 1), req(2, 50, 1), req(3, 50, 1), req(4, 50, 1), req(5, 4, 0)});
  EXPECT_FALSE(q.next_batch(0));
  enqueue_all(q, {req(6, 3, 0), req(7, 2, 0), req(8, 1, 1)});  // level 0's bucket: 3 + 1 from level 1
  auto b = q.next_batch(0);
  ASSERT_TRUE(b);
  EXPECT_STREQ(b->reason, "full");
  EXPECT_EQ(ids(*b), (std::vector<std::uint64_t>{5, 6, 7, 8}));
  b = q.next_batch(0);
  ASSERT_TRUE(b);
  EXPECT_EQ(ids(*b), (std::vector<std::uint64_t>{1, 2, 3, 4}));
}

TEST(BatcherQueue, MaxQueueSizeRejectsAndRecoversAfterDraining) {
  BatcherOptions o = opts(2, 0);
  o.max_queue_size = 3;
  BatchQueue q(o);
  enqueue_all(q, {req(1), req(2), req(3)});
  EXPECT_EQ(q.enqueue(req(4)), EnqueueStatus::kQueueFull);
  EXPECT_EQ(q.enqueue(req(5)), EnqueueStatus::kQueueFull);
  EXPECT_EQ(q.waiting(), 3);
  ASSERT_TRUE(q.next_batch(0));
  EXPECT_EQ(q.waiting(), 1);
  enqueue_all(q, {req(6), req(7)});
  EXPECT_EQ(q.enqueue(req(8)), EnqueueStatus::kQueueFull);
  auto b1 = q.next_batch(0);
  auto b2 = q.next_batch(0);
  ASSERT_TRUE(b1 && b2);
  EXPECT_EQ(ids(*b1), (std::vector<std::uint64_t>{3, 6}));
  EXPECT_EQ(ids(*b2), (std::vector<std::uint64_t>{7}));
  const auto s = q.stats();
  EXPECT_EQ(s.enqueued, 5);
  EXPECT_EQ(s.rejected_full, 3);
  EXPECT_EQ(s.max_waiting, 3);
  EXPECT_EQ(s.waiting, 0);
}

TEST(BatcherTimeouts, RejectedRequestsExpireOnTimeAndAreHandedBack) {
  BatcherOptions o = opts(8, kLongDelayUs);
  o.default_timeout_us = 150'000;
  BatchQueue q(o);
  enqueue_all(q, {req(1, 0, 0, 40'000), req(2, 0, 0, 0), req(3, 0, 0, -1)});  // 40 ms, none, the default
  std::vector<QueuedRequest> expired;
  auto b = q.next_batch(5.0, &expired);  // returns as soon as something expired
  EXPECT_FALSE(b);
  ASSERT_EQ(ids(expired), (std::vector<std::uint64_t>{1}));
  const double first_ms = ms_between(expired[0].enqueued, Clock::now());
  EXPECT_GE(first_ms, 40.0);
  EXPECT_LT(first_ms, 140.0);  // before the default timeout of the next one: not woken late
  b = q.next_batch(5.0, &expired);
  EXPECT_FALSE(b);
  ASSERT_EQ(ids(expired), (std::vector<std::uint64_t>{1, 3}));
  const double second_ms = ms_between(expired[1].enqueued, Clock::now());
  EXPECT_GE(second_ms, 150.0);
  EXPECT_LT(second_ms, 1000.0);
  // Request 2 has no timeout: it stays.
  EXPECT_FALSE(q.next_batch(0.05, &expired));
  EXPECT_EQ(expired.size(), 2u);
  auto s = q.stats();
  EXPECT_EQ(s.timed_out, 2);
  EXPECT_EQ(s.waiting, 1);
  // Without a list they are counted all the same, and a batch taken first is not expired later.
  enqueue_all(q, {req(4, 0, 0, 20'000)});
  std::this_thread::sleep_for(milliseconds(30));
  EXPECT_FALSE(q.next_batch(0));
  enqueue_all(q, {req(5, 0, 0, 20'000)});
  q.close(true);
  b = q.next_batch(0, &expired);
  ASSERT_TRUE(b);
  EXPECT_EQ(ids(*b), (std::vector<std::uint64_t>{2, 5}));
  std::this_thread::sleep_for(milliseconds(30));
  EXPECT_FALSE(q.next_batch(0, &expired));
  EXPECT_EQ(expired.size(), 2u);
  s = q.stats();
  EXPECT_EQ(s.timed_out, 3);
  EXPECT_EQ(s.enqueued, s.batched_requests + s.timed_out + s.cancelled + s.waiting);
}

// Many requests with long timeouts leave in batches while one with a short timeout waits: the
// expiry entries of those that left are dropped (the heap is rebuilt), the waiting one's is kept.
TEST(BatcherTimeouts, ExpiryBookkeepingSurvivesManyDispatchedRequests) {
  BatcherOptions o = opts(4, kLongDelayUs);
  o.buckets = {8, 64};
  o.priority_levels = 2;
  o.default_timeout_us = 10'000'000;
  BatchQueue q(o);
  enqueue_all(q, {req(1, 50, 1, 60'000)});  // alone in its bucket, never due by size or delay
  std::vector<QueuedRequest> expired;
  std::int64_t full = 0;
  for (std::uint64_t i = 0; i < 5000; ++i) {
    enqueue_all(q, {req(100 + i, 4, 0)});
    if (i % 4 == 3) {
      auto b = q.next_batch(0, &expired);
      full += b && b->requests.size() == 4 && b->bucket == 0;
    }
  }
  EXPECT_EQ(full, 1250);
  EXPECT_EQ(q.waiting(), 1);
  auto b = q.next_batch(5.0, &expired);
  EXPECT_FALSE(b);
  ASSERT_EQ(ids(expired), (std::vector<std::uint64_t>{1}));
  const double ms = ms_between(expired[0].enqueued, Clock::now());
  EXPECT_GE(ms, 60.0);
  EXPECT_LT(ms, 3000.0);
  EXPECT_EQ(q.stats().timed_out, 1);
}

TEST(BatcherTimeouts, AWaiterOnAnotherThreadRejectsOnTime) {
  BatchQueue q(opts(8, kLongDelayUs));
  std::vector<QueuedRequest> expired;
  Clock::time_point returned;
  std::thread consumer([&] {
    (void)q.next_batch(5.0, &expired);
    returned = Clock::now();
  });
  std::this_thread::sleep_for(milliseconds(30));
  enqueue_all(q, {req(1, 0, 0, 50'000)});
  consumer.join();
  ASSERT_EQ(ids(expired), (std::vector<std::uint64_t>{1}));
  const double ms = ms_between(expired[0].enqueued, returned);
  EXPECT_GE(ms, 50.0);
  EXPECT_LT(ms, 500.0);
}

TEST(BatcherTimeouts, DelayedRequestsAreServedBehindFreshOnes) {
  BatcherOptions o = opts(2, kLongDelayUs);
  o.timeout_action = TimeoutAction::kDelay;
  o.default_timeout_us = 20'000;
  BatchQueue q(o);
  enqueue_all(q, {req(1), req(2, 0, 0, 0)});  // 1 times out after 20 ms, 2 never
  std::this_thread::sleep_for(milliseconds(40));
  std::vector<QueuedRequest> expired;
  auto b = q.next_batch(0, &expired);
  ASSERT_TRUE(b);  // 2 waiting = full
  EXPECT_EQ(ids(*b), (std::vector<std::uint64_t>{2, 1}));
  EXPECT_FALSE(b->requests[0].delayed);
  EXPECT_TRUE(b->requests[1].delayed);
  EXPECT_TRUE(expired.empty());
  EXPECT_EQ(q.stats().delayed, 1);

  enqueue_all(q, {req(3), req(4, 0, 0, 0)});
  std::this_thread::sleep_for(milliseconds(40));  // 3 is demoted, 4 not
  enqueue_all(q, {req(5, 0, 0, 0), req(6, 0, 0, 0)});
  std::vector<std::vector<std::uint64_t>> got;
  for (int k = 0; k < 2; ++k) {
    b = q.next_batch(0, &expired);
    ASSERT_TRUE(b);
    got.push_back(ids(*b));
  }
  EXPECT_EQ(got, (std::vector<std::vector<std::uint64_t>>{{4, 5}, {6, 3}}));
  const auto s = q.stats();
  EXPECT_EQ(s.delayed, 2);  // each counted once
  EXPECT_EQ(s.timed_out, 0);
  EXPECT_EQ(s.waiting, 0);
}

TEST(BatcherClose, DrainDeliversEverythingAtOnce) {
  BatcherOptions o = opts(4, kLongDelayUs);
  o.priority_levels = 2;
  BatchQueue q(o);
  for (std::uint64_t i = 0; i < 10; ++i) enqueue_all(q, {req(i, 0, static_cast<std::int64_t>(i % 2))});
  q.close(true);
  q.close(false);  // idempotent: the first call decided
  EXPECT_EQ(q.enqueue(req(99)), EnqueueStatus::kClosed);
  std::vector<std::vector<std::uint64_t>> got;
  const auto t0 = Clock::now();
  while (auto b = q.next_batch(5.0)) {
    EXPECT_STREQ(b->reason, "drain");
    got.push_back(ids(*b));
    ASSERT_LT(got.size(), 10u);
  }
  EXPECT_LT(seconds_since(t0), 1.0);  // nothing waited for a delay or the 5 s timeouts
  EXPECT_EQ(got, (std::vector<std::vector<std::uint64_t>>{{0, 2, 4, 6}, {8, 1, 3, 5}, {7, 9}}));
  auto s = q.stats();
  EXPECT_EQ(s.batched_requests, 10);
  EXPECT_EQ(s.waiting, 0);
  EXPECT_EQ(s.batch_size_counts, (std::vector<std::int64_t>{0, 0, 1, 0, 2}));
  EXPECT_TRUE(q.closed());

  // A waiter for a batch that is not due is woken by close(true) and takes it.
  BatchQueue q2(opts(4, kLongDelayUs));
  enqueue_all(q2, {req(1), req(2), req(3)});
  std::optional<Batch> woken;
  std::thread consumer([&] { woken = q2.next_batch(5.0); });
  std::this_thread::sleep_for(milliseconds(30));
  const auto t1 = Clock::now();
  q2.close(true);
  consumer.join();
  EXPECT_LT(seconds_since(t1), 1.0);
  ASSERT_TRUE(woken);
  EXPECT_STREQ(woken->reason, "drain");
  EXPECT_EQ(ids(*woken), (std::vector<std::uint64_t>{1, 2, 3}));
  EXPECT_FALSE(q2.next_batch(5.0));
  EXPECT_LT(seconds_since(t1), 1.0);
}

TEST(BatcherClose, CloseWithoutDrainStopsAndCancelHandsEverythingBack) {
  BatcherOptions o = opts(4, kLongDelayUs);
  o.priority_levels = 2;
  o.timeout_action = TimeoutAction::kDelay;
  BatchQueue q(o);
  enqueue_all(q, {req(1, 0, 1), req(2, 0, 0, 1000), req(3)});
  EXPECT_EQ(ids(q.cancel()), (std::vector<std::uint64_t>{2, 3, 1}));
  EXPECT_EQ(q.stats().cancelled, 3);  // cancel() before close(): the queue stays open
  EXPECT_FALSE(q.closed());

  enqueue_all(q, {req(4, 0, 1), req(5, 0, 0, 1000), req(6)});
  std::this_thread::sleep_for(milliseconds(10));
  EXPECT_FALSE(q.next_batch(0));  // 5 is demoted (kDelay)
  std::optional<Batch> woken = Batch{};
  std::thread consumer([&] { woken = q.next_batch(5.0); });
  std::this_thread::sleep_for(milliseconds(30));
  const auto t0 = Clock::now();
  q.close(false);
  consumer.join();
  EXPECT_LT(seconds_since(t0), 1.0);
  EXPECT_FALSE(woken);
  EXPECT_FALSE(q.next_batch(5.0));
  EXPECT_LT(seconds_since(t0), 1.0);
  EXPECT_EQ(q.waiting(), 3);
  // Level by level; each level's fresh requests before its delayed ones.
  const auto rest = q.cancel();
  EXPECT_EQ(ids(rest), (std::vector<std::uint64_t>{6, 5, 4}));
  EXPECT_TRUE(rest[1].delayed);
  EXPECT_TRUE(q.cancel().empty());
  const auto s = q.stats();
  EXPECT_EQ(s.cancelled, 6);
  EXPECT_EQ(s.waiting, 0);
  EXPECT_EQ(s.enqueued, 6);
  EXPECT_EQ(s.batches, 0);
}

TEST(BatcherWaits, NextBatchTimeoutsAreBoundedAndChecked) {
  BatchQueue q(opts(8, kLongDelayUs));
  auto t0 = Clock::now();
  EXPECT_FALSE(q.next_batch(0.05));
  double waited = seconds_since(t0);
  EXPECT_GE(waited, 0.045);
  EXPECT_LT(waited, 0.5);
  t0 = Clock::now();
  EXPECT_FALSE(q.next_batch(0));
  EXPECT_LT(seconds_since(t0), 0.1);
  enqueue_all(q, {req(1)});  // not due for a minute
  t0 = Clock::now();
  EXPECT_FALSE(q.next_batch(0.05));
  waited = seconds_since(t0);
  EXPECT_GE(waited, 0.045);
  EXPECT_LT(waited, 0.5);
  for (double bad : {-0.001, std::nan(""), std::numeric_limits<double>::infinity()}) {
    EXPECT_CONTAINS(error_of([&] { q.next_batch(bad); }), "timeout_s must be >= 0 and finite, got ");
  }
  EXPECT_EQ(q.waiting(), 1);
}

// Several executors waiting on an empty queue: each request wakes one, none sleeps until its timeout.
TEST(BatcherWaits, NoWakeUpIsLostBetweenSeveralWaiters) {
  BatchQueue q(opts(1, 0));
  constexpr int kConsumers = 3;
  std::vector<std::optional<Batch>> got(kConsumers);
  std::vector<double> waited(kConsumers);
  std::vector<std::thread> consumers;
  for (int c = 0; c < kConsumers; ++c) {
    consumers.emplace_back([&, c] {
      const auto t0 = Clock::now();
      got[c] = q.next_batch(10.0);
      waited[c] = seconds_since(t0);
    });
  }
  std::this_thread::sleep_for(milliseconds(50));
  enqueue_all(q, {req(1), req(2), req(3)});
  for (auto& t : consumers) t.join();
  std::vector<std::uint64_t> all;
  for (int c = 0; c < kConsumers; ++c) {
    ASSERT_TRUE(got[c]) << c;
    EXPECT_LT(waited[c], 5.0) << c;
    for (auto id : ids(*got[c])) all.push_back(id);
  }
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, (std::vector<std::uint64_t>{1, 2, 3}));
}

// A waiter woken by an enqueue whose batch is not due yet, and whose own timeout ends first, passes
// the wake-up on: the other waiter takes the batch when it is due, not at the end of its timeout.
TEST(BatcherWaits, AWaiterThatTimesOutPassesItsWakeUpOn) {
  for (int round = 0; round < 3; ++round) {
    BatchQueue q(opts(2, 100'000));
    std::optional<Batch> got;
    std::thread short_waiter([&] { EXPECT_FALSE(q.next_batch(0.05)); });
    std::this_thread::sleep_for(milliseconds(10));  // waits first: the first to be notified
    std::thread long_waiter([&] { got = q.next_batch(10.0); });
    std::this_thread::sleep_for(milliseconds(10));
    enqueue_all(q, {req(1)});
    short_waiter.join();
    long_waiter.join();
    ASSERT_TRUE(got) << round;
    EXPECT_EQ(ids(*got), (std::vector<std::uint64_t>{1}));
    const double ms = ms_between(got->requests[0].enqueued, got->formed);
    EXPECT_GE(ms, 100.0);
    EXPECT_LT(ms, 2000.0) << round;
  }
}

// Pushes that land while a waiter polls (a long idle spin: the push lands inside it), while the others
// sleep, and with polling off: every request leaves promptly, whichever waiter takes it, and the
// waiters that got nothing sleep until their timeout (run under TSan in CI: the poll reads the version
// counter that enqueue() bumps under the lock).
TEST(BatcherWaits, PushesDuringTheIdleSpinAreTakenPromptly) {
  for (std::int64_t spin_us : {std::int64_t{100000}, std::int64_t{200}, std::int64_t{0}}) {
    BatcherOptions o = opts(1, 0);
    o.idle_spin_us = spin_us;
    BatchQueue q(o);
    constexpr int kWaiters = 3, kRequests = 6;
    std::atomic<int> taken{0};
    std::vector<double> lag_ms(kRequests + 1, -1.0);
    std::vector<std::thread> waiters;
    for (int w = 0; w < kWaiters; ++w) {
      waiters.emplace_back([&] {
        while (taken.load() < kRequests) {
          auto b = q.next_batch(0.5);
          if (!b) continue;
          for (const auto& r : b->requests) lag_ms[r.id] = ms_between(r.enqueued, b->formed);
          taken += static_cast<int>(b->requests.size());
        }
      });
    }
    for (std::uint64_t id = 1; id <= kRequests; ++id) {
      std::this_thread::sleep_for(milliseconds(id % 2 == 0 ? 1 : 20));  // inside a long spin, or after it
      enqueue_all(q, {req(id)});
    }
    for (auto& t : waiters) t.join();
    for (std::uint64_t id = 1; id <= kRequests; ++id) {
      EXPECT_GE(lag_ms[id], 0.0) << "request " << id << " spin " << spin_us;
      EXPECT_LT(lag_ms[id], 400.0) << "request " << id << " spin " << spin_us;  // not a waiter's 0.5 s timeout
    }
    EXPECT_EQ(q.stats().batches, kRequests);
  }
}

// Producers and executors on many threads: every request leaves exactly once, in one batch of one
// bucket, and the counters add up (run under TSan and ASan in CI).
TEST(BatcherConcurrency, ProducersAndExecutorsDeliverEveryRequestOnce) {
  constexpr int kProducers = 8, kPerProducer = 20000, kConsumers = 3;
  constexpr std::uint64_t kTotal = std::uint64_t{kProducers} * kPerProducer;
  BatcherOptions o = opts(16, 200);
  o.preferred_batch_sizes = {4, 8};
  o.buckets = {16, 64, 256};
  o.priority_levels = 3;
  o.max_queue_size = 256;
  BatchQueue q(o);

  const auto t0 = Clock::now();
  std::atomic<std::int64_t> refused{0};
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&q, &refused, p, t0] {
      std::mt19937_64 rng(1000 + p);
      std::uniform_int_distribution<std::int64_t> length(0, 256), priority(0, 2), timeout(1, 3000), pick(0, 49);
      for (int i = 0; i < kPerProducer; ++i) {
        const std::uint64_t id = std::uint64_t{static_cast<std::uint64_t>(p)} * kPerProducer + i;
        const std::int64_t t = pick(rng) == 0 ? timeout(rng) : -1;  // 2%: a short reject-timeout
        const QueuedRequest r = req(id, length(rng), priority(rng), t);
        // A full queue pushes back: retry (bounded) until an executor made room.
        while (q.enqueue(r) == EnqueueStatus::kQueueFull && seconds_since(t0) < 50.0) {
          ++refused;
          std::this_thread::yield();
        }
        if (i % 64 == 63) std::this_thread::sleep_for(std::chrono::microseconds(50));  // bursts
      }
    });
  }
  struct Seen {
    std::vector<std::uint32_t> count = std::vector<std::uint32_t>(kTotal, 0);
    std::int64_t batches = 0, expired = 0, oversized = 0, mixed = 0, bad_padding = 0, timeouts = 0;
  };
  std::vector<Seen> seen(kConsumers);
  std::vector<std::thread> consumers;
  for (int c = 0; c < kConsumers; ++c) {
    consumers.emplace_back([&, c] {
      Seen& s = seen[c];
      std::vector<QueuedRequest> expired;
      while (seconds_since(t0) < 50.0) {
        auto b = q.next_batch(0.2, &expired);
        for (const auto& r : expired) ++s.count[r.id];
        s.expired += static_cast<std::int64_t>(expired.size());
        expired.clear();
        if (!b) {
          if (q.closed() && q.waiting() == 0) return;
          continue;
        }
        ++s.batches;
        if (b->requests.size() > 16 || b->requests.empty()) ++s.oversized;
        if (b->bucket < 0 || b->padded_length != o.buckets[static_cast<std::size_t>(b->bucket)]) ++s.bad_padding;
        for (const auto& r : b->requests) {
          ++s.count[r.id];
          if (r.bucket != b->bucket || gpuopt::serve::bucket_for(o, r.length) != r.bucket) ++s.mixed;
        }
      }
      ++s.timeouts;
    });
  }
  for (auto& t : producers) t.join();
  q.close(true);
  for (auto& t : consumers) t.join();

  std::int64_t batches = 0, expired = 0;
  std::uint64_t missing = 0, duplicated = 0;
  for (std::uint64_t id = 0; id < kTotal; ++id) {
    std::uint32_t n = 0;
    for (const Seen& s : seen) n += s.count[id];
    missing += n == 0;
    duplicated += n > 1;
  }
  for (const Seen& s : seen) {
    batches += s.batches;
    expired += s.expired;
    EXPECT_EQ(s.oversized, 0);
    EXPECT_EQ(s.mixed, 0);
    EXPECT_EQ(s.bad_padding, 0);
    EXPECT_EQ(s.timeouts, 0);
  }
  EXPECT_EQ(missing, 0u);
  EXPECT_EQ(duplicated, 0u);
  const auto st = q.stats();
  EXPECT_EQ(st.enqueued, static_cast<std::int64_t>(kTotal));
  EXPECT_EQ(st.waiting, 0);
  EXPECT_EQ(st.cancelled, 0);
  EXPECT_EQ(st.timed_out, expired);
  EXPECT_EQ(st.batches, batches);
  EXPECT_EQ(st.enqueued, st.batched_requests + st.timed_out + st.cancelled + st.waiting);
  std::int64_t by_size = 0, total = 0;
  for (std::size_t k = 0; k < st.batch_size_counts.size(); ++k) {
    by_size += st.batch_size_counts[k];
    total += static_cast<std::int64_t>(k) * st.batch_size_counts[k];
  }
  EXPECT_EQ(by_size, st.batches);
  EXPECT_EQ(total, st.batched_requests);
  EXPECT_EQ(st.batch_size_counts[0], 0);
  EXPECT_EQ(st.rejected_full, refused.load());
  EXPECT_LE(st.max_waiting, 256);
}

}  // namespace
