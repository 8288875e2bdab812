#include "server.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <utility>

#include "device.h"

#ifdef GPUOPT_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "gpuopt/cuda.h"
#endif

namespace gpuopt::torch_ext {
namespace {

// The longest a batch may run on the GPU before it is failed (a hung kernel, a GPU deadlock).
constexpr double kBatchTimeoutS = 120.0;

double us_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

std::int64_t product(at::IntArrayRef sizes) {
  std::int64_t p = 1;
  for (const std::int64_t s : sizes) p *= s;
  return p;
}

// The strides of one row of a batch in `format`: those of a [1, *shape] tensor past the batch axis.
std::vector<std::int64_t> row_strides(at::IntArrayRef shape, at::MemoryFormat format, at::ScalarType dtype) {
  std::vector<std::int64_t> batch_shape{1};
  batch_shape.insert(batch_shape.end(), shape.begin(), shape.end());
  const at::Tensor meta = at::empty(batch_shape, at::TensorOptions().device(at::kMeta).dtype(dtype), format);
  return std::vector<std::int64_t>(meta.strides().begin() + 1, meta.strides().end());
}

// x * c mod 2^32 for x in [0, 2^32): two 16-bit halves of c, so no product reaches 2^63.
at::Tensor mul32(const at::Tensor& x, std::int64_t c) {
  const at::Tensor high = at::bitwise_left_shift(at::bitwise_and(x * (c >> 16), 0xFFFF), 16);
  return at::bitwise_and(x * (c & 0xFFFF) + high, 0xFFFFFFFFLL);
}

at::Tensor mix32(at::Tensor x) {
  x = at::bitwise_xor(x, at::bitwise_right_shift(x, 16));
  x = mul32(x, 0x7feb352d);
  x = at::bitwise_xor(x, at::bitwise_right_shift(x, 15));
  x = mul32(x, 0x846ca68b);
  return at::bitwise_xor(x, at::bitwise_right_shift(x, 16));
}

// The device of each executor: as given, or every executor on the server's device.
std::vector<std::int64_t> devices_of_executors(const ServerOptions& o, std::size_t executors) {
  return o.executor_devices.empty() ? std::vector<std::int64_t>(executors, o.device) : o.executor_devices;
}

std::vector<std::int64_t> distinct(const std::vector<std::int64_t>& values) {
  std::vector<std::int64_t> out;
  for (const std::int64_t v : values) {
    if (std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
  }
  return out;
}

std::vector<std::size_t> slots_of(const std::vector<std::int64_t>& of_executor, const std::vector<std::int64_t>& devices) {
  std::vector<std::size_t> out;
  for (const std::int64_t d : of_executor) {
    out.push_back(static_cast<std::size_t>(std::find(devices.begin(), devices.end(), d) - devices.begin()));
  }
  return out;
}

}  // namespace

std::vector<std::int64_t> output_row_shape(at::IntArrayRef out_shape, std::int64_t padded_length,
                                           std::int64_t length) {
  std::vector<std::int64_t> shape(out_shape.begin() + 1, out_shape.end());
  if (padded_length > 0 && !shape.empty() && shape[0] == padded_length) shape[0] = length;
  return shape;
}

at::Tensor checksum_weights(std::int64_t numel, at::Device device) {
  TORCH_CHECK_VALUE(numel >= 0 && numel <= (std::int64_t{1} << 32) / serve::kChecksums,
                    "checksum_weights: numel must be in [0, 2^32 / ", serve::kChecksums, "], got ", numel);
  const at::Tensor index = at::arange(numel * serve::kChecksums, at::TensorOptions().dtype(at::kLong).device(device));
  return (mix32(index).to(at::kDouble) / 4294967296.0 * 2.0 - 1.0).view({numel, serve::kChecksums});
}

at::Tensor answer_checksums(const at::Tensor& rows, const at::Tensor& numels, at::Tensor& weights) {
  TORCH_CHECK_VALUE(rows.dim() == 2, "answer_checksums: rows must be [n, row_numel], got ", rows.sizes());
  const std::int64_t row_numel = rows.size(1);
  if (!weights.defined() || weights.size(0) < row_numel || weights.device() != rows.device()) {
    std::int64_t capacity = 1024;  // grown by doubling: a new row size rarely rebuilds the weights
    while (capacity < row_numel) capacity *= 2;
    capacity = std::max(row_numel, std::min(capacity, (std::int64_t{1} << 32) / serve::kChecksums));
    weights = checksum_weights(capacity, rows.device());
  }
  // A copy even when rows is already float64: the tail is zeroed in place, and rows is the model's output.
  at::Tensor x = rows.to(at::kDouble, /*non_blocking=*/false, /*copy=*/true);
  if (numels.defined()) {
    const at::Tensor k = at::arange(row_numel, at::TensorOptions().dtype(at::kLong).device(rows.device()));
    x.masked_fill_(k.unsqueeze(0) >= numels.unsqueeze(1), 0.0);
  }
  return at::matmul(x, weights.narrow(0, 0, row_numel)).contiguous();
}

// ---- GraphExecutor ---------------------------------------------------------------------------------------

GraphExecutor::GraphExecutor(std::vector<GraphEntry> entries, std::int64_t device)
    : entries_(std::move(entries)), device_(device) {
  TORCH_CHECK_VALUE(!entries_.empty(), "GraphExecutor: no graphs given");
  for (GraphEntry& e : entries_) {
    TORCH_CHECK_VALUE(e.exec != 0, "GraphExecutor: a graph of ", e.rows, " rows has no executable (instantiate it)");
    TORCH_CHECK_VALUE(e.rows >= 1, "GraphExecutor: rows must be >= 1, got ", e.rows);
    TORCH_CHECK_VALUE(e.output.defined() && e.output.dim() >= 1 && e.output.size(0) == e.rows,
                      "GraphExecutor: the static output of the graph of ", e.rows,
                      " rows must have a batch axis of that size");
    TORCH_CHECK_VALUE(e.output.is_contiguous(), "GraphExecutor: the static output must be contiguous");
    for (at::Tensor& t : e.inputs) {
      TORCH_CHECK_VALUE(t.defined() && t.is_cuda() && t.dim() >= 1 && t.size(0) == e.rows,
                        "GraphExecutor: every static input of the graph of ", e.rows,
                        " rows must be a CUDA tensor with that batch size");
      t = t.detach();  // no Python object tied to what the executor thread holds
    }
    e.output = e.output.detach();
  }
  std::sort(entries_.begin(), entries_.end(), [](const GraphEntry& a, const GraphEntry& b) {
    return a.bucket != b.bucket ? a.bucket < b.bucket : a.rows < b.rows;
  });
}

const GraphEntry& GraphExecutor::pick(std::int64_t rows, std::int64_t bucket) const {
  for (const GraphEntry& e : entries_) {
    if (e.bucket == bucket && e.rows >= rows) return e;
  }
  GPUOPT_CHECK(false, "GraphExecutor: no graph captured for ", rows, " rows in bucket ", bucket);
  return entries_.front();  // unreachable
}

std::vector<at::Tensor> GraphExecutor::inputs(std::int64_t rows, std::int64_t bucket, std::int64_t padded_length) {
  (void)padded_length;
  return pick(rows, bucket).inputs;
}

at::Tensor GraphExecutor::run(std::int64_t rows, std::int64_t bucket, std::int64_t padded_length) {
  (void)padded_length;
  const GraphEntry& e = pick(rows, bucket);
#ifdef GPUOPT_WITH_CUDA
  cuda::graph_launch(reinterpret_cast<cudaGraphExec_t>(e.exec),
                     c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).stream());
#else
  GPUOPT_CHECK(false, "GraphExecutor: this build of gpuopt has no CUDA");
#endif
  return e.output;
}

// ---- Future -----------------------------------------------------------------------------------------------

bool Future::wait(double timeout_s) {
  TORCH_CHECK_VALUE(timeout_s >= 0 && std::isfinite(timeout_s), "Future.wait: timeout_s must be >= 0 and finite, got ",
                    timeout_s);
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return done_; });
}

