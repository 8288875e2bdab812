"""Fused input projections for gpuopt's decode paths.

At batch 1 a decode step is a chain of matrix-vector products, each reading one weight matrix; a small
matrix costs a kernel's launch and ramp-up as much as its bytes (on an H100, OPT-1.3B's 2048 x 2048
projections ran at 1.3 TB/s, its 2048 x 8192 ones at 2.4 TB/s). The projections that read the same
input -- an attention layer's q, k and v, a gated MLP's gate and up -- are fused here into one linear
layer over their concatenated weights: one larger GEMM (or one int8 kernel after quantization) instead
of two or three, with the same arithmetic per output (the parity check compares every cell with the
unfused fp32 reference).

The model's own forward is unchanged: the first projection computes all outputs and returns its
slice, the others return theirs from that same call (and compute afresh if called on another input,
so a model that does not follow the q, k, v order stays correct, only unfused).

Attention layers that scale the query projection's output in their forward (``q_proj(x) *
self.scaling``: :data:`SCALED_QUERY_LAYERS`) get the scale folded into the query rows of the fused
weight and bias, and ``scaling`` set to 1.0: a multiplication by one, which torch.compile drops, instead
of a kernel per layer and step. With a power-of-two scale (OPT's head sizes 64 and 256: 1/8, 1/16) the
outputs are the same bits in fp32 and bf16; in fp16 a weight below 2^-11 in magnitude becomes subnormal
once scaled and loses bits (the scale is folded in fp32, before the cast). Other scales differ by the
rounding of the scaled weights. Every cell's parity check compares with the unfused fp32 reference.
"""

from __future__ import annotations

import torch
from torch import nn

from ..quant.prologue import RMS_NORMS, norm_of
from ..quant.weight_only import norm_row_sums  # the linear operators' norm_sum (re-exported)

# The sibling projections fused, in the order a model's forward calls them.
GROUPS: tuple[tuple[str, ...], ...] = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
# Attention classes whose forward computes ``q_proj(hidden_states) * self.scaling`` and uses ``scaling``
# for nothing else (transformers 4.5x-5.x): the scale is folded into the fused query rows.
SCALED_QUERY_LAYERS: tuple[str, ...] = ("OPTAttention",)


def _version(x: torch.Tensor) -> int | None:
    """``x``'s version counter (bumped by every in-place change); None for an inference-mode tensor,
    which has none, and while torch.compile traces (the traced step is one graph: identity alone then
    says it is the same input)."""
    if torch.compiler.is_compiling():
        return None
    try:
        return x._version
    except RuntimeError:
        return None


