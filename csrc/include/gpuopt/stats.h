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
// Run-to-run band assumed by cross-run comparisons (two separate runs, e.g. a baseline file) when no
// A/A calibration exists: the spread of medians between separate runs, beyond what one run sees.
// Conservative: separately measured A/A GEMM pairs on an H100 differed by up to ~2-3%.
inline constexpr double kDefaultRunToRunRelGpu = 0.03;
inline constexpr double kDefaultRunToRunRelHost = 0.05;  // host (CPU) timings: busier, noisier

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
// Student-t quantile: exact for df 1 and 2, else the Cornish-Fisher expansion around the normal
// (< 1e-3 absolute error for df >= 5, < 5e-2 for df 3 and 4 at p <= 0.995).
double student_t_quantile(double p, double df);

// Number of contiguous batches used for autocorrelation-aware intervals: 0 below 40 samples (too
// few; intervals then assume independent samples), else between 8 and 30.
std::size_t batch_count(std::size_t n);

// Confidence interval of the median from the spread of batch medians (the batch-means method of
// simulation output analysis). Samples must be in time order. Consecutive GPU timings are often
// correlated (clock and power states last milliseconds to seconds), which makes an interval built on
// independence too narrow; batches longer than the correlation keep it honest. Returns the median
// +- t * sd(batch medians) / sqrt(batches). `batches` of the result: the count actually used, after
// halving while neighbouring batch medians stay correlated -- the dependence structure that
// bootstrap_speedup() resamples.
struct Interval {
  double lo = 0, hi = 0;
  std::size_t batches = 0;
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
  // The level the interval has: the requested one when attained, else the exact coverage reached
  // by [min, max] of too few samples (1 - 2^(1-n): 0 for one sample, 0.5 for two, 0.75 for three).
  double ci_level = 0;
  double ci_requested = 0;  // the confidence asked for
  double ci_coverage = 0;  // exact coverage of the order-statistics interval
  bool ci_attained = false;
  // "order-statistics": independent samples assumed; "batch-medians": the batch interval was wider
  // (correlated samples) and is reported. The reported interval is the envelope of both.
  const char* ci_method = "order-statistics";
  std::size_t ci_batches = 0;  // batches of the batch-median interval (0 below 40 samples)
  std::size_t outliers = 0;
  double ci_rel = 0;  // rel_halfwidth(p50, ci_lo, ci_hi)
  double target_rel_ci = 0;
  bool target_met = false;  // meets_target: the sampler's stopping rule
};

// Full summary; samples non-empty, finite and in time order. stddev uses n - 1 (0 for one sample).
// target_rel_ci in (0, 1).
Summary summarize(const std::vector<double>& samples, double confidence = kDefaultConfidence,
                  double target_rel_ci = kDefaultTargetRelCi);

// The interval summarize() reports, alone (for stopping rules and speedups).
struct MedianCi {
  double median = 0, lo = 0, hi = 0;
  double level = 0;  // Summary::ci_level: the confidence when attained, else the coverage reached
  bool attained = false;
  bool batched = false;  // the batch-median interval was the wider one
  std::size_t batches = 0;  // batches the batch-median interval used (0 below 40 samples)
};
MedianCi median_ci(const std::vector<double>& samples_in_order, double confidence);

// Largest distance of a bound of [lo, hi] from `center`, relative to it; +inf unless center > 0.
double rel_halfwidth(double center, double lo, double hi);

// Samples (in the order taken) over a threshold, and whether a tail of `tail_share` explains them: the
// calls over it, the episodes they form (runs of consecutive calls over it: one stall of the host spans
// several calls, so an episode is the independent event), and p_value = P[B >= episodes] for
// B ~ Binomial(n, tail_share). A p99 over an SLO is shown only when p_value is small (tail_share 0.01).
struct Exceedance {
  std::size_t n = 0, over = 0, episodes = 0;
  double p_value = 1.0;
};
// kValue errors for no samples, a non-finite sample or threshold, tail_share outside (0, 1).
Exceedance exceedance(const std::vector<double>& samples_in_order, double threshold, double tail_share);

// The precision target of the sampler and of summaries: the interval reached its confidence and
// lies within +-target_rel_ci of the median.
bool meets_target(const MedianCi& ci, double target_rel_ci);

