#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gpuopt/errors.h"
#include "gpuopt/staging.h"

namespace {

using gpuopt::StagingJob;
using gpuopt::StagingWorker;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// What the jobs of one test saw: which threads staged them and which destroyed them.
struct Log {
  std::mutex mu;
  std::set<std::thread::id> stagers, destroyers;
  std::atomic<int> destroyed{0};
};

// A gate a job waits at inside stage(), opened by the test (bounded: a test never hangs on it).
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  void release() {
    {
      std::lock_guard<std::mutex> lock(mu);
      open = true;
    }
    cv.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(20), [this] { return open; })) << "gate never opened";
  }
};

class Job : public StagingJob {
 public:
  Job(std::shared_ptr<Log> log, int input) : log_(std::move(log)), input(input) {}
  ~Job() override {
    std::lock_guard<std::mutex> lock(log_->mu);
    log_->destroyers.insert(std::this_thread::get_id());
    ++log_->destroyed;
  }
  void stage() override {
    {
      std::lock_guard<std::mutex> lock(log_->mu);
      log_->stagers.insert(std::this_thread::get_id());
    }
    if (gate) gate->wait();
    if (sleep_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    if (fail_with_value_error) GPUOPT_CHECK_VALUE(false, "job ", input, " cannot be staged");
    output = input * 3 + 1;
  }

  std::shared_ptr<Log> log_;
  int input;
  long output = -1;
  int sleep_us = 0;
  bool fail_with_value_error = false;
  std::shared_ptr<Gate> gate;
};

std::unique_ptr<Job> job(const std::shared_ptr<Log>& log, int input) { return std::make_unique<Job>(log, input); }

long output_of(std::unique_ptr<StagingJob> j) { return static_cast<Job&>(*j).output; }

template <typename F>
std::string error_of(F&& f, gpuopt::ErrorKind want) {
  try {
    f();
  } catch (const gpuopt::Error& e) {
    EXPECT_EQ(static_cast<int>(e.kind()), static_cast<int>(want)) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected a gpuopt::Error";
  return "";
}

TEST(Staging, DeliversInSubmissionOrderAndNeverDestroysAJobOnTheWorker) {
  auto log = std::make_shared<Log>();
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> value(-1000000, 1000000), sleep(0, 300);
  std::vector<int> inputs(200);
  for (int& x : inputs) x = value(rng);
  StagingWorker w("Pipe", 3);
  std::size_t submitted = 0, delivered = 0;
  while (delivered < inputs.size()) {
    while (submitted < inputs.size() && w.in_flight() < 3) {
      auto j = job(log, inputs[submitted++]);
      j->sleep_us = sleep(rng);
      w.submit(std::move(j), 10.0);
    }
    EXPECT_EQ(output_of(w.next(10.0)), 3L * inputs[delivered] + 1) << "batch " << delivered;
    ++delivered;
  }
  const auto s = w.stats();
  EXPECT_EQ(s.submitted, 200);
  EXPECT_EQ(s.delivered, 200);
  EXPECT_EQ(s.failed, 0);
  EXPECT_GT(s.stage_ms, 0.0);
  ASSERT_EQ(log->stagers.size(), 1u);
  const std::thread::id worker = *log->stagers.begin();
  EXPECT_NE(worker, std::this_thread::get_id());
  EXPECT_EQ(log->destroyed.load(), 200);
  EXPECT_EQ(log->destroyers.count(worker), 0u);
}

TEST(Staging, SubmitWaitsForRoomAndTimesOutWithAClearError) {
  auto log = std::make_shared<Log>();
  StagingWorker w("Pipe", 2);
  w.submit(job(log, 1), 5.0);
  w.submit(job(log, 2), 5.0);
  const auto t0 = Clock::now();
  const std::string msg = error_of([&] { w.submit(job(log, 3), 0.2); }, gpuopt::ErrorKind::kRuntime);
  const double waited = seconds_since(t0);
  EXPECT_GE(waited, 0.19);
  EXPECT_LT(waited, 5.0);
  EXPECT_NE(msg.find("Pipe.submit: no room within timeout_s=0.2: depth=2 batches are in flight"), std::string::npos)
      << msg;
  EXPECT_EQ(log->destroyed.load(), 1);  // the refused job, destroyed on this thread
  // A consumer on another thread makes room: the blocked submit goes through.
  std::thread consumer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(output_of(w.next(5.0)), 4);
  });
  w.submit(job(log, 4), 5.0);
  consumer.join();
  EXPECT_EQ(output_of(w.next(5.0)), 7);
  EXPECT_EQ(output_of(w.next(5.0)), 13);
}

