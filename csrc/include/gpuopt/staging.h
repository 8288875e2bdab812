// A bounded, ordered staging worker: jobs submitted by a consumer are staged one at a time, in
// order, by one worker thread, at most `depth` in flight, and handed back in submission order.
// It is the thread and queue logic of the input pipeline; what staging a job means is the job's.
//
// Ownership rule that keeps a Python-owned buffer from being freed on the worker thread (a deleter
// that needs the GIL would deadlock against a consumer joining the worker with the GIL held): the
// worker never destroys a job. Jobs are destroyed by the consumer's calls: next() hands the job
// back, close() (and the destructor) destroys the jobs not delivered, on the calling thread.
//
// Every wait is bounded: submit() and next() take a timeout; close() waits only for the job being
// staged, whose stage() must itself return in bounded time. No CUDA, no torch, no Python here.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace gpuopt {

class StagingJob {
 public:
  virtual ~StagingJob() = default;
  // Runs on the worker thread. An exception is re-thrown by the next() that delivers this job.
  virtual void stage() = 0;
};

struct StagingStats {
  std::int64_t submitted = 0, delivered = 0;
  std::int64_t failed = 0;     // jobs whose stage() threw
  std::int64_t cancelled = 0;  // jobs dropped by close() before delivery
  double stage_ms = 0;         // worker time in stage()
  double wait_ms = 0;          // consumer time blocked in next()
};

constexpr std::int64_t kMaxStagingDepth = 64;
constexpr double kMaxStagingTimeoutS = 24 * 3600.0;

class StagingWorker {
 public:
  // `name` prefixes error messages ("InputPipeline.next: ..."). Starts the worker thread.
  StagingWorker(std::string name, std::int64_t depth);
  ~StagingWorker();  // close()
  StagingWorker(const StagingWorker&) = delete;
  StagingWorker& operator=(const StagingWorker&) = delete;

  // Queues `job`, waiting up to timeout_s while `depth` jobs are in flight. ValueError-kind when
  // closed; RuntimeError-kind when no room was made in time (the job is then destroyed here).
  void submit(std::unique_ptr<StagingJob> job, double timeout_s);
  // The oldest job once it is staged, waiting up to timeout_s; re-throws what its stage() threw
  // (the job is destroyed here). ValueError-kind when nothing is in flight or when closed;
  // RuntimeError-kind on timeout.
  std::unique_ptr<StagingJob> next(double timeout_s);
  // Cancels: jobs not yet delivered are dropped (destroyed on this thread), waiters in submit()
  // and next() fail with "closed", and the worker exits after the job it is staging. Idempotent.
  void close() noexcept;

  bool closed() const;
  std::int64_t in_flight() const;  // submitted, not yet delivered
  std::int64_t depth() const { return depth_; }
  StagingStats stats() const;
  const std::string& name() const { return name_; }

 private:
  struct Entry {
    std::unique_ptr<StagingJob> job;
    std::exception_ptr error;
  };
  void run();
  std::int64_t in_flight_locked() const;
  void check_timeout(double timeout_s, const char* call) const;

  const std::string name_;
  const std::int64_t depth_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::deque<Entry> pending_, ready_;
  bool staging_ = false;  // the worker holds a job
  bool closed_ = false;
  StagingStats stats_;
  std::mutex close_mu_;  // one close() joins; others wait for it
  std::thread thread_;   // last: started once everything above exists
};

}  // namespace gpuopt
