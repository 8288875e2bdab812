#pragma once

// The decode attention kernel (gpuopt::cuda::decode_attention): one query per (batch, head) against
// a KV cache, softmax in fp32 with the running-maximum rescaling of FlashAttention, in one pass
// over the keys that the mask lets through.
//
// One block per (head, batch row, split of the keys). A key row of D values is read by kLanes lanes, kElems values
// each (16-byte loads, interleaved so that a row's lanes read it contiguously); a warp holds
// kGroups keys at a time and unrolls kUnroll of them, so that a block of 16 warps has up to 512 keys
// of K and V in flight (fp16 with head size 64; 256 at 128) (decode is latency-bound: a handful of SMs must stream the cache). Each group
// keeps its own maximum, sum and output slice; a warp merges its groups by shuffles, the block its
// warps through shared memory. Masked keys
// cost one byte read: their K and V rows are never loaded. A long cache with few (batch, head)
// pairs is split over several blocks per pair (FlashDecoding's split-KV), each writing its maximum,
// sum and unnormalised output to a float32 workspace that decode_attention_combine reduces.
//
// Causal (appending only): the keys attended are those up to the new token's row, [0, position];
// the splits divide that range, read from the device, instead of the whole cache.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "int8_linear_kernels.cuh"  // to_float, from_float, unpack2
#include "pdl.cuh"

namespace gpuopt::cuda::kernels {

constexpr int kAttnMaxWarps = 16;
constexpr int kAttnUnroll = 8;

template <typename T>
struct AttnShape {
  static constexpr int kVec = 16 / static_cast<int>(sizeof(T));  // values per 16-byte load
};

template <typename T, int D>
struct AttnRow {
  static constexpr int kVec = AttnShape<T>::kVec;
  static constexpr int kLanes = D / kVec < 32 ? D / kVec : 32;  // lanes per key row
  static constexpr int kElems = D / kLanes;                      // values per lane
  static constexpr int kLoads = kElems / kVec;                   // 16-byte loads per lane
  static constexpr int kGroups = 32 / kLanes;                    // keys per warp at a time
  static constexpr int kUnroll = kAttnUnroll / kLoads;           // keys per group per pass (registers)
  static_assert(D % kVec == 0 && (D / kVec & (D / kVec - 1)) == 0, "D / kVec must be a power of two");
  static_assert(kElems % kVec == 0, "a lane reads whole 16-byte vectors");
};

template <typename T>
struct DecodeAttentionArgs {
  const T* q;                 // [batch, heads, 1, D], rows at q + b * qb + h * qh
  const T* k;                 // [batch, kv_heads, keys, D]
  const T* v;                 // the same shape as k
  const bool* mask;           // broadcast to [batch, heads, 1, keys]; nullptr: every key
  T* out;                     // [batch, 1, heads, D], contiguous
  float* partial;             // split-KV: [batch, heads, splits, D + 2] (max, sum, output); else nullptr
  int heads, group, keys;     // group = heads / kv_heads
  bool causal;                // attend to keys [0, *position] only (appending)
  long long qb, qh;           // element strides
  long long kb, kh, kl, vb, vh, vl;
  long long mb, mh, ml;       // element strides of mask (0 where broadcast)
  float scale_log2;           // softmax scale * log2(e): scores are kept in base 2
  // Appending: the new token's key and value rows ([batch, kv_heads, 1, D], strides nkb/nkh, nvb/nvh)
  // go to row *position of k and v (a position outside [0, keys) writes nothing); the kernel reads
  // that row from them, so no block waits for the write. k_new == nullptr: nothing appended.
  const T* k_new;
  const T* v_new;
  long long nkb, nkh, nvb, nvh;
  const long long* position;
};

// Value e of load i of lane `lane` sits at (i * kLanes + lane) * kVec + e of the row.
template <typename T, int D>
__device__ __forceinline__ void load_row(const T* row, int lane, uint4 (&raw)[AttnRow<T, D>::kLoads]) {
  using R = AttnRow<T, D>;
#pragma unroll
  for (int i = 0; i < R::kLoads; ++i) {
    raw[i] = *reinterpret_cast<const uint4*>(row + (i * R::kLanes + lane) * R::kVec);
  }
}

template <int kLoads>
__device__ __forceinline__ void to_floats(const uint4 (&raw)[kLoads], float (&f)[kLoads * 4], float) {
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    f[4 * i + 0] = __uint_as_float(raw[i].x);
    f[4 * i + 1] = __uint_as_float(raw[i].y);
    f[4 * i + 2] = __uint_as_float(raw[i].z);
    f[4 * i + 3] = __uint_as_float(raw[i].w);
  }
}

