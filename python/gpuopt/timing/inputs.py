"""gpuopt's inputs convention, in one place: what "inputs" means for every function that takes them
(measure, Config.apply, parity, profile, benchmark), and which device a ``device=`` argument names."""

from __future__ import annotations

from typing import Any

import torch


def split_inputs(inputs: Any) -> tuple[tuple, dict]:
    """gpuopt's inputs convention as (args, kwargs): None -> no arguments, a dict -> keyword
    arguments, a tuple or list -> positional arguments, anything else -> one positional argument."""
    if inputs is None:
        return (), {}
    if isinstance(inputs, dict):
        return (), dict(inputs)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    return (inputs,), {}


def tensors_in(obj: Any) -> list[torch.Tensor]:
    """Every tensor inside nested tuples, lists and dicts (inputs or outputs of any structure)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in tensors_in(v)]
    if isinstance(obj, (tuple, list)):
        return [t for v in obj for t in tensors_in(v)]
    return []


def argument_sets(inputs: Any) -> list[tuple[tuple, dict]]:
    """``measure(inputs=...)``: None -> one call without arguments; otherwise a non-empty list or tuple
    of argument sets, each read by :func:`split_inputs` (a dict is keyword arguments, a tuple or list
    positional arguments, anything else one positional argument)."""
    if inputs is None:
        return [((), {})]
    if not isinstance(inputs, (list, tuple)):
        raise TypeError(f"inputs must be a list of argument sets, got {type(inputs).__name__}")
    if len(inputs) == 0:
        raise ValueError("inputs must hold at least one argument set, got an empty list")
    return [split_inputs(item) if item is not None else ((None,), {}) for item in inputs]


def device_index(device) -> int | None:
    """None -> current CUDA device (or None without CUDA); int >= 0, 'cuda:1' or torch.device -> index; 'cpu' ->
    None (the CPU alone: host mode then synchronizes no GPU)."""
    if device is None:
        return torch.cuda.current_device() if torch.cuda.is_available() else None
    if isinstance(device, bool):
        raise TypeError(f"device must be an int, a string like 'cuda:0' or a torch.device, got {device!r}")
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"device must be a CUDA device index >= 0 (or 'cpu' for the CPU alone), got {device}")
        return device
    if isinstance(device, (str, torch.device)):
        d = torch.device(device)
        if d.type == "cpu":
            return None
        if d.type != "cuda":
            raise ValueError(f"device must be a CUDA device or 'cpu', got {device!r}")
        return d.index if d.index is not None else torch.cuda.current_device()
    raise TypeError(f"device must be an int, a string like 'cuda:0' or a torch.device, got {device!r}")
