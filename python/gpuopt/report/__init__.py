"""Report: the Results table (one typed row per cell, JSON/CSV files), Markdown reports, plots and the
cross-hardware comparison.

Layer: imports ``gpuopt.timing``, ``gpuopt.prepare`` and ``gpuopt.analysis``; never ``gpuopt.run``.
"""

from . import plots
from .crosshw import cross_hardware_markdown
from .grid_table import grid
from .results import Results, Row, merge

__all__ = ["Results", "Row", "cross_hardware_markdown", "grid", "merge", "plots"]