TEST(Staging, NextTimesOutWhileTheJobIsStillStaging) {
  auto log = std::make_shared<Log>();
  auto gate = std::make_shared<Gate>();
  StagingWorker w("Pipe", 2);
  auto j = job(log, 5);
  j->gate = gate;
  w.submit(std::move(j), 5.0);
  const auto t0 = Clock::now();
  const std::string msg = error_of([&] { w.next(0.15); }, gpuopt::ErrorKind::kRuntime);
  EXPECT_GE(seconds_since(t0), 0.14);
  EXPECT_NE(msg.find("Pipe.next: no batch was staged within timeout_s=0.15 (1 in flight, the oldest still being "
                     "staged)"),
            std::string::npos)
      << msg;
  gate->release();
  EXPECT_EQ(output_of(w.next(5.0)), 16);  // still delivered after the timeout
  EXPECT_GE(w.stats().wait_ms, 140.0);
}

TEST(Staging, StageErrorsReachTheConsumerInOrderWithTheirKind) {
  auto log = std::make_shared<Log>();
  StagingWorker w("Pipe", 3);
  w.submit(job(log, 1), 5.0);
  auto bad = job(log, 2);
  bad->fail_with_value_error = true;
  w.submit(std::move(bad), 5.0);
  w.submit(job(log, 3), 5.0);
  EXPECT_EQ(output_of(w.next(5.0)), 4);
  EXPECT_EQ(error_of([&] { w.next(5.0); }, gpuopt::ErrorKind::kValue), "job 2 cannot be staged");
  EXPECT_EQ(output_of(w.next(5.0)), 10);  // the pipeline goes on
  EXPECT_EQ(w.stats().failed, 1);
  EXPECT_EQ(log->destroyed.load(), 3);
  EXPECT_EQ(log->destroyers.size(), 1u);  // all on this thread
  EXPECT_EQ(*log->destroyers.begin(), std::this_thread::get_id());
}

TEST(Staging, CloseCancelsOnTheCallingThreadAndWakesWaiters) {
  auto log = std::make_shared<Log>();
  auto gate = std::make_shared<Gate>();
  auto w = std::make_unique<StagingWorker>("Pipe", 3);
  auto first = job(log, 1);
  first->gate = gate;  // the worker holds this one while close() runs
  w->submit(std::move(first), 5.0);
  w->submit(job(log, 2), 5.0);
  w->submit(job(log, 3), 5.0);
  std::string consumer_error, producer_error;
  std::thread consumer([&] { consumer_error = error_of([&] { w->next(20.0); }, gpuopt::ErrorKind::kValue); });
  std::thread producer([&] { producer_error = error_of([&] { w->submit(job(log, 4), 20.0); }, gpuopt::ErrorKind::kValue); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // both are waiting now
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    gate->release();
  });
  const auto t0 = Clock::now();
  w->close();
  EXPECT_LT(seconds_since(t0), 10.0);
  consumer.join();
  producer.join();
  opener.join();
  // Both were waiting (50 ms head start); on a very slow run they may have arrived after close().
  EXPECT_TRUE(consumer_error == "Pipe was closed while next() waited" ||
              consumer_error == "Pipe is closed; create a new one")
      << consumer_error;
  EXPECT_EQ(producer_error, "Pipe is closed; create a new one");
  EXPECT_EQ(log->destroyed.load(), 4);  // 3 cancelled + the refused submit
  EXPECT_EQ(w->stats().cancelled, 3);
  EXPECT_TRUE(w->closed());
  EXPECT_EQ(w->in_flight(), 0);
  ASSERT_EQ(log->stagers.size(), 1u);
  EXPECT_EQ(log->destroyers.count(*log->stagers.begin()), 0u);
  EXPECT_EQ(error_of([&] { w->next(1.0); }, gpuopt::ErrorKind::kValue), "Pipe is closed; create a new one");
  w->close();  // idempotent
  w.reset();
}

