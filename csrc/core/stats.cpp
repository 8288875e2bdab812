#include "gpuopt/stats.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "gpuopt/errors.h"

namespace gpuopt::stats {
namespace {

void check_confidence(double confidence) {
  GPUOPT_CHECK_VALUE(confidence > 0.0 && confidence < 1.0,
                     "confidence must be in (0, 1), got ", confidence);
}

void check_target(double target_rel_ci) {
  GPUOPT_CHECK_VALUE(target_rel_ci > 0.0 && target_rel_ci < 1.0, "target_rel_ci must be in (0, 1), got ",
                     target_rel_ci);
}

void check_min_effect(double min_effect) {
  GPUOPT_CHECK_VALUE(min_effect >= 0.0 && min_effect < 1.0, "min_effect must be in [0, 1), got ", min_effect);
}

void check_noise_floor(double noise_floor_rel) {
  GPUOPT_CHECK_VALUE(std::isfinite(noise_floor_rel) && noise_floor_rel >= 0.0,
                     "noise_floor_rel must be a finite fraction >= 0, got ", noise_floor_rel);
}

void check_samples(const std::vector<double>& samples, const char* name) {
  GPUOPT_CHECK_VALUE(!samples.empty(), name, " must hold at least one sample, got none");
  for (double x : samples) {
    GPUOPT_CHECK_VALUE(std::isfinite(x), name, " must be finite, got ", x);
  }
}

// log P(Bin(n, 1/2) = k)
double log_binom_half(std::size_t n, std::size_t k) {
  const double dn = static_cast<double>(n);
  const double dk = static_cast<double>(k);
  return std::lgamma(dn + 1) - std::lgamma(dk + 1) - std::lgamma(dn - dk + 1) - dn * std::log(2.0);
}

// Median of the first n values of buf, reordering them (numpy semantics).
double median_in_place(double* first, std::size_t n) {
  double* mid = first + n / 2;
  std::nth_element(first, mid, first + n);
  if (n % 2 == 1) return *mid;
  const double lower = *std::max_element(first, mid);
  return 0.5 * (lower + *mid);
}

// splitmix64: small, fast and good enough to draw bootstrap indices.
struct SplitMix64 {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n) without modulo bias worth caring about for n << 2^64 (Lemire's reduction).
  std::size_t below(std::size_t n) {
    return static_cast<std::size_t>((static_cast<__uint128_t>(next()) * n) >> 64);
  }
};

// Boundaries of k near-equal contiguous blocks of n samples: block j is [b[j], b[j + 1]).
std::vector<std::size_t> block_bounds(std::size_t n, std::size_t k) {
  std::vector<std::size_t> b(k + 1);
  for (std::size_t j = 0; j <= k; ++j) b[j] = j * n / k;
  return b;
}

// Units the bootstrap resamples: the batches of the measurement's own batch-median interval (its
// dependence structure), or single samples where that interval assumes independence.
std::size_t resampling_blocks(const MedianCi& ci, std::size_t n) { return ci.batches > 0 ? ci.batches : n; }

// Largest log distance of a bound of [lo, hi] from center (+inf when lo <= 0).
double log_halfwidth(const MedianCi& ci) {
  if (!(ci.lo > 0.0)) return std::numeric_limits<double>::infinity();
  return std::max(std::log(ci.median / ci.lo), std::log(ci.hi / ci.median));
}

// The q-quantile (numpy's linear method) of the first n values of buf, reordering them.
double quantile_in_place(double* first, std::size_t n, double q) {
  if (q == 0.5) return median_in_place(first, n);
  const double pos = q * static_cast<double>(n - 1);
  const auto lo = static_cast<std::size_t>(std::floor(pos));
  std::nth_element(first, first + lo, first + n);
  const double a = first[lo];
  if (lo + 1 >= n) return a;
  const double b = *std::min_element(first + lo + 1, first + n);
  return a + (b - a) * (pos - static_cast<double>(lo));
}

// The q-quantile of a resample made of the chosen blocks concatenated.
double block_resample_quantile(const std::vector<double>& data, const std::vector<std::size_t>& bounds,
                               const std::vector<std::size_t>& chosen, std::vector<double>& buf, double q) {
  std::size_t len = 0;
  for (std::size_t j : chosen) {
    const std::size_t b = bounds[j], e = bounds[j + 1];
    std::copy(data.begin() + static_cast<std::ptrdiff_t>(b), data.begin() + static_cast<std::ptrdiff_t>(e),
              buf.begin() + static_cast<std::ptrdiff_t>(len));
    len += e - b;
  }
  return quantile_in_place(buf.data(), len, q);
}

void draw_blocks(std::vector<std::size_t>& chosen, std::size_t k, SplitMix64& rng) {
  chosen.resize(k);
  for (std::size_t& j : chosen) j = rng.below(k);
}

}  // namespace

double normal_quantile(double p) {
  GPUOPT_CHECK_VALUE(p > 0.0 && p < 1.0, "p must be in (0, 1), got ", p);
  static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
                             1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
  static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                             6.680131188771972e+01,  -1.328068155288572e+01};
  static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                             -2.549732539343734e+00, 4.374664141464968e+00,  2.938163982698783e+00};
  static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                             3.754408661907416e+00};
  const double p_low = 0.02425;
  auto tail = [&](double q) {
    return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
           ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1.0);
  };
  if (p < p_low) return tail(std::sqrt(-2.0 * std::log(p)));
  if (p > 1.0 - p_low) return -tail(std::sqrt(-2.0 * std::log(1.0 - p)));
  const double q = p - 0.5;
  const double r = q * q;
  return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
         (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1.0);
}

