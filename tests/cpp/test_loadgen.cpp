#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <iomanip>
#include <functional>
#include <limits>
#include <mutex>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gpuopt/errors.h"
#include "gpuopt/loadgen.h"
#include "gpuopt/stats.h"

namespace {

using gpuopt::serve::ArrivalKind;
using gpuopt::serve::ArrivalOptions;
using gpuopt::serve::Clock;
using gpuopt::serve::Completion;
using gpuopt::serve::EarlyStop;
using gpuopt::serve::LoadGenerator;
using gpuopt::serve::LoadOptions;
using gpuopt::serve::LoadResult;
using gpuopt::serve::Query;
using gpuopt::serve::QueryRecord;
using gpuopt::serve::QueryStatus;
using gpuopt::serve::Scenario;
using gpuopt::serve::Target;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

template <typename F>
std::string value_error_of(F&& f) {
  try {
    f();
  } catch (const gpuopt::Error& e) {
    EXPECT_EQ(static_cast<int>(e.kind()), static_cast<int>(gpuopt::ErrorKind::kValue)) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected a gpuopt::Error";
  return "";
}

bool has_reason(const LoadResult& r, const std::string& part) {
  for (const std::string& reason : r.invalid_reasons) {
    if (reason.find(part) != std::string::npos) return true;
  }
  return false;
}

std::string reasons(const LoadResult& r) {
  std::string out;
  for (const std::string& reason : r.invalid_reasons) out += "[" + reason + "] ";
  return out;
}

ArrivalOptions arrival(ArrivalKind kind, double rate) {
  ArrivalOptions a;
  a.kind = kind;
  a.rate = rate;
  return a;
}

std::vector<double> gaps_of(const std::vector<double>& offsets) {
  std::vector<double> g(offsets.size());
  std::adjacent_difference(offsets.begin(), offsets.end(), g.begin());
  return g;  // g[0] is the first offset itself (the first gap for the random processes)
}

double mean_of(const std::vector<double>& x) { return std::accumulate(x.begin(), x.end(), 0.0) / x.size(); }

double cv2_of(const std::vector<double>& x) {
  const double m = mean_of(x);
  double ss = 0;
  for (double v : x) ss += (v - m) * (v - m);
  return ss / (x.size() - 1) / (m * m);
}

std::int64_t count_in(const std::vector<double>& offsets, double lo, double hi) {
  return std::count_if(offsets.begin(), offsets.end(), [&](double t) { return t >= lo && t < hi; });
}

// ---- a fake server ------------------------------------------------------------------------------------

struct FakeOptions {
  int service_us = 200;                  // per batch
  std::size_t max_batch = 1u << 20;      // takes up to this many of what is queued
  std::int64_t max_in_flight = 0;        // > 0: issue() counts a violation beyond it
  std::uint64_t drop_every = 0;          // > 0: ids with id % drop_every == drop_every - 1 are never answered
  std::uint64_t reject_every = 0;        // > 0: ids with id % reject_every == 0 are rejected inside issue()
  bool answer_twice = false;             // each query is completed twice (the second as failed)
  bool answer_unknown = false;           // the first issue() also completes an id never issued
  int stall_us = 0;                      // > 0: issue() answers inline, the first call after stalling this long
};

// One worker thread serving FIFO batches of what is queued after a simulated service time, like a
// dynamic batcher with one executor. It counts what it sees for the tests' assertions.
class FakeServer : public Target {
 public:
  explicit FakeServer(FakeOptions o) : o_(o) {}
  ~FakeServer() override { shutdown(); }

  void start(LoadGenerator& gen) {
    gen_ = &gen;
    worker_ = std::thread([this] { serve(); });
  }

  // Joins the worker: call before the LoadGenerator it completes into is destroyed.
  void shutdown() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closing_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  void issue(const Query* q, std::size_t n) override {
    if (o_.stall_us > 0) {
      bool first;
      {
        std::lock_guard<std::mutex> lock(mu_);
        first = call_sizes.empty();
        call_sizes.push_back(n);
      }
      if (first) std::this_thread::sleep_for(std::chrono::microseconds(o_.stall_us));
      for (std::size_t i = 0; i < n; ++i) gen_->complete(q[i].id, Completion{});
      return;
    }
    std::vector<std::uint64_t> rejected;
    std::vector<std::uint64_t> unknown;
    {
      std::lock_guard<std::mutex> lock(mu_);
      call_sizes.push_back(n);
      if (o_.max_in_flight > 0 && in_flight_ + static_cast<std::int64_t>(n) > o_.max_in_flight) ++violations;
      for (std::size_t i = 0; i < n; ++i) {
        received.push_back(q[i]);
        if (o_.reject_every > 0 && q[i].id % o_.reject_every == 0) {
          rejected.push_back(q[i].id);
        } else if (o_.drop_every > 0 && q[i].id % o_.drop_every == o_.drop_every - 1) {
          ++dropped;
        } else {
          queue_.push_back({q[i].id, Clock::now()});
          ++in_flight_;
        }
      }
      max_in_flight = std::max(max_in_flight, in_flight_);
      if (o_.answer_unknown && call_sizes.size() == 1) unknown.push_back(1000000007);
    }
    cv_.notify_all();
    // Synchronous answers, from inside issue(), without holding our lock (as a real queue would).
    for (std::uint64_t id : rejected) {
      Completion c;
      c.status = QueryStatus::kRejected;
      c.error = "queue full";
      gen_->complete(id, c);
    }
    for (std::uint64_t id : unknown) gen_->complete(id, Completion{});
  }

  // Read after shutdown().
  std::vector<std::size_t> call_sizes;
  std::vector<Query> received;
  std::int64_t max_in_flight = 0;
  std::int64_t violations = 0;
  std::int64_t dropped = 0;

 private:
  struct Item {
    std::uint64_t id;
    Clock::time_point enqueued;
  };

  void serve() {
    for (;;) {
      std::vector<Item> batch;
      Clock::time_point taken;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_for(lock, std::chrono::milliseconds(20), [this] { return closing_ || !queue_.empty(); });
        if (closing_) return;
        if (queue_.empty()) continue;
        while (!queue_.empty() && batch.size() < o_.max_batch) {
          batch.push_back(queue_.front());
          queue_.pop_front();
        }
        taken = Clock::now();
      }
      std::this_thread::sleep_for(std::chrono::microseconds(o_.service_us));
      const double compute_us = std::chrono::duration<double, std::micro>(Clock::now() - taken).count();
      for (const Item& item : batch) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          --in_flight_;  // before complete(): the generator may issue the next query at once
        }
        Completion c;
        c.queue_us = std::chrono::duration<double, std::micro>(taken - item.enqueued).count();
        c.compute_us = compute_us;
        c.batch_size = static_cast<std::int64_t>(batch.size());
        c.checksum = {static_cast<double>(item.id), -1.0, 0.5};  // all kChecksums travel to the record
        gen_->complete(item.id, c);
        if (o_.answer_twice) {
          Completion again;
          again.status = QueryStatus::kFailed;
          again.error = "answered again";
          gen_->complete(item.id, again);
        }
      }
    }
  }

  const FakeOptions o_;
  LoadGenerator* gen_ = nullptr;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  std::int64_t in_flight_ = 0;
  bool closing_ = false;
  std::thread worker_;
};

