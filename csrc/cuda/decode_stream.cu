// A decode step in one persistent kernel (gpuopt::cuda::decode_stream): a program of operations (embedding,
// linear layers with a layer norm before and a bias, ReLU and residual after, attention over a static KV cache)
// run by one block an SM (or fewer, DecodeProgram.blocks), every block resident at once (a cooperative launch).
//
// Weights stream: each block's last warp (the producer) bulk-copies the weight tiles the block will need, in the
// order it will need them, operation after operation, into a ring of shared-memory stages. The weights depend on
// nothing the step computes, so HBM keeps streaming while the 16 consumer warps wait for an operation's input.
// The warp before it (the epilogue warp) finishes each tile the consumers have summed (run_epilogues) while they
// go on to the next tile's segments, and during an attention asks L1 for the cache rows of its second pass.
//
// Activations are tagged words (stream_kernels.cuh): every operation's output is written as 32-bit words, the
// value in the low half and the launch's epoch in the high half, each into a buffer of its own; a block needing
// an input polls the words until all carry its epoch. No block ever waits at the end of an operation, and there
// is no grid barrier and no fence: an operation starts in a block as soon as the values it reads are there.
// The epoch: every block adds one to a launch counter at its start; count / blocks + 1 (mod 65535) is the same
// for all blocks of a launch and differs from the last launch's (launches on one stream do not overlap).
//
// A linear operation: block b takes tiles t, t + grid, ... of 16 output rows, t = (b - op.first_block) mod grid
// (the host deals each operation's tiles on from where the one before stopped). Its input (k values, at most
// kDecodeStreamMaxK) is asked for whole and waited for a segment at a time into shared memory. Each tile is
// summed by 16 warps with tensor-core MMAs (warp w takes the 64-value chunks w, w + 16, ... as decode_linear's
// kernel does) from the ring's stages of 16 rows x 2048 bytes (1024 values of T; int8 weights: 2048 values, a
// warp's chunks w and w + 16, each word widened to T exactly for the MMAs and the sums scaled in the epilogue),
// and its 16 warps' sums handed to the epilogue warp through two buffers with full and empty mbarriers
// (SumsHandoff): no block barrier a tile. On the H200, OPT-1.3B's TPOT went from 883.0 to 849.1 us in fp16 and
// from 682.5 to 633.4 in int8 with the epilogue warp, against warp 0 running each epilogue between the tile's
// barrier and its next MMAs (three interleaved rounds, 2026-11-29).
// A layer norm before is folded as linear_epilogue.cuh folds it, with its scale on the input instead of in a copy
// of the weight: the values are multiplied by the norm's weights as they come in, and the sums corrected in the
// epilogue with the mean and deviation and weight @ norm_weight. Each consumer warp adds up its threads' sums and
// sums of squares of the raw input values once all are in and hands them over with the block's first tile; the
// epilogue warp adds up the 16 warps' and takes the mean and deviation before that tile's epilogue. (Reduced by
// the consumers with two block barriers before the first tile's handoff, as at 2f0b8b1, they held up every warp's
// next tile: on the H200, OPT-1.3B's TPOT went from 843.7 to 830.5 us in fp16 and from 613.3 to 598.6 in int8
// with the epilogue warp taking them; three interleaved rounds, dev log llm_decode-megakernel-norm-dev-7a24f92.)
// Rounding: norm_weight * in is rounded to T where the model rounds the normed values, so the rounding error grows
// with the input's mean over its deviation (about 6 times the model's at a mean of 6 deviations; OPT's parity is
// unchanged). The shift (bias, and weight @ norm_bias) is added to the float32 sum and the result rounded to T;
// the ReLU and the residual follow in T's precision, as the model's own modules round.
//
// An attention operation (batch 1): block b takes heads h, h + grid, ... (h as t above). It polls the head's
// query and key (the input is the fused q/k/v output: the heads' queries, then keys, then values), writes the key
// into the cache at the step's position, attends to positions 0 .. position in float32 (each warp its own rows,
// from scores to weighted values; the warps combined once), and polls the value last (writing it into the cache
// too). The embedding's values are written by every block, 16 a block.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "decode_linear_kernels.cuh"  // linear_mma_words, kLinearChunk
#include "gpuopt/cuda.h"
#include "stream_kernels.cuh"
#include "values.cuh"

