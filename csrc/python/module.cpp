#include <c10/util/Exception.h>

#include "bindings.h"
#include "gpuopt/errors.h"

namespace gpuopt::python {

void register_errors(py::module_& m) {
  // Local to this module, and tried before pybind11's defaults: gpuopt::Error by kind, and torch's
  // typed TORCH_CHECK_* errors as the matching Python types (without the C++ backtrace).
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const gpuopt::Error& e) {
      PyObject* type = PyExc_RuntimeError;
      switch (e.kind()) {
        case ErrorKind::kValue: type = PyExc_ValueError; break;
        case ErrorKind::kType: type = PyExc_TypeError; break;
        case ErrorKind::kIndex: type = PyExc_IndexError; break;
        case ErrorKind::kRuntime: type = PyExc_RuntimeError; break;
      }
      PyErr_SetString(type, e.what());
    } catch (const c10::ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
    } catch (const c10::TypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what_without_backtrace());
    } catch (const c10::IndexError& e) {
      PyErr_SetString(PyExc_IndexError, e.what_without_backtrace());
    } catch (const c10::NotImplementedError& e) {
      PyErr_SetString(PyExc_NotImplementedError, e.what_without_backtrace());
    } catch (const c10::OutOfMemoryError& e) {
      // torch.OutOfMemoryError when torch exposes it, so callers can catch it the usual way.
      PyObject* oom = PyObject_GetAttrString(py::module_::import("torch").ptr(), "OutOfMemoryError");
      if (oom == nullptr) {
        PyErr_Clear();
        oom = PyExc_MemoryError;
        Py_INCREF(oom);
      }
      PyErr_SetString(oom, e.what_without_backtrace());
      Py_DECREF(oom);
    } catch (const c10::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    }
  });
  (void)m;
}

}  // namespace gpuopt::python

PYBIND11_MODULE(_C, m) {
  m.doc() = "gpuopt's compiled core (C++17/CUDA). Use the `gpuopt` package, not this module.";
  gpuopt::python::register_errors(m);
  gpuopt::python::bind_build(m);
  gpuopt::python::bind_stats(m);
  gpuopt::python::bind_timing(m);
  gpuopt::python::bind_monitor(m);
  gpuopt::python::bind_config(m);
  gpuopt::python::bind_memory(m);
  gpuopt::python::bind_serve(m);
  gpuopt::python::bind_llm(m);
}
