#include "decode_stream.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "device.h"

#ifdef GPUOPT_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace gpuopt::torch_ext {
namespace {

constexpr std::int64_t kAlignWords = 32;  // each activation's words start on a 128-byte line
// The ring's default depth: on the H200, OPT-1.3B's step at position 300 took 995-1000 us with 4 or 5 stages,
// 1013-1023 us with 6 (the most that fit) and 1005-1022 with 3 (three interleaved sweeps, 2026-11-29); with the
// tiles dealt on (finish()), 969 us with 5 and 968 with 4. Measured as TPOT p50 over 256 tokens (prompt 128) at
// db861cb's kernel instead of one step at position 300, 4 stages lose 10-11 us: fp16 854.7, 829.6, 818.5 and 822.7 us
// with 3, 4, 5 and 6 stages, int8wo 604.1, 590.1, 580.0 and 583.7 (three interleaved rounds, dev log
// llm_decode-megakernel-int8-diagnostics-dev-db861cb).
constexpr std::int64_t kDefaultStages = 5;

bool aligned16(const at::Tensor& t) { return reinterpret_cast<std::uintptr_t>(t.const_data_ptr()) % 16 == 0; }

}  // namespace

DecodeProgram::DecodeProgram(std::int64_t device, c10::ScalarType dtype) : dtype_(dtype) {
  device_ = checked_cuda_device(device, "DecodeProgram");
  TORCH_CHECK_TYPE(dtype == at::kHalf || dtype == at::kBFloat16,
                   "DecodeProgram: dtype must be float16 or bfloat16, got ", dtype_name(dtype));
#ifdef GPUOPT_WITH_CUDA
  TORCH_CHECK_VALUE(cuda::hopper_code_runs(static_cast<int>(device_)), "DecodeProgram: CUDA device ", device_,
                    " cannot run it: the persistent decode kernel needs compute capability 9.0+ and this build's "
                    "code for it (GPUOPT_CUDA_ARCHS with 9.0)");
#endif
}

void DecodeProgram::check_open(const char* op) const {
  TORCH_CHECK(!finished_, "DecodeProgram.", op, ": the program is finished; build a new one to change it");
}

void DecodeProgram::check_tensor(const char* op, const char* name, const at::Tensor& t,
                                 std::optional<c10::ScalarType> dtype) const {
  TORCH_CHECK_TYPE(t.is_cuda() && t.device().index() == device_, "DecodeProgram.", op, ": ", name,
                   " must be on cuda:", device_, ", got ", t.device());
  TORCH_CHECK_TYPE(t.scalar_type() == dtype.value_or(dtype_), "DecodeProgram.", op, ": ", name, " must be ",
                   dtype_name(dtype.value_or(dtype_)), dtype.has_value() ? "" : " (the program's dtype)", ", got ",
                   dtype_name(t.scalar_type()));
  TORCH_CHECK_TYPE(t.is_contiguous() && aligned16(t), "DecodeProgram.", op, ": ", name,
                   " must be contiguous and 16-byte aligned");
}

std::int64_t DecodeProgram::add_activation(std::int64_t size) {
  offsets_.push_back(words_);
  sizes_.push_back(size);
  words_ += (size + kAlignWords - 1) / kAlignWords * kAlignWords;
  TORCH_CHECK_VALUE(words_ < (std::int64_t{1} << 31), "DecodeProgram: the activations exceed 2^31 words");
  return static_cast<std::int64_t>(offsets_.size()) - 1;
}

std::int64_t DecodeProgram::activation_size(const char* op, const char* name, std::int64_t id) const {
  TORCH_CHECK_VALUE(id >= 0 && id < static_cast<std::int64_t>(sizes_.size()), "DecodeProgram.", op, ": ", name,
                    " must be an activation id this program returned (0 to ",
                    static_cast<std::int64_t>(sizes_.size()) - 1, "), got ", id);
  return sizes_[static_cast<std::size_t>(id)];
}