double student_t_quantile(double p, double df) {
  GPUOPT_CHECK_VALUE(df >= 1.0, "degrees of freedom must be >= 1, got ", df);
  // Closed forms where the expansion below is poor (a calibration of 2 or 3 rounds).
  if (df == 1.0) return std::tan(3.141592653589793 * (p - 0.5));
  if (df == 2.0) return (2.0 * p - 1.0) / std::sqrt(2.0 * p * (1.0 - p));
  // Abramowitz & Stegun 26.7.5.
  const double z = normal_quantile(p);
  const double z2 = z * z, z3 = z2 * z, z5 = z3 * z2, z7 = z5 * z2, z9 = z7 * z2;
  const double g1 = (z3 + z) / 4.0;
  const double g2 = (5 * z5 + 16 * z3 + 3 * z) / 96.0;
  const double g3 = (3 * z7 + 19 * z5 + 17 * z3 - 15 * z) / 384.0;
  const double g4 = (79 * z9 + 776 * z7 + 1482 * z5 - 1920 * z3 - 945 * z) / 92160.0;
  return z + g1 / df + g2 / (df * df) + g3 / (df * df * df) + g4 / (df * df * df * df);
}

std::size_t batch_count(std::size_t n) {
  if (n < 40) return 0;
  return std::clamp<std::size_t>(n / 10, 8, 30);
}

