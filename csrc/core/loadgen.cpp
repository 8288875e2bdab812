// The load generator. Choices the header leaves open:
//
// Arrivals. Offsets come from one std::mt19937_64 seeded with `seed`, generated lazily (run() takes
// them in chunks, so a run without max_queries never precomputes its whole schedule, and a run's
// schedule is exactly arrival_offsets_s(arrival, n, seed)). Constant and trace start at 0 (constant:
// k / rate exactly; trace: the cumulative sum of the cycled gaps); the random processes start at
// their first gap, so offsets[0] > 0. Ramp and spike are thinned against a piecewise-constant bound
// of their rate (a window of the ramp, or a piece of the spike), so a large rate ratio costs no
// rejected candidates outside the window it applies to.
//
// Queries. Sample and priority come from a second mt19937_64 seeded from `seed` (so that changing
// sample_count does not move the schedule). Records are per sample: LoadResult's issued/ok/... count
// samples; multi-stream's min_queries/max_queries, latency and early stopping count groups.
//
// Stop rule. A unit (query; multi-stream: group) is issued unless: max_queries units were issued, or
// max_duration_s has elapsed, or both min_queries units were issued and min_duration_s has elapsed.
// For the server "elapsed" is the unit's scheduled offset (the schedule decides, not how late the
// generator runs), and max_duration_s also bounds the wall clock. Offline issues min_queries queries
// at once; min_duration_s does not apply, max_duration_s bounds its drain.
//
// Results. target_rate: the arrival process' rate for constant, Poisson and gamma; for ramp and spike
// its mean over [0, last scheduled offset]; for a trace, gaps per second of its cycle. Queue and
// compute percentiles are over the ok queries that reported them. batch_size_counts counts ok queries
// that reported their batch size ([0] stays 0; empty when none reported one).
#include "gpuopt/loadgen.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <numeric>
#include <random>
#include <sstream>
#include <thread>
#include <utility>

#include "gpuopt/errors.h"
#include "gpuopt/stats.h"

namespace gpuopt::serve {
namespace {

constexpr std::size_t kChunk = 4096;           // arrival offsets generated at a time
constexpr double kLeadS = 1e-3;                // start_ lies this far ahead of run(), so query 0 is not late
constexpr auto kSpin = std::chrono::microseconds(100);  // the server yields, not sleeps, this close to a due time
constexpr double kMaxWaitS = 1e9;              // longer waits are clamped (no time_point overflow)
constexpr std::size_t kMaxErrors = 8;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Clock::duration to_duration(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::min(s, kMaxWaitS)));
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Short numbers for messages: 12.3, 0.25, 1.23e+05.
std::string num(double x, int digits = 3) {
  std::ostringstream out;
  out << std::setprecision(digits) << x;
  return out.str();
}

// "p99", "p99.9", "p50"
std::string percentile_label(double p) { return "p" + num(p * 100.0, 6); }

void check_rate(double rate, const char* field) {
  GPUOPT_CHECK_VALUE(rate > 0 && rate <= kMaxScheduleRate, "arrival.", field, " must be in (0, ", kMaxScheduleRate,
                     "] queries/s, got ", rate);
}

void check_positive_s(double s, const char* field) {
  GPUOPT_CHECK_VALUE(s > 0 && std::isfinite(s), "arrival.", field, " must be a finite number of seconds > 0, got ",
                     s);
}

// log(exp(a) + exp(b)) without overflow; a may be -inf.
double log_add(double a, double b) {
  if (a == -std::numeric_limits<double>::infinity()) return b;
  const double hi = std::max(a, b), lo = std::min(a, b);
  return hi + std::log1p(std::exp(lo - hi));
}

void check_unit_interval(double x, const char* name) {
  GPUOPT_CHECK_VALUE(x > 0 && x < 1, name, " must be in (0, 1), got ", x);
}

// One arrival process, drawn lazily: next() is the offset of the next arrival.
class ArrivalStream {
 public:
  ArrivalStream(const ArrivalOptions& a, std::uint64_t seed) : a_(a), rng_(seed) {
    validate(a_);
    if (a_.kind == ArrivalKind::kGamma) gamma_ = std::gamma_distribution<double>(1 / a_.burstiness, a_.burstiness / a_.rate);
  }

  double next() {
    switch (a_.kind) {
      case ArrivalKind::kConstant:
        return static_cast<double>(k_++) / a_.rate;
      case ArrivalKind::kTrace:
        if (k_++ > 0) t_ += a_.intervals_s[(static_cast<std::size_t>(k_) - 2) % a_.intervals_s.size()];
        return t_;
      case ArrivalKind::kPoisson:
        t_ += std::exponential_distribution<double>(a_.rate)(rng_);
        return t_;
      case ArrivalKind::kGamma:
        t_ += gamma_(rng_);
        return t_;
      case ArrivalKind::kRamp:
      case ArrivalKind::kSpike:
        return next_thinned();
    }
    return t_;
  }