std::int64_t DecodeProgram::n_ops() const {
#ifdef GPUOPT_WITH_CUDA
  return static_cast<std::int64_t>(ops_.size());
#else
  return 0;
#endif
}

#ifdef GPUOPT_WITH_CUDA

std::int64_t DecodeProgram::embed(const at::Tensor& table, const std::optional<at::Tensor>& positions,
                                  std::int64_t position_offset) {
  constexpr const char* op = "embed";
  check_open(op);
  check_tensor(op, "table", table);
  TORCH_CHECK_VALUE(table.dim() == 2 && table.size(1) >= 16 && table.size(1) % 16 == 0 && table.size(0) >= 1,
                    "DecodeProgram.embed: table must be [vocab, N] with N a positive multiple of 16, got ",
                    table.sizes());
  if (positions.has_value()) {  // everything checked before anything is kept
    check_tensor(op, "positions", *positions);
    TORCH_CHECK_VALUE(positions->dim() == 2 && positions->size(1) == table.size(1), "DecodeProgram.embed: ",
                      "positions must be [rows, ", table.size(1), "], got ", positions->sizes());
    TORCH_CHECK_VALUE(position_offset >= 0 && position_offset < positions->size(0), "DecodeProgram.embed: ",
                      "position_offset must be 0 to ", positions->size(0) - 1, ", got ", position_offset);
  }
  cuda::DecodeStreamOp o;
  o.kind = cuda::kDecodeStreamEmbed;
  o.n = static_cast<int>(table.size(1));
  o.table = table.const_data_ptr();
  keep_.push_back(table);
  vocab_ = vocab_ < 0 ? table.size(0) : std::min(vocab_, table.size(0));  // every table takes the token
  if (positions.has_value()) {
    o.positions = positions->const_data_ptr();
    o.position_offset = static_cast<int>(position_offset);
    keep_.push_back(*positions);
    const std::int64_t most = positions->size(0) - position_offset;
    max_position_ = max_position_ < 0 ? most : std::min(max_position_, most);
  }
  const std::int64_t id = add_activation(o.n);
  o.output = static_cast<int>(offsets_[static_cast<std::size_t>(id)]);
  ops_.push_back(o);
  return id;
}

