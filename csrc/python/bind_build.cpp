#include "../torch/ceilings.h"
#include "../torch/device.h"
#include "bindings.h"
#include "build_info.h"

namespace gpuopt::python {

void bind_build(py::module_& m) {
  m.attr("__version__") = GPUOPT_VERSION;
  m.attr("BUILT_TORCH_VERSION") = GPUOPT_BUILT_TORCH_VERSION;

  m.def("build_info", [] {
    py::dict d;
    d["gpuopt_version"] = GPUOPT_VERSION;
    d["torch_version"] = GPUOPT_BUILT_TORCH_VERSION;
    d["torch_cuda"] = std::string(GPUOPT_BUILT_TORCH_CUDA).empty() ? py::object(py::none())
                                                                    : py::object(py::str(GPUOPT_BUILT_TORCH_CUDA));
    d["cuda"] = torch_ext::cuda_compiled();
    d["no_cuda_reason"] = torch_ext::no_cuda_reason();
    d["cuda_archs"] = GPUOPT_CUDA_ARCHS;
    d["nvcc_version"] = GPUOPT_NVCC_VERSION;
    d["compiler"] = GPUOPT_CXX_COMPILER;
    d["cxx_standard"] = GPUOPT_CXX_STANDARD;
    d["build_type"] = GPUOPT_BUILD_TYPE;
    return d;
  }, "What this extension was built from: versions, CUDA, architectures, compiler, build type.");

  m.def("cuda_compiled", &torch_ext::cuda_compiled);
  m.def("cuda_device_count", &torch_ext::cuda_device_count);
  m.def("cuda_runtime_version", &torch_ext::cuda_runtime_version,
        "CUDA runtime version gpuopt runs with (e.g. 13000); 0 without CUDA.");
  m.def("cuda_driver_version", &torch_ext::cuda_driver_version,
        "CUDA version supported by the installed driver (e.g. 13000); 0 without a driver.");
  m.def("l2_cache_bytes", &torch_ext::l2_cache_bytes, py::arg("device") = 0);
  m.def(
      "time_device_copy",
      [](std::int64_t nbytes, std::int64_t reps, std::int64_t device) {
        const torch_ext::CopyTiming t = torch_ext::time_device_copy(nbytes, reps, device);
        py::dict d;
        d["ms_per_copy"] = t.ms_per_copy;
        d["gbps"] = t.gbps;
        return d;
      },
      py::arg("nbytes"), py::arg("reps") = 10, py::arg("device") = 0,
      "Times device-to-device copies with CUDA events; gbps counts bytes read plus written.");

  m.def(
      "kernel_ceilings",
      [](std::int64_t device, bool quick) {
        torch_ext::KernelCeilings c;
        {
          py::gil_scoped_release nogil;
          c = torch_ext::measure_kernel_ceilings(device, quick);
        }
        py::dict d;
        d["hbm_read_gbps"] = c.hbm_read_gbps;
        d["hbm_write_gbps"] = c.hbm_write_gbps;
        d["hbm_copy_gbps"] = c.hbm_copy_gbps;
        d["l2_gbps"] = c.l2_gbps;
        d["fp32_fma_tflops"] = c.fp32_fma_tflops;
        d["launch_host_us"] = c.launch_host_us;
        d["launch_device_us"] = c.launch_device_us;
        d["graph_node_us"] = c.graph_node_us;
        d["hbm_bytes"] = c.hbm_bytes;
        d["l2_bytes"] = c.l2_bytes;
        return d;
      },
      py::arg("device") = 0, py::arg("quick") = false,
      "Device ceilings measured with gpuopt's own kernels: HBM read/write/copy and L2 GB/s, FP32 FMA "
      "TFLOP/s, launch overhead, CUDA-graph per-node overhead.");
}

}  // namespace gpuopt::python
