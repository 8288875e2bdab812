"""Int8 weight-only quantization: each linear layer's weight stored as int8 with one scale per output
channel (symmetric, absmax / 127), activations kept in their floating-point type. Decoding at small
batches reads every weight once per token, so halving the bytes of the weights is what speeds it up;
the matmul is gpuopt's operator ``torch.ops.gpuopt.int8_weight_only_linear`` (a CUDA kernel for up to
16 rows, dequantize + cuBLAS above that; a float32 reference on CPU)."""

from __future__ import annotations

from typing import Any

import torch

from .._ext import _C  # noqa: F401  (loads the gpuopt operators)


def norm_row_sums(weight: torch.Tensor, scales: torch.Tensor | None = None) -> torch.Tensor:
    """``norm_sum`` of gpuopt's linear operators for a folded layer norm: the weight's row sums in float32
    (an int8 weight's times its per-channel ``scales``). Also :func:`gpuopt.llm.fuse.norm_row_sums`."""
    sums = weight.detach().float().sum(1)
    return sums * scales.detach().float() if scales is not None else sums


class Int8WeightOnlyLinear(torch.nn.Module):
    """``y = (x @ weight.T) * scales + bias`` with an int8 ``weight`` [out, in] and per-output-channel
    ``scales``; built from a float linear layer by :meth:`from_float`.

    >>> lin = torch.nn.Linear(64, 32)
    >>> q = Int8WeightOnlyLinear.from_float(lin)
    >>> x = torch.randn(4, 64)
    >>> bool(((q(x) - lin(x)).abs().max() / lin(x).abs().max()) < 0.05)
    True
    """

    activation = "none"  # the class default, for instances pickled before the attribute existed

    folded_norm, norm_eps = "none", 1e-5  # class defaults, for instances pickled before the attributes existed

    def __init__(self, weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None, activation: str = "none",
                 folded_norm: str = "none", norm_eps: float = 1e-5):
        """``folded_norm`` ("none", "layer", "rms"; ``norm_eps``): a norm of x whose elementwise affine the
        weight and bias hold (gpuopt.llm.fuse.NormLinear), applied by the kernel."""
        super().__init__()
        if activation not in ("none", "relu"):
            raise ValueError(f"activation must be 'none' or 'relu', got {activation!r}")
        if folded_norm not in ("none", "layer", "rms"):
            raise ValueError(f"folded_norm must be 'none', 'layer' or 'rms', got {folded_norm!r}")
        self.activation = activation  # applied in the kernel's epilogue
        if weight.dtype != torch.int8 or weight.dim() != 2:
            raise TypeError(f"weight must be a 2-D int8 tensor, got {weight.dtype} of shape {tuple(weight.shape)}")
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.register_buffer("weight", weight.contiguous())
        self.register_buffer("scales", scales)
        self.register_buffer("bias", bias)
        self.folded_norm, self.norm_eps = folded_norm, float(norm_eps)
        self.register_buffer("norm_sum", None, persistent=False)
        self.register_buffer("norm_scales", None, persistent=False)
        self._norm_sums()
        self.register_load_state_dict_post_hook(lambda module, _keys: module._norm_sums())

    def _norm_sums(self) -> None:
        """With a folded layer norm: the kernel gets the scales in float32 (``norm_scales``, whatever x's
        dtype) and ``norm_sum`` = the weight's row sums times the same values. Recomputed after a move or
        cast and ``load_state_dict``."""
        folded = self.folded_norm == "layer"
        self.norm_scales = self.scales.detach().float() if folded else None
        self.norm_sum = norm_row_sums(self.weight, self.norm_scales) if folded else None

    def _apply(self, fn, recurse=True):  # noqa: ANN001, ANN202  (nn.Module's signature)
        super()._apply(fn, recurse)
        self._norm_sums()  # in float32 whatever the module is moved or cast to
        return self

    @classmethod
    def from_float(cls, module: torch.nn.Module, dtype: torch.dtype | None = None) -> Int8WeightOnlyLinear:
        """From a ``torch.nn.Linear`` or transformers' ``Conv1D`` (GPT-2's linear layers, weight [in, out]).
        Scales and bias take ``dtype`` (default: the weight's floating-point type)."""
        w = module.weight.detach()
        if not isinstance(module, torch.nn.Linear):  # Conv1D: y = x @ W + b, W [in, out]
            w = w.t()
        dtype = dtype or w.dtype
        w32 = w.float()
        scales = (w32.abs().amax(dim=1) / 127.0).clamp_min(1e-12)
        q = torch.round(w32 / scales[:, None]).clamp_(-127, 127).to(torch.int8)
        bias = module.bias.detach().to(dtype) if getattr(module, "bias", None) is not None else None
        return cls(q, scales.to(dtype), bias, folded_norm=getattr(module, "folded_norm", "none"),
                   norm_eps=getattr(module, "norm_eps", 1e-5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.folded_norm == "none":
            return torch.ops.gpuopt.int8_weight_only_linear(x, self.weight, self.scales.to(x.dtype), self.bias,
                                                            self.activation)
        scales = self.norm_scales if self.folded_norm == "layer" else self.scales.to(x.dtype)
        return torch.ops.gpuopt.int8_weight_only_linear(x, self.weight, scales, self.bias, self.activation, None,
                                                        self.folded_norm, self.norm_sum, self.norm_eps)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
                + (f", activation={self.activation}" if self.activation != "none" else "")
                + (f", folded_norm={self.folded_norm}, eps={self.norm_eps}" if self.folded_norm != "none" else ""))


def is_quantized_linear(module: Any) -> bool:
    return isinstance(module, Int8WeightOnlyLinear)


def _linear_types() -> tuple[type, ...]:
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:
        return (torch.nn.Linear,)
    return (torch.nn.Linear, Conv1D)


def quantize_int8_weight_only(model: torch.nn.Module, dtype: torch.dtype = torch.float16,
                              skip: tuple[str, ...] = ()) -> torch.nn.Module:
    """Replaces every linear layer of ``model`` (in place; names in ``skip`` excepted) by an
    :class:`Int8WeightOnlyLinear` whose scales and bias are ``dtype``, and casts the rest of the model
    (embeddings, norms) to ``dtype``. Returns the model. A weight shared with an embedding (tied
    output layer) is quantized for the matmul; the embedding keeps its own floating-point copy."""
    types = _linear_types()
    targets = [(name, m) for name, m in model.named_modules() if isinstance(m, types) and name not in skip]
    if not targets:
        raise ValueError(f"model has no linear layer to quantize ({type(model).__name__})")
    for name, m in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, Int8WeightOnlyLinear.from_float(m, dtype))
    return model.to(dtype)