std::int64_t DecodeProgram::linear(std::int64_t input, const std::vector<at::Tensor>& weights,
                                   const std::vector<std::optional<at::Tensor>>& biases,
                                   const std::optional<at::Tensor>& norm_weight,
                                   const std::optional<at::Tensor>& norm_bias, double eps,
                                   std::optional<std::int64_t> residual, bool relu, bool output,
                                   const std::optional<at::Tensor>& plain,
                                   const std::optional<std::vector<at::Tensor>>& scales) {
  constexpr const char* op = "linear";
  check_open(op);
  const std::int64_t k = activation_size(op, "input", input);
  TORCH_CHECK_VALUE(!weights.empty() && static_cast<int>(weights.size()) <= cuda::kDecodeStreamMaxParts,
                    "DecodeProgram.linear: weights must be 1 to ", cuda::kDecodeStreamMaxParts, " tensors, got ",
                    weights.size());
  TORCH_CHECK_VALUE(biases.size() == weights.size(), "DecodeProgram.linear: biases must have one entry (or None) "
                    "per weight (", weights.size(), "), got ", biases.size());
  TORCH_CHECK_VALUE(k >= 64 && k % 64 == 0 && k <= cuda::kDecodeStreamMaxK, "DecodeProgram.linear: the input's "
                    "size (K=", k, ") must be a positive multiple of 64 up to ", cuda::kDecodeStreamMaxK);
  // int8 weights (every operation's, with per-row scales) or every one of the program's dtype: one ring layout.
  const bool int8 = weights[0].scalar_type() == at::kChar;
  if (int8) {
    TORCH_CHECK_VALUE(scales.has_value() && scales->size() == weights.size(), "DecodeProgram.linear: int8 weights "
                      "need scales, one float tensor of per-row scales per weight (", weights.size(), "), got ",
                      scales.has_value() ? std::to_string(scales->size()) : std::string("None"));
  } else {
    TORCH_CHECK_VALUE(!scales.has_value(), "DecodeProgram.linear: scales apply to int8 weights only, got weights "
                      "of ", dtype_name(weights[0].scalar_type()));
  }
  const int kind = int8 ? 2 : 1;
  TORCH_CHECK_VALUE(weight_kind_ == 0 || weight_kind_ == kind, "DecodeProgram.linear: a program's weights must "
                    "all be int8 or all ", dtype_name(dtype_), "; the operations before had ",
                    weight_kind_ == 2 ? "int8" : dtype_name(dtype_), " weights, got ",
                    dtype_name(weights[0].scalar_type()));
  cuda::DecodeStreamOp o;
  o.kind = cuda::kDecodeStreamLinear;
  o.k = static_cast<int>(k);
  o.parts = static_cast<int>(weights.size());
  o.input = static_cast<int>(offsets_[static_cast<std::size_t>(input)]);
  std::int64_t n = 0;
  for (std::size_t p = 0; p < weights.size(); ++p) {
    const at::Tensor& w = weights[p];
    if (int8) {
      TORCH_CHECK_TYPE(w.scalar_type() == at::kChar, "DecodeProgram.linear: weight ", p, " must be int8 as weight 0 "
                       "is, got ", dtype_name(w.scalar_type()));
      check_tensor(op, "weight", w, at::kChar);
    } else {
      check_tensor(op, "weight", w);
    }
    TORCH_CHECK_VALUE(w.dim() == 2 && w.size(1) == k && w.size(0) >= 16 && w.size(0) % 16 == 0,
                      "DecodeProgram.linear: weight ", p, " must be [N, ", k, "] (K the input's size) with N a "
                      "multiple of 16, got ", w.sizes());
    if (int8) {
      const at::Tensor& sc = (*scales)[p];
      TORCH_CHECK_TYPE(sc.is_cuda() && sc.device().index() == device_ && at::isFloatingType(sc.scalar_type()),
                       "DecodeProgram.linear: scales ", p, " must be a floating-point tensor on cuda:", device_,
                       ", got ", dtype_name(sc.scalar_type()), " on ", sc.device());
      TORCH_CHECK_VALUE(sc.numel() == w.size(0), "DecodeProgram.linear: scales ", p, " must have ", w.size(0),
                        " values (one per row of weight ", p, "), got ", sc.numel());
    }
    o.weight[p] = w.const_data_ptr();
    o.part_rows[p] = static_cast<int>(w.size(0));
    if (biases[p].has_value()) {
      check_tensor(op, "bias", *biases[p]);
      TORCH_CHECK_VALUE(biases[p]->numel() == w.size(0), "DecodeProgram.linear: bias ", p, " must have ",
                        w.size(0), " values, got ", biases[p]->numel());
    }
    n += w.size(0);
  }
  o.n = static_cast<int>(n);
  if (norm_weight.has_value()) {
    check_tensor(op, "norm_weight", *norm_weight);
    TORCH_CHECK_VALUE(norm_weight->numel() == k, "DecodeProgram.linear: norm_weight must have ", k,
                      " values, got ", norm_weight->numel());
    TORCH_CHECK_VALUE(eps > 0, "DecodeProgram.linear: eps must be > 0, got ", eps);
    o.norm_weight = norm_weight->const_data_ptr();
    o.eps = static_cast<float>(eps);
    if (norm_bias.has_value()) {
      check_tensor(op, "norm_bias", *norm_bias);
      TORCH_CHECK_VALUE(norm_bias->numel() == k, "DecodeProgram.linear: norm_bias must have ", k, " values, got ",
                        norm_bias->numel());
    }
  } else {
    TORCH_CHECK_VALUE(!norm_bias.has_value(), "DecodeProgram.linear: norm_bias needs norm_weight");
  }
  if (residual.has_value()) {
    const std::int64_t size = activation_size(op, "residual", *residual);
    TORCH_CHECK_VALUE(size == n, "DecodeProgram.linear: the residual must have the output's size (", n, "), got ",
                      size);
    o.residual = static_cast<int>(offsets_[static_cast<std::size_t>(*residual)]);
  }
  o.relu = relu ? 1 : 0;
  if (plain.has_value()) {
    check_tensor(op, "plain", *plain);
    TORCH_CHECK_VALUE(plain->numel() == n, "DecodeProgram.linear: plain must have ", n, " values, got ",
                      plain->numel());
    o.plain = plain->data_ptr();
  }
  TORCH_CHECK_VALUE(output || plain.has_value(), "DecodeProgram.linear: an operation without output needs plain");
  // The epilogue's float32 rows, taken from the weights, biases and norm as they are now (a later change to them
  // needs a new program), on the current stream, before anything is kept (a failure here leaves the program as
  // it was): shift = bias (+ weight @ norm_bias) and norm_sum = weight @ norm_weight.
  at::Tensor shift, norm_sum, row_scale;
  if (int8) {  // the scales in float32, in one row
    std::vector<at::Tensor> rows;
    for (const auto& sc : *scales) rows.push_back(sc.detach().reshape({-1}).to(at::kFloat));
    row_scale = at::cat(rows);
  }
  const bool has_bias = std::any_of(biases.begin(), biases.end(), [](const auto& b) { return b.has_value(); });
  if (norm_weight.has_value() || has_bias) {
    const at::NoGradGuard no_grad;  // parameters in, plain rows out: no graph holding the float32 chunks
    const auto f32 = weights[0].options().dtype(at::kFloat);
    shift = at::zeros({n}, f32);
    at::Tensor gamma, beta;
    if (norm_weight.has_value()) {
      norm_sum = at::empty({n}, f32);
      gamma = norm_weight->view({1, -1}).to(at::kFloat);
      if (norm_bias.has_value()) beta = norm_bias->view({1, -1}).to(at::kFloat);
    }
    std::int64_t row = 0;
    for (std::size_t p = 0; p < weights.size(); ++p) {
      const std::int64_t rows = weights[p].size(0);
      if (biases[p].has_value()) shift.narrow(0, row, rows).add_(biases[p]->view({-1}).to(at::kFloat));
      constexpr std::int64_t kChunk = 4096;  // rows converted to float32 at a time
      for (std::int64_t r = 0; gamma.defined() && r < rows; r += kChunk) {
        at::Tensor w = weights[p].narrow(0, r, std::min(kChunk, rows - r)).to(at::kFloat);
        if (int8) w.mul_(row_scale.narrow(0, row + r, w.size(0)).unsqueeze(1));  // the weights as the sums see them
        norm_sum.narrow(0, row + r, w.size(0)).copy_(w.mul(gamma).sum(1));
        if (beta.defined()) shift.narrow(0, row + r, w.size(0)).add_(w.mul(beta).sum(1));
      }
      row += rows;
    }
    o.shift = shift.const_data_ptr<float>();
    if (norm_sum.defined()) o.norm_sum = norm_sum.const_data_ptr<float>();
  }
  if (int8) o.weight_scale = row_scale.const_data_ptr<float>();
  // Everything checked and computed: the tensors the operation points into are kept from here on.
  for (std::size_t p = 0; p < weights.size(); ++p) {
    keep_.push_back(weights[p]);
    weight_bytes_ += weights[p].numel() * weights[p].element_size();
  }
  for (const auto* t : {&norm_weight, &plain}) {
    if (t->has_value()) keep_.push_back(**t);
  }
  for (const auto& t : {shift, norm_sum, row_scale}) {
    if (t.defined()) keep_.push_back(t);
  }
  weight_kind_ = kind;
  std::int64_t id = -1;
  if (output) {
    id = add_activation(n);
    o.output = static_cast<int>(offsets_[static_cast<std::size_t>(id)]);
  }
  ops_.push_back(o);
  return id;
}

