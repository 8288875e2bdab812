// gpuopt's CUDA layer: kernels and CUDA-runtime helpers with no torch and no Python. Every launch
// takes an explicit stream. Only available when the build compiled CUDA (GPUOPT_WITH_CUDA).
#pragma once

#include <cuda_runtime_api.h>
#include <nvtx3/nvToolsExt.h>

#include <cstddef>
#include <cstdint>

#include "gpuopt/cuda_fwd.h"
#include "gpuopt/errors.h"
#include "gpuopt/pool.h"

#define GPUOPT_CHECK_CUDA(expr)                                                              \
  do {                                                                                       \
    const cudaError_t gpuopt_status_ = (expr);                                               \
    GPUOPT_CHECK(gpuopt_status_ == cudaSuccess, #expr, " failed: ",                          \
                 cudaGetErrorName(gpuopt_status_), " (", cudaGetErrorString(gpuopt_status_), \
                 ")");                                                                       \
  } while (0)

// After every kernel launch: a bad configuration shows up here, not at the next sync.
#define GPUOPT_CHECK_LAUNCH() GPUOPT_CHECK_CUDA(cudaGetLastError())

namespace gpuopt::cuda {

// ---- Streams and events: the only place the LibTorch adapter's CUDA work reaches the runtime.
// Every call takes its stream explicitly and checks its status.
void record_event(cudaEvent_t event, cudaStream_t stream);
// Orders `stream` after the work before `event`'s record (no host wait).
void stream_wait_event(cudaStream_t stream, cudaEvent_t event);
void synchronize_stream(cudaStream_t stream);
// Whether `stream` is capturing a CUDA graph; false when the query fails.
bool stream_is_capturing(cudaStream_t stream) noexcept;
// Clears the runtime's non-sticky last-error slot (after an abandoned capture, say).
void clear_last_error() noexcept;
// cudaMemcpyAsync with cudaMemcpyDefault (unified addressing tells the direction).
void copy_async(void* dst, const void* src, std::size_t bytes, cudaStream_t stream);
// cudaMemsetAsync of `bytes` bytes at `dst` to `value`.
void memset_async(void* dst, int value, std::size_t bytes, cudaStream_t stream);
// Launches an instantiated CUDA graph on `stream` (e.g. torch.cuda.CUDAGraph.raw_cuda_graph_exec()).
void graph_launch(cudaGraphExec_t exec, cudaStream_t stream);
// Blocks until the work before `event`'s record has completed.
void synchronize_event(cudaEvent_t event);
// Waits up to timeout_s for the work before `event`'s record (polling: yields for the first
// 5 ms, then sleeps 50 us at a time); false when it has not completed by then.
bool wait_event(cudaEvent_t event, double timeout_s);

// A CUDA event with timing enabled, destroyed with its owner.
class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;

  void record(cudaStream_t stream);
  void synchronize() const;
  bool query() const;  // true when the work before the record has completed
  cudaEvent_t get() const { return event_; }
  // Milliseconds between two recorded events (start must precede end on the device).
  static float elapsed_ms(const Event& start, const Event& end);

 private:
  cudaEvent_t event_ = nullptr;
};

// Device memory from cudaMalloc, outside torch's caching allocator (so that gpuopt's own scratch,
// such as the L2 flush buffer, never shows in a model's peak-memory figures).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