Interval batch_median_ci(const std::vector<double>& x, double confidence, std::size_t batches) {
  check_confidence(confidence);
  GPUOPT_CHECK_VALUE(batches >= 2 && batches <= x.size(), "batches must be in [2, n=", x.size(), "], got ",
                     batches);
  std::vector<double> buf(x.size());
  std::vector<double> medians;
  // Batch medians must be nearly independent for the interval to hold: while neighbouring batch
  // medians are correlated (lag-1 autocorrelation significant at 5%), halve the number of batches
  // (Fishman's batch-size doubling), down to 4.
  for (;;) {
    const std::vector<std::size_t> bounds = block_bounds(x.size(), batches);
    medians.assign(batches, 0.0);
    for (std::size_t j = 0; j < batches; ++j) {
      const std::size_t len = bounds[j + 1] - bounds[j];
      std::copy(x.begin() + static_cast<std::ptrdiff_t>(bounds[j]),
                x.begin() + static_cast<std::ptrdiff_t>(bounds[j + 1]), buf.begin());
      medians[j] = median_in_place(buf.data(), len);
    }
    if (batches < 8) break;
    const double mean = std::accumulate(medians.begin(), medians.end(), 0.0) / static_cast<double>(batches);
    double num = 0.0, den = 0.0;
    for (std::size_t j = 0; j < batches; ++j) {
      den += (medians[j] - mean) * (medians[j] - mean);
      if (j > 0) num += (medians[j] - mean) * (medians[j - 1] - mean);
    }
    const double r1 = den > 0.0 ? num / den : 0.0;
    if (r1 <= 1.645 / std::sqrt(static_cast<double>(batches))) break;
    batches /= 2;
  }
  const double k = static_cast<double>(batches);
  const double mean = std::accumulate(medians.begin(), medians.end(), 0.0) / k;
  double ss = 0.0;
  for (double m : medians) ss += (m - mean) * (m - mean);
  const double se = std::sqrt(ss / (k - 1.0)) / std::sqrt(k);
  const double half = student_t_quantile(0.5 + confidence / 2.0, k - 1.0) * se;
  const double center = median(x);
  return {center - half, center + half, batches};
}

MedianCi median_ci(const std::vector<double>& x, double confidence) {
  GPUOPT_CHECK_VALUE(!x.empty(), "a confidence interval needs at least one sample, got none");
  std::vector<double> s(x);
  std::sort(s.begin(), s.end());
  const MedianRanks r = median_ci_ranks(s.size(), confidence);
  MedianCi out;
  out.median = quantile_sorted(s, 0.5);
  out.lo = s[r.lo];
  out.hi = s[r.hi];
  out.attained = r.attained;
  const std::size_t batches = batch_count(x.size());
  if (batches > 0) {
    const Interval b = batch_median_ci(x, confidence, batches);
    if (b.hi - b.lo > out.hi - out.lo) out.batched = true;
    out.lo = std::min(out.lo, b.lo);
    out.hi = std::max(out.hi, b.hi);
    out.attained = true;
    out.batches = b.batches;
  }
  out.level = out.attained ? confidence : r.coverage;
  return out;
}

double quantile_sorted(const std::vector<double>& sorted, double q) {
  GPUOPT_CHECK_VALUE(!sorted.empty(), "quantile of an empty sample is undefined");
  GPUOPT_CHECK_VALUE(q >= 0.0 && q <= 1.0, "q must be in [0, 1], got ", q);
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(pos));
  const std::size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

MedianRanks median_ci_ranks(std::size_t n, double confidence) {
  check_confidence(confidence);
  GPUOPT_CHECK_VALUE(n > 0, "a confidence interval needs at least one sample, got n=", n);
  const double tail = (1.0 - confidence) / 2.0;
  // Largest 1-based rank j with P(B <= j - 1) <= tail, B ~ Bin(n, 1/2): then [x_(j), x_(n-j+1)]
  // covers the median with probability 1 - 2 P(B <= j - 1). The mass below mean - 10 sd is < 1e-20,
  // so the running sum starts there.
  const double sd = std::sqrt(static_cast<double>(n)) / 2.0;
  const double start = std::floor(static_cast<double>(n) / 2.0 - 10.0 * sd);
  std::size_t j = start > 1 ? static_cast<std::size_t>(start) : 1;
  // cdf = P(B <= j - 1): exactly P(B = 0) for j == 1, negligible below `start` otherwise.
  double cdf = j == 1 ? std::exp(log_binom_half(n, 0)) : 0.0;
  std::size_t best = 0;
  double best_cdf = 0.0;
  while (2 * j <= n + 1 && cdf <= tail) {
    best = j;
    best_cdf = cdf;
    cdf += std::exp(log_binom_half(n, j));
    ++j;
  }
  MedianRanks r;
  if (best >= 1) {
    r.lo = best - 1;
    r.hi = n - best;
    r.coverage = 1.0 - 2.0 * best_cdf;
    r.attained = true;
  } else {
    r.lo = 0;
    r.hi = n - 1;
    r.coverage = 1.0 - 2.0 * std::exp(log_binom_half(n, 0));
    r.attained = false;
  }
  return r;
}