std::int64_t DecodeProgram::attention(std::int64_t input, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                      double scale) {
  constexpr const char* op = "attention";
  check_open(op);
  const std::int64_t size = activation_size(op, "input", input);
  check_tensor(op, "k_cache", k_cache);
  check_tensor(op, "v_cache", v_cache);
  const bool batched = k_cache.dim() == 4;
  TORCH_CHECK_VALUE((k_cache.dim() == 3 || (batched && k_cache.size(0) == 1)) && v_cache.sizes() == k_cache.sizes(),
                    "DecodeProgram.attention: k_cache and v_cache must both be [1, H, L, D] or [H, L, D], got ",
                    k_cache.sizes(), " and ", v_cache.sizes());
  const std::int64_t heads = k_cache.size(batched ? 1 : 0);
  const std::int64_t len = k_cache.size(batched ? 2 : 1);
  const std::int64_t dim = k_cache.size(batched ? 3 : 2);
  TORCH_CHECK_VALUE(dim == 64 || dim == 128, "DecodeProgram.attention: the head size must be 64 or 128, got ", dim);
  TORCH_CHECK_VALUE(len >= 1 && len <= cuda::kDecodeStreamMaxLen, "DecodeProgram.attention: the cache length must "
                    "be 1 to ", cuda::kDecodeStreamMaxLen, ", got ", len);
  TORCH_CHECK_VALUE(size == 3 * heads * dim, "DecodeProgram.attention: the input must be a fused q/k/v activation "
                    "of 3 * H * D = ", 3 * heads * dim, " values, got ", size);
  TORCH_CHECK_VALUE(scale > 0, "DecodeProgram.attention: scale must be > 0, got ", scale);
  cuda::DecodeStreamOp o;
  o.kind = cuda::kDecodeStreamAttention;
  o.input = static_cast<int>(offsets_[static_cast<std::size_t>(input)]);
  o.n = static_cast<int>(heads * dim);
  o.heads = static_cast<int>(heads);
  o.head_dim = static_cast<int>(dim);
  o.max_len = static_cast<int>(len);
  o.scale = static_cast<float>(scale);
  o.k_cache = k_cache.data_ptr();
  o.v_cache = v_cache.data_ptr();
  keep_.push_back(k_cache);
  keep_.push_back(v_cache);
  max_position_ = max_position_ < 0 ? len : std::min(max_position_, len);
  const std::int64_t id = add_activation(o.n);
  o.output = static_cast<int>(offsets_[static_cast<std::size_t>(id)]);
  ops_.push_back(o);
  return id;
}

