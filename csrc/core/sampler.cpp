#include "gpuopt/sampler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <thread>

#include "gpuopt/errors.h"
#include "gpuopt/stats.h"

namespace gpuopt {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

bool ci_within_target(const std::vector<double>& samples, const SamplerOptions& o) {
  return stats::meets_target(stats::median_ci(samples, o.confidence), o.target_rel_ci);
}

// Polls the meter until its value differs from `from` (at most kEnergyEdgeWaitS, every 0.5 ms, calling
// `between` before each poll: nothing, or one more sample). Returns the new value, or empty when it
// did not step in time or a read failed (`failed` then says so).
template <typename Between>
std::optional<double> next_step(EnergyMeter& meter, double from, Between&& between, bool* failed) {
  const Clock::time_point t0 = Clock::now();
  while (seconds_since(t0) < kEnergyEdgeWaitS) {
    between();
    const std::optional<double> v = meter.read_j();
    if (!v) {
      *failed = true;
      return std::nullopt;
    }
    if (*v != from) return v;
  }
  return std::nullopt;
}

// Calls source.finish() on every way out of run_sampler.
struct FinishGuard {
  SampleSource& source;
  ~FinishGuard() { source.finish(); }
};

}  // namespace

void validate(const SamplerOptions& o) {
  GPUOPT_CHECK_VALUE(o.warmup_iters >= 0, "warmup must be >= 0 calls, got ", o.warmup_iters);
  GPUOPT_CHECK_VALUE(std::isfinite(o.warmup_s) && o.warmup_s >= 0.0,
                     "warmup_s must be a finite number of seconds >= 0, got ", o.warmup_s);
  GPUOPT_CHECK_VALUE(o.warmup_max_iters >= o.warmup_iters, "warmup_max_iters must be >= warmup (",
                     o.warmup_iters, "), got ", o.warmup_max_iters);
  GPUOPT_CHECK_VALUE(o.iters >= 0, "iters must be a positive count (or None for adaptive), got ",
                     o.iters);
  GPUOPT_CHECK_VALUE(o.min_iters >= 1, "min_iters must be >= 1, got ", o.min_iters);
  GPUOPT_CHECK_VALUE(o.max_iters >= o.min_iters, "max_iters must be >= min_iters (", o.min_iters,
                     "), got ", o.max_iters);
  GPUOPT_CHECK_VALUE(std::isfinite(o.max_time_s) && o.max_time_s > 0.0,
                     "max_time_s must be a finite number of seconds > 0, got ", o.max_time_s);
  GPUOPT_CHECK_VALUE(std::isfinite(o.min_time_s) && o.min_time_s >= 0.0 && o.min_time_s <= o.max_time_s,
                     "min_time_s must be in [0, max_time_s=", o.max_time_s, "] seconds, got ", o.min_time_s);
  GPUOPT_CHECK_VALUE(o.target_rel_ci > 0.0 && o.target_rel_ci < 1.0,
                     "target_rel_ci must be in (0, 1), got ", o.target_rel_ci);
  GPUOPT_CHECK_VALUE(o.confidence > 0.0 && o.confidence < 1.0, "confidence must be in (0, 1), got ",
                     o.confidence);
}

SamplerResult run_sampler(SampleSource& source, const SamplerOptions& o, EnergyMeter* meter, double min_energy_s) {
  validate(o);
  GPUOPT_CHECK_VALUE(std::isfinite(min_energy_s) && min_energy_s >= 0.0,
                     "min_energy_s must be a finite number of seconds >= 0, got ", min_energy_s);
  FinishGuard guard{source};
  SamplerResult res;

  const Clock::time_point warm0 = Clock::now();
  while (res.warmup_iters < o.warmup_max_iters &&
         (res.warmup_iters < o.warmup_iters || seconds_since(warm0) < o.warmup_s)) {
    source.warmup();
    ++res.warmup_iters;
  }
  res.warmup_s = seconds_since(warm0);
  source.calibrate();

  const bool fixed = o.iters > 0;
  const std::size_t cap = static_cast<std::size_t>(fixed ? o.iters : o.max_iters);
  res.ms.reserve(std::min<std::size_t>(cap, 1 << 16));
  res.enqueue_ms.reserve(res.ms.capacity());
  std::size_t next_check = static_cast<std::size_t>(o.min_iters);

  // The energy window's start: the counter's next step (the device is idle here, after warm-up).
  std::optional<double> e0;
  bool start_aligned = false, read_failed = false;
  if (meter != nullptr) {
    e0 = meter->read_j();
    if (!e0) {
      read_failed = true;
    } else {
      const std::optional<double> step = next_step(*meter, *e0, [] { std::this_thread::sleep_for(std::chrono::microseconds(500)); }, &read_failed);
      if (step) {
        e0 = step;
        start_aligned = true;
      }
    }
  }
  const bool energy_on = meter != nullptr && e0.has_value();
  const double min_time_s = energy_on && !fixed ? std::min(o.max_time_s, std::max(o.min_time_s, min_energy_s)) : o.min_time_s;

  const Clock::time_point t0 = Clock::now();
  for (;;) {
    const Sample s = source.sample();
    res.ms.push_back(s.ms);
    res.enqueue_ms.push_back(s.enqueue_ms);
    const std::size_t n = res.ms.size();
    if (fixed) {
      if (n >= cap) {
        res.stop_reason = "iters";
        break;
      }
      continue;
    }
    if (n >= next_check && seconds_since(t0) >= min_time_s) {
      if (ci_within_target(res.ms, o)) {
        res.stop_reason = "target";
        res.target_met = true;
        break;
      }
      // Check again after ~12% more samples: O(n log n) in total, however long the run.
      next_check = n + std::max<std::size_t>(1, n / 8);
    }
    if (n >= cap) {
      res.stop_reason = "max_iters";
      break;
    }
    if (seconds_since(t0) >= o.max_time_s) {
      res.stop_reason = "max_time";
      break;
    }
  }
  if (meter != nullptr) {
    EnergyReading e;
    if (!energy_on) {
      e.reason = "the energy counter could not be read";
    } else {
      // The end: an adaptive run samples on until the counter steps; a fixed one stops where it is.
      std::optional<double> e1 = meter->read_j();
      bool end_aligned = false;
      if (e1 && !fixed && start_aligned) {
        const std::optional<double> step = next_step(*meter, *e1, [&] {
          const Sample s = source.sample();
          res.ms.push_back(s.ms);
          res.enqueue_ms.push_back(s.enqueue_ms);
        }, &read_failed);
        if (step) {
          e1 = step;
          end_aligned = true;
        }
      }
      e.window_s = seconds_since(t0);
      e.aligned = start_aligned && end_aligned;
      if (!e1 || read_failed) {
        e.reason = "the energy counter could not be read at the end of the timed region";
      } else if (*e1 <= *e0) {
        e.reason = "the energy counter did not advance over the timed region (" + std::to_string(e.window_s) +
                   " s): no energy is reported rather than 0 J";
      } else {
        e.joules = *e1 - *e0;
        if (!e.aligned) {
          e.reason = fixed ? "a fixed number of samples: the window's end is not aligned to a step of the counter"
                           : "the counter did not step within " + std::to_string(kEnergyEdgeWaitS) +
                                 " s at an end of the window: up to one step of error";
        }
      }
    }
    res.energy = e;
  }
  res.sampling_s = seconds_since(t0);
  if (res.stop_reason != "target") res.target_met = ci_within_target(res.ms, o);
  return res;
}

}  // namespace gpuopt
