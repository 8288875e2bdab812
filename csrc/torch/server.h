// The serving engine: gpuopt::serve::BatchQueue forms batches, `instances` executor threads each run
// one batch at a time on their own CUDA stream (copies on a copy stream of their own, so one
// instance's copies overlap another's compute), and outputs are scattered back to each request.
// Executors may serve different GPUs (ServerOptions::executor_devices, each with the model's replica
// there): the first free executor takes the next batch, so a busier or slower GPU takes fewer.
//
// A request's inputs live in pinned host memory from gpuopt's pinned pool, laid out as one row of
// the batch (the batch's memory format), so staging a batch is one DMA per request and input, plus
// a memset of the padding when sequences are bucketed. Outputs come back in one copy per batch.
//
// How a batch runs is an Executor's: a CUDA graph replayed from C++ (no GIL), or a Python callable
// (csrc/python, with the GIL). Every wait is bounded; shutdown drains or cancels; a batch that fails
// fails its own requests and the server goes on.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "gpuopt/batcher.h"
#include "gpuopt/busy.h"
#include "gpuopt/cuda_fwd.h"
#include "gpuopt/loadgen.h"
#include "pools.h"

namespace gpuopt::torch_ext {

using serve::Clock;
using serve::QueryStatus;

// One input of a request: its dtype, a sample's shape (with sequences: the first axis is the length,
// and its value here is only an example), and the memory format of the batch tensor.
struct InputSpec {
  at::ScalarType dtype = at::kFloat;
  std::vector<std::int64_t> sample_shape;
  at::MemoryFormat memory_format = at::MemoryFormat::Contiguous;
};

// Runs the batches of one instance, on that instance's thread only.
class Executor {
 public:
  virtual ~Executor() = default;
  // "cuda-graph" (replayed from C++, no GIL) or "python" (a Python callable, with the GIL).
  virtual const char* path() const = 0;
  // The batch tensors to stage `rows` requests into (padded to `padded_length` when bucketed, 0
  // otherwise): row r of input k is written at inputs[k][r]. A graph executor returns the static
  // buffers of the graph whose batch is the smallest captured one >= rows (rows beyond `rows` keep
  // old data: rows are independent).
  virtual std::vector<at::Tensor> inputs(std::int64_t rows, std::int64_t bucket, std::int64_t padded_length) = 0;
  // Runs the model on what inputs() returned, on the current stream; rows [0, rows) of the result
  // are the batch's outputs. May throw: the batch's requests then fail with the message.
  virtual at::Tensor run(std::int64_t rows, std::int64_t bucket, std::int64_t padded_length) = 0;
  // Drops what the last batch held (called after its outputs were copied out).
  virtual void finish() {}
};

// One CUDA graph captured (in Python, with torch.cuda.graph) for a batch of `rows` requests of one
// bucket: its instantiated executable (torch.cuda.CUDAGraph.raw_cuda_graph_exec()), the static input
// buffers it reads and the static output it writes. The owner of the graph keeps it alive.
struct GraphEntry {
  std::int64_t bucket = -1;
  std::int64_t rows = 0;
  std::uintptr_t exec = 0;
  std::vector<at::Tensor> inputs;
  at::Tensor output;
};

// Replays, from C++ and without the GIL, the smallest captured graph that holds the batch.
// torch's CUDAGraph.replay() also advances the RNG offsets of graphs that draw random numbers; a
// served model in eval mode draws none, and replay from here does not.
class GraphExecutor final : public Executor {
 public:
  GraphExecutor(std::vector<GraphEntry> entries, std::int64_t device);
  const char* path() const override { return "cuda-graph"; }
  std::vector<at::Tensor> inputs(std::int64_t rows, std::int64_t bucket, std::int64_t padded_length) override;
  at::Tensor run(std::int64_t rows, std::int64_t bucket, std::int64_t padded_length) override;
  std::int64_t graphs() const { return static_cast<std::int64_t>(entries_.size()); }