 private:
  double rate_at(double t) const {
    if (a_.kind == ArrivalKind::kRamp) {
      if (t >= a_.ramp_duration_s) return a_.ramp_to_rate;
      return a_.rate + (a_.ramp_to_rate - a_.rate) * (t / a_.ramp_duration_s);
    }
    const bool inside = t >= a_.spike_start_s && t < a_.spike_start_s + a_.spike_duration_s;
    return inside ? a_.spike_rate : a_.rate;
  }

  // A bound of the rate over [t, end), and that end (+inf: the rate is constant from t on).
  std::pair<double, double> bound(double t) const {
    constexpr double kInf = std::numeric_limits<double>::infinity();
    if (a_.kind == ArrivalKind::kRamp) {
      if (t >= a_.ramp_duration_s) return {a_.ramp_to_rate, kInf};
      // 256 windows over the ramp: the bound exceeds the rate by at most 1/256 of the ramp's rise.
      const double end = std::min(a_.ramp_duration_s, t + a_.ramp_duration_s / 256);
      return {std::max(rate_at(t), rate_at(end)), end};
    }
    const double spike_end = a_.spike_start_s + a_.spike_duration_s;
    if (t < a_.spike_start_s) return {a_.rate, a_.spike_start_s};
    if (t < spike_end) return {a_.spike_rate, spike_end};
    return {a_.rate, kInf};
  }

  // Lewis-Shedler thinning with a piecewise bound: a candidate of the bounding Poisson process past
  // its window restarts at the window's end (memorylessness), one inside it is kept with
  // probability rate/bound.
  double next_thinned() {
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    for (;;) {
      const auto [b, end] = bound(t_);
      const double t = t_ + std::exponential_distribution<double>(b)(rng_);
      if (t >= end) {
        t_ = end;
        continue;
      }
      t_ = t;
      if (unit(rng_) * b <= rate_at(t)) return t;
    }
  }

  const ArrivalOptions& a_;
  std::mt19937_64 rng_;
  std::gamma_distribution<double> gamma_;
  std::int64_t k_ = 0;
  double t_ = 0;
};

// The mean rate of the arrival process over [0, span_s] (target_rate of the result).
double mean_rate(const ArrivalOptions& a, double span_s) {
  switch (a.kind) {
    case ArrivalKind::kConstant:
    case ArrivalKind::kPoisson:
    case ArrivalKind::kGamma:
      return a.rate;
    case ArrivalKind::kTrace: {
      const double cycle = std::accumulate(a.intervals_s.begin(), a.intervals_s.end(), 0.0);
      return static_cast<double>(a.intervals_s.size()) / cycle;
    }
    case ArrivalKind::kRamp: {
      if (span_s <= 0) return a.rate;
      const double d = a.ramp_duration_s, rise = a.ramp_to_rate - a.rate;
      const double area = span_s <= d ? a.rate * span_s + rise * span_s * span_s / (2 * d)
                                      : a.rate * d + rise * d / 2 + a.ramp_to_rate * (span_s - d);
      return area / span_s;
    }
    case ArrivalKind::kSpike: {
      const bool at_zero = a.spike_start_s == 0;
      if (span_s <= 0) return at_zero ? a.spike_rate : a.rate;
      const double overlap =
          std::max(0.0, std::min(span_s, a.spike_start_s + a.spike_duration_s) - std::min(span_s, a.spike_start_s));
      return a.rate + (a.spike_rate - a.rate) * overlap / span_s;
    }
  }
  return a.rate;
}

Percentiles percentiles_ms(std::vector<double> ms) {
  Percentiles p;
  p.n = static_cast<std::int64_t>(ms.size());
  if (ms.empty()) {
    p.mean = p.p50 = p.p90 = p.p95 = p.p99 = p.p999 = p.max = kNaN;
    return p;
  }
  std::sort(ms.begin(), ms.end());
  p.mean = std::accumulate(ms.begin(), ms.end(), 0.0) / static_cast<double>(ms.size());
  p.p50 = stats::quantile_sorted(ms, 0.5);
  p.p90 = stats::quantile_sorted(ms, 0.9);
  p.p95 = stats::quantile_sorted(ms, 0.95);
  p.p99 = stats::quantile_sorted(ms, 0.99);
  p.p999 = stats::quantile_sorted(ms, 0.999);
  p.max = ms.back();
  return p;
}

}  // namespace

