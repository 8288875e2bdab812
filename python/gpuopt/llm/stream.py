"""The ``static-megakernel`` decode path's step: a whole decode step of an OPT model as one persistent kernel
(:class:`gpuopt._C.DecodeProgram`).

One block an SM runs the step's operations in order -- the embeddings, per layer the fused q/k/v projection
after its layer norm, the attention over the static cache, the output projection with its residual, fc1 after
its layer norm with the ReLU, fc2 with its residual, then the final layer norm and the LM head -- while a
producer warp in each block streams the block's weight tiles through shared memory ahead of need: HBM does not
wait for an operation's input. 16 warps sum each tile and hand the sums to an epilogue warp, which writes the
outputs while they sum the next tile. Every output is written as words tagged with the launch, which the operations
reading it poll: there is no grid barrier and no memory fence between operations (csrc/cuda/decode_stream.cu).

It reads the model's own weights where they are; none is copied. They are the model's dtype, or int8 with a scale
per output row where every linear layer is a :class:`gpuopt.quant.Int8WeightOnlyLinear` (precision ``int8wo``):
a stage's row then holds 2048 weights in the 2 KB an fp16 row of 1024 takes, each 16-byte word 16 weights widened
to fp16/bf16 exactly for the tensor cores, and the sums scaled in the epilogue. Each layer norm is folded into
the matrix product after it, with float32 rows (the biases, the int8 layers' scales, and the weights' products
with the norm's weight and bias) taken when the step is built, so a later change to the model needs a new step.
It takes OPT's pre-norm architecture (``facebook/opt-*`` except 350m, whose norms come after), batch 1, float16
or bfloat16 activations, head size 64 or 128, hidden and FFN sizes multiples of 64 up to 8192, a cache of at
most 4096 positions (and the model's own limit, 2048 for OPT); compute capability 9.0+ on a CUDA device.
"""

from __future__ import annotations

from typing import Any

import torch

from .._ext import _C

MAX_K = 8192
MAX_LEN = 4096


