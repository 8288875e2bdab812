// The pybind11 layer: one PYBIND11_MODULE (module.cpp); each bind_<area>.cpp only defines functions.
// pybind11 comes from torch's own headers (BUILD.md pitfall 2), through torch/csrc/utils/pybind.h.
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace gpuopt::python {

namespace py = pybind11;

void register_errors(py::module_& m);
void bind_build(py::module_& m);
void bind_stats(py::module_& m);
void bind_timing(py::module_& m);
void bind_monitor(py::module_& m);
void bind_config(py::module_& m);
void bind_memory(py::module_& m);
void bind_serve(py::module_& m);
void bind_llm(py::module_& m);

}  // namespace gpuopt::python