// ---- names ----------------------------------------------------------------------------------------

const char* scenario_name(Scenario s) {
  switch (s) {
    case Scenario::kSingleStream: return "single-stream";
    case Scenario::kMultiStream: return "multi-stream";
    case Scenario::kServer: return "server";
    case Scenario::kOffline: return "offline";
    case Scenario::kClosedLoop: return "closed-loop";
  }
  return "unknown";
}

Scenario parse_scenario(const std::string& name) {
  for (Scenario s : {Scenario::kSingleStream, Scenario::kMultiStream, Scenario::kServer, Scenario::kOffline,
                     Scenario::kClosedLoop}) {
    if (name == scenario_name(s)) return s;
  }
  GPUOPT_CHECK_VALUE(false, "scenario must be one of single-stream, multi-stream, server, offline, closed-loop; got '",
                     name, "'");
  return Scenario::kServer;
}

const char* arrival_name(ArrivalKind k) {
  switch (k) {
    case ArrivalKind::kConstant: return "constant";
    case ArrivalKind::kPoisson: return "poisson";
    case ArrivalKind::kGamma: return "gamma";
    case ArrivalKind::kRamp: return "ramp";
    case ArrivalKind::kSpike: return "spike";
    case ArrivalKind::kTrace: return "trace";
  }
  return "unknown";
}

ArrivalKind parse_arrival(const std::string& name) {
  for (ArrivalKind k : {ArrivalKind::kConstant, ArrivalKind::kPoisson, ArrivalKind::kGamma, ArrivalKind::kRamp,
                        ArrivalKind::kSpike, ArrivalKind::kTrace}) {
    if (name == arrival_name(k)) return k;
  }
  GPUOPT_CHECK_VALUE(false, "arrival kind must be one of constant, poisson, gamma, ramp, spike, trace; got '", name,
                     "'");
  return ArrivalKind::kPoisson;
}

const char* status_name(QueryStatus s) {
  switch (s) {
    case QueryStatus::kPending: return "pending";
    case QueryStatus::kOk: return "ok";
    case QueryStatus::kFailed: return "failed";
    case QueryStatus::kRejected: return "rejected";
    case QueryStatus::kTimedOut: return "timed-out";
    case QueryStatus::kCancelled: return "cancelled";
    case QueryStatus::kLost: return "lost";
  }
  return "unknown";
}

// ---- arrivals -------------------------------------------------------------------------------------

void validate(const ArrivalOptions& a) {
  switch (a.kind) {
    case ArrivalKind::kConstant:
    case ArrivalKind::kPoisson:
      check_rate(a.rate, "rate");
      return;
    case ArrivalKind::kGamma:
      check_rate(a.rate, "rate");
      GPUOPT_CHECK_VALUE(a.burstiness > 0 && std::isfinite(a.burstiness),
                         "arrival.burstiness (squared coefficient of variation of the gaps) must be finite and > 0, "
                         "got ",
                         a.burstiness);
      return;
    case ArrivalKind::kRamp:
      check_rate(a.rate, "rate");
      check_rate(a.ramp_to_rate, "ramp_to_rate");
      check_positive_s(a.ramp_duration_s, "ramp_duration_s");
      return;
    case ArrivalKind::kSpike:
      check_rate(a.rate, "rate");
      check_rate(a.spike_rate, "spike_rate");
      check_positive_s(a.spike_duration_s, "spike_duration_s");
      GPUOPT_CHECK_VALUE(a.spike_start_s >= 0 && std::isfinite(a.spike_start_s),
                         "arrival.spike_start_s must be a finite number of seconds >= 0, got ", a.spike_start_s);
      return;
    case ArrivalKind::kTrace: {
      // A trace sets its own rate: arrival.rate is ignored.
      GPUOPT_CHECK_VALUE(!a.intervals_s.empty(), "arrival.intervals_s must not be empty for a trace");
      double cycle = 0;
      for (std::size_t i = 0; i < a.intervals_s.size(); ++i) {
        const double gap = a.intervals_s[i];
        GPUOPT_CHECK_VALUE(gap >= 0 && std::isfinite(gap), "arrival.intervals_s[", i,
                           "] must be a finite number of seconds >= 0, got ", gap);
        cycle += gap;
      }
      GPUOPT_CHECK_VALUE(cycle > 0, "arrival.intervals_s must not all be 0 (", a.intervals_s.size(),
                         " gaps of 0 s: an infinite rate)");
      const double rate = static_cast<double>(a.intervals_s.size()) / cycle;
      GPUOPT_CHECK_VALUE(rate <= kMaxScheduleRate, "arrival.intervals_s must average a rate <= ", kMaxScheduleRate,
                         " queries/s, got ", rate, " (", a.intervals_s.size(), " gaps over ", cycle, " s)");
      return;
    }
  }
  GPUOPT_CHECK_VALUE(false, "arrival.kind is not an ArrivalKind: ", static_cast<int>(a.kind));
}

