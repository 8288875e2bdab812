// A load generator with MLPerf LoadGen's scenarios, driving any Target (gpuopt's C++ server, or a
// Python batcher through an adapter) and timing every query from its *scheduled* time, so a server
// that stalls cannot hide its queueing (no coordinated omission).
//
//   single-stream  one query in flight; the next is issued when it completes
//   multi-stream   one query of `samples_per_query` samples in flight; its latency is its last sample's
//   server         open loop: arrivals from an arrival process (Poisson by default) at a target rate
//   offline        every query issued at once; the figure is throughput
//   closed-loop    `concurrency` clients, each issuing its next query when its last one completes
//
// A run issues until both min_queries and min_duration_s are reached (or max_queries /
// max_duration_s, whichever first), then waits up to drain_timeout_s for what is in flight; a query
// not answered by then is lost. Completions may arrive from any thread, before issue() returns.
// No CUDA, no torch, no Python here.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "gpuopt/batcher.h"  // Clock

namespace gpuopt::serve {

enum class Scenario { kSingleStream, kMultiStream, kServer, kOffline, kClosedLoop };
const char* scenario_name(Scenario s);  // "single-stream", "multi-stream", "server", "offline", "closed-loop"
Scenario parse_scenario(const std::string& name);  // kValue error listing the names

enum class ArrivalKind { kConstant, kPoisson, kGamma, kRamp, kSpike, kTrace };
const char* arrival_name(ArrivalKind k);  // "constant", "poisson", "gamma", "ramp", "spike", "trace"
ArrivalKind parse_arrival(const std::string& name);

// The server scenario's arrival process. Rates in queries per second.
struct ArrivalOptions {
  ArrivalKind kind = ArrivalKind::kPoisson;
  double rate = 0;              // > 0 (ramp: the starting rate; spike: the base rate)
  double burstiness = 1;        // gamma: squared coefficient of variation of the gaps (> 0; 1 = Poisson)
  double ramp_to_rate = 0;      // ramp: reached linearly after ramp_duration_s, then held (> 0)
  double ramp_duration_s = 0;   // ramp: > 0
  double spike_rate = 0;        // spike: rate inside [spike_start_s, spike_start_s + spike_duration_s)
  double spike_start_s = 0;
  double spike_duration_s = 0;
  std::vector<double> intervals_s;  // trace: gaps between arrivals (each >= 0, not all 0), cycled
};
constexpr double kMaxScheduleRate = 2e6;  // queries/s the generator will try to schedule

// kValue errors naming the field (a rate <= 0 or above kMaxScheduleRate, a ramp without its end, ...).
void validate(const ArrivalOptions& arrival);
// Offsets from the start, in seconds, of the first `count` arrivals (non-decreasing, first >= 0).
// Deterministic for a seed. Ramp and spike are Poisson with a time-varying rate (thinning).
std::vector<double> arrival_offsets_s(const ArrivalOptions& arrival, std::int64_t count, std::uint64_t seed);

// LoadGen's early stopping for a latency percentile: the smallest order statistic that bounds the
// true `percentile` from above with probability >= `confidence` (Binomial(n, percentile) tail), so a
// short run reports a conservative figure instead of an optimistic one.
struct EarlyStop {
  double percentile = 0.99;
  double confidence = 0.99;
  std::int64_t queries = 0;      // n
  std::int64_t min_queries = 0;  // the smallest n for which a bound exists
  bool enough = false;           // n >= min_queries
  std::int64_t order = 0;        // 1-based rank k of the bounding order statistic (0 when !enough)
  double estimate = std::numeric_limits<double>::quiet_NaN();  // the k-th smallest value (NaN when !enough)
};
std::int64_t early_stop_min_queries(double percentile, double confidence);
// `values` need not be sorted. kValue error for percentile/confidence outside (0, 1).
EarlyStop early_stop(std::vector<double> values, double percentile, double confidence);

enum class QueryStatus { kPending, kOk, kFailed, kRejected, kTimedOut, kCancelled, kLost };
const char* status_name(QueryStatus s);  // "pending", "ok", "failed", "rejected", "timed-out", "cancelled", "lost"

// An answer's checksums: kChecksums independent weighted sums of its output (a target's own
// definition; gpuopt's server: csrc/torch/server.cpp). NaN where the target computes none.
constexpr int kChecksums = 3;
using Checksums = std::array<double, kChecksums>;
inline Checksums no_checksums() {
  Checksums c;
  c.fill(std::numeric_limits<double>::quiet_NaN());
  return c;
}

struct Query {
  std::uint64_t id = 0;       // 0, 1, 2, ... in issue order
  std::int64_t sample = 0;    // which of sample_count samples it carries
  std::int64_t priority = 0;
  Clock::time_point scheduled{};
};

// What a target reports for a query, from any thread.
struct Completion {
  QueryStatus status = QueryStatus::kOk;  // not kPending or kLost
  double queue_us = -1;     // time in the batcher's queue (-1: unknown)
  double compute_us = -1;   // the batch's service time: staging, model, outputs (-1: unknown)
  std::int64_t batch_size = 0;  // of the batch it rode in (0: unknown)
  Checksums checksum = no_checksums();  // of its output, when the target computes them
  std::string error;        // for kFailed / kRejected / kTimedOut / kCancelled
};

class Target {
 public:
  virtual ~Target() = default;
  // Accepts `n` queries. Should return quickly; may complete some (a rejection) before returning.
  virtual void issue(const Query* queries, std::size_t n) = 0;
};

struct LoadOptions {
  Scenario scenario = Scenario::kServer;
  ArrivalOptions arrival;                // server only
  std::int64_t concurrency = 1;          // closed-loop: clients (>= 1)
  std::int64_t samples_per_query = 8;    // multi-stream (>= 1)
  std::int64_t sample_count = 1;         // distinct samples (>= 1); each query draws one uniformly
  std::vector<double> priority_weights;  // relative frequency of priority 0, 1, ...; empty: all 0
  std::int64_t min_queries = 100;        // >= 1 (multi-stream: query groups; offline: the queries issued)
  std::int64_t max_queries = 0;          // 0: no cap; else >= min_queries
  double min_duration_s = 0;             // >= 0
  double max_duration_s = 0;             // 0: no cap; else >= min_duration_s
  double percentile = 0.99;              // reported with early stopping, in (0, 1)
  double confidence = 0.99;              // in (0, 1)
  double slo_ms = 0;                     // 0: none; else the run is invalid when the estimate exceeds it
  double drain_timeout_s = 30;           // > 0
  std::uint64_t seed = 0;
};
void validate(const LoadOptions& options);  // kValue errors naming the field

struct QueryRecord {
  std::uint64_t id = 0;
  std::int64_t sample = 0;
  std::int64_t priority = 0;
  std::int64_t group = 0;      // multi-stream: the query it belongs to; otherwise == id
  double scheduled_s = 0;      // from the run's start
  double issued_s = 0;
  double completed_s = std::numeric_limits<double>::quiet_NaN();
  double queue_us = -1, compute_us = -1;
  std::int64_t batch_size = 0;
  Checksums checksum = no_checksums();
  QueryStatus status = QueryStatus::kPending;
  std::int32_t completions = 0;  // > 1: answered more than once (counted as duplicated)
};

struct Percentiles {  // milliseconds over the ok queries (NaN when none)
  std::int64_t n = 0;
  double mean = 0, p50 = 0, p90 = 0, p95 = 0, p99 = 0, p999 = 0, max = 0;
};

struct LoadResult {
  Scenario scenario = Scenario::kServer;
  // Per record (multi-stream: per sample).
  std::int64_t issued = 0, ok = 0, failed = 0, rejected = 0, timed_out = 0, cancelled = 0, lost = 0;
  std::int64_t duplicated = 0;  // completions beyond the first for a query
  std::int64_t unknown = 0;     // completions for ids never issued
  double duration_s = 0;        // first scheduled time -> last completion
  double issue_span_s = 0;      // first -> last issue
  double target_rate = 0;       // server: the arrival process' rate (ramp, spike: its mean over the
                                // schedule; trace: over its cycle); 0 otherwise
  double scheduled_rate = 0;    // queries scheduled per second over the schedule's span (server)
  double throughput = 0;        // ok queries (samples for multi-stream) per second of duration_s
  Percentiles latency;          // end to end from the scheduled time (multi-stream: per query group)
  Percentiles queue, compute;   // what the target reported (ok queries that reported it)
  double issue_lag_p99_ms = 0;  // issued - scheduled
  EarlyStop early_stop;         // of `latency` at options.percentile
  bool valid = true;
  std::vector<std::string> invalid_reasons;
  std::vector<std::int64_t> batch_size_counts;  // [b] = ok queries that rode in a batch of b
  std::vector<std::string> errors;              // distinct error messages, the first 8
};

class LoadGenerator {
 public:
  LoadGenerator(LoadOptions options, Target& target);  // validate()s
  LoadGenerator(const LoadGenerator&) = delete;
  LoadGenerator& operator=(const LoadGenerator&) = delete;

