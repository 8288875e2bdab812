// Serving: the batcher's and load generator's options, the C++ server (graph or Python executors),
// futures, and the load generator driving a Python target (the naive baseline).
#include <ATen/ATen.h>
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/csrc/autograd/python_variable.h>

#include "../torch/pools.h"
#include "../torch/server.h"
#include "bindings.h"
#include "gpuopt/batcher.h"
#include "gpuopt/busy.h"
#include "gpuopt/loadgen.h"

#ifdef GPUOPT_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace gpuopt::python {
namespace {

using serve::BatcherOptions;
using serve::LoadOptions;
using serve::LoadResult;
using serve::QueryRecord;
using torch_ext::Executor;
using torch_ext::InputSpec;
using torch_ext::Server;

at::MemoryFormat parse_memory_format(const std::string& name) {
  if (name == "contiguous") return at::MemoryFormat::Contiguous;
  if (name == "channels_last") return at::MemoryFormat::ChannelsLast;
  if (name == "channels_last_3d") return at::MemoryFormat::ChannelsLast3d;
  TORCH_CHECK_VALUE(false, "memory_format must be 'contiguous', 'channels_last' or 'channels_last_3d', got '", name,
                    "'");
}

// A Python callable run on the executor's thread with the GIL: called with the batch tensors (on the
// server's device, the executor's stream current), it returns the output tensor. What Python sees
// are aliases, and what C++ keeps is detached, so no Python object is ever freed without the GIL.
class PyExecutor final : public Executor {
 public:
  PyExecutor(py::function fn, std::int64_t device, std::vector<InputSpec> specs)
      : fn_(std::move(fn)), device_(device), specs_(std::move(specs)) {}
  ~PyExecutor() override {
    py::gil_scoped_acquire gil;
    fn_ = py::function();
  }
  const char* path() const override { return "python"; }

  std::vector<at::Tensor> inputs(std::int64_t rows, std::int64_t bucket, std::int64_t padded_length) override {
    (void)bucket;
    batch_.clear();
    const at::Device device = device_ >= 0 ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device_))
                                           : at::Device(at::kCPU);
    for (const InputSpec& s : specs_) {
      std::vector<std::int64_t> shape{rows};
      shape.insert(shape.end(), s.sample_shape.begin(), s.sample_shape.end());
      if (padded_length > 0) shape[1] = padded_length;
      batch_.push_back(at::empty(shape, at::TensorOptions().device(device).dtype(s.dtype), s.memory_format));
    }
    return batch_;
  }

  at::Tensor run(std::int64_t rows, std::int64_t bucket, std::int64_t padded_length) override {
    (void)rows;
    (void)bucket;
    (void)padded_length;
    py::gil_scoped_acquire gil;
    std::string error;
    at::Tensor out;
    try {
      py::tuple args(batch_.size());
      for (std::size_t k = 0; k < batch_.size(); ++k) args[k] = py::cast(batch_[k].detach());
      py::object result = fn_(*args);
      TORCH_CHECK_TYPE(THPVariable_Check(result.ptr()), "the served callable must return a tensor, got ",
                       py::str(py::type::of(result)).cast<std::string>());
      out = THPVariable_Unpack(result.ptr()).detach();
    } catch (py::error_already_set& e) {
      error = e.what();  // formatted with the GIL held; e is destroyed with it too
    }
    if (!error.empty()) throw std::runtime_error(error);
    return out;
  }

  void finish() override { batch_.clear(); }

 private:
  py::function fn_;
  std::int64_t device_;
  std::vector<InputSpec> specs_;
  std::vector<at::Tensor> batch_;
};

// Drops the server with the GIL released while its executors stop (they may need it), then frees it
// (and the Python callable it holds) with the GIL held.
struct ServerDeleter {
  void operator()(Server* s) const {
    if (PyGILState_Check()) {
      py::gil_scoped_release no_gil;
      s->shutdown(false, 0);
    } else {
      s->shutdown(false, 0);
    }
    delete s;
  }
};
using ServerHolder = std::unique_ptr<Server, ServerDeleter>;

py::dict percentiles_dict(const serve::Percentiles& p) {
  py::dict d;
  d["n"] = p.n;
  d["mean"] = p.mean;
  d["p50"] = p.p50;
  d["p90"] = p.p90;
  d["p95"] = p.p95;
  d["p99"] = p.p99;
  d["p99.9"] = p.p999;
  d["max"] = p.max;
  return d;
}

