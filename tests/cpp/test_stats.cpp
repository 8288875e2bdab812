#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gpuopt/errors.h"
#include "gpuopt/stats.h"

namespace {

using gpuopt::stats::bootstrap_speedup;
using gpuopt::stats::judge;
using gpuopt::stats::median_ci_ranks;
using gpuopt::stats::Ratio;
using gpuopt::stats::Verdict;
using gpuopt::stats::quantile_sorted;
using gpuopt::stats::summarize;

std::vector<double> lognormal(std::size_t n, double mu, double sigma, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> d(mu, sigma);
  std::vector<double> v(n);
  for (double& x : v) x = d(rng);
  return v;
}

TEST(Quantile, InterpolatesLinearlyLikeNumpy) {
  const std::vector<double> s{1, 2, 3, 4};
  EXPECT_DOUBLE_EQ(quantile_sorted(s, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(quantile_sorted(s, 1.0), 4.0);
  EXPECT_DOUBLE_EQ(quantile_sorted(s, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(quantile_sorted(s, 0.9), 3.7);  // numpy.quantile([1,2,3,4], 0.9)
}

TEST(Quantile, RejectsBadInput) {
  EXPECT_THROW(quantile_sorted({}, 0.5), gpuopt::Error);
  EXPECT_THROW(quantile_sorted({1.0}, 1.5), gpuopt::Error);
}

// Exact binomial ranks from standard tables (Conover, Practical Nonparametric Statistics):
// n=10 -> ranks 2..9 (coverage 0.9785), n=20 -> 6..15 (0.9586), n=100 -> 40..61 (0.9648).
TEST(MedianCi, MatchesBinomialTables) {
  auto r10 = median_ci_ranks(10, 0.95);
  EXPECT_TRUE(r10.attained);
  EXPECT_EQ(r10.lo, 1u);
  EXPECT_EQ(r10.hi, 8u);
  EXPECT_NEAR(r10.coverage, 0.978515625, 1e-9);
  auto r20 = median_ci_ranks(20, 0.95);
  EXPECT_EQ(r20.lo, 5u);
  EXPECT_EQ(r20.hi, 14u);
  EXPECT_NEAR(r20.coverage, 0.958610535, 1e-6);
  auto r100 = median_ci_ranks(100, 0.95);
  EXPECT_EQ(r100.lo, 39u);
  EXPECT_EQ(r100.hi, 60u);
  EXPECT_GE(r100.coverage, 0.95);
}

TEST(MedianCi, TooFewSamplesFallBackToTheRangeAndSaySo) {
  auto r = median_ci_ranks(5, 0.95);  // best possible coverage with 5 samples is 0.9375
  EXPECT_FALSE(r.attained);
  EXPECT_EQ(r.lo, 0u);
  EXPECT_EQ(r.hi, 4u);
  EXPECT_NEAR(r.coverage, 0.9375, 1e-12);
  auto r6 = median_ci_ranks(6, 0.95);
  EXPECT_TRUE(r6.attained);
}

TEST(MedianCi, LargeNIsSymmetricAndNearNormalApproximation) {
  const std::size_t n = 1000000;
  auto r = median_ci_ranks(n, 0.95);
  EXPECT_TRUE(r.attained);
  EXPECT_EQ(r.lo + r.hi, n - 1);
  const double half = 1.959964 * std::sqrt(static_cast<double>(n)) / 2.0;
  EXPECT_NEAR(static_cast<double>(n) / 2.0 - static_cast<double>(r.lo), half, 2.0);
}

TEST(MedianCi, CoverageHoldsEmpirically) {
  // 2000 experiments of n=50 draws from a skewed distribution with known median exp(0)=1.
  std::mt19937_64 rng(7);
  std::lognormal_distribution<double> d(0.0, 0.5);
  const auto r = median_ci_ranks(50, 0.95);
  int covered = 0;
  const int trials = 2000;
  for (int t = 0; t < trials; ++t) {
    std::vector<double> v(50);
    for (double& x : v) x = d(rng);
    std::sort(v.begin(), v.end());
    covered += (v[r.lo] <= 1.0 && 1.0 <= v[r.hi]) ? 1 : 0;
  }
  EXPECT_NEAR(static_cast<double>(covered) / trials, r.coverage, 0.02);
}

TEST(Quantiles, NormalAndStudentT) {
  EXPECT_NEAR(gpuopt::stats::normal_quantile(0.975), 1.959963985, 1e-8);
  EXPECT_NEAR(gpuopt::stats::normal_quantile(0.01), -2.326347874, 1e-8);
  EXPECT_NEAR(gpuopt::stats::normal_quantile(0.5), 0.0, 1e-12);
  // scipy.stats.t.ppf(0.975, df)
  EXPECT_NEAR(gpuopt::stats::student_t_quantile(0.975, 7), 2.364624, 2e-3);
  EXPECT_NEAR(gpuopt::stats::student_t_quantile(0.975, 29), 2.045230, 1e-4);
  EXPECT_NEAR(gpuopt::stats::student_t_quantile(0.995, 9), 3.249836, 5e-3);
  EXPECT_THROW(gpuopt::stats::normal_quantile(1.0), gpuopt::Error);
}

TEST(BatchCi, IndependentSamplesGiveAnIntervalLikeOrderStatistics) {
  const auto v = lognormal(2000, 0.0, 0.05, 41);
  const auto s = summarize(v);
  const auto b = gpuopt::stats::batch_median_ci(v, 0.95, gpuopt::stats::batch_count(v.size()));
  std::vector<double> sorted(v);
  std::sort(sorted.begin(), sorted.end());
  const auto r = median_ci_ranks(v.size(), 0.95);
  const double iid = sorted[r.hi] - sorted[r.lo];
  EXPECT_GT(b.hi - b.lo, 0.6 * iid);
  EXPECT_LT(b.hi - b.lo, 1.8 * iid);
  EXPECT_LE(s.ci_lo, s.p50);
  EXPECT_GE(s.ci_hi, s.p50);
}

// A slow oscillation (like a GPU under a power cap) shared by runs of neighbouring samples: the
// order-statistics interval is far too narrow, the batch interval is not, and summarize reports it.
std::vector<double> drifting(std::size_t n, double amplitude, std::size_t period, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> noise(0.0, 0.002);
  std::uniform_real_distribution<double> phase(0.0, 6.283185307);
  const double p0 = phase(rng);
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    v[i] = 1.0 + amplitude * std::sin(p0 + 6.283185307 * static_cast<double>(i) / period) + noise(rng);
  }
  return v;
}

TEST(BatchCi, CorrelatedSamplesWidenTheReportedInterval) {
  const auto v = drifting(600, 0.05, 400, 5);
  const auto s = summarize(v);
  EXPECT_STREQ(s.ci_method, "batch-medians");
  EXPECT_GT(s.ci_rel, 0.01);
  EXPECT_FALSE(s.target_met);
}

// An AR(1) process around 1.0: each sample keeps 95% of the previous one's deviation.
std::vector<double> ar1(std::size_t n, double phi, double sd, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> noise(0.0, sd);
  std::vector<double> v(n);
  double x = 0.0;
  for (double& out : v) {
    x = phi * x + noise(rng);
    out = 1.0 + x;
  }
  return v;
}

TEST(BatchCi, CoverageHoldsForCorrelatedRunsWhereIndependenceFails) {
  int covered_batch = 0, covered_iid = 0;
  const int trials = 300;
  for (int t = 0; t < trials; ++t) {
    const auto v = ar1(1000, 0.95, 0.005, 1000 + t);
    const auto s = summarize(v);
    covered_batch += (s.ci_lo <= 1.0 && 1.0 <= s.ci_hi) ? 1 : 0;
    std::vector<double> sorted(v);
    std::sort(sorted.begin(), sorted.end());
    const auto r = median_ci_ranks(v.size(), 0.95);
    covered_iid += (sorted[r.lo] <= 1.0 && 1.0 <= sorted[r.hi]) ? 1 : 0;
  }
  EXPECT_LT(covered_iid, trials * 0.5);    // independence assumed: badly over-confident
  EXPECT_GT(covered_batch, trials * 0.8);  // batch medians: close to nominal
}

TEST(Summarize, MomentsAndQuantiles) {
  const std::vector<double> v{5, 1, 4, 2, 3};
  const auto s = summarize(v);
  EXPECT_EQ(s.n, 5u);
  EXPECT_DOUBLE_EQ(s.mean, 3.0);
  EXPECT_DOUBLE_EQ(s.stddev, std::sqrt(2.5));
  EXPECT_DOUBLE_EQ(s.min, 1.0);
  EXPECT_DOUBLE_EQ(s.max, 5.0);
  EXPECT_DOUBLE_EQ(s.p50, 3.0);
  EXPECT_DOUBLE_EQ(s.iqr, 2.0);
  EXPECT_DOUBLE_EQ(s.mad, 1.0);
  EXPECT_NEAR(s.cv, std::sqrt(2.5) / 3.0, 1e-15);
  EXPECT_FALSE(s.ci_attained);
}

TEST(Summarize, RejectsNonFiniteAndEmpty) {
  EXPECT_THROW(summarize({}), gpuopt::Error);
  EXPECT_THROW(summarize({1.0, NAN}), gpuopt::Error);
  EXPECT_THROW(summarize({1.0, INFINITY}), gpuopt::Error);
  EXPECT_THROW(summarize({1.0, 2.0}, 1.0), gpuopt::Error);
}

TEST(Outliers, CountsFarPointsAndOnlyThose) {
  std::vector<double> v = lognormal(1000, 0.0, 0.01, 3);
  const auto clean = summarize(v);
  EXPECT_LE(clean.outliers, 5u);
  v.push_back(10.0);
  v.push_back(20.0);
  const auto dirty = summarize(v);
  EXPECT_EQ(dirty.outliers, clean.outliers + 2);
}

TEST(Outliers, ConstantSamplesHaveNone) {
  EXPECT_EQ(summarize(std::vector<double>(100, 2.0)).outliers, 0u);
}

TEST(Bootstrap, IdenticalDistributionsContainOne) {
  const auto a = lognormal(400, 0.0, 0.05, 11);
  const auto b = lognormal(400, 0.0, 0.05, 12);
  const auto r = bootstrap_speedup(a, b);
  EXPECT_LT(r.lo, 1.0);
  EXPECT_GT(r.hi, 1.0);
}

TEST(Bootstrap, DetectsAFivePercentSpeedup) {
  const auto a = lognormal(400, std::log(1.05), 0.02, 21);
  const auto b = lognormal(400, 0.0, 0.02, 22);
  const auto r = bootstrap_speedup(a, b);
  EXPECT_NEAR(r.ratio, 1.05, 0.01);
  EXPECT_GT(r.lo, 1.0);
  EXPECT_LE(r.lo, r.ratio);
  EXPECT_GE(r.hi, r.ratio);
}

TEST(Bootstrap, PairedResamplingCancelsSharedDrift) {
  // Two interleaved runs of the same workload under the same drift: unpaired intervals are wide,
  // paired ones are tight and centred on 1.
  const auto drift = drifting(800, 0.05, 300, 9);
  std::mt19937_64 rng(10);
  std::normal_distribution<double> noise(0.0, 0.002);
  std::vector<double> a(drift.size()), b(drift.size());
  for (std::size_t i = 0; i < drift.size(); ++i) {
    a[i] = drift[i] + noise(rng);
    b[i] = drift[i] + noise(rng);
  }
  const auto unpaired = bootstrap_speedup(a, b, 0.95, 1000, 1, false);
  const auto paired = bootstrap_speedup(a, b, 0.95, 1000, 1, true);
  EXPECT_LT(paired.hi - paired.lo, 0.5 * (unpaired.hi - unpaired.lo));
  EXPECT_LT(paired.lo, 1.0);
  EXPECT_GT(paired.hi, 1.0);
  EXPECT_THROW(bootstrap_speedup(a, std::vector<double>(10, 1.0), 0.95, 1000, 1, true), gpuopt::Error);
}

TEST(Bootstrap, IsDeterministicForASeed) {
  const auto a = lognormal(100, 0.0, 0.1, 31);
  const auto b = lognormal(100, 0.0, 0.1, 32);
  const auto r1 = bootstrap_speedup(a, b, 0.95, 500, 42);
  const auto r2 = bootstrap_speedup(a, b, 0.95, 500, 42);
  EXPECT_EQ(r1.lo, r2.lo);
  EXPECT_EQ(r1.hi, r2.hi);
}

TEST(Bootstrap, RejectsBadArguments) {
  EXPECT_THROW(bootstrap_speedup({}, {1.0}), gpuopt::Error);
  EXPECT_THROW(bootstrap_speedup({1.0}, {1.0}, 0.95, 10), gpuopt::Error);
  EXPECT_THROW(bootstrap_speedup({0.0}, {1.0}), gpuopt::Error);
}

// What a call threw: the kind and the message (a test of the message must see it).
template <typename Fn>
std::string value_error(Fn fn) {
  try {
    fn();
  } catch (const gpuopt::Error& e) {
    EXPECT_EQ(e.kind(), gpuopt::ErrorKind::kValue) << e.what();
    return e.what();
  }
  return "no error";
}

TEST(RelHalfwidth, IsTheFartherBoundOverTheCenter) {
  EXPECT_DOUBLE_EQ(gpuopt::stats::rel_halfwidth(2.0, 1.9, 2.3), 0.15);
  EXPECT_DOUBLE_EQ(gpuopt::stats::rel_halfwidth(2.0, 1.5, 2.1), 0.25);
  EXPECT_EQ(gpuopt::stats::rel_halfwidth(0.0, -1.0, 1.0), std::numeric_limits<double>::infinity());
}

TEST(Summarize, CiRelAndTargetMetMatchADirectComputation) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  int met = 0, missed = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const std::size_t n = 3 + rng() % 400;
    const double sigma = 0.005 + 0.1 * std::uniform_real_distribution<double>()(rng);
    const double target = 0.002 + 0.03 * std::uniform_real_distribution<double>()(rng);
    const auto v = lognormal(n, 0.5, sigma, static_cast<unsigned>(rng()));
    const auto s = summarize(v, 0.95, target);
    const double rel = std::max(s.p50 - s.ci_lo, s.ci_hi - s.p50) / s.p50;
    EXPECT_NEAR(s.ci_rel, rel, 1e-15 * rel) << "n=" << n;
    EXPECT_EQ(s.target_met, s.ci_attained && rel <= target) << "n=" << n << " target " << target;
    EXPECT_EQ(s.target_rel_ci, target);
    (s.target_met ? met : missed) += 1;
  }
  EXPECT_GT(met, 0);  // both outcomes were exercised
  EXPECT_GT(missed, 0);
}

TEST(Summarize, TooFewSamplesNeverMeetTheTarget) {
  const auto s = summarize({1.0, 1.0, 1.0, 1.0}, 0.95, 0.5);  // ci_rel is 0, but unattained
  EXPECT_EQ(s.ci_rel, 0.0);
  EXPECT_FALSE(s.ci_attained);
  EXPECT_FALSE(s.target_met);
}

TEST(Summarize, RejectsATargetOutsideZeroToOne) {
  EXPECT_EQ(value_error([] { summarize({1.0, 2.0}, 0.95, 0.0); }), "target_rel_ci must be in (0, 1), got 0");
  EXPECT_EQ(value_error([] { summarize({1.0, 2.0}, 0.95, 1.0); }), "target_rel_ci must be in (0, 1), got 1");
  EXPECT_EQ(value_error([] { summarize({1.0, 2.0}, 0.95, NAN); }), "target_rel_ci must be in (0, 1), got nan");
}

TEST(Verdict, FasterNeedsTheWholeIntervalAboveOneAndTheMinimumEffect) {
  const double above_one = std::nextafter(1.0, 2.0);
  EXPECT_EQ(judge(Ratio{1.25, above_one, 1.3}, 0.25), Verdict::kFaster);  // exactly 1 + min_effect
  EXPECT_EQ(judge(Ratio{std::nextafter(1.25, 0.0), above_one, 1.3}, 0.25), Verdict::kNoDifference);
  EXPECT_EQ(judge(Ratio{2.0, 1.0, 3.0}, 0.25), Verdict::kNoDifference);  // the interval touches 1
  EXPECT_EQ(judge(Ratio{2.0, above_one, 3.0}, 0.25), Verdict::kFaster);
  EXPECT_EQ(judge(Ratio{above_one, above_one, above_one}, 0.0), Verdict::kFaster);  // no minimum
  EXPECT_EQ(judge(Ratio{1.001, 1.0005, 1.002}), Verdict::kNoDifference);  // tight, but below the default 1%
}

TEST(Verdict, SlowerIsTheMirrorImage) {
  const double below_one = std::nextafter(1.0, 0.0);
  EXPECT_EQ(judge(Ratio{0.8, 0.7, below_one}, 0.25), Verdict::kSlower);  // exactly 1 / (1 + min_effect)
  EXPECT_EQ(judge(Ratio{std::nextafter(0.8, 1.0), 0.7, below_one}, 0.25), Verdict::kNoDifference);
  EXPECT_EQ(judge(Ratio{0.5, 0.4, 1.0}, 0.25), Verdict::kNoDifference);  // the interval touches 1
  EXPECT_EQ(judge(Ratio{below_one, below_one, below_one}, 0.0), Verdict::kSlower);
  EXPECT_EQ(judge(Ratio{0.5, 0.4, 1.2}, 0.25), Verdict::kNoDifference);  // the interval spans 1
}

TEST(Verdict, NamesAndValidation) {
  EXPECT_STREQ(gpuopt::stats::verdict_name(Verdict::kFaster), "faster");
  EXPECT_STREQ(gpuopt::stats::verdict_name(Verdict::kSlower), "slower");
  EXPECT_STREQ(gpuopt::stats::verdict_name(Verdict::kNoDifference), "no significant difference");
  const Ratio r{1.1, 1.05, 1.15};
  EXPECT_EQ(value_error([&] { judge(r, 1.0); }), "min_effect must be in [0, 1), got 1");
  EXPECT_EQ(value_error([&] { judge(r, -0.01); }), "min_effect must be in [0, 1), got -0.01");
  EXPECT_EQ(value_error([&] { judge(r, NAN); }), "min_effect must be in [0, 1), got nan");
}

TEST(CompareSamples, IsTheBootstrapJudgedWithMinEffect) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const auto slow = lognormal(300, std::log(1.06), 0.01, seed);
  const auto fast = lognormal(300, 0.0, 0.01, seed + 1);
  gpuopt::stats::CompareOptions o;
  o.seed = seed;
  const auto c = gpuopt::stats::compare_samples(slow, fast, o);
  const auto r = bootstrap_speedup(slow, fast, o.confidence, o.resamples, o.seed, o.paired, o.q);
  EXPECT_EQ(c.ratio.ratio, r.ratio);
  EXPECT_EQ(c.ratio.lo, r.lo);
  EXPECT_EQ(c.ratio.hi, r.hi);
  EXPECT_GT(r.lo, 1.0);
  EXPECT_EQ(c.verdict, Verdict::kFaster);
  EXPECT_EQ(gpuopt::stats::compare_samples(fast, slow, o).verdict, Verdict::kSlower);
  o.min_effect = 0.2;  // a 6% change, however certain, is below a 20% minimum
  EXPECT_EQ(gpuopt::stats::compare_samples(slow, fast, o).verdict, Verdict::kNoDifference);
  o.min_effect = 1.5;
  EXPECT_EQ(value_error([&] { gpuopt::stats::compare_samples(slow, fast, o); }),
            "min_effect must be in [0, 1), got 1.5");
}

TEST(CompareSamples, IdenticalWorkloadsShowNoDifference) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const auto a = lognormal(400, 0.0, 0.02, seed);
  const auto b = lognormal(400, 0.0, 0.02, seed + 7);
  EXPECT_EQ(gpuopt::stats::compare_samples(a, b).verdict, Verdict::kNoDifference);
}

}  // namespace

