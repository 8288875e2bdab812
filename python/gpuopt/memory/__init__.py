"""Memory: pinned-host and device pools in gpuopt's C++ core, and the input pipeline built on them.

Layer: imports only ``gpuopt._ext`` and ``gpuopt.timing``.
"""

from .pipeline import InputPipeline
from .pools import DevicePool, PinnedPool

__all__ = ["DevicePool", "InputPipeline", "PinnedPool"]
