"""Analysis: what a workload costs (FLOPs, bytes), what the device can do (measured ceilings and vendor
datasheets), where a run sits on the roofline, and torch.profiler summaries.

Layer: imports ``gpuopt._ext``, ``gpuopt.timing`` and ``gpuopt.prepare`` only.
"""

from . import datasheet, roofline
from .device_ceilings import ceilings
from .profiler import ProfileSummary, profile

__all__ = ["ProfileSummary", "ceilings", "datasheet", "profile", "roofline"]