bool Future::done() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return done_;
}
QueryStatus Future::status() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return status_;
}
std::string Future::error() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return error_;
}
at::Tensor Future::output() const {
  const std::lock_guard<std::mutex> lock(mu_);
  // A tensor of its own: a Python object tied to output_ would make the executor thread that drops
  // the future free a Python object.
  return output_.defined() ? output_.detach() : output_;
}
double Future::queue_us() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return queue_us_;
}
double Future::compute_us() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return compute_us_;
}
std::int64_t Future::batch_size() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return batch_size_;
}

void Future::set(QueryStatus status, std::string error, at::Tensor output, double queue_us, double compute_us,
                 std::int64_t batch_size) {
  {
    const std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    status_ = status;
    error_ = std::move(error);
    output_ = std::move(output);
    queue_us_ = queue_us;
    compute_us_ = compute_us;
    batch_size_ = batch_size;
    done_ = true;
  }
  cv_.notify_all();
}

// ---- the load generator's view of the server ------------------------------------------------------------

class Server::LoadTarget final : public serve::Target {
 public:
  explicit LoadTarget(Server& server) : server_(server) {}
  std::shared_ptr<serve::LoadGenerator> generator;

  void issue(const serve::Query* queries, std::size_t n) override {
    for (std::size_t i = 0; i < n; ++i) {
      const serve::Query& q = queries[i];
      Request r;
      r.inputs = server_.samples_.at(static_cast<std::size_t>(q.sample));
      r.length = server_.sample_lengths_[static_cast<std::size_t>(q.sample)];
      r.load = generator;
      r.load_id = q.id;
      server_.enqueue(std::move(r), q.priority, -1);  // a refusal is answered inside
    }
  }

