"""LLM inference: prefill and decode of causal language models measured the way vLLM's and gpt-fast's
benchmarks do (TTFT, TPOT, inter-token latency, tokens/s, KV-cache bytes, share of the memory
bandwidth), against the fp32 reference's greedy tokens, with a fast decode path: a static KV cache,
the step captured as a CUDA graph and the token loop driven from C++."""

from .api import decode_sweep
from .measure import MEASURE_DEFAULTS, PRECISIONS, DecodeResult, Models, measure_decode
from .models import LLM_MODELS, build_model, describe_models
from .parity import LOGITS_RTOL, DecodeParity
from .paths import PATHS, Decoder

__all__ = ["LLM_MODELS", "LOGITS_RTOL", "MEASURE_DEFAULTS", "PATHS", "PRECISIONS", "DecodeParity", "DecodeResult",
           "Decoder", "Models", "build_model", "decode_sweep", "describe_models", "measure_decode"]
