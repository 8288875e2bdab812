#include "pools.h"

#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "device.h"

#ifdef GPUOPT_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>

#include "gpuopt/cuda.h"
#endif

namespace gpuopt::torch_ext {
namespace {

// What a pool tensor's DataPtr carries back to its pool when the storage is freed.
struct BlockContext {
  std::shared_ptr<BlockPool> pool;
  Block block;
  bool cuda_fence = false;  // record an event at release (pinned with CUDA, or device)
  int device = 0;           // device whose current stream the release is ordered after
  std::vector<c10::Stream> streams;  // named with record_stream
};

void return_block(void* raw) noexcept {
  auto* ctx = static_cast<BlockContext*>(raw);
  try {
    std::unique_ptr<Fence> fence;
#ifdef GPUOPT_WITH_CUDA
    if (ctx->cuda_fence) {
      std::vector<cudaStream_t> streams{c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(ctx->device))};
      for (const c10::Stream& s : ctx->streams) {
        const cudaStream_t cs = c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, s).stream();
        if (std::find(streams.begin(), streams.end(), cs) == streams.end()) streams.push_back(cs);
      }
      fence = std::make_unique<cuda::EventFence>(ctx->device, streams.data(), std::min<std::size_t>(streams.size(), 4));
    }
#endif
    ctx->pool->release(ctx->block, std::move(fence));
  } catch (...) {
    // A deleter must not throw; a block we cannot fence is better leaked than reused too early.
  }
  delete ctx;
}

std::size_t checked_bytes(at::IntArrayRef shape, at::ScalarType dtype, const std::string& pool) {
  TORCH_CHECK_TYPE(!c10::isQIntType(dtype) && dtype != at::kComplexHalf,
                   pool, ".empty: dtype must be a plain numeric or bool dtype, got ", dtype);
  std::int64_t numel = 1;
  for (std::int64_t d : shape) {
    TORCH_CHECK_VALUE(d > 0, pool, ".empty: every dimension must be > 0, got shape ", shape);
    numel *= d;
  }
  return static_cast<std::size_t>(numel) * c10::elementSize(dtype);
}

}  // namespace

std::shared_ptr<TensorPool> TensorPool::create(Kind kind, std::int64_t device, std::size_t capacity_bytes,
                                               std::string name) {
  PoolOptions options;
  options.name = std::move(name);
  options.capacity_bytes = capacity_bytes;
  std::unique_ptr<RawAllocator> allocator;
#ifdef GPUOPT_WITH_CUDA
  if (kind == Kind::kDevice) {
    require_cuda(options.name.c_str());
    TORCH_CHECK_INDEX(device >= 0 && device < cuda_device_count(), options.name, ": device must be in [0, ",
                      cuda_device_count(), "), got ", device);
    allocator = std::make_unique<cuda::DeviceAllocator>(static_cast<int>(device));
  } else if (cuda_device_count() > 0) {
    allocator = std::make_unique<cuda::PinnedAllocator>();
  }
#else
  if (kind == Kind::kDevice) require_cuda(options.name.c_str());
#endif
  if (allocator == nullptr) allocator = std::make_unique<HostAllocator>();
  return std::shared_ptr<TensorPool>(
      new TensorPool(kind, device, std::make_unique<BlockPool>(std::move(allocator), std::move(options))));
}

bool TensorPool::page_locked() const { return std::string(pool_->kind()) == "pinned"; }

at::Tensor TensorPool::empty(at::IntArrayRef shape, at::ScalarType dtype) {
  const std::size_t nbytes = checked_bytes(shape, dtype, name());
  const Block block = pool_->acquire(nbytes);
  auto* ctx = new BlockContext{pool_, block, false, 0, {}};
  c10::Device where = c10::Device(c10::kCPU);
#ifdef GPUOPT_WITH_CUDA
  if (kind_ == Kind::kDevice) {
    where = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device_));
    ctx->cuda_fence = true;
    ctx->device = static_cast<int>(device_);
  } else if (page_locked()) {
    ctx->cuda_fence = true;
    ctx->device = static_cast<int>(c10::cuda::current_device());
  }
#endif
  // One tensor construction, no dispatcher round trip, no pointer-attribute query (device given).
  return at::for_blob(block.ptr, shape)
      .context(ctx, &return_block)
      .target_device(where)
      .options(at::TensorOptions().dtype(dtype).device(where))
      .make_tensor();
}

void TensorPool::record_stream(const at::Tensor& t, const c10::Stream& stream) {
  const c10::DataPtr& data = t.storage().data_ptr();
  TORCH_CHECK_VALUE(data.get_deleter() == &return_block, name(), ".record_stream: the tensor was not allocated by a "
                    "gpuopt pool");
  auto* ctx = static_cast<BlockContext*>(data.get_context());
  TORCH_CHECK_VALUE(ctx->pool == pool_, name(), ".record_stream: the tensor belongs to another pool (",
                    ctx->pool->options().name, ")");
  TORCH_CHECK_VALUE(stream.device_type() == c10::DeviceType::CUDA, name(), ".record_stream: stream must be a CUDA "
                    "stream, got ", stream);
  TORCH_CHECK_VALUE(ctx->streams.size() < 3, name(), ".record_stream: at most 3 extra streams per tensor");
  ctx->streams.push_back(stream);
}

double pool_cycle_ns(TensorPool& pool, at::IntArrayRef shape, at::ScalarType dtype, std::int64_t iters) {
  TORCH_CHECK_VALUE(iters > 0, "iters must be > 0, got ", iters);
  (void)pool.empty(shape, dtype);  // the miss: allocate once
  const auto t0 = std::chrono::steady_clock::now();
  for (std::int64_t i = 0; i < iters; ++i) (void)pool.empty(shape, dtype);
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
         static_cast<double>(iters);
}

double host_alloc_cycle_ns(std::int64_t bytes, std::int64_t iters) {
  TORCH_CHECK_VALUE(bytes > 0 && iters > 0, "bytes and iters must be > 0, got ", bytes, " and ", iters);
#ifdef GPUOPT_WITH_CUDA
  require_cuda("host_alloc_cycle_ns");
  cuda::PinnedAllocator alloc;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::int64_t i = 0; i < iters; ++i) {
    void* p = alloc.allocate(static_cast<std::size_t>(bytes));
    TORCH_CHECK(p != nullptr, "cudaHostAlloc of ", bytes, " bytes failed");
    alloc.deallocate(p, static_cast<std::size_t>(bytes));
  }
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
         static_cast<double>(iters);
#else
  return 0.0;
#endif
}

}  // namespace gpuopt::torch_ext