namespace {

using gpuopt::stats::rel_halfwidth;

// Level shifts that last whole stretches of samples (clock or power states of a GPU): `runs` runs
// of `len` samples, each at 1 + N(0, level_sd), with small independent noise within a run. Samples
// within a run are not independent, so only the runs tell how well the median is known.
std::vector<double> level_shifts(std::size_t runs, std::size_t len, double level_sd, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> level(0.0, level_sd), noise(0.0, 0.001);
  std::vector<double> v;
  for (std::size_t r = 0; r < runs; ++r) {
    const double l = 1.0 + level(rng);
    for (std::size_t i = 0; i < len; ++i) v.push_back(l + noise(rng));
  }
  return v;
}

// The bootstrap gpuopt had before issue 12 resampled 30 short blocks (or single samples): with
// samples correlated over whole runs, its interval was as narrow as a run's noise.
double per_sample_bootstrap_halfwidth(const std::vector<double>& a, const std::vector<double>& b, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::size_t> ia(0, a.size() - 1), ib(0, b.size() - 1);
  std::vector<double> ra(a.size()), rb(b.size()), ratios;
  for (int k = 0; k < 1000; ++k) {
    for (double& x : ra) x = a[ia(rng)];
    for (double& x : rb) x = b[ib(rng)];
    ratios.push_back(gpuopt::stats::median(ra) / gpuopt::stats::median(rb));
  }
  std::sort(ratios.begin(), ratios.end());
  const double r = gpuopt::stats::median(a) / gpuopt::stats::median(b);
  return rel_halfwidth(r, quantile_sorted(ratios, 0.025), quantile_sorted(ratios, 0.975));
}

TEST(Bootstrap, BatchCorrelatedInputsGiveAnIntervalAsWideAsTheirs) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const auto a = level_shifts(40, 50, 0.05, seed);
  const auto b = level_shifts(40, 50, 0.05, seed + 1);
  const auto sa = summarize(a), sb = summarize(b);
  EXPECT_STREQ(sa.ci_method, "batch-medians");
  const double inputs = std::max(sa.ci_rel, sb.ci_rel);
  const auto r = bootstrap_speedup(a, b, 0.95, 2000, seed);
  const double old_width = per_sample_bootstrap_halfwidth(a, b, seed);
  EXPECT_LT(old_width, 0.7 * inputs) << "the per-sample bootstrap should be too narrow here";
  EXPECT_GE(rel_halfwidth(r.ratio, r.lo, r.hi), inputs);
  // The bootstrap resampled the batches the measurements' intervals used, not 30 short blocks.
  EXPECT_EQ(r.blocks_baseline, sa.ci_batches);
  EXPECT_EQ(r.blocks_candidate, sb.ci_batches);
}

