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