 private:
  Server& server_;
};

// ---- Server -----------------------------------------------------------------------------------------------

Server::Server(ServerOptions options, std::vector<std::unique_ptr<Executor>> executors,
               std::shared_ptr<TensorPool> pinned)
    : options_(std::move(options)),
      executors_(std::move(executors)),
      executor_device_(devices_of_executors(options_, executors_.size())),
      devices_(distinct(executor_device_)),
      executor_slot_(slots_of(executor_device_, devices_)),
      busy_(std::max<std::size_t>(devices_.size(), 1)),
      pinned_(std::move(pinned)),
      queue_(options_.batcher),
      started_(Clock::now()) {
  const std::string& name = options_.name;
  TORCH_CHECK_VALUE(!executors_.empty(), name, ": instances must be >= 1, got 0 executors");
  for (const auto& e : executors_) TORCH_CHECK_VALUE(e != nullptr, name, ": an executor is null");
  TORCH_CHECK_VALUE(!options_.inputs.empty(), name, ": a request needs at least one input");
  TORCH_CHECK_VALUE(pinned_ != nullptr, name, ": the pinned pool is null");
  if (options_.device >= 0) {
    checked_cuda_device(options_.device, "Server device");
  } else {
    TORCH_CHECK_VALUE(options_.device == -1, name, ": device must be a CUDA index >= 0 or -1 for CPU, got ",
                      options_.device);
    TORCH_CHECK_VALUE(options_.executor_devices.empty(), name, ": executor devices are CUDA devices; a CPU server "
                      "(device -1) runs every executor on the CPU, got ", at::IntArrayRef(options_.executor_devices));
  }
  TORCH_CHECK_VALUE(options_.executor_devices.empty() || options_.executor_devices.size() == executors_.size(), name,
                    ": executor_devices must give the device of each of the ", executors_.size(), " executors, got ",
                    options_.executor_devices.size());
  for (const std::int64_t d : options_.executor_devices) checked_cuda_device(d, "Server executor device");
  const bool bucketed = !options_.batcher.buckets.empty();
  for (std::size_t k = 0; k < options_.inputs.size(); ++k) {
    const InputSpec& s = options_.inputs[k];
    if (bucketed) {
      TORCH_CHECK_VALUE(!s.sample_shape.empty(), name, ": with buckets every input's first axis is its sequence "
                        "axis, but input ", k, " is a scalar");
      TORCH_CHECK_VALUE(s.memory_format == at::MemoryFormat::Contiguous, name, ": input ", k,
                        " has a sequence axis and must be contiguous, got memory format ", s.memory_format);
    }
  }
  stats_.batches_per_instance.assign(executors_.size(), 0);
  checksum_weights_.resize(executors_.size());
  stats_.path = executors_.front()->path();
  threads_.reserve(executors_.size());
  for (std::size_t i = 0; i < executors_.size(); ++i) threads_.emplace_back([this, i] { run_instance(i); });
}

Server::~Server() {
  try {
    shutdown(false, 0);
  } catch (...) {  // a destructor must not throw; shutdown only fails on a broken invariant
  }
}

bool Server::closed() const { return closed_.load(); }