std::vector<double> arrival_offsets_s(const ArrivalOptions& arrival, std::int64_t count, std::uint64_t seed) {
  GPUOPT_CHECK_VALUE(count >= 0, "count must be >= 0, got ", count);
  ArrivalStream stream(arrival, seed);
  std::vector<double> out(static_cast<std::size_t>(count));
  for (double& t : out) t = stream.next();
  return out;
}

// ---- early stopping --------------------------------------------------------------------------------

std::int64_t early_stop_min_queries(double percentile, double confidence) {
  check_unit_interval(percentile, "percentile");
  check_unit_interval(confidence, "confidence");
  // Smallest n with p^n <= 1 - c, in logs; the estimate is corrected to the exact comparison.
  const double log_p = std::log(percentile), log_miss = std::log1p(-confidence);
  auto n = static_cast<std::int64_t>(std::ceil(log_miss / log_p));
  n = std::max<std::int64_t>(n, 1);
  while (static_cast<double>(n) * log_p > log_miss) ++n;
  while (n > 1 && static_cast<double>(n - 1) * log_p <= log_miss) --n;
  return n;
}

EarlyStop early_stop(std::vector<double> values, double percentile, double confidence) {
  EarlyStop e;
  e.percentile = percentile;
  e.confidence = confidence;
  e.min_queries = early_stop_min_queries(percentile, confidence);
  e.queries = static_cast<std::int64_t>(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    GPUOPT_CHECK_VALUE(std::isfinite(values[i]), "early_stop: values must be finite, got ", values[i], " at index ",
                       i);
  }
  e.enough = e.queries >= e.min_queries;
  if (!e.enough) return e;
  // X_(k) >= the true p-quantile unless k or more samples fall below it: P = P[B <= k - 1] with
  // B ~ Binomial(n, p). The smallest k with P[B >= k] <= 1 - c is found by summing the upper tail
  // downwards in logs. Terms above j_hi (pmf < (1 - c) e^-40 / (n + 1) each) add nothing visible, so
  // the sum starts there: O(a few standard deviations) terms, not O(n).
  const std::int64_t n = e.queries;
  const double dn = static_cast<double>(n);
  const double log_p = std::log(percentile), log_q = std::log1p(-percentile);
  const double log_miss = std::log1p(-confidence);
  const double lgamma_n1 = std::lgamma(dn + 1);
  auto log_pmf = [&](std::int64_t j) {
    const double dj = static_cast<double>(j);
    if (j == n) return dn * log_p;  // exactly the expression early_stop_min_queries compares
    return lgamma_n1 - std::lgamma(dj + 1) - std::lgamma(dn - dj + 1) + dj * log_p + (dn - dj) * log_q;
  };
  const double negligible = log_miss - 40 - std::log(dn + 1);
  const auto mode = std::min<std::int64_t>(n, static_cast<std::int64_t>(std::floor((dn + 1) * percentile)));
  std::int64_t j_hi = n;
  if (log_pmf(n) < negligible) {  // the largest j in [mode, n) with log_pmf(j) >= negligible (decreasing there)
    std::int64_t lo = mode, hi = n;
    while (hi - lo > 1) {
      const std::int64_t mid = lo + (hi - lo) / 2;
      (log_pmf(mid) >= negligible ? lo : hi) = mid;
    }
    j_hi = lo;
  }
  double log_tail = -std::numeric_limits<double>::infinity();
  std::int64_t k = 1;
  for (std::int64_t j = j_hi; j >= 0; --j) {
    log_tail = log_add(log_tail, log_pmf(j));  // log P[B >= j]
    if (log_tail > log_miss) {
      k = j + 1;
      break;
    }
  }
  e.order = std::min(k, n);
  std::nth_element(values.begin(), values.begin() + (e.order - 1), values.end());
  e.estimate = values[static_cast<std::size_t>(e.order - 1)];
  return e;
}

// ---- options ---------------------------------------------------------------------------------------

