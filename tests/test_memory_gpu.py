"""Pools, fences and the input pipeline on a real GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import gpuopt
from gpuopt import DevicePool, InputPipeline, PinnedPool

pytestmark = pytest.mark.gpuopt_gpu

LONG = 200_000_000  # torch.cuda._sleep cycles: ~0.1 s


def run_script(body: str, *, timeout_s: float, env: dict[str, str] | None = None) -> dict:
    """Runs `body` in a fresh interpreter (a crash or a hang becomes a clean failure) and returns the
    JSON object it prints last."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(body)], capture_output=True, text=True,
                          timeout=timeout_s, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


# Kernels loaded eagerly: with lazy loading the first launch of a kernel synchronizes the device,
# which hides a block handed out while a stream still uses it.
EAGER = {"CUDA_MODULE_LOADING": "EAGER"}


def test_pinned_block_used_on_a_side_stream_and_freed_on_another_is_not_reused_early():
    # No record_stream: the stream current at allocation (s) must fence the block by itself.
    r = run_script("""
        import json, torch, gpuopt
        n = 1 << 22
        pool = gpuopt.PinnedPool()
        s, other = torch.cuda.Stream(), torch.cuda.Stream()
        dst = torch.zeros(n, device="cuda")
        torch.cuda._sleep(1)
        torch.cuda.synchronize()
        with torch.cuda.stream(s):
            src = pool.empty(n, torch.float32)
            src.fill_(1.0)
            torch.cuda._sleep(2_000_000_000)  # ~1 s
            dst.copy_(src, non_blocking=True)  # reads src after the sleep
        ptr = src.data_ptr()
        with torch.cuda.stream(other):
            busy_at_free = not s.query()
            del src
            again = pool.empty(n, torch.float32)  # the same size class
            again.fill_(2.0)
            busy_after_refill = not s.query()
        s.synchronize()
        print(json.dumps({"busy_at_free": busy_at_free, "busy_after_refill": busy_after_refill,
                          "reused": again.data_ptr() == ptr, "dst_sum": float(dst.double().sum()), "n": n,
                          "busy_skips": pool.stats()["busy_skips"]}))
    """, timeout_s=120, env=EAGER)
    assert r["busy_at_free"] and r["busy_after_refill"], f"s finished too early for the test to mean anything: {r}"
    assert not r["reused"] and r["busy_skips"] == 1
    assert r["dst_sum"] == r["n"], f"the copy on s read the block after it was refilled with 2.0: {r}"


def test_device_block_used_on_a_side_stream_and_freed_on_another_is_not_reused_early():
    r = run_script("""
        import json, torch, gpuopt
        n = 1 << 24
        pool = gpuopt.DevicePool()
        s, other = torch.cuda.Stream(), torch.cuda.Stream()
        torch.cuda._sleep(1)
        torch.ones(4, device="cuda").sum()
        torch.cuda.synchronize()
        with torch.cuda.stream(s):
            t = pool.empty(n, torch.float32)
            t.fill_(1.0)
            torch.cuda._sleep(2_000_000_000)  # ~1 s
            total = t.double().sum()  # reads t after the sleep
        ptr = t.data_ptr()
        with torch.cuda.stream(other):
            busy_at_free = not s.query()
            del t
            u = pool.empty(n, torch.float32)
            u.fill_(2.0)  # runs at once on the idle stream `other`
            other.synchronize()
            busy_after_refill = not s.query()
        s.synchronize()
        print(json.dumps({"busy_at_free": busy_at_free, "busy_after_refill": busy_after_refill,
                          "reused": u.data_ptr() == ptr, "total": float(total), "n": n}))
    """, timeout_s=120, env=EAGER)
    assert r["busy_at_free"] and r["busy_after_refill"], f"s finished too early for the test to mean anything: {r}"
    assert not r["reused"]
    assert r["total"] == r["n"], f"the sum on s read the block after it was refilled with 2.0: {r}"


def test_pipeline_create_submit_delete_cannot_hang():
    # torch.from_numpy batches free their array under the GIL: a worker that dropped the last
    # reference while `del` joined it with the GIL held used to deadlock within 300 rounds.
    r = run_script("""
        import json, numpy as np, torch, gpuopt
        rng = np.random.default_rng(0)
        def batch():
            return torch.from_numpy(rng.standard_normal((64, 1024), dtype=np.float32))
        checked = 0
        for i in range(300):
            pipe = gpuopt.InputPipeline(depth=2)
            first = batch()
            expected = first.clone()
            pipe.submit(first)
            pipe.submit(batch())
            del first
            if i % 50 == 0:
                assert torch.equal(pipe.next().cpu(), expected)
                checked += 1
            del pipe
        for i in range(300):
            with gpuopt.InputPipeline(depth=2) as pipe:
                pipe.submit(batch())
                pipe.submit(batch())
            assert pipe.closed
        for i in range(100):
            pipe = gpuopt.InputPipeline(depth=2)
            pipe.submit(batch())
            pipe.submit(batch())
            pipe.close()
            pipe.close()
            assert pipe.stats()["cancelled"] + pipe.stats()["delivered"] == 2
        print(json.dumps({"checked": checked}))
    """, timeout_s=90)
    assert r["checked"] == 6