// The guarantee of bootstrap_speedup (unpaired medians): rel_halfwidth(speedup) >= the larger of the
// inputs' ci_rel, for any data; checked on independent, drifting and level-shifted sets of any size.
TEST(Bootstrap, SpeedupIsNeverMoreCertainThanEitherInput) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 60; ++trial) {
    auto make = [&](unsigned s) {
      switch (rng() % 3) {
        case 0: return lognormal(2 + rng() % 500, 0.1 * (rng() % 5), 0.001 + 0.1 * (rng() % 100) / 100.0, s);
        case 1: return drifting(40 + rng() % 800, 0.01 + 0.05 * (rng() % 10) / 10.0, 20 + rng() % 400, s);
        default: return level_shifts(2 + rng() % 12, 5 + rng() % 80, 0.005 + 0.05 * (rng() % 10) / 10.0, s);
      }
    };
    const auto a = make(static_cast<unsigned>(rng())), b = make(static_cast<unsigned>(rng()));
    const auto r = bootstrap_speedup(a, b, 0.95, 200, rng());
    const double inputs = std::max(summarize(a).ci_rel, summarize(b).ci_rel);
    EXPECT_GE(rel_halfwidth(r.ratio, r.lo, r.hi), inputs * (1.0 - 1e-12)) << "n " << a.size() << ", " << b.size();
    EXPECT_LE(r.lo, r.ratio);
    EXPECT_GE(r.hi, r.ratio);
  }
}

