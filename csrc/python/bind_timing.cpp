#include <pybind11/stl.h>
#include <torch/csrc/jit/api/module.h>

#include <optional>
#include <utility>
#include <vector>

#include "../torch/graphs.h"
#include "../torch/timing.h"
#include "bindings.h"
#include "measure_options.h"

namespace gpuopt::python {

torch_ext::MeasureOptions to_options(const PyOptions& p) {
  TORCH_CHECK_VALUE(!p.iters || *p.iters > 0, "iters must be a positive count (or None to stop "
                    "adaptively), got ", p.iters.value_or(0));
  TORCH_CHECK_VALUE(!p.calls_per_sample || *p.calls_per_sample > 0,
                    "calls_per_sample must be >= 1 (or None for automatic), got ",
                    p.calls_per_sample.value_or(0));
  torch_ext::MeasureOptions o;
  o.mode = p.mode;
  o.sampler.warmup_iters = p.warmup;
  o.sampler.warmup_s = p.warmup_s;
  o.sampler.warmup_max_iters = std::max(SamplerOptions{}.warmup_max_iters, p.warmup);
  o.sampler.iters = p.iters.value_or(0);
  o.sampler.min_iters = p.min_iters;
  o.sampler.max_iters = p.max_iters;
  o.sampler.min_time_s = p.min_time_s;
  o.sampler.max_time_s = p.max_time_s;
  o.sampler.target_rel_ci = p.target_rel_ci;
  o.sampler.confidence = p.confidence;
  o.flush_l2 = p.flush_l2;
  o.device = p.device;
  o.calls_per_sample = p.calls_per_sample.value_or(0);
  o.block_target_ms = p.block_target_ms;
  o.energy = p.energy;
  o.min_energy_s = p.min_energy_s;
  return o;
}

py::dict to_dict(const torch_ext::MeasureResult& r) {
  py::dict d;
  d["samples_ms"] = r.sampler.ms;
  d["enqueue_ms"] = r.sampler.enqueue_ms;
  d["warmup_iters"] = r.sampler.warmup_iters;
  d["warmup_s"] = r.sampler.warmup_s;
  d["sampling_s"] = r.sampler.sampling_s;
  d["target_met"] = r.sampler.target_met;
  d["stop_reason"] = r.sampler.stop_reason;
  d["mode"] = r.mode;
  d["device"] = r.device;
  d["calls_per_sample"] = r.calls_per_sample;
  d["delay_us"] = r.delay_us;
  d["delay_short"] = r.delay_short;
  d["flush_bytes"] = r.flush_bytes;
  if (r.sampler.energy) {
    py::dict e;
    e["joules"] = r.sampler.energy->joules;
    e["window_s"] = r.sampler.energy->window_s;
    e["aligned"] = r.sampler.energy->aligned;
    e["reason"] = r.sampler.energy->reason;
    d["energy"] = e;
  } else {
    d["energy"] = py::none();
  }
  return d;
}

namespace {

// Python calls fn(*args, **kwargs) for argument sets rotated by call index. The caller holds the GIL
// across the whole timed loop. Released between calls, the GIL would go to any other Python thread
// that wants it, and each call would first wait for it to come back -- up to the interpreter's switch
// interval (5 ms) -- while the GPU idles mid-sample: a bubble that reads as "launch-bound". Held, it
// leaves other threads only the interpreter's forced switches inside fn's own bytecode; gpuopt
// starts no Python thread of its own (its clock monitor is a C++ thread).
torch_ext::Callable python_callable(const py::function& fn, const std::vector<std::pair<py::tuple, py::dict>>& calls) {
  TORCH_CHECK_VALUE(!calls.empty(), "inputs must hold at least one argument set");
  const auto n = static_cast<std::int64_t>(calls.size());
  return [&fn, &calls, n](std::int64_t i) {
    const auto& [args, kwargs] = calls[static_cast<std::size_t>(i % n)];
    fn(*args, **kwargs);
  };
}

}  // namespace

void bind_timing(py::module_& m) {
  py::class_<PyOptions>(m, "MeasureOptions")
      .def(py::init([](std::string mode, std::int64_t warmup, double warmup_s, std::optional<std::int64_t> iters,
                       std::int64_t min_iters, std::int64_t max_iters, double min_time_s, double max_time_s,
                       double target_rel_ci, double confidence, bool flush_l2, std::int64_t device,
                       std::optional<std::int64_t> calls_per_sample, double block_target_ms,
                       std::shared_ptr<EnergyMeter> energy, double min_energy_s) {
             return PyOptions{std::move(mode), warmup,     warmup_s,      iters,      min_iters,
                              max_iters,       min_time_s, max_time_s,    target_rel_ci, confidence,
                              flush_l2,        device,     calls_per_sample, block_target_ms,
                              std::move(energy), min_energy_s};
           }),
           py::kw_only(), py::arg("mode"), py::arg("warmup"), py::arg("warmup_s"), py::arg("iters"),
           py::arg("min_iters"), py::arg("max_iters"), py::arg("min_time_s"), py::arg("max_time_s"),
           py::arg("target_rel_ci"),
           py::arg("confidence"), py::arg("flush_l2"), py::arg("device"), py::arg("calls_per_sample"),
           py::arg("block_target_ms"), py::arg("energy") = nullptr,
           py::arg("min_energy_s") = torch_ext::MeasureOptions{}.min_energy_s);

  m.def(
      "measure_defaults",
      [] {
        const torch_ext::MeasureOptions o;
        const SamplerOptions& s = o.sampler;
        py::dict d;
        d["warmup"] = s.warmup_iters;
        d["warmup_s"] = s.warmup_s;
        d["iters"] = s.iters > 0 ? py::cast(s.iters) : py::none();
        d["min_iters"] = s.min_iters;
        d["max_iters"] = s.max_iters;
        d["min_time_s"] = s.min_time_s;
        d["max_time_s"] = s.max_time_s;
        d["target_rel_ci"] = s.target_rel_ci;
        d["confidence"] = s.confidence;
        d["flush_l2"] = o.flush_l2;
        d["calls_per_sample"] = o.calls_per_sample > 0 ? py::cast(o.calls_per_sample) : py::none();
        d["block_target_ms"] = o.block_target_ms;
        d["min_energy_s"] = o.min_energy_s;
        return d;
      },
      "measure()'s option defaults, defined once in C++ (SamplerOptions, MeasureOptions); None where "
      "the option is chosen at run time (iters: adaptive, calls_per_sample: from warm-up).");

  m.def(
      "validate_measure_options", [](const PyOptions& options) { torch_ext::validate(to_options(options)); },
      py::arg("options"),
      "ValueError naming the first option out of range, as measure() would raise it, without measuring.");

  m.def(
      "measure_callable",
      [](const py::function& fn, const std::vector<std::pair<py::tuple, py::dict>>& calls,
         const PyOptions& options) {
        // The GIL stays held across the loop (see python_callable).
        return to_dict(torch_ext::measure(python_callable(fn, calls), to_options(options)));
      },
      py::arg("fn"), py::arg("calls"), py::arg("options"),
      "Times fn(*args, **kwargs), rotating through `calls`, holding the GIL across the timed loop.");

  m.def(
      "measure_script",
      [](const py::object& script_module, const std::vector<std::vector<at::Tensor>>& inputs,
         const PyOptions& options) {
        TORCH_CHECK_VALUE(!inputs.empty(), "inputs must hold at least one argument set");
        const torch_ext::MeasureOptions o = to_options(options);
        auto module = script_module.cast<torch::jit::Module>();
        std::vector<std::vector<c10::IValue>> stacks;
        stacks.reserve(inputs.size());
        for (const auto& set : inputs) stacks.emplace_back(set.begin(), set.end());
        const auto n = static_cast<std::int64_t>(stacks.size());
        const torch_ext::Callable call = [&module, &stacks, n](std::int64_t i) {
          module.forward(stacks[static_cast<std::size_t>(i % n)]);
        };
        // No Python runs in the loop, so other Python threads may.
        torch_ext::MeasureResult result;
        {
          py::gil_scoped_release nogil;
          result = torch_ext::measure(call, o);
        }
        return to_dict(result);
      },
      py::arg("script_module"), py::arg("inputs"), py::arg("options"),
      "Times a TorchScript module's forward entirely in C++, without the GIL.");

  m.def(
      "measure_pair",
      [](const py::function& fn_a, const py::function& fn_b,
         const std::vector<std::pair<py::tuple, py::dict>>& calls, const PyOptions& options) {
        const torch_ext::Callable a = python_callable(fn_a, calls);
        const torch_ext::Callable b = python_callable(fn_b, calls);
        // The GIL stays held across the loop (see python_callable).
        const torch_ext::PairResult r = torch_ext::measure_pair(a, b, to_options(options));
        py::dict d;
        d["a"] = to_dict(r.a);
        d["b"] = to_dict(r.b);
        d["ratio_samples"] = r.ratio.ms;
        return d;
      },
      py::arg("fn_a"), py::arg("fn_b"), py::arg("calls"), py::arg("options"),
      "Times two callables interleaved sample by sample (A B, B A, ...) so device drift hits both; "
      "the GIL is held across the timed loop.");

  m.def("graph_pool_use_count", &torch_ext::graph_pool_use_count, py::arg("device"), py::arg("pool"),
        "How many CUDA graphs (and captures under way) hold private memory pool `pool` (a "
        "torch.cuda.graph_pool_handle()) of CUDA device `device`; 0 when it does not exist, -1 when this "
        "torch cannot tell.");
  m.def("release_failed_capture", &torch_ext::release_failed_capture, py::arg("device"), py::arg("pool"),
        py::arg("use_count_before"),
        "After a failed capture into `pool`, once the CUDAGraph is reset: ends the caching allocators' "
        "routing to the pool and drops the capture's reference to it where this torch left them "
        "(use_count_before: graph_pool_use_count before capture_begin). Returns how many it undid.");
}

}  // namespace gpuopt::python