void DecodeProgram::finish() {
  check_open("finish");
  TORCH_CHECK_VALUE(!ops_.empty(), "DecodeProgram.finish: the program has no operations");
  TORCH_CHECK_VALUE(vocab_ > 0 && max_position_ > 0, "DecodeProgram.finish: the program needs an embedding (the "
                    "step's token) and a positions table or an attention (the step's position bound)");
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  const std::int64_t most =
      cuda::decode_stream_stages(activation_type(dtype_), static_cast<int>(device_), int8_weights());
  const auto options = at::TensorOptions().device(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device_)));
  tags_ = at::zeros({std::max<std::int64_t>(words_, 4)}, options.dtype(at::kInt));
  launches_ = at::zeros({3}, options.dtype(at::kLong));  // the launch count, then greedy decoding's two words
  blocks_ = blocks();
  // Tiles and heads dealt on from where the operation before stopped: a block with fewer of one operation's
  // tiles takes the first of the next one's, which its ring fetched meanwhile. On the H200, OPT-1.3B's step at
  // position 300 took 969 us so, against 991 us with every operation's tile 0 in block 0 (interleaved).
  std::int64_t next = 0;
  for (auto& o : ops_) {
    o.first_block = static_cast<int>(next);
    if (o.kind == cuda::kDecodeStreamLinear) next = (next + o.n / 16) % blocks_;
    if (o.kind == cuda::kDecodeStreamAttention) next = (next + o.heads) % blocks_;
  }
  const auto bytes = static_cast<std::int64_t>(ops_.size() * sizeof(cuda::DecodeStreamOp));
  at::Tensor host = at::empty({bytes}, at::TensorOptions().dtype(at::kByte));
  std::memcpy(host.data_ptr(), ops_.data(), static_cast<std::size_t>(bytes));
  ops_device_ = host.to(options.dtype(at::kByte));
  most_stages_ = most;
  stages_ = default_stages();
  finished_ = true;
}