py::dict result_dict(const LoadResult& r) {
  py::dict d;
  d["scenario"] = serve::scenario_name(r.scenario);
  d["issued"] = r.issued;
  d["ok"] = r.ok;
  d["failed"] = r.failed;
  d["rejected"] = r.rejected;
  d["timed_out"] = r.timed_out;
  d["cancelled"] = r.cancelled;
  d["lost"] = r.lost;
  d["duplicated"] = r.duplicated;
  d["unknown"] = r.unknown;
  d["duration_s"] = r.duration_s;
  d["issue_span_s"] = r.issue_span_s;
  d["target_rate"] = r.target_rate;
  d["scheduled_rate"] = r.scheduled_rate;
  d["throughput"] = r.throughput;
  d["latency_ms"] = percentiles_dict(r.latency);
  d["queue_ms"] = percentiles_dict(r.queue);
  d["compute_ms"] = percentiles_dict(r.compute);
  d["issue_lag_p99_ms"] = r.issue_lag_p99_ms;
  py::dict es;
  es["percentile"] = r.early_stop.percentile;
  es["confidence"] = r.early_stop.confidence;
  es["queries"] = r.early_stop.queries;
  es["min_queries"] = r.early_stop.min_queries;
  es["enough"] = r.early_stop.enough;
  es["order"] = r.early_stop.order;
  es["estimate_ms"] = std::isnan(r.early_stop.estimate) ? py::object(py::none()) : py::cast(r.early_stop.estimate);
  d["early_stop"] = es;
  d["valid"] = r.valid;
  d["invalid_reasons"] = r.invalid_reasons;
  d["batch_size_counts"] = r.batch_size_counts;
  d["errors"] = r.errors;
  return d;
}

// Every query's record as columns (CPU tensors): a million records cost milliseconds, not seconds.
py::dict records_dict(const std::vector<QueryRecord>& records) {
  const auto n = static_cast<std::int64_t>(records.size());
  auto i64 = [&](auto get) {
    at::Tensor t = at::empty({n}, at::kLong);
    auto* p = t.data_ptr<std::int64_t>();
    for (std::int64_t i = 0; i < n; ++i) p[i] = static_cast<std::int64_t>(get(records[static_cast<std::size_t>(i)]));
    return t;
  };
  auto f64 = [&](auto get) {
    at::Tensor t = at::empty({n}, at::kDouble);
    auto* p = t.data_ptr<double>();
    for (std::int64_t i = 0; i < n; ++i) p[i] = static_cast<double>(get(records[static_cast<std::size_t>(i)]));
    return t;
  };
  py::dict d;
  d["id"] = i64([](const QueryRecord& r) { return r.id; });
  d["sample"] = i64([](const QueryRecord& r) { return r.sample; });
  d["priority"] = i64([](const QueryRecord& r) { return r.priority; });
  d["group"] = i64([](const QueryRecord& r) { return r.group; });
  d["scheduled_s"] = f64([](const QueryRecord& r) { return r.scheduled_s; });
  d["issued_s"] = f64([](const QueryRecord& r) { return r.issued_s; });
  d["completed_s"] = f64([](const QueryRecord& r) { return r.completed_s; });
  d["queue_us"] = f64([](const QueryRecord& r) { return r.queue_us; });
  d["compute_us"] = f64([](const QueryRecord& r) { return r.compute_us; });
  d["batch_size"] = i64([](const QueryRecord& r) { return r.batch_size; });
  {  // [n, kChecksums]: NaN where the target computed none
    at::Tensor t = at::empty({n, serve::kChecksums}, at::kDouble);
    auto* p = t.data_ptr<double>();
    for (const QueryRecord& r : records) p = std::copy(r.checksum.begin(), r.checksum.end(), p);
    d["checksum"] = t;
  }
  d["status"] = i64([](const QueryRecord& r) { return static_cast<int>(r.status); });
  d["completions"] = i64([](const QueryRecord& r) { return r.completions; });
  return d;
}