void validate(const LoadOptions& o) {
  GPUOPT_CHECK_VALUE(std::string(scenario_name(o.scenario)) != "unknown", "scenario is not a Scenario: ",
                     static_cast<int>(o.scenario));
  GPUOPT_CHECK_VALUE(o.concurrency >= 1, "concurrency must be >= 1, got ", o.concurrency);
  GPUOPT_CHECK_VALUE(o.samples_per_query >= 1, "samples_per_query must be >= 1, got ", o.samples_per_query);
  GPUOPT_CHECK_VALUE(o.sample_count >= 1, "sample_count must be >= 1, got ", o.sample_count);
  double weight_sum = 0;
  for (std::size_t i = 0; i < o.priority_weights.size(); ++i) {
    const double w = o.priority_weights[i];
    GPUOPT_CHECK_VALUE(w >= 0 && std::isfinite(w), "priority_weights[", i, "] must be finite and >= 0, got ", w);
    weight_sum += w;
  }
  GPUOPT_CHECK_VALUE(o.priority_weights.empty() || weight_sum > 0,
                     "priority_weights must have a positive sum (or be empty: every query at priority 0), got ",
                     o.priority_weights.size(), " zeros");
  GPUOPT_CHECK_VALUE(o.min_queries >= 1, "min_queries must be >= 1, got ", o.min_queries);
  GPUOPT_CHECK_VALUE(o.max_queries == 0 || o.max_queries >= o.min_queries,
                     "max_queries must be 0 (no cap) or >= min_queries=", o.min_queries, ", got ", o.max_queries);
  GPUOPT_CHECK_VALUE(o.min_duration_s >= 0 && std::isfinite(o.min_duration_s),
                     "min_duration_s must be a finite number of seconds >= 0, got ", o.min_duration_s);
  GPUOPT_CHECK_VALUE(o.max_duration_s == 0 || (o.max_duration_s >= o.min_duration_s && std::isfinite(o.max_duration_s)),
                     "max_duration_s must be 0 (no cap) or finite and >= min_duration_s=", o.min_duration_s, ", got ",
                     o.max_duration_s);
  check_unit_interval(o.percentile, "percentile");
  check_unit_interval(o.confidence, "confidence");
  GPUOPT_CHECK_VALUE(o.slo_ms >= 0 && std::isfinite(o.slo_ms), "slo_ms must be 0 (none) or finite and > 0, got ",
                     o.slo_ms);
  GPUOPT_CHECK_VALUE(o.drain_timeout_s > 0 && std::isfinite(o.drain_timeout_s),
                     "drain_timeout_s must be a finite number of seconds > 0, got ", o.drain_timeout_s);
  if (o.scenario == Scenario::kServer) validate(o.arrival);
}

// ---- the generator ----------------------------------------------------------------------------------

struct LoadGenerator::Draws {
  explicit Draws(const LoadOptions& o)
      : rng(o.seed ^ 0x9e3779b97f4a7c15ULL),
        sample(0, o.sample_count - 1),
        priority(o.priority_weights.begin(), o.priority_weights.end()),
        prioritized(!o.priority_weights.empty()) {}
  std::mt19937_64 rng;
  std::uniform_int_distribution<std::int64_t> sample;
  std::discrete_distribution<std::int64_t> priority;
  bool prioritized;
};

LoadGenerator::LoadGenerator(LoadOptions options, Target& target)
    : options_(std::move(options)), target_(target), first_error_(static_cast<std::size_t>(QueryStatus::kLost) + 1) {
  validate(options_);
}

bool LoadGenerator::done(std::int64_t units, double elapsed_s) const {
  if (options_.max_queries > 0 && units >= options_.max_queries) return true;
  if (options_.max_duration_s > 0 && elapsed_s >= options_.max_duration_s) return true;
  return units >= options_.min_queries && elapsed_s >= options_.min_duration_s;
}

Query LoadGenerator::admit_locked(Draws& draws, double scheduled_s, Clock::time_point scheduled, std::int64_t group,
                                  Clock::time_point now) {
  QueryRecord r;
  r.id = records_.size();
  r.sample = draws.sample(draws.rng);
  r.priority = draws.prioritized ? draws.priority(draws.rng) : 0;
  r.group = group;
  r.scheduled_s = scheduled_s;
  r.issued_s = seconds(now - start_);
  records_.push_back(r);
  ++outstanding_;
  return Query{r.id, r.sample, r.priority, scheduled};
}

void LoadGenerator::issue_unlocked(std::unique_lock<std::mutex>& lock, const std::vector<Query>& batch) {
  lock.unlock();
  try {
    target_.issue(batch.data(), batch.size());
  } catch (...) {
    lock.lock();
    throw;
  }
  lock.lock();
}

bool LoadGenerator::stopped_by(std::unique_lock<std::mutex>& lock, Clock::time_point until) {
  return changed_.wait_until(lock, until, [this] { return stop_.load(); });
}

