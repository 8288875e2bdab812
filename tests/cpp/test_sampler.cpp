#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <optional>
#include <string>
#include <random>
#include <stdexcept>
#include <thread>

#include "gpuopt/errors.h"
#include "gpuopt/sampler.h"

namespace {

using gpuopt::Sample;
using gpuopt::SamplerOptions;

// Samples drawn from a normal distribution around 1 ms with a given relative spread.
class FakeSource : public gpuopt::SampleSource {
 public:
  explicit FakeSource(double rel_sd, unsigned seed = 1) : rng_(seed), dist_(1.0, rel_sd) {}
  double warmup() override {
    ++warmups;
    return 0.0;
  }
  void calibrate() override { ++calibrations; }
  Sample sample() override {
    ++samples;
    if (throw_at > 0 && samples == throw_at) throw std::runtime_error("boom from fn");
    if (sleep_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    return {std::max(1e-6, dist_(rng_)), 0.25};
  }
  void finish() noexcept override { ++finishes; }

  int warmups = 0, calibrations = 0, finishes = 0;
  long samples = 0;
  long throw_at = 0;
  int sleep_us = 0;

 private:
  std::mt19937_64 rng_;
  std::normal_distribution<double> dist_;
};

TEST(Sampler, StopsWhenTheMedianIsPreciseEnough) {
  FakeSource src(0.02);
  SamplerOptions o;
  o.warmup_s = 0;
  o.min_time_s = 0;
  o.target_rel_ci = 0.01;
  const auto r = gpuopt::run_sampler(src, o);
  EXPECT_EQ(r.stop_reason, "target");
  EXPECT_TRUE(r.target_met);
  // CI half-width ~ 1.96 * 1.2533 * sd / sqrt(n) <= 1% of the median needs n of roughly 24..60.
  EXPECT_GE(r.ms.size(), 10u);
  EXPECT_LE(r.ms.size(), 200u);
  EXPECT_EQ(r.ms.size(), r.enqueue_ms.size());
  EXPECT_EQ(src.warmups, 3);
  EXPECT_EQ(src.calibrations, 1);
  EXPECT_EQ(src.finishes, 1);
}

TEST(Sampler, MinTimeKeepsSamplingPastAnEarlyTarget) {
  FakeSource src(0.001);
  src.sleep_us = 200;
  SamplerOptions o;
  o.warmup_s = 0;
  o.min_time_s = 0.05;
  const auto r = gpuopt::run_sampler(src, o);
  EXPECT_EQ(r.stop_reason, "target");
  EXPECT_GE(r.sampling_s, 0.05);
  EXPECT_GT(r.ms.size(), 20u);
}

TEST(Sampler, FixedItersTakesExactlyThatMany) {
  FakeSource src(0.5);
  SamplerOptions o;
  o.warmup_s = 0;
  o.iters = 37;
  const auto r = gpuopt::run_sampler(src, o);
  EXPECT_EQ(r.ms.size(), 37u);
  EXPECT_EQ(r.stop_reason, "iters");
}

TEST(Sampler, NoisySamplesHitMaxIters) {
  FakeSource src(0.5);
  SamplerOptions o;
  o.warmup_s = 0;
  o.target_rel_ci = 0.001;
  o.max_iters = 500;
  const auto r = gpuopt::run_sampler(src, o);
  EXPECT_EQ(r.stop_reason, "max_iters");
  EXPECT_FALSE(r.target_met);
  EXPECT_EQ(r.ms.size(), 500u);
}

TEST(Sampler, TimeBudgetStopsSampling) {
  FakeSource src(0.5);
  src.sleep_us = 1000;
  SamplerOptions o;
  o.warmup_s = 0;
  o.target_rel_ci = 0.001;
  o.min_time_s = 0;
  o.max_time_s = 0.05;
  const auto r = gpuopt::run_sampler(src, o);
  EXPECT_EQ(r.stop_reason, "max_time");
  EXPECT_GE(r.sampling_s, 0.05);
  EXPECT_LT(r.ms.size(), 60u);
}

TEST(Sampler, WarmupByTimeRunsAtLeastThatLong) {
  FakeSource src(0.01);
  SamplerOptions o;
  o.warmup_iters = 1;
  o.warmup_s = 0.02;
  o.iters = 1;
  auto slow = [&] {
    struct Slow : FakeSource {
      using FakeSource::FakeSource;
      double warmup() override {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        return FakeSource::warmup();
      }
    } s(0.01);
    return gpuopt::run_sampler(s, o);
  };
  const auto r = slow();
  EXPECT_GE(r.warmup_s, 0.02);
  EXPECT_GE(r.warmup_iters, 5);
}

TEST(Sampler, ExceptionFromTheCallPropagatesAndFinishes) {
  FakeSource src(0.1);
  src.throw_at = 5;
  SamplerOptions o;
  o.warmup_s = 0;
  EXPECT_THROW(gpuopt::run_sampler(src, o), std::runtime_error);
  EXPECT_EQ(src.finishes, 1);
}

TEST(Sampler, ValidatesOptionsWithNamedMessages) {
  auto message_for = [](SamplerOptions o) -> std::string {
    try {
      gpuopt::validate(o);
    } catch (const gpuopt::Error& e) {
      EXPECT_EQ(e.kind(), gpuopt::ErrorKind::kValue);
      return e.what();
    }
    return "";
  };
  SamplerOptions o;
  o.iters = -1;
  EXPECT_NE(message_for(o).find("iters"), std::string::npos);
  o = {};
  o.target_rel_ci = 1.5;
  EXPECT_NE(message_for(o).find("target_rel_ci must be in (0, 1), got 1.5"), std::string::npos);
  o = {};
  o.max_time_s = -2;
  EXPECT_NE(message_for(o).find("max_time_s"), std::string::npos);
  o = {};
  o.warmup_s = NAN;
  EXPECT_NE(message_for(o).find("warmup_s"), std::string::npos);
  o = {};
  o.min_time_s = 20.0;  // above max_time_s
  EXPECT_NE(message_for(o).find("min_time_s must be in [0, max_time_s=10]"), std::string::npos);
  o = {};
  o.min_iters = 0;
  EXPECT_NE(message_for(o).find("min_iters"), std::string::npos);
  EXPECT_EQ(message_for(SamplerOptions{}), "");
}

}  // namespace

namespace {

// A counter of constant power that steps every `period_s` (as NVML's energy counter does): it reads
// the energy of the last completed step.
class SteppedMeter : public gpuopt::EnergyMeter {
 public:
  SteppedMeter(double watts, double period_s) : watts_(watts), period_s_(period_s), t0_(Clock::now()) {}
  std::optional<double> read_j() override {
    ++reads;
    if (fail_after > 0 && reads > fail_after) return std::nullopt;
    const double t = std::chrono::duration<double>(Clock::now() - t0_).count();
    if (stuck) return 1000.0;
    return 1000.0 + watts_ * period_s_ * std::floor(t / period_s_);
  }
  long reads = 0;
  long fail_after = 0;
  bool stuck = false;

