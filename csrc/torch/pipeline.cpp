#include "pipeline.h"

#include <c10/util/Exception.h>

#include <cstring>
#include <utility>

#include "device.h"

#ifdef GPUOPT_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "gpuopt/cuda.h"
#endif

namespace gpuopt::torch_ext {
namespace {

std::shared_ptr<TensorPool> checked_pool(std::shared_ptr<TensorPool> pool, TensorPool::Kind kind, const char* arg,
                                         const char* want) {
  TORCH_CHECK_VALUE(pool != nullptr && pool->kind() == kind, "InputPipeline: ", arg, " must be a ", want);
  return pool;
}

double checked_timeout(double timeout_s) {
  TORCH_CHECK_VALUE(timeout_s > 0 && timeout_s <= kMaxStagingTimeoutS, "InputPipeline: timeout_s must be > 0 and <= ",
                    kMaxStagingTimeoutS, " seconds, got ", timeout_s);
  return timeout_s;
}

}  // namespace

// One batch: the host tensor the consumer submitted, and what staging made of it. Destroyed only on
// the consumer's side (StagingWorker's rule), so the host tensor is never released by the worker.
class InputPipeline::Batch final : public StagingJob {
 public:
  Batch(InputPipeline& owner, at::Tensor host) : owner_(owner), host_(std::move(host)) {}
  ~Batch() override {
#ifdef GPUOPT_WITH_CUDA
    if (copied_ != nullptr) cuda::release_event(owner_.device_, copied_);
#endif
  }

  void stage() override {
#ifdef GPUOPT_WITH_CUDA
    const auto nbytes = host_.nbytes();
    const c10::cuda::CUDAStream stream = c10::cuda::getStreamFromExternal(owner_.copy_stream_, owner_.device_);
    // The copy stream is current while both blocks are taken and the pinned one is freed, so their
    // fences are on the copy stream (and the device block's later also on the consumer's).
    const c10::cuda::CUDAStreamGuard current(stream);
    at::Tensor pinned = owner_.pinned_->empty(host_.sizes(), host_.scalar_type());
    std::memcpy(pinned.data_ptr(), host_.data_ptr(), nbytes);
    device_ = owner_.device_pool_->empty(host_.sizes(), host_.scalar_type());
    cuda::copy_async(device_.data_ptr(), pinned.data_ptr(), nbytes, stream.stream());
    copied_ = cuda::acquire_event(owner_.device_);
    cuda::record_event(copied_, stream.stream());
    owner_.bytes_ += static_cast<std::int64_t>(nbytes);
    // `pinned` is freed here: its block is reused only after the copy has read it.
#endif
  }

  // The staged device tensor, after the current stream was made to wait for its copy.
  at::Tensor take() {
#ifdef GPUOPT_WITH_CUDA
    cuda::stream_wait_event(c10::cuda::getCurrentCUDAStream(owner_.device_).stream(), copied_);
#endif
    return std::move(device_);
  }

 private:
  InputPipeline& owner_;
  at::Tensor host_;
  at::Tensor device_;
  cuda::EventHandle copied_ = nullptr;
};

InputPipeline::InputPipeline(std::shared_ptr<TensorPool> pinned, std::shared_ptr<TensorPool> device_pool,
                             std::int64_t device, std::int64_t depth, double timeout_s)
    : pinned_(checked_pool(std::move(pinned), TensorPool::Kind::kPinned, "pinned_pool", "PinnedPool")),
      device_pool_(checked_pool(std::move(device_pool), TensorPool::Kind::kDevice, "device_pool", "DevicePool")),
      device_(checked_cuda_device(device, "InputPipeline")),
      timeout_s_(checked_timeout(timeout_s)),
      worker_("InputPipeline", depth) {
  TORCH_CHECK_VALUE(device_pool_->device() == device_, "InputPipeline: device_pool is on cuda:",
                    static_cast<int>(device_pool_->device()), " but the pipeline delivers to cuda:",
                    static_cast<int>(device_), "; give a DevicePool of the same device");
#ifdef GPUOPT_WITH_CUDA
  copy_stream_ = c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device_).stream();
#endif
}

InputPipeline::~InputPipeline() { worker_.close(); }

void InputPipeline::submit(const at::Tensor& host, std::optional<double> timeout_s) {
  TORCH_CHECK_VALUE(host.device().is_cpu(), "InputPipeline.submit: batches must be CPU tensors, got device ",
                    host.device());
  TORCH_CHECK_VALUE(host.numel() > 0, "InputPipeline.submit: the batch is empty (shape ", host.sizes(), ")");
  worker_.submit(std::make_unique<Batch>(*this, host.contiguous()), timeout_s.value_or(timeout_s_));
}

at::Tensor InputPipeline::next(std::optional<double> timeout_s) {
  const std::unique_ptr<StagingJob> batch = worker_.next(timeout_s.value_or(timeout_s_));
  return static_cast<Batch&>(*batch).take();  // the batch, with its host tensor, is released here
}

PipelineStats InputPipeline::stats() const {
  const StagingStats w = worker_.stats();
  PipelineStats s;
  s.submitted = w.submitted;
  s.delivered = w.delivered;
  s.failed = w.failed;
  s.cancelled = w.cancelled;
  s.bytes = bytes_.load();
  s.stage_ms = w.stage_ms;
  s.wait_ms = w.wait_ms;
  return s;
}

}  // namespace gpuopt::torch_ext