std::int64_t LoadGenerator::issue_server(std::unique_lock<std::mutex>& lock, Draws& draws) {
  ArrivalStream stream(options_.arrival, options_.seed);
  std::vector<double> chunk;
  std::size_t next = 0;
  std::vector<Query> batch;
  std::int64_t units = 0;
  for (;;) {
    if (next == chunk.size()) {
      chunk.resize(kChunk);
      for (double& t : chunk) t = stream.next();
      next = 0;
    }
    if (done(units, chunk[next])) return units;
    const Clock::time_point due = start_ + to_duration(chunk[next]);
    if (stopped_by(lock, due - kSpin)) return units;
    lock.unlock();
    while (Clock::now() < due && !stop_.load()) std::this_thread::yield();
    lock.lock();
    if (stop_.load()) return units;
    const Clock::time_point now = Clock::now();
    if (options_.max_duration_s > 0 && seconds(now - start_) >= options_.max_duration_s) return units;
    // Every query already due goes in one call (the generator catches up in batches at high rates).
    batch.clear();
    do {
      batch.push_back(admit_locked(draws, chunk[next], start_ + to_duration(chunk[next]), units, now));
      ++units;
      ++next;
    } while (next < chunk.size() && start_ + to_duration(chunk[next]) <= now && !done(units, chunk[next]));
    issue_unlocked(lock, batch);
  }
}

std::int64_t LoadGenerator::issue_closed_loop(std::unique_lock<std::mutex>& lock, Draws& draws, std::int64_t clients,
                                              std::int64_t group_size) {
  free_since_.assign(static_cast<std::size_t>(clients), start_);
  if (stopped_by(lock, start_)) return 0;
  const Clock::time_point end =
      options_.max_duration_s > 0 ? start_ + to_duration(options_.max_duration_s) : Clock::time_point::max();
  std::vector<Query> batch;
  std::int64_t units = 0;
  Clock::time_point progress = start_;  // the last issue; a completion must follow within drain_timeout_s
  for (;;) {
    const Clock::time_point silent = progress + to_duration(options_.drain_timeout_s);
    changed_.wait_until(lock, std::min(silent, end), [this] { return stop_.load() || !free_since_.empty(); });
    if (stop_.load()) return units;
    const Clock::time_point now = Clock::now();
    if (free_since_.empty()) {
      stalled_ = now < end;
      return units;
    }
    const double elapsed = seconds(now - start_);
    if (done(units, elapsed)) return units;
    batch.clear();
    while (!free_since_.empty() && !done(units, elapsed)) {
      // Think time 0: the client's next query is scheduled the moment its last one was answered.
      const Clock::time_point scheduled = free_since_.front();
      free_since_.pop_front();
      for (std::int64_t s = 0; s < group_size; ++s) {
        batch.push_back(admit_locked(draws, seconds(scheduled - start_), scheduled, units, now));
      }
      group_left_.push_back(group_size);
      ++units;
    }
    progress = now;
    issue_unlocked(lock, batch);
  }
}

std::int64_t LoadGenerator::issue_offline(std::unique_lock<std::mutex>& lock, Draws& draws) {
  if (stopped_by(lock, start_)) return 0;
  const Clock::time_point now = Clock::now();
  std::vector<Query> batch;
  batch.reserve(static_cast<std::size_t>(options_.min_queries));
  for (std::int64_t i = 0; i < options_.min_queries; ++i) batch.push_back(admit_locked(draws, 0.0, start_, i, now));
  issue_unlocked(lock, batch);
  return options_.min_queries;
}

void LoadGenerator::drain_locked(std::unique_lock<std::mutex>& lock, Clock::time_point deadline) {
  changed_.wait_until(lock, deadline, [this] { return outstanding_ == 0; });
  draining_done_ = true;  // from here on complete() ignores what arrives
  for (QueryRecord& r : records_) {
    if (r.status == QueryStatus::kPending) r.status = QueryStatus::kLost;
  }
}

LoadResult LoadGenerator::run() {
  std::unique_lock<std::mutex> lock(mu_);
  GPUOPT_CHECK_VALUE(!ran_, "LoadGenerator.run() was already called; create a new LoadGenerator for another run");
  ran_ = true;
  start_ = Clock::now() + to_duration(kLeadS);
  const Scenario scenario = options_.scenario;
  closed_loop_ = scenario == Scenario::kSingleStream || scenario == Scenario::kMultiStream ||
                 scenario == Scenario::kClosedLoop;
  Draws draws(options_);
  std::int64_t units = 0;
  try {
    switch (scenario) {
      case Scenario::kServer: units = issue_server(lock, draws); break;
      case Scenario::kOffline: units = issue_offline(lock, draws); break;
      case Scenario::kSingleStream: units = issue_closed_loop(lock, draws, 1, 1); break;
      case Scenario::kMultiStream: units = issue_closed_loop(lock, draws, 1, options_.samples_per_query); break;
      case Scenario::kClosedLoop: units = issue_closed_loop(lock, draws, options_.concurrency, 1); break;
    }
  } catch (...) {
    // The target threw: nothing more is awaited, and later completions are ignored.
    draining_done_ = true;
    throw;
  }
  stopped_ = stop_.load();
  Clock::time_point deadline = Clock::now() + to_duration(options_.drain_timeout_s);
  if (scenario == Scenario::kOffline && options_.max_duration_s > 0) {
    deadline = std::min(deadline, start_ + to_duration(options_.max_duration_s));
  }
  drain_locked(lock, deadline);
  return summarize_locked(units);
}