TEST(Bootstrap, PairedRatiosKeepTheirOwnIntervalAndShareBlocks) {
  const auto drift = drifting(800, 0.05, 300, 9);
  const auto r = bootstrap_speedup(drift, drift, 0.95, 500, 1, true);
  EXPECT_EQ(r.blocks_baseline, r.blocks_candidate);
  EXPECT_FALSE(r.widened_to_inputs);  // shared drift cancels: the inputs' intervals do not apply
  EXPECT_DOUBLE_EQ(r.lo, 1.0);
  EXPECT_DOUBLE_EQ(r.hi, 1.0);
}

TEST(Summarize, TooFewSamplesReportTheCoverageReached) {
  // [min, max] of n samples covers the median with probability 1 - 2 * 0.5^n.
  const std::vector<std::pair<std::size_t, double>> cases{{1, 0.0}, {2, 0.5}, {3, 0.75}, {4, 0.875}, {5, 0.9375}};
  for (const auto& [n, coverage] : cases) {
    const auto s = summarize(lognormal(n, 0.0, 0.1, 7));
    EXPECT_FALSE(s.ci_attained) << n;
    EXPECT_DOUBLE_EQ(s.ci_level, coverage) << n;
    EXPECT_DOUBLE_EQ(s.ci_requested, 0.95) << n;
    EXPECT_DOUBLE_EQ(s.ci_lo, s.min) << n;
    EXPECT_DOUBLE_EQ(s.ci_hi, s.max) << n;
  }
  const auto six = summarize(lognormal(6, 0.0, 0.1, 7));  // 1 - 2/64 = 0.969 >= 0.95
  EXPECT_TRUE(six.ci_attained);
  EXPECT_DOUBLE_EQ(six.ci_level, 0.95);
  EXPECT_DOUBLE_EQ(summarize(lognormal(5, 0.0, 0.1, 7), 0.9).ci_level, 0.9);  // 0.9375 >= 0.9
}