std::int64_t Server::checked_length(const std::vector<at::Tensor>& inputs, const char* what) const {
  const std::string& name = options_.name;
  TORCH_CHECK_VALUE(inputs.size() == options_.inputs.size(), name, ".", what, ": expected ", options_.inputs.size(),
                    " input tensor(s) per request, got ", inputs.size());
  const bool bucketed = !options_.batcher.buckets.empty();
  std::int64_t length = 0;
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    const at::Tensor& t = inputs[k];
    const InputSpec& s = options_.inputs[k];
    TORCH_CHECK_VALUE(t.defined(), name, ".", what, ": input ", k, " is undefined");
    TORCH_CHECK_VALUE(t.device().is_cpu(), name, ".", what, ": request inputs must be CPU tensors (they are staged "
                      "through pinned memory), input ", k, " is on ", t.device());
    TORCH_CHECK_VALUE(t.dim() == static_cast<std::int64_t>(s.sample_shape.size()), name, ".", what, ": input ", k,
                      " must have the sample shape ", at::IntArrayRef(s.sample_shape), " (no batch axis), got ",
                      t.sizes());
    const std::size_t fixed_from = bucketed ? 1 : 0;
    for (std::size_t d = fixed_from; d < s.sample_shape.size(); ++d) {
      TORCH_CHECK_VALUE(t.size(static_cast<std::int64_t>(d)) == s.sample_shape[d], name, ".", what, ": input ", k,
                        " must have the sample shape ", at::IntArrayRef(s.sample_shape),
                        bucketed ? " (any length on axis 0)" : "", ", got ", t.sizes());
    }
    if (bucketed) {
      const std::int64_t l = t.size(0);
      TORCH_CHECK_VALUE(l >= 1, name, ".", what, ": input ", k, " has length 0");
      TORCH_CHECK_VALUE(k == 0 || l == length, name, ".", what, ": every input of a request must have the same "
                        "length on axis 0; input 0 has ", length, ", input ", k, " has ", l);
      length = l;
    }
  }
  return length;
}

std::vector<at::Tensor> Server::to_rows(const std::vector<at::Tensor>& inputs) {
  std::vector<at::Tensor> rows;
  rows.reserve(inputs.size());
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    const InputSpec& s = options_.inputs[k];
    const at::Tensor& t = inputs[k];
    at::Tensor flat = pinned_->empty({std::max<std::int64_t>(t.numel(), 1)}, s.dtype);
    at::Tensor row = flat.as_strided(t.sizes(), row_strides(t.sizes(), s.memory_format, s.dtype), 0);
    row.copy_(t);  // casts to the server's dtype
    rows.push_back(std::move(row));
  }
  return rows;
}

std::shared_ptr<Future> Server::submit(const std::vector<at::Tensor>& inputs, std::int64_t priority,
                                       std::int64_t timeout_us) {
  auto future = std::make_shared<Future>();
  Request r;
  r.length = checked_length(inputs, "submit");
  if (r.length > 0) serve::bucket_for(options_.batcher, r.length);  // a ValueError naming the length, up front
  r.inputs = to_rows(inputs);
  r.future = future;
  enqueue(std::move(r), priority, timeout_us);
  return future;
}

std::int64_t Server::add_sample(const std::vector<at::Tensor>& inputs) {
  const std::int64_t length = checked_length(inputs, "add_sample");
  if (length > 0) serve::bucket_for(options_.batcher, length);
  std::vector<at::Tensor> rows = to_rows(inputs);
  const std::lock_guard<std::mutex> lock(requests_mu_);
  samples_.push_back(std::move(rows));
  sample_lengths_.push_back(length);
  return static_cast<std::int64_t>(samples_.size()) - 1;
}

std::int64_t Server::sample_count() const {
  const std::lock_guard<std::mutex> lock(requests_mu_);
  return static_cast<std::int64_t>(samples_.size());
}

QueryStatus Server::enqueue(Request request, std::int64_t priority, std::int64_t timeout_us) {
  serve::QueuedRequest q;
  q.length = request.length;
  q.priority = priority;
  q.timeout_us = timeout_us;
  {
    const std::lock_guard<std::mutex> lock(requests_mu_);
    q.id = next_id_++;
    requests_.emplace(q.id, std::move(request));
  }
  {
    const std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.submitted;
  }
  serve::EnqueueStatus status;
  try {
    status = queue_.enqueue(q);
  } catch (...) {  // a priority or timeout out of range: the caller's error, raised to them
    const std::lock_guard<std::mutex> lock(requests_mu_);
    requests_.erase(q.id);
    const std::lock_guard<std::mutex> slock(stats_mu_);
    --stats_.submitted;
    throw;
  }
  if (status == serve::EnqueueStatus::kAccepted) return QueryStatus::kPending;
  Request r;
  {
    const std::lock_guard<std::mutex> lock(requests_mu_);
    auto it = requests_.find(q.id);
    if (it == requests_.end()) return QueryStatus::kCancelled;  // shutdown took it and answered it
    r = std::move(it->second);
    requests_.erase(it);
  }
  const bool full = status == serve::EnqueueStatus::kQueueFull;
  const std::string error = full ? detail::cat(options_.name, ": queue full (max_queue_size=", options_.batcher.max_queue_size,
                              " requests waiting); request rejected")
                : detail::cat(options_.name, " is closed; request not accepted");
  const QueryStatus s = full ? QueryStatus::kRejected : QueryStatus::kCancelled;
  answer(r, s, error, -1, -1, 0);
  return s;
}