def unsupported(model: torch.nn.Module, batch_size: int, dtype: torch.dtype, max_len: int) -> str | None:
    """Why the persistent step cannot run ``model`` at this shape (a sentence), or None where it can."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) != "opt":
        return (f"it runs OPT-architecture models only (model_type 'opt'); got "
                f"{getattr(config, 'model_type', None) or type(model).__name__}")
    decoder = getattr(getattr(model, "model", None), "decoder", None)
    if decoder is None or not hasattr(model, "lm_head"):
        return f"{type(model).__name__} is not an OPT causal LM (model.decoder and lm_head)"
    if not config.do_layer_norm_before or decoder.final_layer_norm is None:
        return "it runs OPT's pre-norm layers only (do_layer_norm_before=True; opt-350m's norms come after)"
    if decoder.project_in is not None or decoder.project_out is not None:
        return "word_embed_proj_dim must equal hidden_size (no project_in/project_out)"
    if not config.enable_bias or not config.layer_norm_elementwise_affine:
        return "enable_bias and layer_norm_elementwise_affine must be True"
    if config.activation_function != "relu":
        return f"the activation must be relu, got {config.activation_function!r}"
    param = next(model.parameters(), None)
    if param is not None and param.device.type == "cuda" and torch.cuda.get_device_capability(param.device)[0] < 9:
        major, minor = torch.cuda.get_device_capability(param.device)
        return f"it needs compute capability 9.0+ (bulk copies and mbarriers), got {major}.{minor}"
    if batch_size != 1:
        return f"batch_size must be 1, got {batch_size}"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"the precision must be fp16 or bf16, got {dtype}"
    hidden, ffn, heads = config.hidden_size, config.ffn_dim, config.num_attention_heads
    head_dim = hidden // heads
    if head_dim not in (64, 128):
        return f"the head size must be 64 or 128, got {head_dim}"
    for name, size in (("hidden_size", hidden), ("ffn_dim", ffn)):
        if size % 64 or size > MAX_K:
            return f"{name} must be a multiple of 64 up to {MAX_K}, got {size}"
    if config.vocab_size % 16:
        return f"vocab_size must be a multiple of 16, got {config.vocab_size}"
    if max_len > MAX_LEN:
        return f"prompt plus new tokens must be at most {MAX_LEN}, got {max_len}"
    return _linears_unsupported(model)


def _linears(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    decoder = model.model.decoder
    named = []
    for i, layer in enumerate(decoder.layers):
        attn = layer.self_attn
        named += [(f"layer {i}'s {name}", module) for name, module in (
            ("q_proj", attn.q_proj), ("k_proj", attn.k_proj), ("v_proj", attn.v_proj), ("out_proj", attn.out_proj),
            ("fc1", layer.fc1), ("fc2", layer.fc2))]
    return named + [("lm_head", model.lm_head)]


_KINDS = ("plain nn.Linear layers, or int8 weight-only ones (gpuopt.quant.quantize_int8_weight_only), all of one "
          "kind (no fused ones)")


def _is_int8(module: torch.nn.Module) -> bool:
    from ..quant import Int8WeightOnlyLinear

    return type(module) is Int8WeightOnlyLinear


def _linears_unsupported(model: torch.nn.Module) -> str | None:
    """Why the linear layers cannot run in the kernel: each a plain ``nn.Linear``, or each an int8 weight-only
    layer as :func:`gpuopt.quant.quantize_int8_weight_only` makes it (no activation or norm folded in)."""
    from ..quant import Int8WeightOnlyLinear

    named = _linears(model)
    int8 = _is_int8(named[0][1])  # the first layer's kind, which every other must share
    kind = Int8WeightOnlyLinear if int8 else torch.nn.Linear
    first, module = named[0]
    if type(module) is not kind:  # the first is neither kind
        return f"{first} is a {type(module).__name__}; it reads {_KINDS}"
    for name, module in named:
        if type(module) is not kind:
            return f"{name} is a {type(module).__name__} where {first} is a {kind.__name__}; it reads {_KINDS}"
        if int8 and (module.activation != "none" or module.folded_norm != "none"):
            return (f"{name} has activation {module.activation!r} and folded_norm {module.folded_norm!r}; it reads "
                    "int8 layers as quantize_int8_weight_only makes them ('none' and 'none')")
    return None


def build(model: torch.nn.Module, cache: Any, logits: torch.Tensor) -> Any:
    """The step of OPT ``model`` (on one CUDA device, in its dtype) over ``cache`` (a transformers static cache,
    its layers' ``keys``/``values`` allocated: after a first prefill), writing the logits into ``logits``
    ([1, vocab]). Returns the finished :class:`gpuopt._C.DecodeProgram`; ``program.run(ids, position)`` is
    the step, and ``program.run(ids, position, None, tokens, column)`` the greedy step (its argmax and the
    token loop's bookkeeping in the same kernel)."""
    decoder = model.model.decoder
    dtype = decoder.embed_tokens.weight.dtype
    program = _C.DecodeProgram(logits.device.index, dtype)
    layers = getattr(cache, "layers", None)
    if not layers or not all(hasattr(layer, "keys") for layer in layers):
        raise ValueError("path 'static-megakernel' needs a transformers static cache with per-layer keys and "
                         "values (transformers >= 4.56)")
    why = _linears_unsupported(model)
    if why is not None:
        raise ValueError(f"path 'static-megakernel' cannot run {type(model).__name__}: {why}")
    int8 = _is_int8(model.lm_head)  # every linear layer int8 weight-only, or none (checked above)

    def linear(x: int, modules: list[torch.nn.Module], **kw: Any) -> int:
        scales = [m.scales for m in modules] if int8 else None
        return program.linear(x, [m.weight for m in modules], [getattr(m, "bias", None) for m in modules],
                              scales=scales, **kw)

    embed = decoder.embed_positions
    h = program.embed(decoder.embed_tokens.weight, embed.weight, getattr(embed, "offset", 2))
    for i, layer in enumerate(decoder.layers):
        attn = layer.self_attn
        norm = layer.self_attn_layer_norm
        qkv = linear(h, [attn.q_proj, attn.k_proj, attn.v_proj], norm_weight=norm.weight, norm_bias=norm.bias,
                     eps=norm.eps)
        att = program.attention(qkv, layers[i].keys, layers[i].values, attn.scaling)
        mid = linear(att, [attn.out_proj], residual=h)
        norm = layer.final_layer_norm
        f = linear(mid, [layer.fc1], norm_weight=norm.weight, norm_bias=norm.bias, eps=norm.eps, relu=True)
        h = linear(f, [layer.fc2], residual=mid)
    norm = decoder.final_layer_norm
    linear(h, [model.lm_head], norm_weight=norm.weight, norm_bias=norm.bias, eps=norm.eps, output=False,
           plain=logits)
    program.finish()
    return program
