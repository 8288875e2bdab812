#include <pybind11/stl.h>

#include <memory>
#include <optional>

#include "../torch/pipeline.h"
#include "../torch/pools.h"
#include "bindings.h"

namespace gpuopt::python {
namespace {

using torch_ext::TensorPool;

py::dict stats_dict(const PoolStats& s) {
  py::dict d;
  d["acquisitions"] = s.acquisitions;
  d["releases"] = s.releases;
  d["hits"] = s.hits;
  d["misses"] = s.misses;
  d["busy_skips"] = s.busy_skips;
  d["allocations"] = s.allocations;
  d["frees"] = s.frees;
  d["bytes_reserved"] = s.bytes_reserved;
  d["peak_bytes_reserved"] = s.peak_bytes_reserved;
  d["bytes_in_use"] = s.bytes_in_use;
  d["peak_bytes_in_use"] = s.peak_bytes_in_use;
  d["bytes_requested_in_use"] = s.bytes_requested_in_use;
  d["blocks_in_use"] = s.blocks_in_use;
  d["free_blocks"] = s.free_blocks;
  d["largest_free_block"] = s.largest_free_block;
  d["fragmentation"] = s.fragmentation;
  return d;
}

std::size_t capacity(std::optional<std::int64_t> bytes, const char* name) {
  TORCH_CHECK_VALUE(!bytes || *bytes > 0, name, ": capacity_bytes must be > 0 (or None for unlimited), got ",
                    bytes.value_or(0));
  return bytes ? static_cast<std::size_t>(*bytes) : 0;
}

}  // namespace

void bind_memory(py::module_& m) {
  py::class_<TensorPool, std::shared_ptr<TensorPool>>(m, "TensorPool")
      .def("empty", &TensorPool::empty, py::arg("shape"), py::arg("dtype") = at::kFloat,
           "A tensor whose storage comes from the pool and returns to it when the tensor is freed.")
      .def("record_stream", &TensorPool::record_stream, py::arg("tensor"), py::arg("stream"))
      .def("stats", [](const TensorPool& p) { return stats_dict(p.stats()); })
      .def("trim", &TensorPool::trim, py::call_guard<py::gil_scoped_release>())
      .def("close", &TensorPool::close, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("closed", &TensorPool::closed)
      .def_property_readonly("page_locked", &TensorPool::page_locked)
      .def_property_readonly("name", &TensorPool::name);

  m.def(
      "pinned_pool",
      [](std::optional<std::int64_t> capacity_bytes, const std::string& name) {
        return TensorPool::create(TensorPool::Kind::kPinned, 0, capacity(capacity_bytes, name.c_str()), name);
      },
      py::arg("capacity_bytes") = py::none(), py::arg("name") = "PinnedPool");
  m.def(
      "device_pool",
      [](std::int64_t device, std::optional<std::int64_t> capacity_bytes, const std::string& name) {
        return TensorPool::create(TensorPool::Kind::kDevice, device, capacity(capacity_bytes, name.c_str()), name);
      },
      py::arg("device"), py::arg("capacity_bytes") = py::none(), py::arg("name") = "DevicePool");

  m.def("pool_cycle_ns", &torch_ext::pool_cycle_ns, py::arg("pool"), py::arg("shape"), py::arg("dtype"),
        py::arg("iters"), py::call_guard<py::gil_scoped_release>());
  m.def("host_alloc_cycle_ns", &torch_ext::host_alloc_cycle_ns, py::arg("bytes"), py::arg("iters"),
        py::call_guard<py::gil_scoped_release>());

  py::class_<torch_ext::InputPipeline>(m, "InputPipeline")
      .def(py::init<std::shared_ptr<TensorPool>, std::shared_ptr<TensorPool>, std::int64_t, std::int64_t>(),
           py::arg("pinned_pool"), py::arg("device_pool"), py::arg("device"), py::arg("depth"))
      .def("submit", &torch_ext::InputPipeline::submit, py::arg("batch"), py::call_guard<py::gil_scoped_release>())
      .def("next", &torch_ext::InputPipeline::next, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("in_flight", &torch_ext::InputPipeline::in_flight)
      .def_property_readonly("depth", &torch_ext::InputPipeline::depth)
      .def("stats", [](const torch_ext::InputPipeline& p) {
        const torch_ext::PipelineStats s = p.stats();
        py::dict d;
        d["submitted"] = s.submitted;
        d["delivered"] = s.delivered;
        d["bytes"] = s.bytes;
        d["stage_ms"] = s.stage_ms;
        d["wait_ms"] = s.wait_ms;
        return d;
      });
}

}  // namespace gpuopt::python
