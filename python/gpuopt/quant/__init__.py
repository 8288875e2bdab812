"""Quantized precisions: int8 weight-only linear layers (gpuopt's CUDA kernel for the small batches of
LLM decoding, torch.ops.gpuopt.int8_weight_only_linear). INT8/FP8 activations and exported backends
(ONNX Runtime, TensorRT) come here next."""

from .weight_only import Int8WeightOnlyLinear, is_quantized_linear, quantize_int8_weight_only

__all__ = ["Int8WeightOnlyLinear", "is_quantized_linear", "quantize_int8_weight_only"]
