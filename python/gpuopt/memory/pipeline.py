"""A stream-overlapped host-to-device input pipeline, staged by a C++ worker through the pools."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from .._ext import _C
from ..timing.inputs import device_index
from .pools import DevicePool, PinnedPool


class InputPipeline:
    """Host batches to the device, overlapped with compute.

    A C++ worker thread copies each host batch into a pinned pool block and queues its host-to-device
    copy on a dedicated copy stream, ``depth`` batches ahead; ``next()`` makes the current stream wait
    for the batch's copy (an event), so the copy of batch i+1 runs while batch i computes.

    >>> pipe = gpuopt.InputPipeline(depth=2)                     # doctest: +SKIP
    >>> for x in pipe.iterate(host_batches):                     # doctest: +SKIP
    ...     y = model(x)
    """

    def __init__(self, *, depth: int = 2, device: int | str | torch.device | None = None,
                 pinned_pool: PinnedPool | None = None, device_pool: DevicePool | None = None):
        if isinstance(depth, bool) or not isinstance(depth, int):
            raise TypeError(f"depth must be an int, got {depth!r}")
        index = device_index(device)
        self.pinned_pool = pinned_pool or PinnedPool(name="InputPipeline pinned pool")
        self.device_pool = device_pool or DevicePool(device=index, name="InputPipeline device pool")
        self._native = _C.InputPipeline(self.pinned_pool._native, self.device_pool._native,
                                        -1 if index is None else index, depth)

    @property
    def depth(self) -> int:
        return self._native.depth

    def submit(self, batch: torch.Tensor) -> None:
        """Queue a CPU tensor (blocks while ``depth`` batches are in flight)."""
        if not isinstance(batch, torch.Tensor):
            raise TypeError(f"InputPipeline.submit: batch must be a torch.Tensor, got {type(batch).__name__}")
        self._native.submit(batch)

    def next(self) -> torch.Tensor:
        """The next batch on the device, in submission order."""
        return self._native.next()

    def iterate(self, batches: Iterable[torch.Tensor]) -> Iterator[torch.Tensor]:
        """Device tensors for ``batches``, staged ``depth`` ahead of the one being used."""
        it = iter(batches)
        for queued, batch in enumerate(it, 1):
            self.submit(batch)
            if queued == self.depth:
                break
        for batch in it:
            yield self.next()
            self.submit(batch)
        for _ in range(self._native.in_flight):
            yield self.next()

    def stats(self) -> dict[str, Any]:
        """Batches submitted and delivered, bytes, worker staging time, consumer wait time."""
        return dict(self._native.stats())
