// A host-to-device input pipeline: host batches are staged through a pinned pool and copied to the
// device on a dedicated copy stream, `depth` batches ahead, so the copy of batch i+1 overlaps the
// compute of batch i. Events order the consumer's stream after each copy. The thread and queue are
// gpuopt::StagingWorker's; this adapter gives it the stage step.
//
// It cannot hang on the GIL: the worker never drops the last reference to a host batch (a batch
// made by torch.from_numpy frees its array under the GIL); batches go back to the consumer's side
// and are released there, in next() or close(). The destructor is therefore safe with the GIL held,
// and every wait is bounded (submit/next by timeout_s; close() waits only for the batch being
// staged, whose pool waits are bounded by fence_wait_timeout_s).
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>

#include "gpuopt/cuda_fwd.h"
#include "gpuopt/staging.h"
#include "pools.h"

namespace gpuopt::torch_ext {

struct PipelineStats {
  std::int64_t submitted = 0, delivered = 0;
  std::int64_t failed = 0;     // batches whose staging failed (the error was raised by next())
  std::int64_t cancelled = 0;  // batches dropped by close()
  std::int64_t bytes = 0;      // staged
  double stage_ms = 0;         // worker time: pinned staging + enqueueing copies
  double wait_ms = 0;          // consumer time blocked in next() waiting for a staged batch
};

class InputPipeline {
 public:
  // timeout_s: how long submit() and next() wait by default, in (0, kMaxStagingTimeoutS].
  InputPipeline(std::shared_ptr<TensorPool> pinned, std::shared_ptr<TensorPool> device_pool, std::int64_t device,
                std::int64_t depth, double timeout_s);
  ~InputPipeline();  // close()
  InputPipeline(const InputPipeline&) = delete;
  InputPipeline& operator=(const InputPipeline&) = delete;

  // Queues a non-empty CPU tensor (made contiguous); waits up to timeout_s while `depth` batches are
  // in flight.
  void submit(const at::Tensor& host, std::optional<double> timeout_s = std::nullopt);
  // The next batch on the device, in submission order, waiting up to timeout_s for its staging; the
  // current stream is made to wait for its copy. Re-raises an error met while staging it.
  at::Tensor next(std::optional<double> timeout_s = std::nullopt);
  // Cancels: batches not yet delivered are dropped (released on this thread), waiters in submit()
  // and next() fail, the worker exits after the batch it is staging. Idempotent.
  void close() { worker_.close(); }
  bool closed() const { return worker_.closed(); }
  std::int64_t in_flight() const { return worker_.in_flight(); }
  std::int64_t depth() const { return worker_.depth(); }
  double timeout_s() const { return timeout_s_; }
  PipelineStats stats() const;

 private:
  class Batch;

  std::shared_ptr<TensorPool> pinned_, device_pool_;
  c10::DeviceIndex device_;
  double timeout_s_;
  cuda::StreamHandle copy_stream_ = nullptr;  // one of torch's pool streams, kept by torch
  std::atomic<std::int64_t> bytes_{0};
  StagingWorker worker_;  // last: its thread stops before the members its batches use go away
};

}  // namespace gpuopt::torch_ext
