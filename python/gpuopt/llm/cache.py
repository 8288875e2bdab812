"""gpuopt's static KV cache for its decode paths.

transformers' ``StaticCache`` keeps a fill level per layer: each layer's ``update`` computes the
positions to write from it, writes the key and the value with two ``index_copy_``, and advances it --
in a compiled OPT-1.3B decode step on an H100, 72 small kernels per step (3 per layer, about 0.08 ms
with the gaps between them).

:func:`share_fill_level` swaps the cache's full-attention layers for :class:`DecodeLayer` s that share
one fill level, owned by the caller (gpuopt's Decoder advances it once per step: it is the step's
position), and, where gpuopt's decode attention runs (:func:`defer_writes`), hand a decode step's new
key and value to the attention function instead of writing them: its kernel
(``torch.ops.gpuopt.decode_attention_append``) writes them into the cache and attends in one launch.
Anything else that attends (SDPA for a shape the kernel does not take) writes them first
(:meth:`DecodeLayer.flush`), so the cache is never read stale; a write no attention takes is an error
at the layer's next update (the Decoder checks on its first eager step and hands the writes back).
"""

from __future__ import annotations

from typing import Any

import torch

ATTRIBUTE = "_gpuopt_kv"  # on an attention module: its DecodeLayer, whose writes it takes over
_layer_class: type | None = None


def layer_class() -> type | None:
    """The :class:`DecodeLayer` class (built on first use: transformers is optional), or None where this
    transformers has no ``StaticLayer`` keeping its fill level in a tensor (before about 4.56)."""
    global _layer_class
    if _layer_class is not None:
        return _layer_class
    try:
        from transformers.cache_utils import StaticLayer

        probe = StaticLayer(max_cache_len=1)  # 4.54-4.55 take more arguments: no shared level there
    except (ImportError, TypeError):
        return None
    if not isinstance(getattr(probe, "cumulative_length", None), torch.Tensor):
        return None

    class DecodeLayer(StaticLayer):
        """A StaticLayer whose fill level (``cumulative_length``) is a tensor shared by all layers and
        advanced by its owner, not by ``update``; with ``defer`` set, a one-token update is kept in
        ``pending`` for the attention function instead of written."""

        def __init__(self, max_cache_len: int, length: torch.Tensor):
            super().__init__(max_cache_len=max_cache_len)
            self.cumulative_length = length  # lazy_initialization's .to(device) keeps this very tensor
            self.defer = False
            self.pending: tuple[torch.Tensor, torch.Tensor] | None = None
            # causal: the attention function may bound the keys by the fill level (rows [0, position])
            # instead of reading the mask -- set by the owner once it has seen that the model's mask is
            # exactly that (check_mask: record in mask_is_causal whether the next one-token step's was).
            self.causal = False
            self.check_mask = False
            self.mask_is_causal: bool | None = None

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            if self.pending is not None:
                # Its row's position has passed (the owner advanced the fill level): writing it now would
                # land in the wrong row.
                raise RuntimeError("gpuopt.llm.cache: the attention function did not take the previous step's "
                                   "key and value (a model whose attention does not go through "
                                   "gpuopt.llm.attention cannot defer its cache writes: undefer_writes())")
            if self.defer and key_states.shape[-2] == 1:
                self.pending = (key_states, value_states)
            else:
                self.write(key_states, value_states)
            return self.keys, self.values

        def write(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            position = torch.arange(key_states.shape[-2], device=self.device) + self.cumulative_length
            self.keys.index_copy_(2, position, key_states)
            self.values.index_copy_(2, position, value_states)

        def take(self) -> tuple[torch.Tensor, torch.Tensor] | None:
            """The pending key and value (now the taker's to write), or None."""
            pending, self.pending = self.pending, None
            return pending

        def flush(self) -> None:
            """Writes the pending key and value, if any (within the step that deferred them: the row is
            the fill level's)."""
            pending = self.take()
            if pending is not None:
                self.write(*pending)

    _layer_class = DecodeLayer
    return DecodeLayer


def share_fill_level(cache: Any, device: torch.device) -> torch.Tensor | None:
    """Replaces ``cache``'s plain ``StaticLayer`` s by :class:`DecodeLayer` s sharing one fill level,
    which it returns (a 0-d int64 tensor on ``device``, zero); None (the cache unchanged) where this
    transformers or cache does not allow it. Other layer kinds (sliding windows) keep their own."""
    cls = layer_class()
    layers = getattr(cache, "layers", None)
    if cls is None or not isinstance(layers, list) or not layers:
        return None
    from transformers.cache_utils import StaticLayer

    plain = [i for i, layer in enumerate(layers) if type(layer) is StaticLayer and not layer.is_initialized]
    if not plain:
        return None
    length = torch.zeros((), dtype=torch.long, device=device)
    for i in plain:
        layers[i] = cls(layers[i].max_cache_len, length)
    return length


def defer_writes(model: torch.nn.Module, cache: Any) -> int:
    """Hands each module of ``model`` with a ``layer_idx`` (the attention modules of transformers' models)
    its cache layer's writes of one-token updates (:data:`ATTRIBUTE`); returns how many modules took
    theirs."""
    cls = layer_class()
    layers = getattr(cache, "layers", None) or []
    count = 0
    for module in model.modules():
        index = getattr(module, "layer_idx", None)
        if cls is not None and isinstance(index, int) and 0 <= index < len(layers) and isinstance(layers[index], cls):
            layers[index].defer = True
            module.__dict__[ATTRIBUTE] = layers[index]
            count += 1
    return count


def undefer_writes(model: torch.nn.Module, cache: Any = None) -> None:
    """Undoes :func:`defer_writes`. A write of ``cache`` no attention took is dropped: its step is over
    and the fill level has moved on, so its row is no longer known (the Decoder's next prefill rewrites
    the cache)."""
    cls = layer_class()
    for layer in getattr(cache, "layers", None) or []:
        if cls is not None and isinstance(layer, cls):
            layer.take()
            layer.defer = False
            layer.causal = layer.check_mask = False
            layer.mask_is_causal = None
    for module in model.modules():
        module.__dict__.pop(ATTRIBUTE, None)


def pending_layers(cache: Any) -> int:
    """How many of ``cache``'s layers hold a write no attention took."""
    return sum(1 for layer in getattr(cache, "layers", None) or [] if getattr(layer, "pending", None) is not None)


__all__ = ["ATTRIBUTE", "defer_writes", "layer_class", "pending_layers", "share_fill_level", "undefer_writes"]
