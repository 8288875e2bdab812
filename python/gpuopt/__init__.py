"""gpuopt: how fast a PyTorch model really runs on a GPU, why, and how to make it faster.

The compiled core (``gpuopt._C``) is loaded after torch and checked against the installed torch
version; everything public is re-exported here.
"""

import torch  # noqa: F401  (first: the extension links against the libtorch it loads)

from . import datasheet, plot, roofline, zoo  # noqa: E402,F401,I001  (submodules as attributes)
from ._ext import build_info
from .bench import benchmark
from .config import Config, Prepared, autocast, precision, preset, presets
from .device_ceilings import ceilings
from .env import env
from .memory import DevicePool, InputPipeline, PinnedPool
from .parity import Parity, parity
from .profile import ProfileSummary, profile
from .results import Results
from .sweep import sweep
from .timing import Comparison, Measurement, compare, measure

__version__ = build_info()["gpuopt_version"]

__all__ = [
    "Comparison", "Config", "DevicePool", "InputPipeline", "Measurement", "Parity", "PinnedPool", "Prepared",
    "ProfileSummary", "Results", "__version__", "autocast", "benchmark", "build_info", "ceilings", "compare",
    "datasheet", "env", "measure", "parity", "plot", "precision", "preset", "presets", "profile", "roofline",
    "sweep", "zoo",
]