class FusedProjections(nn.Module):
    """Several linear layers reading one input, as one (``linear``, their weights concatenated)."""

    def __init__(self, linears: list[nn.Linear], first_scale: float = 1.0):
        """``first_scale`` multiplies the first projection's weight and bias (a scale its output got
        after the call, folded in)."""
        super().__init__()
        first = linears[0]
        w = first.weight
        has_bias = any(m.bias is not None for m in linears)
        self.sizes = tuple(m.out_features for m in linears)
        self.first_scale = first_scale
        self.linear = nn.Linear(first.in_features, sum(self.sizes), bias=has_bias, device=w.device, dtype=w.dtype)
        with torch.no_grad():
            self.linear.weight.copy_(torch.cat([m.weight for m in linears]))
            if has_bias:
                self.linear.bias.copy_(torch.cat([m.bias if m.bias is not None else
                                                  torch.zeros(m.out_features, device=w.device, dtype=w.dtype)
                                                  for m in linears]))
            if first_scale != 1.0:  # in the parameters' dtype, as the model scales its output
                self.linear.weight[:self.sizes[0]].mul_(first_scale)
                if has_bias:
                    self.linear.bias[:self.sizes[0]].mul_(first_scale)
        self.linear.requires_grad_(False)
        # The last input, its version counter and its outputs, None where handed out already (released
        # once every part was taken, so that a long prefill's activations are not kept until the next call).
        self._last: tuple[torch.Tensor, int | None, tuple[torch.Tensor | None, ...]] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The first projection's output; the others' are kept for :meth:`part`."""
        parts = self.linear(x).split(self.sizes, dim=-1)
        self._last = (x, _version(x), (None, *parts[1:])) if len(parts) > 1 else None
        return parts[0]

    def part(self, x: torch.Tensor, index: int) -> torch.Tensor:
        """Output ``index`` of the fused layer on ``x``: the one computed with the first projection when
        ``x`` is that call's input, unchanged since (same tensor, same version) and the part was not
        taken yet; else computed afresh."""
        last = self._last
        if last is not None and last[0] is x and last[1] == _version(x) and last[2][index] is not None:
            parts = last[2]
            rest = (*parts[:index], None, *parts[index + 1:])
            self._last = None if all(p is None for p in rest) else (last[0], last[1], rest)
            return parts[index]
        return self.linear(x).split(self.sizes, dim=-1)[index]

    def extra_repr(self) -> str:
        return f"sizes={self.sizes}" + (f", first_scale={self.first_scale}" if self.first_scale != 1.0 else "")


class ProjectionPart(nn.Module):
    """Projection ``index`` (> 0) of a :class:`FusedProjections`: its slice of the fused output."""

    def __init__(self, fused: FusedProjections, index: int):
        super().__init__()
        self._fused = (fused,)  # not a submodule: its weights are counted once, under the fused module
        self.index = index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._fused[0].part(x, self.index)

    def extra_repr(self) -> str:
        return f"index={self.index}"


def fuse_projections(model: nn.Module, scaled_query: tuple[str, ...] = SCALED_QUERY_LAYERS) -> int:
    """Fuses, in place, every group of :data:`GROUPS` found as plain ``nn.Linear`` siblings with one
    input size, dtype and device; returns how many groups were fused. In modules whose class is named in
    ``scaled_query``, the query's ``scaling`` (a float) is folded into the fused weights and set to 1.0."""
    if not isinstance(scaled_query, (tuple, list)) or not all(isinstance(n, str) for n in scaled_query):
        raise TypeError(f"fuse_projections: scaled_query must be a tuple of class names, got {scaled_query!r}")
    count = 0
    for module in list(model.modules()):
        for names in GROUPS:
            linears = [getattr(module, n, None) for n in names]
            if not all(type(m) is nn.Linear for m in linears):
                continue
            w0 = linears[0].weight
            if any(m.in_features != linears[0].in_features or m.weight.dtype != w0.dtype or
                   m.weight.device != w0.device for m in linears):
                continue
            scale = getattr(module, "scaling", None)
            fold = names[0] == "q_proj" and type(module).__name__ in scaled_query and isinstance(scale, float)
            fused = FusedProjections(linears, first_scale=scale if fold else 1.0)
            if fold:
                module.scaling = 1.0
            setattr(module, names[0], fused)
            for i, n in enumerate(names[1:], start=1):
                setattr(module, n, ProjectionPart(fused, i))
            count += 1
    return count


# Decoder layers whose norm's output feeds one module only: (norm, the module reading it, whether that may be
# a plain linear layer -- else it must be a FusedProjections holding every projection of the norm's output).
# OPT's (transformers 4.5x-5.x) with ``do_layer_norm_before`` (all but opt-350m); Llama's.
NORM_FOLDS: dict[str, tuple[tuple[str, str, bool], ...]] = {
    "OPTDecoderLayer": (("self_attn_layer_norm", "self_attn.q_proj", False), ("final_layer_norm", "fc1", True)),
    "LlamaDecoderLayer": (("input_layernorm", "self_attn.q_proj", False),
                          ("post_attention_layernorm", "mlp.gate_proj", False)),
}


# RMS norms computing weight * x / sqrt(mean(x^2) + eps) (transformers' Llama, Mistral, Qwen2; not Gemma's,
# which scales by 1 + weight).
def _norm_of(module: nn.Module, width: int) -> tuple[str, float, torch.Tensor | None, torch.Tensor | None] | None:
    return norm_of(module, width)


