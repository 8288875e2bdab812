"""A stream-overlapped host-to-device input pipeline, staged by a C++ worker through the pools."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from .._ext import _C
from ..timing.inputs import device_index
from .pools import DevicePool, PinnedPool


def _timeout(value: float | None, where: str) -> float | None:
    # The range is checked (and named) in C++; the type here, so a str is not a pybind11 error.
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{where}: timeout_s must be a number of seconds, got {value!r}")
    return float(value)


class InputPipeline:
    """Host batches to the device, overlapped with compute.

    A C++ worker thread copies each host batch into a pinned pool block and queues its host-to-device
    copy on a dedicated copy stream, ``depth`` batches ahead; ``next()`` makes the current stream wait
    for the batch's copy (an event), so the copy of batch i+1 runs while batch i computes.

    Every wait is bounded: ``submit()`` and ``next()`` give up after ``timeout_s`` (the pipeline's,
    or their own) with a RuntimeError that says why. ``close()`` cancels: batches not yet delivered
    are dropped and the worker stops after the batch it is staging; use the pipeline as a context
    manager to close it on exit. Host batches are released by the caller's side (``next()``,
    ``close()``), never by the worker, so ``torch.from_numpy`` batches and ``del`` are safe.

    >>> with gpuopt.InputPipeline(depth=2) as pipe:              # doctest: +SKIP
    ...     for x in pipe.iterate(host_batches):
    ...         y = model(x)
    """

    def __init__(self, *, depth: int = 2, device: int | str | torch.device | None = None,
                 pinned_pool: PinnedPool | None = None, device_pool: DevicePool | None = None,
                 timeout_s: float = 60.0):
        if isinstance(depth, bool) or not isinstance(depth, int):
            raise TypeError(f"depth must be an int, got {depth!r}")
        timeout = _timeout(timeout_s, "InputPipeline")
        if timeout is None:
            raise TypeError("InputPipeline: timeout_s must be a number of seconds, got None")
        index = device_index(device)
        self.pinned_pool = pinned_pool or PinnedPool(name="InputPipeline pinned pool")
        self.device_pool = device_pool or DevicePool(device=index, name="InputPipeline device pool")
        self._native = _C.InputPipeline(self.pinned_pool._native, self.device_pool._native,
                                        -1 if index is None else index, depth, timeout)

    @property
    def depth(self) -> int:
        return self._native.depth

    @property
    def timeout_s(self) -> float:
        return self._native.timeout_s

    @property
    def in_flight(self) -> int:
        """Batches submitted and not yet delivered."""
        return self._native.in_flight

    @property
    def closed(self) -> bool:
        return self._native.closed

    def submit(self, batch: torch.Tensor, *, timeout_s: float | None = None) -> None:
        """Queue a CPU tensor; waits (up to ``timeout_s``, default the pipeline's) while ``depth``
        batches are in flight."""
        if not isinstance(batch, torch.Tensor):
            raise TypeError(f"InputPipeline.submit: batch must be a torch.Tensor, got {type(batch).__name__}")
        self._native.submit(batch, _timeout(timeout_s, "InputPipeline.submit"))

    def next(self, *, timeout_s: float | None = None) -> torch.Tensor:
        """The next batch on the device, in submission order (waits up to ``timeout_s``, default the
        pipeline's, for it to be staged); re-raises an error met while staging it."""
        return self._native.next(_timeout(timeout_s, "InputPipeline.next"))

    def close(self) -> None:
        """Cancel what is in flight and stop the worker (without holding the GIL). Idempotent."""
        self._native.close()

    def __enter__(self) -> InputPipeline:
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

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
        """Batches submitted, delivered, failed and cancelled, bytes staged, worker staging time,
        consumer wait time."""
        return dict(self._native.stats())
