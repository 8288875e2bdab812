// Statistics of timing samples: order statistics, a distribution-free confidence interval of the
// median, MAD outliers, and a bootstrap interval for the ratio of two medians.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gpuopt::stats {

// Defaults of the statistics, the sampler (SamplerOptions) and comparisons: defined here only, and
// read by Python through _C.measure_defaults() and the bindings' own defaults.
inline constexpr double kDefaultConfidence = 0.95;
inline constexpr double kDefaultTargetRelCi = 0.01;  // CI half-width of the median, relative to it
inline constexpr int kDefaultResamples = 2000;
inline constexpr std::uint64_t kDefaultSeed = 0x6770756f707431ULL;
inline constexpr double kDefaultMinEffect = 0.01;  // smallest speedup or slowdown called a change

// Quantile of sorted data by linear interpolation between order statistics (numpy's default).
// q in [0, 1]; data non-empty and sorted ascending.
double quantile_sorted(const std::vector<double>& sorted, double q);

// Ranks (0-based, inclusive) of the order statistics that bound a distribution-free confidence
// interval of the median: the largest symmetric pair whose exact binomial coverage is >= confidence.
// When n is too small for that coverage, the interval is [min, max] and `attained` is false.
struct MedianRanks {
  std::size_t lo = 0;
  std::size_t hi = 0;
  double coverage = 0.0;  // exact coverage of [x_lo, x_hi]
  bool attained = false;  // coverage >= requested confidence
};
MedianRanks median_ci_ranks(std::size_t n, double confidence);

// Outliers by the modified z-score 0.6745 * |x - median| / MAD > threshold (Iglewicz and Hoaglin);
// when MAD is 0 the mean absolute deviation (scaled by 1.2533) stands in. Reported, never removed.
std::size_t count_outliers(const std::vector<double>& sorted, double threshold = 3.5);

// Standard normal quantile (Acklam's rational approximation, relative error < 1.2e-9), p in (0, 1).
double normal_quantile(double p);
// Student-t quantile (Cornish-Fisher expansion around the normal; < 1e-3 absolute error for df >= 5).
double student_t_quantile(double p, double df);

// Number of contiguous batches used for autocorrelation-aware intervals: 0 below 40 samples (too
// few; intervals then assume independent samples), else between 8 and 30.
std::size_t batch_count(std::size_t n);

// Confidence interval of the median from the spread of batch medians (the batch-means method of
// simulation output analysis). Samples must be in time order. Consecutive GPU timings are often
// correlated (clock and power states last milliseconds to seconds), which makes an interval built on
// independence too narrow; batches longer than the correlation keep it honest. Returns the median
// +- t * sd(batch medians) / sqrt(batches).
struct Interval {
  double lo = 0, hi = 0;
};
Interval batch_median_ci(const std::vector<double>& samples_in_order, double confidence, std::size_t batches);

struct Summary {
  std::size_t n = 0;
  double mean = 0, stddev = 0, min = 0, max = 0;
  double p25 = 0, p50 = 0, p75 = 0, p90 = 0, p95 = 0, p99 = 0;
  double iqr = 0;
  double cv = 0;  // stddev / mean
  double mad = 0;  // median absolute deviation (unscaled)
  double ci_lo = 0, ci_hi = 0;  // confidence interval of the median
  double ci_level = 0;  // requested level
  double ci_coverage = 0;  // exact coverage of the order-statistics interval
  bool ci_attained = false;
  // "order-statistics": independent samples assumed; "batch-medians": the batch interval was wider
  // (correlated samples) and is reported. The reported interval is the envelope of both.
  const char* ci_method = "order-statistics";
  std::size_t ci_batches = 0;
  std::size_t outliers = 0;
  double ci_rel = 0;  // rel_halfwidth(p50, ci_lo, ci_hi)
  double target_rel_ci = 0;
  bool target_met = false;  // meets_target: the sampler's stopping rule
};

// Full summary; samples non-empty, finite and in time order. stddev uses n - 1 (0 for one sample).
// target_rel_ci in (0, 1).
Summary summarize(const std::vector<double>& samples, double confidence = kDefaultConfidence,
                  double target_rel_ci = kDefaultTargetRelCi);

// The interval summarize() reports, alone (for stopping rules): {lo, hi, attained}.
struct MedianCi {
  double median = 0, lo = 0, hi = 0;
  bool attained = false;
  bool batched = false;
};
MedianCi median_ci(const std::vector<double>& samples_in_order, double confidence);

// Largest distance of a bound of [lo, hi] from `center`, relative to it; +inf unless center > 0.
double rel_halfwidth(double center, double lo, double hi);

// The precision target of the sampler and of summaries: the interval reached its confidence and
// lies within +-target_rel_ci of the median.
bool meets_target(const MedianCi& ci, double target_rel_ci);

// Ratio median(baseline) / median(candidate) -- the speedup of the candidate -- with a percentile
// block-bootstrap confidence interval: each set (in time order) is cut into batch_count(n)
// contiguous blocks that are resampled whole, so correlation between neighbouring samples is kept
// (plain resampling below 40 samples). `paired`: the sets were taken interleaved (same length, sample
// i of each adjacent in time) and are resampled with the same blocks, so shared drift cancels.
struct Ratio {
  double ratio = 0, lo = 0, hi = 0;
  double confidence = 0;
  int resamples = 0;
};
// `q` picks the statistic: 0.5 (default) the median, 0.95 the p95 (a regression of the tail).
Ratio bootstrap_speedup(const std::vector<double>& baseline, const std::vector<double>& candidate,
                        double confidence = kDefaultConfidence, int resamples = kDefaultResamples,
                        std::uint64_t seed = kDefaultSeed, bool paired = false, double q = 0.5);

enum class Verdict { kFaster, kSlower, kNoDifference };
// "faster", "slower", "no significant difference".
const char* verdict_name(Verdict verdict);

// The one verdict of gpuopt (compare(), Results.speedups, the pytest plugin): "faster" when the whole
// interval lies above 1 and the speedup is at least 1 + min_effect; "slower" when it lies below 1 and
// the slowdown is at least as large (ratio <= 1 / (1 + min_effect)); otherwise no significant
// difference. min_effect in [0, 1) keeps changes smaller than timings reproduce from being called
// speedups, however tight the interval.
Verdict judge(const Ratio& ratio, double min_effect = kDefaultMinEffect);

struct CompareOptions {
  double confidence = kDefaultConfidence;
  int resamples = kDefaultResamples;
  std::uint64_t seed = kDefaultSeed;
  bool paired = false;
  double q = 0.5;
  double min_effect = kDefaultMinEffect;
};
struct Comparison {
  Ratio ratio;
  Verdict verdict = Verdict::kNoDifference;
};
// bootstrap_speedup() followed by judge().
Comparison compare_samples(const std::vector<double>& baseline, const std::vector<double>& candidate,
                           const CompareOptions& options = {});

// Median of unsorted data (numpy semantics: mean of the two middle values for even n).
double median(std::vector<double> data);

}  // namespace gpuopt::stats