std::size_t count_outliers(const std::vector<double>& sorted, double threshold) {
  GPUOPT_CHECK_VALUE(threshold > 0.0, "outlier threshold must be > 0, got ", threshold);
  if (sorted.size() < 3) return 0;
  const double med = quantile_sorted(sorted, 0.5);
  std::vector<double> dev(sorted.size());
  for (std::size_t i = 0; i < sorted.size(); ++i) dev[i] = std::fabs(sorted[i] - med);
  const double mean_abs = std::accumulate(dev.begin(), dev.end(), 0.0) / static_cast<double>(dev.size());
  const double mad = median(dev);
  double scale;  // robust sd estimate times 0.6745, so that z = |x - med| / scale
  if (mad > 0.0) {
    scale = mad / 0.6745;
  } else if (mean_abs > 0.0) {
    scale = 1.253314 * mean_abs;
  } else {
    return 0;  // all samples equal
  }
  std::size_t count = 0;
  for (double d : dev) count += (d / scale) > threshold ? 1 : 0;
  return count;
}

double rel_halfwidth(double center, double lo, double hi) {
  if (!(center > 0.0)) return std::numeric_limits<double>::infinity();
  return std::max(center - lo, hi - center) / center;
}

Exceedance exceedance(const std::vector<double>& samples_in_order, double threshold, double tail_share) {
  check_samples(samples_in_order, "samples");
  GPUOPT_CHECK_VALUE(std::isfinite(threshold), "threshold must be finite, got ", threshold);
  GPUOPT_CHECK_VALUE(tail_share > 0.0 && tail_share < 1.0, "tail_share must be in (0, 1), got ", tail_share);
  Exceedance e;
  e.n = samples_in_order.size();
  bool in_episode = false;
  for (double x : samples_in_order) {
    const bool over = x > threshold;
    e.over += over ? 1 : 0;
    e.episodes += (over && !in_episode) ? 1 : 0;
    in_episode = over;
  }
  // P[B >= k] = 1 - P[B <= k - 1], the lower terms summed in logs (k is small where it matters).
  const double dn = static_cast<double>(e.n);
  const double log_p = std::log(tail_share), log_q = std::log1p(-tail_share);
  double below = 0.0;
  for (std::size_t j = 0; j < e.episodes; ++j) {
    const double dj = static_cast<double>(j);
    below += std::exp(std::lgamma(dn + 1) - std::lgamma(dj + 1) - std::lgamma(dn - dj + 1) + dj * log_p +
                      (dn - dj) * log_q);
  }
  e.p_value = std::clamp(1.0 - below, 0.0, 1.0);
  return e;
}

bool meets_target(const MedianCi& ci, double target_rel_ci) {
  return ci.attained && rel_halfwidth(ci.median, ci.lo, ci.hi) <= target_rel_ci;
}

Summary summarize(const std::vector<double>& samples, double confidence, double target_rel_ci) {
  check_samples(samples, "samples");
  check_confidence(confidence);
  check_target(target_rel_ci);
  std::vector<double> s(samples);
  std::sort(s.begin(), s.end());
  Summary out;
  out.n = s.size();
  const double n = static_cast<double>(out.n);
  out.mean = std::accumulate(s.begin(), s.end(), 0.0) / n;
  double ss = 0.0;
  for (double x : s) ss += (x - out.mean) * (x - out.mean);
  out.stddev = out.n > 1 ? std::sqrt(ss / (n - 1.0)) : 0.0;
  out.min = s.front();
  out.max = s.back();
  out.p25 = quantile_sorted(s, 0.25);
  out.p50 = quantile_sorted(s, 0.50);
  out.p75 = quantile_sorted(s, 0.75);
  out.p90 = quantile_sorted(s, 0.90);
  out.p95 = quantile_sorted(s, 0.95);
  out.p99 = quantile_sorted(s, 0.99);
  out.iqr = out.p75 - out.p25;
  out.cv = out.mean != 0.0 ? out.stddev / out.mean : 0.0;
  std::vector<double> dev(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) dev[i] = std::fabs(s[i] - out.p50);
  out.mad = median(dev);
  const MedianRanks r = median_ci_ranks(out.n, confidence);
  const MedianCi ci = median_ci(samples, confidence);
  out.ci_lo = ci.lo;
  out.ci_hi = ci.hi;
  out.ci_level = ci.level;
  out.ci_requested = confidence;
  out.ci_coverage = r.coverage;
  out.ci_attained = ci.attained;
  out.ci_method = ci.batched ? "batch-medians" : "order-statistics";
  out.ci_batches = ci.batches;
  out.outliers = count_outliers(s);
  out.ci_rel = rel_halfwidth(out.p50, out.ci_lo, out.ci_hi);
  out.target_rel_ci = target_rel_ci;
  out.target_met = meets_target(ci, target_rel_ci);
  return out;
}

