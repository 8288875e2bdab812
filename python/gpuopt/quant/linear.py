"""Quantized linear layers for the ``fp8``, ``int8`` and ``int8-wo`` precisions, and the pass that puts
them into a model (:func:`quantize_linears`).

- ``fp8``: weights stored as float8 e4m3 with one scale per output channel; each call quantizes its
  activations per row with gpuopt's kernel (``torch.ops.gpuopt.quantize_rowwise``: the absmax and the
  cast in one pass) and multiplies on the FP8 tensor cores (``torch._scaled_mm``, row-wise scales,
  bf16 out). Compute capability 8.9 (Ada, Hopper) or newer on CUDA.
- ``int8``: dynamic int8: weights int8 per output channel, activations quantized per row at each
  call, int8 x int8 -> int32 (``torch._int_mm``), rescaled in fp32.
- ``int8-wo``: weight-only int8 (:class:`Int8WeightOnlyLinear`), activations stay 16-bit: for the
  memory-bound small batches.

``torch.nn.Linear`` layers are replaced, and ``torch.nn.MultiheadAttention`` modules by
:class:`QuantizedSelfAttention` (quantized projections around ``scaled_dot_product_attention``); layers
whose shapes the GEMM cannot take (fp8: both dimensions multiples of 16; int8: of 8) stay, with the
reason. Everything else runs in the config's 16-bit type.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .._ext import _C  # noqa: F401  (loads the gpuopt operators)
from ..timing.inputs import device_index
from .weight_only import Int8WeightOnlyLinear

QUANTIZED_PRECISIONS = ("int8-wo", "int8", "fp8")
_ALIGN = {"fp8": 16, "int8": 8, "int8-wo": 1}
_INT_MM_MIN_ROWS = 17  # torch._int_mm on CUDA takes more than 16 rows


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


_NORMS = ("none", "layer", "rms")
_ACTIVATIONS = ("none", "gelu", "gelu_tanh", "relu", "silu")


class _QuantizedInput(torch.nn.Module):
    """A linear layer that quantizes its input per row at each call, optionally through a prologue: the norm
    or activation that produced the input, folded into the quantization (:func:`set_prologue`;
    :mod:`gpuopt.quant.prologue` finds them)."""

    def _init_prologue(self) -> None:
        self.prologue_norm, self.prologue_eps, self.prologue_activation = "none", 1e-5, "none"
        self.register_buffer("prologue_weight", None)
        self.register_buffer("prologue_bias", None)
        self.shared_input: Any = None  # a SharedQuantization with the layers that read the same tensor

    @property
    def prologue_active(self) -> bool:
        return self.prologue_norm != "none" or self.prologue_activation != "none"

    def set_prologue(self, *, norm: str = "none", weight: torch.Tensor | None = None,
                     bias: torch.Tensor | None = None, eps: float = 1e-5, activation: str = "none") -> None:
        """From now on the layer computes ``linear(activation(norm(x)))``: ``norm`` "layer" or "rms" over
        the last dimension with ``eps`` and its elementwise ``weight`` and ``bias`` (kept in float32), then
        ``activation`` ("gelu", "gelu_tanh", "relu", "silu"), all inside the quantization of x."""
        if norm not in _NORMS:
            raise ValueError(f"norm must be one of {', '.join(_NORMS)}, got {norm!r}")
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {', '.join(_ACTIVATIONS)}, got {activation!r}")
        for name, t in (("weight", weight), ("bias", bias)):
            if t is not None and (not isinstance(t, torch.Tensor) or t.shape != (self.in_features,)):
                raise ValueError(f"{name} must be a tensor of shape ({self.in_features},) (in_features), got "
                                 f"{getattr(t, 'shape', t)!r}")
        if norm == "none" and (weight is not None or bias is not None):
            raise ValueError("weight and bias are the norm's elementwise affine: give norm='layer' or 'rms' with them")

        def kept(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.detach().to(self.weight.device, torch.float32).clone()

        self.prologue_norm, self.prologue_eps, self.prologue_activation = norm, float(eps), activation
        self.prologue_weight, self.prologue_bias = kept(weight), kept(bias)

    def _quantize(self, x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """x's rows quantized (through the prologue), or the quantization a sibling layer made of the same x
        (``shared_input``: :class:`gpuopt.quant.prologue.SharedQuantization`)."""
        if self.shared_input is not None:
            return self.shared_input.take(x, lambda: self._quantize_rows(x, dtype))
        return self._quantize_rows(x, dtype)

    def _quantize_rows(self, x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        rows = _rows(x)
        if not self.prologue_active:
            return torch.ops.gpuopt.quantize_rowwise(rows, dtype)
        return torch.ops.gpuopt.quantize_rowwise(rows, dtype, self.prologue_norm, self.prologue_weight,
                                                 self.prologue_bias, self.prologue_eps, self.prologue_activation)

    def extra_repr(self) -> str:
        text = f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
        if self.prologue_norm != "none":
            text += f", prologue_norm={self.prologue_norm}"
        if self.prologue_activation != "none":
            text += f", prologue_activation={self.prologue_activation}"
        return text


class Fp8Linear(_QuantizedInput):
    """``y = x @ W.T + b`` on FP8 tensor cores: ``weight`` float8 e4m3 [out, in] with per-output-channel
    ``scales`` [1, out] (float32); activations quantized per row at each call (through the prologue, if
    one is set)."""

    def __init__(self, weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.register_buffer("weight", weight)
        self.register_buffer("scales", scales)
        self.register_buffer("bias", bias)
        self._init_prologue()
        # The bias in the GEMM's epilogue where this torch's row-wise _scaled_mm takes one on this device
        # (no extra pass over the output), else added after it.
        self.fused_bias = bias is not None and _scaled_mm_takes_bias(weight.device)

    @classmethod
    def from_float(cls, lin: torch.nn.Linear) -> Fp8Linear:
        q, s = torch.ops.gpuopt.quantize_rowwise(lin.weight.detach(), torch.float8_e4m3fn)
        bias = lin.bias.detach().to(torch.bfloat16) if lin.bias is not None else None
        return cls(q, s.reshape(1, -1).contiguous(), bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qx, sx = self._quantize(x, torch.float8_e4m3fn)
        # On CUDA, Hopper's fast FP8 accumulation (partial sums kept in the tensor cores' own precision
        # between promotions), as torchao's float8 inference uses for the forward GEMM: 8-15% faster at
        # BERT-base and 4096-wide shapes on the H100; the parity gate checks what it costs.
        y = torch._scaled_mm(qx, self.weight.t(), scale_a=sx, scale_b=self.scales,
                             bias=self.bias if self.fused_bias else None, out_dtype=torch.bfloat16,
                             use_fast_accum=qx.is_cuda)
        if self.bias is not None and not self.fused_bias:
            y = y + self.bias
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


def _scaled_mm_takes_bias(device: torch.device) -> bool:
    """Whether row-wise scaled FP8 matmuls take a bf16 bias on ``device`` (asked once per device)."""
    return _rowwise_refusal(device.type, device_index(device), bias=True) is None


class Int8Linear(_QuantizedInput):
    """Dynamic int8 ``y = x @ W.T + b``: ``weight`` int8 [out, in] with per-output-channel ``scales``
    [1, out] (float32); activations quantized per row at each call (through the prologue, if one is set),
    int32 accumulation."""

    def __init__(self, weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.register_buffer("weight", weight)
        self.register_buffer("scales", scales)
        self.register_buffer("bias", bias)
        self._init_prologue()

    @classmethod
    def from_float(cls, lin: torch.nn.Linear) -> Int8Linear:
        q, s = torch.ops.gpuopt.quantize_rowwise(lin.weight.detach(), torch.int8)
        bias = lin.bias.detach().float() if lin.bias is not None else None
        return cls(q, s.reshape(1, -1).contiguous(), bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = _rows(x)
        rows = x2.shape[0]
        qx, sx = self._quantize(x, torch.int8)
        if x2.is_cuda and rows < _INT_MM_MIN_ROWS:  # zero rows past the real ones: torch._int_mm's minimum
            qx = torch.nn.functional.pad(qx, (0, 0, 0, _INT_MM_MIN_ROWS - rows))
        acc = torch._int_mm(qx, self.weight.t())[:rows]
        y = acc.float() * sx * self.scales
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


class QuantizedSelfAttention(torch.nn.Module):
    """A ``torch.nn.MultiheadAttention`` whose projections are quantized linear layers (its own reads
    its projection weights directly, so they cannot be swapped in place): the input projection as one
    quantized [3E, E] layer for self-attention (query, key and value the same tensor) or three, the
    attention through ``scaled_dot_product_attention``, the output projection quantized. Returns
    ``(output, None)``: attention weights (``need_weights=True``) are not computed."""

    def __init__(self, mha: torch.nn.MultiheadAttention, precision: str):
        super().__init__()
        if not mha._qkv_same_embed_dim or mha.bias_k is not None or mha.add_zero_attn:
            raise ValueError("only MultiheadAttention with one embedding size, no bias_k/bias_v and no "
                             "add_zero_attn is quantized")
        e = mha.embed_dim
        self.num_heads, self.embed_dim, self.batch_first = mha.num_heads, e, mha.batch_first
        w, b = mha.in_proj_weight.detach(), None if mha.in_proj_bias is None else mha.in_proj_bias.detach()
        proj = torch.nn.Linear(e, 3 * e, bias=b is not None, device=w.device, dtype=w.dtype)
        with torch.no_grad():
            proj.weight.copy_(w)
            if b is not None:
                proj.bias.copy_(b)
        self.in_proj = _quantized(proj, precision)
        self.out_proj = _quantized(mha.out_proj, precision)
        # What torch.nn.TransformerEncoder(Layer) reads before its fused fast path, which would use the
        # float weights: without an input-projection bias tensor it takes the ordinary path, this forward.
        self._qkv_same_embed_dim = True
        self.in_proj_bias = None
        self.in_proj_weight = None

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_padding_mask: torch.Tensor | None = None, need_weights: bool = True,
                attn_mask: torch.Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[torch.Tensor, None]:
        if need_weights:
            raise ValueError("a quantized MultiheadAttention does not compute attention weights: call it with "
                             "need_weights=False")
        same = query is key and key is value  # before the transposes make new tensors
        if not self.batch_first:  # [T, B, E] -> [B, T, E]
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        e, h = self.embed_dim, self.num_heads
        if same:
            q, k, v = self.in_proj(query).split(e, dim=-1)
        else:
            w_q, w_k, w_v = (self.in_proj(t)[..., i * e:(i + 1) * e] for i, t in enumerate((query, key, value)))
            q, k, v = w_q, w_k, w_v
        bsz, tq, tk = q.shape[0], q.shape[1], k.shape[1]
        q, k, v = (t.reshape(bsz, -1, h, e // h).transpose(1, 2) for t in (q, k, v))
        # MultiheadAttention's masks as one additive mask (bool: True = not attended; float: added), as
        # F.multi_head_attention_forward merges them; a causal hint without a padding mask goes to SDPA alone.
        if is_causal and key_padding_mask is None:
            mask, causal = None, True
        else:
            mask, causal = None, False
            if attn_mask is not None:
                m = attn_mask.view(bsz, h, tq, tk) if attn_mask.dim() == 3 else attn_mask
                mask = _additive(m, q.dtype)
            if key_padding_mask is not None:
                pad = _additive(key_padding_mask.view(bsz, 1, 1, tk), q.dtype)
                mask = pad if mask is None else mask + pad
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        out = self.out_proj(out.transpose(1, 2).reshape(bsz, tq, e))
        return (out if self.batch_first else out.transpose(0, 1)), None


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A MultiheadAttention mask as an additive one: bool True (not attended) -> -inf, float as given."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask, float("-inf"))
    return mask.to(dtype)


@dataclass
class QuantizeReport:
    """What :func:`quantize_linears` did: the layers it replaced and those it kept, with why."""

    precision: str
    quantized: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)  # layer name -> why it stays 16-bit

    def describe(self) -> str:
        total = len(self.quantized) + len(self.kept)
        text = f"{self.precision}: {len(self.quantized)} of {total} linear layers quantized"
        if self.kept:
            shown = "; ".join(f"{name} ({why})" for name, why in list(self.kept.items())[:4])
            more = f"; and {len(self.kept) - 4} more" if len(self.kept) > 4 else ""
            text += f"; kept in 16-bit: {shown}{more}"
        return text + "; convolutions and the other layers run in 16-bit"


def quantize_linears(model: torch.nn.Module, precision: str) -> QuantizeReport:
    """Replace ``model``'s linear layers in place by their ``precision`` form (one of
    :data:`QUANTIZED_PRECISIONS`) and say which. The model's float weights should already be in the
    16-bit type the rest runs in."""
    if precision not in QUANTIZED_PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(QUANTIZED_PRECISIONS)}, got {precision!r}")
    report = QuantizeReport(precision)
    align = _ALIGN[precision]
    replace: list[tuple[torch.nn.Module, str, torch.nn.Module]] = []
    for parent_name, parent in model.named_modules():
        for name, child in parent.named_children():
            full = f"{parent_name}.{name}" if parent_name else name
            if isinstance(child, torch.nn.MultiheadAttention):
                if child.embed_dim % align:
                    report.kept[full] = f"attention of width {child.embed_dim}: not a multiple of {align}"
                    continue
                try:
                    replace.append((parent, name, QuantizedSelfAttention(child, precision)))
                except ValueError as exc:
                    report.kept[full] = str(exc)
                    continue
                report.quantized += [f"{full}.in_proj", f"{full}.out_proj"]
                continue
            if not isinstance(child, torch.nn.Linear):
                continue
            if isinstance(parent, torch.nn.MultiheadAttention):
                continue  # its out_proj: quantized with it above, or kept with the reason
            if getattr(child, "folded_norm", "none") != "none":  # gpuopt.llm.fuse.NormLinear: x must be normalized
                report.kept[full] = f"a {child.folded_norm} norm folded in (gpuopt.llm.fuse.NormLinear)"
                continue
            if child.in_features % align or child.out_features % align:
                report.kept[full] = f"{child.in_features}x{child.out_features}: not multiples of {align}"
            else:
                replace.append((parent, name, _quantized(child, precision)))
                report.quantized.append(full)
    for parent, name, new in replace:
        setattr(parent, name, new)
    for m in model.modules():  # an encoder whose layers changed must not turn padded inputs into nested tensors
        if isinstance(m, torch.nn.TransformerEncoder) and any(
                isinstance(getattr(layer, "self_attn", None), QuantizedSelfAttention) for layer in m.layers):
            m.use_nested_tensor = False
    return report


def _quantized(lin: torch.nn.Linear, precision: str) -> torch.nn.Module:
    if precision == "fp8":
        return Fp8Linear.from_float(lin)
    if precision == "int8":
        return Int8Linear.from_float(lin)
    return Int8WeightOnlyLinear.from_float(lin)


def fp8_refusal(device: torch.device) -> str | None:
    """Why ``fp8`` cannot run on ``device`` (None when it can): on CUDA it needs compute capability 8.9
    (Ada) or newer and a torch whose row-wise scaled matmul (``torch._scaled_mm`` with per-row scales, what
    :class:`Fp8Linear` runs) runs there -- torch before 2.7 refuses it on Ada ("Rowwise scaling is not
    supported"); on the CPU, a torch whose ``_scaled_mm`` runs there. The matmul is tried once per device
    (:func:`_rowwise_refusal`)."""
    if device.type == "cuda":
        cc = torch.cuda.get_device_capability(device)
        name = torch.cuda.get_device_name(device)
        if cc < (8, 9):
            return (f"fp8 needs FP8 tensor cores (compute capability 8.9 or newer: Ada, Hopper); "
                    f"{name} has {cc[0]}.{cc[1]}")
        why = _rowwise_refusal("cuda", device_index(device))
        return (f"fp8 needs row-wise scaled FP8 matmuls (torch._scaled_mm with per-row scales), which torch "
                f"{torch.__version__} refuses on {name} ({why})") if why else None
    why = _rowwise_refusal("cpu", None)
    return f"fp8 on the CPU needs a torch whose _scaled_mm runs there ({why})" if why else None


# (device type, index, with a bias) -> what the row-wise probe raised, or None: only answers about this torch and
# device (no out-of-memory, no CUDA error left by earlier work, which say nothing about fp8 and may pass).
_ROWWISE: dict[tuple[str, int | None, bool], str | None] = {}
# A CUDA error's type (torch 2.8 on); before it, CUDA errors are RuntimeErrors known by their text.
_CUDA_ERROR: type[Exception] | None = getattr(torch, "AcceleratorError", None)


def _is_cuda_error(exc: Exception) -> bool:
    return isinstance(exc, _CUDA_ERROR) if _CUDA_ERROR is not None else "CUDA error" in str(exc)


def _rowwise_refusal(device_type: str, index: int | None, bias: bool = False) -> str | None:
    """What a 16 x 16 row-wise scaled FP8 matmul, called as :class:`Fp8Linear` calls it (with a bf16 bias in
    its epilogue where ``bias``), raises on the device ("Type: message"), None when it runs. Asked once per
    device (it launches work: :func:`fp8_refusal` runs before any CUDA graph capture, when a config is
    prepared). Out of memory and CUDA errors are raised."""
    key = (device_type, index, bias)
    if key in _ROWWISE:
        return _ROWWISE[key]
    device = torch.device(device_type, index) if index is not None else torch.device(device_type)
    try:
        a = torch.zeros(16, 16, device=device).to(torch.float8_e4m3fn)
        extra = {"bias": torch.zeros(16, device=device, dtype=torch.bfloat16)} if bias else {}
        torch._scaled_mm(a, a.t(), scale_a=torch.ones(16, 1, device=device), scale_b=torch.ones(1, 16, device=device),
                         out_dtype=torch.bfloat16, use_fast_accum=device.type == "cuda", **extra)
        why = None
    except torch.OutOfMemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever this torch says, it is the reason
        if _is_cuda_error(exc):
            raise
        why = f"{type(exc).__name__}: {exc}"
    _ROWWISE[key] = why
    return why


def is_quantized(module: Any) -> bool:
    return isinstance(module, (Fp8Linear, Int8Linear, Int8WeightOnlyLinear, QuantizedSelfAttention))


__all__ = ["QUANTIZED_PRECISIONS", "Fp8Linear", "Int8Linear", "QuantizeReport", "QuantizedSelfAttention", "fp8_refusal", "is_quantized",
           "quantize_linears"]