py::dict stats_dict(const torch_ext::ServerStats& s) {
  py::dict d;
  d["submitted"] = s.submitted;
  d["ok"] = s.ok;
  d["failed"] = s.failed;
  d["rejected"] = s.rejected;
  d["timed_out"] = s.timed_out;
  d["cancelled"] = s.cancelled;
  d["batches"] = s.batches;
  d["failed_batches"] = s.failed_batches;
  d["batches_per_instance"] = s.batches_per_instance;
  d["busy_s"] = s.busy_s;
  d["devices"] = s.devices;
  d["busy_s_per_device"] = s.busy_s_per_device;
  d["batches_per_device"] = s.batches_per_device;
  d["uptime_s"] = s.uptime_s;
  d["stage_ms"] = s.stage_ms;
  d["model_ms"] = s.model_ms;
  d["output_ms"] = s.output_ms;
  d["checksum_failures"] = s.checksum_failures;
  d["checksum_error"] = s.checksum_error;
  d["path"] = s.path;
  py::dict q;
  q["enqueued"] = s.queue.enqueued;
  q["rejected_full"] = s.queue.rejected_full;
  q["timed_out"] = s.queue.timed_out;
  q["delayed"] = s.queue.delayed;
  q["cancelled"] = s.queue.cancelled;
  q["batches"] = s.queue.batches;
  q["batched_requests"] = s.queue.batched_requests;
  q["waiting"] = s.queue.waiting;
  q["max_waiting"] = s.queue.max_waiting;
  q["batch_size_counts"] = s.queue.batch_size_counts;
  d["queue"] = q;
  return d;
}

// The load generator driving a Python target: issue(ids, samples, priorities) is called with the
// GIL; the target answers through complete(), from any Python thread.
class PyTarget final : public serve::Target {
 public:
  explicit PyTarget(py::function issue) : issue_(std::move(issue)) {}
  ~PyTarget() override {
    py::gil_scoped_acquire gil;
    issue_ = py::function();
  }
  void issue(const serve::Query* queries, std::size_t n) override {
    std::vector<std::int64_t> ids(n), samples(n), priorities(n);
    for (std::size_t i = 0; i < n; ++i) {
      ids[i] = static_cast<std::int64_t>(queries[i].id);
      samples[i] = queries[i].sample;
      priorities[i] = queries[i].priority;
    }
    py::gil_scoped_acquire gil;
    issue_(ids, samples, priorities);
  }

 private:
  py::function issue_;
};

class PyLoadGenerator {
 public:
  PyLoadGenerator(const LoadOptions& options, py::function issue)
      : target_(std::make_unique<PyTarget>(std::move(issue))),
        generator_(std::make_unique<serve::LoadGenerator>(options, *target_)) {}
  serve::LoadGenerator& get() { return *generator_; }

 private:
  std::unique_ptr<PyTarget> target_;
  std::unique_ptr<serve::LoadGenerator> generator_;
};

std::string status_of(serve::QueryStatus s) { return serve::status_name(s); }

serve::QueryStatus parse_status(const std::string& name) {
  for (auto s : {serve::QueryStatus::kOk, serve::QueryStatus::kFailed, serve::QueryStatus::kRejected,
                 serve::QueryStatus::kTimedOut, serve::QueryStatus::kCancelled}) {
    if (name == serve::status_name(s)) return s;
  }
  TORCH_CHECK_VALUE(false, "status must be one of 'ok', 'failed', 'rejected', 'timed-out', 'cancelled', got '", name,
                    "'");
}

}  // namespace