TEST(Verdict, AnInputWithoutItsIntervalIsNeverSignificant) {
  const std::vector<double> one{1.0}, other(50, 2.0);
  const auto r = bootstrap_speedup(other, one);
  EXPECT_FALSE(r.attained);
  EXPECT_EQ(judge(r, 0.0), Verdict::kNoDifference);
  EXPECT_EQ(gpuopt::stats::compare_samples(other, one).verdict, Verdict::kNoDifference);
  EXPECT_EQ(gpuopt::stats::compare_samples(other, std::vector<double>(6, 1.0)).verdict, Verdict::kFaster);
}

TEST(Verdict, TheRunToRunBandMustBeExceededToo) {
  const Ratio r{1.04, 1.03, 1.05};
  EXPECT_EQ(judge(r, 0.01, 0.0), Verdict::kFaster);
  EXPECT_EQ(judge(r, 0.01, 0.039), Verdict::kFaster);  // 1.04 / 1.039 > 1
  EXPECT_EQ(judge(r, 0.01, 0.04), Verdict::kNoDifference);  // 1.04 / 1.04 touches 1
  const Ratio s{1.0 / 1.04, 1.0 / 1.05, 1.0 / 1.03};
  EXPECT_EQ(judge(s, 0.01, 0.039), Verdict::kSlower);
  EXPECT_EQ(judge(s, 0.01, 0.041), Verdict::kNoDifference);
  const auto i = gpuopt::stats::judged_interval(r, 0.02);  // the CI is wider on the right already
  EXPECT_DOUBLE_EQ(i.lo, 1.04 / 1.02);
  EXPECT_DOUBLE_EQ(i.hi, 1.0608);
  EXPECT_EQ(judge(r, 0.01, 2.0), Verdict::kNoDifference);  // a band over 100%: nothing is significant
  EXPECT_EQ(value_error([&] { judge(r, 0.01, INFINITY); }), "noise_floor_rel must be a finite fraction >= 0, got inf");
  EXPECT_EQ(value_error([&] { judge(r, 0.01, -0.1); }), "noise_floor_rel must be a finite fraction >= 0, got -0.1");
}