// Answers every query inside issue() with what `answer` says.
class InlineTarget : public Target {
 public:
  explicit InlineTarget(std::function<Completion(const Query&)> answer) : answer_(std::move(answer)) {}
  void attach(LoadGenerator& gen) { gen_ = &gen; }
  void issue(const Query* q, std::size_t n) override {
    for (std::size_t i = 0; i < n; ++i) gen_->complete(q[i].id, answer_(q[i]));
  }

 private:
  std::function<Completion(const Query&)> answer_;
  LoadGenerator* gen_ = nullptr;
};

struct Outcome {
  LoadResult result;
  std::vector<QueryRecord> records;
  std::vector<std::size_t> call_sizes;
  std::vector<Query> received;
  std::int64_t max_in_flight = 0, violations = 0, dropped = 0;
  double wall_s = 0;
};

Outcome run_load(const LoadOptions& options, const FakeOptions& fake) {
  FakeServer server(fake);
  LoadGenerator gen(options, server);
  struct Join {
    FakeServer& s;
    ~Join() { s.shutdown(); }  // before gen is destroyed, even when a check throws
  } join{server};
  server.start(gen);
  Outcome out;
  const auto t0 = Clock::now();
  out.result = gen.run();
  out.wall_s = seconds_since(t0);
  server.shutdown();
  out.records = gen.records();
  out.call_sizes = server.call_sizes;
  out.received = server.received;
  out.max_in_flight = server.max_in_flight;
  out.violations = server.violations;
  out.dropped = server.dropped;
  return out;
}

LoadOptions server_options(ArrivalKind kind, double rate, std::int64_t queries) {
  LoadOptions o;
  o.scenario = Scenario::kServer;
  o.arrival = arrival(kind, rate);
  o.min_queries = queries;
  o.drain_timeout_s = 5;
  return o;
}

LoadOptions scenario_options(Scenario s, std::int64_t queries) {
  LoadOptions o;
  o.scenario = s;
  o.min_queries = queries;
  o.drain_timeout_s = 5;
  return o;
}

// ---- validation ---------------------------------------------------------------------------------------

TEST(LoadGenValidation, ArrivalErrorsNameTheField) {
  using gpuopt::serve::validate;
  EXPECT_EQ(value_error_of([] { validate(arrival(ArrivalKind::kPoisson, -1)); }),
            "arrival.rate must be in (0, 2e+06] queries/s, got -1");
  EXPECT_EQ(value_error_of([] { validate(arrival(ArrivalKind::kConstant, 3e6)); }),
            "arrival.rate must be in (0, 2e+06] queries/s, got 3e+06");
  EXPECT_EQ(value_error_of([] { validate(arrival(ArrivalKind::kConstant, std::nan(""))); }),
            "arrival.rate must be in (0, 2e+06] queries/s, got nan");
  ArrivalOptions g = arrival(ArrivalKind::kGamma, 100);
  g.burstiness = 0;
  EXPECT_EQ(value_error_of([&] { validate(g); }),
            "arrival.burstiness (squared coefficient of variation of the gaps) must be finite and > 0, got 0");
  ArrivalOptions r = arrival(ArrivalKind::kRamp, 100);
  EXPECT_EQ(value_error_of([&] { validate(r); }), "arrival.ramp_to_rate must be in (0, 2e+06] queries/s, got 0");
  r.ramp_to_rate = 200;
  EXPECT_EQ(value_error_of([&] { validate(r); }),
            "arrival.ramp_duration_s must be a finite number of seconds > 0, got 0");
  ArrivalOptions s = arrival(ArrivalKind::kSpike, 100);
  s.spike_duration_s = 1;
  EXPECT_EQ(value_error_of([&] { validate(s); }), "arrival.spike_rate must be in (0, 2e+06] queries/s, got 0");
  s.spike_rate = 1000;
  s.spike_start_s = -1;
  EXPECT_EQ(value_error_of([&] { validate(s); }),
            "arrival.spike_start_s must be a finite number of seconds >= 0, got -1");
  s.spike_start_s = 0;
  s.spike_duration_s = 0;
  EXPECT_EQ(value_error_of([&] { validate(s); }),
            "arrival.spike_duration_s must be a finite number of seconds > 0, got 0");
  ArrivalOptions t = arrival(ArrivalKind::kTrace, 0);  // a trace ignores rate
  EXPECT_EQ(value_error_of([&] { validate(t); }), "arrival.intervals_s must not be empty for a trace");
  t.intervals_s = {0.1, -0.5};
  EXPECT_EQ(value_error_of([&] { validate(t); }),
            "arrival.intervals_s[1] must be a finite number of seconds >= 0, got -0.5");
  t.intervals_s = {0, 0, 0};
  EXPECT_EQ(value_error_of([&] { validate(t); }), "arrival.intervals_s must not all be 0 (3 gaps of 0 s: an infinite rate)");
  t.intervals_s = {0, 1e-7};
  EXPECT_EQ(value_error_of([&] { validate(t); }),
            "arrival.intervals_s must average a rate <= 2e+06 queries/s, got 2e+07 (2 gaps over 1e-07 s)");
  t.intervals_s = {0, 0.01};
  validate(t);
  EXPECT_EQ(value_error_of([] { gpuopt::serve::arrival_offsets_s(arrival(ArrivalKind::kPoisson, 1), -1, 0); }),
            "count must be >= 0, got -1");
  EXPECT_EQ(value_error_of([] { gpuopt::serve::arrival_offsets_s(arrival(ArrivalKind::kPoisson, 0), 5, 0); }),
            "arrival.rate must be in (0, 2e+06] queries/s, got 0");
}

