"""gpuopt: how fast a PyTorch model really runs on a GPU, why, and how to make it faster.

The compiled core (``gpuopt._C``) is loaded after torch and checked against the installed torch
version; everything public is re-exported here.
"""

import torch  # noqa: F401  (first: the extension links against the libtorch it loads)

from ._ext import build_info
from .config import Config, Prepared, autocast, precision, preset, presets
from .env import env
from .memory import DevicePool, InputPipeline, PinnedPool
from .parity import Parity, parity
from .timing import Comparison, Measurement, compare, measure

__version__ = build_info()["gpuopt_version"]

__all__ = [
    "Comparison", "Config", "DevicePool", "InputPipeline", "Measurement", "Parity", "PinnedPool", "Prepared",
    "__version__", "autocast", "build_info",
    "compare", "env", "measure", "parity", "precision", "preset", "presets",
]
