#pragma once

// The primitives of gpuopt's persistent decode kernel (decode_stream.cu), compute
// capability 9.0+ (compiled out below it; the hosts check hopper_code_runs):
//
// - a ring of shared-memory stages, each filled by bulk copies (cp.async.bulk) that complete on the stage's
//   "full" mbarrier and freed by the consumer warps' arrivals on its "empty" one;
// - tagged words: a 16-bit value in the low half of a 32-bit word and the launch's epoch in the high half,
//   written and read whole (single-copy atomic). A reader that sees its epoch in every word it loads has this
//   launch's values: the wait for another block's output and its load are one, with no fence and no counter.
//   (A release/acquire counter between the matrix products cost 2.1-3.8 us each on the H200: its release is a
//   full memory barrier; benchmarks/results/llm_decode-chain-streamed-58b6b12-nvidia-h200.)
//
// Every wait gives up with a trap after kStreamSpinLimit clock cycles (several seconds): a bug ends the launch
// with an error instead of hanging the device.

#include <cstdint>

namespace gpuopt::cuda::kernels {

constexpr long long kStreamSpinLimit = 1LL << 33;

__device__ __forceinline__ std::uint32_t smem(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void stage_init(std::uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem(bar)), "r"(count) : "memory");
}

// After every stage_init of a block, before any other thread uses the barriers (then a __syncthreads).
__device__ __forceinline__ void stage_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ bool stage_done(std::uint64_t* bar, unsigned parity) {
  std::uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(smem(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

// Until the phase of `bar` with this parity has completed.
__device__ __forceinline__ void stage_wait(std::uint64_t* bar, unsigned parity) {
  if (stage_done(bar, parity)) return;
  const long long start = clock64();
  while (!stage_done(bar, parity)) {
    if (clock64() - start > kStreamSpinLimit) __trap();
  }
}

__device__ __forceinline__ void stage_arrive(std::uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem(bar)) : "memory");
}

// The producer's arrival on a full barrier, announcing the bytes its copies will bring.
__device__ __forceinline__ void stage_expect(std::uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem(bar)), "r"(bytes) : "memory");
}

// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global memory into shared memory,
// completing on `bar`.
__device__ __forceinline__ void stage_copy(void* dst, const void* src, unsigned bytes, std::uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem(dst)),
               "l"(src), "r"(bytes), "r"(smem(bar))
               : "memory");
}

// 4 bytes from global memory into shared memory, asynchronously: complete for this thread after
// async_copies_wait().
__device__ __forceinline__ void async_copy4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem(dst)), "l"(src) : "memory");
}

__device__ __forceinline__ void async_copies_wait() { asm volatile("cp.async.wait_all;" ::: "memory"); }

__device__ __forceinline__ uint4 tagged_load4(const unsigned* p) {
  uint4 v;
  asm volatile("ld.relaxed.gpu.global.v4.b32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

__device__ __forceinline__ unsigned tagged_load1(const unsigned* p) {
  unsigned v;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void tagged_store(unsigned* p, unsigned v) {
  asm volatile("st.relaxed.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ bool tagged4(const uint4& w, unsigned epoch) {
  return (w.x >> 16) == epoch && (w.y >> 16) == epoch && (w.z >> 16) == epoch && (w.w >> 16) == epoch;
}

// The four words at p (16-byte aligned) once all carry `epoch`.
__device__ __forceinline__ uint4 tagged_wait4(const unsigned* p, unsigned epoch) {
  uint4 w = tagged_load4(p);
  if (tagged4(w, epoch)) return w;
  const long long start = clock64();
  do {
    if (clock64() - start > kStreamSpinLimit) __trap();
    w = tagged_load4(p);
  } while (!tagged4(w, epoch));
  return w;
}

// The word at p once it carries `epoch`.
__device__ __forceinline__ unsigned tagged_wait1(const unsigned* p, unsigned epoch) {
  unsigned w = tagged_load1(p);
  if ((w >> 16) == epoch) return w;
  const long long start = clock64();
  do {
    if (clock64() - start > kStreamSpinLimit) __trap();
    w = tagged_load1(p);
  } while ((w >> 16) != epoch);
  return w;
}

__device__ __forceinline__ long long now_ns() {
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// A barrier of the first kThreads threads of the block (named barrier 1): the consumer warps, without the
// epilogue warp and the producer.
template <int kThreads>
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kThreads) : "memory");
}
#endif

}  // namespace gpuopt::cuda::kernels
