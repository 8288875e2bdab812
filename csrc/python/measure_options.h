// measure()'s options as Python gives them (_C.MeasureOptions) and its result as a dict: shared by
// the timing bindings and the LLM token loop's; defined once, in bind_timing.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "../torch/timing.h"
#include "bindings.h"

namespace gpuopt::python {

struct PyOptions {
  std::string mode;
  std::int64_t warmup;
  double warmup_s;
  std::optional<std::int64_t> iters;
  std::int64_t min_iters;
  std::int64_t max_iters;
  double min_time_s;
  double max_time_s;
  double target_rel_ci;
  double confidence;
  bool flush_l2;
  std::int64_t device;
  std::optional<std::int64_t> calls_per_sample;
  double block_target_ms;
  std::shared_ptr<EnergyMeter> energy;  // None: no energy
  double min_energy_s = 0.0;
};

// ValueError for iters or calls_per_sample out of range; the rest is torch_ext::validate's.
torch_ext::MeasureOptions to_options(const PyOptions& p);
py::dict to_dict(const torch_ext::MeasureResult& r);

}  // namespace gpuopt::python
