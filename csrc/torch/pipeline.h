// A host-to-device input pipeline: host batches are staged through a pinned pool by a worker thread
// and copied to the device on a dedicated copy stream, `depth` batches ahead, so the copy of batch
// i+1 overlaps the compute of batch i. Events order the consumer's stream after each copy.
#pragma once

#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "pools.h"

namespace gpuopt::torch_ext {

struct PipelineStats {
  std::int64_t submitted = 0, delivered = 0;
  std::int64_t bytes = 0;
  double stage_ms = 0;  // worker time: pinned staging + enqueueing copies
  double wait_ms = 0;   // consumer time blocked in next() waiting for a staged batch
};

class InputPipeline {
 public:
  InputPipeline(std::shared_ptr<TensorPool> pinned, std::shared_ptr<TensorPool> device_pool, std::int64_t device,
                std::int64_t depth);
  ~InputPipeline();
  InputPipeline(const InputPipeline&) = delete;
  InputPipeline& operator=(const InputPipeline&) = delete;

  // Queues a contiguous CPU tensor; blocks while `depth` batches are already in flight.
  void submit(const at::Tensor& host);
  // The next batch on the device, in submission order; the current stream is made to wait for its
  // copy. Re-raises an error the worker met while staging it.
  at::Tensor next();
  std::int64_t in_flight() const;
  PipelineStats stats() const;
  std::int64_t depth() const { return depth_; }

 private:
  struct Staged {
    at::Tensor device;
    void* copied = nullptr;  // cudaEvent_t
    std::exception_ptr error;
  };
  void worker();
  Staged stage(const at::Tensor& host);

  std::shared_ptr<TensorPool> pinned_, device_pool_;
  std::int64_t device_, depth_;
  void* copy_stream_ = nullptr;  // cudaStream_t of a pool stream, kept by torch
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<at::Tensor> pending_;
  std::deque<Staged> ready_;
  std::int64_t staging_ = 0;
  bool stop_ = false;
  PipelineStats stats_;
  std::thread thread_;
};

}  // namespace gpuopt::torch_ext