void Server::answer(Request& r, QueryStatus status, const std::string& error, double queue_us, double compute_us,
                    std::int64_t batch_size, at::Tensor output, const serve::Checksums& checksum) {
  {
    const std::lock_guard<std::mutex> lock(stats_mu_);
    switch (status) {
      case QueryStatus::kOk: ++stats_.ok; break;
      case QueryStatus::kFailed: ++stats_.failed; break;
      case QueryStatus::kRejected: ++stats_.rejected; break;
      case QueryStatus::kTimedOut: ++stats_.timed_out; break;
      default: ++stats_.cancelled; break;
    }
  }
  if (r.future) r.future->set(status, error, std::move(output), queue_us, compute_us, batch_size);
  if (r.load) {
    serve::Completion c;
    c.status = status;
    c.queue_us = queue_us;
    c.compute_us = compute_us;
    c.batch_size = batch_size;
    c.checksum = checksum;
    c.error = error;
    r.load->complete(r.load_id, c);
  }
}

void Server::run_instance(std::size_t instance) {
  cuda::StreamHandle copy_stream = nullptr;
#ifdef GPUOPT_WITH_CUDA
  std::optional<c10::cuda::CUDAGuard> device_guard;
  std::optional<c10::cuda::CUDAStreamGuard> stream_guard;
  if (executor_device_[instance] >= 0) {
    const auto device = static_cast<c10::DeviceIndex>(executor_device_[instance]);
    device_guard.emplace(device);
    stream_guard.emplace(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device));
    copy_stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device).stream();
  }
#endif
  std::vector<serve::QueuedRequest> expired;
  while (true) {
    expired.clear();
    std::optional<serve::Batch> batch = queue_.next_batch(0.1, &expired);
    for (const serve::QueuedRequest& e : expired) {
      Request r;
      {
        const std::lock_guard<std::mutex> lock(requests_mu_);
        auto it = requests_.find(e.id);
        if (it == requests_.end()) continue;
        r = std::move(it->second);
        requests_.erase(it);
      }
      const std::int64_t timeout = e.timeout_us == -1 ? options_.batcher.default_timeout_us : e.timeout_us;
      const double waited = us_between(e.enqueued, Clock::now());
      answer(r, QueryStatus::kTimedOut,
             detail::cat(options_.name, ": timed out after ", static_cast<std::int64_t>(waited),
                         " us in the queue (timeout ", timeout, " us, timeout_action=reject)"),
             waited, -1, 0);
    }
    if (!batch) {
      // nullopt also follows expiries; stop once closed and empty (shutdown cancels what a closing
      // without drain leaves).
      if (queue_.closed() && queue_.waiting() == 0) break;
      continue;
    }
    run_batch(instance, *batch, copy_stream);
  }
}