// An NVTX range for the scope, so profiler traces show gpuopt's phases. Costs a few ns without a tool.
class NvtxRange {
 public:
  explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
  ~NvtxRange() { nvtxRangePop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

// Events without timing, recycled: recording a fence must cost about a microsecond, not the tens of
// microseconds cudaEventCreate can take. Thread-safe; per device.
cudaEvent_t acquire_event(int device);
void release_event(int device, cudaEvent_t event) noexcept;

// A stream and the device it belongs to. The device matters: the legacy default stream (nullptr)
// means "the current device's", and an event must be recorded on a stream of its own device.
struct StreamRef {
  int device = 0;
  cudaStream_t stream = nullptr;
};

// A pool fence: one recycled event recorded on each stream that used a block, on that stream's
// device; ready once all have completed. The caller passes each stream once.
class EventFence final : public gpuopt::Fence {
 public:
  EventFence(const StreamRef* streams, std::size_t count);
  ~EventFence() override;
  EventFence(const EventFence&) = delete;
  EventFence& operator=(const EventFence&) = delete;
  bool ready() override;  // completed events go back to the recycler as they are seen
  void wait() override;

 private:
  struct Recorded {
    int device;
    cudaEvent_t event;
  };
  std::vector<Recorded> pending_;
};

// Raw allocators for gpuopt::BlockPool.
class PinnedAllocator final : public gpuopt::RawAllocator {
 public:
  void* allocate(std::size_t bytes) override;  // cudaHostAlloc (portable)
  void deallocate(void* ptr, std::size_t bytes) noexcept override;
  const char* kind() const override { return "pinned"; }
};

class DeviceAllocator final : public gpuopt::RawAllocator {
 public:
  explicit DeviceAllocator(int device) : device_(device) {}
  void* allocate(std::size_t bytes) override;  // cudaMalloc on `device`
  void deallocate(void* ptr, std::size_t bytes) noexcept override;
  const char* kind() const override { return "device"; }

 private:
  int device_;
};

// out[i] = gpuopt::pattern(i, seed) (gpuopt/pattern.h) for i < n: a cheap integer hash, so
// results are checkable exactly on the host. Also what flush_l2 writes (every byte is stored).
void fill_pattern(std::uint32_t* out, std::int64_t n, std::uint32_t seed, cudaStream_t stream);

// Whether `device` runs this binary's tensor-core (mma.sync) code: compute capability 8.0+ and its code
// for that device built for 8.0 or newer (a build for 7.5 alone would JIT its compute_75 PTX there,
// whose MMA is compiled out). Asked once per device (made current for the query).
bool mma_code_runs(int device);
// The same for 9.0+ code (programmatic dependent launch): compute capability 9.0+ and this binary's code
// for the device built for 9.0+.
bool hopper_code_runs(int device);

// Programmatic dependent launch of the decode kernels (decode_linear, int8_linear, decode_attention;
// csrc/cuda/pdl.cuh): on by default, used where `device` has compute capability 9.0+ and this binary's
// code for it is built for 9.0+ (programmatic_launch_runs). Process-wide; set_ returns the previous value.
// For benchmarks that compare the two.
bool programmatic_launch();
bool set_programmatic_launch(bool enabled);
bool programmatic_launch_runs(int device);

// ---- int8 weight-only linear for decode-sized batches: out[m, n] = (sum_k x[m, k] * w[n, k]) *
// scales[n] + bias[n], accumulated in fp32, written in x's type. Bandwidth-bound: the weight is
// streamed once with 16-byte loads, for all rows of x. Two kernels:
//  - tensor cores (fp16/bf16 x, K % 64 == 0, compute capability 8.0 or newer): 16 output columns
//    per block, 4 to 32 warps splitting K; the int8 weights become 16-bit MMA operands with integer
//    bit tricks (exact: |w| <= 128), so no int-to-float conversion instruction (a quarter of the
//    FMA rate) runs per weight, and the activations stay 16-bit; fp32 accumulation.
//  - SIMT (every other case): one warp per output column, int8 and activations converted to fp32.
// Capturable (no allocation, no synchronization).
enum class ActivationType { kFloat32, kFloat16, kBFloat16 };

// Which kernel int8_linear runs: kAuto the tensor-core kernel where it applies (int8_linear_tensor_cores)
// for two rows or more (four where n > kInt8LinearWideN), k >= kInt8LinearLongK or n <=
// kInt8LinearNarrowN, else SIMT; the others force one (kTensorCore refuses a case it cannot run), for
// tests and benchmarks.
enum class Int8Kernel { kAuto, kSimt, kTensorCore };
constexpr std::int64_t kInt8LinearLongK = 4096;
// Up to this many output columns (n / 16 tensor-core blocks, no more than an H100's SMs) the tensor
// cores also take one row, giving each warp one chunk of K (more warps per block); wider matrices get
// one batch of chunks per warp.
constexpr std::int64_t kInt8LinearNarrowN = 2048;
constexpr std::int64_t kInt8LinearWideN = 16384;

// A norm of x folded into a linear layer (Int8LinearParams, DecodeLinearParams): none, a layer norm
// (mean and variance) or an RMS norm (mean square), each without its elementwise affine, which the
// weight and bias hold.
enum class LinearNorm { kNone, kLayer, kRms };

struct Int8LinearParams {
  ActivationType type = ActivationType::kFloat32;  // of x, bias and out
  const void* x = nullptr;                         // [rows, k], contiguous
  const std::int8_t* weight = nullptr;             // [n, k], contiguous
  const void* scales = nullptr;                    // [n], per output channel
  bool scales_fp32 = true;                         // scales are float32 (else of `type`)
  const void* bias = nullptr;                      // [n] of `type`, or nullptr
  void* out = nullptr;                             // [rows, n], contiguous
  std::int64_t rows = 0, n = 0, k = 0;
  int device = 0;                                  // the CUDA device of every pointer
  Int8Kernel kernel = Int8Kernel::kAuto;
  int mma_warps = 0;  // the tensor-core kernel's warps per block (splitting K): 0 chosen from n and k, or 4, 8, 16, 32
  int mma_vector = 0;  // its 16-byte loads per weight row, lane and chunk: 0 chosen (2 where k % 128 == 0), 1, 2
  bool relu = false;   // out = max(out, 0)
  // A norm folded in (its elementwise scale in the weight, its shift in the bias): x's rows are normalized
  // in the kernel, out = act(norm(x) @ w.T + bias) + residual (see csrc/cuda/linear_epilogue.cuh).
  LinearNorm norm = LinearNorm::kNone;
  const float* norm_sum = nullptr;  // [n] float32, for kLayer: the weight's row sums (int8: times the scales)
  float eps = 1e-5f;                // added to the variance (kLayer) or mean square (kRms)
  const void* residual = nullptr;   // [rows, n] of `type`, contiguous, added last; or nullptr
};

// The most rows int8_linear takes: past that the GEMM is no longer bandwidth-bound, and a
// dequantized cuBLAS GEMM wins.
constexpr std::int64_t kInt8LinearMaxRows = 16;
// Whether int8_linear takes these arguments: 1 <= rows <= kInt8LinearMaxRows, n >= 1, k a positive
// multiple of 16, and x and weight 16-byte aligned (so that every row starts aligned).
bool int8_linear_supported(const Int8LinearParams& p);
// Whether the tensor-core kernel can run p: fp16/bf16 x, k % 64 == 0, and p.device of compute
// capability 8.0 or newer with this binary's code for it built for 8.0+ (p.device is made current for
// the one query per device).
bool int8_linear_tensor_cores(const Int8LinearParams& p);
// GPUOPT_CHECK_VALUE unless int8_linear_supported(p) (and, for Int8Kernel::kTensorCore, unless
// int8_linear_tensor_cores(p)).
void int8_linear(const Int8LinearParams& p, cudaStream_t stream);

// ---- 16-bit linear layer for decode-sized batches: out[m, n] = act(sum_k x[m, k] * w[n, k] + bias[n])
// for fp16 or bf16 x and w of one type, accumulated in fp32 by tensor-core MMAs (the weight rows are
// the MMA's M, x's rows its N, so 1 to 8 rows cost the same). Bandwidth-bound: the weight is streamed
// once with 16-byte loads; 16 output columns per block, 4 to 32 warps splitting K in chunks of 32, 64 or
// 128 values (a row's chunk 64, 128 or 256 contiguous bytes), each lane with a batch of loads in flight. Capturable (no allocation, no synchronization).
enum class LinearActivation { kNone, kRelu };

struct DecodeLinearParams {
  ActivationType type = ActivationType::kFloat16;  // of x, weight, bias and out: kFloat16 or kBFloat16
  const void* x = nullptr;       // [rows, k], contiguous
  const void* weight = nullptr;  // [n, k], contiguous
  const void* bias = nullptr;    // [n], or nullptr
  void* out = nullptr;           // [rows, n], contiguous
  std::int64_t rows = 0, n = 0, k = 0;
  LinearActivation activation = LinearActivation::kNone;
  int device = 0;  // the CUDA device of every pointer
  int warps = 0;   // warps per block: 0 chosen from k (one batch of loads per warp), or 4, 8, 16, 32
  int vector = 0;  // 16-byte loads per weight row, lane and chunk: 0 chosen, 1, 2, 4 (the largest k allows)
  // A norm folded in (its elementwise scale in the weight, its shift in the bias): x's rows are normalized
  // in the kernel, out = act(norm(x) @ w.T + bias) + residual (see csrc/cuda/linear_epilogue.cuh).
  LinearNorm norm = LinearNorm::kNone;
  const float* norm_sum = nullptr;  // [n] float32, for kLayer: the weight's row sums
  float eps = 1e-5f;                // added to the variance (kLayer) or mean square (kRms)
  const void* residual = nullptr;   // [rows, n] of `type`, contiguous, added last; or nullptr
};

// The most rows decode_linear takes (one MMA tile): past that a cuBLAS GEMM is as fast.
constexpr std::int64_t kDecodeLinearMaxRows = 8;
// K per warp step: 16 bytes of each of a lane's two weight rows.
constexpr std::int64_t kDecodeLinearChunk = 32;
// ---- A decode step in one persistent kernel (csrc/cuda/decode_stream.cu): a program of operations run by one
// block an SM by default, or fewer (DecodeProgram.blocks), every block resident at once (a cooperative launch),
// the weights streamed through shared memory ahead of need and every operation's output written as words tagged
// with the launch, which its readers poll (no grid barrier). Batch 1, fp16/bf16 activations, weights of that type
// or int8 with per-row scales, compute capability 9.0+. Capturable: ids and position are read on the device.
constexpr int kDecodeStreamEmbed = 0;      // out = table[id] (+ positions[position + position_offset])
constexpr int kDecodeStreamLinear = 1;     // out = act(norm(in) @ weight.T + bias) (+ residual)
constexpr int kDecodeStreamAttention = 2;  // out[h] = attention of head h over the cache's 0 .. position
constexpr int kDecodeStreamMaxParts = 3;
constexpr int kDecodeStreamMaxK = 8192;    // a linear operation's input values
constexpr int kDecodeStreamMaxLen = 4096;  // an attention's cache positions (a policy limit: no kernel buffer bounds it)
struct DecodeStreamOp {
  int kind = kDecodeStreamLinear;
  int n = 0;          // output values: linear, the parts' rows summed (a multiple of 16); embed, the hidden size
                      // (a multiple of 16); attention, heads * head_dim
  int k = 0;          // linear: input values, a multiple of 64 up to kDecodeStreamMaxK
  int input = -1;     // word offset in the tags of the input (linear: 16-byte aligned; attention: the fused
                      // q/k/v output, the heads' queries, then keys, then values)
  int output = -1;    // word offset of the output (-1: none)
  int residual = -1;  // word offset of an activation added last (linear), or -1
  int relu = 0;       // linear: a ReLU after the bias
  int parts = 1;      // linear: the weight's row blocks (q, k and v in one operation without a copy)
  int part_rows[kDecodeStreamMaxParts] = {};             // multiples of 16
  const void* weight[kDecodeStreamMaxParts] = {};        // [part_rows, k], contiguous, 16-byte aligned: of T,
                                                         // or int8 in a program of int8 weights
  // linear, int8 weights: each output row's sum times its scale (float32 [n]) before the norm's correction and
  // the shift; null for weights of T
  const float* weight_scale = nullptr;
  // linear: added to output row r before the ReLU: the bias, and with a layer norm weight @ norm_bias too
  // (float32 [n]), or null
  const float* shift = nullptr;
  // linear: a layer norm of the input first, folded into the product with its scale on the input (norm_weight
  // [k] of T): out = rstd * (weight @ (norm_weight * in) - mean * norm_sum) + shift, norm_sum = weight @
  // norm_weight (float32 [n], required with norm_weight). Both null: no norm.
  const void* norm_weight = nullptr;
  const float* norm_sum = nullptr;
  float eps = 1e-5f;
  void* plain = nullptr;              // linear: the output also written as T [n] (the logits), or null
  const void* table = nullptr;        // embed: [vocab, n]
  const void* positions = nullptr;    // embed: [rows, n] or null
  int position_offset = 0;
  void* k_cache = nullptr;  // attention: [heads, max_len, head_dim] (batch 1), the step writes row position
  void* v_cache = nullptr;
  int heads = 0;
  int head_dim = 0;  // 64 or 128
  int max_len = 0;
  float scale = 1.0f;
  int first_block = 0;  // linear: tile t runs in block (first_block + t) % blocks; attention: head h likewise
};
struct DecodeStreamParams {
  ActivationType type = ActivationType::kFloat16;
  bool int8_weights = false;  // every linear operation's weights int8 (with scales), or all of `type`
  const DecodeStreamOp* ops = nullptr;  // device memory
  int n_ops = 0;
  unsigned* tags = nullptr;                // the activations' words, zero before the first launch
  unsigned long long* launches = nullptr;  // zero before the first launch
  long long* ids = nullptr;                // device: the step's token (written with greedy)
  long long* position = nullptr;           // device: the step's position, the cache's fill level (advanced
                                           // with greedy)
  int vocab = 0;                           // ids must be below it
  int max_position = 0;                    // the position must be below it
  int device = 0;
  int blocks = 0;  // the grid: 1 .. decode_stream_blocks(device), the SMs (DecodeProgram.blocks; default all)
  int stages = 0;  // the ring's stages: 2 .. decode_stream_stages(type, device, int8_weights)
  long long* trace = nullptr;  // null, or [blocks][n_ops][2] int64: each block's globaltimer (ns) when an
                               // operation's input was in and when it was done (a profile); a linear's input
                               // time is its last warp's, kept by atomicMax: start the tensor below any
                               // timestamp, e.g. 0 or -1
  // Greedy decoding's bookkeeping in the step, or null: the first index of the largest value of the last
  // operation's output (a linear operation's `plain`: the logits, at most `vocab` of them) written into *ids and
  // tokens[clamp(*column, 0, token_slots - 1)], then *position and *column advanced by one. greedy: two uint64
  // words, zero before the first launch; each launch leaves them zero.
  unsigned long long* greedy = nullptr;
  long long* tokens = nullptr;
  long long* column = nullptr;
  int token_slots = 0;
};
int decode_stream_blocks(int device);
// The most ring stages a block of the kernel for `type` (and int8 or `type` weights) holds on `device` (its shared
// memory); it also lets the kernel use that much, once for all later launches: call it before the first.
int decode_stream_stages(ActivationType type, int device, bool int8_weights = false);
void decode_stream(const DecodeStreamParams& p, cudaStream_t stream);

// Whether decode_linear takes these arguments: fp16/bf16, 1 <= rows <= kDecodeLinearMaxRows, n >= 1,
// k a positive multiple of kDecodeLinearChunk, x and weight 16-byte aligned, and p.device of compute
// capability 8.0+ with this binary's code for it built for 8.0+ (asked once per device).
bool decode_linear_supported(const DecodeLinearParams& p);
// GPUOPT_CHECK_VALUE unless decode_linear_supported(p), p.warps is 0, 4, 8, 16 or 32 and p.vector 0, 1, 2
// or 4.
void decode_linear(const DecodeLinearParams& p, cudaStream_t stream);

// ---- row-wise quantization: for each row r of x [rows, k], amax = max |x[r, :]|, scale[r] =
// amax / qmax (1 for an all-zero row) and q[r, i] = x[r, i] * (qmax / amax), rounded to the
// nearest int8 (clamped to +-127) or saturated to float8 e4m3 (qmax 448). One kernel: a row that fits
// registers (k <= 16384 16-bit values; up to 2048 values a row takes 8 to 32 threads of a warp, longer
// ones a block) is read once; longer rows (or odd k, unaligned data) are read again (from L2).
// Capturable.
//
// A prologue, applied in float32 before the absmax (the step that produced x folded in, so that its
// output is never written): a norm of the row (layer: (x - mean) * rsqrt(var + eps); rms: x * rsqrt(mean
// square + eps)) with its elementwise weight and bias, then an activation.
enum class QuantType { kInt8, kFloat8E4M3 };
enum class QuantizeActivation { kNone, kGelu, kGeluTanh, kRelu, kSilu };

struct QuantizeRowsParams {
  ActivationType type = ActivationType::kFloat32;  // of x
  QuantType qtype = QuantType::kFloat8E4M3;
  const void* x = nullptr;  // [rows, k], contiguous
  void* q = nullptr;        // [rows, k], one byte per value, contiguous
  float* scales = nullptr;  // [rows]
  std::int64_t rows = 0, k = 0;
  LinearNorm norm = LinearNorm::kNone;
  const float* norm_weight = nullptr;  // [k] float32 or nullptr (1): the norm's elementwise scale
  const float* norm_bias = nullptr;    // [k] float32 or nullptr (0): its shift (kLayer only)
  float eps = 1e-5f;
  QuantizeActivation activation = QuantizeActivation::kNone;  // after the norm
  void* y = nullptr;  // [rows, k] of `type`, contiguous, or nullptr: the prologue's output, written as well
};

// The largest value of each quantized type.
constexpr float kInt8Max = 127.0f;
constexpr float kFloat8E4M3Max = 448.0f;

// GPUOPT_CHECK_VALUE unless rows >= 0 and k >= 1 with non-null pointers, and a bias only with kLayer.
void quantize_rows(const QuantizeRowsParams& p, cudaStream_t stream);

// ---- decode attention: one query token per (batch row, head) against a KV cache,
// out[b, 0, h, :] = softmax(scale * q[b, h] . k[b, h / group, j] over the keys j that mask lets
// through) @ v[b, h / group, :], in fp32, written in the inputs' type (grouped-query attention when
// heads > kv_heads). One block per (head, batch row), one pass over the keys with FlashAttention's
// running-maximum softmax; a masked key costs one byte of mask, its K and V rows are not read. A
// query that no key may attend to gets zeros. Capturable (no allocation, no synchronization).
struct DecodeAttentionParams {
  ActivationType type = ActivationType::kFloat32;  // of q, k, v and out
  const void* q = nullptr;     // [batch, heads, 1, head_dim], head_dim contiguous
  const void* k = nullptr;     // [batch, kv_heads, keys, head_dim], head_dim contiguous
  const void* v = nullptr;     // the same
  const bool* mask = nullptr;  // broadcast to [batch, heads, 1, keys] by its strides; nullptr: all keys
  void* out = nullptr;         // [batch, 1, heads, head_dim], contiguous
  std::int64_t batch = 0, heads = 0, kv_heads = 0, keys = 0, head_dim = 0;
  std::int64_t q_stride_b = 0, q_stride_h = 0;  // strides in elements
  std::int64_t k_stride_b = 0, k_stride_h = 0, k_stride_l = 0;
  std::int64_t v_stride_b = 0, v_stride_h = 0, v_stride_l = 0;
  std::int64_t mask_stride_b = 0, mask_stride_h = 0, mask_stride_l = 0;
  float scale = 1.0f;  // applied to the dot products
  int device = 0;      // the CUDA device of every pointer
  // Split-KV workspace, decode_attention_workspace(p) floats (nullptr where that is 0).
  float* workspace = nullptr;
  // Appending (decode_attention_append): the new token's key and value, [batch, kv_heads, 1, head_dim]
  // with head_dim contiguous, written into k and v at row *position (an int64 on the device; a row
  // outside [0, keys) writes nothing) and attended from there. k_new == nullptr: nothing appended.
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  std::int64_t k_new_stride_b = 0, k_new_stride_h = 0, v_new_stride_b = 0, v_new_stride_h = 0;
  const std::int64_t* position = nullptr;
  // Appending only (needs k_new): attend to rows [0, *position] (a decode step's causal mask, kept on
  // the device) instead of the whole cache; mask, if any, applies as well. A negative position attends
  // to no key (zeros), one at or past the end to the whole cache.
  bool causal = false;
};

// Whether decode_attention takes p: head_dim 32, 64, 128 or 256; batch, heads, kv_heads and keys >= 1
// with heads a multiple of kv_heads (and within a grid: heads < 2^31, batch <= 65535, keys < 2^31);
// q, k, v, out (and k_new, v_new) 16-byte aligned with every row stride a multiple of 16 bytes.
bool decode_attention_supported(const DecodeAttentionParams& p);
// Floats of workspace decode_attention needs for p: 0 unless the cache is long (over 1024 keys) and
// the (batch, head) pairs too few to fill the device, when the keys are split over several blocks
// per pair (FlashDecoding's split-KV) and a second kernel combines the splits.
std::int64_t decode_attention_workspace(const DecodeAttentionParams& p);
// GPUOPT_CHECK_VALUE unless decode_attention_supported(p) and p.workspace holds
// decode_attention_workspace(p) floats.
void decode_attention(const DecodeAttentionParams& p, cudaStream_t stream);

// A single-thread kernel that spins for `ns` nanoseconds of %globaltimer. Queued before a timed
// region it keeps the GPU busy while the host enqueues the region, so launch gaps stay out of
// device-time measurements.
void delay(std::uint64_t ns, cudaStream_t stream);

// Device-to-device copy of `bytes`, `reps` times back to back between events; ms per copy.
double time_copy_ms(void* dst, const void* src, std::size_t bytes, int reps, cudaStream_t stream);

// cudaDeviceGetAttribute, checked.
int device_attribute(cudaDeviceAttr attribute, int device);
std::size_t l2_cache_bytes(int device);

// ---- Device ceilings (micro-benchmarks of ours). Each runs `reps` timed launches on `stream` after
// one warm-up launch and returns the median rate. Buffers are the caller's.
struct Rate {
  double median = 0;  // GB/s, TFLOP/s or us, per the function
  double best = 0;
};
// HBM: 16-byte vectorised grid-stride loops; bytes counted once each (copy: read + written).
Rate hbm_read_gbps(const void* buffer, std::size_t bytes, int reps, cudaStream_t stream);
Rate hbm_write_gbps(void* buffer, std::size_t bytes, int reps, cudaStream_t stream);
Rate hbm_copy_gbps(void* dst, const void* src, std::size_t bytes, int reps, cudaStream_t stream);
// L2: `passes` reads of a buffer small enough to stay in L2, loads cached at L2 only (ld.global.cg).
Rate l2_read_gbps(const void* buffer, std::size_t bytes, int passes, int reps, cudaStream_t stream);
// CUDA-core FP32: independent FMA chains in every thread of a full grid; FLOPs = 2 per FMA.
Rate fp32_fma_tflops(float* sink, int reps, cudaStream_t stream);
// Empty kernels: host microseconds per launch, and device microseconds per kernel when launched
// back to back (launch-rate bound).
struct LaunchCost {
  double host_us_per_launch = 0;
  double device_us_per_kernel = 0;
};
LaunchCost launch_overhead(int launches, cudaStream_t stream);
// A CUDA graph of `nodes` empty kernels, replayed: device microseconds per node.
Rate graph_node_us(int nodes, int reps, cudaStream_t stream);

int runtime_version();  // e.g. 13000
int driver_version();   // the CUDA version the driver supports, e.g. 13000; 0 without a driver

}  // namespace gpuopt::cuda