TEST(LoadGenValidation, LoadOptionErrorsNameTheField) {
  using gpuopt::serve::validate;
  auto error_with = [](auto change) {
    LoadOptions o = scenario_options(Scenario::kClosedLoop, 10);
    change(o);
    return value_error_of([&] { validate(o); });
  };
  EXPECT_EQ(error_with([](LoadOptions& o) { o.min_queries = 0; }), "min_queries must be >= 1, got 0");
  EXPECT_EQ(error_with([](LoadOptions& o) { o.max_queries = 5; }),
            "max_queries must be 0 (no cap) or >= min_queries=10, got 5");
  EXPECT_EQ(error_with([](LoadOptions& o) { o.concurrency = 0; }), "concurrency must be >= 1, got 0");
  EXPECT_EQ(error_with([](LoadOptions& o) { o.samples_per_query = -2; }), "samples_per_query must be >= 1, got -2");
  EXPECT_EQ(error_with([](LoadOptions& o) { o.sample_count = 0; }), "sample_count must be >= 1, got 0");
  EXPECT_EQ(error_with([](LoadOptions& o) { o.priority_weights = {1, -1}; }),
            "priority_weights[1] must be finite and >= 0, got -1");
  EXPECT_EQ(error_with([](LoadOptions& o) { o.priority_weights = {1, INFINITY}; }),
            "priority_weights[1] must be finite and >= 0, got inf");
  EXPECT_EQ(error_with([](LoadOptions& o) { o.priority_weights = {0, 0}; }),
            "priority_weights must have a positive sum (or be empty: every query at priority 0), got 2 zeros");
  EXPECT_EQ(error_with([](LoadOptions& o) { o.min_duration_s = -1; }),
            "min_duration_s must be a finite number of seconds >= 0, got -1");
  EXPECT_EQ(error_with([](LoadOptions& o) {
              o.min_duration_s = 2;
              o.max_duration_s = 1;
            }),
            "max_duration_s must be 0 (no cap) or finite and >= min_duration_s=2, got 1");
  EXPECT_EQ(error_with([](LoadOptions& o) { o.percentile = 1; }), "percentile must be in (0, 1), got 1");
  EXPECT_EQ(error_with([](LoadOptions& o) { o.confidence = 0; }), "confidence must be in (0, 1), got 0");
  EXPECT_EQ(error_with([](LoadOptions& o) { o.slo_ms = -3; }), "slo_ms must be 0 (none) or finite and > 0, got -3");
  EXPECT_EQ(error_with([](LoadOptions& o) { o.drain_timeout_s = 0; }),
            "drain_timeout_s must be a finite number of seconds > 0, got 0");
  // The arrival process is checked for the server only, also by the constructor.
  LoadOptions closed = scenario_options(Scenario::kClosedLoop, 10);
  closed.arrival.rate = 0;
  validate(closed);
  closed.scenario = Scenario::kServer;
  FakeServer unused(FakeOptions{});
  EXPECT_EQ(value_error_of([&] { LoadGenerator gen(closed, unused); }),
            "arrival.rate must be in (0, 2e+06] queries/s, got 0");
}

TEST(LoadGenValidation, NamesRoundTrip) {
  using namespace gpuopt::serve;
  for (Scenario s : {Scenario::kSingleStream, Scenario::kMultiStream, Scenario::kServer, Scenario::kOffline,
                     Scenario::kClosedLoop}) {
    EXPECT_EQ(parse_scenario(scenario_name(s)), s);
  }
  for (ArrivalKind k : {ArrivalKind::kConstant, ArrivalKind::kPoisson, ArrivalKind::kGamma, ArrivalKind::kRamp,
                        ArrivalKind::kSpike, ArrivalKind::kTrace}) {
    EXPECT_EQ(parse_arrival(arrival_name(k)), k);
  }
  EXPECT_STREQ(scenario_name(Scenario::kClosedLoop), "closed-loop");
  EXPECT_STREQ(status_name(QueryStatus::kTimedOut), "timed-out");
  EXPECT_EQ(value_error_of([] { parse_scenario("Server"); }),
            "scenario must be one of single-stream, multi-stream, server, offline, closed-loop; got 'Server'");
  EXPECT_EQ(value_error_of([] { parse_arrival("uniform"); }),
            "arrival kind must be one of constant, poisson, gamma, ramp, spike, trace; got 'uniform'");
}

// ---- arrival processes -------------------------------------------------------------------------------

TEST(LoadGenArrivals, ConstantIsExactAndStartsAtZero) {
  const auto t = gpuopt::serve::arrival_offsets_s(arrival(ArrivalKind::kConstant, 300), 1000, 5);
  ASSERT_EQ(t.size(), 1000u);
  for (std::size_t k = 0; k < t.size(); ++k) ASSERT_EQ(t[k], static_cast<double>(k) / 300) << k;
}

TEST(LoadGenArrivals, PoissonGapsAreExponentialWithTheRate) {
  const auto t = gpuopt::serve::arrival_offsets_s(arrival(ArrivalKind::kPoisson, 1000), 200000, 11);
  const auto g = gaps_of(t);
  EXPECT_GT(t[0], 0.0);  // the first arrival is one gap after the start
  EXPECT_TRUE(std::is_sorted(t.begin(), t.end()));
  EXPECT_NEAR(mean_of(g), 1e-3, 0.03e-3);
  EXPECT_NEAR(cv2_of(g), 1.0, 0.03);
  // The exponential's median is ln 2 times its mean.
  std::vector<double> sorted = g;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_NEAR(gpuopt::stats::quantile_sorted(sorted, 0.5), std::log(2.0) * 1e-3, 0.03e-3);
}

TEST(LoadGenArrivals, GammaGapsHaveTheMeanAndSquaredCvOfTheBurstiness) {
  for (double burstiness : {0.25, 4.0}) {
    ArrivalOptions a = arrival(ArrivalKind::kGamma, 500);
    a.burstiness = burstiness;
    const auto g = gaps_of(gpuopt::serve::arrival_offsets_s(a, 200000, 3));
    EXPECT_NEAR(mean_of(g), 2e-3, 0.03 * 2e-3) << burstiness;
    EXPECT_NEAR(cv2_of(g), burstiness, 0.08 * burstiness) << burstiness;
  }
}

TEST(LoadGenArrivals, RampRaisesTheRateLinearlyThenHoldsIt) {
  ArrivalOptions a = arrival(ArrivalKind::kRamp, 1000);
  a.ramp_to_rate = 5000;
  a.ramp_duration_s = 1;
  const auto t = gpuopt::serve::arrival_offsets_s(a, 12000, 21);
  ASSERT_GT(t.back(), 2.0);
  // Expected counts: the integral of the rate; Poisson sd is the square root, 4 sd allowed.
  const double first = 1000 * 0.25 + 4000 * 0.25 * 0.25 / 2;  // 375
  const double last = (4000 + 5000) / 2.0 * 0.25;             // 1125
  EXPECT_NEAR(count_in(t, 0, 0.25), first, 4 * std::sqrt(first));
  EXPECT_NEAR(count_in(t, 0.75, 1.0), last, 4 * std::sqrt(last));
  EXPECT_NEAR(count_in(t, 1.0, 2.0), 5000, 4 * std::sqrt(5000.0));
  // A falling ramp, by a factor 1000: the bound follows the rate down.
  a.rate = 2e5;
  a.ramp_to_rate = 200;
  a.ramp_duration_s = 0.01;
  const auto d = gpuopt::serve::arrival_offsets_s(a, 3000, 22);
  const double in_ramp = (2e5 + 200) / 2 * 0.01;  // 1001
  EXPECT_NEAR(count_in(d, 0, 0.01), in_ramp, 4 * std::sqrt(in_ramp));
  EXPECT_NEAR(count_in(d, 0.01, 5.01), 1000, 4 * std::sqrt(1000.0));
}

TEST(LoadGenArrivals, SpikeRaisesTheRateInsideItsWindowOnly) {
  ArrivalOptions a = arrival(ArrivalKind::kSpike, 1000);
  a.spike_rate = 20000;
  a.spike_start_s = 0.5;
  a.spike_duration_s = 0.1;
  const auto t = gpuopt::serve::arrival_offsets_s(a, 4000, 8);
  ASSERT_GT(t.back(), 1.0);
  EXPECT_NEAR(count_in(t, 0, 0.5), 500, 4 * std::sqrt(500.0));
  EXPECT_NEAR(count_in(t, 0.5, 0.6), 2000, 4 * std::sqrt(2000.0));
  EXPECT_NEAR(count_in(t, 0.6, 1.0), 400, 4 * std::sqrt(400.0));
  EXPECT_TRUE(std::is_sorted(t.begin(), t.end()));
}

