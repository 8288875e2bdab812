#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>

#include "bindings.h"
#include "gpuopt/monitor.h"
#include "gpuopt/nvml.h"

namespace gpuopt::python {
namespace {

// The GPU clock monitor of measure() and compare(): NVML read from a C++ thread, which never needs
// the GIL that the timed loop holds. Inactive (no thread, summary None) without NVML or the device.
class ClockMonitor {
 public:
  ClockMonitor(std::int64_t device, const std::optional<std::string>& uuid, double interval_ms) {
    py::gil_scoped_release nogil;  // the first use loads and initialises NVML
    const nvml::Device d = nvml::Device::open(nvml::Library::system(), uuid.value_or(""), device);
    reason_ = d.reason();
    active_ = d.active();
    monitor_ = std::make_unique<Monitor>(std::make_shared<NvmlProbe>(d), interval_ms);
  }
  ~ClockMonitor() {
    // Joining the thread may wait for an NVML call: not with the GIL held.
    if (PyGILState_Check()) {
      py::gil_scoped_release nogil;
      monitor_.reset();
    } else {
      monitor_.reset();
    }
  }

  bool active() const { return active_; }
  const std::string& reason() const { return reason_; }
  void start() {
    if (active_) monitor_->start();
  }
  bool stop() { return monitor_->stop(); }
  std::string error() const { return monitor_->error(); }

  std::optional<py::dict> summary(double skip_s) const {
    const std::optional<MonitorSummary> s = active_ ? monitor_->summary(skip_s) : std::nullopt;
    if (!s) return std::nullopt;
    py::dict d;
    d["sm_mhz_median"] = s->sm_mhz_median;
    d["sm_mhz_min"] = s->sm_mhz_min;
    d["max_sm_mhz"] = s->max_sm_mhz;
    d["throttle_reasons"] = s->throttle_reasons;
    d["samples"] = s->samples;
    // Our own process may be invisible inside a container, so "others" means: more than one.
    d["compute_processes"] = s->compute_processes;
    d["power_w_mean"] = s->power_w_mean;
    d["power_energy_j"] = s->power_energy_j;
    d["power_span_s"] = s->power_span_s;
    d["power_samples"] = s->power_samples;
    return d;
  }

 private:
  bool active_ = false;
  std::string reason_;
  std::unique_ptr<Monitor> monitor_;
};

}  // namespace

void bind_monitor(py::module_& m) {
  py::class_<ClockMonitor>(m, "ClockMonitor")
      .def(py::init<std::int64_t, const std::optional<std::string>&, double>(), py::arg("device"),
           py::arg("uuid") = py::none(), py::arg("interval_ms") = 100.0,
           "Monitor of CUDA device `device`, found in NVML by `uuid` ('GPU-...', as torch reports it) "
           "or else by index.")
      .def_property_readonly("active", &ClockMonitor::active)
      .def_property_readonly("reason", &ClockMonitor::reason, "why the monitor is inactive ('' if active)")
      .def_property_readonly("error", &ClockMonitor::error, "what ended the readings early ('' if nothing)")
      .def("start", &ClockMonitor::start, "Starts reading (a no-op when inactive). Once per monitor.")
      .def("stop", &ClockMonitor::stop, py::call_guard<py::gil_scoped_release>(),
           "Stops reading; False when the thread did not end in time (it is left to finish alone).")
      .def("summary", &ClockMonitor::summary, py::arg("skip_s") = 0.0,
           "Clock statistics over the readings after the first skip_s seconds (warm-up), or None: "
           "sm_mhz_median, sm_mhz_min, max_sm_mhz, throttle_reasons, samples, compute_processes.")
      .def("__enter__",
           [](ClockMonitor& self) -> ClockMonitor& {
             self.start();
             return self;
           },
           py::return_value_policy::reference)
      .def("__exit__", [](ClockMonitor& self, const py::args&) {
        {
          py::gil_scoped_release nogil;
          self.stop();
        }
        return false;
      });

  py::class_<EnergyMeter, std::shared_ptr<EnergyMeter>>(
      m, "EnergyMeter", "An energy counter measure() reads at the edges of its timed region.");
  py::class_<NvmlEnergyMeter, EnergyMeter, std::shared_ptr<NvmlEnergyMeter>>(m, "NvmlEnergyMeter")
      .def(py::init([](std::int64_t device, const std::optional<std::string>& uuid) {
             py::gil_scoped_release nogil;  // the first use loads and initialises NVML
             return std::make_shared<NvmlEnergyMeter>(
                 nvml::Device::open(nvml::Library::system(), uuid.value_or(""), device));
           }),
           py::arg("device"), py::arg("uuid") = py::none(),
           "NVML's total energy counter of CUDA device `device` (found by `uuid`, else by index).")
      .def_property_readonly("active", [](const NvmlEnergyMeter& e) { return e.device().active(); })
      .def_property_readonly("reason", [](const NvmlEnergyMeter& e) { return e.device().reason(); },
                             "why the device is inactive ('' if active)")
      .def("read_j", &NvmlEnergyMeter::read_j, "Joules since the driver loaded; None where unsupported.")
      .def("power_w", [](const NvmlEnergyMeter& e) -> std::optional<double> {
             const auto mw = e.device().power_mw();
             return mw ? std::optional<double>(*mw / 1e3) : std::nullopt;
           }, "The power draw now, in watts; None where unsupported.")
      .def("power_limit_w", [](const NvmlEnergyMeter& e) -> std::optional<double> {
             const auto mw = e.device().power_limit_mw();
             return mw ? std::optional<double>(*mw / 1e3) : std::nullopt;
           }, "The enforced power limit, in watts; None where unsupported.");
}

}  // namespace gpuopt::python
