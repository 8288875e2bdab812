"""gpuopt's decode attention inside Hugging Face models.

A decode step attends one query token per head to the KV cache. Through ``torch.nn.functional.
scaled_dot_product_attention`` that is a general kernel launched per layer (cuDNN's took 6.2-6.3 us
per layer of OPT-1.3B on an H100, for about 100 KB of cache). gpuopt's operator
(``torch.ops.gpuopt.decode_attention``) reads the boolean mask as transformers builds it and only the
cache rows the mask lets through, in one kernel (5.4-5.6 us per layer there; 1.15-7.6x transformers'
SDPA function per call on the decode shapes measured, see the README).

It enters a model through transformers' attention interface (``AttentionInterface``, the documented
way to plug an attention function in): :func:`use` registers it under the name ``"gpuopt"``, with
SDPA's mask function (the same boolean mask SDPA gets), and switches the model to it. The function
runs gpuopt's operator for one query token (on the CPU its float32 reference, for tests) and hands
everything else (the prefill, dropout, softcapping, attention sinks, float masks, autograd, shapes the
operator does not take) to transformers' SDPA function unchanged. Models that do
not dispatch through the interface keep their attention; :func:`use` then says so.
"""

from __future__ import annotations

from typing import Any

import torch

from . import cache as _cache

NAME = "gpuopt"
DIMS = (32, 64, 128, 256)  # head sizes the CUDA kernel takes; others run SDPA (the CPU reference takes any)
# Keywords that change what attention computes: with any of them set, SDPA runs.
_SDPA_ONLY = ("softcap", "s_aux", "sinks", "sliding_window", "position_bias")

# How many eager calls ran gpuopt's operator, so that a caller can tell whether a model's attention
# went through it.
calls = 0


def _sdpa() -> Any:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward


def takes(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
          dropout: float = 0.0, **kwargs: Any) -> bool:
    """Whether :func:`attention` runs gpuopt's operator for these arguments (else SDPA): one query
    token, and on CUDA a head size the kernel takes. On an H100 the kernel beat transformers' SDPA
    function (as models call it, with a mask: grouped KV heads copied per query head first) on every
    decode shape measured, batch 1-32, caches of 384-4,096 keys, 32 or 8 KV heads for 32 query heads
    (1.15-7.6x; ``benchmarks/llm_decode.py --parts attention``)."""
    if query.dim() != 4 or key.dim() != 4 or value.shape != key.shape:
        return False
    b, h, _, d = query.shape
    if key.shape[0] != b or key.shape[3] != d or key.shape[1] < 1 or h % key.shape[1]:
        return False
    if isinstance(attention_mask, torch.Tensor) and (attention_mask.dim() != 4
                                                     or attention_mask.shape[-1] != key.shape[2]):
        return False
    if torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad):
        return False  # the operator has no backward
    if query.is_cuda and d not in DIMS:
        return False
    return (query.shape[2] == 1
            and query.dtype == key.dtype == value.dtype
            and query.dtype in (torch.float16, torch.bfloat16, torch.float32)
            and not dropout and not kwargs.get("output_attentions")
            and all(kwargs.get(k) is None for k in _SDPA_ONLY)
            and (attention_mask is None or (isinstance(attention_mask, torch.Tensor)
                                            and attention_mask.dtype == torch.bool)))


def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: Any, dropout: float = 0.0, scaling: float | None = None, is_causal: bool | None = None,
              **kwargs: Any) -> tuple[torch.Tensor, None]:
    """A transformers attention function (query [B, H, q, D], key and value [B, Hkv, L, D]; returns
    [B, q, H, D] and no weights): gpuopt's operator for one query token, SDPA otherwise."""
    global calls
    # A gpuopt cache layer may have left this step's key and value to write (gpuopt.llm.cache).
    layer = getattr(module, _cache.ATTRIBUTE, None)
    pending = layer.take() if layer is not None else None
    if pending is not None and key is not layer.keys:  # not this layer's cache after all: written as usual
        layer.write(*pending)
        pending = None
    if takes(query, key, value, attention_mask, dropout, **kwargs):
        if not torch.compiler.is_compiling():
            calls += 1
        if pending is not None:  # written by the kernel, which reads the new row from them
            if layer.check_mask:
                layer.mask_is_causal = is_causal_mask(attention_mask, layer.cumulative_length, key.shape[2])
            # A mask known to be the causal one (gpuopt.llm.cache) is not read: the kernel bounds the keys
            # by the position, and the mask's computation is left out of a compiled step.
            mask = None if layer.causal else attention_mask
            return torch.ops.gpuopt.decode_attention_append(query, key, value, pending[0], pending[1],
                                                            layer.cumulative_length, mask, scaling,
                                                            layer.causal), None
        return torch.ops.gpuopt.decode_attention(query, key, value, attention_mask, scaling), None
    if pending is not None:
        layer.write(*pending)
    return _sdpa()(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                   is_causal=is_causal, **kwargs)