TEST(LoadGenArrivals, TraceCyclesItsGapsFromZero) {
  ArrivalOptions a;
  a.kind = ArrivalKind::kTrace;
  a.intervals_s = {0.001, 0.003, 0};
  const auto t = gpuopt::serve::arrival_offsets_s(a, 8, 99);
  const std::vector<double> want = {0, 0.001, 0.004, 0.004, 0.005, 0.008, 0.008, 0.009};
  ASSERT_EQ(t.size(), want.size());
  for (std::size_t i = 0; i < t.size(); ++i) EXPECT_NEAR(t[i], want[i], 1e-15) << i;
}

TEST(LoadGenArrivals, DeterministicPerSeed) {
  std::vector<ArrivalOptions> kinds = {arrival(ArrivalKind::kPoisson, 100), arrival(ArrivalKind::kGamma, 100),
                                       arrival(ArrivalKind::kRamp, 100), arrival(ArrivalKind::kSpike, 100)};
  kinds[1].burstiness = 3;
  kinds[2].ramp_to_rate = 400;
  kinds[2].ramp_duration_s = 2;
  kinds[3].spike_rate = 900;
  kinds[3].spike_duration_s = 1;
  for (const ArrivalOptions& a : kinds) {
    const auto x = gpuopt::serve::arrival_offsets_s(a, 5000, 42);
    EXPECT_EQ(x, gpuopt::serve::arrival_offsets_s(a, 5000, 42)) << gpuopt::serve::arrival_name(a.kind);
    EXPECT_NE(x, gpuopt::serve::arrival_offsets_s(a, 5000, 43)) << gpuopt::serve::arrival_name(a.kind);
    // A prefix is the same process: a run drawing offsets in chunks sees the same schedule.
    const auto prefix = gpuopt::serve::arrival_offsets_s(a, 777, 42);
    EXPECT_TRUE(std::equal(prefix.begin(), prefix.end(), x.begin()));
  }
}

// ---- early stopping ----------------------------------------------------------------------------------

// The smallest 1-based rank k with P[Binomial(n, p) <= k - 1] >= c, by direct summation in long
// double (n + 1 if none); `margin` is the smallest |cdf - c| met, to skip ties rounding could flip.
std::int64_t exact_rank(std::int64_t n, double p, double c, long double* margin) {
  long double cdf = 0, pmf = std::pow(1.0L - p, static_cast<long double>(n));  // P[B = 0]
  *margin = 1;
  for (std::int64_t j = 0; j <= n; ++j) {
    cdf += pmf;
    *margin = std::min(*margin, std::fabs(cdf - static_cast<long double>(c)));
    if (cdf >= c) return j + 1;
    pmf *= static_cast<long double>(n - j) / (j + 1) * p / (1 - p);
  }
  return n + 1;
}

TEST(LoadGenEarlyStop, KnownMinimumQueries) {
  using gpuopt::serve::early_stop_min_queries;
  EXPECT_EQ(early_stop_min_queries(0.9, 0.99), 44);
  EXPECT_EQ(early_stop_min_queries(0.99, 0.99), 459);
  EXPECT_EQ(early_stop_min_queries(0.99, 0.95), 299);
  EXPECT_EQ(early_stop_min_queries(0.999, 0.99), 4603);
  EXPECT_EQ(early_stop_min_queries(0.5, 0.5), 1);
  for (double p : {0.5, 0.9, 0.95, 0.99}) {
    for (double c : {0.5, 0.9, 0.99}) {
      const std::int64_t n = early_stop_min_queries(p, c);
      EXPECT_LE(std::pow(p, n), 1 - c + 1e-15) << p << " " << c;
      if (n > 1) {
        EXPECT_GT(std::pow(p, n - 1), 1 - c) << p << " " << c;
      }
    }
  }
}