void Server::run_batch(std::size_t instance, serve::Batch& batch, cuda::StreamHandle copy_stream) {
  const Clock::time_point start = Clock::now();
  std::vector<Request> reqs;
  std::vector<serve::QueuedRequest> queued;  // parallel to reqs
  reqs.reserve(batch.requests.size());
  std::int64_t dropped = 0;
  {
    const std::lock_guard<std::mutex> lock(requests_mu_);
    for (const serve::QueuedRequest& q : batch.requests) {
      auto it = requests_.find(q.id);
      if (it == requests_.end()) continue;  // answered by shutdown already
      if (it->second.load && it->second.load->finished()) {
        ++dropped;  // its load run is over (counted lost there): serving it would load the next run
      } else {
        reqs.push_back(std::move(it->second));
        queued.push_back(q);
      }
      requests_.erase(it);
    }
  }
  if (dropped > 0) {
    const std::lock_guard<std::mutex> lock(stats_mu_);
    stats_.cancelled += dropped;
  }
  const auto n = static_cast<std::int64_t>(reqs.size());
  if (n == 0) return;
  const std::int64_t padded = options_.batcher.buckets.empty() ? 0 : batch.padded_length;
  Executor& exec = *executors_[instance];
  const std::int64_t device = executor_device_[instance];
  busy_.begin(executor_slot_[instance]);
  std::string error;
  at::Tensor host_out;
  at::Tensor host_sums;  // [n, kChecksums] float64 on the host, when this batch's answers get checksums
  std::vector<std::int64_t> numels(reqs.size());  // each answer's elements: a prefix of its output row
  Clock::time_point staged{}, ran{}, done{};
  std::int64_t row_numel = 0;
  at::ScalarType out_dtype = at::kFloat;
  std::vector<std::int64_t> out_shape;
#ifdef GPUOPT_WITH_CUDA
  const bool on_cuda = device >= 0;
  cuda::StreamHandle exec_stream = nullptr;
  if (on_cuda) exec_stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
#else
  (void)copy_stream;
#endif
  try {
    std::vector<at::Tensor> dst = exec.inputs(n, batch.bucket, padded);
    TORCH_CHECK_VALUE(dst.size() == options_.inputs.size(), options_.name, ": the executor gave ", dst.size(),
                      " input tensors for ", options_.inputs.size(), " inputs");
    for (std::size_t k = 0; k < dst.size(); ++k) {
      const at::Tensor& d = dst[k];
      TORCH_CHECK(d.dim() >= 1 && d.size(0) >= n, options_.name, ": input buffer ", k, " of shape ", d.sizes(),
                  " cannot hold ", n, " rows");
      TORCH_CHECK(d.stride(0) == product(d.sizes().slice(1)) && d.is_non_overlapping_and_dense(), options_.name,
                  ": input buffer ", k, " is not dense by rows (shape ", d.sizes(), ", strides ", d.strides(), ")");
      const std::int64_t elem = static_cast<std::int64_t>(d.element_size());
      const std::int64_t row_bytes = d.stride(0) * elem;
      auto* base = static_cast<char*>(d.data_ptr());
      for (std::int64_t r = 0; r < n; ++r) {
        const at::Tensor& src = reqs[static_cast<std::size_t>(r)].inputs[k];
        const std::int64_t bytes = src.numel() * elem;
        TORCH_CHECK(bytes <= row_bytes, options_.name, ": a request row of ", bytes, " bytes exceeds the batch row (",
                    row_bytes, " bytes)");
        char* row = base + r * row_bytes;
#ifdef GPUOPT_WITH_CUDA
        if (on_cuda) {
          cuda::copy_async(row, src.data_ptr(), static_cast<std::size_t>(bytes), copy_stream);
          if (bytes < row_bytes) {
            cuda::memset_async(row + bytes, 0, static_cast<std::size_t>(row_bytes - bytes), copy_stream);
          }
          continue;
        }
#endif
        std::memcpy(row, src.data_ptr(), static_cast<std::size_t>(bytes));
        if (bytes < row_bytes) std::memset(row + bytes, 0, static_cast<std::size_t>(row_bytes - bytes));
      }
    }
#ifdef GPUOPT_WITH_CUDA
    cuda::EventHandle copied = nullptr;
    if (on_cuda) {
      copied = cuda::acquire_event(static_cast<int>(device));
      cuda::record_event(copied, copy_stream);
      cuda::stream_wait_event(exec_stream, copied);
      // Recycled at once: cudaStreamWaitEvent took its snapshot, a later record does not change it.
      cuda::release_event(static_cast<int>(device), copied);
    }
#endif
    dst.clear();
    staged = Clock::now();
    at::Tensor out = exec.run(n, batch.bucket, padded);
    TORCH_CHECK(out.defined() && out.dim() >= 1 && out.size(0) >= n, options_.name,
                ": the model's output must be a tensor with a batch axis of at least ", n, " rows, got ",
                out.defined() ? out.sizes() : at::IntArrayRef{});
    if (!out.is_contiguous()) out = out.contiguous();
    out_dtype = out.scalar_type();
    out_shape.assign(out.sizes().begin(), out.sizes().end());
    row_numel = product(out.sizes().slice(1));
    const std::int64_t out_bytes = n * row_numel * static_cast<std::int64_t>(out.element_size());
    bool cut = false, want_sums = false;
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      numels[i] = product(output_row_shape(out_shape, padded, reqs[i].length));
      cut = cut || numels[i] != row_numel;
      want_sums = want_sums || reqs[i].load != nullptr;
    }
    want_sums = want_sums && options_.checksums && (at::isFloatingType(out_dtype) || at::isIntegralType(out_dtype, true));
    // On the output's device, queued after the model on its stream: only [n, kChecksums] comes back.
    at::Tensor sums;
    auto checksums_of_batch = [&] {
      at::Tensor numels_on_device;
      if (cut) {
        at::Tensor host_numels = pinned_->empty({n}, at::kLong);  // fenced on this stream when freed
        std::copy(numels.begin(), numels.end(), host_numels.data_ptr<std::int64_t>());
        numels_on_device = at::empty({n}, at::TensorOptions().dtype(at::kLong).device(out.device()));
#ifdef GPUOPT_WITH_CUDA
        if (on_cuda && out.device().is_cuda()) {
          cuda::copy_async(numels_on_device.data_ptr(), host_numels.data_ptr(), static_cast<std::size_t>(n) * 8,
                           exec_stream);
        } else {
          numels_on_device.copy_(host_numels);
        }
#else
        numels_on_device.copy_(host_numels);
#endif
      }
      sums = answer_checksums(out.narrow(0, 0, n).reshape({n, row_numel}), numels_on_device,
                              checksum_weights_[instance]);
    };
    // A batch whose checksums cannot be computed (no memory for the float64 copy, say) keeps NaN
    // checksums -- verification counts those answers as mismatched -- and its answers still go out.
    auto compute_checksums = [&] {
      if (!want_sums) return;
      try {
        checksums_of_batch();
      } catch (const std::exception& e) {
        sums = at::Tensor();
        const std::lock_guard<std::mutex> lock(stats_mu_);
        ++stats_.checksum_failures;
        if (stats_.checksum_error.empty()) stats_.checksum_error = e.what();
      }
    };
#ifdef GPUOPT_WITH_CUDA
    if (on_cuda) {
      TORCH_CHECK(out.device().is_cuda(), options_.name, ": the model's output is on ", out.device(),
                  ", expected the server's CUDA device");
      compute_checksums();
      host_out = pinned_->empty({std::max<std::int64_t>(out_bytes, 1)}, at::kByte);
      cuda::copy_async(host_out.data_ptr(), out.data_ptr(), static_cast<std::size_t>(out_bytes), exec_stream);
      if (sums.defined()) {
        host_sums = pinned_->empty({n, serve::kChecksums}, at::kDouble);
        cuda::copy_async(host_sums.data_ptr(), sums.data_ptr(), static_cast<std::size_t>(sums.nbytes()), exec_stream);
      }
      ran = Clock::now();
      const int dev = static_cast<int>(device);
      cuda::EventHandle finished = cuda::acquire_event(dev);
      try {
        cuda::record_event(finished, exec_stream);
        // Bounded: a hung kernel fails its batch instead of hanging the server. What the batch used
        // stays safe: pool blocks are fenced on this stream, static buffers belong to the executor.
        TORCH_CHECK(cuda::wait_event(finished, kBatchTimeoutS), options_.name, ": the batch of ", n,
                    " did not finish on the GPU within ", kBatchTimeoutS, " s");
      } catch (...) {
        cuda::release_event(dev, finished);
        throw;
      }
      cuda::release_event(dev, finished);
    }
#endif
    if (!host_out.defined()) {
      TORCH_CHECK(out.device().is_cpu(), options_.name, ": the model's output is on ", out.device(),
                  ", expected CPU");
      host_out = out;
      ran = Clock::now();
      compute_checksums();  // on the host: output time
      host_sums = sums;
    }
    exec.finish();
  } catch (const std::exception& e) {
    error = e.what();
#ifdef GPUOPT_WITH_CUDA
    if (on_cuda) {  // nothing may still read the request rows or buffers once they are released
      try {
        cuda::synchronize_stream(copy_stream);
        cuda::synchronize_stream(exec_stream);
      } catch (...) {
      }
    }
#endif
    try {
      exec.finish();
    } catch (...) {
    }
  }
  done = Clock::now();
  busy_.end(executor_slot_[instance]);
  const double compute_us = us_between(start, done);
  {
    const std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.batches;
    ++stats_.batches_per_instance[instance];
    if (!error.empty()) ++stats_.failed_batches;
    if (staged != Clock::time_point{}) stats_.stage_ms += us_between(start, staged) / 1e3;
    if (ran != Clock::time_point{}) stats_.model_ms += us_between(staged, ran) / 1e3;
    if (ran != Clock::time_point{}) stats_.output_ms += us_between(ran, done) / 1e3;
  }
  if (!error.empty()) {
    const std::string message = detail::cat("the model failed on a batch of ", n, ": ", error);
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      answer(reqs[i], QueryStatus::kFailed, message, us_between(queued[i].enqueued, start), compute_us, n);
    }
    return;
  }
  const std::int64_t elem = static_cast<std::int64_t>(c10::elementSize(out_dtype));
  const auto* base = static_cast<const char*>(host_out.data_ptr());
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    Request& r = reqs[i];
    const char* row = base + static_cast<std::int64_t>(i) * row_numel * elem;
    const std::vector<std::int64_t> shape = output_row_shape(out_shape, padded, r.length);
    const std::int64_t numel = numels[i];
    const double queue_us = us_between(queued[i].enqueued, start);
    at::Tensor copy;
    if (r.future) {
      try {
        copy = at::empty(shape, at::TensorOptions().dtype(out_dtype));
      } catch (const std::exception& e) {  // out of host memory: this request fails, the others go on
        answer(r, QueryStatus::kFailed, detail::cat("its output could not be returned: ", e.what()), queue_us,
               compute_us, n);
        continue;
      }
      std::memcpy(copy.data_ptr(), row, static_cast<std::size_t>(numel * elem));
    }
    serve::Checksums checksum = serve::no_checksums();
    if (r.load && host_sums.defined()) {
      const double* sums_row = host_sums.data_ptr<double>() + static_cast<std::int64_t>(i) * serve::kChecksums;
      std::copy(sums_row, sums_row + serve::kChecksums, checksum.begin());
    }
    answer(r, QueryStatus::kOk, "", queue_us, compute_us, n, std::move(copy), checksum);
  }
}