def is_causal_mask(mask: Any, position: torch.Tensor | int, keys: int) -> bool:
    """Whether ``mask`` (a decode step's, broadcastable to [batch, heads, 1, keys]) lets exactly the rows
    [0, position] through for every batch row and head. Reads the device (synchronizes): for a check
    on an eager step, not for the step itself."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[-1] != keys:
        return False
    rows = torch.arange(keys, device=mask.device) <= torch.as_tensor(position, device=mask.device).reshape(())
    return bool(torch.equal(mask, rows.view(1, 1, 1, keys).expand(mask.shape)))


def register() -> None:
    """Registers :func:`attention` with transformers as ``"gpuopt"`` (idempotent), with SDPA's
    boolean mask."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)


def can_use(model: torch.nn.Module) -> bool:
    """Whether ``model`` dispatches its attention through transformers' attention interface, so that
    :func:`use` can switch it."""
    if not callable(getattr(model, "set_attn_implementation", None)) or getattr(model, "config", None) is None:
        return False
    check = getattr(model, "_can_set_attn_implementation", None)
    return bool(check()) if callable(check) else True


def use(model: torch.nn.Module) -> str | None:
    """Switches ``model`` to gpuopt's decode attention; returns the implementation it had (for
    :func:`restore`), or None where the model cannot switch (it keeps its own)."""
    if not can_use(model):
        return None
    register()
    before = model.config._attn_implementation
    model.set_attn_implementation(NAME)
    return before


def restore(model: torch.nn.Module, before: str | None) -> None:
    """Undoes :func:`use` (``before`` is what it returned). Only the top-level setting is kept and
    restored: a multimodal model's sub-configs come back with it too."""
    if before is not None and model.config._attn_implementation != before:
        model.set_attn_implementation(before)


# -- the attention layer's decode step in one operator --------------------------------------------------------
#
# With the q/k/v projections fused (gpuopt.llm.fuse), the key and value written by the attention kernel and the
# keys bounded by the position (gpuopt.llm.cache: a causal layer), a decode step's attention is the projection's
# kernel, then the attention's. ``torch.ops.gpuopt.decode_qkv_attention`` does both in one kernel on CUDA: the
# block that finishes a head's projection tiles runs that head's attention, while the other heads' tiles still
# stream (csrc/cuda/decode_qkv_attention_kernels.cuh), so neither a kernel boundary nor the attention's own
# launch and first loads stand between them. :func:`fuse_steps` gives each attention module of a class in
# :data:`STEP_LAYERS` a forward that runs it for one-token steps and the module's own forward otherwise.

# Attention classes whose forward is transformers' OPT form (4.5x-5.x): q, k and v projections of the hidden
# states (q times ``scaling``), the cache's update, the attention function with scaling 1.0, then ``out_proj``
# of the heads' outputs side by side; it returns (output, weights).
STEP_LAYERS: tuple[str, ...] = ("OPTAttention",)
_STEP = "_gpuopt_step"  # on a fused module: its counters (the kernel's per-head count), int32 zeros

# How many eager calls ran the fused operator (as ``calls`` for the attention function).
step_calls = 0


