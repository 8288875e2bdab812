"""Pools and the input pipeline: the API, errors and thread safety (CPU; CI)."""

from __future__ import annotations

import pytest
import torch

import gpuopt
from gpuopt import PinnedPool
from gpuopt._ext import _C


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


@pytest.mark.parametrize("capacity_bytes", [None, 1 << 20])
def test_cpp_threads_share_a_pool_without_the_gil(seed, capacity_bytes):
    # C++ threads (not Python ones, which the GIL would serialise) create and free tensors of random
    # sizes, each tagged at both ends and checked before it is freed.
    pool = PinnedPool(capacity_bytes=capacity_bytes, name="Stressed")
    threads, iters = 8, 20000
    r = _C.pool_stress(pool._native, threads, iters, seed % (1 << 31))
    n = threads * iters
    assert r["tensors"] == n and r["corrupted"] == 0
    assert r["acquisitions"] == r["releases"] == n
    assert r["hits"] + r["misses"] == n and r["hits"] > 10 * r["misses"]  # the pool actually pools
    assert r["bytes_in_use"] == r["blocks_in_use"] == r["bytes_requested_in_use"] == 0
    assert r["free_blocks"] == r["allocations"] - r["frees"]
    # 8 threads x at most 5 held x at most a 16 KiB class: 640 KiB, under the 1 MiB capacity.
    assert r["peak_bytes_in_use"] <= threads * 5 * 16384
    if capacity_bytes is not None:
        assert r["peak_bytes_reserved"] <= capacity_bytes
    assert pool.stats() == {k: v for k, v in r.items() if k not in ("tensors", "corrupted", "seconds")}


@pytest.mark.parametrize(
    "args, match",
    [
        ((0, 10, 1), r"pool_stress: threads must be in \[1, 256\], got 0"),
        ((2, 0, 1), r"pool_stress: iters must be in \[1, 1e8\], got 0"),
        ((2, 10, -3), "pool_stress: seed must be >= 0, got -3"),
    ],
)
def test_pool_stress_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        _C.pool_stress(PinnedPool()._native, *args)


def test_fence_wait_timeout_is_validated_and_kept():
    assert PinnedPool().fence_wait_timeout_s == 10.0
    pool = PinnedPool(capacity_bytes=4096, fence_wait_timeout_s=0.25)
    assert pool.fence_wait_timeout_s == 0.25 and pool.capacity_bytes == 4096
    assert PinnedPool().capacity_bytes is None
    for bad in (-1, float("nan"), 3601):
        with pytest.raises(ValueError, match=r"Waiting: fence_wait_timeout_s must be in \[0, 3600\] seconds, got"):
            PinnedPool(name="Waiting", fence_wait_timeout_s=bad)
    with pytest.raises(TypeError, match="Waiting: fence_wait_timeout_s must be a number of seconds, got '5'"):
        PinnedPool(name="Waiting", fence_wait_timeout_s="5")


def test_pipeline_arguments_are_checked_before_any_device_work():
    with pytest.raises(TypeError, match="InputPipeline: timeout_s must be a number of seconds, got '1'"):
        gpuopt.InputPipeline(timeout_s="1")
    with pytest.raises(TypeError, match="InputPipeline: timeout_s must be a number of seconds, got None"):
        gpuopt.InputPipeline(timeout_s=None)
    pinned = PinnedPool()
    with pytest.raises(ValueError, match="InputPipeline: device_pool must be a DevicePool"):
        _C.InputPipeline(pinned._native, pinned._native, 0, 2)
    with pytest.raises(ValueError, match="InputPipeline: device_pool must be a DevicePool"):
        _C.InputPipeline(pinned._native, None, 0, 2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_without_cuda_pinned_is_plain_host_memory_and_device_things_say_why():
    assert not PinnedPool().page_locked
    with pytest.raises(ValueError, match="DevicePool needs a CUDA device"):
        gpuopt.DevicePool()
    with pytest.raises(ValueError, match="needs a CUDA device"):
        gpuopt.InputPipeline()
    with pytest.raises(TypeError, match="depth must be an int"):
        gpuopt.InputPipeline(depth=1.5)