double median(std::vector<double> data) {
  GPUOPT_CHECK_VALUE(!data.empty(), "median of an empty sample is undefined");
  return median_in_place(data.data(), data.size());
}

Ratio bootstrap_speedup(const std::vector<double>& baseline, const std::vector<double>& candidate,
                        double confidence, int resamples, std::uint64_t seed, bool paired, double q) {
  GPUOPT_CHECK_VALUE(q > 0.0 && q < 1.0, "q must be in (0, 1), got ", q);
  check_samples(baseline, "baseline samples");
  check_samples(candidate, "candidate samples");
  check_confidence(confidence);
  GPUOPT_CHECK_VALUE(resamples >= 100, "resamples must be >= 100, got ", resamples);
  GPUOPT_CHECK_VALUE(!paired || baseline.size() == candidate.size(),
                     "paired samples must have equal counts, got ", baseline.size(), " and ", candidate.size());
  std::vector<double> sa(baseline), sb(candidate);
  std::sort(sa.begin(), sa.end());
  std::sort(sb.begin(), sb.end());
  const double med_a = quantile_sorted(sa, q);
  const double med_b = quantile_sorted(sb, q);
  GPUOPT_CHECK_VALUE(med_a > 0.0 && med_b > 0.0, "a speedup needs positive statistics, got baseline ", med_a,
                     " and candidate ", med_b);
  const MedianCi ci_a = median_ci(baseline, confidence);
  const MedianCi ci_b = median_ci(candidate, confidence);
  SplitMix64 rng{seed};
  std::size_t ka = resampling_blocks(ci_a, baseline.size());
  std::size_t kb = resampling_blocks(ci_b, candidate.size());
  if (paired) ka = kb = std::min(ka, kb);  // one set of blocks: the coarser structure of the two
  const std::vector<std::size_t> bounds_a = block_bounds(baseline.size(), ka);
  const std::vector<std::size_t> bounds_b = block_bounds(candidate.size(), kb);
  // A resample of whole blocks can be longer than n by at most one block.
  std::vector<double> buf_a(2 * baseline.size() + 1), buf_b(2 * candidate.size() + 1);
  std::vector<std::size_t> chosen_a, chosen_b;
  std::vector<double> ratios(static_cast<std::size_t>(resamples));
  for (double& r : ratios) {
    draw_blocks(chosen_a, ka, rng);
    if (paired) {
      chosen_b = chosen_a;
    } else {
      draw_blocks(chosen_b, kb, rng);
    }
    r = block_resample_quantile(baseline, bounds_a, chosen_a, buf_a, q) /
        block_resample_quantile(candidate, bounds_b, chosen_b, buf_b, q);
  }
  std::sort(ratios.begin(), ratios.end());
  const double tail = (1.0 - confidence) / 2.0;
  Ratio out;
  out.ratio = med_a / med_b;
  out.lo = quantile_sorted(ratios, tail);
  out.hi = quantile_sorted(ratios, 1.0 - tail);
  out.confidence = confidence;
  out.resamples = resamples;
  out.attained = ci_a.attained && ci_b.attained;
  out.blocks_baseline = ka;
  out.blocks_candidate = kb;
  if (!paired && q == 0.5) {
    // Independent measurements: the ratio is no more certain than either median (a percentile
    // bootstrap of few blocks is itself too narrow, and has no t-quantile for its few degrees of
    // freedom; the batch interval has).
    const double la = log_halfwidth(ci_a), lb = log_halfwidth(ci_b);
    const double spread = std::sqrt(la * la + lb * lb);
    const double lo = out.ratio * std::exp(-spread), hi = out.ratio * std::exp(spread);
    if (lo < out.lo || hi > out.hi) out.widened_to_inputs = true;
    out.lo = std::min(out.lo, lo);
    out.hi = std::max(out.hi, hi);
  }
  return out;
}

