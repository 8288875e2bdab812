"""Causal language models to measure: Hugging Face architectures built from their configs with random
weights (nothing is downloaded), and the facts about them the decode measurement needs -- maximum
positions, KV-cache bytes per token, bytes a decode step must read, FLOPs of a prefill."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from .._checks import check_int

# name -> (transformers config class name, its arguments, what it is)
_SPECS: dict[str, tuple[str, dict[str, Any], str]] = {
    "opt-125m": ("OPTConfig", dict(hidden_size=768, num_hidden_layers=12, ffn_dim=3072, num_attention_heads=12,
                                   vocab_size=50272, max_position_embeddings=2048, word_embed_proj_dim=768),
                 "facebook/opt-125m's architecture"),
    "opt-1.3b": ("OPTConfig", dict(hidden_size=2048, num_hidden_layers=24, ffn_dim=8192, num_attention_heads=32,
                                   vocab_size=50272, max_position_embeddings=2048, word_embed_proj_dim=2048),
                 "facebook/opt-1.3b's architecture"),
    "gpt2": ("GPT2Config", dict(n_embd=768, n_layer=12, n_head=12, vocab_size=50257, n_positions=1024),
             "gpt2 (124M)"),
    # Llama 3.2 1B's shape: 16 layers, grouped-query attention (32 query / 8 KV heads), tied embeddings.
    "llama-1b": ("LlamaConfig", dict(hidden_size=2048, num_hidden_layers=16, intermediate_size=8192,
                                     num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
                                     max_position_embeddings=131072, rope_theta=500000.0, tie_word_embeddings=True,
                                     rms_norm_eps=1e-5),
                 "a Llama-architecture model of 1.24B parameters (Llama 3.2 1B's shape)"),
    # Small models of the same architectures, for smoke tests and CPU runs.
    "tiny-opt": ("OPTConfig", dict(hidden_size=64, num_hidden_layers=2, ffn_dim=128, num_attention_heads=4,
                                   vocab_size=512, max_position_embeddings=256, word_embed_proj_dim=64),
                 "a 2-layer OPT for smoke tests"),
    "tiny-gpt2": ("GPT2Config", dict(n_embd=64, n_layer=2, n_head=4, vocab_size=512, n_positions=256),
                  "a 2-layer GPT-2 for smoke tests"),
    "tiny-llama": ("LlamaConfig", dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                                       num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                                       max_position_embeddings=256, tie_word_embeddings=True),
                   "a 2-layer Llama with grouped-query attention for smoke tests"),
}

LLM_MODELS: tuple[str, ...] = tuple(_SPECS)


def describe_models() -> dict[str, str]:
    """Each built-in model name with what it is."""
    return {name: spec[2] for name, spec in _SPECS.items()}


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:
        raise ImportError("gpuopt's LLM measurements build models with Hugging Face transformers, which is not "
                          "installed: pip install transformers (or gpuopt[models])") from exc
    return transformers


def model_config(name: str) -> Any:
    """The transformers config of a built-in model (ValueError listing the names for an unknown one)."""
    if not isinstance(name, str):
        raise TypeError(f"model must be a model name (str) or a causal LM module, got {type(name).__name__}")
    if name not in _SPECS:
        raise ValueError(f"unknown model {name!r}; built-in causal LMs: {', '.join(LLM_MODELS)} "
                         "(or pass a Hugging Face causal LM module)")
    cls_name, kwargs, _ = _SPECS[name]
    cfg = getattr(_transformers(), cls_name)(**kwargs)
    # Random weights emit random tokens: no end-of-sequence may cut a generation short, and padding is
    # never needed (every prompt of a batch has the same length).
    cfg.eos_token_id = None
    cfg.pad_token_id = 0
    return cfg


def build_model(name: str, *, device: torch.device | str = "cpu", seed: int = 0) -> torch.nn.Module:
    """A built-in causal LM with random weights (transformers' own initialisation, seeded), in fp32 and
    eval mode, built directly on ``device``.

    >>> m = build_model("tiny-llama")
    >>> type(m).__name__
    'LlamaForCausalLM'
    """
    cfg = model_config(name)
    transformers = _transformers()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if torch.device(device).type == "cuda":
            torch.cuda.manual_seed_all(seed)
        with torch.device(device):
            model = transformers.AutoModelForCausalLM.from_config(cfg)
    prepare_for_decoding(model)
    return model.eval()


def prepare_for_decoding(model: torch.nn.Module) -> None:
    """Greedy decoding of exactly the asked number of tokens: no end-of-sequence token stops it early."""
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        gen.eos_token_id = None
        gen.pad_token_id = 0 if gen.pad_token_id is None else gen.pad_token_id
        gen.do_sample = False


def check_causal_lm(model: Any, parameter: str = "model") -> torch.nn.Module:
    """``model`` itself if it is a Hugging Face causal LM (a module with ``generate`` and a config with a
    vocabulary), else TypeError naming ``parameter`` and saying what is allowed."""
    ok = (isinstance(model, torch.nn.Module) and callable(getattr(model, "generate", None))
          and getattr(getattr(model, "config", None), "vocab_size", None) is not None)
    if not ok:
        raise TypeError(f"{parameter} must be a Hugging Face causal LM (a module with generate() and a config, e.g. "
                        f"transformers.AutoModelForCausalLM.from_config(...)) or one of {', '.join(LLM_MODELS)}; "
                        f"got {type(model).__name__}")
    return model


def model_name(model: str | torch.nn.Module) -> str:
    """How results name a model: a built-in name as given, a module by its config's ``name_or_path``,
    else its class name."""
    if isinstance(model, str):
        return model
    return getattr(getattr(model, "config", None), "name_or_path", None) or type(model).__name__


def max_positions(config: Any) -> int | None:
    """The most positions (prompt + generated tokens) the model can attend to, or None if unbounded."""
    for attr in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        v = getattr(config, attr, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


@dataclass(frozen=True)
class Shape:
    """What the measurement needs to know of a model's shape."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @classmethod
    def of(cls, config: Any) -> Shape:
        get = lambda *names: next((getattr(config, n) for n in names if getattr(config, n, None)), None)  # noqa: E731
        layers = get("num_hidden_layers", "n_layer", "num_layers")
        hidden = get("hidden_size", "n_embd", "d_model")
        heads = get("num_attention_heads", "n_head")
        if not (layers and hidden and heads):
            raise ValueError(f"cannot read the layer count, hidden size and heads of {type(config).__name__}")
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or hidden // heads
        return cls(layers, hidden, heads, kv_heads, head_dim, config.vocab_size)

    def kv_bytes_per_token(self, element_size: int) -> int:
        """Bytes of keys and values one token adds to the cache, across layers (one sequence)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * element_size


def _storage_key(t: torch.Tensor) -> tuple:
    return (t.device, t.untyped_storage().data_ptr())


def decode_weight_bytes(model: torch.nn.Module, batch_size: int) -> int:
    """Bytes of weights one decode step must read: every parameter (and quantized weight buffer) once,
    shared tensors once, except embedding tables that only a lookup uses (input or position
    embeddings not tied to an output layer), of which a step reads ``batch_size`` rows."""
    from ..quant import is_quantized_linear

    lookups: dict[tuple, torch.Tensor] = {}
    matmul: set[tuple] = set()
    tensors: dict[tuple, torch.Tensor] = {}
    for module in model.modules():
        own = list(module.parameters(recurse=False))
        if is_quantized_linear(module):
            own += list(module.buffers(recurse=False))
        for t in own:
            tensors.setdefault(_storage_key(t), t)
        if isinstance(module, torch.nn.Embedding):
            lookups[_storage_key(module.weight)] = module.weight
        else:
            matmul.update(_storage_key(t) for t in own)
    total = 0
    for key, t in tensors.items():
        if key in lookups and key not in matmul:
            row = t.shape[-1] * t.element_size()
            total += min(batch_size, t.shape[0]) * row
        else:
            total += t.untyped_storage().nbytes()
    return total


def linear_params(model: torch.nn.Module) -> int:
    """Weights that multiply activations (everything but lookup tables, norms and biases): 2 x this many
    FLOPs per token of a forward pass, attention aside."""
    from ..quant import is_quantized_linear
    from .linear import DecodeLinear

    conv1d = _conv1d_class()
    n = 0
    seen: set[tuple] = set()
    for module in model.modules():
        w = None
        if (isinstance(module, (torch.nn.Linear, DecodeLinear)) or (conv1d is not None and isinstance(module, conv1d))
                or is_quantized_linear(module)):
            w = module.weight
        if w is not None and _storage_key(w) not in seen:
            seen.add(_storage_key(w))
            n += w.numel()
    return n


def _conv1d_class() -> type | None:
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:
        return None
    return Conv1D


def prefill_flops(model: torch.nn.Module, shape: Shape, batch_size: int, prompt_len: int,
                  logits_rows: int = 1) -> float:
    """FLOPs of a prefill: the linear layers on every prompt token (the output layer on ``logits_rows``
    of them per sequence) and causal attention (QK^T and AV over the keys up to each position)."""
    out_layer = shape.vocab * shape.hidden
    body = max(linear_params(model) - out_layer, 0)
    tokens = batch_size * prompt_len
    attention = 2 * 2 * shape.layers * shape.heads * shape.head_dim * batch_size * prompt_len * (prompt_len + 1) / 2
    return 2.0 * body * tokens + 2.0 * out_layer * batch_size * logits_rows + attention


def check_lengths(config: Any, prompt_len: int, new_tokens: int, model_name: str) -> None:
    """ValueError when the prompt and the generated tokens do not fit the model's positions."""
    check_int("prompt_len", prompt_len)
    check_int("new_tokens", new_tokens)
    limit = max_positions(config)
    if limit is not None and prompt_len + new_tokens > limit:
        raise ValueError(f"prompt_len + new_tokens = {prompt_len} + {new_tokens} = {prompt_len + new_tokens} exceeds "
                         f"{model_name}'s maximum positions ({limit})")


def human_bytes(n: float) -> str:
    if not math.isfinite(n):
        return str(n)
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"

