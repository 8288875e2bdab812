// CUDA runtime helpers: events, versions, timed copies.
#include <chrono>
#include <thread>
#include <utility>

#include "gpuopt/cuda.h"

namespace gpuopt::cuda {

void record_event(cudaEvent_t event, cudaStream_t stream) {
  GPUOPT_CHECK_CUDA(cudaEventRecord(event, stream));
}

void stream_wait_event(cudaStream_t stream, cudaEvent_t event) {
  GPUOPT_CHECK_CUDA(cudaStreamWaitEvent(stream, event, 0));
}

void synchronize_stream(cudaStream_t stream) { GPUOPT_CHECK_CUDA(cudaStreamSynchronize(stream)); }

bool stream_is_capturing(cudaStream_t stream) noexcept {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return status != cudaStreamCaptureStatusNone;
}

void clear_last_error() noexcept { (void)cudaGetLastError(); }

void copy_async(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) {
  GPUOPT_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
}

void memset_async(void* dst, int value, std::size_t bytes, cudaStream_t stream) {
  GPUOPT_CHECK_CUDA(cudaMemsetAsync(dst, value, bytes, stream));
}

void graph_launch(cudaGraphExec_t exec, cudaStream_t stream) {
  GPUOPT_CHECK_VALUE(exec != nullptr, "graph_launch: the graph executable is null (not instantiated)");
  GPUOPT_CHECK_CUDA(cudaGraphLaunch(exec, stream));
}

void synchronize_event(cudaEvent_t event) { GPUOPT_CHECK_CUDA(cudaEventSynchronize(event)); }

bool wait_event(cudaEvent_t event, double timeout_s) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const auto deadline = start + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(timeout_s));
  for (;;) {
    const cudaError_t status = cudaEventQuery(event);
    if (status == cudaSuccess) return true;
    if (status != cudaErrorNotReady) GPUOPT_CHECK_CUDA(status);
    (void)cudaGetLastError();  // not-ready is not sticky; keep the slot clean
    const auto now = clock::now();
    if (now >= deadline) return false;
    if (now - start < std::chrono::milliseconds(5)) {
      std::this_thread::yield();  // a batch usually finishes within milliseconds: stay responsive
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

Event::Event() { GPUOPT_CHECK_CUDA(cudaEventCreate(&event_)); }

Event::~Event() {
  if (event_ != nullptr) cudaEventDestroy(event_);
}

Event::Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (event_ != nullptr) cudaEventDestroy(event_);
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

void Event::record(cudaStream_t stream) { GPUOPT_CHECK_CUDA(cudaEventRecord(event_, stream)); }

void Event::synchronize() const { GPUOPT_CHECK_CUDA(cudaEventSynchronize(event_)); }

bool Event::query() const {
  const cudaError_t status = cudaEventQuery(event_);
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not-ready is not sticky, but keep the last-error slot clean
    return false;
  }
  GPUOPT_CHECK_CUDA(status);
  return true;
}

float Event::elapsed_ms(const Event& start, const Event& end) {
  float ms = 0.0f;
  GPUOPT_CHECK_CUDA(cudaEventElapsedTime(&ms, start.event_, end.event_));
  return ms;
}

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  GPUOPT_CHECK_VALUE(bytes > 0, "buffer size must be > 0 bytes, got ", bytes);
  const cudaError_t status = cudaMalloc(&ptr_, bytes);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    GPUOPT_CHECK(false, "cudaMalloc of ", bytes, " bytes for gpuopt's scratch buffer failed: ",
                 cudaGetErrorString(status),
                 " (torch's allocator may hold the memory: torch.cuda.empty_cache() can release it)");
  }
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) cudaFree(ptr_);
}

double time_copy_ms(void* dst, const void* src, std::size_t bytes, int reps, cudaStream_t stream) {
  GPUOPT_CHECK_VALUE(bytes > 0, "bytes must be > 0, got ", bytes);
  GPUOPT_CHECK_VALUE(reps > 0, "reps must be > 0, got ", reps);
  Event start, end;
  start.record(stream);
  for (int i = 0; i < reps; ++i) {
    GPUOPT_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
  }
  end.record(stream);
  end.synchronize();
  return static_cast<double>(Event::elapsed_ms(start, end)) / reps;
}

int device_attribute(cudaDeviceAttr attribute, int device) {
  int value = 0;
  GPUOPT_CHECK_CUDA(cudaDeviceGetAttribute(&value, attribute, device));
  return value;
}

std::size_t l2_cache_bytes(int device) {
  return static_cast<std::size_t>(device_attribute(cudaDevAttrL2CacheSize, device));
}

int runtime_version() {
  int v = 0;
  GPUOPT_CHECK_CUDA(cudaRuntimeGetVersion(&v));
  return v;
}

int driver_version() {
  int v = 0;
  if (cudaDriverGetVersion(&v) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return v;
}

}  // namespace gpuopt::cuda
