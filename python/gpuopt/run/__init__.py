"""Run: workloads (the model zoo or any module), the runner that prepares, parity-checks and measures
every cell, ``benchmark()`` and resumable ``sweep()``.

Layer: imports everything below it (timing, memory, prepare, analysis, report); nothing above.
"""

from . import zoo
from .bench import benchmark
from .sweeps import sweep

__all__ = ["benchmark", "sweep", "zoo"]
