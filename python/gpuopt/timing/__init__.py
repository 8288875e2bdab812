"""Timing: gpuopt's timing engine (C++ loop and statistics), comparisons, the inputs convention, NVML
facts and the environment record.

Layer: the lowest above ``gpuopt._ext``; imports nothing else of gpuopt.
"""

from .calibration import RunToRun, calibrate
from .comparison import Comparison, compare
from .environment import env
from .measurement import MODES, Measurement, format_ms, measure, validate_measure_options

__all__ = ["MODES", "Comparison", "Measurement", "RunToRun", "calibrate", "compare", "env", "format_ms", "measure",
           "validate_measure_options"]