TEST(CompareSamples, CrossRunNoiseFloorWidensOnlyTheVerdictInterval) {
  const auto slow = lognormal(300, std::log(1.03), 0.005, 3);
  const auto fast = lognormal(300, 0.0, 0.005, 4);
  gpuopt::stats::CompareOptions o;
  const auto plain = gpuopt::stats::compare_samples(slow, fast, o);
  EXPECT_EQ(plain.verdict, Verdict::kFaster);
  EXPECT_EQ(plain.judged.lo, plain.ratio.lo);
  o.noise_floor_rel = 0.05;
  const auto cross = gpuopt::stats::compare_samples(slow, fast, o);
  EXPECT_EQ(cross.verdict, Verdict::kNoDifference);
  EXPECT_EQ(cross.ratio.lo, plain.ratio.lo);  // the statistical interval is unchanged
  EXPECT_DOUBLE_EQ(cross.judged.lo, cross.ratio.ratio / 1.05);
}

TEST(RunToRun, PoolsLogVarianceOverWorkloads) {
  // One workload, 3 rounds: sd of logs by hand, t(0.975, 2) = 4.302653 (scipy.stats.t.ppf).
  const std::vector<double> m{1.0, 1.02, 0.99};
  const double l0 = std::log(1.0), l1 = std::log(1.02), l2 = std::log(0.99);
  const double mean = (l0 + l1 + l2) / 3.0;
  const double sd = std::sqrt(((l0 - mean) * (l0 - mean) + (l1 - mean) * (l1 - mean) + (l2 - mean) * (l2 - mean)) / 2.0);
  const auto r = gpuopt::stats::run_to_run_spread({m});
  EXPECT_NEAR(r.sd_log, sd, 1e-15);
  EXPECT_NEAR(r.rel, std::expm1(4.302653 * sd * std::sqrt(2.0)), 1e-6);
  EXPECT_EQ(r.df, 2u);
  EXPECT_EQ(r.rounds, 3u);
  // Pooled: two workloads whose scales differ by 1000x contribute only their relative spread.
  std::vector<double> big(m);
  for (double& x : big) x *= 1000.0;
  const auto p = gpuopt::stats::run_to_run_spread({m, big, {5.0, 5.0}});
  EXPECT_NEAR(p.sd_log, std::sqrt(2.0 * sd * sd * 2.0 / 5.0), 1e-12);  // (ss + ss + 0) / (2 + 2 + 1)
  EXPECT_EQ(p.df, 5u);
  EXPECT_EQ(p.rounds, 2u);
  EXPECT_EQ(p.workloads, 3u);
  EXPECT_EQ(value_error([] { gpuopt::stats::run_to_run_spread({{1.0, 1.1}}); }),
            "a run-to-run calibration needs at least 3 rounds in all (2 degrees of freedom), got 2");
  EXPECT_EQ(value_error([] { gpuopt::stats::run_to_run_spread({{1.0}}); }),
            "each workload needs the medians of at least 2 rounds, got 1");
  EXPECT_EQ(value_error([] { gpuopt::stats::run_to_run_spread({{1.0, 0.0, 1.0}}); }),
            "round medians must be finite and > 0, got 0");
}

