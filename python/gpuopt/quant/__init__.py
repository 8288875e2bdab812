"""Quantized linear layers on gpuopt's operators: fp8 and dynamic int8 (activations quantized per row by
``torch.ops.gpuopt.quantize_rowwise``, then ``torch._scaled_mm`` / ``torch._int_mm``), and int8 weight-only
(``torch.ops.gpuopt.int8_weight_only_linear``, the LLM decode kernel). The ``fp8``, ``int8`` and ``int8-wo``
precisions of :class:`gpuopt.Config` put them into a model (:func:`quantize_linears`).

Layer: above ``timing``/``_ext`` and below ``prepare``."""

from .linear import (
    QUANTIZED_PRECISIONS,
    Fp8Linear,
    Int8Linear,
    QuantizedSelfAttention,
    QuantizeReport,
    fp8_refusal,
    is_quantized,
    quantize_linears,
)
from .weight_only import Int8WeightOnlyLinear, is_quantized_linear, quantize_int8_weight_only

__all__ = ["QUANTIZED_PRECISIONS", "Fp8Linear", "Int8Linear", "Int8WeightOnlyLinear", "QuantizeReport",
           "QuantizedSelfAttention", "fp8_refusal", "is_quantized", "is_quantized_linear", "quantize_int8_weight_only",
           "quantize_linears"]