// Ratio median(baseline) / median(candidate) -- the speedup of the candidate -- with a percentile
// block-bootstrap confidence interval that keeps the dependence structure of each measurement's own
// interval: each set (in time order) is cut into the batches its batch-median interval used (after
// halving while neighbouring batches stay correlated), which are resampled whole (single samples
// below 40, where the order-statistics interval assumes independence). `paired`: the sets were
// taken interleaved (same length, sample i of each adjacent in time) and are resampled with the same
// blocks, so shared drift cancels.
// Unpaired (q = 0.5), the interval is then widened, where it is narrower, to the inputs' own median
// intervals propagated to the ratio: ratio * exp(+-sqrt(la^2 + lb^2)), with la the larger log
// distance of input a's interval bound from its median. Hence, exactly (rel_halfwidth as below):
//   rel_halfwidth(ratio, lo, hi) >= max(rel_halfwidth of baseline's CI, of candidate's CI)
// at the same confidence: a speedup is never more certain than its inputs.
struct Ratio {
  double ratio = 0, lo = 0, hi = 0;
  double confidence = 0;
  int resamples = 0;
  // False when an input's median interval could not reach `confidence` (too few samples): then no
  // difference is significant at that confidence.
  bool attained = true;
  bool widened_to_inputs = false;  // the inputs' intervals, not the bootstrap, set a bound
  std::size_t blocks_baseline = 0, blocks_candidate = 0;  // resampled units (samples or batches)
};
// `q` picks the statistic: 0.5 (default) the median, 0.95 the p95 (a regression of the tail).
Ratio bootstrap_speedup(const std::vector<double>& baseline, const std::vector<double>& candidate,
                        double confidence = kDefaultConfidence, int resamples = kDefaultResamples,
                        std::uint64_t seed = kDefaultSeed, bool paired = false, double q = 0.5);

// Run-to-run spread from an A/A calibration: round_medians[w] holds the medians of workload w
// measured in separate rounds (runs). The log medians' variance is pooled over workloads
// (df = sum(rounds_w - 1) >= 2), and `rel` is the band that the ratio of two separate runs of the
// same workload stays within at `confidence`: exp(t(df) * sd * sqrt(2)) - 1.
struct RunToRun {
  double rel = 0;
  double sd_log = 0;  // pooled standard deviation of log medians
  std::size_t rounds = 0;  // fewest rounds of a workload
  std::size_t workloads = 0;
  std::size_t df = 0;
  double confidence = 0;
};
RunToRun run_to_run_spread(const std::vector<std::vector<double>>& round_medians,
                           double confidence = kDefaultConfidence);

enum class Verdict { kFaster, kSlower, kNoDifference };
// "faster", "slower", "no significant difference".
const char* verdict_name(Verdict verdict);

// The one verdict of gpuopt (compare(), Results.speedups, the pytest plugin): "faster" when the whole
// interval lies above 1 and the speedup is at least 1 + min_effect; "slower" when it lies below 1 and
// the slowdown is at least as large (ratio <= 1 / (1 + min_effect)); otherwise no significant
// difference. min_effect in [0, 1) keeps changes smaller than timings reproduce from being called
// speedups, however tight the interval. An unattained ratio (see Ratio) is never significant.
// noise_floor_rel (finite, >= 0): for cross-run comparisons, the run-to-run band; the interval judged is
// then the envelope of the CI and [ratio / (1 + noise_floor_rel), ratio * (1 + noise_floor_rel)], so a
// difference counts only if it exceeds both the statistical interval and the run-to-run band.
Verdict judge(const Ratio& ratio, double min_effect = kDefaultMinEffect, double noise_floor_rel = 0.0);

// The interval judge() decides on: the CI widened to the run-to-run band.
Interval judged_interval(const Ratio& ratio, double noise_floor_rel);

struct CompareOptions {
  double confidence = kDefaultConfidence;
  int resamples = kDefaultResamples;
  std::uint64_t seed = kDefaultSeed;
  bool paired = false;
  double q = 0.5;
  double min_effect = kDefaultMinEffect;
  double noise_floor_rel = 0.0;  // cross-run comparisons: the run-to-run band (see judge)
};
struct Comparison {
  Ratio ratio;  // the statistical interval
  Interval judged;  // the interval the verdict used (ratio's, widened by noise_floor_rel)
  Verdict verdict = Verdict::kNoDifference;
};
// bootstrap_speedup() followed by judge().
Comparison compare_samples(const std::vector<double>& baseline, const std::vector<double>& candidate,
                           const CompareOptions& options = {});

// Median of unsorted data (numpy semantics: mean of the two middle values for even n).
double median(std::vector<double> data);

}  // namespace gpuopt::stats
