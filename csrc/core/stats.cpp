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

double bootstrap_median(const std::vector<double>& data, std::vector<double>& buf, SplitMix64& rng) {
  const std::size_t n = data.size();
  for (std::size_t i = 0; i < n; ++i) buf[i] = data[rng.below(n)];
  return median_in_place(buf.data(), n);
}

}  // namespace

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

double Summary::ci_rel_halfwidth() const {
  if (!(p50 > 0.0)) return std::numeric_limits<double>::infinity();
  return std::max(p50 - ci_lo, ci_hi - p50) / p50;
}

Summary summarize(const std::vector<double>& samples, double confidence) {
  check_samples(samples, "samples");
  check_confidence(confidence);
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
  out.ci_lo = s[r.lo];
  out.ci_hi = s[r.hi];
  out.ci_level = confidence;
  out.ci_coverage = r.coverage;
  out.ci_attained = r.attained;
  out.outliers = count_outliers(s);
  return out;
}

double median(std::vector<double> data) {
  GPUOPT_CHECK_VALUE(!data.empty(), "median of an empty sample is undefined");
  return median_in_place(data.data(), data.size());
}

Ratio bootstrap_speedup(const std::vector<double>& baseline, const std::vector<double>& candidate,
                        double confidence, int resamples, std::uint64_t seed) {
  check_samples(baseline, "baseline samples");
  check_samples(candidate, "candidate samples");
  check_confidence(confidence);
  GPUOPT_CHECK_VALUE(resamples >= 100, "resamples must be >= 100, got ", resamples);
  const double med_a = median(baseline);
  const double med_b = median(candidate);
  GPUOPT_CHECK_VALUE(med_a > 0.0 && med_b > 0.0,
                     "a speedup needs positive medians, got baseline ", med_a, " and candidate ", med_b);
  SplitMix64 rng{seed};
  std::vector<double> buf_a(baseline.size()), buf_b(candidate.size());
  std::vector<double> ratios(static_cast<std::size_t>(resamples));
  for (double& r : ratios) {
    const double a = bootstrap_median(baseline, buf_a, rng);
    const double b = bootstrap_median(candidate, buf_b, rng);
    r = a / b;
  }
  std::sort(ratios.begin(), ratios.end());
  const double tail = (1.0 - confidence) / 2.0;
  Ratio out;
  out.ratio = med_a / med_b;
  out.lo = quantile_sorted(ratios, tail);
  out.hi = quantile_sorted(ratios, 1.0 - tail);
  out.confidence = confidence;
  out.resamples = resamples;
  return out;
}

}  // namespace gpuopt::stats