  // Issues on the calling thread and returns when the run and its drain are over. Once.
  LoadResult run();
  // Thread-safe; any thread, any time (a completion after the drain counts as lost-then-late: ignored).
  void complete(std::uint64_t id, const Completion& completion);
  // Stops issuing early (thread-safe); run() then drains and returns, marked invalid ("stopped").
  void stop();
  // True once the run's drain ended: later completions are ignored, so a target may drop what it still
  // holds of this run instead of serving it (thread-safe).
  bool finished() const;
  // Every query's record (after run()).
  std::vector<QueryRecord> records() const;

 private:
  struct Draws;  // sample and priority of each query (seeded; run()'s thread only)
  // Appends the record of one query (under mu_) and returns what issue() receives.
  Query admit_locked(Draws& draws, double scheduled_s, Clock::time_point scheduled, std::int64_t group,
                     Clock::time_point now);
  // The stop rule of every scenario, for the unit (query; multi-stream: group) about to be issued.
  bool done(std::int64_t units, double elapsed_s) const;
  // Calls the target without holding mu_ (it may complete() synchronously).
  void issue_unlocked(std::unique_lock<std::mutex>& lock, const std::vector<Query>& batch);
  // Waits (bounded by `until`) for stop(); true when stop() was called.
  bool stopped_by(std::unique_lock<std::mutex>& lock, Clock::time_point until);
  std::int64_t issue_server(std::unique_lock<std::mutex>& lock, Draws& draws);
  std::int64_t issue_closed_loop(std::unique_lock<std::mutex>& lock, Draws& draws, std::int64_t clients,
                                 std::int64_t group_size);
  std::int64_t issue_offline(std::unique_lock<std::mutex>& lock, Draws& draws);
  void drain_locked(std::unique_lock<std::mutex>& lock, Clock::time_point deadline);
  LoadResult summarize_locked(std::int64_t units) const;

  LoadOptions options_;
  Target& target_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::deque<QueryRecord> records_;              // indexed by id
  std::deque<std::int64_t> group_left_;          // closed loops: samples of each group not yet answered
  std::deque<Clock::time_point> free_since_;     // closed loops: when each idle client became free
  std::vector<std::string> errors_;
  std::vector<std::string> first_error_;         // by QueryStatus: the first message seen
  std::int64_t duplicated_ = 0, unknown_ = 0;
  Clock::time_point start_{};
  std::int64_t outstanding_ = 0;  // issued, not yet completed
  bool closed_loop_ = false;
  bool stalled_ = false;          // a closed loop saw no completion for drain_timeout_s
  bool stopped_ = false;          // stop() ended the issuing
  bool draining_done_ = false;
  std::atomic<bool> stop_{false};
  bool ran_ = false;
};

}  // namespace gpuopt::serve