void LoadGenerator::complete(std::uint64_t id, const Completion& c) {
  const Clock::time_point now = Clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  if (draining_done_) return;
  if (id >= records_.size()) {
    ++unknown_;
    return;
  }
  QueryRecord& r = records_[id];
  if (++r.completions > 1) {
    ++duplicated_;
    return;
  }
  r.completed_s = seconds(now - start_);
  r.status = c.status;
  std::string error = c.error;
  if (c.status == QueryStatus::kPending || c.status == QueryStatus::kLost) {
    r.status = QueryStatus::kFailed;
    error = std::string("the target answered with status '") + status_name(c.status) + "'";
  }
  r.queue_us = c.queue_us;
  r.compute_us = c.compute_us;
  r.batch_size = c.batch_size;
  r.checksum = c.checksum;
  if (!error.empty()) {
    if (errors_.size() < kMaxErrors && std::find(errors_.begin(), errors_.end(), error) == errors_.end()) {
      errors_.push_back(error);
    }
    std::string& first = first_error_[static_cast<std::size_t>(r.status)];
    if (first.empty()) first = error;
  }
  --outstanding_;
  bool wake = outstanding_ == 0;
  if (closed_loop_ && --group_left_[static_cast<std::size_t>(r.group)] == 0) {
    free_since_.push_back(now);
    wake = true;
  }
  if (wake) changed_.notify_all();
}

bool LoadGenerator::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return draining_done_;
}

void LoadGenerator::stop() {
  std::lock_guard<std::mutex> lock(mu_);  // a waiter between its check and its wait cannot miss it
  stop_ = true;
  changed_.notify_all();
}

std::vector<QueryRecord> LoadGenerator::records() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {records_.begin(), records_.end()};
}

