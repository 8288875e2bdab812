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
  m.def("fill_pattern", &torch_ext::fill_pattern, py::arg("out"), py::arg("seed") = 0,
        "Writes gpuopt's hash pattern into a contiguous int32 CUDA tensor on the current stream.");
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
}

}  // namespace gpuopt::python
