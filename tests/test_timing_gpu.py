"""Every device mode of gpuopt.measure on a real GPU."""

from __future__ import annotations

import functools
import threading
import time

import numpy as np
import pytest
import torch

import gpuopt
from gpuopt import measure
from gpuopt._ext import _C
from gpuopt.timing import graphs, nvml

pytestmark = pytest.mark.gpuopt_gpu


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


def test_a_failed_capture_leaves_no_capture_under_way_in_the_allocator():
    # torch 2.11 left a failed capture "under way" in its caching allocator (capture_end throws before
    # it ends the routing; reset() keeps the pool): empty_cache() and the retry after a failed cudaMalloc
    # then returned nothing for the rest of the process. Both gpuopt capture paths undo that.
    x = torch.ones(8, device="cuda")
    stream_before = torch.cuda.current_stream()
    with pytest.raises(ValueError, match="could not be captured"):
        measure(lambda: float(x.sum().item()), mode="graph", max_time_s=1)  # the C++ loop's capture
    pool = torch.cuda.graph_pool_handle()
    with pytest.raises(RuntimeError), graphs.capture(torch.cuda.CUDAGraph(), stream=torch.cuda.Stream(), pool=pool):
        float(x.sum().item())  # the Python capture (cudagraph configs, servers, decode loops)
    assert _C.graph_pool_use_count(torch.cuda.current_device(), pool) == 0  # the capture's reference dropped
    assert torch.cuda.current_stream() == stream_before

    # Fill the GPU on this stream until it runs out, free it, then ask for memory on another stream:
    # only the cached blocks going back to the driver can serve it.
    torch.cuda.empty_cache()
    base = torch.cuda.memory_reserved()
    chunks = []
    with pytest.raises(torch.OutOfMemoryError):
        while True:
            chunks.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))
    assert len(chunks) > 1
    del chunks
    with torch.cuda.stream(torch.cuda.Stream()):
        y = torch.ones(1 << 30, dtype=torch.uint8, device="cuda")
        assert int(y[-1]) == 1
    del y
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() <= base


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


@pytest.mark.filterwarnings("ignore:`torch.jit.trace.*is deprecated:FutureWarning")
def test_torchscript_module_on_gpu(monkeypatch):
    used = []
    real = _C.measure_script
    monkeypatch.setattr(_C, "measure_script", lambda *a: used.append(True) or real(*a))
    linear = torch.nn.Linear(4096, 4096).cuda().eval()
    x = torch.randn(2048, 4096, device="cuda")
    module = torch.jit.trace(linear, x)
    with torch.no_grad():
        ref = events_ms(lambda: linear(x))  # ~1 ms of GEMM: device-bound, no launch gaps
        m = measure(module, inputs=[x], max_time_s=2)
    assert used, "the TorchScript module was not timed by measure_script"
    assert m.mode == "latency" and m.p50 == pytest.approx(ref, rel=0.1), (m, ref)


def _nvml_monitor_active() -> None:
    mon = nvml.clock_monitor(torch.cuda.current_device())
    assert mon.active, f"the GPU machine has NVML, but the clock monitor is inactive: {mon.reason}"


def test_the_clock_monitor_summary_reaches_the_measurement(big_matmul):
    _nvml_monitor_active()
    m = measure(big_matmul, mode="latency", max_time_s=1.5, min_time_s=1.0, warmup_s=0.2)
    c = m.clocks
    assert c is not None, m
    # One reading per 100 ms over the sampling time, the warm-up skipped.
    assert 0.5 * m.sampling_s / 0.1 <= c["samples"] <= (m.sampling_s + m.warmup_s) / 0.1 + 3, (c, m.sampling_s)
    assert 0 < c["sm_mhz_min"] <= c["sm_mhz_median"] <= c["max_sm_mhz"] * 1.01, c
    assert set(c["throttle_reasons"]) <= {"sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal",
                                          "hw_power_brake"}
    pynvml = pytest.importorskip("pynvml")  # an independent reading of the same device
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{torch.cuda.get_device_properties(m.device).uuid}")
    assert c["max_sm_mhz"] == pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)
    paired = gpuopt.compare(big_matmul, big_matmul, mode="latency", max_time_s=1.0, min_time_s=0.5)
    assert paired.baseline_measurement.clocks["samples"] >= 3
    assert measure(big_matmul, mode="latency", max_time_s=0.3, monitor=False).clocks is None


@pytest.mark.parametrize("kind", ["measure", "compare"])
def test_no_python_thread_runs_beside_a_latency_measurement(kind, big_copy):
    _nvml_monitor_active()  # the clock monitor runs, as a C++ thread
    before = {t.ident for t in threading.enumerate()}
    seen = []

    def fn():
        seen.append({t.ident for t in threading.enumerate()})
        big_copy()

    if kind == "measure":
        clocks = measure(fn, mode="latency", max_time_s=0.5).clocks
    else:
        clocks = gpuopt.compare(fn, fn, mode="latency", max_time_s=0.5).baseline_measurement.clocks
    assert clocks is not None and clocks["samples"] >= 1
    assert len(seen) > 20 and all(s == before for s in seen)


def test_the_gil_is_held_across_the_latency_loop():
    # As the host-mode test in test_timing.py, through the device loop (events, synchronization):
    # a builtin that runs no bytecode shuts another Python thread out for the whole loop.
    stamps: list[float] = []
    stop = threading.Event()

    def stamp():
        while not stop.is_set():
            stamps.append(time.perf_counter())

    t = threading.Thread(target=stamp, daemon=True)
    t.start()
    while len(stamps) < 1000:
        time.sleep(0.001)
    try:
        # min_time_s: the events time no GPU work, so the interval is exact at once and would stop the loop
        m = measure(functools.partial(sum, range(20000)), mode="latency", target_rel_ci=1e-6, min_time_s=0.3,
                    max_time_s=0.3, warmup=1, warmup_s=0)
    finally:
        stop.set()
        t.join(timeout=10)
    assert m.sampling_s >= 0.3 and m.n > 100
    assert float(np.diff(stamps).max()) >= m.sampling_s


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


def test_host_mode_on_the_cpu_runs_beside_visible_gpus():
    # device="cpu" times the CPU alone: no device guard and no synchronize of a GPU (it raised IndexError for
    # device -1 on a machine with GPUs, failing CPU ranks of gpuopt.dist and CPU benchmarks there).
    m = gpuopt.measure(lambda: sum(range(1000)), mode="host", device="cpu", max_time_s=0.05, min_time_s=0.0)
    assert m.n >= 1 and m.mode == "host"
    res = gpuopt.benchmark("tiny-cnn", batch_sizes=[2], device="cpu", modes=["host"], max_time_s=0.05, min_time_s=0.0,
                           progress=False)
    assert not res.failed and res.device == "CPU" and {r.device for r in res.rows} == {"cpu"}
    assert all(r.measurement.device is None for r in res.rows)  # measured on the CPU, not on cuda:0
