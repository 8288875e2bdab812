"""gpuopt: how fast a PyTorch model really runs on a GPU, why, and how to make it faster.

The compiled core (``gpuopt._C``) is loaded after torch and checked against the installed torch
version; everything public is re-exported here.
"""

import torch  # noqa: F401  (first: the extension links against the libtorch it loads)

from ._ext import build_info
from .env import env
from .timing import Comparison, Measurement, compare, measure

__version__ = build_info()["gpuopt_version"]

__all__ = ["Comparison", "Measurement", "__version__", "build_info", "compare", "env", "measure"]
