"""Signal in a model's output: which output tensors carry any (not all zeros, not constant), and a
seeded re-initialisation of zero-initialised layers (ViT-B/16's classifier head) so that a model with
random weights gives outputs that parity can compare on every backend."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from .._ext import _C
from ..timing.inputs import split_inputs
from .config import Config


def output_tensors(obj: Any, path: str = "") -> list[tuple[str, torch.Tensor]]:
    """(path, tensor) of every tensor in an output structure: tensors, tuples/lists, dicts and
    Hugging Face ModelOutput. The path says where it sits, e.g. ``logits`` or ``[0]``."""
    if isinstance(obj, torch.Tensor):
        return [(path or "output", obj)]
    if hasattr(obj, "to_tuple") and hasattr(obj, "keys"):  # transformers ModelOutput
        obj = dict(obj.items())
    if isinstance(obj, dict):
        out = []
        for k, v in obj.items():
            out += output_tensors(v, f"{path}.{k}" if path else str(k))
        return out
    if isinstance(obj, (list, tuple)):
        out = []
        for i, v in enumerate(obj):
            out += output_tensors(v, f"{path}[{i}]")
        return out
    return []


def is_degenerate(t: torch.Tensor) -> bool:
    """True when ``t`` carries no signal: empty, all zeros, or (more than one element) constant."""
    if t.numel() == 0:
        return True
    r = t.detach().float()
    return bool(torch.all(r == 0)) or (t.numel() > 1 and bool(r.max() == r.min()))


def zero_weights(model: torch.nn.Module) -> list[str]:
    """Names of the model's ``weight`` parameters that are all zeros (zero-initialised layers)."""
    return [name for name, p in model.named_parameters()
            if name.rsplit(".", 1)[-1] == "weight" and p.numel() > 0 and not bool(p.detach().any())]


@dataclass
class SignalFix:
    """What :func:`with_signal` returns: the model to use, what was done (``notes``), and the
    parameters that were re-initialised (empty when the model came back unchanged)."""

    model: torch.nn.Module
    notes: list[str] = field(default_factory=list)
    reinitialised: list[str] = field(default_factory=list)


def _degenerate_outputs(model: torch.nn.Module, example_inputs: Any, device: torch.device) -> list[str]:
    """Paths of the outputs without signal: one fp32 forward of an eval-mode copy on ``device``."""
    m = copy.deepcopy(model).eval().to(device)
    (args, kwargs), _ = _C.convert_nested(split_inputs(example_inputs), device, None, False)
    with Config("fp32").guard(device.type):
        out = m(*args, **kwargs)
    return [path for path, t in output_tensors(out) if is_degenerate(t)]


def _reinitialise(model: torch.nn.Module, names: list[str], seed: int) -> None:
    # normal(0, 1/sqrt(fan_in)) keeps the output's scale that of the features entering the layer;
    # a 1-D weight (a norm layer's scale) gets ones, the identity scale.
    gen = torch.Generator().manual_seed(seed)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name in names:
            p = params[name]
            if p.dim() >= 2:
                fan_in = p[0].numel()
                value = torch.randn(p.shape, generator=gen, dtype=torch.float32) / math.sqrt(fan_in)
            else:
                value = torch.ones(p.shape)
            p.copy_(value)


def with_signal(model: torch.nn.Module, example_inputs: Any, *, device: str | torch.device | None = None,
                seed: int = 0) -> SignalFix:
    """``model``, or a copy of it whose zero-initialised layers are re-initialised, so that its fp32
    output on ``example_inputs`` carries signal.

    A model with random weights can give an output that is all zeros or constant for every input
    (torchvision's ViT-B/16 starts its classifier head at zero); comparing such an output says nothing
    about the backend that produced it. When an fp32 output on ``device`` is degenerate, a deep copy
    gets every all-zero ``weight`` re-initialised (seeded with ``seed``: normal with std
    1/sqrt(fan_in), ones for a 1-D scale; biases kept) and is checked again. The caller's model is
    never modified; a model with nothing to fix comes back as the same object with no notes.
    ``gpuopt.benchmark`` and ``gpuopt sweep`` do this before preparing the reference and every config.

    >>> import torch
    >>> m = torch.nn.Linear(8, 4)
    >>> torch.nn.init.zeros_(m.weight), torch.nn.init.zeros_(m.bias)  # doctest: +ELLIPSIS
    (...)
    >>> fix = with_signal(m, torch.randn(2, 8), device="cpu")
    >>> fix.reinitialised, fix.model is m
    (['weight'], False)
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {seed!r}")
    dev = torch.device(device) if device is not None else torch.device(
        "cuda" if torch.cuda.is_available() else "cpu")
    degenerate = _degenerate_outputs(model, example_inputs, dev)
    if not degenerate:
        return SignalFix(model)
    what = ", ".join(repr(p) for p in degenerate)
    zeros = zero_weights(model)
    if not zeros:
        return SignalFix(model, [f"fp32 output {what} carries no signal (all zeros or constant) and no layer has "
                                 "all-zero weights to re-initialise; parity cannot compare it"])
    fixed = copy.deepcopy(model)
    _reinitialise(fixed, zeros, seed)
    notes = [f"fp32 output {what} carried no signal (all zeros or constant): re-initialised the all-zero "
             f"{', '.join(zeros)} (seed {seed}: normal with std 1/sqrt(fan_in), ones for a 1-D scale) so that "
             "every backend's real output is compared"]
    still = _degenerate_outputs(fixed, example_inputs, dev)
    if still:
        notes.append(f"fp32 output {', '.join(repr(p) for p in still)} still carries no signal after the "
                     "re-initialisation; parity cannot compare it")
    return SignalFix(fixed, notes, zeros)