namespace gpuopt::cuda {
namespace kernels {

constexpr int kDsWarps = 16;  // consumer warps; the epilogue warp and the producer are two more
[[maybe_unused]] constexpr int kDsThreads = kDsWarps * 32;
constexpr int kDsVec = 2;  // 16-byte words of a row per lane and chunk (a chunk: 64 values)
constexpr int kDsChunk = kDsVec * kLinearChunk;
constexpr int kDsSegment = kDsWarps * kDsChunk;  // a stage's values of a row of T: 1024
// A stage's values of a row of W: 2048 bytes (1024 of T, or 2048 int8 values, a warp taking chunks w and w + 16),
// a bulk copy each. On the H200, OPT-1.3B's int8 step at position 300 took 812 us with rows of 1024 int8 values
// (6 to 11 stages; both LM heads 52 us, fp16's step 885 us) and 657 us with 2048 (5 stages; LM head 31 us);
// rows of 4096 bytes (2 or 3 stages fit) took 687-694 us in int8 and 924-937 in fp16, against 657 and 894
// (interleaved, 2026-11-29).
template <typename W>
constexpr int kDsSegmentOf = kDsSegment * 2 / static_cast<int>(sizeof(W));
// A stage's row of weights of type W (T, or int8 with a scale per row) and the bytes after it: a lane (g, t) of
// the MMAs reads 16 bytes at 16 t * sizeof(W) of rows g and g + 8, so row g starts 16 bytes (T: lanes t cover 128
// bytes) or 64 bytes (int8: 64) after row g - 1 modulo 128: the 8 lanes of a 16-byte load's phase hit 8
// different 4-bank groups.
template <typename W>
constexpr int kDsRowBytes = kDsSegmentOf<W> * static_cast<int>(sizeof(W)) + (sizeof(W) == 1 ? 64 : 16);
template <typename W>
constexpr int kDsStageBytes = 16 * kDsRowBytes<W>;
[[maybe_unused]] constexpr int kDsMaxDim = 128;  // head size

template <typename T>
__device__ __forceinline__ unsigned short bits_of(T v) {
  unsigned short b;
  memcpy(&b, &v, sizeof(b));
  return b;
}

template <typename T>
__device__ __forceinline__ T value_of(unsigned word) {
  const auto b = static_cast<unsigned short>(word & 0xffffu);
  T v;
  memcpy(&v, &b, sizeof(v));
  return v;
}

template <typename T>
__device__ __forceinline__ void put(unsigned* tags, int offset, int index, T v, unsigned epoch) {
  tagged_store(tags + offset + index, bits_of(v) | (epoch << 16));
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// The block's first tile (linear) or head (attention) of `op`: tile or head t runs in block
// (op.first_block + t) % grid.
__device__ __forceinline__ int first_of(const DecodeStreamOp& op) {
  const int grid = static_cast<int>(gridDim.x);
  return (static_cast<int>(blockIdx.x) - op.first_block % grid + grid) % grid;
}

// The rows of tile `tile` (16 output rows from 16 * tile) in op's parts: the part and the first row in it.
__device__ __forceinline__ int tile_part(const DecodeStreamOp& op, int tile, int& row) {
  row = tile * 16;
  int part = 0;
  while (part + 1 < op.parts && row >= op.part_rows[part]) {
    row -= op.part_rows[part];
    ++part;
  }
  return part;
}

// The block's weight segments (16 rows x up to kDsSegmentOf<W> values of one tile: 1024 of T, 2048 int8; W: the
// weights' type), in the consumers' order: linear operations in program order, the block's tiles first_of(op),
// + grid, ... of each, a tile's K in kDsSegmentOf<W>-value steps.
template <typename W>
struct Segments {
  const DecodeStreamOp* ops;
  int n_ops;
  int s = -1;
  int tile = 0;
  int seg = 0;
  // Moves to the next segment; false past the last.
  __device__ bool advance() {
    if (s >= 0) {
      if (++seg * kDsSegmentOf<W> < ops[s].k) return true;
      seg = 0;
      tile += static_cast<int>(gridDim.x);
      if (tile * 16 < ops[s].n) return true;
    }
    while (++s < n_ops) {
      const int first = first_of(ops[s]);
      if (ops[s].kind == kDecodeStreamLinear && first * 16 < ops[s].n) {
        tile = first;
        seg = 0;
        return true;
      }
    }
    return false;
  }
  // Row r of the segment and its values.
  __device__ const W* row(int r, int& len) const {
    const DecodeStreamOp& op = ops[s];
    int first = 0;
    const int part = tile_part(op, tile, first);
    len = min(kDsSegmentOf<W>, op.k - seg * kDsSegmentOf<W>);
    return static_cast<const W*>(op.weight[part]) + static_cast<std::int64_t>(first + r) * op.k +
           seg * kDsSegmentOf<W>;
  }
};

// A place in the ring: its stage and the parity of the stage's current phase (the wait of a full barrier's phase;
// an empty barrier's is the other parity), advanced a segment at a time. Counted, not divided out of a segment
// number: the division by the run-time stage count took 25 dependent instructions a segment, in front of every
// segment's wait.
struct RingAt {
  unsigned stage = 0;
  unsigned parity = 0;
  __device__ __forceinline__ void advance(int stages) {
    if (++stage == static_cast<unsigned>(stages)) {
      stage = 0;
      parity ^= 1u;
    }
  }
};

// The producer warp: every segment into the ring, in the consumers' order.
template <typename W>
__device__ void produce(const DecodeStreamOp* ops, int n_ops, unsigned char* ring, std::uint64_t* full,
                        std::uint64_t* empty, int stages) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  Segments<W> next{ops, n_ops};
  for (RingAt at; next.advance(); at.advance(stages)) {
    const unsigned stage = at.stage;
    int len = 0;
    const W* src = next.row(lane < 16 ? lane : 0, len);
    if (lane == 0) {
      stage_wait(&empty[stage], at.parity ^ 1u);
      stage_expect(&full[stage], 16u * static_cast<unsigned>(len) * sizeof(W));
    }
    __syncwarp();
    if (lane < 16) {
      stage_copy(ring + static_cast<std::size_t>(stage) * kDsStageBytes<W> + lane * kDsRowBytes<W>, src,
                 static_cast<unsigned>(len) * sizeof(W), &full[stage]);
    }
  }
}

__device__ __forceinline__ uint2 pack_values(const uint4& w) {
  return make_uint2((w.x & 0xffffu) | (w.y << 16), (w.z & 0xffffu) | (w.w << 16));
}

constexpr int kDsWordsPerThread = kDecodeStreamMaxK / 4 / kDsThreads;  // 16-byte words of an input a thread
static_assert(kDsWordsPerThread * 4 * kDsThreads == kDecodeStreamMaxK && kDsWordsPerThread <= 32,
              "an input's words are dealt evenly, a thread's pending ones fit a 32-bit mask");
constexpr int kDsChunkWords = kDsChunk / 4;  // a chunk's words of 4 input values
static_assert(32 % kDsChunkWords == 0 && kDecodeStreamMaxK % (4 * kDsChunkWords * kDsWarps) == 0,
              "a warp's lanes take whole chunks");

// The input word (4 values) that thread threadIdx.x takes as its e-th: one of the values its own warp's MMAs read.
// Consumer warp w reads the values v with v / kDsChunk % kDsWarps == w (fp16: chunk w of each 1024-value segment;
// int8: chunks w and w + 16 of each 2048-value one), so a warp waits for its own values only and starts its MMAs
// while other warps still wait for theirs; no block barrier stands between an input's last value and the MMAs
// that read it. For each e, lanes 0-15 take one of the warp's chunks (16 words) and lanes 16-31 the next.
__device__ __forceinline__ int word_of(int e) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int row = e * (32 / kDsChunkWords) + lane / kDsChunkWords;  // of kDsWarps chunks
  return (row * kDsWarps + warp) * kDsChunkWords + lane % kDsChunkWords;
}

// A word of 4 input values into xs's form: with a layer norm (g: its weights for the 4 values), their sum and
// sum of squares written to stats in float32 and the values multiplied by the weights (rounded to T).
template <typename T>
__device__ __forceinline__ uint2 take_word(const uint4& w, const T* g, float* stats) {
  if (g == nullptr) return pack_values(w);
  const unsigned words[4] = {w.x, w.y, w.z, w.w};
  const uint2 gw = __ldg(reinterpret_cast<const uint2*>(g));
  const unsigned gs[2] = {gw.x, gw.y};
  unsigned out[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float a = to_float(value_of<T>(words[2 * h]));
    const float b = to_float(value_of<T>(words[2 * h + 1]));
    stats[0] += a + b;
    stats[1] += a * a + b * b;
    const float2 scale = unpack2(gs[h], T{});
    out[h] = static_cast<unsigned>(bits_of(from_float<T>(a * scale.x))) |
             (static_cast<unsigned>(bits_of(from_float<T>(b * scale.y))) << 16);
  }
  return make_uint2(out[0], out[1]);
}

// An input's statistics for a layer norm: each of the thread's words' sum and sum of squares, kept apart so
// that they are added in the words' order, whatever order they came in (the same bits every run).
using WordStats = float[kDsWordsPerThread][2];

// An activation's k values asked for all at once, those already written into xs (through take_word: g, the
// norm's weights, or null); returns the thread's words still to come (bit e: its word word_of(e)), for
// take_values (the caller syncs its warp). The norm's weights of those are asked into L1 meanwhile.
template <typename T>
__device__ __forceinline__ unsigned ask_values(const unsigned* words, unsigned epoch, T* xs, int k, const T* g,
                                               WordStats& stats) {
  uint4 w[kDsWordsPerThread] = {};
#pragma unroll
  for (int e = 0; e < kDsWordsPerThread; ++e) {
    const int j = word_of(e);
    if (j < k / 4) w[e] = tagged_load4(words + 4 * j);
  }
  unsigned pending = 0;
#pragma unroll
  for (int e = 0; e < kDsWordsPerThread; ++e) {
    const int j = word_of(e);
    if (j < k / 4) {
      if (tagged4(w[e], epoch)) {
        reinterpret_cast<uint2*>(xs)[j] = take_word<T>(w[e], g != nullptr ? g + 4 * j : nullptr, stats[e]);
      } else {
        pending |= 1u << e;
        if (g != nullptr) prefetch_l1(g + 4 * j);
      }
    }
  }
  return pending;
}

// The values [first, end) still to come after ask_values, waited for into xs (the caller syncs its warp).
template <typename T>
__device__ __forceinline__ void take_values(const unsigned* words, unsigned epoch, T* xs, int first, int end,
                                            unsigned pending, const T* g, WordStats& stats) {
#pragma unroll
  for (int e = 0; e < kDsWordsPerThread; ++e) {
    const int j = word_of(e);
    if ((pending >> e & 1u) != 0 && 4 * j >= first && 4 * j < end) {
      reinterpret_cast<uint2*>(xs)[j] =
          take_word<T>(tagged_wait4(words + 4 * j, epoch), g != nullptr ? g + 4 * j : nullptr, stats[e]);
    }
  }
}

// What output row n's epilogue takes (c < 16: the tile's row c): the int8 weights' scale, the shift and the
// norm's sum (the epilogue's rows), and the residual's word (its tag checked when it is added).
struct Epilogue {
  float scale = 1.0f;
  float shift = 0.0f;
  float norm_sum = 0.0f;
  unsigned residual = 0;
};

// The epilogue's rows of a block's first kDsHeldTiles tiles of an operation are copied (cp.async) into scratch
// behind the tiles' two sum buffers (float [tile][scale, shift, norm sum][16]) by the epilogue warp when it reaches
// the operation (after the last epilogue of the operation before, usually while the consumers still wait for the
// input), and waited for before its first epilogue. Asked a tile ahead with __ldg instead, the
// rows (evicted from L2 by the weights streaming through it) came from DRAM behind the weight stream and held up
// every tile whose weights were already in the ring: on the H200, OPT-1.3B's int8 step at position 300 took
// 741 us that way and 693 us with the rows held, fp16's 927.5 and 918 (with no rows read at all, wrong logits:
// 687 and 907; interleaved, 2026-11-29). Their room in scratch costs no shared memory: a first try (57976af)
// held them in an array of their own, 6 KB more, which takes int8's five stages past 196 KB a block (the L1 then
// has 28 KB of the SM's 256, not 60). An LM head of more than kDsHeldTiles tiles a block asks the later tiles' rows a
// tile ahead.
constexpr int kDsHeldTiles = 32;
using HeldRows = float[3][16];
constexpr int kDsSumFloats = 2 * kDsWarps * 16;  // the tiles' sums, two buffers, at scratch's start
static_assert(kDsSumFloats + kDsHeldTiles * 3 * 16 <= kDsWarps * kDsMaxDim, "the held rows fit in scratch");

// A linear operation's fields that the epilogue warp reads at every tile, copied into shared memory when it
// reaches the operation (the same values written by every lane, then __syncwarp; the next operation's copy comes
// after run_epilogues' last __syncwarp). Read from the program (global memory) instead, each was reloaded after
// every wait's memory clobber: a series of global loads in every epilogue. Held in registers instead (compiled
// here, not run), they made ptxas spill 4-48 bytes, with local loads in the consumers' path. See ConsumerFields
// for what both bought.
struct EpilogueFields {
  int n;
  int k;
  float eps;
  int residual;
  int output;
  int relu;
  void* plain;
  const float* rows[3];  // the int8 weights' scales, the shift, the norm's sums (each may be null)
};

// By the 32 lanes of one warp.
__device__ __forceinline__ void ask_rows(const EpilogueFields& f, int first_tile, HeldRows* held) {
  const int blocks = static_cast<int>(gridDim.x);
  const int tiles = min((f.n / 16 - first_tile + blocks - 1) / blocks, kDsHeldTiles);  // n: 16 rows a tile
  for (int q = static_cast<int>(threadIdx.x % 32); q < tiles * 48; q += 32) {
    const int j = q / 48;
    const int a = q % 48 / 16;
    const int r = q % 16;
    const float* row = f.rows[a];
    if (row != nullptr) {
      async_copy4(&held[j][a][r], row + (first_tile + j * blocks) * 16 + r);
    } else {
      held[j][a][r] = a == 0 ? 1.0f : 0.0f;
    }
  }
}

// Row n's residual word, asked for a tile ahead; its rows too where they are not held (`far`).
__device__ __forceinline__ Epilogue ask_epilogue(const EpilogueFields& f, const unsigned* tags, int n, bool far) {
  Epilogue e;
  if (far) {
    if (f.rows[0] != nullptr) e.scale = __ldg(f.rows[0] + n);
    if (f.rows[1] != nullptr) e.shift = __ldg(f.rows[1] + n);
    if (f.rows[2] != nullptr) e.norm_sum = __ldg(f.rows[2] + n);
  }
  if (f.residual >= 0) e.residual = tagged_load1(tags + f.residual + n);
  return e;
}

// Greedy decoding's key of output row n with value v: larger for a larger value, then for a smaller n (the
// first maximal index, as torch.argmax; a NaN counts as the largest value and -0 equals +0, as there). Never 0.
__device__ __forceinline__ unsigned long long argmax_key(float v, int n) {
  unsigned bits = __float_as_uint(v);
  if (bits == 0x80000000u) bits = 0u;  // -0 as +0
  bits = isnan(v) ? 0xffffffffu : (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
  return (static_cast<unsigned long long>(bits) << 32) | (0xffffffffu - static_cast<unsigned>(n));
}

// The consumer warps' operation's fields read after a wait or a barrier, copied into shared memory when they
// reach the operation (the same values written by every consumer thread). Read from the program instead, each
// was a global load after the waits' memory clobbers, in front of the next tile's wait (a linear's n), a
// segment's values (its input), the scores or the output (an attention's scale and output); held in registers
// (one more, the bound), ptxas spilled in the int8 kernels' tile loop. On the H200, OPT-1.3B's TPOT went from
// 827.4 to 819.0 us in fp16 and from 601.9 to 582.2 in int8 with the bound and the epilogue warp's fields
// (EpilogueFields, without k and eps) from shared memory, and to 814.9 and 581.3 with the input, the attention's
// fields, k and eps too (three interleaved rounds, dev log llm_decode-megakernel-fields-dev-0478e04).
// No barrier stands between an attention's last read of scale and output and the next linear's writes of n and
// input, so the two pairs must stay apart: a linear's fields are rewritten only after run_linear's last
// barrier, an attention's only after the named barrier before the next attention.
struct ConsumerFields {
  int n;       // linear
  int input;   // linear
  float scale; // attention
  int output;  // attention
};

// The handoff of a tile's sums from the consumer warps to the epilogue warp: two buffers of kDsWarps x 16 floats
// at scratch's start, each with a full barrier (a consumer warp's arrival once its sums are written) and an empty
// one (the epilogue warp's, once it has read them), and, with the block's first tile of an operation with a layer
// norm, each warp's sum and sum of squares of its threads' input values (the epilogue warp takes the mean and
// deviation from them). Tile u (counted over the launch by both sides) uses buffer u % 2 in phase u / 2.
struct SumsHandoff {
  std::uint64_t full[2];
  std::uint64_t empty[2];
  float stats[2][kDsWarps][2];
};
static_assert(kDsWarps == 16, "the epilogue warp's lanes c and c + 16 take consumer warp c's statistics");

// A linear operation's tiles in this block, as the consumer warps run them. The input is asked for whole and
// waited for a segment at a time as the first tile needs it, each warp for the values it reads (word_of): the
// values other blocks wrote first are summed while the last ones are written. With a layer norm, the values are
// multiplied by the norm's weights as they come, each warp's sums of the raw values (and of their squares) go to
// the epilogue warp with the first tile, which takes the mean and variance, and the tiles' sums are corrected in
// the epilogue (DecodeStreamOp::norm_sum): the norm never holds up the MMAs, and no block barrier stands between
// the first tile's MMAs and its handoff, except after an attention (after_attention, below). W: the weights' type,
// T or int8 (a lane's 16-byte word of a row is then 16 values, widened to T exactly for the MMAs, and the sums are
// multiplied by the row's scale in the epilogue; a segment is 2048 values, a warp's chunks w and w + 16). A tile's
// sums go to the epilogue warp (run_epilogues) without a wait for it: the consumers go on to the next tile's
// segments while it finishes the last one. after_attention: the operation before was an attention, whose first
// head-size threads may still be reading its partial sums in scratch, where the tiles' sums go; the consumers meet
// once before the first sums, or before returning where the block has no tile (the next linear then has
// after_attention false).
template <typename T, typename W>
__device__ void run_linear(const DecodeStreamOp& op, unsigned* tags, unsigned epoch, T* xs, float* scratch,
                           unsigned char* ring, std::uint64_t* full, std::uint64_t* empty, int stages,
                           RingAt& at, SumsHandoff& handoff, unsigned& u, long long* trace, ConsumerFields& f,
                           bool after_attention) {
  const int blocks = static_cast<int>(gridDim.x);
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int g = lane / 4;
  const int t = lane % 4;
  const int k = op.k;
  const int first_tile = first_of(op);
  if (first_tile * 16 >= op.n) {  // block-uniform
    if (after_attention) consumers_sync<kDsThreads>();
    return;
  }
  f.n = op.n;
  f.input = op.input;
  const auto* gamma = static_cast<const T*>(op.norm_weight);
  constexpr int kSeg = kDsSegmentOf<W>;
  const int segments = (k + kSeg - 1) / kSeg;
  WordStats stats = {};  // the norm's sums of this thread's words
  int ready = 0;
  const unsigned pending = ask_values(tags + op.input, epoch, xs, k, gamma, stats);
  for (int tile = first_tile; tile * 16 < f.n; tile += blocks, ++u) {
    // Two sums a lane, each of half the MMAs (fp16: a lane's first and second 16-byte word of a chunk; int8: chunks
    // warp and warp + 16), added at the tile's end: two chains of dependent MMAs, not one twice as long.
    float acc[2][4] = {};
    for (int seg = 0; seg * kSeg < k; ++seg, at.advance(stages)) {
      const int len = min(kSeg, k - seg * kSeg);
      if (seg == ready) {
        take_values(tags + f.input, epoch, xs, seg * kSeg, seg * kSeg + len, pending, gamma, stats);
        __syncwarp();  // the warp's values of the segment, all it reads (word_of)
        if (++ready == segments && trace != nullptr && lane == 0) atomicMax(trace, now_ns());  // the last warp's
      }
      stage_wait(&full[at.stage], at.parity);
      const unsigned char* st = ring + static_cast<std::size_t>(at.stage) * kDsStageBytes<W>;
      if constexpr (sizeof(W) == 1) {  // chunks warp and warp + 16: a lane's 16 values of a row in one word
        static_assert(kDsVec == 2, "a lane's 16 int8 values pair with its two words of x");
        // Both chunks' words are loaded before the MMAs of either. A lane past the segment's values (a last,
        // shorter segment) reads its row's first word with x zero: int8 weights are finite, so it adds 0.
        uint4 wl[2], wh[2];
        uint4 x2[2][1][2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int col = (warp + h * kDsWarps) * kDsChunk + 8 * kDsVec * t;
          const bool in = col < len;
          wl[h] = *reinterpret_cast<const uint4*>(st + g * kDsRowBytes<W> + (in ? col : 0));
          wh[h] = *reinterpret_cast<const uint4*>(st + (g + 8) * kDsRowBytes<W> + (in ? col : 0));
          const auto* xv = reinterpret_cast<const uint4*>(xs + seg * kSeg + (in ? col : 0));
          x2[h][0][0] = in ? xv[0] : make_uint4(0u, 0u, 0u, 0u);
          x2[h][0][1] = in ? xv[1] : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          int8_mma_chunk<T, 1>(wl[h], wh[h], x2[h], reinterpret_cast<float(&)[1][4]>(acc[h]));
        }
      } else if (warp * kDsChunk < len) {
        const int col = (warp * kDsChunk + 8 * kDsVec * t) * static_cast<int>(sizeof(W));
        const auto* wl = reinterpret_cast<const uint4*>(st + g * kDsRowBytes<W> + col);
        const auto* wh = reinterpret_cast<const uint4*>(st + (g + 8) * kDsRowBytes<W> + col);
        const auto* xv = reinterpret_cast<const uint4*>(xs + seg * kSeg + warp * kDsChunk + 8 * kDsVec * t);
#pragma unroll
        for (int v = 0; v < kDsVec; ++v) linear_mma_words<T>(wl[v], wh[v], xv[v], acc[v]);
      }
      __syncwarp();
      if (lane == 0) stage_arrive(&empty[at.stage]);
    }
    // After an attention, its first head-size threads may still be reading its partial sums in scratch
    // (attend_head's combination); a warp whose input did not wait on this block's head gets here first.
    if (after_attention && tile == first_tile) consumers_sync<kDsThreads>();
    const unsigned buffer = u & 1u;
    const unsigned parity = (u >> 1) & 1u;
    // The buffer is free once the epilogue warp has read tile u - 2's sums (at once, nearly always).
    stage_wait(&handoff.empty[buffer], parity ^ 1u);
    // D: lane (g, t) holds output rows g and g + 8 for x rows 2t and 2t + 1: x row 0 is t == 0's.
    float* sums = scratch + buffer * kDsWarps * 16;
    if (t == 0) {
      sums[warp * 16 + g] = acc[0][0] + acc[1][0];
      sums[warp * 16 + g + 8] = acc[0][2] + acc[1][2];
    }
    if (gamma != nullptr && tile == first_tile) {  // every value is in: the warp's share of the norm's statistics
      float norm[2] = {0.0f, 0.0f};  // the warp's sum and sum of squares of its input values
#pragma unroll
      for (int e = 0; e < kDsWordsPerThread; ++e) {
        norm[0] += stats[e][0];
        norm[1] += stats[e][1];
      }
#pragma unroll
      for (int o = 16; o > 0; o /= 2) {
        norm[0] += __shfl_xor_sync(0xffffffffu, norm[0], o);
        norm[1] += __shfl_xor_sync(0xffffffffu, norm[1], o);
      }
      if (lane == 0) {
        handoff.stats[buffer][warp][0] = norm[0];
        handoff.stats[buffer][warp][1] = norm[1];
      }
    }
    __syncwarp();  // the warp's writes before its arrival (which releases them)
    if (lane == 0) stage_arrive(&handoff.full[buffer]);
  }
  consumers_sync<kDsThreads>();  // xs free for the next operation
}

// A linear operation's epilogues in this block, run by the epilogue warp (lane c < 16: the tile's output row c;
// lanes c and c + 16 each add up half of the consumer warps' sums): the int8 scale, the norm's correction, the
// shift, ReLU and residual, and the outputs written (tagged words, the plain output, greedy's key). The rows
// (scale, shift, norm sum) of the block's first kDsHeldTiles tiles are copied into scratch when it reaches the
// operation, after the operation before's last epilogue.
template <typename T>
__device__ void run_epilogues(const DecodeStreamOp& op, unsigned* tags, unsigned epoch, float* scratch,
                              SumsHandoff& handoff, unsigned& u, long long* trace, unsigned long long* best,
                              EpilogueFields& f) {
  const int blocks = static_cast<int>(gridDim.x);
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int c = lane % 16;
  const int half = lane / 16;
  const int first_tile = first_of(op);
  if (first_tile * 16 >= op.n) return;
  f.n = op.n;
  f.k = op.k;
  f.eps = op.eps;
  f.residual = op.residual;
  f.output = op.output;
  f.relu = op.relu;
  f.plain = op.plain;
  f.rows[0] = op.weight_scale;
  f.rows[1] = op.shift;
  f.rows[2] = op.norm_sum;
  __syncwarp();
  const auto* gamma = static_cast<const T*>(op.norm_weight);
  auto* held = reinterpret_cast<HeldRows*>(scratch + kDsSumFloats);
  ask_rows(f, first_tile, held);
  Epilogue now;
  if (lane < 16) now = ask_epilogue(f, tags, first_tile * 16 + c, false);
  float norm[2] = {0.0f, 0.0f};
  unsigned long long mine = 0;  // greedy (best != null): the largest argmax_key of this lane's rows
  for (int tile = first_tile, j = 0; tile * 16 < f.n; tile += blocks, ++j, ++u) {
    const int n = tile * 16 + c;
    Epilogue next;
    if (lane < 16 && n + 16 * blocks < f.n) {
      next = ask_epilogue(f, tags, n + 16 * blocks, j + 1 >= kDsHeldTiles);
    }
    const unsigned buffer = u & 1u;
    stage_wait(&handoff.full[buffer], (u >> 1) & 1u);
    if (j == 0) {
      async_copies_wait();  // the held rows in
      __syncwarp();         // and seen by every lane
      if (gamma != nullptr) {  // the norm's mean and 1 / deviation from the consumer warps' sums (lane c: warp c)
        norm[0] = handoff.stats[buffer][c][0];
        norm[1] = handoff.stats[buffer][c][1];
#pragma unroll
        for (int o = 8; o > 0; o /= 2) {
          norm[0] += __shfl_xor_sync(0xffffffffu, norm[0], o);
          norm[1] += __shfl_xor_sync(0xffffffffu, norm[1], o);
        }
        const float mean = norm[0] / static_cast<float>(f.k);
        norm[0] = mean;
        norm[1] = rsqrtf(fmaxf(norm[1] / static_cast<float>(f.k) - mean * mean, 0.0f) + f.eps);
      }
    }
    const float* sums = scratch + buffer * kDsWarps * 16;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kDsWarps / 2; ++w) sum += sums[(half * kDsWarps / 2 + w) * 16 + c];
    sum += __shfl_xor_sync(0xffffffffu, sum, 16);
    __syncwarp();
    if (lane == 0) stage_arrive(&handoff.empty[buffer]);
    if (lane < 16) {
      if (j < kDsHeldTiles) {
        now.scale = held[j][0][c];
        now.shift = held[j][1][c];
        now.norm_sum = held[j][2][c];
      }
      sum *= now.scale;
      if (gamma != nullptr) sum = norm[1] * (sum - norm[0] * now.norm_sum);
      T y = from_float<T>(sum + now.shift);
      if (f.relu) y = from_float<T>(fmaxf(to_float(y), 0.0f));
      if (f.residual >= 0) {
        if ((now.residual >> 16) != epoch) now.residual = tagged_wait1(tags + f.residual + n, epoch);
        y = from_float<T>(to_float(y) + to_float(value_of<T>(now.residual)));
      }
      if (f.plain != nullptr) static_cast<T*>(f.plain)[n] = y;
      if (best != nullptr) mine = max(mine, argmax_key(to_float(y), n));
      if (f.output >= 0) put<T>(tags, f.output, n, y, epoch);
    }
    now = next;
  }
  if (best != nullptr) {  // the block's largest key (lanes 16 .. 31 hold 0) into *best
#pragma unroll
    for (int o = 8; o > 0; o /= 2) mine = max(mine, __shfl_xor_sync(0xffffffffu, mine, o));
    if (lane == 0) atomicMax(best, mine);
  }
  __syncwarp();  // every lane's reads of the held rows done before the next operation's copies overwrite them
  if (trace != nullptr && lane == 0) trace[1] = now_ns();
}

template <typename T>
__device__ void run_embed(const DecodeStreamOp& op, unsigned* tags, unsigned epoch, long long id, long long position) {
  const int blocks = static_cast<int>(gridDim.x);
  if (threadIdx.x >= 16) return;
  const auto* table = static_cast<const T*>(op.table);
  const auto* positions = static_cast<const T*>(op.positions);
  for (int tile = static_cast<int>(blockIdx.x); tile * 16 < op.n; tile += blocks) {
    const int c = tile * 16 + static_cast<int>(threadIdx.x);
    float v = to_float(table[id * op.n + c]);
    if (positions != nullptr) v += to_float(positions[(position + op.position_offset) * op.n + c]);
    put<T>(tags, op.output, c, from_float<T>(v), epoch);
  }
}

// An attention's pass: the cached rows its 16 warps take at once (kAttendPass<D> / kDsWarps a warp): 256 for a
// head size of 64, 128 for 128.
template <int D>
constexpr int kAttendPass = kDsWarps * 32 / (D / 32);

// A lane's keys of a pass: values [32 * part, 32 * part + 32) of row `row`; zeros past the cached rows (so a
// pass's registers never carry the pass before's).
template <typename T, int D>
__device__ __forceinline__ void load_warp_keys(const T* kc, int row, int part, int cached, uint4 (&keys)[4]) {
  const auto* at = reinterpret_cast<const uint4*>(kc + static_cast<std::int64_t>(row) * D + 32 * part);
#pragma unroll
  for (int w = 0; w < 4; ++w) keys[w] = row < cached ? at[w] : make_uint4(0u, 0u, 0u, 0u);
}

// A lane's values of a pass: dimensions [8 * db, 8 * db + 8) of rows row, row + step, ... (4 rows); zeros
// past the cached rows.
template <typename T, int D>
__device__ __forceinline__ void load_warp_values(const T* vc, int row, int step, int db, int cached,
                                                 uint4 (&values)[4]) {
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const int r = row + u * step;
    values[u] = r < cached ? *reinterpret_cast<const uint4*>(vc + static_cast<std::int64_t>(r) * D + 8 * db)
                           : make_uint4(0u, 0u, 0u, 0u);
  }
}