LoadResult LoadGenerator::summarize_locked(std::int64_t units) const {
  const LoadOptions& o = options_;
  LoadResult res;
  res.scenario = o.scenario;
  res.issued = static_cast<std::int64_t>(records_.size());
  res.duplicated = duplicated_;
  res.unknown = unknown_;
  res.errors = errors_;

  double first_scheduled = std::numeric_limits<double>::infinity(), last_scheduled = 0;
  double first_issued = std::numeric_limits<double>::infinity(), last_issued = 0, last_completed = 0;
  bool any_completed = false;
  std::vector<double> queue_ms, compute_ms, lag_ms;
  for (const QueryRecord& r : records_) {
    first_scheduled = std::min(first_scheduled, r.scheduled_s);
    last_scheduled = std::max(last_scheduled, r.scheduled_s);
    first_issued = std::min(first_issued, r.issued_s);
    last_issued = std::max(last_issued, r.issued_s);
    lag_ms.push_back((r.issued_s - r.scheduled_s) * 1e3);
    if (!std::isnan(r.completed_s)) {
      last_completed = std::max(last_completed, r.completed_s);
      any_completed = true;
    }
    switch (r.status) {
      case QueryStatus::kOk: ++res.ok; break;
      case QueryStatus::kFailed: ++res.failed; break;
      case QueryStatus::kRejected: ++res.rejected; break;
      case QueryStatus::kTimedOut: ++res.timed_out; break;
      case QueryStatus::kCancelled: ++res.cancelled; break;
      case QueryStatus::kLost: ++res.lost; break;
      case QueryStatus::kPending: break;
    }
    if (r.status != QueryStatus::kOk) continue;
    if (r.queue_us >= 0) queue_ms.push_back(r.queue_us / 1e3);
    if (r.compute_us >= 0) compute_ms.push_back(r.compute_us / 1e3);
    if (r.batch_size > 0) {
      if (res.batch_size_counts.size() <= static_cast<std::size_t>(r.batch_size)) {
        res.batch_size_counts.resize(static_cast<std::size_t>(r.batch_size) + 1, 0);
      }
      ++res.batch_size_counts[static_cast<std::size_t>(r.batch_size)];
    }
  }
  if (res.issued == 0) first_scheduled = first_issued = 0;
  res.duration_s = any_completed ? last_completed - first_scheduled : 0;
  res.issue_span_s = last_issued - first_issued;
  const double schedule_span = last_scheduled - first_scheduled;
  if (o.scenario == Scenario::kServer) {
    res.target_rate = mean_rate(o.arrival, last_scheduled);
    if (res.issued >= 2 && schedule_span > 0) res.scheduled_rate = static_cast<double>(res.issued - 1) / schedule_span;
  }
  if (res.duration_s > 0) res.throughput = static_cast<double>(res.ok) / res.duration_s;

  // Latency per query, or per group of samples (multi-stream: ok when all its samples are).
  std::vector<double> latency_ms;
  if (o.scenario == Scenario::kMultiStream) {
    std::size_t i = 0;
    while (i < records_.size()) {
      const std::int64_t group = records_[i].group;
      bool ok = true;
      double last = 0;
      for (; i < records_.size() && records_[i].group == group; ++i) {
        ok = ok && records_[i].status == QueryStatus::kOk;
        last = std::max(last, records_[i].completed_s);
      }
      if (ok) latency_ms.push_back((last - records_[i - 1].scheduled_s) * 1e3);
    }
  } else {
    for (const QueryRecord& r : records_) {
      if (r.status == QueryStatus::kOk) latency_ms.push_back((r.completed_s - r.scheduled_s) * 1e3);
    }
  }
  res.latency = percentiles_ms(latency_ms);
  res.queue = percentiles_ms(std::move(queue_ms));
  res.compute = percentiles_ms(std::move(compute_ms));
  if (!lag_ms.empty()) {
    std::sort(lag_ms.begin(), lag_ms.end());
    res.issue_lag_p99_ms = stats::quantile_sorted(lag_ms, 0.99);
  }
  res.early_stop = early_stop(std::move(latency_ms), o.percentile, o.confidence);

  // Validity: every reason that applies, in a fixed order.
  auto invalid = [&res](std::string reason) {
    res.valid = false;
    res.invalid_reasons.push_back(std::move(reason));
  };
  if (res.lost > 0) {
    invalid(std::to_string(res.lost) + " queries lost (no answer within drain_timeout_s=" + num(o.drain_timeout_s, 6) +
            ")");
  }
  if (res.duplicated > 0) invalid(std::to_string(res.duplicated) + " duplicated completions (queries answered twice)");
  if (res.unknown > 0) invalid(std::to_string(res.unknown) + " completions for ids that were never issued");
  const std::pair<QueryStatus, std::int64_t> failures[] = {{QueryStatus::kFailed, res.failed},
                                                           {QueryStatus::kRejected, res.rejected},
                                                           {QueryStatus::kTimedOut, res.timed_out},
                                                           {QueryStatus::kCancelled, res.cancelled}};
  for (const auto& [status, count] : failures) {
    if (count == 0) continue;
    const std::string& example = first_error_[static_cast<std::size_t>(status)];
    invalid(std::to_string(count) + " " + status_name(status) + (example.empty() ? "" : " (" + example + ")"));
  }
  const std::string label = percentile_label(o.percentile);
  if (!res.early_stop.enough) {
    invalid(label + " needs at least " + std::to_string(res.early_stop.min_queries) + " queries at " +
            num(o.confidence * 100, 6) + "% confidence; got " + std::to_string(res.early_stop.queries));
  } else if (o.slo_ms > 0 && res.early_stop.estimate > o.slo_ms) {
    invalid(label + " estimate " + num(res.early_stop.estimate) + " ms > slo " + num(o.slo_ms, 6) + " ms");
  }
  if (o.scenario == Scenario::kServer && res.scheduled_rate > 0) {
    const double served = res.duration_s > 0 ? static_cast<double>(res.ok) / res.duration_s : 0;
    if (served < 0.9 * res.scheduled_rate) {
      invalid("served " + num(served, 4) + "/s of the " + num(res.scheduled_rate, 4) +
              "/s scheduled: the server could not keep up");
    }
    if (res.issue_span_s > 1.05 * schedule_span + 1e-3) {
      invalid("the generator fell behind: it issued a " + num(schedule_span, 4) + " s schedule over " +
              num(res.issue_span_s, 4) + " s");
    }
  }
  if (stalled_) invalid("no completion for " + num(o.drain_timeout_s, 6) + " s (drain_timeout_s): issuing stopped");
  if (stopped_) invalid("stopped early");
  if (!stopped_ && !stalled_ && units < o.min_queries) {
    invalid("max_duration_s=" + num(o.max_duration_s, 6) + " reached after " + std::to_string(units) +
            " of min_queries=" + std::to_string(o.min_queries) + " queries");
  }
  return res;
}

}  // namespace gpuopt::serve
