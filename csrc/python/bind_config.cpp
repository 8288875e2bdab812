#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../torch/convert.h"
#include "../torch/guards.h"
#include "bindings.h"

namespace gpuopt::python {
namespace {

c10::DeviceType parse_device_type(const std::string& s) {
  if (s == "cuda") return c10::DeviceType::CUDA;
  if (s == "cpu") return c10::DeviceType::CPU;
  TORCH_CHECK_VALUE(false, "device_type must be \"cuda\" or \"cpu\", got \"", s, "\"");
  return c10::DeviceType::CPU;
}

// A StateGuard as a Python context manager (re-usable, not re-entrant).
class PyStateGuard {
 public:
  explicit PyStateGuard(torch_ext::StateSpec spec) : spec_(spec) { torch_ext::validate(spec_); }
  void enter() {
    TORCH_CHECK(!active_, "this gpuopt guard is already active; create one per `with` block");
    active_ = std::make_unique<torch_ext::StateGuard>(spec_);
  }
  void exit() { active_.reset(); }

 private:
  torch_ext::StateSpec spec_;
  std::unique_ptr<torch_ext::StateGuard> active_;
};

py::object convert_nested(const py::handle& obj, const torch_ext::ConvertSpec& spec, int& changed) {
  if (THPVariable_Check(obj.ptr())) {
    bool layout = false;
    at::Tensor out = torch_ext::convert(THPVariable_Unpack(obj.ptr()), spec, &layout);
    changed += layout ? 1 : 0;
    return py::cast(out);
  }
  if (py::isinstance<py::dict>(obj)) {
    py::dict out;
    for (auto item : py::reinterpret_borrow<py::dict>(obj)) out[item.first] = convert_nested(item.second, spec, changed);
    return out;
  }
  if (py::isinstance<py::list>(obj)) {
    py::list out;
    for (auto item : py::reinterpret_borrow<py::list>(obj)) out.append(convert_nested(item, spec, changed));
    return out;
  }
  if (py::isinstance<py::tuple>(obj)) {
    py::list items;
    for (auto item : py::reinterpret_borrow<py::tuple>(obj)) items.append(convert_nested(item, spec, changed));
    if (py::hasattr(obj, "_fields")) return py::type::of(obj)(*items);  // namedtuple keeps its type
    return py::tuple(items);
  }
  return py::reinterpret_borrow<py::object>(obj);
}

}  // namespace

void bind_config(py::module_& m) {
  py::class_<PyStateGuard>(m, "StateGuard",
                           "Context manager setting autocast / TF32 / cudnn.benchmark / inference mode "
                           "for its block and restoring what it found.")
      .def(py::init([](std::optional<bool> autocast, at::ScalarType autocast_dtype, const std::string& device_type,
                       bool autocast_cache, std::optional<bool> tf32, std::optional<bool> cudnn_benchmark,
                       bool inference_mode) {
             torch_ext::StateSpec s;
             s.autocast = autocast;
             s.autocast_dtype = autocast_dtype;
             s.device_type = parse_device_type(device_type);
             s.autocast_cache = autocast_cache;
             s.tf32 = tf32;
             s.cudnn_benchmark = cudnn_benchmark;
             s.inference_mode = inference_mode;
             return PyStateGuard(s);
           }),
           py::kw_only(), py::arg("autocast") = py::none(), py::arg("autocast_dtype") = at::kHalf,
           py::arg("device_type") = "cuda", py::arg("autocast_cache") = true, py::arg("tf32") = py::none(),
           py::arg("cudnn_benchmark") = py::none(), py::arg("inference_mode") = false)
      .def("__enter__", [](PyStateGuard& g) { g.enter(); return &g; }, py::return_value_policy::reference)
      .def("__exit__", [](PyStateGuard& g, const py::args&) {
        g.exit();
        return false;
      });

  m.def("state", [] {
    const torch_ext::StateSnapshot s = torch_ext::snapshot();
    py::dict d;
    d["autocast_cuda"] = s.autocast_cuda;
    d["autocast_cpu"] = s.autocast_cpu;
    d["autocast_cuda_dtype"] = s.autocast_cuda_dtype;
    d["autocast_cpu_dtype"] = s.autocast_cpu_dtype;
    d["matmul_precision"] = s.matmul_precision;
    d["cudnn_tf32"] = s.cudnn_tf32;
    d["cudnn_benchmark"] = s.cudnn_benchmark;
    d["inference_mode"] = s.inference_mode;
    return d;
  }, "The global switches configs touch, as torch reports them.");

  m.def(
      "convert_nested",
      [](const py::object& obj, std::optional<c10::Device> device, std::optional<at::ScalarType> dtype,
         bool channels_last) {
        torch_ext::ConvertSpec spec{device, dtype, channels_last};
        int changed = 0;
        py::object out = convert_nested(obj, spec, changed);
        return py::make_tuple(out, changed);
      },
      py::arg("obj"), py::arg("device") = py::none(), py::arg("dtype") = py::none(),
      py::arg("channels_last") = false,
      "Converts every tensor in nested tuples/lists/dicts: device, floating dtype, channels-last "
      "(4-D/5-D). Returns (converted, number of tensors whose layout changed).");
}

}  // namespace gpuopt::python