// One pass of attend_head over the lane's keys and values of rows first .. first + kAttendPass<D> - 1, added into
// the warp's running maximum `most`, the lane's share of the sum `total` and its weighted values `acc`. False
// once the warp has no rows (nor in a later pass).
template <typename T, int D>
__device__ __forceinline__ bool warp_pass(const uint4 (&keys)[4], const uint4 (&values)[4], const float* head,
                                          int first, int cached, int key_row, int key_part, int value_row,
                                          float scale, float& most, float& total, float (&acc)[8]) {
  constexpr int kRowThreads = D / 32;
  constexpr int kWarpRows = 32 / kRowThreads;
  constexpr int kLaneRows = 32 / (D / 8);
  const int warp = static_cast<int>(threadIdx.x / 32);
  asm volatile("" ::: "memory");  // the query read from shared memory here, not hoisted into registers
  const bool in = first + key_row < cached;
  float dot = 0.0f;
  const float* q = head + 32 * key_part;
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const std::uint32_t words[4] = {keys[w].x, keys[w].y, keys[w].z, keys[w].w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = unpack2(words[e], T{});
      dot += q[8 * w + 2 * e] * f.x + q[8 * w + 2 * e + 1] * f.y;
    }
  }
#pragma unroll
  for (int o = 1; o < kRowThreads; o *= 2) dot += __shfl_xor_sync(0xffffffffu, dot, o);
  const float score = in ? dot * scale : -INFINITY;
  float pass_most = score;
