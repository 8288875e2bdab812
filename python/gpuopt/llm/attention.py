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


__all__ = ["DIMS", "NAME", "attention", "can_use", "is_causal_mask", "register", "restore", "takes", "use"]