std::int64_t DecodeProgram::default_stages() const { return std::min(kDefaultStages, most_stages_); }

std::int64_t DecodeProgram::blocks() const {
  return blocks_ > 0 ? blocks_ : cuda::decode_stream_blocks(static_cast<int>(device_));  // finish() sets it > 0
}

void DecodeProgram::set_blocks(std::int64_t blocks) {
  check_open("blocks");
  // Every block must be resident at once (they wait on each other's outputs): at most one an SM.
  const std::int64_t sms = cuda::decode_stream_blocks(static_cast<int>(device_));
  TORCH_CHECK_VALUE(blocks >= 0 && blocks <= sms, "DecodeProgram.blocks: must be 0 (one block an SM, ", sms,
                    ") or 1 to ", sms, ", got ", blocks);
  blocks_ = blocks;
}

void DecodeProgram::set_stages(std::int64_t stages) {
  TORCH_CHECK(finished_, "DecodeProgram.stages: call finish() first");
  TORCH_CHECK_VALUE(stages == 0 || (stages >= 2 && stages <= most_stages_), "DecodeProgram.stages: must be 0 (the "
                    "default, ", default_stages(), ") or 2 to ", most_stages_,
                    " (the most a block's shared memory holds), got ", stages);
  stages_ = stages == 0 ? default_stages() : stages;
}