#pragma unroll
  for (int o = 16; o > 0; o /= 2) pass_most = fmaxf(pass_most, __shfl_xor_sync(0xffffffffu, pass_most, o));
  if (pass_most == -INFINITY) return false;  // rows past the cache here and in every later pass
  const float now = fmaxf(most, pass_most);
  const float shrink = __expf(most - now);  // 0 on the warp's first pass with rows (most is -inf)
  most = now;
  const float p = in ? __expf(score - now) : 0.0f;
  total = total * shrink + (key_part == 0 ? p : 0.0f);
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const int r = value_row + u * kLaneRows;
    const float pr = __shfl_sync(0xffffffffu, p, (r - warp * kWarpRows) * kRowThreads);  // 0 past the rows
    const std::uint32_t words[4] = {values[u].x, values[u].y, values[u].z, values[u].w};  // zeros there
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = unpack2(words[e], T{});
      acc[2 * e] = acc[2 * e] * (u == 0 ? shrink : 1.0f) + pr * f.x;
      acc[2 * e + 1] = acc[2 * e + 1] * (u == 0 ? shrink : 1.0f) + pr * f.y;
    }
  }
  return true;
}

// Head h of a one-token step: scores of positions 0 .. position (the new key's at position) in float32, the
// softmax, the weighted values; the key and value written into the cache at position. D: the head size.
//
// Each warp takes its own rows of the cache (kAttendPass<D> / kDsWarps a pass) from their keys to their weighted
// values, with a running maximum (FlashAttention's softmax), so no block barrier comes between the scores and the
// values. A lane holds 4 16-byte words of keys (32 values of a row) and 4 of values (8 dimensions of 4 of the warp's
// rows): the first pass's are loaded before the head's query is polled, so their round trips through L2 pass while the
// q/k/v projection ends; a later pass (past 256 cached rows for a head size of 64) loads its own, the second from L1
// (the epilogue warp asked for its rows there, prefetch_second_pass). Each warp's maximum, sum of exponentials and
// weighted values then go to shared memory, and the first D threads combine them with the new row. Each of those
// threads asks for the new value's word once its word of the query is in, and waits for it only if
// it was not yet written (the q/k/v projection writes the values last). The cache rows were asked into L2 before the
// q/k/v projection (prefetch_heads). Two block barriers, where block-wide reductions of the scores took seven: on the
// H200, OPT-1.3B's TPOT (prompt 128 + 256 tokens) went from 851.3 to 843.5 us in fp16 and from 633.9 to 613.3 in int8
// (three interleaved rounds, 2026-11-29). The first pass stays apart from the loop of later ones: as one loop, or
// beside the block-wide attention kept for longer caches, the kernel needed more registers, and the linear operations'
// segment loop paid (fp16 TPOT +13 us and +15 us).
template <typename T, int D>
__device__ void attend_head(const DecodeStreamOp& op, int h, unsigned* tags, unsigned epoch, long long position,
                            float* scratch, float* red, float* head, long long* trace, ConsumerFields& f) {
  constexpr int kRowThreads = D / 32;          // keys: lanes a cached row, 32 values each
  constexpr int kWarpRows = 32 / kRowThreads;  // a warp's rows: 16 (D 64) or 8 (D 128)
  constexpr int kSlice = D / 8;                // values: lanes a row, 8 dimensions each
  constexpr int kLaneRows = 32 / kSlice;       // a lane's 4 value rows kLaneRows apart
  static_assert((D == 64 || D == 128) && kLaneRows * 4 == kWarpRows,
                "head sizes 64 and 128 (head and scratch hold 2 x 128 and 16 x 128 floats); a warp's keys and "
                "values are the same rows");
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32;
  const int warp = tid / 32;
  f.scale = op.scale;
  f.output = op.output;
  const int q_at = op.input + h * D;
  const int k_at = op.input + op.heads * D + h * D;
  const int v_at = op.input + 2 * op.heads * D + h * D;
  auto* kc = static_cast<T*>(op.k_cache) + static_cast<std::int64_t>(h) * op.max_len * D;
  auto* vc = static_cast<T*>(op.v_cache) + static_cast<std::int64_t>(h) * op.max_len * D;
  const int cached = static_cast<int>(position);  // rows 0 .. position - 1 from the cache, the new one from head
  const int key_row = warp * kWarpRows + lane / kRowThreads;
  const int key_part = lane % kRowThreads;
  const int value_row = warp * kWarpRows + lane / kSlice;  // the lane's first value row
  const int db = lane % kSlice;
  uint4 keys[4];
  uint4 values[4];
  load_warp_keys<T, D>(kc, key_row, key_part, cached, keys);
  load_warp_values<T, D>(vc, value_row, kLaneRows, db, cached, values);
  static_assert(2 * D <= kDsThreads, "a thread polls one word of the query and key");
  if (tid < 2 * D) {
    const T v = value_of<T>(tagged_wait1(tags + (tid < D ? q_at + tid : k_at + tid - D), epoch));
    head[tid] = to_float(v);
    if (tid >= D) kc[position * D + tid - D] = v;
  }
  unsigned value_word = tid < D ? tagged_load1(tags + v_at + tid) : 0u;  // the new value, if already written
  consumers_sync<kDsThreads>();  // head written; for a block's second head, the first's reads of scratch and red done
  if (trace != nullptr && threadIdx.x == 0) trace[0] = now_ns();
  float most = -INFINITY;  // the warp's running maximum
  float total = 0.0f;      // the lane's share of the warp's sum of exp(score - most) (its key row's, part 0)
  float acc[8] = {};       // its 8 dimensions' weighted values over its value rows
  // The first pass apart from the loop of later ones (see above: fewer registers held through it).
  bool more = warp_pass<T, D>(keys, values, head, 0, cached, key_row, key_part, value_row, f.scale, most, total,
                              acc);
  for (int first = kAttendPass<D>; more && first < cached; first += kAttendPass<D>) {
    load_warp_keys<T, D>(kc, first + key_row, key_part, cached, keys);
    load_warp_values<T, D>(vc, first + value_row, kLaneRows, db, cached, values);
    more = warp_pass<T, D>(keys, values, head, first, cached, key_row, key_part, value_row, f.scale, most, total,
                           acc);
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) total += __shfl_xor_sync(0xffffffffu, total, o);
#pragma unroll
  for (int o = kSlice; o < 32; o *= 2) {
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] += __shfl_xor_sync(0xffffffffu, acc[e], o);
  }
  if (lane < kSlice) {
#pragma unroll
    for (int e = 0; e < 8; ++e) scratch[warp * kDsMaxDim + 8 * db + e] = acc[e];
  }
  if (lane == 0) {
    red[warp] = most;
    red[kDsWarps + warp] = total;
  }
  float last = 0.0f;  // the new key's score, by the warps of the first D threads
  if (warp < D / 32) {
#pragma unroll
    for (int e = lane; e < D; e += 32) last += head[e] * head[D + e];
#pragma unroll
    for (int o = 16; o > 0; o /= 2) last += __shfl_xor_sync(0xffffffffu, last, o);
    last *= f.scale;
  }
  consumers_sync<kDsThreads>();
  if (tid < D) {
    float top = last;
#pragma unroll
    for (int w = 0; w < kDsWarps; ++w) top = fmaxf(top, red[w]);
    const float p_last = __expf(last - top);
    float sum = p_last;
    float o = 0.0f;
#pragma unroll 4
    for (int w = 0; w < kDsWarps; ++w) {
      const float c = __expf(red[w] - top);  // 0 for a warp without rows (-inf)
      sum += c * red[kDsWarps + w];
      o += c * scratch[w * kDsMaxDim + tid];
    }
    if ((value_word >> 16) != epoch) value_word = tagged_wait1(tags + v_at + tid, epoch);
    const T v = value_of<T>(value_word);
    vc[position * D + tid] = v;
    o += p_last * to_float(v);
    put<T>(tags, f.output, h * D + tid, from_float<T>(o / sum), epoch);
  }
  // No barrier after the combination: whatever writes head, scratch or red next (the block's next head, the next
  // linear operation, the epilogue warp's held rows) does so only after a barrier every consumer thread reaches
  // once done here (the next head's first barrier, run_linear's after_attention one, which a block with no tile
  // meets before it returns, named barrier 3).
  if (trace != nullptr) {  // the trace's end once every thread is done (block-uniform)
    consumers_sync<kDsThreads>();
    if (threadIdx.x == 0) trace[1] = now_ns();
  }
}