TEST(Staging, DestructorWithQueuedAndStagedJobsIsBoundedAndFreesOnItsThread) {
  auto log = std::make_shared<Log>();
  for (int round = 0; round < 50; ++round) {
    StagingWorker w("Pipe", 4);
    for (int i = 0; i < 4; ++i) {
      auto j = job(log, i);
      j->sleep_us = 100 * (i + round % 3);
      w.submit(std::move(j), 5.0);
    }
    if (round % 2 == 0) (void)w.next(5.0);
  }  // each destructor cancels what is left
  EXPECT_EQ(log->destroyed.load(), 50 * 4);
  ASSERT_GE(log->stagers.size(), 1u);
  for (const auto& id : log->stagers) EXPECT_EQ(log->destroyers.count(id), 0u);
}

TEST(Staging, BadArguments) {
  EXPECT_EQ(error_of([] { StagingWorker w("Pipe", 0); }, gpuopt::ErrorKind::kValue),
            "Pipe: depth must be in [1, 64], got 0");
  EXPECT_EQ(error_of([] { StagingWorker w("Pipe", 65); }, gpuopt::ErrorKind::kValue),
            "Pipe: depth must be in [1, 64], got 65");
  auto log = std::make_shared<Log>();
  StagingWorker w("Pipe", 1);
  EXPECT_EQ(error_of([&] { w.next(1.0); }, gpuopt::ErrorKind::kValue),
            "Pipe.next: nothing was submitted (submit a batch first)");
  for (double bad : {0.0, -1.0, std::nan(""), 1e9}) {
    const std::string msg = error_of([&] { w.submit(job(log, 1), bad); }, gpuopt::ErrorKind::kValue);
    EXPECT_NE(msg.find("Pipe.submit: timeout_s must be > 0 and <= 86400 seconds, got "), std::string::npos) << msg;
  }
  EXPECT_NE(error_of([&] { w.next(-2.0); }, gpuopt::ErrorKind::kValue).find("Pipe.next: timeout_s must be > 0"),
            std::string::npos);
  EXPECT_EQ(w.in_flight(), 0);
}

// A producer and a consumer thread, many small jobs with random staging times: order, counts and
// thread ownership hold under contention (run under TSan and ASan in CI).
TEST(Staging, ProducerAndConsumerThreads) {
  auto log = std::make_shared<Log>();
  constexpr int kJobs = 5000;
  StagingWorker w("Pipe", 4);
  std::thread producer([&] {
    std::mt19937 rng(11);
    std::uniform_int_distribution<int> sleep(0, 20);
    for (int i = 0; i < kJobs; ++i) {
      auto j = job(log, i);
      j->sleep_us = sleep(rng) == 0 ? 50 : 0;
      w.submit(std::move(j), 20.0);
    }
  });
  long mismatches = 0;
  std::thread consumer([&] {
    for (int i = 0; i < kJobs; ++i) {
      // The producer may not have submitted yet: "nothing was submitted" is a consumer error, so
      // wait for work to be in flight first (bounded).
      const auto t0 = Clock::now();
      while (w.in_flight() == 0 && seconds_since(t0) < 20) std::this_thread::yield();
      if (output_of(w.next(20.0)) != 3L * i + 1) ++mismatches;
    }
  });
  producer.join();
  consumer.join();
  EXPECT_EQ(mismatches, 0);
  const auto s = w.stats();
  EXPECT_EQ(s.submitted, kJobs);
  EXPECT_EQ(s.delivered, kJobs);
  EXPECT_EQ(log->destroyed.load(), kJobs);
  ASSERT_EQ(log->stagers.size(), 1u);
  EXPECT_EQ(log->destroyers.count(*log->stagers.begin()), 0u);
}

}  // namespace