template <int kLoads, typename T>  // __half or __nv_bfloat16
__device__ __forceinline__ void to_floats(const uint4 (&raw)[kLoads], float (&f)[kLoads * 8], T tag) {
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    const std::uint32_t words[4] = {raw[i].x, raw[i].y, raw[i].z, raw[i].w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const float2 p = unpack2(words[w], tag);
      f[8 * i + 2 * w] = p.x;
      f[8 * i + 2 * w + 1] = p.y;
    }
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(kAttnMaxWarps * 32) decode_attention(DecodeAttentionArgs<T> a) {
  using R = AttnRow<T, D>;
  constexpr int kU = R::kUnroll;
  __shared__ float part_acc[kAttnMaxWarps][D];
  __shared__ float part_max[kAttnMaxWarps];
  __shared__ float part_sum[kAttnMaxWarps];
  __shared__ float weight[kAttnMaxWarps];
  __shared__ float block_max;
  // Under programmatic launch (pdl.cuh): the query, the rows to append and the cache all come from
  // earlier kernels, so nothing is read before the wait.
  allow_next_grid();
  wait_for_prior_grid();

  const int h = static_cast<int>(blockIdx.x);
  const int b = static_cast<int>(blockIdx.y);
  // The keys this block attends: its split of [0, limit), limit the cache's length or, causal, the
  // appended row's position + 1 (0 for a negative position, the whole cache past its end).
  const long long position = a.k_new != nullptr ? *a.position : -1;
  const int limit = !a.causal ? a.keys : position < 0 ? 0 : position < a.keys ? static_cast<int>(position) + 1 : a.keys;
  const int per = (limit + static_cast<int>(gridDim.z) - 1) / static_cast<int>(gridDim.z);
  const int first = static_cast<int>(blockIdx.z) * per;
  const int end = min(limit, first + per);
  const int hk = h / a.group;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int warps = static_cast<int>(blockDim.x >> 5);
  const int sub = lane / R::kLanes;  // this lane's key within the warp's kGroups
  const int l = lane % R::kLanes;    // this lane's slice of the row
  const int groups = warps * R::kGroups;

  float q[R::kElems];
  {
    uint4 raw[R::kLoads];
    load_row<T, D>(a.q + b * a.qb + h * a.qh, l, raw);
    to_floats(raw, q, T{});
#pragma unroll
    for (int e = 0; e < R::kElems; ++e) q[e] *= a.scale_log2;
  }
  const T* kbase = a.k + b * a.kb + hk * a.kh;
  const T* vbase = a.v + b * a.vb + hk * a.vh;
  const bool* mrow = a.mask != nullptr ? a.mask + b * a.mb + h * a.mh : nullptr;
  int pos = -1;  // the appended row, or -1
  const T* knew = nullptr;
  const T* vnew = nullptr;
  if (a.k_new != nullptr) {
    pos = position >= 0 && position < a.keys ? static_cast<int>(position) : -1;
    knew = a.k_new + b * a.nkb + hk * a.nkh;
    vnew = a.v_new + b * a.nvb + hk * a.nvh;
    // The first query head of the KV head writes the row, in the split that holds it.
    if (pos >= first && pos < end && h % a.group == 0) {
      T* krow = const_cast<T*>(kbase) + pos * a.kl;
      T* vrow = const_cast<T*>(vbase) + pos * a.vl;
      for (int d = static_cast<int>(threadIdx.x); d < D; d += static_cast<int>(blockDim.x)) {
        krow[d] = knew[d];
        vrow[d] = vnew[d];
      }
    }
  }

  float run_max = -INFINITY, run_sum = 0.0f;
  float acc[R::kElems];
#pragma unroll
  for (int e = 0; e < R::kElems; ++e) acc[e] = 0.0f;

  // The bound is the warp's first key, so that every lane of a warp runs the same iterations (the
  // shuffles below need them all); keys past the end are invalid, as masked ones are. A pass takes
  // kU keys per group at once: their dot products and shuffles are independent, and the running
  // maximum is rescaled once per pass, not per key.
  for (int base = first + warp * R::kGroups; base < end; base += groups * kU) {
    uint4 kraw[kU][R::kLoads];
    uint4 vraw[kU][R::kLoads];
    bool ok[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int j = base + sub + u * groups;
      ok[u] = j < end && (mrow == nullptr || mrow[j * a.ml]);
      if (ok[u]) {
        load_row<T, D>(j == pos ? knew : kbase + j * a.kl, l, kraw[u]);
        load_row<T, D>(j == pos ? vnew : vbase + j * a.vl, l, vraw[u]);
      }
    }
    float score[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      score[u] = 0.0f;
      if (ok[u]) {
        float kf[R::kElems];
        to_floats(kraw[u], kf, T{});
#pragma unroll
        for (int e = 0; e < R::kElems; ++e) score[u] = fmaf(q[e], kf[e], score[u]);
      }
    }
#pragma unroll
    for (int off = R::kLanes / 2; off > 0; off >>= 1) {
#pragma unroll
      for (int u = 0; u < kU; ++u) score[u] += __shfl_xor_sync(0xffffffffu, score[u], off);
    }
    float next = run_max;
#pragma unroll
    for (int u = 0; u < kU; ++u) next = ok[u] ? fmaxf(next, score[u]) : next;
    if (next == -INFINITY) continue;  // no key for this group yet (no shuffle follows in this pass)
    const float shrink = exp2f(run_max - next);  // 0 while run_max is -inf
    run_sum *= shrink;
#pragma unroll
    for (int e = 0; e < R::kElems; ++e) acc[e] *= shrink;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if (ok[u]) {
        const float p = exp2f(score[u] - next);
        float vf[R::kElems];
        to_floats(vraw[u], vf, T{});
        run_sum += p;
#pragma unroll
        for (int e = 0; e < R::kElems; ++e) acc[e] = fmaf(p, vf[e], acc[e]);
      }
    }
    run_max = next;
  }

  // The kGroups groups of a warp (lanes l + kLanes * sub) into one, by shuffles.
  if (R::kGroups > 1) {
    float wmax = run_max;
#pragma unroll
    for (int off = R::kLanes; off < 32; off <<= 1) wmax = fmaxf(wmax, __shfl_xor_sync(0xffffffffu, wmax, off));
    const float f = wmax == -INFINITY ? 0.0f : exp2f(run_max - wmax);  // 0 for a group that saw no key
    run_sum *= f;
#pragma unroll
    for (int e = 0; e < R::kElems; ++e) acc[e] *= f;
#pragma unroll
    for (int off = R::kLanes; off < 32; off <<= 1) {
      run_sum += __shfl_xor_sync(0xffffffffu, run_sum, off);
#pragma unroll
      for (int e = 0; e < R::kElems; ++e) acc[e] += __shfl_xor_sync(0xffffffffu, acc[e], off);
    }
    run_max = wmax;
  }

  // Then the warps: out = sum_w acc_w * 2^(max_w - M) / sum_w sum_w * 2^(max_w - M).
  if (lane == 0) {
    part_max[warp] = run_max;
    part_sum[warp] = run_sum;
  }
  if (sub == 0) {
#pragma unroll
    for (int i = 0; i < R::kLoads; ++i) {
#pragma unroll
      for (int e = 0; e < R::kVec; ++e) part_acc[warp][(i * R::kLanes + l) * R::kVec + e] = acc[i * R::kVec + e];
    }
  }
  __syncthreads();
  if (warp == 0) {
    float m = lane < warps ? part_max[lane] : -INFINITY;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    if (lane < warps) weight[lane] = m == -INFINITY ? 0.0f : exp2f(part_max[lane] - m);  // 0: no key
    if (lane == 0) block_max = m;
  }
  __syncthreads();
  const float m = block_max;
  float total = 0.0f;
  for (int w = 0; w < warps; ++w) total = fmaf(part_sum[w], weight[w], total);
  const long long pair = static_cast<long long>(b) * a.heads + h;
  if (a.partial != nullptr) {  // this split's maximum, sum and unnormalised output
    float* p = a.partial + (pair * gridDim.z + blockIdx.z) * (D + 2);
    if (threadIdx.x == 0) {
      p[0] = m;
      p[1] = total;
    }
    for (int d = static_cast<int>(threadIdx.x); d < D; d += static_cast<int>(blockDim.x)) {
      float o = 0.0f;
      for (int w = 0; w < warps; ++w) o = fmaf(part_acc[w][d], weight[w], o);
      p[2 + d] = o;
    }
    return;
  }
  T* out = a.out + pair * D;
  for (int d = static_cast<int>(threadIdx.x); d < D; d += static_cast<int>(blockDim.x)) {
    float o = 0.0f;
    for (int w = 0; w < warps; ++w) o = fmaf(part_acc[w][d], weight[w], o);
    // A query that no key may attend to gets zeros (as FlashAttention gives), not NaN.
    out[d] = from_float<T>(total > 0.0f ? o / total : 0.0f);
  }
}

// Split-KV: out[b, 0, h, d] from the splits' (max, sum, output) of decode_attention. One block of D
// threads per (head, batch row).
template <typename T, int D>
__global__ void decode_attention_combine(const float* __restrict__ partial, T* __restrict__ out, int heads,
                                         int splits) {
  allow_next_grid();
  wait_for_prior_grid();
  const long long pair = static_cast<long long>(blockIdx.y) * heads + blockIdx.x;
  const float* p = partial + pair * splits * (D + 2);
  float m = -INFINITY;
  for (int s = 0; s < splits; ++s) m = fmaxf(m, p[s * (D + 2)]);
  float total = 0.0f, o = 0.0f;
  const int d = static_cast<int>(threadIdx.x);
  for (int s = 0; s < splits; ++s) {
    const float w = m == -INFINITY ? 0.0f : exp2f(p[s * (D + 2)] - m);  // 0 for a split that saw no key
    total = fmaf(p[s * (D + 2) + 1], w, total);
    o = fmaf(p[s * (D + 2) + 2 + d], w, o);
  }
  out[pair * D + d] = from_float<T>(total > 0.0f ? o / total : 0.0f);
}

}  // namespace gpuopt::cuda::kernels
