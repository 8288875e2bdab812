#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gpuopt/errors.h"
#include "gpuopt/stats.h"

namespace {

using gpuopt::stats::bootstrap_speedup;
using gpuopt::stats::median_ci_ranks;
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

}  // namespace