 private:
  const GraphEntry& pick(std::int64_t rows, std::int64_t bucket) const;
  std::vector<GraphEntry> entries_;  // by (bucket, rows)
  std::int64_t device_;
};

struct ServerOptions {
  serve::BatcherOptions batcher;
  std::int64_t device = -1;  // CUDA device index; -1: CPU
  // The CUDA device of each executor (serve::executor_devices); empty: every executor on `device`.
  std::vector<std::int64_t> executor_devices;
  std::vector<InputSpec> inputs;
  bool checksums = false;    // each load-generator answer's checksums (answer_checksums) in its record
  std::string name = "Server";
};

// What a Python caller holds for one request.
class Future {
 public:
  // Waits up to timeout_s (>= 0) for the answer; true when it came.
  bool wait(double timeout_s);
  bool done() const;
  QueryStatus status() const;
  std::string error() const;
  at::Tensor output() const;  // CPU; undefined unless ok
  double queue_us() const, compute_us() const;
  std::int64_t batch_size() const;

 private:
  friend class Server;
  void set(QueryStatus status, std::string error, at::Tensor output, double queue_us, double compute_us,
           std::int64_t batch_size);
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  QueryStatus status_ = QueryStatus::kPending;
  std::string error_;
  at::Tensor output_;
  double queue_us_ = -1, compute_us_ = -1;
  std::int64_t batch_size_ = 0;
};

struct ServerStats {
  std::int64_t submitted = 0, ok = 0, failed = 0, rejected = 0, timed_out = 0, cancelled = 0;
  std::int64_t batches = 0, failed_batches = 0;
  std::vector<std::int64_t> batches_per_instance;
  double busy_s = 0;     // time with at least one batch in service (staging to outputs)
  std::vector<std::int64_t> devices;             // the server's devices, in order (-1: CPU)
  std::vector<double> busy_s_per_device;         // per device: time with a batch in service there
  std::vector<std::int64_t> batches_per_device;  // per device: batches served (failed ones included)
  double uptime_s = 0;   // since the server started
  double stage_ms = 0, model_ms = 0, output_ms = 0;  // summed over batches (host time per phase)
  std::int64_t checksum_failures = 0;  // batches whose answer checksums could not be computed (left NaN)
  std::string checksum_error;          // the first such failure's reason
  std::string path;
  serve::BatcherStats queue;
};

struct LoadRun {
  serve::LoadResult result;
  std::vector<serve::QueryRecord> records;
  double busy_s = 0;  // the server's busy time during the run
  std::vector<double> busy_s_per_device;         // during the run, per device (ServerStats::devices)
  std::vector<std::int64_t> batches_per_device;  // during the run, per device
  double wall_s = 0;
};

class Server {
 public:
  // One executor per instance; `pinned` is the pinned pool requests are staged through (a plain
  // host pool on CPU servers).
  Server(ServerOptions options, std::vector<std::unique_ptr<Executor>> executors, std::shared_ptr<TensorPool> pinned);
  ~Server();  // shutdown(drain=false): must be called without the GIL when executors need it
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // A request (CPU tensors, one per input, in the InputSpec order; copied here). The future is
  // already done (kRejected) when the queue is full, (kCancelled) when the server is closed.
  std::shared_ptr<Future> submit(const std::vector<at::Tensor>& inputs, std::int64_t priority, std::int64_t timeout_us);
  // A sample for run_load(), converted to pinned rows once; returns its index.
  std::int64_t add_sample(const std::vector<at::Tensor>& inputs);
  std::int64_t sample_count() const;
  // Drives the server with the load generator over the added samples (sample_count is set from them).
  LoadRun run_load(serve::LoadOptions options);
  // Closes the queue; drain=true serves what waits (up to timeout_s), then cancels the rest; waits
  // for the executors (each finishes the batch it runs). Idempotent.
  void shutdown(bool drain, double timeout_s);
  bool closed() const;
  ServerStats stats() const;
  const ServerOptions& options() const { return options_; }
  std::int64_t instances() const { return static_cast<std::int64_t>(executors_.size()); }

