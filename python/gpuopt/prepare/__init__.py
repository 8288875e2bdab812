"""Prepare: optimization configs (precision, memory format, backend) applied to a model through C++
state guards, the parity gate that checks a prepared model against the FP32 reference, and the
seeded re-initialisation that gives a zero-initialised model's output signal to compare.

Layer: imports ``gpuopt._ext`` and ``gpuopt.timing`` only.
"""

from .config import Config, Prepared, autocast, precision, preset, presets
from .gate import Parity, parity
from .signal import SignalFix, with_signal

__all__ = ["Config", "Parity", "Prepared", "SignalFix", "autocast", "parity", "precision", "preset", "presets",
           "with_signal"]
