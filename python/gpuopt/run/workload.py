"""What a benchmark runs, resolved and validated before anything is measured: the workload (a zoo name
or a module and how to make its inputs), configs, batch sizes, modes, device and measure options."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..prepare.config import (
    INFERENCE_ONLY_BACKENDS,
    INFERENCE_ONLY_PRECISIONS,
    Config,
    default_preset,
    preset,
    presets,
)
from ..timing.inputs import tensors_in
from ..timing.measurement import MODES, validate_measure_options
from . import zoo

BENCH_MODES = (*MODES, "end-to-end")
TRAIN_MODE = "train"


@dataclass
class Workload:
    """A model and how to make its inputs for a batch size."""

    name: str
    model: torch.nn.Module
    make_inputs: Callable[[int], Any] | None  # None: fixed inputs
    fixed_inputs: Any = None
    item_unit: str = "items"

    def inputs(self, batch: int) -> Any:
        return self.fixed_inputs if self.make_inputs is None else self.make_inputs(batch)


def batch_of(inputs: Any) -> int:
    for t in tensors_in(inputs):
        if t.dim() > 0:
            return int(t.shape[0])
    raise ValueError("inputs hold no tensor with a batch dimension")


def workload(model_or_name: torch.nn.Module | str, *, inputs: Any = None, input_shape: Sequence[int] | None = None,
             input_fn: Callable[[int], Any] | None = None) -> Workload:
    """Resolve what to benchmark: a zoo name or a module, and exactly one way to get inputs
    (zoo models bring theirs; ``inputs`` fixes them; ``input_shape`` is one item's shape, filled with
    random numbers per batch size; ``input_fn(batch_size)`` makes them)."""
    given = [k for k, v in (("inputs", inputs), ("input_shape", input_shape), ("input_fn", input_fn)) if v is not None]
    if len(given) > 1:
        raise ValueError(f"give at most one of inputs, input_shape, input_fn; got {', '.join(given)}")
    if isinstance(model_or_name, str):
        spec = zoo.spec(model_or_name)
        model, make = zoo.get(model_or_name)
        name, unit = model_or_name, spec.items
    elif isinstance(model_or_name, torch.nn.Module):
        model, make, name, unit = model_or_name, None, type(model_or_name).__name__, "items"
    else:
        raise TypeError(f"model must be a zoo name (see gpuopt.zoo.names()) or a torch.nn.Module, "
                        f"got {type(model_or_name).__name__}")
    if input_shape is not None:
        shape = check_input_shape(input_shape)
        make = lambda batch: torch.randn(batch, *shape)  # noqa: E731
    elif input_fn is not None:
        if not callable(input_fn):
            raise TypeError(f"input_fn must be callable (batch_size -> inputs), got {type(input_fn).__name__}")
        make = input_fn
    elif inputs is not None:
        return Workload(name, model, None, inputs, unit)
    if make is None:
        raise ValueError(f"model {name} needs inputs: give inputs=, input_shape= or input_fn=")
    return Workload(name, model, make, None, unit)


def check_input_shape(input_shape: Any) -> tuple[int, ...]:
    if not (isinstance(input_shape, (tuple, list)) and input_shape
            and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in input_shape)):
        raise ValueError(f"input_shape must be a non-empty sequence of positive ints (one item, without the "
                         f"batch dimension), got {input_shape!r}")
    return tuple(input_shape)


def resolve_configs(configs: str | Config | Sequence[str | Config] | None, *, device: torch.device | None = None,
                    train: bool = False) -> list[Config]:
    """A preset name, one config (object or string) or a sequence of them; None: the default preset
    for ``device`` and ``train`` (:func:`~gpuopt.prepare.config.default_preset`). With ``train``, an
    inference-only backend is refused: it could not time a training step."""
    if configs is None:
        return preset(default_preset(device.type if device is not None else "cpu", train))
    if isinstance(configs, Config):
        out = [configs]
    elif isinstance(configs, str):
        out = preset(configs) if configs in presets() else [Config.parse(configs)]
    elif not isinstance(configs, (list, tuple)) or not configs:
        raise ValueError(f"configs must be a preset name, a config or a non-empty list of them, got {configs!r}")
    else:
        out = [Config.parse(c) for c in configs]
        labels = [c.label for c in out]
        dupes = sorted({x for x in labels if labels.count(x) > 1})
        if dupes:
            raise ValueError(f"configs repeat {', '.join(dupes)}; give each a distinct name")
    inference_only = [c.label for c in out
                      if c.backend in INFERENCE_ONLY_BACKENDS or c.precision in INFERENCE_ONLY_PRECISIONS]
    if train and inference_only:
        raise ValueError(f"configs {', '.join(inference_only)} use an inference-only backend "
                         f"({' or '.join(INFERENCE_ONLY_BACKENDS)}) or precision "
                         f"({' or '.join(INFERENCE_ONLY_PRECISIONS)}) and cannot time training steps; with train=True "
                         f"give eager or compile configs, or no configs for the training preset "
                         f"({default_preset('cpu', True)} on the CPU, {default_preset('cuda', True)} on CUDA)")
    return out


def resolve_batch_sizes(batch_sizes: Sequence[int] | int) -> list[int]:
    if isinstance(batch_sizes, int) and not isinstance(batch_sizes, bool):
        batch_sizes = [batch_sizes]
    if not isinstance(batch_sizes, (list, tuple)) or not batch_sizes:
        raise ValueError(f"batch_sizes must be a non-empty list of positive integers, got {batch_sizes!r}")
    for b in batch_sizes:
        if isinstance(b, bool) or not isinstance(b, int) or b <= 0:
            raise ValueError(f"batch_sizes must hold positive integers, got {b!r} in {list(batch_sizes)!r}")
    return list(dict.fromkeys(batch_sizes))


def resolve_modes(modes: Sequence[str] | str, train: bool, device: torch.device | None = None) -> list[str]:
    """Validated modes; on a CPU device latency and throughput become host mode (wall clock around
    each call: a CPU call's latency), graph mode is refused."""
    if isinstance(modes, str):
        modes = [modes]
    bad = [m for m in modes if m not in BENCH_MODES]
    if bad or not modes:
        raise ValueError(f"modes must be a non-empty list of {', '.join(BENCH_MODES)}; got {list(modes)!r}")
    if device is not None and device.type == "cpu":
        if "graph" in modes:
            raise ValueError("mode 'graph' needs a CUDA device; on the CPU use latency, throughput, host or end-to-end")
        modes = ["host" if m in ("latency", "throughput") else m for m in modes]
    return list(dict.fromkeys(modes)) + ([TRAIN_MODE] if train else [])


def resolve_device(device: Any) -> torch.device:
    """None (cuda when visible, else cpu), 'cpu', 'cuda', 'cuda:N' or a torch.device of those types;
    ValueError naming the device otherwise, or when it asks for a CUDA device that is not visible."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be 'cpu', 'cuda', 'cuda:N' or a torch.device, got {device!r}")
    try:
        d = torch.device(device)
    except RuntimeError:
        d = None
    if d is None or d.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {str(device)!r}")
    if d.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(device)!r} asked for CUDA, and no CUDA device is visible")
    if d.type == "cuda" and d.index is not None and d.index >= torch.cuda.device_count():
        raise ValueError(f"device {str(device)!r}: only {torch.cuda.device_count()} CUDA device(s) are visible "
                         f"(cuda:0 to cuda:{torch.cuda.device_count() - 1})")
    return d


def check_measure_options(options: dict[str, Any], modes: Sequence[str], device: torch.device) -> dict[str, Any]:
    """The measure options of a benchmark or sweep, checked for every mode its cells measure in
    (gpuopt.timing.validate_measure_options), so a bad value fails before the first cell."""
    if "mode" in options or "inputs" in options:
        raise TypeError("give modes= (a list) instead of mode=, and inputs= to benchmark() itself")
    timed = {m if m in MODES else ("throughput" if device.type == "cuda" else "host") for m in modes}
    return validate_measure_options(options, sorted(timed))
