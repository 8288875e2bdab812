#include "pipeline.h"

#include <c10/util/Exception.h>

#include <chrono>
#include <cstring>

#include "device.h"

#ifdef GPUOPT_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "gpuopt/cuda.h"
#endif

namespace gpuopt::torch_ext {
namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

InputPipeline::InputPipeline(std::shared_ptr<TensorPool> pinned, std::shared_ptr<TensorPool> device_pool,
                             std::int64_t device, std::int64_t depth)
    : pinned_(std::move(pinned)), device_pool_(std::move(device_pool)), device_(device), depth_(depth) {
  TORCH_CHECK_VALUE(depth >= 1 && depth <= 16, "depth must be in [1, 16], got ", depth);
  require_cuda("InputPipeline");
  TORCH_CHECK_INDEX(device >= 0 && device < cuda_device_count(), "device must be in [0, ", cuda_device_count(),
                    "), got ", device);
  TORCH_CHECK_VALUE(pinned_ && pinned_->kind() == TensorPool::Kind::kPinned, "pinned_pool must be a PinnedPool");
  TORCH_CHECK_VALUE(device_pool_ && device_pool_->kind() == TensorPool::Kind::kDevice,
                    "device_pool must be a DevicePool");
#ifdef GPUOPT_WITH_CUDA
  copy_stream_ = c10::cuda::getStreamFromPool(/*isHighPriority=*/true, static_cast<c10::DeviceIndex>(device)).stream();
#endif
  thread_ = std::thread([this] { worker(); });
}

InputPipeline::~InputPipeline() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
#ifdef GPUOPT_WITH_CUDA
  for (Staged& s : ready_) {
    if (s.copied != nullptr) cuda::release_event(static_cast<int>(device_), static_cast<cudaEvent_t>(s.copied));
  }
#endif
}

void InputPipeline::submit(const at::Tensor& host) {
  TORCH_CHECK_VALUE(host.device().is_cpu(), "InputPipeline.submit: batches must be CPU tensors, got device ",
                    host.device());
  TORCH_CHECK_VALUE(host.numel() > 0, "InputPipeline.submit: the batch is empty (shape ", host.sizes(), ")");
  at::Tensor batch = host.contiguous();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] {
    return stop_ || static_cast<std::int64_t>(pending_.size() + ready_.size()) + staging_ < depth_;
  });
  TORCH_CHECK(!stop_, "InputPipeline is closed");
  pending_.push_back(std::move(batch));
  ++stats_.submitted;
  cv_.notify_all();
}

at::Tensor InputPipeline::next() {
  const auto t0 = std::chrono::steady_clock::now();
  Staged s;
  {
    std::unique_lock<std::mutex> lock(mu_);
    TORCH_CHECK_VALUE(!(pending_.empty() && ready_.empty() && staging_ == 0),
                      "InputPipeline.next: nothing was submitted (submit a batch first)");
    cv_.wait(lock, [this] { return stop_ || !ready_.empty(); });
    TORCH_CHECK(!ready_.empty(), "InputPipeline is closed");
    s = std::move(ready_.front());
    ready_.pop_front();
    ++stats_.delivered;
    stats_.wait_ms += ms_since(t0);
  }
  cv_.notify_all();
  if (s.error) std::rethrow_exception(s.error);
#ifdef GPUOPT_WITH_CUDA
  const auto index = static_cast<c10::DeviceIndex>(device_);
  auto event = static_cast<cudaEvent_t>(s.copied);
  const cudaError_t status = cudaStreamWaitEvent(c10::cuda::getCurrentCUDAStream(index).stream(), event, 0);
  cuda::release_event(static_cast<int>(device_), event);  // the wait above keeps the recorded state
  GPUOPT_CHECK_CUDA(status);
#endif
  return s.device;
}

InputPipeline::Staged InputPipeline::stage(const at::Tensor& host) {
  Staged s;
#ifdef GPUOPT_WITH_CUDA
  const auto nbytes = static_cast<std::size_t>(host.numel()) * host.element_size();
  at::Tensor pinned = pinned_->empty(host.sizes(), host.scalar_type());
  std::memcpy(pinned.data_ptr(), host.data_ptr(), nbytes);
  s.device = device_pool_->empty(host.sizes(), host.scalar_type());
  auto stream = static_cast<cudaStream_t>(copy_stream_);
  GPUOPT_CHECK_CUDA(cudaMemcpyAsync(s.device.data_ptr(), pinned.data_ptr(), nbytes, cudaMemcpyHostToDevice, stream));
  cudaEvent_t copied = cuda::acquire_event(static_cast<int>(device_));
  GPUOPT_CHECK_CUDA(cudaEventRecord(copied, stream));
  s.copied = copied;
  const auto index = static_cast<c10::DeviceIndex>(device_);
  pinned_->record_stream(pinned, c10::cuda::getStreamFromExternal(stream, index).unwrap());
  // `pinned` is released here: its block is reused only after the copy has read it.
#else
  (void)host;
#endif
  return s;
}

void InputPipeline::worker() {
#ifdef GPUOPT_WITH_CUDA
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
#endif
  for (;;) {
    at::Tensor host;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !pending_.empty(); });
      if (stop_) return;
      host = std::move(pending_.front());
      pending_.pop_front();
      ++staging_;
    }
    const auto t0 = std::chrono::steady_clock::now();
    Staged s;
    try {
      s = stage(host);
    } catch (...) {
      s.error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      --staging_;
      stats_.bytes += host.numel() * static_cast<std::int64_t>(host.element_size());
      stats_.stage_ms += ms_since(t0);
      ready_.push_back(std::move(s));
    }
    cv_.notify_all();
  }
}

std::int64_t InputPipeline::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<std::int64_t>(pending_.size() + ready_.size()) + staging_;
}

PipelineStats InputPipeline::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace gpuopt::torch_ext