// The block's heads (first_of(op), + grid, ...: one a block where there are no more heads than blocks).
template <typename T, int D>
__device__ void run_attention(const DecodeStreamOp& op, unsigned* tags, unsigned epoch, long long position,
                              float* scratch, float* red, float* head, long long* trace, ConsumerFields& f) {
  for (int h = first_of(op); h < op.heads; h += static_cast<int>(gridDim.x)) {
    attend_head<T, D>(op, h, tags, epoch, position, scratch, red, head, trace, f);
  }
}

// Asks L2 for the block's heads' cache rows 0 .. position - 1 of attention `op` (keys and values), to be read
// once the q/k/v projection before it is done.
__device__ __forceinline__ void prefetch_heads(const DecodeStreamOp& op, long long position, int element) {
  if (position <= 0) return;
  const std::int64_t row = static_cast<std::int64_t>(op.head_dim) * element;
  const auto bytes = static_cast<unsigned>(position * row);
  for (int h = first_of(op); h < op.heads; h += static_cast<int>(gridDim.x)) {
    const std::int64_t at = static_cast<std::int64_t>(h) * op.max_len * row;
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(static_cast<const char*>(op.k_cache) + at),
                 "r"(bytes)
                 : "memory");
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(static_cast<const char*>(op.v_cache) + at),
                 "r"(bytes)
                 : "memory");
  }
}

