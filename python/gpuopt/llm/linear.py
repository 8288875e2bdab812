"""gpuopt's 16-bit linear layers for decode steps, and the L2 prefetch chain between them.

At batch 1 a decode step is a chain of matrix-vector products, each reading one weight matrix once.
:class:`DecodeLinear` runs ``torch.ops.gpuopt.decode_linear``: for 1 to 8 rows of fp16/bf16 a
bandwidth-bound tensor-core kernel of gpuopt's with the bias (and a ReLU, where the model applies one
right after) in its epilogue; for longer inputs (the prefill) ATen's linear, i.e. cuBLAS.

Between two linear layers the step runs small kernels (attention, layer norms, residual adds) that
read little memory, and every kernel starts and ends with the memory system half idle. So each
:class:`DecodeLinear` also names the weight of the layer that runs after it (:func:`chain_prefetch`,
from the order one forward called them in): once its outputs are written, its kernel asks the L2 for
that weight's first bytes (``gpuopt._C.decode_linear_prefetch_bytes``; compute capability 9.0+), which
then stream in while the kernels in between run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .._ext import _C  # noqa: F401  (loads the gpuopt operators)

DTYPES = (torch.float16, torch.bfloat16)


class DecodeLinear(nn.Module):
    """``act(x @ weight.T + bias)`` through ``torch.ops.gpuopt.decode_linear``, on the parameters of the
    ``nn.Linear`` it replaces (shared, so a weight tied to an embedding stays tied). ``activation``:
    "none" or "relu"; ``prefetch``: the tensor the kernel asks the L2 for after its outputs (None: none)."""

    def __init__(self, linear: nn.Linear, activation: str = "none"):
        super().__init__()
        if activation not in ("none", "relu"):
            raise ValueError(f"activation must be 'none' or 'relu', got {activation!r}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_parameter("weight", linear.weight)
        self.register_parameter("bias", linear.bias)
        self.activation = activation
        self.prefetch: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.gpuopt.decode_linear(x, self.weight, self.bias, self.activation, self.prefetch)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"activation={self.activation}, prefetch={self.prefetch is not None}")


def use_decode_linear(model: nn.Module) -> int:
    """Replaces, in place, every plain ``nn.Linear`` of ``model`` with a float16/bfloat16 weight by a
    :class:`DecodeLinear`, and fuses a ReLU into the first of a ``fc1``, ``activation_fn`` (``nn.ReLU``),
    ``fc2`` trio of siblings (OPT's MLP); returns how many linear layers were replaced."""
    count = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear and child.weight.dtype in DTYPES:
                setattr(module, name, DecodeLinear(child))
                count += 1
    for module in model.modules():
        fc1, act = getattr(module, "fc1", None), getattr(module, "activation_fn", None)
        if isinstance(fc1, DecodeLinear) and isinstance(act, nn.ReLU) and isinstance(getattr(module, "fc2", None),
                                                                                    nn.Module):
            fc1.activation = "relu"
            module.activation_fn = nn.Identity()
    return count


def call_order(model: nn.Module, run: Callable[[], Any]) -> list[DecodeLinear]:
    """The :class:`DecodeLinear` modules of ``model`` in the order ``run()`` (one forward) first called them."""
    order: dict[int, DecodeLinear] = {}

    def hook(module: nn.Module, args: Any) -> None:
        order.setdefault(id(module), module)

    handles = [m.register_forward_pre_hook(hook) for m in model.modules() if isinstance(m, DecodeLinear)]
    try:
        run()
    finally:
        for h in handles:
            h.remove()
    return list(order.values())


def chain_prefetch(order: list[DecodeLinear]) -> int:
    """Gives each layer of ``order`` the next one's weight to prefetch (the last, the first's: the next
    step starts there); returns how many layers prefetch."""
    for i, m in enumerate(order):
        # Detached (same memory): a Parameter attribute would register as one of this module's.
        m.prefetch = order[(i + 1) % len(order)].weight.detach() if len(order) > 1 else None
    return len(order) if len(order) > 1 else 0


def clear_prefetch(model: nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, DecodeLinear):
            m.prefetch = None


__all__ = ["DecodeLinear", "call_order", "chain_prefetch", "clear_prefetch", "use_decode_linear"]