TEST(Exceedance, CountsEpisodesAndTheirBinomialTail) {
  std::vector<double> s(40, 1.0);
  s[5] = s[6] = s[7] = 20.0;  // one burst of three calls
  s[30] = 20.0;               // and a lone stall
  const auto e = gpuopt::stats::exceedance(s, 5.0, 0.01);
  EXPECT_EQ(e.n, 40u);
  EXPECT_EQ(e.over, 4u);
  EXPECT_EQ(e.episodes, 2u);
  // P[B >= 2], B ~ Binomial(40, 0.01) = 1 - 0.99^40 - 40 * 0.01 * 0.99^39
  EXPECT_NEAR(e.p_value, 1.0 - std::pow(0.99, 40) - 40 * 0.01 * std::pow(0.99, 39), 1e-12);
  EXPECT_EQ(gpuopt::stats::exceedance(std::vector<double>(10, 1.0), 5.0, 0.01).p_value, 1.0);  // none over
  std::vector<double> all(300, 9.0);
  const auto a = gpuopt::stats::exceedance(all, 5.0, 0.01);
  EXPECT_EQ(a.episodes, 1u);  // one long episode is one event
  EXPECT_NEAR(a.p_value, 1.0 - std::pow(0.99, 300), 1e-12);
  std::vector<double> alt(200, 1.0);
  for (std::size_t i = 0; i < alt.size(); i += 20) alt[i] = 9.0;  // 10 separate stalls in 200: not a 1% tail
  EXPECT_LT(gpuopt::stats::exceedance(alt, 5.0, 0.01).p_value, 1e-3);
  EXPECT_EQ(value_error([] { gpuopt::stats::exceedance({1.0}, 5.0, 1.0); }), "tail_share must be in (0, 1), got 1");
  EXPECT_EQ(value_error([] { gpuopt::stats::exceedance({}, 5.0, 0.01); }),
            "samples must hold at least one sample, got none");
}

TEST(Quantiles, StudentTIsExactForOneAndTwoDegrees) {
  EXPECT_NEAR(gpuopt::stats::student_t_quantile(0.975, 1), 12.706205, 1e-5);
  EXPECT_NEAR(gpuopt::stats::student_t_quantile(0.975, 2), 4.302653, 1e-6);
  EXPECT_NEAR(gpuopt::stats::student_t_quantile(0.975, 3), 3.182446, 5e-3);
}

}  // namespace
