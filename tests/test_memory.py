"""Pools and the input pipeline: the API, errors and thread safety (CPU; CI)."""

from __future__ import annotations

import threading

import pytest
import torch

import gpuopt
from gpuopt import PinnedPool


def test_pool_tensors_are_real_and_return_to_the_pool():
    pool = PinnedPool()
    t = pool.empty((3, 5), torch.float64)
    assert t.shape == (3, 5) and t.dtype == torch.float64 and t.is_contiguous()
    t.copy_(torch.arange(15, dtype=torch.float64).reshape(3, 5))
    assert float(t.sum()) == 105.0
    ptr = t.data_ptr()
    del t
    s = pool.stats()
    assert s["bytes_in_use"] == 0 and s["free_blocks"] == 1 and s["misses"] == 1
    u = pool.empty(100, torch.float32)  # 400 B: the same 512 B size class as 120 B
    assert u.data_ptr() == ptr and pool.stats()["hits"] == 1


def test_stats_track_use_peak_and_fragmentation():
    pool = PinnedPool()
    a = pool.empty(1000, torch.uint8)
    b = pool.empty(5000, torch.uint8)
    s = pool.stats()
    assert s["blocks_in_use"] == 2 and s["bytes_requested_in_use"] == 6000
    assert s["bytes_in_use"] == 1024 + 5120
    assert s["fragmentation"] == pytest.approx(1 - 6000 / 6144)
    del a, b
    s = pool.stats()
    assert s["peak_bytes_in_use"] == 6144 and s["bytes_in_use"] == 0 and s["largest_free_block"] == 5120
    assert pool.trim() == 6144 and pool.stats()["bytes_reserved"] == 0


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda p: p.empty(0), ValueError, r"every dimension must be > 0, got shape \[0\]"),
        (lambda p: p.empty((4, -2)), ValueError, r"got shape \[4, -2\]"),
        (lambda p: p.empty(2.5), TypeError, "shape must be an int or a sequence of ints"),
        (lambda p: p.empty((2, True)), TypeError, "shape must be an int or a sequence of ints"),
        (lambda p: p.empty(4, "float32"), TypeError, "dtype must be a torch.dtype"),
        (lambda p: p.empty(4, torch.qint8), TypeError, "dtype must be a plain numeric or bool dtype"),
        (lambda p: p.empty(1 << 22, torch.uint8), ValueError, r"capacity_bytes=1048576 \(1 MiB\)"),
    ],
)
def test_bad_requests_are_clear_errors(call, exc, match):
    pool = PinnedPool(capacity_bytes=1 << 20, name="Small")
    with pytest.raises(exc, match=match):
        call(pool)


def test_bad_capacity_and_use_after_close():
    with pytest.raises(ValueError, match="capacity_bytes must be > 0"):
        PinnedPool(capacity_bytes=0)
    with PinnedPool(name="Scoped") as pool:
        held = pool.empty(10)
    assert pool.closed
    with pytest.raises(ValueError, match="Scoped is closed"):
        pool.empty(10)
    held.fill_(1.0)  # still valid; its block is freed when it goes
    del held
    assert pool.stats()["bytes_reserved"] == 0


def test_tensors_keep_their_pool_alive():
    pool = PinnedPool()
    t = pool.empty(1000)
    del pool
    t.fill_(2.0)
    assert float(t.sum()) == 2000.0
    del t  # returns the block to the pool, which then goes away


def test_concurrent_threads_share_a_pool():
    pool = PinnedPool()
    errors = []

    def work(seed):
        try:
            g = torch.Generator().manual_seed(seed)
            for _ in range(2000):
                n = int(torch.randint(1, 4096, (1,), generator=g))
                t = pool.empty(n, torch.uint8)
                t[0] = 1
                del t
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    s = pool.stats()
    assert not errors
    assert s["acquisitions"] == s["releases"] == 8000 and s["bytes_in_use"] == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_without_cuda_pinned_is_plain_host_memory_and_device_things_say_why():
    assert not PinnedPool().page_locked
    with pytest.raises(ValueError, match="DevicePool needs a CUDA device"):
        gpuopt.DevicePool()
    with pytest.raises(ValueError, match="needs a CUDA device"):
        gpuopt.InputPipeline()
    with pytest.raises(TypeError, match="depth must be an int"):
        gpuopt.InputPipeline(depth=1.5)
