"""Prepare: optimization configs (precision, memory format, backend) applied to a model through C++
state guards, and the parity gate that checks a prepared model against the FP32 reference.

Layer: imports ``gpuopt._ext`` and ``gpuopt.timing`` only.
"""

from .config import Config, Prepared, autocast, precision, preset, presets
from .parity import Parity, parity

__all__ = ["Config", "Parity", "Prepared", "autocast", "parity", "precision", "preset", "presets"]
