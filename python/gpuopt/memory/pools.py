"""Pinned-host and device memory pools implemented in gpuopt's C++ core, handing out torch tensors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .._ext import _C
from ..timing.inputs import device_index


def _fence_wait_timeout(value: float, owner: str) -> float:
    # The range is checked (and named) by the C++ pool; the type here, so a str is not a pybind11 error.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{owner}: fence_wait_timeout_s must be a number of seconds, got {value!r}")
    return float(value)


def _shape(shape: int | Sequence[int], owner: str) -> Sequence[int]:
    # Exact-type checks first: this runs on every allocation.
    if type(shape) is int:
        return (shape,)
    if type(shape) in (tuple, list, torch.Size) and all(type(d) is int for d in shape):
        return shape
    raise TypeError(f"{owner}.empty: shape must be an int or a sequence of ints, got {shape!r}")


class _Pool:
    _kind = "pool"

    def __init__(self, native: Any):
        self._native = native

    def empty(self, shape: int | Sequence[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A tensor from the pool; its storage returns to the pool when the tensor is freed. Its block
        is reused only after the work queued, by then, on the stream current at allocation, on the
        stream current when it is freed and on every stream given to :meth:`record_stream` has
        finished. Under ``capacity_bytes`` a request whose room is held only by such pending work
        waits for it (up to ``fence_wait_timeout_s``) instead of failing."""
        if type(dtype) is not torch.dtype:
            raise TypeError(f"{self.name}.empty: dtype must be a torch.dtype, got {dtype!r}")
        return self._native.empty(_shape(shape, self.name), dtype)

    def record_stream(self, tensor: torch.Tensor, stream: torch.cuda.Stream) -> None:
        """Also wait for the work queued on ``stream`` before reusing ``tensor``'s block (like
        ``Tensor.record_stream``, for a tensor used on a stream that is current neither when it is
        allocated nor when it is freed). At most 16 distinct streams per tensor."""
        self._native.record_stream(tensor, stream)

    def stats(self) -> dict[str, Any]:
        """Allocations, hits, misses, busy skips (free blocks passed over while their work ran),
        fence waits (requests that waited for such blocks under ``capacity_bytes``), bytes reserved /
        in use / peak, largest free block, fragmentation (the share of in-use bytes lost to
        size-class rounding)."""
        return dict(self._native.stats())

    def trim(self) -> int:
        """Free idle blocks whose work has finished; returns the bytes freed."""
        return self._native.trim()

    def close(self) -> None:
        """Free idle blocks and refuse further allocations; tensors still alive free theirs on release."""
        self._native.close()

    @property
    def closed(self) -> bool:
        return self._native.closed

    @property
    def name(self) -> str:
        return self._native.name

    @property
    def capacity_bytes(self) -> int | None:
        return self._native.capacity_bytes

    @property
    def fence_wait_timeout_s(self) -> float:
        return self._native.fence_wait_timeout_s

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

    def __repr__(self) -> str:
        s = self.stats()
        return (f"{type(self).__name__}({self.name!r}, reserved {s['bytes_reserved'] / 2**20:.1f} MiB, in use "
                f"{s['bytes_in_use'] / 2**20:.1f} MiB, hits {s['hits']}, misses {s['misses']})")


class PinnedPool(_Pool):
    """Page-locked host memory, pooled: ``cudaHostAlloc`` costs milliseconds, a pool hit about a
    microsecond. Without CUDA the same API hands out page-aligned plain host memory
    (``page_locked`` is then False).

    >>> import torch, gpuopt
    >>> pool = gpuopt.PinnedPool(capacity_bytes=64 << 20)
    >>> t = pool.empty((4, 1024), torch.float16)
    >>> t.shape, pool.stats()["bytes_in_use"] > 0
    (torch.Size([4, 1024]), True)
    """

    def __init__(self, capacity_bytes: int | None = None, *, name: str = "PinnedPool",
                 fence_wait_timeout_s: float = 10.0):
        super().__init__(_C.pinned_pool(capacity_bytes, name, _fence_wait_timeout(fence_wait_timeout_s, name)))

    @property
    def page_locked(self) -> bool:
        return self._native.page_locked


class DevicePool(_Pool):
    """Device memory from ``cudaMalloc``, pooled outside torch's caching allocator, reused only after
    the streams that used a block have finished with it. Needs CUDA."""

    def __init__(self, capacity_bytes: int | None = None, *, device: int | str | torch.device | None = None,
                 name: str = "DevicePool", fence_wait_timeout_s: float = 10.0):
        index = device_index(device)
        super().__init__(_C.device_pool(-1 if index is None else index, capacity_bytes, name,
                                        _fence_wait_timeout(fence_wait_timeout_s, name)))
