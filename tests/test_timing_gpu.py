"""Every device mode of gpuopt.measure on a real GPU."""

from __future__ import annotations

import pytest
import torch

import gpuopt
from gpuopt import measure

pytestmark = pytest.mark.gpu


def events_ms(fn, reps=50) -> float:
    """Reference: plain torch events around `reps` back-to-back calls, ms per call."""
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


@pytest.fixture
def big_copy():
    """A large memory-bound kernel (~0.1-0.2 ms): unlike a big GEMM it is not power-capped, so
    back-to-back methods see the same device."""
    x = torch.randn(64 << 20, device="cuda")
    y = torch.empty_like(x)
    return lambda: y.copy_(x)


@pytest.fixture
def big_matmul():
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    return lambda: a @ b


@pytest.mark.parametrize("mode", ["latency", "throughput", "graph"])
def test_device_modes_agree_with_torch_events_on_large_kernels(mode, big_copy):
    ref = events_ms(big_copy)
    m = measure(big_copy, mode=mode, max_time_s=3)
    assert m.mode == mode and m.device == torch.cuda.current_device()
    assert m.device_name == torch.cuda.get_device_name()
    assert m.p50 == pytest.approx(ref, rel=0.05), (m, ref)
    assert m.target_met
    assert m.memory["max_allocated_bytes"] >= 2 * (64 << 20) * 4


def test_graph_and_latency_agree_for_large_kernels(big_copy):
    c = gpuopt.compare(big_copy, big_copy, mode="latency")
    lat = measure(big_copy, mode="latency", max_time_s=3)
    graph = measure(big_copy, mode="graph", max_time_s=3)
    assert graph.p50 == pytest.approx(lat.p50, rel=0.03)
    assert c.verdict == "no significant difference"


def test_interleaved_compare_of_identical_gemms_finds_no_difference(big_matmul):
    # A big GEMM drifts with the power cap; interleaving makes both sides see the same drift.
    for _ in range(5):
        assert gpuopt.compare(big_matmul, big_matmul).verdict == "no significant difference"


def test_host_mode_includes_synchronization(big_copy):
    m = measure(big_copy, mode="host", max_time_s=2)
    lat = measure(big_copy, mode="latency", max_time_s=2)
    assert m.p50 >= lat.p50 * 0.97


def test_flush_l2_slows_a_cache_resident_kernel():
    l2 = gpuopt._C.l2_cache_bytes(torch.cuda.current_device())
    x = torch.randn(l2 // 8 // 4, device="cuda")  # an eighth of the L2: stays resident when warm
    y = torch.empty_like(x)
    warm = measure(lambda: y.copy_(x), mode="latency", max_time_s=2)
    cold = measure(lambda: y.copy_(x), mode="latency", flush_l2=True, max_time_s=2)
    assert cold.flush_l2_bytes >= 2 * l2
    assert cold.p50 > 1.1 * warm.p50, (warm, cold)


def test_tiny_kernel_overheads():
    x = torch.zeros(1, device="cuda")
    lat = measure(lambda: x.add_(1), mode="latency", max_time_s=2)
    graph = measure(lambda: x.add_(1), mode="graph", max_time_s=2)
    assert lat.p50 < 0.015, lat  # device time, launch gaps hidden
    assert graph.p50 < 0.004, graph
    assert graph.calls_per_sample > 10


def test_many_tiny_launches_are_diagnosed_launch_bound():
    x = torch.zeros(16, device="cuda")

    def many():
        for _ in range(100):
            x.add_(1)

    m = measure(many, mode="latency", max_time_s=2)
    assert m.diagnosis == "launch-bound", m
    assert any("launch-bound" in w for w in m.warnings)


def test_throughput_blocks_are_pipelined(big_copy):
    m = measure(big_copy, mode="throughput", calls_per_sample=4, max_time_s=2)
    assert m.calls_per_sample == 4
    lat = measure(big_copy, mode="latency", max_time_s=2)
    assert m.p50 <= lat.p50 * 1.03


def test_graph_capture_failure_is_a_value_error_and_leaves_no_state():
    x = torch.ones(8, device="cuda")
    stream_before = torch.cuda.current_stream()
    with pytest.raises(ValueError, match='mode="graph": fn could not be captured'):
        measure(lambda: float(x.sum().item()), mode="graph", max_time_s=1)
    assert not torch.cuda.is_current_stream_capturing()
    assert torch.cuda.current_stream() == stream_before
    assert float((x * 2).sum()) == 16.0  # the device is usable
    assert measure(lambda: x.mul_(1), mode="graph", iters=5).n == 5


def test_exception_inside_fn_propagates_and_leaves_the_device_usable():
    x = torch.ones(8, device="cuda")
    n = {"calls": 0}

    def fn():
        n["calls"] += 1
        x.add_(1)
        if n["calls"] == 7:
            raise KeyError("from fn")

    for mode in ("latency", "throughput"):
        n["calls"] = 0
        with pytest.raises(KeyError, match="from fn"):
            measure(fn, mode=mode, iters=20, warmup=2, warmup_s=0)
    n["calls"] = 0  # graph mode: the 7th call happens during capture -> a capture error
    with pytest.raises(ValueError, match="KeyError"):
        measure(fn, mode="graph", iters=20, warmup=2, warmup_s=0)
    n["calls"] = 5  # ... or during warm-up, eagerly -> the callable's own error
    with pytest.raises(KeyError, match="from fn"):
        measure(fn, mode="graph", iters=20, warmup=2, warmup_s=0)
    torch.cuda.synchronize()
    assert not torch.cuda.is_current_stream_capturing()
    assert torch.isfinite(x).all()


def test_inputs_rotate_on_the_device():
    xs = [torch.full((1024,), float(i), device="cuda") for i in range(3)]
    out = torch.zeros(1024, device="cuda")
    measure(lambda x: out.add_(x), mode="latency", inputs=xs, iters=6, warmup=0, warmup_s=0)
    # 6 calls: each input twice -> 2 * (0 + 1 + 2)
    assert float(out[0]) == 6.0


def test_torchscript_module_on_gpu():
    module = torch.jit.trace(torch.nn.Linear(512, 512).cuda().eval(), torch.randn(64, 512, device="cuda"))
    m = measure(module, inputs=[torch.randn(64, 512, device="cuda")], max_time_s=1)
    assert m.mode == "latency" and m.p50 > 0


def test_nvml_clocks_recorded_when_available(big_matmul):
    m = measure(big_matmul, mode="throughput", max_time_s=1.0, warmup_s=0.2)
    if not gpuopt.env()["nvml"]:
        pytest.skip("nvidia-ml-py not installed")
    assert m.clocks is not None and m.clocks["max_sm_mhz"] > 0 and m.clocks["sm_mhz_median"] > 0


def test_compare_finds_the_faster_of_two_real_workloads():
    a = torch.randn(64 << 20, device="cuda")  # 256 MiB
    b = torch.randn(48 << 20, device="cuda")  # 192 MiB: 25% less to copy
    ya, yb = torch.empty_like(a), torch.empty_like(b)
    ma = measure(lambda: ya.copy_(a), max_time_s=2, label="256 MiB")
    mb = measure(lambda: yb.copy_(b), max_time_s=2, label="192 MiB")
    c = gpuopt.compare(ma, mb)
    assert c.verdict == "faster" and 1.2 < c.speedup < 1.45, c
    paired = gpuopt.compare(lambda: ya.copy_(a), lambda: yb.copy_(b), mode="graph")
    assert paired.verdict == "faster" and paired.interleaved and 1.2 < paired.speedup < 1.45, paired
