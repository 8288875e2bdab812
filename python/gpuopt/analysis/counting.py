"""What one forward call of a model costs, counted: FLOPs (torch's FlopCounterMode) and the bytes it
moves (forward hooks on the leaf modules). The roofline places measured runs against these counts."""

from __future__ import annotations

import math
import weakref
from typing import Any

import torch

from ..timing.inputs import split_inputs, tensors_in


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


_FORMULAS_REGISTERED = False


def _matmul_flops(x_shape, w_shape, *args: Any, out_shape=None, **kwargs: Any) -> int:
    """x [..., K] times weight [N, K]^T: 2 * rows * K * N."""
    return 2 * math.prod(x_shape[:-1]) * x_shape[-1] * w_shape[0]


def _decode_attention_flops(q_shape, k_shape, *args: Any, out_shape=None, **kwargs: Any) -> int:
    """One query per (batch row, head) against every key of the cache, scores then values: 4 * B * H * L * D
    (as torch counts SDPA: the keys a mask lets through are not known from the shapes)."""
    b, h, _, d = q_shape
    return 4 * b * h * k_shape[2] * d


def register_flop_formulas() -> None:
    """Registers FLOP formulas for gpuopt's own operators with ``torch.utils.flop_counter`` (an operator
    without one counts 0): ``decode_linear`` and ``int8_weight_only_linear`` as matrix products,
    ``decode_attention`` and ``decode_attention_append`` as attention over the whole cache. Idempotent;
    :func:`count_flops` calls it. Needs gpuopt's compiled extension (where the operators live)."""
    global _FORMULAS_REGISTERED
    if _FORMULAS_REGISTERED:
        return
    from torch.utils.flop_counter import register_flop_formula

    from .._ext import _C  # noqa: F401  (loads the extension, which registers the operators)

    ops = torch.ops.gpuopt
    register_flop_formula([ops.decode_linear, ops.int8_weight_only_linear])(_matmul_flops)
    register_flop_formula([ops.decode_attention, ops.decode_attention_append])(_decode_attention_flops)
    _FORMULAS_REGISTERED = True


def count_flops(model: Any, inputs: Any) -> float:
    """FLOPs of one forward call, counted by ``torch.utils.flop_counter.FlopCounterMode`` under
    ``torch.no_grad()`` (a multiply-add is 2 FLOPs; matmuls, convolutions and attention are counted,
    gpuopt's decode and int8 weight-only linear layers and decode attention too
    (:func:`register_flop_formulas`), elementwise ops are not).

    ``inputs``: a tensor (one positional argument), a tuple/list (positional), a dict (keyword).

    >>> import torch
    >>> count_flops(torch.nn.Linear(32, 16, bias=False), torch.randn(8, 32))
    8192.0
    """
    from torch.utils.flop_counter import FlopCounterMode

    if not callable(model):
        raise TypeError(f"model must be an nn.Module or a callable, got {type(model).__name__}")
    args, kwargs = split_inputs(inputs)
    register_flop_formulas()
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(*args, **kwargs)
    return float(counter.get_total_flops())


def count_bytes(model: torch.nn.Module, inputs: Any) -> dict[str, int]:
    """Bytes one forward call moves to and from device memory, as a lower and an upper estimate.

    One forward call runs under ``torch.no_grad()`` with a forward hook on every leaf module (a
    module without children); tensors are counted at their stored size (``numel * element_size``).

    - ``min_bytes``: every tensor moved the fewest times an unfused execution allows: parameters and
      buffers read once, the inputs read once, the outputs written once, and each intermediate
      activation (a leaf module's output that is not a model output) written once and read once.
    - ``max_bytes``: every leaf-module call moves its own parameters and buffers, its inputs and its
      outputs once (so a module called twice reads its weights twice, and an input read by two
      modules is read twice); parameters of non-leaf modules are read once. Never below min_bytes.

    Work in functional calls between modules (``x + y`` inside ``forward``) is seen only through the
    tensors that leaf modules take and give. Also returned: ``weight_bytes``, ``input_bytes``,
    ``output_bytes``, ``activation_bytes`` (intermediates, counted once) and ``leaf_calls``.

    >>> import torch
    >>> count_bytes(torch.nn.Linear(4, 2, bias=False), torch.randn(1, 4))["min_bytes"]  # 32 + 16 + 8
    56
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    args, kwargs = split_inputs(inputs)
    leaves = [m for m in model.modules() if next(m.children(), None) is None]
    leaf_ids = {id(m) for m in leaves}
    weights = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    non_leaf_weights = {id(t): t for m in model.modules() if id(m) not in leaf_ids
                        for t in [*m.parameters(recurse=False), *m.buffers(recurse=False)]}
    calls: list[int] = []  # bytes each leaf call moves (max model)
    produced: list[tuple[Any, int, int]] = []  # (weakref to a leaf output, its data_ptr, its bytes)

    def hook(module, hook_args, hook_kwargs, output):
        own = _nbytes([*module.parameters(recurse=False), *module.buffers(recurse=False)])
        outs = tensors_in(output)
        calls.append(own + _nbytes(tensors_in(hook_args)) + _nbytes(tensors_in(hook_kwargs)) + _nbytes(outs))
        for t in outs:
            produced.append((weakref.ref(t), t.data_ptr(), t.numel() * t.element_size()))

    handles = [m.register_forward_hook(hook, with_kwargs=True) for m in leaves]
    try:
        with torch.no_grad():
            output = model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    outputs = tensors_in(output)
    # A leaf output that is (or is viewed by) a model output is written once as an output, not an
    # activation. A weakref still alive identifies it: a view keeps its base alive, and a freed
    # intermediate whose memory the output reuses is dead.
    out_objs = {id(t) for t in outputs} | {id(t._base) for t in outputs if t._base is not None}
    out_ptrs = {t.data_ptr() for t in outputs}
    activation = 0
    for ref, ptr, nbytes in produced:
        t = ref()
        if t is not None and (id(t) in out_objs or (ptr in out_ptrs and ptr != 0 and t.data_ptr() == ptr)):
            continue
        activation += nbytes
    weight_bytes = _nbytes(list(weights.values()))
    input_bytes = _nbytes(tensors_in(args)) + _nbytes(tensors_in(kwargs))
    output_bytes = _nbytes(outputs)
    min_bytes = weight_bytes + input_bytes + output_bytes + 2 * activation
    max_bytes = max(min_bytes, sum(calls) + _nbytes(list(non_leaf_weights.values())))
    return {"min_bytes": min_bytes, "max_bytes": max_bytes, "weight_bytes": weight_bytes,
            "input_bytes": input_bytes, "output_bytes": output_bytes, "activation_bytes": activation,
            "leaf_calls": len(calls)}
