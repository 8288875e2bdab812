"""Models by name, with random weights (nothing is downloaded at run time), and inputs for them.

torchvision models (resnet18, resnet50, vit_b_16, efficientnet_b0, mobilenet_v3_large), Hugging Face
models built from their configs (bert-base, opt-125m, opt-1.3b; needs transformers), and tiny models
for CPU runs. Any ``nn.Module`` can be benchmarked directly instead.

Pretrained weights, when asked for by name, come through the libraries' own loaders and caches:
``hf:<model id or local folder>`` (``transformers.AutoModel.from_pretrained``; a local folder saved
with ``save_pretrained`` also works without the prefix) and ``<torchvision model>:<weights>``
(``torchvision.models.get_model``, e.g. ``resnet50:IMAGENET1K_V2`` or ``resnet50:DEFAULT``). They are
downloaded once into the Hugging Face or torch hub cache; offline, what is cached loads.

Random weights alone can give outputs that fp16 cannot hold or no signal at all. efficientnet_b0's
and mobilenet_v3_large's outputs are about 1e-14 and 1e-10 (BatchNorm's default statistics, mean 0
and variance 1, do not match their activations, which shrink layer by layer), so fp16 gives zeros:
their BatchNorm statistics are calibrated on random inputs of their own. vit_b_16's classifier head
starts at zero (an all-zero output): it is re-initialised, seeded. The other models keep their
default statistics: calibrated, ResNet-50's low-precision errors grow past the parity tolerance
(measured on an H100: fp16-amp 2.8e-2 instead of 6.9e-4), while its outputs are already of
ordinary magnitude.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..prepare.signal import with_signal, zero_weights
from ..timing.inputs import split_inputs

# Calibration: a few small seeded batches (cheap on a CPU), statistics averaged over all of them.
CALIBRATION_BATCHES = 2
CALIBRATION_BATCH_SIZE = 2
SEED = 0


class TinyCNN(torch.nn.Module):
    """A small CNN for CPU runs and tests (3x32x32 images, 10 classes)."""

    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.BatchNorm2d(64), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        )
        self.head = torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.head(self.features(x))


class TinyTransformer(torch.nn.Module):
    """A two-layer encoder over token ids (sequence 32, width 64) for CPU runs and tests."""

    def __init__(self, vocab: int = 1000, width: int = 64):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        layer = torch.nn.TransformerEncoderLayer(width, 4, 2 * width, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, input_ids):
        return self.head(self.encoder(self.embed(input_ids)))


@dataclass(frozen=True)
class ModelSpec:
    name: str
    build: Callable[[], torch.nn.Module]
    # batch size -> inputs (CPU tensors), Config.apply convention; None: from the built model's config
    make_inputs: Callable[[int], Any] | None
    items: str = "images"  # what one batch element is, for throughput units
    needs: str | None = None  # optional package
    calibrate: bool = False  # BatchNorm statistics from random inputs (default ones make outputs vanish)
    pretrained: bool = False  # trained weights: kept as they are (no calibration, no re-initialisation)


def _torchvision(name: str) -> Callable[[], torch.nn.Module]:
    def build():
        try:
            import torchvision
        except ImportError as exc:
            raise ImportError(f"model {name!r} needs torchvision: pip install torchvision") from exc
        return getattr(torchvision.models, name)(weights=None)

    return build


def _images(shape: tuple[int, ...]) -> Callable[[int], torch.Tensor]:
    return lambda batch: torch.randn(batch, *shape)


def _hf(kind: str, **config: Any) -> Callable[[], torch.nn.Module]:
    def build():
        try:
            import transformers
        except ImportError as exc:
            raise ImportError("this model needs transformers: pip install transformers") from exc
        if kind == "bert":
            return transformers.BertModel(transformers.BertConfig(**config))
        # One forward pass is timed: no key/value cache is built (TorchScript cannot return one).
        return transformers.OPTForCausalLM(transformers.OPTConfig(use_cache=False, **config))

    return build


def _tokens(vocab: int, seq: int, mask: bool) -> Callable[[int], dict[str, torch.Tensor]]:
    def make(batch: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, vocab, (batch, seq))
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)} if mask else {"input_ids": ids}

    return make


_SPECS = [
    ModelSpec("resnet18", _torchvision("resnet18"), _images((3, 224, 224)), needs="torchvision"),
    ModelSpec("resnet50", _torchvision("resnet50"), _images((3, 224, 224)), needs="torchvision"),
    ModelSpec("vit_b_16", _torchvision("vit_b_16"), _images((3, 224, 224)), needs="torchvision"),
    ModelSpec("efficientnet_b0", _torchvision("efficientnet_b0"), _images((3, 224, 224)), needs="torchvision",
              calibrate=True),
    ModelSpec("mobilenet_v3_large", _torchvision("mobilenet_v3_large"), _images((3, 224, 224)), needs="torchvision",
              calibrate=True),
    ModelSpec("bert-base", _hf("bert"), _tokens(30522, 128, True), items="sequences", needs="transformers"),
    ModelSpec("opt-125m", _hf("opt", hidden_size=768, num_hidden_layers=12, ffn_dim=3072, num_attention_heads=12,
                              word_embed_proj_dim=768), _tokens(50272, 128, True), items="sequences",
              needs="transformers"),
    ModelSpec("opt-1.3b", _hf("opt", hidden_size=2048, num_hidden_layers=24, ffn_dim=8192, num_attention_heads=32,
                              word_embed_proj_dim=2048), _tokens(50272, 128, True), items="sequences",
              needs="transformers"),
    ModelSpec("tiny-cnn", TinyCNN, _images((3, 32, 32))),
    ModelSpec("tiny-transformer", TinyTransformer, _tokens(1000, 32, False), items="sequences"),
]
MODELS: dict[str, ModelSpec] = {s.name: s for s in _SPECS}


# The longest sequence a Hugging Face model is benchmarked at (shorter when its positions end sooner).
HF_SEQUENCE = 128


def names() -> list[str]:
    return list(MODELS)


def _pretrained_hf(source: str) -> ModelSpec:
    def build() -> torch.nn.Module:
        try:
            import transformers
        except ImportError as exc:
            raise ImportError(f"model 'hf:{source}' needs transformers: pip install transformers") from exc
        try:
            model = transformers.AutoModel.from_pretrained(source)
        except (OSError, ValueError) as exc:
            raise ValueError(
                f"cannot load Hugging Face model {source!r}: {str(exc).splitlines()[0] if str(exc) else exc!r}. "
                "Check the id (or the folder, saved with save_pretrained); offline, only a model downloaded "
                "before (in the Hugging Face cache) loads; or benchmark a zoo name for random weights") from exc
        if hasattr(model.config, "use_cache"):
            model.config.use_cache = False  # one forward pass is timed; TorchScript cannot return a cache
        return model

    return ModelSpec(f"hf:{source}", build, None, items="sequences", needs="transformers", pretrained=True)


def hf_inputs(config: Any, seq: int = HF_SEQUENCE) -> Callable[[int], dict[str, torch.Tensor]]:
    """Token inputs for a Hugging Face model from its config: ids below ``vocab_size``, a sequence no
    longer than its position embeddings, an all-ones attention mask, as keyword inputs."""
    vocab = getattr(config, "vocab_size", None)
    if not isinstance(vocab, int) or vocab <= 0:
        raise ValueError(f"the Hugging Face config of {type(config).__name__} has no vocab_size: gpuopt makes "
                         "token inputs only; give inputs= or input_fn= for this model")
    positions = next((p for p in (getattr(config, k, None) for k in ("max_position_embeddings", "n_positions"))
                      if isinstance(p, int) and p > 0), seq)
    return _tokens(vocab, min(seq, positions), True)


def _pretrained_torchvision(model: str, weights_name: str) -> ModelSpec:
    try:
        import torchvision
    except ImportError as exc:
        raise ImportError(f"model '{model}:{weights_name}' needs torchvision: pip install torchvision") from exc
    try:
        enum = torchvision.models.get_model_weights(model)
    except ValueError as exc:
        close = difflib.get_close_matches(model, torchvision.models.list_models(), n=3, cutoff=0.6)
        hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
        raise ValueError(f"unknown torchvision model {model!r} in '{model}:{weights_name}'{hint}; the names are "
                         "torchvision.models.list_models()") from exc
    allowed = [*enum.__members__]
    if weights_name not in allowed:
        raise ValueError(f"unknown weights {weights_name!r} for torchvision model {model!r}; allowed: "
                         f"{', '.join(allowed)}")
    weights = enum[weights_name]
    side = (getattr(weights.transforms(), "crop_size", None) or [224])[0]

    def build() -> torch.nn.Module:
        try:
            return torchvision.models.get_model(model, weights=weights)
        except OSError as exc:  # urllib's URLError and the hub's download errors
            raise ValueError(
                f"cannot load torchvision weights {model}:{weights.name} ({exc}); they download once into "
                f"{torch.hub.get_dir()}/checkpoints: connect to the network once, or benchmark {model!r} "
                "for random weights") from exc

    return ModelSpec(f"{model}:{weights_name}", build, _images((3, side, side)), needs="torchvision",
                     pretrained=True)


def spec(name: str) -> ModelSpec:
    """The zoo entry for ``name``, or a pretrained model (``hf:<id or folder>``, a folder saved with
    ``save_pretrained``, ``<torchvision model>:<weights>``; the weights name is checked here, nothing
    loads until ``build``); ValueError with close matches for an unknown name."""
    if not isinstance(name, str):
        raise TypeError(f"model name must be a string, got {type(name).__name__}")
    if name in MODELS:
        return MODELS[name]
    if name.startswith("hf:") and len(name) > 3:
        return _pretrained_hf(name[3:])
    if (Path(name) / "config.json").is_file():
        return _pretrained_hf(name)
    if ":" in name and not name.startswith("hf:"):
        return _pretrained_torchvision(*name.split(":", 1))
    close = difflib.get_close_matches(name, MODELS, n=3, cutoff=0.5)
    hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
    raise ValueError(f"unknown model {name!r}{hint}; known models: {', '.join(MODELS)}; pretrained weights: "
                     "hf:<Hugging Face id or folder>, <torchvision model>:<weights> (e.g. resnet50:IMAGENET1K_V2)")


def calibrate_batchnorm(model: torch.nn.Module, make_inputs: Callable[[int], Any], *,
                        batches: int = CALIBRATION_BATCHES, batch_size: int = CALIBRATION_BATCH_SIZE,
                        seed: int = SEED) -> int:
    """Set the running statistics of ``model``'s BatchNorm layers to those of its activations on
    ``batches`` seeded random batches from ``make_inputs`` (an equal-weight average: momentum None),
    instead of the default mean 0 and variance 1. Only the BatchNorm layers run in train mode
    (dropout stays off); the model is left in eval mode and the global RNG as it was. Returns the
    number of BatchNorm layers calibrated.

    >>> model, make_inputs = TinyCNN(), spec("tiny-cnn").make_inputs
    >>> calibrate_batchnorm(model, make_inputs)
    2
    """
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
             and m.track_running_stats]
    model.eval()
    if not norms:
        return 0
    momenta = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None
        m.train()
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(seed)
            for _ in range(batches):
                args, kwargs = split_inputs(make_inputs(batch_size))
                model(*args, **kwargs)
    finally:
        for m, momentum in zip(norms, momenta):
            m.momentum = momentum
        model.eval()
    return len(norms)


def get(name: str) -> tuple[torch.nn.Module, Callable[[int], Any]]:
    """(model, batch size -> inputs) for a zoo name, in eval mode. Random weights have outputs of
    ordinary magnitude: BatchNorm statistics calibrated where the default ones make them vanish, and
    zero-initialised layers re-initialised (seeded). Pretrained weights (see :func:`spec`) are kept.

    >>> model, make_inputs = get("tiny-cnn")
    >>> tuple(model(make_inputs(2)).shape)
    (2, 10)
    """
    s = spec(name)
    model = s.build().eval()
    if s.pretrained:
        return model, s.make_inputs or hf_inputs(model.config)
    if s.calibrate:
        calibrate_batchnorm(model, s.make_inputs)
    if zero_weights(model):  # only then can the output lack signal: skip a CPU forward otherwise
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(SEED)
            example = s.make_inputs(1)
        model = with_signal(model, example, device="cpu", seed=SEED).model
    return model.eval(), s.make_inputs