void DecodeProgram::run(const at::Tensor& ids, const at::Tensor& position, const std::optional<at::Tensor>& trace,
                        const std::optional<at::Tensor>& tokens, const std::optional<at::Tensor>& column) {
  TORCH_CHECK(finished_, "DecodeProgram.run: call finish() first");
  TORCH_CHECK_VALUE(tokens.has_value() == column.has_value(), "DecodeProgram.run: tokens and column come together "
                    "(greedy decoding), got ", tokens.has_value() ? "tokens" : "column", " alone");
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"ids", &ids}, {"position", &position}}) {
    TORCH_CHECK_TYPE(t->is_cuda() && t->device().index() == device_ && t->scalar_type() == at::kLong,
                     "DecodeProgram.run: ", name, " must be int64 on cuda:", device_, ", got ",
                     dtype_name(t->scalar_type()), " on ", t->device());
    TORCH_CHECK_VALUE(t->numel() == 1, "DecodeProgram.run: ", name, " must hold one value (batch 1), got ",
                      t->numel());
  }
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  cuda::DecodeStreamParams p;
  p.type = activation_type(dtype_);
  p.int8_weights = int8_weights();
  p.ops = reinterpret_cast<const cuda::DecodeStreamOp*>(ops_device_.const_data_ptr());
  p.n_ops = static_cast<int>(ops_.size());
  p.tags = static_cast<unsigned*>(tags_.data_ptr());
  p.launches = static_cast<unsigned long long*>(launches_.data_ptr());
  p.ids = static_cast<long long*>(ids.data_ptr());
  p.position = static_cast<long long*>(position.data_ptr());
  p.vocab = static_cast<int>(vocab_);
  p.max_position = static_cast<int>(max_position_);
  p.device = static_cast<int>(device_);
  p.blocks = static_cast<int>(blocks_);
  p.stages = static_cast<int>(stages_);
  if (trace.has_value()) {
    TORCH_CHECK_TYPE(trace->is_cuda() && trace->device().index() == device_ && trace->scalar_type() == at::kLong &&
                         trace->is_contiguous(),
                     "DecodeProgram.run: trace must be a contiguous int64 tensor on cuda:", device_);
    TORCH_CHECK_VALUE(trace->numel() == static_cast<std::int64_t>(p.blocks) * p.n_ops * 2, "DecodeProgram.run: trace ",
                      "must be [", p.blocks, ", ", p.n_ops, ", 2], got ", trace->sizes());
    p.trace = static_cast<long long*>(trace->data_ptr());
  }
  if (tokens.has_value()) {
    for (const auto& [name, t] :
         {std::pair<const char*, const at::Tensor*>{"tokens", &*tokens}, {"column", &*column}}) {
      TORCH_CHECK_TYPE(t->is_cuda() && t->device().index() == device_ && t->scalar_type() == at::kLong,
                       "DecodeProgram.run: ", name, " must be an int64 tensor on cuda:", device_, ", got ",
                       dtype_name(t->scalar_type()), " on ", t->device());
      TORCH_CHECK_VALUE(t->is_contiguous(), "DecodeProgram.run: ", name, " must be contiguous, got strides ",
                        t->strides());
    }
    TORCH_CHECK_VALUE((tokens->dim() == 1 || (tokens->dim() == 2 && tokens->size(0) == 1)) && tokens->numel() >= 1 &&
                          tokens->numel() <= std::numeric_limits<int>::max(),
                      "DecodeProgram.run: tokens must be [T] or [1, T] with T >= 1 (batch 1), got ", tokens->sizes());
    TORCH_CHECK_VALUE(column->numel() == 1, "DecodeProgram.run: column must hold one value, got ", column->numel());
    const cuda::DecodeStreamOp& last = ops_.back();
    TORCH_CHECK_VALUE(last.kind == cuda::kDecodeStreamLinear && last.plain != nullptr,
                      "DecodeProgram.run: greedy decoding (tokens, column) takes the argmax of the last operation's "
                      "plain output (the logits), and the program's last operation has none");
    TORCH_CHECK_VALUE(last.n <= vocab_, "DecodeProgram.run: greedy decoding writes the last operation's row index "
                      "(0 .. ", last.n - 1, ") into ids, which the next step embeds: its ", last.n,
                      " rows must be at most the embedding's vocab (", vocab_, ")");
    p.greedy = p.launches + 1;
    p.tokens = static_cast<long long*>(tokens->data_ptr());
    p.column = static_cast<long long*>(column->data_ptr());
    p.token_slots = static_cast<int>(tokens->numel());
  }
  cuda::decode_stream(p, c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).stream());
}

#else  // no CUDA: the constructor has already refused

std::int64_t DecodeProgram::embed(const at::Tensor&, const std::optional<at::Tensor>&, std::int64_t) { return -1; }
std::int64_t DecodeProgram::linear(std::int64_t, const std::vector<at::Tensor>&,
                                   const std::vector<std::optional<at::Tensor>>&, const std::optional<at::Tensor>&,
                                   const std::optional<at::Tensor>&, double, std::optional<std::int64_t>, bool, bool,
                                   const std::optional<at::Tensor>&, const std::optional<std::vector<at::Tensor>>&) {
  return -1;
}
std::int64_t DecodeProgram::attention(std::int64_t, const at::Tensor&, const at::Tensor&, double) { return -1; }
void DecodeProgram::finish() {}
std::int64_t DecodeProgram::blocks() const { return 0; }
void DecodeProgram::set_blocks(std::int64_t) {}
void DecodeProgram::set_stages(std::int64_t) {}
void DecodeProgram::run(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                        const std::optional<at::Tensor>&, const std::optional<at::Tensor>&) {}

#endif

}  // namespace gpuopt::torch_ext
