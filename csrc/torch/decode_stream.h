// A decode step as one persistent kernel (gpuopt::cuda::decode_stream): the LibTorch side, which builds the
// step's program from tensors (checking every one), keeps them alive, uploads the program and launches it on
// torch's current stream.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <vector>

#ifdef GPUOPT_WITH_CUDA
#include "gpuopt/cuda.h"
#endif

namespace gpuopt::torch_ext {

// Operations are added in the order they run; each returns its output's activation id (>= 0) for later
// operations to read. finish() uploads the program; run() then launches it (capturable in a CUDA graph). One
// program launches on one stream at a time. Errors: TypeError for a tensor of the wrong dtype, device or layout,
// ValueError for a shape or value the kernel does not take (and for int8 weights after weights of the program's
// dtype, or the other way round: the program's kind of weights), both naming the operation and the argument.
class DecodeProgram {
 public:
  DecodeProgram(std::int64_t device, c10::ScalarType dtype);

  // out = table[id] + positions[position + position_offset] (positions optional): [vocab, n], [rows, n].
  std::int64_t embed(const at::Tensor& table, const std::optional<at::Tensor>& positions,
                     std::int64_t position_offset);
  // out = relu?(layer_norm?(in) @ cat(weights).T + cat(biases)) + residual?; weights [rows_p, K] (1 to 3
  // parts); `plain`, if given, [1, N] or [N] of the program's dtype, receives the output too; output=false
  // writes no activation (returns -1; `plain` then required). The layer norm is folded into the product: the
  // biases, weights @ norm_weight and weights @ norm_bias are taken here in float32, so a later change to a
  // bias, a norm or a weight of a normed operation needs a new program. Weights may be int8 with `scales` (one
  // floating-point tensor of per-row scales per weight: weight_p = int8_p * scales_p[:, None]), also taken here
  // in float32 (a later change to them needs a new program; the int8 weights are read where they are); a
  // program's weights are all int8 or all of its dtype.
  std::int64_t linear(std::int64_t input, const std::vector<at::Tensor>& weights,
                      const std::vector<std::optional<at::Tensor>>& biases,
                      const std::optional<at::Tensor>& norm_weight, const std::optional<at::Tensor>& norm_bias,
                      double eps, std::optional<std::int64_t> residual, bool relu, bool output,
                      const std::optional<at::Tensor>& plain,
                      const std::optional<std::vector<at::Tensor>>& scales = std::nullopt);
  // One query token's attention, head by head, over caches [1, H, L, D] (or [H, L, D]) written at the step's
  // position: input is a fused q/k/v activation of 3 * H * D values (queries, keys, values).
  std::int64_t attention(std::int64_t input, const at::Tensor& k_cache, const at::Tensor& v_cache, double scale);
  void finish();
  // The step for token ids [1] or [1, 1] at position [1] or [] (int64 on the program's device). trace: None, or
  // an int64 tensor [blocks, n_ops, 2] on the device receiving each block's nanosecond timestamps (its input of
  // each operation in, the operation done; a profile; a linear's input time is its last warp's, kept by
  // atomicMax, so the tensor must start below any timestamp, e.g. zeros or -1). tokens ([T] or [1, T]) and
  // column (one value), int64 on the device, together: greedy decoding's bookkeeping in the step, no other
  // kernel: the first index of the largest of the last operation's plain output (the logits; torch.argmax's
  // pick) is written into ids and tokens[clamp(column, 0, T - 1)], then position and column are advanced by one.
  void run(const at::Tensor& ids, const at::Tensor& position, const std::optional<at::Tensor>& trace,
           const std::optional<at::Tensor>& tokens = std::nullopt,
           const std::optional<at::Tensor>& column = std::nullopt);
  // The step's grid: one block an SM unless set before finish() to 1 .. the SMs (0: one an SM again); setting it
  // after finish() is an error. Fewer blocks leave SMs free and give each block more tiles and heads; for tests
  // and tuning.
  std::int64_t blocks() const;
  void set_blocks(std::int64_t blocks);
  // The ring's stages a block streams its weights through (0 before finish(), which sets the default: 5, or the
  // most that fit if fewer); settable after finish() to 2 .. the most, or 0 for the default. For tuning.
  std::int64_t stages() const { return stages_; }
  std::int64_t max_stages() const { return most_stages_; }  // the most a block's shared memory holds (finish())
  void set_stages(std::int64_t stages);

  std::int64_t device() const { return device_; }
  std::int64_t n_ops() const;
  bool finished() const { return finished_; }
  std::int64_t words() const { return words_; }
  std::int64_t max_position() const { return max_position_; }
  std::int64_t vocab() const { return vocab_; }
  std::int64_t weight_bytes() const { return weight_bytes_; }
  bool int8_weights() const { return weight_kind_ == 2; }

 private:
  std::int64_t add_activation(std::int64_t size);
  void check_open(const char* op) const;
  std::int64_t activation_size(const char* op, const char* name, std::int64_t id) const;
  std::int64_t default_stages() const;  // kDefaultStages, or the most that fit if fewer (finish())
  // On the program's device, contiguous, 16-byte aligned, of `dtype` (default: the program's).
  void check_tensor(const char* op, const char* name, const at::Tensor& t,
                    std::optional<c10::ScalarType> dtype = std::nullopt) const;

  std::int64_t device_;
  c10::ScalarType dtype_;
  std::vector<std::int64_t> offsets_;  // each activation's word offset
  std::vector<std::int64_t> sizes_;    // and values
  std::int64_t words_ = 0;
  std::int64_t vocab_ = -1;
  std::int64_t max_position_ = -1;
  std::int64_t weight_bytes_ = 0;
  int weight_kind_ = 0;  // the linear operations' weights: 0 none yet, 1 the program's dtype, 2 int8
  std::int64_t blocks_ = 0;       // set_blocks (0: one block an SM), then resolved by finish()
  std::int64_t stages_ = 0;       // set by finish(), then set_stages
  std::int64_t most_stages_ = 0;
  bool finished_ = false;
  std::vector<at::Tensor> keep_;  // every tensor an operation points into
#ifdef GPUOPT_WITH_CUDA
  std::vector<cuda::DecodeStreamOp> ops_;
#endif
  at::Tensor ops_device_, tags_, launches_;
};

}  // namespace gpuopt::torch_ext