class NormLinear(nn.Linear):
    """``linear(norm(x))`` with the norm's elementwise affine folded into the linear layer: weight[:, k] *
    scale[k] and bias + weight @ shift, in float32 before the cast. Its forward normalizes x's rows without
    affine (``folded_norm``: "layer" -- mean and variance -- or "rms", mean square; ``norm_eps``) through
    ``torch.ops.gpuopt.decode_linear``, which gpuopt's decode kernels do from the loads of their matmul;
    :class:`gpuopt.llm.linear.DecodeLinear` and ``gpuopt.quant.Int8WeightOnlyLinear`` built from it keep
    the norm. It is the step between :func:`fold_norms` and that swap, not a fast path: its forward takes
    the weight's row sums at every call (the swapped modules keep them)."""

    def __init__(self, linear: nn.Linear, kind: str, eps: float, scale: torch.Tensor | None,
                 shift: torch.Tensor | None):
        w = linear.weight
        has_bias = linear.bias is not None or shift is not None
        # on the meta device first: nn.Linear's random initialization is not needed
        super().__init__(linear.in_features, linear.out_features, bias=has_bias, device="meta", dtype=w.dtype)
        with torch.no_grad():
            w32 = w.float()
            self.weight = nn.Parameter((w32 * scale.float() if scale is not None else w32).to(w.dtype),
                                       requires_grad=False)
            if has_bias:
                b = linear.bias.float() if linear.bias is not None else torch.zeros(w.shape[0], device=w.device)
                self.bias = nn.Parameter((b + w32 @ shift.float() if shift is not None else b).to(w.dtype),
                                         requires_grad=False)
        self.folded_norm, self.norm_eps = kind, eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.gpuopt.decode_linear(x, self.weight, self.bias, "none", None, self.folded_norm,
                                              norm_row_sums(self.weight) if self.folded_norm == "layer" else None,
                                              self.norm_eps)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", folded_norm={self.folded_norm}, eps={self.norm_eps}"


def fold_norms(model: nn.Module, layers: dict[str, tuple[tuple[str, str, bool], ...]] = NORM_FOLDS) -> int:
    """Folds, in place, each norm of :data:`NORM_FOLDS` into the linear layer reading its output (a
    :class:`FusedProjections`'s, so after :func:`fuse_projections`; or a plain one where allowed): the
    linear layer becomes a :class:`NormLinear`, the norm ``nn.Identity``. Returns how many were folded.
    Norms over another shape or of another class (:func:`_norm_of`) stay, and so do norms read by anything
    else (unfused q/k/v; OPT without ``do_layer_norm_before``)."""
    count = 0
    for module in list(model.modules()):
        folds = layers.get(type(module).__name__)
        if folds is None or getattr(module, "do_layer_norm_before", True) is False:
            continue
        for norm_name, reader_name, plain_ok in folds:
            norm = getattr(module, norm_name, None)
            try:
                reader = module.get_submodule(reader_name)
            except AttributeError:
                continue
            owner, attr = (reader, "linear") if isinstance(reader, FusedProjections) else (None, None)
            if owner is None and plain_ok:
                parent_name, _, attr = reader_name.rpartition(".")
                owner = module.get_submodule(parent_name) if parent_name else module
            linear = getattr(owner, attr, None) if owner is not None else None
            if type(linear) is not nn.Linear or norm is None:
                continue
            found = _norm_of(norm, linear.in_features)
            if found is None:
                continue
            setattr(owner, attr, NormLinear(linear, *found))
            setattr(module, norm_name, nn.Identity())
            count += 1
    return count


__all__ = ["GROUPS", "NORM_FOLDS", "RMS_NORMS", "SCALED_QUERY_LAYERS", "FusedProjections", "NormLinear", "ProjectionPart",
           "fold_norms", "fuse_projections", "norm_row_sums"]
