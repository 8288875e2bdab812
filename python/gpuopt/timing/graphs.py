"""CUDA graph capture that fails cleanly: the one way gpuopt's Python captures graphs (cudagraph
configs, the server's buckets, the LLM decode loop); the C++ timing loop's graph mode does the same.

``torch.cuda.graph`` in torch releases before the fix (2.11 among them) leaves a failed capture
half open: the caching allocator keeps routing to the capture's private pool, and while it believes
a capture is under way, ``torch.cuda.empty_cache()`` and the retry after a failed ``cudaMalloc``
return no cached memory at all. One model that cannot be captured (a ``.item()``, a host sync)
followed by one out-of-memory batch, and every later cell of the process runs out of memory too.
:func:`capture` undoes what torch left, and only that (newer torch cleans up itself).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from .._ext import _C


@contextlib.contextmanager
def capture(graph: torch.cuda.CUDAGraph, *, stream: torch.cuda.Stream,
            pool: tuple[int, int] | None = None) -> Iterator[None]:
    """``with capture(graph, stream=s, pool=p):`` captures the body into ``graph`` on ``s`` (made
    current, on its device) into memory pool ``p`` (default: a new one), as ``torch.cuda.graph``
    does. When the body or the capture fails, the capture is ended and the graph reset, the
    allocators' state for the pool is undone (see the module docstring), the current stream is the
    one before, and the exception propagates."""
    device = stream.device
    pool = torch.cuda.graph_pool_handle() if pool is None else pool
    with torch.cuda.device(device):
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()  # as torch.cuda.graph: free what can be freed for the graph
        before = _C.graph_pool_use_count(device.index, pool)
        with torch.cuda.stream(stream):
            try:
                graph.capture_begin(pool=pool)
            except BaseException:
                _abandon(graph, device, pool, before)
                raise
            try:
                yield
            except BaseException:
                _abandon(graph, device, pool, before)
                raise
            try:
                graph.capture_end()
            except BaseException:
                _abandon(graph, device, pool, before)
                raise


def _abandon(graph: torch.cuda.CUDAGraph, device: torch.device, pool: tuple[int, int], before: int) -> None:
    if torch.cuda.is_current_stream_capturing():
        with contextlib.suppress(Exception):  # an invalidated capture ends with an error; ending it is the point
            graph.capture_end()
    with contextlib.suppress(Exception):
        graph.reset()
    _C.release_failed_capture(device.index, pool, before)


__all__ = ["capture"]