// The epilogue warp, idle during an attention, asks L1 for the keys and values of the attention's second pass (rows
// kAttendPass<D> .. 2 * kAttendPass<D> - 1 of the block's heads; 64 KB at most for a head, against 60 KB of L1
// beside the ring), which the consumers read once their first pass is done; prefetch_heads has asked L2 for them
// before. Later passes are not asked for; a block with several heads asks for all their rows at once, so a later
// head's may evict an earlier one's (L1 is a cache: only time is lost). On the H200, OPT-1.3B's TPOT (prompt 128 +
// 256 tokens, so positions up to 383: one pass or two) went from 802.5 to 799.5 us in fp16 (lower in each of three
// interleaved rounds) and from 569.5 to 569.2 in int8 (2026-11-30). Asked by the consumers themselves before their
// query's poll, the addresses pushed the kernel past its 96 registers (72-92 bytes of spills).
__device__ __forceinline__ void prefetch_second_pass(const DecodeStreamOp& op, long long position, int element) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  static_assert(kAttendPass<64> == kDsWarps * 1024 / 64 && kAttendPass<128> == kDsWarps * 1024 / 128,
                "attend_head's pass");
  const int pass = kDsWarps * 1024 / op.head_dim;  // kAttendPass<head_dim> (head sizes 64 and 128)
  const int end = static_cast<int>(min(position, static_cast<long long>(2 * pass)));
  const int row_bytes = op.head_dim * element;
  for (int h = first_of(op); h < op.heads; h += static_cast<int>(gridDim.x)) {
    const std::int64_t at = static_cast<std::int64_t>(h) * op.max_len * row_bytes;
    const char* k = static_cast<const char*>(op.k_cache) + at;
    const char* v = static_cast<const char*>(op.v_cache) + at;
    for (int r = pass + lane; r < end; r += 32) {
      for (int b = 0; b < row_bytes; b += 128) {
        asm volatile("prefetch.global.L1 [%0];" ::"l"(k + static_cast<std::int64_t>(r) * row_bytes + b));
        asm volatile("prefetch.global.L1 [%0];" ::"l"(v + static_cast<std::int64_t>(r) * row_bytes + b));
      }
    }
  }
}