RunToRun run_to_run_spread(const std::vector<std::vector<double>>& round_medians, double confidence) {
  check_confidence(confidence);
  GPUOPT_CHECK_VALUE(!round_medians.empty(), "a run-to-run calibration needs at least one workload, got none");
  RunToRun out;
  out.confidence = confidence;
  out.rounds = std::numeric_limits<std::size_t>::max();
  double ss = 0.0;
  for (const std::vector<double>& medians : round_medians) {
    GPUOPT_CHECK_VALUE(medians.size() >= 2, "each workload needs the medians of at least 2 rounds, got ",
                       medians.size());
    double mean = 0.0;
    for (double m : medians) {
      GPUOPT_CHECK_VALUE(std::isfinite(m) && m > 0.0, "round medians must be finite and > 0, got ", m);
      mean += std::log(m);
    }
    mean /= static_cast<double>(medians.size());
    for (double m : medians) ss += (std::log(m) - mean) * (std::log(m) - mean);
    out.df += medians.size() - 1;
    out.rounds = std::min(out.rounds, medians.size());
  }
  GPUOPT_CHECK_VALUE(out.df >= 2, "a run-to-run calibration needs at least 3 rounds in all (2 degrees of "
                     "freedom), got ", out.df + round_medians.size());
  out.workloads = round_medians.size();
  out.sd_log = std::sqrt(ss / static_cast<double>(out.df));
  const double t = student_t_quantile(0.5 + confidence / 2.0, static_cast<double>(out.df));
  out.rel = std::expm1(t * out.sd_log * std::sqrt(2.0));
  return out;
}

const char* verdict_name(Verdict verdict) {
  switch (verdict) {
    case Verdict::kFaster: return "faster";
    case Verdict::kSlower: return "slower";
    case Verdict::kNoDifference: break;
  }
  return "no significant difference";
}

Interval judged_interval(const Ratio& r, double noise_floor_rel) {
  check_noise_floor(noise_floor_rel);
  return {std::min(r.lo, r.ratio / (1.0 + noise_floor_rel)), std::max(r.hi, r.ratio * (1.0 + noise_floor_rel)), 0};
}

Verdict judge(const Ratio& r, double min_effect, double noise_floor_rel) {
  check_min_effect(min_effect);
  const Interval i = judged_interval(r, noise_floor_rel);
  if (!r.attained) return Verdict::kNoDifference;
  if (i.lo > 1.0 && r.ratio >= 1.0 + min_effect) return Verdict::kFaster;
  if (i.hi < 1.0 && r.ratio <= 1.0 / (1.0 + min_effect)) return Verdict::kSlower;
  return Verdict::kNoDifference;
}

Comparison compare_samples(const std::vector<double>& baseline, const std::vector<double>& candidate,
                           const CompareOptions& o) {
  check_min_effect(o.min_effect);  // before the bootstrap's work
  check_noise_floor(o.noise_floor_rel);
  Comparison out;
  out.ratio = bootstrap_speedup(baseline, candidate, o.confidence, o.resamples, o.seed, o.paired, o.q);
  out.judged = judged_interval(out.ratio, o.noise_floor_rel);
  out.verdict = judge(out.ratio, o.min_effect, o.noise_floor_rel);
  return out;
}

}  // namespace gpuopt::stats
