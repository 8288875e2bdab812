#include <pybind11/stl.h>

#include <algorithm>
#include <tuple>

#include "bindings.h"
#include "gpuopt/stats.h"

namespace gpuopt::python {

namespace {

py::dict summary_to_dict(const stats::Summary& s) {
  py::dict d;
  d["n"] = s.n;
  d["mean"] = s.mean;
  d["std"] = s.stddev;
  d["min"] = s.min;
  d["max"] = s.max;
  d["p25"] = s.p25;
  d["p50"] = s.p50;
  d["p75"] = s.p75;
  d["p90"] = s.p90;
  d["p95"] = s.p95;
  d["p99"] = s.p99;
  d["iqr"] = s.iqr;
  d["cv"] = s.cv;
  d["mad"] = s.mad;
  d["ci_lo"] = s.ci_lo;
  d["ci_hi"] = s.ci_hi;
  d["ci_level"] = s.ci_level;
  d["ci_requested"] = s.ci_requested;
  d["ci_coverage"] = s.ci_coverage;
  d["ci_attained"] = s.ci_attained;
  d["ci_method"] = s.ci_method;
  d["ci_batches"] = s.ci_batches;
  d["outliers"] = s.outliers;
  d["ci_rel"] = s.ci_rel;
  d["target_rel_ci"] = s.target_rel_ci;
  d["target_met"] = s.target_met;
  return d;
}

}  // namespace

void bind_stats(py::module_& m) {
  m.def(
      "summarize",
      [](const std::vector<double>& samples, double confidence, double target_rel_ci) {
        stats::Summary s;
        {
          py::gil_scoped_release nogil;
          s = stats::summarize(samples, confidence, target_rel_ci);
        }
        return summary_to_dict(s);
      },
      py::arg("samples"), py::arg("confidence") = stats::kDefaultConfidence,
      py::arg("target_rel_ci") = stats::kDefaultTargetRelCi,
      "Order statistics, moments, MAD outliers, the CI of the median, its half-width relative to the "
      "median (ci_rel) and whether it meets target_rel_ci (target_met: measure()'s stopping rule). "
      "ci_level is the level the interval has: ci_requested when attained, else the exact coverage "
      "that [min, max] of too few samples reaches (0 for one sample).");

  m.def(
      "median_ci_ranks",
      [](std::size_t n, double confidence) {
        const stats::MedianRanks r = stats::median_ci_ranks(n, confidence);
        return py::make_tuple(r.lo, r.hi, r.coverage, r.attained);
      },
      py::arg("n"), py::arg("confidence") = 0.95,
      "0-based ranks (lo, hi) of the order statistics bounding the median's CI, their exact "
      "coverage, and whether the requested confidence was attained.");

  m.def(
      "quantile",
      [](std::vector<double> data, double q) {
        std::sort(data.begin(), data.end());
        return stats::quantile_sorted(data, q);
      },
      py::arg("data"), py::arg("q"), "Linear-interpolation quantile (numpy's default method).");

  m.def(
      "bootstrap_speedup",
      [](const std::vector<double>& baseline, const std::vector<double>& candidate, double confidence,
         int resamples, std::uint64_t seed, bool paired, double q) {
        const stats::Ratio r = stats::bootstrap_speedup(baseline, candidate, confidence, resamples, seed, paired, q);
        return std::make_tuple(r.ratio, r.lo, r.hi);  // converted after the GIL is back
      },
      py::arg("baseline"), py::arg("candidate"), py::arg("confidence") = stats::kDefaultConfidence,
      py::arg("resamples") = stats::kDefaultResamples, py::arg("seed") = stats::kDefaultSeed,
      py::arg("paired") = false, py::arg("q") = 0.5,
      py::call_guard<py::gil_scoped_release>(),
      "quantile_q(baseline) / quantile_q(candidate) (q=0.5: medians) with a percentile block-bootstrap "
      "confidence interval (paired: interleaved samples resampled with the same blocks).");

  m.def(
      "compare_samples",
      [](const std::vector<double>& baseline, const std::vector<double>& candidate, double confidence,
         int resamples, std::uint64_t seed, bool paired, double q, double min_effect, double noise_floor_rel) {
        stats::CompareOptions o;
        o.confidence = confidence;
        o.resamples = resamples;
        o.seed = seed;
        o.paired = paired;
        o.q = q;
        o.min_effect = min_effect;
        o.noise_floor_rel = noise_floor_rel;
        stats::Comparison c;
        {
          py::gil_scoped_release nogil;
          c = stats::compare_samples(baseline, candidate, o);
        }
        py::dict d;
        d["ratio"] = c.ratio.ratio;
        d["lo"] = c.ratio.lo;
        d["hi"] = c.ratio.hi;
        d["judged_lo"] = c.judged.lo;
        d["judged_hi"] = c.judged.hi;
        d["attained"] = c.ratio.attained;
        d["widened_to_inputs"] = c.ratio.widened_to_inputs;
        d["blocks"] = py::make_tuple(c.ratio.blocks_baseline, c.ratio.blocks_candidate);
        d["noise_floor_rel"] = o.noise_floor_rel;
        d["verdict"] = stats::verdict_name(c.verdict);
        return d;
      },
      py::arg("baseline"), py::arg("candidate"), py::kw_only(),
      py::arg("confidence") = stats::kDefaultConfidence,
      py::arg("resamples") = stats::kDefaultResamples, py::arg("seed") = stats::kDefaultSeed,
      py::arg("paired") = false, py::arg("q") = 0.5, py::arg("min_effect") = stats::kDefaultMinEffect,
      py::arg("noise_floor_rel") = 0.0,
      "gpuopt's one verdict: the speedup quantile_q(baseline) / quantile_q(candidate) with its "
      "block-bootstrap CI (lo, hi; as bootstrap_speedup: batches of each measurement's own interval, "
      "and unpaired never narrower than the inputs' intervals), judged on that CI widened to the "
      "run-to-run band noise_floor_rel (judged_lo, judged_hi; cross-run comparisons): 'faster' (above 1 "
      "and speedup >= 1 + min_effect), 'slower' (below 1 and speedup <= 1 / (1 + min_effect)) or 'no "
      "significant difference' (also whenever an input's interval did not attain `confidence`: "
      "attained False).");
  m.def(
      "run_to_run_spread",
      [](const std::vector<std::vector<double>>& round_medians, double confidence) {
        const stats::RunToRun r = stats::run_to_run_spread(round_medians, confidence);
        py::dict d;
        d["rel"] = r.rel;
        d["sd_log"] = r.sd_log;
        d["rounds"] = r.rounds;
        d["workloads"] = r.workloads;
        d["df"] = r.df;
        d["confidence"] = r.confidence;
        return d;
      },
      py::arg("round_medians"), py::arg("confidence") = stats::kDefaultConfidence,
      "Run-to-run band of an A/A calibration: round_medians[w] are workload w's medians from separate "
      "rounds; the pooled sd of their logs gives rel, the band the ratio of two separate runs stays "
      "within at `confidence` (exp(t * sd * sqrt 2) - 1).");
  m.def("rel_halfwidth", &stats::rel_halfwidth, py::arg("center"), py::arg("lo"), py::arg("hi"),
        "Largest distance of a bound of [lo, hi] from center, relative to it (inf unless center > 0): "
        "summarize()'s ci_rel.");

  m.def(
      "compare_defaults",
      [] {
        const stats::CompareOptions o;
        py::dict d;
        d["confidence"] = o.confidence;
        d["resamples"] = o.resamples;
        d["seed"] = o.seed;
        d["min_effect"] = o.min_effect;
        d["run_to_run_rel_gpu"] = stats::kDefaultRunToRunRelGpu;
        d["run_to_run_rel_host"] = stats::kDefaultRunToRunRelHost;
        return d;
      },
      "compare_samples()'s defaults, defined once in C++ (compare() states the same).");
  m.def(
      "exceedance",
      [](const std::vector<double>& samples, double threshold, double tail_share) {
        const stats::Exceedance e = stats::exceedance(samples, threshold, tail_share);
        py::dict d;
        d["n"] = e.n;
        d["over"] = e.over;
        d["episodes"] = e.episodes;
        d["p_value"] = e.p_value;
        return d;
      },
      py::arg("samples"), py::arg("threshold"), py::arg("tail_share"),
      "Samples (in order) over `threshold`: calls, episodes (runs of consecutive calls) and P[B >= episodes] "
      "for B ~ Binomial(n, tail_share) -- whether a tail of that share explains them.");
  m.def("batch_count", &stats::batch_count, py::arg("n"));
  m.def(
      "batch_median_ci",
      [](const std::vector<double>& samples, double confidence, std::size_t batches) {
        const stats::Interval i = stats::batch_median_ci(samples, confidence, batches);
        return std::make_tuple(i.lo, i.hi);
      },
      py::arg("samples"), py::arg("confidence"), py::arg("batches"));
  m.def("student_t_quantile", &stats::student_t_quantile, py::arg("p"), py::arg("df"));
}

}  // namespace gpuopt::python
