"""Argument checks shared by every layer, so each kind of bad input gets one wording and the right
Python type: TypeError for a value of the wrong type, ValueError for one out of range."""

from __future__ import annotations

from typing import Any


def check_int(name: str, value: Any, minimum: int = 1) -> int:
    """``value`` if it is an integer (not a bool) of at least ``minimum``; else TypeError (not an
    integer) or ValueError (too small), both naming ``name``, the value and what is allowed."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_devices(name: str, devices: Any) -> None:
    """The form of a ``devices`` value: ``"all"``, a count ``N`` >= 1 or a non-empty list of distinct
    non-negative indices (TypeError for another kind of value, ValueError naming ``name``)."""
    form = f"{name} must be 'all', a number of GPUs or a list of distinct GPU indices"
    if isinstance(devices, str):
        if devices != "all":
            raise ValueError(f"{form}, got {devices!r}")
    elif isinstance(devices, bool) or not isinstance(devices, (int, list, tuple)):
        raise TypeError(f"{form}, got {devices!r}")
    elif isinstance(devices, int) and devices < 1:
        raise ValueError(f"{name} must be at least 1, got {devices}")
    elif isinstance(devices, (list, tuple)):
        bad = [d for d in devices if isinstance(d, bool) or not isinstance(d, int) or d < 0]
        if not devices or bad or len(set(devices)) != len(devices):
            raise ValueError(f"{form}, got {list(devices)!r}")


def cuda_indices(name: str, devices: Any) -> list[int]:
    """The CUDA device indices ``devices`` names among those visible: ``"all"``, a count ``N`` (the first
    N) or a list of distinct indices. TypeError for another kind of value; ValueError, naming ``name``,
    the value and the GPUs visible, for a bad value or more GPUs than are visible."""
    import torch

    check_devices(name, devices)
    visible = torch.cuda.device_count()
    seen = f"{visible} visible (cuda:0 to cuda:{visible - 1})" if visible else "none visible"
    if devices == "all":
        if not visible:
            raise ValueError(f"{name}='all' asks for GPUs; {seen}")
        return list(range(visible))
    if isinstance(devices, int):
        if devices > visible:
            raise ValueError(f"{name}={devices} asks for {devices} GPUs; {seen}")
        return list(range(devices))
    missing = [d for d in devices if d >= visible]
    if missing:
        raise ValueError(f"{name}={list(devices)!r} names GPU(s) {missing}; {seen}")
    return list(devices)
