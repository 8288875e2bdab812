"""gpuopt's 16-bit linear layers for decode steps.

At batch 1 a decode step is a chain of matrix-vector products, each reading one weight matrix once.
:class:`DecodeLinear` runs ``torch.ops.gpuopt.decode_linear``: for 1 to 8 rows of fp16/bf16 a
bandwidth-bound tensor-core kernel of gpuopt's with the bias (and a ReLU, where a known layer applies one
right after: OPT's MLP) in its epilogue -- one kernel where cuBLAS runs a GEMM, at times a split-K reduction, and
the ReLU; for longer inputs (the prefill) ATen's linear, i.e. cuBLAS. Inference only: the operator has
no autograd formula.
"""

from __future__ import annotations

import torch
from torch import nn

from .._ext import _C  # noqa: F401  (loads the gpuopt operators)

DTYPES = (torch.float16, torch.bfloat16)


class DecodeLinear(nn.Module):
    """``act(x @ weight.T + bias)`` through ``torch.ops.gpuopt.decode_linear``, on the parameters of the
    ``nn.Linear`` it replaces (shared, so a weight tied to an embedding stays tied). ``activation``:
    "none" or "relu". From a :class:`gpuopt.llm.fuse.NormLinear` it keeps the folded norm: the kernel
    normalizes x's rows (``folded_norm``, ``norm_eps``; ``norm_sum``, the weight's row sums, kept in
    float32 whatever the module is moved or cast to)."""

    def __init__(self, linear: nn.Linear, activation: str = "none"):
        super().__init__()
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be a torch.nn.Linear (weight [out, in]), got {type(linear).__name__}")
        if activation not in ("none", "relu"):
            raise ValueError(f"activation must be 'none' or 'relu', got {activation!r}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_parameter("weight", linear.weight)
        self.register_parameter("bias", linear.bias)
        self.activation = activation
        self.folded_norm: str = getattr(linear, "folded_norm", "none")
        self.norm_eps: float = getattr(linear, "norm_eps", 1e-5)
        self.register_buffer("norm_sum", None, persistent=False)
        self._norm_sums()
        self.register_load_state_dict_post_hook(lambda module, _keys: module._norm_sums())

    def _norm_sums(self) -> None:
        """``norm_sum`` from the weight as it is now: after construction, a move or cast (``_apply``) and
        ``load_state_dict``. A weight changed in place otherwise needs a call of this."""
        from .fuse import norm_row_sums

        self.norm_sum = norm_row_sums(self.weight) if self.folded_norm == "layer" else None

    def _apply(self, fn, recurse=True):  # noqa: ANN001, ANN202  (nn.Module's signature)
        super()._apply(fn, recurse)
        self._norm_sums()  # from the weight as moved or cast, in float32
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.folded_norm == "none":
            return torch.ops.gpuopt.decode_linear(x, self.weight, self.bias, self.activation)
        return torch.ops.gpuopt.decode_linear(x, self.weight, self.bias, self.activation, None, self.folded_norm,
                                              self.norm_sum, self.norm_eps)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"activation={self.activation}"
                + (f", folded_norm={self.folded_norm}, eps={self.norm_eps}" if self.folded_norm != "none" else ""))


# Decoder layers whose forward applies ``activation_fn`` once, to ``fc1``'s output only, and hands the
# result to ``fc2`` (transformers' OPT): :func:`fuse_relu` may move a ReLU there into ``fc1``.
RELU_MLP_LAYERS: tuple[str, ...] = ("OPTDecoderLayer",)


def use_decode_linear(model: nn.Module, relu: bool = True) -> int:
    """Replaces, in place, every plain ``nn.Linear`` (or :class:`gpuopt.llm.fuse.NormLinear`) of ``model``
    with a float16/bfloat16 weight by a :class:`DecodeLinear` and, with ``relu``, fuses ReLUs
    (:func:`fuse_relu`); returns how many linear layers were replaced."""
    from .fuse import NormLinear

    count = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) in (nn.Linear, NormLinear) and child.weight.dtype in DTYPES:
                setattr(module, name, DecodeLinear(child))
                count += 1
    if relu:
        fuse_relu(model)
    return count


def fuse_relu(model: nn.Module, layers: tuple[str, ...] = RELU_MLP_LAYERS) -> int:
    """Moves the ReLU of every layer whose class name is in ``layers`` (whose forward applies
    ``activation_fn`` to ``fc1``'s output only, then ``fc2``: :data:`RELU_MLP_LAYERS`) into ``fc1``'s
    epilogue, where ``activation_fn`` is an ``nn.ReLU`` and ``fc1`` one of gpuopt's layers that take an
    ``activation`` (a :class:`DecodeLinear` or an int8 weight-only linear); ``activation_fn`` becomes
    ``nn.Identity``. Returns how many were fused."""
    from ..quant import Int8WeightOnlyLinear

    count = 0
    for module in model.modules():
        if type(module).__name__ not in layers:
            continue
        fc1, act = getattr(module, "fc1", None), getattr(module, "activation_fn", None)
        if (isinstance(fc1, (DecodeLinear, Int8WeightOnlyLinear)) and fc1.activation == "none"
                and type(act) is nn.ReLU and isinstance(getattr(module, "fc2", None), nn.Module)):
            fc1.activation = "relu"
            module.activation_fn = nn.Identity()
            count += 1
    return count


__all__ = ["DTYPES", "RELU_MLP_LAYERS", "DecodeLinear", "fuse_relu", "use_decode_linear"]