LoadRun Server::run_load(serve::LoadOptions options) {
  const std::int64_t samples = sample_count();
  TORCH_CHECK_VALUE(samples > 0, options_.name, ".run_load: add samples first (add_sample)");
  TORCH_CHECK_VALUE(!closed(), options_.name, ".run_load: the server is closed");
  options.sample_count = samples;
  LoadTarget target(*this);
  auto generator = std::make_shared<serve::LoadGenerator>(options, target);
  target.generator = generator;
  const ServerStats before = stats();
  const Clock::time_point t0 = Clock::now();
  LoadRun run;
  run.result = generator->run();
  run.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  const ServerStats after = stats();
  run.busy_s = after.busy_s - before.busy_s;
  for (std::size_t d = 0; d < after.devices.size(); ++d) {
    run.busy_s_per_device.push_back(after.busy_s_per_device[d] - before.busy_s_per_device[d]);
    run.batches_per_device.push_back(after.batches_per_device[d] - before.batches_per_device[d]);
  }
  run.records = generator->records();
  return run;
}

void Server::shutdown(bool drain, double timeout_s) {
  TORCH_CHECK_VALUE(timeout_s >= 0 && std::isfinite(timeout_s), options_.name,
                    ".close: timeout_s must be >= 0 and finite, got ", timeout_s);
  const std::lock_guard<std::mutex> lock(shutdown_mu_);
  closed_ = true;
  queue_.close(drain);
  if (drain) {  // served by the executors, bounded by timeout_s; what is left then is cancelled
    const Clock::time_point deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                          std::chrono::duration<double>(timeout_s));
    while (queue_.waiting() > 0 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (const serve::QueuedRequest& q : queue_.cancel()) {
    Request r;
    {
      const std::lock_guard<std::mutex> rlock(requests_mu_);
      auto it = requests_.find(q.id);
      if (it == requests_.end()) continue;
      r = std::move(it->second);
      requests_.erase(it);
    }
    answer(r, QueryStatus::kCancelled,
           detail::cat(options_.name, " shut down before this request was served (", drain ? "drain timed out" : "cancel",
                       ")"),
           us_between(q.enqueued, Clock::now()), -1, 0);
  }
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();  // each finishes the batch it is running
  }
  std::vector<Request> left;
  {
    const std::lock_guard<std::mutex> rlock(requests_mu_);
    for (auto& [id, r] : requests_) left.push_back(std::move(r));
    requests_.clear();
  }
  for (Request& r : left) answer(r, QueryStatus::kCancelled, options_.name + " shut down", -1, -1, 0);
}

ServerStats Server::stats() const {
  ServerStats s;
  {
    const std::lock_guard<std::mutex> lock(stats_mu_);
    s = stats_;
  }
  const serve::BusyClock::Reading busy = busy_.read();
  s.busy_s = busy.any_s;
  s.devices = devices_;
  s.busy_s_per_device = busy.device_s;
  s.batches_per_device = busy.batches;
  s.uptime_s = std::chrono::duration<double>(Clock::now() - started_).count();
  s.queue = queue_.stats();
  return s;
}

}  // namespace gpuopt::torch_ext
