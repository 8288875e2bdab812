"""The CUDA layer on a real device: a kernel of ours on torch's current stream, and a timed copy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpuopt import _C

pytestmark = pytest.mark.gpuopt_gpu


@pytest.mark.parametrize("n,offset", [(1, 0), (5, 1), (1 << 20, 0), ((1 << 20) + 3, 3)])
def test_fill_pattern_runs_on_the_current_stream(n, offset):
    seed = int(np.random.default_rng().integers(0, 2**32))
    side = torch.cuda.Stream()
    base = torch.empty(n + offset, dtype=torch.int32, device="cuda")
    out = base[offset:]  # offsets exercise the unaligned head and tail
    # The same calls once first: lazy kernel loading and the first op lookup can outlast the sleep.
    scratch = torch.empty(5, dtype=torch.int32, device="cuda")  # 5: vectorised body and scalar tail
    scratch.zero_()
    torch.ops.gpuopt.fill_pattern_(scratch, seed)
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # ~50 ms on the side stream
        out.zero_()
        torch.ops.gpuopt.fill_pattern_(out, seed)  # must queue behind zero_() on the *side* stream
    # Still sleeping, so zero_() has not run: a fill on any other stream would have run first and
    # been overwritten with zeros.
    assert not side.query()
    side.synchronize()
    # The CPU operator is checked against an independent numpy hash in test_ops.py.
    assert torch.equal(out.cpu(), torch.ops.gpuopt.pattern(n, seed, torch.device("cpu")))


def test_timed_device_copy_has_plausible_bandwidth():
    nbytes = 512 << 20
    ours = _C.time_device_copy(nbytes, reps=20)
    assert 100.0 < ours["gbps"] < 20_000.0, ours
    # The same copy timed by torch's own events, within 15%.
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        dst.copy_(src)
    end.record()
    end.synchronize()
    torch_gbps = 2 * nbytes / (start.elapsed_time(end) / 20 * 1e-3) / 1e9
    assert ours["gbps"] == pytest.approx(torch_gbps, rel=0.15)


def test_l2_size_matches_torch():
    props = torch.cuda.get_device_properties(0)
    assert _C.l2_cache_bytes(0) == props.L2_cache_size


def test_bad_device_index_is_an_index_error():
    count = torch.cuda.device_count()
    with pytest.raises(
        IndexError, match=rf"time_device_copy: device must be in \[0, {count}\), got 99"
    ):
        _C.time_device_copy(1024, 1, 99)
