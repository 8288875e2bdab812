#include "pools.h"

#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "device.h"

#ifdef GPUOPT_WITH_CUDA
#include <c10/cuda/CUDAStream.h>

#include "gpuopt/cuda.h"
#endif

namespace gpuopt::torch_ext {
namespace {

// What a pool tensor's DataPtr carries back to its pool when the storage is freed.
struct BlockContext {
  BlockContext(std::shared_ptr<BlockPool> p, Block b) : pool(std::move(p)), block(b) {}
  std::shared_ptr<BlockPool> pool;
  Block block;
  bool cuda_fence = false;       // fence with CUDA events (pinned with CUDA, or device)
  c10::DeviceIndex device = -1;  // a device pool's device; -1: the current device at release (pinned)
  std::mutex mu;                 // record_stream may be called from several threads
  // The stream current at allocation, then those named with record_stream; distinct.
  c10::SmallVector<c10::Stream, 4> streams;
};

#ifdef GPUOPT_WITH_CUDA
c10::Stream current_stream(c10::DeviceIndex device) {
  return (device >= 0 ? c10::cuda::getCurrentCUDAStream(device) : c10::cuda::getCurrentCUDAStream()).unwrap();
}

std::unique_ptr<Fence> event_fence(BlockContext& ctx) {
  const c10::Stream released_on = current_stream(ctx.device);
  c10::SmallVector<cuda::StreamRef, 4> refs;
  const auto add = [&refs](const c10::Stream& s) {
    refs.push_back({s.device_index(), c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, s).stream()});
  };
  for (const c10::Stream& s : ctx.streams) add(s);
  if (std::find(ctx.streams.begin(), ctx.streams.end(), released_on) == ctx.streams.end()) add(released_on);
  return std::make_unique<cuda::EventFence>(refs.data(), refs.size());
}
#endif

void return_block(void* raw) noexcept {
  std::unique_ptr<BlockContext> ctx(static_cast<BlockContext*>(raw));
  try {
    std::unique_ptr<Fence> fence;
#ifdef GPUOPT_WITH_CUDA
    if (ctx->cuda_fence) fence = event_fence(*ctx);
#endif
    ctx->pool->release(ctx->block, std::move(fence));
  } catch (...) {
    // A deleter must not throw; a block we cannot fence is better leaked than reused too early.
  }
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

TensorPool::TensorPool(Kind kind, c10::DeviceIndex device, std::unique_ptr<BlockPool> pool)
    : kind_(kind), device_(device), page_locked_(std::string(pool->kind()) == "pinned"), pool_(std::move(pool)) {}

std::shared_ptr<TensorPool> TensorPool::create(Kind kind, std::int64_t device, PoolOptions options) {
  std::unique_ptr<RawAllocator> allocator;
  c10::DeviceIndex index = -1;
  if (kind == Kind::kDevice) index = checked_cuda_device(device, options.name.c_str());
#ifdef GPUOPT_WITH_CUDA
  if (kind == Kind::kDevice) {
    allocator = std::make_unique<cuda::DeviceAllocator>(index);
  } else if (cuda_device_count() > 0) {
    allocator = std::make_unique<cuda::PinnedAllocator>();
  }
#endif
  if (allocator == nullptr) allocator = std::make_unique<HostAllocator>();
  return std::shared_ptr<TensorPool>(
      new TensorPool(kind, index, std::make_unique<BlockPool>(std::move(allocator), std::move(options))));
}

at::Tensor TensorPool::empty(at::IntArrayRef shape, at::ScalarType dtype) {
  return wrap(pool_->acquire(checked_bytes(shape, dtype, name())), shape, dtype);
}

std::optional<at::Tensor> TensorPool::reuse(at::IntArrayRef shape, at::ScalarType dtype) {
  const std::optional<Block> block = pool_->reuse(checked_bytes(shape, dtype, name()));
  if (!block) return std::nullopt;
  return wrap(*block, shape, dtype);
}

at::Tensor TensorPool::wrap(const Block& block, at::IntArrayRef shape, at::ScalarType dtype) {
  auto* ctx = new BlockContext(pool_, block);
  c10::Device where = c10::Device(c10::kCPU);
#ifdef GPUOPT_WITH_CUDA
  if (kind_ == Kind::kDevice) {
    where = c10::Device(c10::kCUDA, device_);
    ctx->cuda_fence = true;
    ctx->device = device_;
  } else {
    ctx->cuda_fence = page_locked_;
  }
  if (ctx->cuda_fence) ctx->streams.push_back(current_stream(ctx->device));
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
  std::lock_guard<std::mutex> lock(ctx->mu);
  if (std::find(ctx->streams.begin(), ctx->streams.end(), stream) != ctx->streams.end()) return;
  TORCH_CHECK_VALUE(ctx->streams.size() < kMaxStreamsPerTensor, name(), ".record_stream: a tensor can be fenced on at "
                    "most ", kMaxStreamsPerTensor, " distinct streams (the one current at allocation included), and "
                    "this one already is on ", ctx->streams.size(), "; synchronize with the other streams and record "
                    "fewer, or copy the tensor");
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

PoolStressResult pool_stress(TensorPool& pool, std::int64_t threads, std::int64_t iters, std::int64_t seed) {
  TORCH_CHECK_VALUE(pool.kind() == TensorPool::Kind::kPinned, "pool_stress: pool must be a PinnedPool (its blocks are "
                    "written and checked on the host), got ", pool.name());
  TORCH_CHECK_VALUE(threads >= 1 && threads <= 256, "pool_stress: threads must be in [1, 256], got ", threads);
  TORCH_CHECK_VALUE(iters >= 1 && iters <= 100000000, "pool_stress: iters must be in [1, 1e8], got ", iters);
  TORCH_CHECK_VALUE(seed >= 0, "pool_stress: seed must be >= 0, got ", seed);
  constexpr std::size_t kHeld = 4;
  std::mutex mu;
  std::exception_ptr first_error;
  std::int64_t corrupted = 0;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> workers;
  for (std::int64_t w = 0; w < threads; ++w) {
    workers.emplace_back([&, w] {
      std::int64_t bad = 0;
      try {
        std::mt19937_64 rng(static_cast<std::uint64_t>(seed) * 1000003u + static_cast<std::uint64_t>(w));
        std::uniform_int_distribution<std::int64_t> size(16, 16384);
        struct Held {
          at::Tensor t;
          std::uint64_t tag;
        };
        std::vector<Held> held;
        // A tag at both ends: another thread given the same block would overwrite it.
        const auto check = [&bad](const Held& h) {
          std::uint64_t head = 0, tail = 0;
          const auto* p = static_cast<const unsigned char*>(h.t.data_ptr());
          std::memcpy(&head, p, sizeof head);
          std::memcpy(&tail, p + h.t.numel() - sizeof tail, sizeof tail);
          bad += (head != h.tag || tail != h.tag) ? 1 : 0;
        };
        for (std::int64_t i = 0; i < iters; ++i) {
          Held h{pool.empty({size(rng)}, at::kByte),
                 (static_cast<std::uint64_t>(w) << 40) ^ static_cast<std::uint64_t>(i) ^ rng()};
          auto* p = static_cast<unsigned char*>(h.t.data_ptr());
          std::memcpy(p, &h.tag, sizeof h.tag);
          std::memcpy(p + h.t.numel() - sizeof h.tag, &h.tag, sizeof h.tag);
          held.push_back(std::move(h));
          if (held.size() > kHeld || rng() % 2 == 0) {  // free a random one of those held
            const std::size_t k = rng() % held.size();
            check(held[k]);
            held.erase(held.begin() + static_cast<std::ptrdiff_t>(k));
          }
        }
        for (const Held& h : held) check(h);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first_error) first_error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mu);
      corrupted += bad;
    });
  }
  for (std::thread& t : workers) t.join();
  if (first_error) std::rethrow_exception(first_error);
  PoolStressResult r;
  r.tensors = threads * iters;
  r.corrupted = corrupted;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace gpuopt::torch_ext
