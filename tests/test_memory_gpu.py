"""Pools, fences and the input pipeline on a real GPU."""

from __future__ import annotations

import pytest
import torch

import gpuopt
from gpuopt import DevicePool, InputPipeline, PinnedPool

pytestmark = pytest.mark.gpu

LONG = 200_000_000  # torch.cuda._sleep cycles: ~0.1 s


def test_pinned_pool_is_page_locked():
    pool = PinnedPool()
    t = pool.empty((1024, 1024), torch.float16)
    assert pool.page_locked and t.is_pinned()


def test_device_block_is_not_reused_while_a_kernel_still_reads_it():
    pool = DevicePool()
    busy, other = torch.cuda.Stream(), torch.cuda.Stream()
    t = pool.empty(1 << 24, torch.float32)
    t.fill_(1.0)
    with torch.cuda.stream(busy):
        t.sum()  # load the kernels now: CUDA's lazy loading synchronizes on first use
    torch.cuda.synchronize()
    ptr = t.data_ptr()
    with torch.cuda.stream(busy):
        torch.cuda._sleep(LONG)
        total = t.sum()  # reads t after ~0.1 s
        assert not busy.query(), "the stream must still be busy for this test to mean anything"
        del t  # fence: an event on `busy`, recorded now
    with torch.cuda.stream(other):  # a reuse attempt from another stream, while `busy` still runs
        u = pool.empty(1 << 24, torch.float32)
        u.fill_(7.0)
    assert u.data_ptr() != ptr
    assert pool.stats()["busy_skips"] >= 1
    busy.synchronize()
    other.synchronize()
    assert float(total) == float(1 << 24)  # the reader saw ones, not sevens
    del u
    torch.cuda.synchronize()
    hits = pool.stats()["hits"]
    pool.empty(1 << 24, torch.float32)  # both blocks are idle now: served from the pool
    assert pool.stats()["hits"] == hits + 1 and pool.stats()["allocations"] == 2


def test_pinned_block_waits_for_the_copy_that_reads_it():
    pool = PinnedPool()
    side = torch.cuda.Stream()
    src = pool.empty(1 << 22, torch.float32)
    src.fill_(3.0)
    dst = torch.empty(1 << 22, device="cuda")
    ptr = src.data_ptr()
    with torch.cuda.stream(side):
        torch.cuda._sleep(LONG)
        dst.copy_(src, non_blocking=True)
    pool.record_stream(src, side)  # used on `side`, freed from the default stream's context
    del src
    again = pool.empty(1 << 22, torch.float32)
    assert again.data_ptr() != ptr
    again.fill_(9.0)  # host writes must not reach the pending copy
    side.synchronize()
    assert float(dst.sum()) == 3.0 * (1 << 22)


def test_record_stream_rejects_foreign_tensors():
    pool = PinnedPool(name="Mine")
    with pytest.raises(ValueError, match="Mine.record_stream: the tensor was not allocated by a gpuopt pool"):
        pool.record_stream(torch.empty(4, pin_memory=True), torch.cuda.current_stream())
    other = PinnedPool(name="Other")
    with pytest.raises(ValueError, match="belongs to another pool"):
        pool.record_stream(other.empty(4), torch.cuda.current_stream())


def test_input_pipeline_delivers_batches_in_order_on_the_device():
    batches = [torch.randn(16, 3, 32, 32) for _ in range(7)]
    batches[3] = batches[3].transpose(2, 3)  # non-contiguous input is accepted
    pipe = InputPipeline(depth=3)
    got = [x.clone() for x in pipe.iterate(batches)]
    assert len(got) == 7
    for host, dev in zip(batches, got):
        assert dev.is_cuda and torch.equal(dev.cpu(), host.contiguous())
    s = pipe.stats()
    assert s["submitted"] == s["delivered"] == 7 and s["bytes"] == sum(b.numel() * 4 for b in batches)


def test_input_pipeline_errors():
    pipe = InputPipeline(depth=2)
    with pytest.raises(ValueError, match="nothing was submitted"):
        pipe.next()
    with pytest.raises(ValueError, match="batches must be CPU tensors"):
        pipe.submit(torch.zeros(4, device="cuda"))
    with pytest.raises(ValueError, match="depth must be in"):
        InputPipeline(depth=0)


def test_measurements_record_peak_memory():
    def grow():
        x = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        x.fill_(1)

    m = gpuopt.measure(grow, iters=3)
    assert m.memory["max_allocated_bytes"] >= 256 << 20
    assert m.memory["max_reserved_bytes"] >= m.memory["max_allocated_bytes"]
    if gpuopt.env()["nvml"]:
        assert m.memory["nvml_used_bytes"] >= 256 << 20
