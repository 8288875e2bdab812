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
      "median (ci_rel) and whether it meets target_rel_ci (target_met: measure()'s stopping rule).");

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
         int resamples, std::uint64_t seed, bool paired, double q, double min_effect) {
        stats::CompareOptions o;
        o.confidence = confidence;
        o.resamples = resamples;
        o.seed = seed;
        o.paired = paired;
        o.q = q;
        o.min_effect = min_effect;
        stats::Comparison c;
        {
          py::gil_scoped_release nogil;
          c = stats::compare_samples(baseline, candidate, o);
        }
        py::dict d;
        d["ratio"] = c.ratio.ratio;
        d["lo"] = c.ratio.lo;
        d["hi"] = c.ratio.hi;
        d["verdict"] = stats::verdict_name(c.verdict);
        return d;
      },
      py::arg("baseline"), py::arg("candidate"), py::kw_only(),
      py::arg("confidence") = stats::kDefaultConfidence,
      py::arg("resamples") = stats::kDefaultResamples, py::arg("seed") = stats::kDefaultSeed,
      py::arg("paired") = false, py::arg("q") = 0.5, py::arg("min_effect") = stats::kDefaultMinEffect,
      "gpuopt's one verdict: the speedup quantile_q(baseline) / quantile_q(candidate) with its "
      "block-bootstrap CI (as bootstrap_speedup), judged 'faster' (CI above 1 and speedup >= "
      "1 + min_effect), 'slower' (CI below 1 and speedup <= 1 / (1 + min_effect)) or 'no significant "
      "difference'. Returns {ratio, lo, hi, verdict}.");
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
        return d;
      },
      "compare_samples()'s defaults, defined once in C++ (compare() states the same).");
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
