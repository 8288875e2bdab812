"""The CUDA layer on a real device: a kernel of ours on torch's current stream, and a timed copy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpuopt import _C

pytestmark = pytest.mark.gpu


def _lowbias32(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.uint32)
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x7FEB352D)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x846CA68B)
    x ^= x >> np.uint32(16)
    return x


def expected_pattern(n: int, seed: int) -> np.ndarray:
    i = np.arange(n, dtype=np.uint64)
    hi = (i >> np.uint64(32)).astype(np.uint32)
    with np.errstate(over="ignore"):
        return _lowbias32(i.astype(np.uint32) ^ _lowbias32(np.uint32(seed) ^ hi))


@pytest.mark.parametrize("n,offset", [(1, 0), (5, 1), (1 << 20, 0), ((1 << 20) + 3, 3)])
def test_fill_pattern_runs_on_the_current_stream(n, offset):
    seed = int(np.random.default_rng().integers(0, 2**32))
    side = torch.cuda.Stream()
    base = torch.empty(n + offset, dtype=torch.int32, device="cuda")
    out = base[offset:]  # offsets exercise the unaligned head and tail
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # ~25 ms on the side stream
        out.zero_()
        _C.fill_pattern(out, seed)  # must queue behind zero_() on the *side* stream
    side.synchronize()
    got = out.cpu().numpy().view(np.uint32)
    np.testing.assert_array_equal(got, expected_pattern(n, seed))


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
    with pytest.raises(IndexError, match="device must be in"):
        _C.time_device_copy(1024, 1, 99)