void bind_serve(py::module_& m) {
  py::class_<BatcherOptions>(m, "BatcherOptions")
      .def(py::init<>())
      .def_readwrite("max_batch_size", &BatcherOptions::max_batch_size)
      .def_readwrite("max_queue_delay_us", &BatcherOptions::max_queue_delay_us)
      .def_readwrite("preferred_batch_sizes", &BatcherOptions::preferred_batch_sizes)
      .def_readwrite("buckets", &BatcherOptions::buckets)
      .def_readwrite("max_queue_size", &BatcherOptions::max_queue_size)
      .def_readwrite("priority_levels", &BatcherOptions::priority_levels)
      .def_readwrite("default_timeout_us", &BatcherOptions::default_timeout_us)
      .def_readwrite("idle_spin_us", &BatcherOptions::idle_spin_us)
      .def_property(
          "timeout_action",
          [](const BatcherOptions& o) { return o.timeout_action == serve::TimeoutAction::kReject ? "reject" : "delay"; },
          [](BatcherOptions& o, const std::string& v) {
            TORCH_CHECK_VALUE(v == "reject" || v == "delay", "timeout_action must be 'reject' or 'delay', got '", v,
                              "'");
            o.timeout_action = v == "reject" ? serve::TimeoutAction::kReject : serve::TimeoutAction::kDelay;
          })
      .def("validate", [](const BatcherOptions& o) { serve::validate(o); })
      .def("bucket_for", [](const BatcherOptions& o, std::int64_t length) { return serve::bucket_for(o, length); });

  py::class_<LoadOptions>(m, "LoadOptions")
      .def(py::init<>())
      .def_property(
          "scenario", [](const LoadOptions& o) { return std::string(serve::scenario_name(o.scenario)); },
          [](LoadOptions& o, const std::string& v) { o.scenario = serve::parse_scenario(v); })
      .def_property(
          "arrival", [](const LoadOptions& o) { return std::string(serve::arrival_name(o.arrival.kind)); },
          [](LoadOptions& o, const std::string& v) { o.arrival.kind = serve::parse_arrival(v); })
      .def_property(
          "rate", [](const LoadOptions& o) { return o.arrival.rate; },
          [](LoadOptions& o, double v) { o.arrival.rate = v; })
      .def_property(
          "burstiness", [](const LoadOptions& o) { return o.arrival.burstiness; },
          [](LoadOptions& o, double v) { o.arrival.burstiness = v; })
      .def_property(
          "ramp_to_rate", [](const LoadOptions& o) { return o.arrival.ramp_to_rate; },
          [](LoadOptions& o, double v) { o.arrival.ramp_to_rate = v; })
      .def_property(
          "ramp_duration_s", [](const LoadOptions& o) { return o.arrival.ramp_duration_s; },
          [](LoadOptions& o, double v) { o.arrival.ramp_duration_s = v; })
      .def_property(
          "spike_rate", [](const LoadOptions& o) { return o.arrival.spike_rate; },
          [](LoadOptions& o, double v) { o.arrival.spike_rate = v; })
      .def_property(
          "spike_start_s", [](const LoadOptions& o) { return o.arrival.spike_start_s; },
          [](LoadOptions& o, double v) { o.arrival.spike_start_s = v; })
      .def_property(
          "spike_duration_s", [](const LoadOptions& o) { return o.arrival.spike_duration_s; },
          [](LoadOptions& o, double v) { o.arrival.spike_duration_s = v; })
      .def_property(
          "intervals_s", [](const LoadOptions& o) { return o.arrival.intervals_s; },
          [](LoadOptions& o, std::vector<double> v) { o.arrival.intervals_s = std::move(v); })
      .def_readwrite("concurrency", &LoadOptions::concurrency)
      .def_readwrite("samples_per_query", &LoadOptions::samples_per_query)
      .def_readwrite("sample_count", &LoadOptions::sample_count)
      .def_readwrite("priority_weights", &LoadOptions::priority_weights)
      .def_readwrite("min_queries", &LoadOptions::min_queries)
      .def_readwrite("max_queries", &LoadOptions::max_queries)
      .def_readwrite("min_duration_s", &LoadOptions::min_duration_s)
      .def_readwrite("max_duration_s", &LoadOptions::max_duration_s)
      .def_readwrite("percentile", &LoadOptions::percentile)
      .def_readwrite("confidence", &LoadOptions::confidence)
      .def_readwrite("slo_ms", &LoadOptions::slo_ms)
      .def_readwrite("drain_timeout_s", &LoadOptions::drain_timeout_s)
      .def_readwrite("seed", &LoadOptions::seed)
      .def("validate", [](const LoadOptions& o) { serve::validate(o); });

  m.def(
      "arrival_offsets_s",
      [](const LoadOptions& o, std::int64_t count, std::uint64_t seed) {
        return serve::arrival_offsets_s(o.arrival, count, seed);
      },
      py::arg("options"), py::arg("count"), py::arg("seed") = 0,
      "Offsets (s) of the first `count` arrivals of the options' arrival process.");
  m.def("executor_devices", &serve::executor_devices, py::arg("devices"), py::arg("instances"),
        "The device of each executor of a server over `devices` with `instances` per device (interleaved).");
  m.def("early_stop_min_queries", &serve::early_stop_min_queries, py::arg("percentile"), py::arg("confidence"));
  m.attr("CHECKSUMS") = serve::kChecksums;
  m.def(
      "checksum_weights",
      [](std::int64_t numel, const std::string& device) {
        return torch_ext::checksum_weights(numel, c10::Device(device));
      },
      py::arg("numel"), py::arg("device") = "cpu",
      "The server's answer-checksum weights, [numel, CHECKSUMS] float64 on `device` (see server.h).");
  m.def(
      "early_stop",
      [](std::vector<double> values, double percentile, double confidence) {
        const serve::EarlyStop e = serve::early_stop(std::move(values), percentile, confidence);
        py::dict d;
        d["queries"] = e.queries;
        d["min_queries"] = e.min_queries;
        d["enough"] = e.enough;
        d["order"] = e.order;
        d["estimate"] = std::isnan(e.estimate) ? py::object(py::none()) : py::cast(e.estimate);
        return d;
      },
      py::arg("values"), py::arg("percentile"), py::arg("confidence"));

  py::class_<torch_ext::Future, std::shared_ptr<torch_ext::Future>>(m, "ServeFuture")
      .def("wait", &torch_ext::Future::wait, py::arg("timeout_s"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("done", &torch_ext::Future::done)
      .def_property_readonly("status", [](const torch_ext::Future& f) { return status_of(f.status()); })
      .def_property_readonly("error", &torch_ext::Future::error)
      .def_property_readonly("output", &torch_ext::Future::output)
      .def_property_readonly("queue_us", &torch_ext::Future::queue_us)
      .def_property_readonly("compute_us", &torch_ext::Future::compute_us)
      .def_property_readonly("batch_size", &torch_ext::Future::batch_size);

  py::class_<Server, ServerHolder>(m, "Server")
      .def(py::init([](const BatcherOptions& batcher, std::int64_t device,
                       const std::vector<std::tuple<at::ScalarType, std::vector<std::int64_t>, std::string>>& inputs,
                       std::int64_t instances, std::optional<py::function> fn,
                       std::optional<std::vector<std::vector<py::tuple>>> graphs, bool checksums,
                       const std::string& name, std::shared_ptr<torch_ext::TensorPool> pinned,
                       const std::vector<std::int64_t>& devices) {
             torch_ext::ServerOptions o;
             o.batcher = batcher;
             o.device = device;
             o.checksums = checksums;
             o.name = name;
             for (const auto& [dtype, shape, format] : inputs) {
               o.inputs.push_back(InputSpec{dtype, shape, parse_memory_format(format)});
             }
             TORCH_CHECK_VALUE(fn.has_value() != graphs.has_value(), name,
                               ": give either fn (a Python callable) or graphs (captured CUDA graphs), not both");
             std::vector<std::unique_ptr<Executor>> executors;
             if (fn) {
               TORCH_CHECK_VALUE(instances >= 1 && instances <= 64, name, ": instances must be in [1, 64], got ",
                                 instances);
               const std::vector<std::int64_t> of_executor =
                   devices.empty() ? std::vector<std::int64_t>(static_cast<std::size_t>(instances), device)
                                   : serve::executor_devices(devices, instances);
               if (!devices.empty()) o.executor_devices = of_executor;
               for (const std::int64_t d : of_executor) {
                 executors.push_back(std::make_unique<PyExecutor>(*fn, d, o.inputs));
               }
             } else {
               TORCH_CHECK_VALUE(!graphs->empty(), name, ": graphs must list the graphs of each instance");
               if (!devices.empty()) {
                 TORCH_CHECK_VALUE(graphs->size() % devices.size() == 0, name, ": graphs must list the graphs of ",
                                   "each executor, instances per device times ", devices.size(), " devices, got ",
                                   graphs->size());
                 o.executor_devices = serve::executor_devices(
                     devices, static_cast<std::int64_t>(graphs->size() / devices.size()));
               }
               for (const std::vector<py::tuple>& per_instance : *graphs) {
                 std::vector<torch_ext::GraphEntry> entries;
                 for (const py::tuple& t : per_instance) {
                   TORCH_CHECK_VALUE(t.size() == 5, name, ": a graph entry is (bucket, rows, exec, inputs, output)");
                   torch_ext::GraphEntry e;
                   e.bucket = t[0].cast<std::int64_t>();
                   e.rows = t[1].cast<std::int64_t>();
                   e.exec = t[2].cast<std::uintptr_t>();
                   e.inputs = t[3].cast<std::vector<at::Tensor>>();
                   e.output = t[4].cast<at::Tensor>();
                   entries.push_back(std::move(e));
                 }
                 const std::int64_t d = devices.empty() ? device : o.executor_devices[executors.size()];
                 executors.push_back(std::make_unique<torch_ext::GraphExecutor>(std::move(entries), d));
               }
             }
             return ServerHolder(new Server(std::move(o), std::move(executors), std::move(pinned)));
           }),
           py::arg("batcher"), py::arg("device"), py::arg("inputs"), py::arg("instances") = 1,
           py::arg("fn") = py::none(), py::arg("graphs") = py::none(), py::arg("checksums") = false,
           py::arg("name") = "Server", py::arg("pinned_pool"), py::arg("devices") = std::vector<std::int64_t>{})
      .def("submit", &Server::submit, py::arg("inputs"), py::arg("priority") = 0, py::arg("timeout_us") = -1)
      .def("add_sample", &Server::add_sample, py::arg("inputs"))
      .def_property_readonly("sample_count", &Server::sample_count)
      .def_property_readonly("instances", &Server::instances)
      .def_property_readonly("closed", &Server::closed)
      .def(
          "run_load",
          [](Server& s, const LoadOptions& options, bool records) {
            torch_ext::LoadRun run;
            {
              py::gil_scoped_release no_gil;
              run = s.run_load(options);
            }
            py::dict d = result_dict(run.result);
            d["busy_s"] = run.busy_s;
            d["busy_s_per_device"] = run.busy_s_per_device;
            d["batches_per_device"] = run.batches_per_device;
            d["wall_s"] = run.wall_s;
            d["records"] = records ? py::object(records_dict(run.records)) : py::object(py::none());
            return d;
          },
          py::arg("options"), py::arg("records") = false)
      .def("close", &Server::shutdown, py::arg("drain") = true, py::arg("timeout_s") = 30.0,
           py::call_guard<py::gil_scoped_release>())
      .def("stats", [](const Server& s) { return stats_dict(s.stats()); });

  py::class_<PyLoadGenerator>(m, "LoadGenerator")
      .def(py::init<const LoadOptions&, py::function>(), py::arg("options"), py::arg("issue"))
      .def(
          "run",
          [](PyLoadGenerator& g, bool records) {
            LoadResult r;
            std::vector<QueryRecord> recs;
            {
              py::gil_scoped_release no_gil;
              r = g.get().run();
              if (records) recs = g.get().records();
            }
            py::dict d = result_dict(r);
            d["records"] = records ? py::object(records_dict(recs)) : py::object(py::none());
            return d;
          },
          py::arg("records") = false)
      .def(
          "complete",
          [](PyLoadGenerator& g, std::int64_t id, const std::string& status, double queue_us, double compute_us,
             std::int64_t batch_size, const std::string& error, const std::vector<double>& checksum) {
            TORCH_CHECK_VALUE(checksum.size() <= static_cast<std::size_t>(serve::kChecksums),
                              "LoadGenerator.complete: checksum takes at most ", serve::kChecksums, " values, got ",
                              checksum.size());
            serve::Completion c;
            c.status = parse_status(status);
            c.queue_us = queue_us;
            c.compute_us = compute_us;
            c.batch_size = batch_size;
            c.error = error;
            std::copy(checksum.begin(), checksum.end(), c.checksum.begin());  // the rest stay NaN
            g.get().complete(static_cast<std::uint64_t>(id), c);
          },
          py::arg("id"), py::arg("status") = "ok", py::arg("queue_us") = -1.0, py::arg("compute_us") = -1.0,
          py::arg("batch_size") = 0, py::arg("error") = "", py::arg("checksum") = std::vector<double>{})
      .def("stop", [](PyLoadGenerator& g) { g.get().stop(); });
}

}  // namespace gpuopt::python