def _step_projection(module: torch.nn.Module) -> torch.nn.Module | None:
    """The linear layer computing ``module``'s q, k and v at once (a fused projection whose scale is folded, of
    three equal parts), or None."""
    from .fuse import FusedProjections, NormLinear
    from .linear import DecodeLinear

    fused = getattr(module, "q_proj", None)
    if not isinstance(fused, FusedProjections) or len(fused.sizes) != 3 or len(set(fused.sizes)) != 1:
        return None
    linear = fused.linear
    if type(linear) not in (torch.nn.Linear, NormLinear, DecodeLinear) or getattr(linear, "activation", "none") != "none":
        return None
    return linear if getattr(module, "scaling", None) == 1.0 else None


def _fused_step(module: torch.nn.Module, hidden_states: torch.Tensor, *args: Any,
                **kwargs: Any) -> tuple[torch.Tensor, None] | None:
    """``module``'s forward as one operator where it applies (one new token, its cache layer causal and
    deferring, the fused projection, no attention weights asked for), else None."""
    global step_calls
    layer = getattr(module, _cache.ATTRIBUTE, None)
    linear = _step_projection(module)
    counters = module.__dict__.get(_STEP)
    if (layer is None or linear is None or counters is None or module.training or kwargs.get("output_attentions")
            or (len(args) > 2 and args[2]) or not getattr(layer, "causal", False) or not layer.defer
            or not layer.is_initialized or layer.pending is not None
            or getattr(module.config, "_attn_implementation", None) != NAME
            or hidden_states.dim() != 3 or hidden_states.shape[1] != 1 or torch.is_grad_enabled()):
        return None
    keys, values = layer.keys, layer.values
    b, h, _, d = keys.shape
    if (h != getattr(module, "num_heads", None) or linear.weight.shape[0] != 3 * h * d or keys.dtype != hidden_states.dtype
            or b != hidden_states.shape[0] or (keys.is_cuda and d not in DIMS)):
        return None
    if not torch.compiler.is_compiling():
        step_calls += 1
    norm = getattr(linear, "folded_norm", "none")
    sums = getattr(linear, "norm_sum", None)
    if norm == "layer" and sums is None:  # a NormLinear (the step before DecodeLinear) takes them per call
        from .fuse import norm_row_sums

        sums = norm_row_sums(linear.weight)
    out = torch.ops.gpuopt.decode_qkv_attention(hidden_states, linear.weight, linear.bias, keys, values,
                                                layer.cumulative_length, counters, norm,
                                                sums if norm == "layer" else None,
                                                getattr(linear, "norm_eps", 1e-5), 1.0)
    return module.out_proj(out.reshape(b, 1, h * d)), None


def _step_forward(module: torch.nn.Module):  # noqa: ANN202 - a bound forward
    own = type(module).forward

    def forward(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        out = _fused_step(module, hidden_states, *args, **kwargs)
        return out if out is not None else own(module, hidden_states, *args, **kwargs)

    return forward


def fuse_steps(model: torch.nn.Module) -> int:
    """Gives each attention module of ``model`` whose class is in :data:`STEP_LAYERS`, whose q/k/v projections
    are fused (:func:`gpuopt.llm.fuse.fuse_projections`) and whose cache layer defers its writes
    (:func:`gpuopt.llm.cache.defer_writes`) a forward running one-token steps through
    ``torch.ops.gpuopt.decode_qkv_attention`` (its own forward otherwise, and for steps whose layer is not
    causal). Returns how many modules got it; :func:`unfuse_steps` undoes it."""
    count = 0
    for module in model.modules():
        if type(module).__name__ not in STEP_LAYERS or _step_projection(module) is None:
            continue
        layer = getattr(module, _cache.ATTRIBUTE, None)
        heads = getattr(module, "num_heads", None)
        if layer is None or not isinstance(heads, int) or heads < 1:
            continue
        module.__dict__[_STEP] = torch.zeros(heads, dtype=torch.int32, device=module.q_proj.linear.weight.device)
        module.__dict__["forward"] = _step_forward(module)
        count += 1
    return count


def unfuse_steps(model: torch.nn.Module) -> None:
    """Undoes :func:`fuse_steps`."""
    for module in model.modules():
        if module.__dict__.pop(_STEP, None) is not None:
            module.__dict__.pop("forward", None)


__all__ = ["DIMS", "NAME", "STEP_LAYERS", "attention", "can_use", "fuse_steps", "is_causal_mask", "register", "restore",
           "takes", "unfuse_steps", "use"]