TEST(LoadGenEarlyStop, RankMatchesTheExactBinomialForSmallN) {
  int compared = 0;
  for (double p : {0.5, 0.9, 0.95, 0.99}) {
    for (double c : {0.9, 0.95, 0.99}) {
      const std::int64_t min_n = gpuopt::serve::early_stop_min_queries(p, c);
      for (std::int64_t n = 1; n <= 600; n += (n < 120 ? 1 : 7)) {
        long double margin;
        const std::int64_t k = exact_rank(n, p, c, &margin);
        if (margin < 1e-12L) continue;
        std::vector<double> values(static_cast<std::size_t>(n));
        std::iota(values.begin(), values.end(), 1.0);
        std::shuffle(values.begin(), values.end(), std::mt19937(static_cast<unsigned>(n)));
        const EarlyStop e = gpuopt::serve::early_stop(values, p, c);
        ASSERT_EQ(e.queries, n);
        ASSERT_EQ(e.min_queries, min_n);
        if (k > n) {
          ASSERT_FALSE(e.enough) << "n=" << n << " p=" << p << " c=" << c;
          ASSERT_EQ(e.order, 0);
          ASSERT_TRUE(std::isnan(e.estimate));
        } else {
          ASSERT_TRUE(e.enough) << "n=" << n << " p=" << p << " c=" << c;
          ASSERT_EQ(e.order, k) << "n=" << n << " p=" << p << " c=" << c;
          ASSERT_EQ(e.estimate, static_cast<double>(k));  // the k-th smallest of 1..n
        }
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 1500);
}

TEST(LoadGenEarlyStop, BoundaryAtTheMinimumCount) {
  std::vector<double> values(458);
  std::iota(values.begin(), values.end(), 0.5);
  EarlyStop e = gpuopt::serve::early_stop(values, 0.99, 0.99);
  EXPECT_FALSE(e.enough);
  EXPECT_EQ(e.min_queries, 459);
  values.push_back(1000);
  e = gpuopt::serve::early_stop(values, 0.99, 0.99);
  EXPECT_TRUE(e.enough);
  EXPECT_EQ(e.order, 459);  // only the maximum bounds the p99 at 459 samples
  EXPECT_EQ(e.estimate, 1000);
}

TEST(LoadGenEarlyStop, LargeNFollowsTheNormalApproximation) {
  std::mt19937_64 rng(5);
  std::lognormal_distribution<double> latency(0.0, 0.5);
  for (std::int64_t n : {100000, 1000000}) {
    std::vector<double> values(static_cast<std::size_t>(n));
    for (double& v : values) v = latency(rng);
    const auto t0 = Clock::now();
    const EarlyStop e = gpuopt::serve::early_stop(values, 0.99, 0.99);
    const double took = seconds_since(t0);
    const double np = n * 0.99, sd = std::sqrt(n * 0.99 * 0.01);
    EXPECT_NEAR(static_cast<double>(e.order), np + 2.326 * sd + 0.5, 3.0 + 0.05 * sd) << n;
    std::sort(values.begin(), values.end());
    EXPECT_EQ(e.estimate, values[static_cast<std::size_t>(e.order - 1)]);
    EXPECT_GT(e.estimate, gpuopt::stats::quantile_sorted(values, 0.99));  // conservative
    EXPECT_LT(took, 5.0) << "early_stop must not be quadratic";
  }
}

TEST(LoadGenEarlyStop, RankIsMonotone) {
  std::int64_t previous = 458;
  for (std::int64_t n = 459; n <= 3000; ++n) {
    const EarlyStop e = gpuopt::serve::early_stop(std::vector<double>(static_cast<std::size_t>(n), 1.0), 0.99, 0.99);
    ASSERT_TRUE(e.enough);
    ASSERT_GE(e.order, previous) << n;  // one more sample: the same rank or the next
    ASSERT_LE(e.order - previous, 1) << n;
    ASSERT_LE(e.order, n);
    previous = e.order;
  }
  EXPECT_LT(previous, 3000 - 10);  // the rank falls behind n as n grows
  std::vector<double> values(2000, 1.0);
  std::int64_t lower = 0;
  for (double c : {0.5, 0.8, 0.9, 0.95, 0.99, 0.999}) {
    const EarlyStop e = gpuopt::serve::early_stop(values, 0.95, c);
    EXPECT_GT(e.order, lower) << c;  // more confidence: a higher rank
    lower = e.order;
  }
}

TEST(LoadGenEarlyStop, BadArguments) {
  EXPECT_EQ(value_error_of([] { gpuopt::serve::early_stop({1, 2}, 1.0, 0.9); }),
            "percentile must be in (0, 1), got 1");
  EXPECT_EQ(value_error_of([] { gpuopt::serve::early_stop({1, 2}, 0.9, 0); }), "confidence must be in (0, 1), got 0");
  EXPECT_EQ(value_error_of([] { gpuopt::serve::early_stop({1, std::nan("")}, 0.9, 0.9); }),
            "early_stop: values must be finite, got nan at index 1");
  const EarlyStop none = gpuopt::serve::early_stop({}, 0.9, 0.99);
  EXPECT_EQ(none.queries, 0);
  EXPECT_FALSE(none.enough);
  EXPECT_EQ(none.min_queries, 44);
}

// ---- scenarios ---------------------------------------------------------------------------------------

TEST(LoadGenServer, SustainableRateIsValidAndTimedFromTheSchedule) {
  LoadOptions o = server_options(ArrivalKind::kPoisson, 2000, 600);
  const Outcome out = run_load(o, FakeOptions{});
  const LoadResult& r = out.result;
  EXPECT_TRUE(r.valid) << reasons(r);
  EXPECT_EQ(r.issued, 600);
  EXPECT_EQ(r.ok, 600);
  EXPECT_EQ(r.lost + r.failed + r.rejected + r.duplicated + r.unknown, 0);
  EXPECT_EQ(r.target_rate, 2000);
  EXPECT_NEAR(r.scheduled_rate, 2000, 300);
  EXPECT_NEAR(r.throughput, r.scheduled_rate, 0.1 * r.scheduled_rate);
  // Every latency includes at least the service time; the percentiles agree with the records.
  std::vector<double> latency_ms;
  for (const QueryRecord& q : out.records) {
    ASSERT_EQ(q.status, QueryStatus::kOk);
    ASSERT_GE(q.issued_s, q.scheduled_s);
    latency_ms.push_back((q.completed_s - q.scheduled_s) * 1e3);
    ASSERT_GE(latency_ms.back(), 0.2) << q.id;
    EXPECT_EQ(q.checksum, (gpuopt::serve::Checksums{static_cast<double>(q.id), -1.0, 0.5}));
    EXPECT_EQ(q.completions, 1);
  }
  std::sort(latency_ms.begin(), latency_ms.end());
  EXPECT_EQ(r.latency.n, 600);
  EXPECT_DOUBLE_EQ(r.latency.p50, gpuopt::stats::quantile_sorted(latency_ms, 0.5));
  EXPECT_DOUBLE_EQ(r.latency.p99, gpuopt::stats::quantile_sorted(latency_ms, 0.99));
  EXPECT_DOUBLE_EQ(r.latency.max, latency_ms.back());
  EXPECT_GE(r.latency.p50, 0.2);
  EXPECT_TRUE(r.early_stop.enough);
  EXPECT_EQ(r.early_stop.queries, 600);
  EXPECT_GE(r.early_stop.estimate, r.latency.p99);
  EXPECT_EQ(r.queue.n, 600);
  EXPECT_EQ(r.compute.n, 600);
  EXPECT_GE(r.compute.p50, 0.2);
  std::int64_t in_batches = 0;
  for (std::size_t b = 0; b < r.batch_size_counts.size(); ++b) in_batches += r.batch_size_counts[b];
  EXPECT_EQ(in_batches, 600);
  EXPECT_EQ(r.batch_size_counts.at(0), 0);
  // Queries reach the target with their ids in order and their scheduled times.
  ASSERT_EQ(out.received.size(), 600u);
  for (std::size_t i = 0; i < out.received.size(); ++i) ASSERT_EQ(out.received[i].id, i);
}

TEST(LoadGenServer, ScheduleIsTheArrivalProcessAcrossChunks) {
  LoadOptions o = server_options(ArrivalKind::kPoisson, 40000, 5000);  // crosses a 4096-offset chunk
  o.seed = 77;
  const Outcome out = run_load(o, FakeOptions{});
  const auto want = gpuopt::serve::arrival_offsets_s(o.arrival, 5000, 77);
  ASSERT_EQ(out.records.size(), 5000u);
  for (std::size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(out.records[i].scheduled_s, want[i]) << i;
    ASSERT_EQ(out.records[i].group, static_cast<std::int64_t>(i));
  }
  EXPECT_EQ(out.result.ok, 5000);
  // At this rate the generator issues what is due together: fewer calls than queries.
  EXPECT_LT(out.call_sizes.size(), 5000u);
  EXPECT_EQ(std::accumulate(out.call_sizes.begin(), out.call_sizes.end(), std::size_t{0}), 5000u);
}

TEST(LoadGenServer, TraceScheduleAndTargetRate) {
  LoadOptions o = server_options(ArrivalKind::kTrace, 0, 60);
  o.arrival.intervals_s = {0.001, 0.002};
  o.percentile = 0.9;
  const Outcome out = run_load(o, FakeOptions{});
  EXPECT_NEAR(out.result.target_rate, 2 / 0.003, 1e-9);
  ASSERT_EQ(out.records.size(), 60u);
  EXPECT_EQ(out.records[0].scheduled_s, 0.0);
  EXPECT_NEAR(out.records[59].scheduled_s, 29 * 0.003 + 0.001, 1e-12);
  EXPECT_NEAR(out.result.scheduled_rate, 59 / 0.088, 1e-6);
}

TEST(LoadGenServer, AboveCapacityIsInvalidAndLatencyIncludesTheBacklog) {
  // One query at a time, >= 1 ms each: at most 1000/s served, 2500/s scheduled.
  constexpr double kRate = 2500, kServiceS = 1e-3;
  LoadOptions o = server_options(ArrivalKind::kConstant, kRate, 500);
  FakeOptions f;
  f.max_batch = 1;
  f.service_us = 1000;
  const Outcome out = run_load(o, f);
  const LoadResult& r = out.result;
  EXPECT_FALSE(r.valid);
  EXPECT_TRUE(has_reason(r, "/s scheduled: the server could not keep up")) << reasons(r);
  EXPECT_FALSE(has_reason(r, "fell behind")) << reasons(r);  // the generator kept its schedule
  EXPECT_EQ(r.ok, 500);
  EXPECT_LT(r.throughput, 0.5 * kRate);
  // Query i cannot finish before (i + 1) service times after the start, whatever the generator did:
  // its latency from the schedule is at least (i + 1) S - i / rate. Measuring from the issue time
  // instead (coordinated omission) would hide this.
  std::vector<double> bound_ms;
  for (const QueryRecord& q : out.records) {
    const double i = static_cast<double>(q.id);
    const double bound = ((i + 1) * kServiceS - i / kRate) * 1e3;
    ASSERT_GE((q.completed_s - q.scheduled_s) * 1e3, bound - 1e-6) << q.id;
    bound_ms.push_back(bound);
  }
  std::sort(bound_ms.begin(), bound_ms.end());
  EXPECT_GE(r.latency.p99, gpuopt::stats::quantile_sorted(bound_ms, 0.99));
  EXPECT_GE(r.latency.p99, 250.0);
  // Latency grows along the run.
  auto mean_latency = [&](std::size_t from, std::size_t to) {
    double sum = 0;
    for (std::size_t i = from; i < to; ++i) sum += out.records[i].completed_s - out.records[i].scheduled_s;
    return sum / static_cast<double>(to - from);
  };
  EXPECT_GT(mean_latency(375, 500) - mean_latency(0, 125), 0.1);
  // The queue time the target reported grows the same way.
  EXPECT_GT(r.queue.max, 200.0);
}

TEST(LoadGenServer, AStallInsideIssueCannotHideFromTheSchedule) {
  // The target's first issue() blocks 150 ms (a pause), then it answers every query at once. Timed
  // from the issue, the queries due during the pause look instant (coordinated omission); timed from
  // the schedule, query i waited at least 150 ms - i / rate.
  constexpr double kRate = 2500, kStallS = 0.15;
  LoadOptions o = server_options(ArrivalKind::kConstant, kRate, 250);  // scheduled over 0.0996 s
  o.percentile = 0.5;
  FakeOptions f;
  f.stall_us = static_cast<int>(kStallS * 1e6);
  const Outcome out = run_load(o, f);
  const LoadResult& r = out.result;
  EXPECT_EQ(r.ok, 250);
  EXPECT_EQ(out.call_sizes.size(), 2u);  // query 0, then everything that fell due during the stall
  EXPECT_TRUE(has_reason(r, "the generator fell behind")) << reasons(r);
  EXPECT_TRUE(has_reason(r, "the server could not keep up")) << reasons(r);
  std::vector<double> from_issue_ms;
  for (const QueryRecord& q : out.records) {
    ASSERT_GE(q.completed_s - q.scheduled_s, kStallS - static_cast<double>(q.id) / kRate - 1e-6) << q.id;
    from_issue_ms.push_back((q.completed_s - q.issued_s) * 1e3);
  }
  std::sort(from_issue_ms.begin(), from_issue_ms.end());
  EXPECT_GE(r.latency.p50, (kStallS - 125 / kRate) * 1e3);  // >= 100 ms
  EXPECT_LT(gpuopt::stats::quantile_sorted(from_issue_ms, 0.5), 0.1 * r.latency.p50);
  EXPECT_GE(r.issue_lag_p99_ms, (kStallS - 5 / kRate) * 1e3);  // p99 of 250 lies between queries 3 and 4
  EXPECT_GE(r.issue_span_s, kStallS);
}

TEST(LoadGenClosedLoop, SingleStreamHasOneQueryInFlightScheduledAtTheLastCompletion) {
  LoadOptions o = scenario_options(Scenario::kSingleStream, 100);
  FakeOptions f;
  f.max_in_flight = 1;
  const Outcome out = run_load(o, f);
  const LoadResult& r = out.result;
  EXPECT_EQ(out.violations, 0);
  EXPECT_EQ(out.max_in_flight, 1);
  EXPECT_EQ(r.issued, 100);
  EXPECT_EQ(r.ok, 100);
  ASSERT_EQ(out.records.size(), 100u);
  EXPECT_EQ(out.records[0].scheduled_s, 0.0);
  for (std::size_t i = 1; i < out.records.size(); ++i) {
    ASSERT_EQ(out.records[i].scheduled_s, out.records[i - 1].completed_s) << i;
  }
  EXPECT_EQ(r.latency.n, 100);
  EXPECT_GE(r.latency.p50, 0.2);
  EXPECT_EQ(r.target_rate, 0);
  EXPECT_EQ(r.scheduled_rate, 0);
  EXPECT_FALSE(r.valid);
  EXPECT_EQ(r.invalid_reasons, std::vector<std::string>{"p99 needs at least 459 queries at 99% confidence; got 100"});
  EXPECT_FALSE(r.early_stop.enough);
  EXPECT_GE(r.issue_lag_p99_ms, 0.0);
}

TEST(LoadGenClosedLoop, ConcurrencyClientsKeepExactlyThatManyInFlight) {
  LoadOptions o = scenario_options(Scenario::kClosedLoop, 400);
  o.concurrency = 4;
  o.percentile = 0.9;
  FakeOptions f;
  f.max_in_flight = 4;
  f.service_us = 300;
  const Outcome out = run_load(o, f);
  const LoadResult& r = out.result;
  EXPECT_EQ(out.violations, 0);
  EXPECT_EQ(out.max_in_flight, 4);
  EXPECT_EQ(out.call_sizes.at(0), 4u);  // the four clients start together
  EXPECT_EQ(r.issued, 400);
  EXPECT_EQ(r.ok, 400);
  EXPECT_TRUE(r.valid) << reasons(r);
  // Each scheduled time after the first four is some earlier query's completion.
  std::vector<double> completions;
  for (const QueryRecord& q : out.records) completions.push_back(q.completed_s);
  std::sort(completions.begin(), completions.end());
  for (std::size_t i = 4; i < out.records.size(); ++i) {
    ASSERT_TRUE(std::binary_search(completions.begin(), completions.end(), out.records[i].scheduled_s)) << i;
  }
}

TEST(LoadGenClosedLoop, MultiStreamIssuesWholeGroupsOneAtATime) {
  LoadOptions o = scenario_options(Scenario::kMultiStream, 30);  // 30 groups
  o.samples_per_query = 8;
  o.percentile = 0.9;
  o.confidence = 0.9;  // 22 groups suffice
  FakeOptions f;
  f.max_in_flight = 8;
  f.max_batch = 3;  // a group takes three batches: its latency is its last sample's
  const Outcome out = run_load(o, f);
  const LoadResult& r = out.result;
  EXPECT_EQ(out.violations, 0);
  EXPECT_EQ(r.issued, 240);
  EXPECT_EQ(r.ok, 240);
  ASSERT_EQ(out.call_sizes.size(), 30u);
  for (std::size_t n : out.call_sizes) EXPECT_EQ(n, 8u);
  EXPECT_EQ(r.latency.n, 30);
  EXPECT_EQ(r.early_stop.queries, 30);
  EXPECT_TRUE(r.valid) << reasons(r);
  std::vector<double> group_ms;
  double previous_end = 0;
  for (std::int64_t g = 0; g < 30; ++g) {
    double end = 0;
    for (std::int64_t s = 0; s < 8; ++s) {
      const QueryRecord& q = out.records[static_cast<std::size_t>(g * 8 + s)];
      ASSERT_EQ(q.group, g);
      ASSERT_EQ(q.scheduled_s, previous_end);
      end = std::max(end, q.completed_s);
    }
    group_ms.push_back((end - previous_end) * 1e3);
    previous_end = end;
  }
  std::sort(group_ms.begin(), group_ms.end());
  EXPECT_DOUBLE_EQ(r.latency.max, group_ms.back());
  EXPECT_GE(r.latency.p50, 3 * 0.2);  // three batches of >= 200 us
  EXPECT_NEAR(r.throughput, 240 / r.duration_s, 1e-9);
  EXPECT_NEAR(r.duration_s, previous_end, 1e-12);
}

TEST(LoadGenClosedLoop, NoCompletionStopsIssuingWithinTheDrainTimeout) {
  LoadOptions o = scenario_options(Scenario::kSingleStream, 50);
  o.drain_timeout_s = 0.2;
  FakeOptions f;
  f.drop_every = 1;  // never answers
  const Outcome out = run_load(o, f);
  const LoadResult& r = out.result;
  EXPECT_LT(out.wall_s, 2.0);
  EXPECT_GE(out.wall_s, 0.2);
  EXPECT_EQ(r.issued, 1);
  EXPECT_EQ(r.lost, 1);
  EXPECT_TRUE(has_reason(r, "no completion for 0.2 s")) << reasons(r);
  EXPECT_TRUE(has_reason(r, "1 queries lost (no answer within drain_timeout_s=0.2)")) << reasons(r);
  EXPECT_EQ(out.records.at(0).status, QueryStatus::kLost);
  EXPECT_TRUE(std::isnan(r.latency.p50));
}

TEST(LoadGenClosedLoop, DurationsBoundTheRun) {
  LoadOptions o = scenario_options(Scenario::kClosedLoop, 1);
  o.min_duration_s = 0.1;
  o.percentile = 0.5;
  o.confidence = 0.5;
  Outcome out = run_load(o, FakeOptions{});
  EXPECT_GE(out.wall_s, 0.1);
  EXPECT_GT(out.result.issued, 20);
  // The last query was issued within one round trip of the minimum duration: 0.2 ms of service, plus the
  // threads' wake-ups, which on a loaded 2-core CI machine took over 1 ms (20 ms allowed).
  EXPECT_GE(out.records.back().issued_s, 0.1 - 0.02);
  EXPECT_TRUE(out.result.valid) << reasons(out.result);

  o.min_queries = 1000000;
  o.min_duration_s = 0;
  o.max_duration_s = 0.15;
  out = run_load(o, FakeOptions{});
  EXPECT_LT(out.wall_s, 1.5);
  EXPECT_LT(out.records.back().issued_s, 0.15);
  EXPECT_TRUE(has_reason(out.result, "max_duration_s=0.15 reached after " + std::to_string(out.result.issued) +
                                         " of min_queries=1000000 queries"))
      << reasons(out.result);

  o.min_queries = 10;
  o.max_duration_s = 0;
  o.max_queries = 25;
  o.min_duration_s = 30;  // max_queries ends it first
  out = run_load(o, FakeOptions{});
  EXPECT_EQ(out.result.issued, 25);
  EXPECT_LT(out.wall_s, 5.0);
}

TEST(LoadGenClosedLoop, SloJudgesTheEarlyStoppingEstimate) {
  LoadOptions o = scenario_options(Scenario::kSingleStream, 60);
  o.percentile = 0.9;  // 44 queries bound the p90 at 99% confidence
  FakeOptions f;
  f.service_us = 1000;
  o.slo_ms = 0.5;  // below the service time: missed
  Outcome out = run_load(o, f);
  ASSERT_TRUE(out.result.early_stop.enough);
  EXPECT_GE(out.result.early_stop.estimate, 1.0);
  EXPECT_GE(out.result.early_stop.estimate, out.result.latency.p90);
  std::ostringstream want;
  want << std::setprecision(3) << "p90 estimate " << out.result.early_stop.estimate << " ms > slo 0.5 ms";
  EXPECT_EQ(out.result.invalid_reasons, std::vector<std::string>{want.str()});
  o.slo_ms = 1000;  // met
  out = run_load(o, f);
  EXPECT_TRUE(out.result.valid) << reasons(out.result);
}

TEST(LoadGenClosedLoop, FailuresKeepTheFirstEightDistinctErrors) {
  InlineTarget target([](const Query& q) {
    Completion c;
    if (q.id % 2 == 1) {
      c.status = QueryStatus::kFailed;
      c.error = "bad input " + std::to_string(q.id % 20);
    } else if (q.id == 4) {
      c.status = QueryStatus::kPending;  // not an answer: counted as failed
    }
    return c;
  });
  LoadOptions o = scenario_options(Scenario::kClosedLoop, 100);
  o.concurrency = 3;
  LoadGenerator gen(o, target);
  target.attach(gen);
  const LoadResult r = gen.run();
  EXPECT_EQ(r.issued, 100);
  EXPECT_EQ(r.failed, 51);
  EXPECT_EQ(r.ok, 49);
  EXPECT_EQ(r.latency.n, 49);
  EXPECT_EQ(r.errors, (std::vector<std::string>{"bad input 1", "bad input 3", "the target answered with status 'pending'",
                                                "bad input 5", "bad input 7", "bad input 9", "bad input 11",
                                                "bad input 13"}));
  EXPECT_TRUE(has_reason(r, "51 failed (bad input 1)")) << reasons(r);
  EXPECT_EQ(gen.records()[4].status, QueryStatus::kFailed);
}

TEST(LoadGenOffline, EverythingInOneCallScheduledAtTheStart) {
  LoadOptions o = scenario_options(Scenario::kOffline, 1000);
  FakeOptions f;
  f.max_batch = 64;
  const Outcome out = run_load(o, f);
  const LoadResult& r = out.result;
  ASSERT_EQ(out.call_sizes, std::vector<std::size_t>{1000});
  for (const QueryRecord& q : out.records) ASSERT_EQ(q.scheduled_s, 0.0);
  EXPECT_EQ(r.ok, 1000);
  EXPECT_TRUE(r.valid) << reasons(r);
  EXPECT_NEAR(r.throughput, 1000 / r.duration_s, 1e-9);
  EXPECT_GE(r.duration_s, 16 * 200e-6);  // 16 batches of >= 200 us
  ASSERT_EQ(r.batch_size_counts.size(), 65u);
  EXPECT_EQ(r.batch_size_counts[64], 15 * 64);
  EXPECT_EQ(r.batch_size_counts[40], 40);
}

TEST(LoadGenOffline, MaxDurationBoundsTheDrain) {
  LoadOptions o = scenario_options(Scenario::kOffline, 300);
  o.drain_timeout_s = 30;
  o.max_duration_s = 0.2;
  FakeOptions f;
  f.drop_every = 1;
  const Outcome out = run_load(o, f);
  EXPECT_LT(out.wall_s, 2.0);
  EXPECT_GE(out.wall_s, 0.19);
  EXPECT_EQ(out.result.lost, 300);
}

TEST(LoadGenQueries, SamplesAndPrioritiesFollowTheirDistributions) {
  LoadOptions o = scenario_options(Scenario::kOffline, 20000);
  o.sample_count = 10;
  o.priority_weights = {1, 3, 0};
  o.seed = 123;
  const Outcome a = run_load(o, FakeOptions{});
  std::vector<std::int64_t> per_sample(10, 0), per_priority(3, 0);
  ASSERT_EQ(a.received.size(), 20000u);
  for (std::size_t i = 0; i < a.received.size(); ++i) {
    const Query& q = a.received[i];
    ASSERT_TRUE(q.sample >= 0 && q.sample < 10);
    ASSERT_TRUE(q.priority >= 0 && q.priority < 3);
    ASSERT_EQ(q.sample, a.records[i].sample);
    ASSERT_EQ(q.priority, a.records[i].priority);
    ++per_sample[static_cast<std::size_t>(q.sample)];
    ++per_priority[static_cast<std::size_t>(q.priority)];
  }
  for (std::int64_t n : per_sample) EXPECT_NEAR(n, 2000, 4 * std::sqrt(2000 * 0.9));
  EXPECT_NEAR(per_priority[1], 15000, 4 * std::sqrt(20000 * 0.75 * 0.25));
  EXPECT_EQ(per_priority[2], 0);
  // The same seed draws the same queries.
  const Outcome b = run_load(o, FakeOptions{});
  for (std::size_t i = 0; i < a.received.size(); ++i) {
    ASSERT_EQ(a.received[i].sample, b.received[i].sample);
    ASSERT_EQ(a.received[i].priority, b.received[i].priority);
  }
}

TEST(LoadGenFaults, DroppedQueriesAreLostAndLateAnswersIgnored) {
  LoadOptions o = server_options(ArrivalKind::kConstant, 2000, 200);
  o.drain_timeout_s = 0.3;
  FakeOptions f;
  f.drop_every = 10;
  FakeServer server(f);
  LoadGenerator gen(o, server);
  struct Join {
    FakeServer& s;
    ~Join() { s.shutdown(); }
  } join{server};
  server.start(gen);
  EXPECT_FALSE(gen.finished());
  const auto t0 = Clock::now();
  const LoadResult r = gen.run();
  const double wall = seconds_since(t0);
  EXPECT_TRUE(gen.finished());  // a target may now drop what it still holds of this run
  server.shutdown();
  EXPECT_GE(wall, 0.1 + 0.3 - 0.01);  // the schedule, then the whole drain timeout
  EXPECT_LT(wall, 2.0);
  EXPECT_EQ(r.lost, 20);
  EXPECT_EQ(r.ok, 180);
  EXPECT_FALSE(r.valid);
  EXPECT_TRUE(has_reason(r, "20 queries lost (no answer within drain_timeout_s=0.3)")) << reasons(r);
  // Answers after the run are ignored; the generator stays usable for records().
  gen.complete(9, Completion{});
  gen.complete(123456789, Completion{});
  const auto records = gen.records();
  for (const QueryRecord& q : records) {
    ASSERT_EQ(q.status, q.id % 10 == 9 ? QueryStatus::kLost : QueryStatus::kOk) << q.id;
    ASSERT_EQ(q.completions, q.id % 10 == 9 ? 0 : 1);
    if (q.status == QueryStatus::kLost) {
      ASSERT_TRUE(std::isnan(q.completed_s));
    }
  }
  EXPECT_EQ(value_error_of([&] { gen.run(); }),
            "LoadGenerator.run() was already called; create a new LoadGenerator for another run");
}

TEST(LoadGenFaults, DuplicateAndUnknownCompletionsAreCounted) {
  LoadOptions o = server_options(ArrivalKind::kConstant, 2000, 100);
  o.percentile = 0.9;
  FakeOptions f;
  f.answer_twice = true;
  f.answer_unknown = true;
  const Outcome out = run_load(o, f);
  const LoadResult& r = out.result;
  EXPECT_EQ(r.duplicated, 100);
  EXPECT_EQ(r.unknown, 1);
  EXPECT_EQ(r.ok, 100);  // the first answer is kept
  EXPECT_EQ(r.failed, 0);
  EXPECT_TRUE(has_reason(r, "100 duplicated completions")) << reasons(r);
  EXPECT_TRUE(has_reason(r, "1 completions for ids that were never issued")) << reasons(r);
  for (const QueryRecord& q : out.records) ASSERT_EQ(q.completions, 2);
  EXPECT_TRUE(r.errors.empty());  // errors of ignored duplicates are not reported
}

TEST(LoadGenFaults, SynchronousRejectionInsideIssue) {
  LoadOptions o = server_options(ArrivalKind::kConstant, 3000, 300);
  o.percentile = 0.9;
  FakeOptions f;
  f.reject_every = 3;
  Outcome out = run_load(o, f);
  EXPECT_EQ(out.result.rejected, 100);
  EXPECT_EQ(out.result.ok, 200);
  EXPECT_EQ(out.result.latency.n, 200);  // rejected queries have no latency
  EXPECT_TRUE(has_reason(out.result, "100 rejected (queue full)")) << reasons(out.result);
  EXPECT_EQ(out.result.errors, std::vector<std::string>{"queue full"});
  EXPECT_EQ(out.records[3].status, QueryStatus::kRejected);

  // A closed loop whose every query is rejected inside issue(): the slot frees during issue().
  LoadOptions closed = scenario_options(Scenario::kSingleStream, 50);
  f.reject_every = 1;
  out = run_load(closed, f);
  EXPECT_EQ(out.result.rejected, 50);
  EXPECT_EQ(out.result.issued, 50);
  EXPECT_LT(out.wall_s, 2.0);
  for (std::size_t i = 1; i < out.records.size(); ++i) {
    ASSERT_EQ(out.records[i].scheduled_s, out.records[i - 1].completed_s);
  }
}

TEST(LoadGenFaults, StopFromAnotherThread) {
  LoadOptions o = server_options(ArrivalKind::kConstant, 1000, 10);
  o.min_duration_s = 20;
  FakeServer server(FakeOptions{});
  LoadGenerator gen(o, server);
  struct Join {
    FakeServer& s;
    ~Join() { s.shutdown(); }
  } join{server};
  server.start(gen);
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    gen.stop();
  });
  const auto t0 = Clock::now();
  const LoadResult r = gen.run();
  const double wall = seconds_since(t0);
  stopper.join();
  server.shutdown();
  EXPECT_LT(wall, 2.0);
  EXPECT_GE(wall, 0.09);
  EXPECT_GT(r.issued, 20);
  EXPECT_LT(r.issued, 1000);
  EXPECT_EQ(r.ok, r.issued);
  EXPECT_TRUE(has_reason(r, "stopped early")) << reasons(r);
  EXPECT_FALSE(has_reason(r, "max_duration_s")) << reasons(r);

  // stop() before run(): nothing is issued, and run() still returns a result.
  FakeServer idle(FakeOptions{});
  LoadGenerator early(scenario_options(Scenario::kClosedLoop, 10), idle);
  early.stop();
  const LoadResult e = early.run();
  EXPECT_EQ(e.issued, 0);
  EXPECT_TRUE(has_reason(e, "stopped early")) << reasons(e);
}

}  // namespace
