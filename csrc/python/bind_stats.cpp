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
  return d;
}

}  // namespace

void bind_stats(py::module_& m) {
  m.def(
      "summarize",
      [](const std::vector<double>& samples, double confidence) {
        stats::Summary s;
        {
          py::gil_scoped_release nogil;
          s = stats::summarize(samples, confidence);
        }
        return summary_to_dict(s);
      },
      py::arg("samples"), py::arg("confidence") = 0.95,
      "Order statistics, moments, MAD outliers and the distribution-free CI of the median.");

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
      py::arg("baseline"), py::arg("candidate"), py::arg("confidence") = 0.95,
      py::arg("resamples") = 2000, py::arg("seed") = 0x6770756f707431ULL, py::arg("paired") = false,
      py::arg("q") = 0.5,
      py::call_guard<py::gil_scoped_release>(),
      "quantile_q(baseline) / quantile_q(candidate) (q=0.5: medians) with a percentile block-bootstrap "
      "confidence interval (paired: interleaved samples resampled with the same blocks).");
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