// Named barriers between the consumer warps and the epilogue warp around an attention, which uses scratch: the
// epilogue warp's arrival once it has finished the operations before it, and the consumers' once the attention
// is done with scratch (the epilogue warp then asks the next operation's rows into it).
constexpr int kDsEpiloguesDone = 2;
constexpr int kDsScratchFree = 3;
template <int kId>
__device__ __forceinline__ void named_arrive() {
  asm volatile("bar.arrive %0, %1;" ::"n"(kId), "n"(kDsThreads + 32) : "memory");
}
template <int kId>
__device__ __forceinline__ void named_sync() {
  asm volatile("bar.sync %0, %1;" ::"n"(kId), "n"(kDsThreads + 32) : "memory");
}
#endif

// Dynamic shared memory: `stages` full and `stages` empty mbarriers (a 128-byte line or more), the ring (stages x
// kDsStageBytes<W>), then the input (kDecodeStreamMaxK values of T). T:
// the activations' type; W: the weights' (T, or int8 with per-row scales). Warps: kDsWarps consumers, then the
// epilogue warp, then the producer.
template <typename T, typename W>
__global__ void __launch_bounds__((kDsWarps + 2) * 32, 1)
    decode_stream_kernel(const DecodeStreamOp* ops, int n_ops, unsigned* tags, unsigned long long* launches,
                         long long* ids, long long* positions, int stages, int vocab, int max_position,
                         long long* trace, unsigned long long* greedy, long long* tokens, long long* column,
                         int token_slots) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char dynamic[];
  // The tiles' sums (two buffers) and the held epilogue rows (run_linear, run_epilogues); an attention's
  // partial sums.
  __shared__ float scratch[kDsWarps * kDsMaxDim];
  __shared__ float red[2 * kDsWarps];  // an attention's warp maxima and sums
  __shared__ float head[2 * kDsMaxDim];  // an attention's query and key
  __shared__ SumsHandoff handoff;
  __shared__ ConsumerFields consumer_fields;  // the consumers' operation's (run_linear, attend_head)
  __shared__ EpilogueFields epilogue_fields;  // the epilogue warp's operation's (run_epilogues)
  __shared__ unsigned epoch_shared;
  __shared__ long long id_shared, position_shared;
  auto* full = reinterpret_cast<std::uint64_t*>(dynamic);
  std::uint64_t* empty = full + stages;
  unsigned char* ring = dynamic + ((2 * stages * 8 + 127) / 128) * 128;
  T* xs = reinterpret_cast<T*>(ring + static_cast<std::size_t>(stages) * kDsStageBytes<W>);
  const int warp = static_cast<int>(threadIdx.x / 32);
  if (threadIdx.x == 0) {
    for (int j = 0; j < stages; ++j) {
      stage_init(&full[j], 1);
      stage_init(&empty[j], kDsWarps);
    }
    for (int j = 0; j < 2; ++j) {
      stage_init(&handoff.full[j], kDsWarps);
      stage_init(&handoff.empty[j], 1);
    }
    stage_init_fence();
    const unsigned long long count = atomicAdd(launches, 1ull);
    epoch_shared = static_cast<unsigned>((count / gridDim.x) % 65535ull) + 1u;
    // Read before the block's start: the last block of greedy decoding rewrites both once every block's
    // epilogue warp has arrived, which may be before this block's consumers start.
    id_shared = *ids;
    position_shared = *positions;
  }
  __syncthreads();
  if (warp == kDsWarps + 1) {
    produce<W>(ops, n_ops, ring, full, empty, stages);
    return;
  }
  const unsigned epoch = epoch_shared;
  if (warp == kDsWarps) {  // the epilogue warp
    unsigned u = 0;
    for (int s = 0; s < n_ops; ++s) {
      const DecodeStreamOp& op = ops[s];
      long long* row = trace != nullptr ? trace + (static_cast<std::int64_t>(blockIdx.x) * n_ops + s) * 2 : nullptr;
      if (op.kind == kDecodeStreamLinear) {
        run_epilogues<T>(op, tags, epoch, scratch, handoff, u, row,
                         greedy != nullptr && s + 1 == n_ops ? greedy : nullptr, epilogue_fields);
      } else if (op.kind != kDecodeStreamEmbed) {  // an attention: the consumers' test, so both meet
        named_arrive<kDsEpiloguesDone>();
        prefetch_second_pass(op, position_shared, static_cast<int>(sizeof(T)));
        named_sync<kDsScratchFree>();
      }
    }
    // Greedy: the last block to arrive has every block's key in greedy[0]; it writes the token where the next
    // launch reads it and clears both words for that launch.
    if (greedy != nullptr && threadIdx.x % 32 == 0) {
      __threadfence();  // this block's atomicMax before its arrival
      if (atomicAdd(&greedy[1], 1ull) == gridDim.x - 1) {
        __threadfence();
        const unsigned long long key = atomicExch(&greedy[0], 0ull);
        atomicExch(&greedy[1], 0ull);
        const auto token = static_cast<long long>(0xffffffffu - static_cast<unsigned>(key & 0xffffffffull));
        *ids = token;
        tokens[max(0ll, min(*column, static_cast<long long>(token_slots - 1)))] = token;
        *column += 1;
        *positions += 1;
      }
    }
    return;
  }
  const long long id = id_shared;
  const long long position = position_shared;
  // The host checks what it can; a token or position out of range here (a bug) ends the launch, not a read
  // out of bounds.
  if (id < 0 || id >= vocab || position < 0 || position >= max_position) __trap();
  RingAt at;
  unsigned u = 0;
  for (int s = 0; s < n_ops; ++s) {
    const DecodeStreamOp& op = ops[s];
    long long* row = trace != nullptr ? trace + (static_cast<std::int64_t>(blockIdx.x) * n_ops + s) * 2 : nullptr;
    if (op.kind == kDecodeStreamLinear) {
      if (s + 1 < n_ops && ops[s + 1].kind == kDecodeStreamAttention && threadIdx.x == 0) {
        prefetch_heads(ops[s + 1], position, static_cast<int>(sizeof(T)));
      }
      run_linear<T, W>(op, tags, epoch, xs, scratch, ring, full, empty, stages, at, handoff, u, row,
                       consumer_fields, s > 0 && ops[s - 1].kind == kDecodeStreamAttention);
    } else if (op.kind == kDecodeStreamEmbed) {
      run_embed<T>(op, tags, epoch, id, position);
      if (row != nullptr && threadIdx.x == 0) row[0] = row[1] = now_ns();
    } else {
      named_sync<kDsEpiloguesDone>();  // the epilogue warp done with scratch
      if (op.head_dim == 64) {
        run_attention<T, 64>(op, tags, epoch, position, scratch, red, head, row, consumer_fields);
      } else {
        run_attention<T, 128>(op, tags, epoch, position, scratch, red, head, row, consumer_fields);
      }
      named_arrive<kDsScratchFree>();
    }
  }
