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
  d["fence_waits"] = s.fence_waits;
  d["allocations"] = s.allocations;
  d["frees"] = s.frees;
  d["blocks_leaked"] = s.blocks_leaked;
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

PoolOptions pool_options(std::optional<std::int64_t> capacity_bytes, const std::string& name,
                         double fence_wait_timeout_s) {
  TORCH_CHECK_VALUE(!capacity_bytes || *capacity_bytes > 0, name,
                    ": capacity_bytes must be > 0 (or None for unlimited), got ", capacity_bytes.value_or(0));
  PoolOptions o;
  o.name = name;
  o.capacity_bytes = capacity_bytes ? static_cast<std::size_t>(*capacity_bytes) : 0;
  o.fence_wait_timeout_s = fence_wait_timeout_s;  // checked by the pool, which names it
  return o;
}

}  // namespace

void bind_memory(py::module_& m) {
  py::class_<TensorPool, std::shared_ptr<TensorPool>>(m, "TensorPool")
      .def(
          "empty",
          [](TensorPool& pool, at::IntArrayRef shape, at::ScalarType dtype) {
            // A hit takes a microsecond: keep the GIL. A miss (cudaHostAlloc: milliseconds) or a
            // wait for fences under capacity_bytes runs without it.
            if (std::optional<at::Tensor> hit = pool.reuse(shape, dtype)) return std::move(*hit);
            py::gil_scoped_release no_gil;
            return pool.empty(shape, dtype);
          },
          py::arg("shape"), py::arg("dtype") = at::kFloat,
          "A tensor whose storage comes from the pool and returns to it when the tensor is freed.")
      .def("record_stream", &TensorPool::record_stream, py::arg("tensor"), py::arg("stream"))
      .def("stats", [](const TensorPool& p) { return stats_dict(p.stats()); })
      .def("trim", &TensorPool::trim, py::call_guard<py::gil_scoped_release>())
      .def("close", &TensorPool::close, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("closed", &TensorPool::closed)
      .def_property_readonly("page_locked", &TensorPool::page_locked)
      .def_property_readonly("name", &TensorPool::name)
      .def_property_readonly("capacity_bytes",
                             [](const TensorPool& p) -> std::optional<std::int64_t> {
                               const std::size_t c = p.options().capacity_bytes;
                               if (c == 0) return std::nullopt;
                               return static_cast<std::int64_t>(c);
                             })
      .def_property_readonly("fence_wait_timeout_s",
                             [](const TensorPool& p) { return p.options().fence_wait_timeout_s; });

  m.def(
      "pinned_pool",
      [](std::optional<std::int64_t> capacity_bytes, const std::string& name, double fence_wait_timeout_s) {
        return TensorPool::create(TensorPool::Kind::kPinned, 0,
                                  pool_options(capacity_bytes, name, fence_wait_timeout_s));
      },
      py::arg("capacity_bytes") = py::none(), py::arg("name") = "PinnedPool", py::arg("fence_wait_timeout_s") = 10.0);
  m.def(
      "device_pool",
      [](std::int64_t device, std::optional<std::int64_t> capacity_bytes, const std::string& name,
         double fence_wait_timeout_s) {
        return TensorPool::create(TensorPool::Kind::kDevice, device,
                                  pool_options(capacity_bytes, name, fence_wait_timeout_s));
      },
      py::arg("device"), py::arg("capacity_bytes") = py::none(), py::arg("name") = "DevicePool",
      py::arg("fence_wait_timeout_s") = 10.0);

  m.def("pool_cycle_ns", &torch_ext::pool_cycle_ns, py::arg("pool"), py::arg("shape"), py::arg("dtype"),
        py::arg("iters"), py::call_guard<py::gil_scoped_release>());
  m.def("host_alloc_cycle_ns", &torch_ext::host_alloc_cycle_ns, py::arg("bytes"), py::arg("iters"),
        py::call_guard<py::gil_scoped_release>());
  m.def(
      "pool_stress",
      [](TensorPool& pool, std::int64_t threads, std::int64_t iters, std::int64_t seed) {
        torch_ext::PoolStressResult r;
        {
          py::gil_scoped_release no_gil;  // the threads are C++ threads: nothing serialises them
          r = torch_ext::pool_stress(pool, threads, iters, seed);
        }
        py::dict d = stats_dict(pool.stats());
        d["tensors"] = r.tensors;
        d["corrupted"] = r.corrupted;
        d["seconds"] = r.seconds;
        return d;
      },
      py::arg("pool"), py::arg("threads"), py::arg("iters"), py::arg("seed"),
      "C++ threads create and free tensors of random sizes from a pinned pool; the pool's stats after, "
      "plus tensors (created in all), corrupted (tags overwritten by another thread) and seconds.");

  using torch_ext::InputPipeline;
  // The destructor needs no GIL release: the worker never needs the GIL (see pipeline.h).
  py::class_<InputPipeline>(m, "InputPipeline")
      .def(py::init<std::shared_ptr<TensorPool>, std::shared_ptr<TensorPool>, std::int64_t, std::int64_t, double>(),
           py::arg("pinned_pool"), py::arg("device_pool"), py::arg("device"), py::arg("depth"),
           py::arg("timeout_s") = 60.0)
      .def("submit", &InputPipeline::submit, py::arg("batch"), py::arg("timeout_s") = py::none(),
           py::call_guard<py::gil_scoped_release>())
      .def("next", &InputPipeline::next, py::arg("timeout_s") = py::none(), py::call_guard<py::gil_scoped_release>())
      .def("close", &InputPipeline::close, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("closed", &InputPipeline::closed)
      .def_property_readonly("in_flight", &InputPipeline::in_flight)
      .def_property_readonly("depth", &InputPipeline::depth)
      .def_property_readonly("timeout_s", &InputPipeline::timeout_s)
      .def("stats", [](const InputPipeline& p) {
        const torch_ext::PipelineStats s = p.stats();
        py::dict d;
        d["submitted"] = s.submitted;
        d["delivered"] = s.delivered;
        d["failed"] = s.failed;
        d["cancelled"] = s.cancelled;
        d["bytes"] = s.bytes;
        d["stage_ms"] = s.stage_ms;
        d["wait_ms"] = s.wait_ms;
        return d;
      });
}

}  // namespace gpuopt::python