 private:
  struct Request {
    std::vector<at::Tensor> inputs;  // pinned rows
    std::int64_t length = 0;
    std::shared_ptr<Future> future;
    std::shared_ptr<serve::LoadGenerator> load;  // kept alive: a late answer reaches a live generator
    std::uint64_t load_id = 0;
  };
  class LoadTarget;

  std::int64_t checked_length(const std::vector<at::Tensor>& inputs, const char* what) const;
  std::vector<at::Tensor> to_rows(const std::vector<at::Tensor>& inputs);
  // Queues a request; a refusal (full, closed) is answered here and returned.
  QueryStatus enqueue(Request request, std::int64_t priority, std::int64_t timeout_us);
  // The one place a request is answered (its future and/or its load generator), and counted.
  void answer(Request& r, QueryStatus status, const std::string& error, double queue_us, double compute_us,
              std::int64_t batch_size, at::Tensor output = {}, const serve::Checksums& checksum = serve::no_checksums());
  void run_instance(std::size_t instance);
  void run_batch(std::size_t instance, serve::Batch& batch, cuda::StreamHandle copy_stream);

  ServerOptions options_;
  std::vector<std::unique_ptr<Executor>> executors_;
  std::vector<std::int64_t> executor_device_;  // per executor: its CUDA device, -1 on the CPU
  std::vector<std::int64_t> devices_;          // the distinct devices, in order of first executor
  std::vector<std::size_t> executor_slot_;     // per executor: its device's index in devices_
  serve::BusyClock busy_;
  std::shared_ptr<TensorPool> pinned_;
  serve::BatchQueue queue_;
  const Clock::time_point started_;

  mutable std::mutex requests_mu_;
  std::unordered_map<std::uint64_t, Request> requests_;
  std::uint64_t next_id_ = 0;
  std::vector<std::vector<at::Tensor>> samples_;
  std::vector<at::Tensor> checksum_weights_;  // per instance (its thread only), on the server's device
  std::vector<std::int64_t> sample_lengths_;

  mutable std::mutex stats_mu_;
  ServerStats stats_;  // its busy and per-device figures are busy_'s

  std::mutex shutdown_mu_;
  std::atomic<bool> closed_{false};
  std::vector<std::thread> threads_;  // last: started once everything above exists
};

// The output row shape of a request: the batch output's shape past the batch axis, its sequence axis
// cut to `length` when the output carries the padded sequence (out.size(1) == padded_length).
std::vector<std::int64_t> output_row_shape(at::IntArrayRef out_shape, std::int64_t padded_length, std::int64_t length);

// The weights of the answer checksums, [numel, serve::kChecksums] float64 on `device`: weight j of
// output element k is mix32(k * kChecksums + j) / 2^32 * 2 - 1, in [-1, 1), mix32 a 32-bit integer
// mixer ("lowbias32": xorshift-multiply). Independent pseudo-random sequences, so outputs that sum to
// about zero (a LayerNorm's) or are permutations of each other get distinct checksums, and a swap
// between two answers hides only when all kChecksums agree. Computed with torch integer ops that
// never overflow int64, so every device gives the same values (gpuopt.serving.load.checksum_weights calls this).
at::Tensor checksum_weights(std::int64_t numel, at::Device device);

// The checksums [n, kChecksums] (float64, on rows' device, asynchronously on its current stream) of
// the rows of `rows` ([n, row_numel], any real dtype), row i cut to its first numels[i] elements: the
// sums over k < numels[i] of w_j(k) * rows[i][k] in double. An answer of a bucketed batch is a prefix
// of its flat padded row (output_row_shape cuts only the leading axis of a contiguous row). `numels`
// is a [n] int64 tensor on rows' device, or undefined when every row is whole. `weights` is the
// caller's cache of checksum_weights on that device, grown here as needed.
at::Tensor answer_checksums(const at::Tensor& rows, const at::Tensor& numels, at::Tensor& weights);

}  // namespace gpuopt::torch_ext