#endif
}

}  // namespace kernels

namespace {

template <typename W>
std::size_t dynamic_bytes(int stages) {
  return static_cast<std::size_t>((2 * stages * 8 + 127) / 128 * 128) +
         static_cast<std::size_t>(stages) * kernels::kDsStageBytes<W> + kDecodeStreamMaxK * 2;
}

// The most stages that fit beside the kernel's static shared memory; the kernel allowed their bytes.
template <typename T, typename W>
int prepare_stream(int device) {
  auto* kernel = kernels::decode_stream_kernel<T, W>;
  int optin = 0;
  GPUOPT_CHECK_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  cudaFuncAttributes attributes = {};
  GPUOPT_CHECK_CUDA(cudaFuncGetAttributes(&attributes, kernel));
  const auto room = static_cast<std::int64_t>(optin) - static_cast<std::int64_t>(attributes.sharedSizeBytes);
  int most = 0;
  while (static_cast<std::int64_t>(dynamic_bytes<W>(most + 1)) <= room) ++most;
  GPUOPT_CHECK_VALUE(most >= 2, "decode_stream: shared memory holds fewer than two stages (", optin,
                     " bytes a block)");
  const std::size_t bytes = dynamic_bytes<W>(most);
  GPUOPT_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  int per_sm = 0;
  GPUOPT_CHECK_CUDA(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, (kernels::kDsWarps + 2) * 32, bytes));
  GPUOPT_CHECK(per_sm >= 1, "decode_stream: the kernel fits no block on an SM with ", bytes,
               " bytes of shared memory");
  return most;
}

template <typename T, typename W>
void launch_stream(const DecodeStreamParams& p, cudaStream_t stream) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(p.blocks));
  config.blockDim = dim3((kernels::kDsWarps + 2) * 32);
  config.dynamicSmemBytes = dynamic_bytes<W>(p.stages);
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeCooperative;
  attribute[0].val.cooperative = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  const cudaError_t status = cudaLaunchKernelEx(&config, kernels::decode_stream_kernel<T, W>, p.ops, p.n_ops, p.tags,
                                                p.launches, p.ids, p.position, p.stages, p.vocab,
                                                p.max_position, p.trace, p.greedy, p.tokens, p.column,
                                                p.token_slots);
  if (status != cudaSuccess) (void)cudaGetLastError();
  GPUOPT_CHECK(status == cudaSuccess, "decode_stream: cooperative launch failed: ", cudaGetErrorName(status), " (",
               cudaGetErrorString(status), "); stages (", p.stages, ") must be at most decode_stream_stages(), ",
               "called before the first launch");
}

}  // namespace

int decode_stream_blocks(int device) {
  int sms = 0;
  GPUOPT_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

int decode_stream_stages(ActivationType type, int device, bool int8_weights) {
  GPUOPT_CHECK_VALUE(type == ActivationType::kFloat16 || type == ActivationType::kBFloat16,
                     "decode_stream: needs float16 or bfloat16");
  if (int8_weights) {
    return type == ActivationType::kFloat16 ? prepare_stream<__half, std::int8_t>(device)
                                            : prepare_stream<__nv_bfloat16, std::int8_t>(device);
  }
  return type == ActivationType::kFloat16 ? prepare_stream<__half, __half>(device)
                                          : prepare_stream<__nv_bfloat16, __nv_bfloat16>(device);
}

void decode_stream(const DecodeStreamParams& p, cudaStream_t stream) {
  GPUOPT_CHECK_VALUE(p.type == ActivationType::kFloat16 || p.type == ActivationType::kBFloat16,
                     "decode_stream: needs float16 or bfloat16");
  GPUOPT_CHECK_VALUE(hopper_code_runs(p.device),
                     "decode_stream: needs compute capability 9.0+ and this build's code for it");
  GPUOPT_CHECK_VALUE(p.ops != nullptr && p.n_ops >= 1 && p.tags != nullptr && p.launches != nullptr &&
                         p.ids != nullptr && p.position != nullptr && p.blocks >= 1 && p.stages >= 2,
                     "decode_stream: ops, tags, launches, ids and position must be set, with at least one op, "
                     "one block and two stages");
  GPUOPT_CHECK_VALUE(p.greedy == nullptr || (p.tokens != nullptr && p.column != nullptr && p.token_slots >= 1),
                     "decode_stream: greedy decoding needs tokens, column and token_slots >= 1");
  if (p.type == ActivationType::kFloat16) {
    if (p.int8_weights) {
      launch_stream<__half, std::int8_t>(p, stream);
    } else {
      launch_stream<__half, __half>(p, stream);
    }
  } else if (p.int8_weights) {
    launch_stream<__nv_bfloat16, std::int8_t>(p, stream);
  } else {
    launch_stream<__nv_bfloat16, __nv_bfloat16>(p, stream);
  }
}

}  // namespace gpuopt::cuda