 private:
  using Clock = std::chrono::steady_clock;
  double watts_, period_s_;
  Clock::time_point t0_;
};

SamplerOptions quick() {
  SamplerOptions o;
  o.warmup_s = 0;
  o.min_time_s = 0;
  o.target_rel_ci = 0.2;  // the target alone would stop at once
  return o;
}

}  // namespace

TEST(SamplerEnergy, TheWindowSpansWholeStepsAndTheMinimumWindow) {
  FakeSource src(0.01);
  src.sleep_us = 200;
  SteppedMeter meter(300.0, 0.02);  // 300 W, a step every 20 ms
  const auto r = gpuopt::run_sampler(src, quick(), &meter, 0.4);
  ASSERT_TRUE(r.energy);
  ASSERT_TRUE(r.energy->joules) << r.energy->reason;
  EXPECT_TRUE(r.energy->aligned) << r.energy->reason;
  EXPECT_GE(r.energy->window_s, 0.4);  // sampled at least the minimum energy window
  EXPECT_GE(r.sampling_s, 0.4);
  // Whole steps of 6 J, and joules / window = 300 W up to the few milliseconds between a step and the
  // poll that sees it (an end not aligned to a step would be off by up to 6 J / 0.4 s = 15 W).
  const double steps = *r.energy->joules / 6.0;
  EXPECT_NEAR(steps, std::round(steps), 1e-9);
  EXPECT_NEAR(*r.energy->joules / r.energy->window_s, 300.0, 300.0 * 0.005 / r.energy->window_s + 1.0);
  EXPECT_EQ(r.ms.size(), r.enqueue_ms.size());
}

TEST(SamplerEnergy, NoMeterNoEnergyAndAFixedRunIsNotExtended) {
  FakeSource a(0.01);
  EXPECT_FALSE(gpuopt::run_sampler(a, quick()).energy);
  FakeSource b(0.01);
  b.sleep_us = 200;
  SteppedMeter meter(100.0, 0.01);
  SamplerOptions o = quick();
  o.iters = 50;
  const auto r = gpuopt::run_sampler(b, o, &meter, 5.0);  // the minimum window does not apply to iters
  EXPECT_EQ(r.ms.size(), 50u);
  ASSERT_TRUE(r.energy);
  EXPECT_FALSE(r.energy->aligned);
  EXPECT_NE(r.energy->reason.find("fixed number of samples"), std::string::npos) << r.energy->reason;
}

TEST(SamplerEnergy, AStuckOrFailingCounterGivesNoJoulesNeverZero) {
  FakeSource a(0.01);
  a.sleep_us = 200;
  SteppedMeter stuck(100.0, 0.01);
  stuck.stuck = true;
  auto r = gpuopt::run_sampler(a, quick(), &stuck, 0.3);
  ASSERT_TRUE(r.energy);
  EXPECT_FALSE(r.energy->joules);
  EXPECT_NE(r.energy->reason.find("did not advance"), std::string::npos) << r.energy->reason;
  FakeSource b(0.01);
  SteppedMeter failing(100.0, 0.01);
  failing.fail_after = 1;  // the first read works, every later one fails
  r = gpuopt::run_sampler(b, quick(), &failing, 0.05);
  ASSERT_TRUE(r.energy);
  EXPECT_FALSE(r.energy->joules);
  EXPECT_NE(r.energy->reason.find("could not be read"), std::string::npos) << r.energy->reason;
  FakeSource c(0.01);
  EXPECT_THROW(gpuopt::run_sampler(c, quick(), &failing, -1.0), gpuopt::Error);
}