def test_under_capacity_a_fenced_block_is_waited_for_not_refused():
    n = 1 << 20  # 4 MiB of float32: the whole capacity
    pool = DevicePool(capacity_bytes=4 * n, fence_wait_timeout_s=10)
    s = torch.cuda.Stream()
    torch.cuda._sleep(1)
    torch.empty(n, device="cuda").fill_(1.0)  # load the kernels now: a lazy first load synchronizes
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        t = pool.empty(n, torch.float32)
        torch.cuda._sleep(LONG * 3)  # ~0.3 s
        t.fill_(1.0)
    assert not s.query(), "s must still be busy for this test to mean anything"
    del t  # fenced on s, where it was allocated
    t0 = time.perf_counter()
    u = pool.empty(n, torch.float32)  # waits for s instead of "would exceed capacity_bytes ... 0 B are in use"
    waited = time.perf_counter() - t0
    assert s.query(), "the request returned before the fence completed"
    assert waited > 0.01
    st = pool.stats()
    assert st["fence_waits"] == 1 and st["hits"] == 1 and st["allocations"] == 1 and st["bytes_reserved"] == 4 * n
    del u

    tight = DevicePool(capacity_bytes=4 * n, fence_wait_timeout_s=0.05, name="Tight")
    with torch.cuda.stream(s):
        t = tight.empty(n, torch.float32)
        torch.cuda._sleep(LONG * 10)  # ~1 s
        t.fill_(1.0)
    del t
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"Tight: a 4 MiB request .* would exceed capacity_bytes=4194304 \(4 MiB\); "
                                         r"4 MiB of free blocks are held by pending GPU work \(their fences did not "
                                         r"complete within fence_wait_timeout_s=0.05\) and 0 B are in use"):
        tight.empty(n, torch.float32)
    waited = time.perf_counter() - t0
    assert 0.05 <= waited < 0.5
    assert not s.query(), "s finished before the bound: the timeout was not exercised"
    s.synchronize()
    tight.empty(n, torch.float32)  # the fence has completed: served from the pool
    assert tight.stats()["hits"] == 1


def test_pipeline_timeouts_and_close():
    batch = torch.randn(256, 1024)  # 1 MiB: the pinned pool's whole capacity
    pinned = PinnedPool(capacity_bytes=1 << 20, fence_wait_timeout_s=10, name="Staging")
    s = torch.cuda.Stream()
    torch.cuda._sleep(1)
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        held = pinned.empty(256 * 1024)
        torch.cuda._sleep(LONG * 5)  # ~0.5 s
    del held  # fenced on s: staging the batch must wait for it
    pipe = InputPipeline(depth=1, pinned_pool=pinned, timeout_s=30)
    pipe.submit(batch)
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match=r"InputPipeline.submit: no room within timeout_s=0.1: depth=1 batches are "
                                           r"in flight"):
        pipe.submit(batch, timeout_s=0.1)
    assert time.perf_counter() - t0 >= 0.1
    assert not s.query(), "s must still be busy for the next() timeout to be exercised"
    with pytest.raises(RuntimeError, match=r"InputPipeline.next: no batch was staged within timeout_s=0.05 \(1 in "
                                           r"flight, the oldest still being staged\)"):
        pipe.next(timeout_s=0.05)
    got = pipe.next()  # staged once the fence completes
    assert torch.equal(got.cpu(), batch)
    assert pinned.stats()["fence_waits"] == 1
    pipe.submit(batch)
    pipe.close()
    assert pipe.closed and pipe.stats()["cancelled"] == 1
    with pytest.raises(ValueError, match="InputPipeline is closed; create a new one"):
        pipe.submit(batch)
    with pytest.raises(ValueError, match="InputPipeline is closed; create a new one"):
        pipe.next()
    with pytest.raises(ValueError, match=r"InputPipeline.next: timeout_s must be > 0 and <= 86400 seconds, got 0"):
        InputPipeline(depth=1).next(timeout_s=0)
    with pytest.raises(ValueError, match=r"InputPipeline: timeout_s must be > 0 and <= 86400 seconds, got -1"):
        InputPipeline(timeout_s=-1)


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


def test_record_stream_is_deduplicated_and_bounded():
    pool = PinnedPool(name="Bounded")
    t = pool.empty(1024)  # fenced on the current stream (allocation) already: 15 more fit
    streams = [torch.cuda.Stream() for _ in range(16)]
    for s in streams[:15]:
        pool.record_stream(t, s)
        pool.record_stream(t, s)  # a stream recorded twice counts once
    pool.record_stream(t, torch.cuda.current_stream())  # the allocation stream: already there
    with pytest.raises(ValueError, match=r"Bounded.record_stream: a tensor can be fenced on at most 16 distinct "
                                         r"streams \(the one current at allocation included\), and this one already "
                                         r"is on 16"):
        pool.record_stream(t, streams[15])
    with torch.cuda.stream(streams[3]):
        torch.cuda._sleep(LONG)
    ptr = t.data_ptr()
    del t  # fenced on all 16 streams: streams[3] is still sleeping
    again = pool.empty(1024)
    assert not streams[3].query(), "streams[3] must still be busy for this test to mean anything"
    assert again.data_ptr() != ptr and pool.stats()["busy_skips"] == 1
    torch.cuda.synchronize()


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
    with pytest.raises(ValueError, match=r"InputPipeline.next: nothing was submitted \(submit a batch first\)"):
        pipe.next()
    with pytest.raises(ValueError, match="batches must be CPU tensors"):
        pipe.submit(torch.zeros(4, device="cuda"))
    with pytest.raises(ValueError, match=r"InputPipeline: depth must be in \[1, 64\], got 0"):
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
