"""The token clock (gpuopt._C.StepClock) and the C++ token loop (gpuopt._C.TokenLoop): per-request TTFT,
end-to-end time and pooled inter-token gaps from the host clock, typed errors, and on a GPU two captured
graphs replayed from C++ with CUDA-event marks and measure_token_loop."""

from __future__ import annotations

import gc
import math
import time
import weakref

import pytest
import torch

from gpuopt._ext import _C


def _request(clock: _C.StepClock, gaps_s: list[float], first_s: float) -> None:
    """begin(), sleep first_s, mark(), then for each gap: sleep, mark()."""
    clock.begin()
    time.sleep(first_s)
    clock.mark()
    for gap in gaps_s:
        time.sleep(gap)
        clock.mark()


def test_host_clock_times_a_request():
    clock = _C.StepClock(-1, 8)
    assert clock.device == -1 and clock.max_tokens == 8 and clock.n == 0
    _request(clock, [0.010, 0.015], first_s=0.020)
    assert clock.n == 0  # still pending: collected by the next begin(), collect() or requests()
    r = clock.requests()
    assert clock.n == 1
    assert r["tokens"] == [3]
    assert r["ttft_ms"][0] >= 20.0
    assert len(r["itl_ms"]) == 2 and r["itl_ms"][0] >= 10.0 and r["itl_ms"][1] >= 15.0
    assert r["e2e_ms"][0] >= 45.0
    assert r["e2e_ms"][0] == pytest.approx(r["ttft_ms"][0] + sum(r["itl_ms"]), rel=1e-9, abs=1e-6)
    assert clock.requests() == r  # reading again changes nothing


def test_gaps_of_all_requests_are_pooled_in_order():
    clock = _C.StepClock(-1, 4)
    _request(clock, [0.040, 0.010], first_s=0.005)
    _request(clock, [0.025], first_s=0.030)  # begin() collects the first request
    assert clock.n == 1
    clock.collect()
    assert clock.n == 2
    clock.collect()  # nothing pending: a no-op
    r = clock.requests()
    assert r["tokens"] == [3, 2]
    itl = r["itl_ms"]
    assert len(itl) == 3 and itl[0] >= 40.0 and itl[1] >= 10.0 and itl[2] >= 25.0
    assert r["ttft_ms"][0] >= 5.0 and r["ttft_ms"][1] >= 30.0
    # each request's end-to-end time is its TTFT plus its own gaps, in pooled order
    assert r["e2e_ms"][0] == pytest.approx(r["ttft_ms"][0] + itl[0] + itl[1], abs=1e-6)
    assert r["e2e_ms"][1] == pytest.approx(r["ttft_ms"][1] + itl[2], abs=1e-6)


def test_more_marks_than_max_tokens_is_a_value_error():
    clock = _C.StepClock(-1, 2)
    clock.begin()
    clock.mark()
    clock.mark()
    with pytest.raises(ValueError, match="more than max_tokens=2 marks"):
        clock.mark()
    r = clock.requests()  # the request keeps the marks it had
    assert r["tokens"] == [2] and len(r["itl_ms"]) == 1


def test_mark_without_begin_is_a_runtime_error():
    clock = _C.StepClock(-1, 4)
    with pytest.raises(RuntimeError, match=r"no request begun \(call begin\(\) first\)"):
        clock.mark()
    clock.begin()
    clock.mark()
    clock.collect()
    with pytest.raises(RuntimeError, match="no request begun"):
        clock.mark()


def test_a_request_without_marks_is_nan():
    clock = _C.StepClock(-1, 4)
    clock.begin()
    clock.begin()
    clock.mark()
    r = clock.requests()
    assert r["tokens"] == [0, 1] and r["itl_ms"] == []
    assert math.isnan(r["ttft_ms"][0]) and math.isnan(r["e2e_ms"][0])
    assert r["ttft_ms"][1] >= 0 and r["e2e_ms"][1] == r["ttft_ms"][1]


def test_clear_forgets_collected_and_pending_requests():
    clock = _C.StepClock(-1, 4)
    _request(clock, [0.001], first_s=0.001)
    clock.begin()
    clock.mark()
    assert clock.n == 1
    clock.clear()
    assert clock.n == 0
    assert clock.requests() == {"ttft_ms": [], "e2e_ms": [], "tokens": [], "itl_ms": []}
    with pytest.raises(RuntimeError, match="no request begun"):
        clock.mark()  # the pending request was dropped
    _request(clock, [], first_s=0.001)
    assert clock.requests()["tokens"] == [1]


@pytest.mark.parametrize("max_tokens", [0, -3, 2**20 + 1])
def test_max_tokens_out_of_range_is_a_value_error(max_tokens):
    with pytest.raises(ValueError, match=rf"StepClock: max_tokens must be in \[1, 1048576\], got {max_tokens}"):
        _C.StepClock(-1, max_tokens)


def test_device_below_minus_one_is_a_value_error():
    with pytest.raises(ValueError, match="StepClock: device must be a CUDA device index, or -1 for the host clock"):
        _C.StepClock(-2, 4)


def _no_device_error() -> tuple[type[Exception], str]:
    """What asking for CUDA raises on this machine: a build without CUDA, or no visible device."""
    if not _C.cuda_compiled():
        return RuntimeError, "gpuopt was built without CUDA"
    return ValueError, "needs a CUDA device, and none is visible"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a machine without a GPU")
def test_device_clock_without_a_gpu_is_refused():
    error, match = _no_device_error()
    with pytest.raises(error, match=match):
        _C.StepClock(0, 4)


def test_token_loop_arguments_are_checked_first():
    with pytest.raises(ValueError, match="TokenLoop: new_tokens must be >= 1, got 0"):
        _C.TokenLoop(1, 1, 0, 0)
    with pytest.raises(ValueError, match=r"TokenLoop: prefill_exec must be an instantiated CUDA graph .* got 0"):
        _C.TokenLoop(0, 1, 0, 4)
    with pytest.raises(ValueError, match=r"TokenLoop: decode_exec must be an instantiated CUDA graph .* got 0"):
        _C.TokenLoop(1, 0, 0, 4, _C.StepClock(-1, 4))
    with pytest.raises(TypeError):
        _C.TokenLoop(-1, 1, 0, 4)  # handles are addresses


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a machine without a GPU")
def test_token_loop_without_a_gpu_is_refused():
    error, match = _no_device_error()
    with pytest.raises(error, match=match):
        _C.TokenLoop(1, 1, 0, 4)


# ---- CUDA ------------------------------------------------------------------------------------------------


def _two_graphs(x: torch.Tensor) -> tuple[torch.cuda.CUDAGraph, torch.cuda.CUDAGraph]:
    """A "prefill" graph adding 1 to x and a "decode" graph doubling it."""
    prefill, decode = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(prefill):
        x.add_(1)
    with torch.cuda.graph(decode):
        x.mul_(2)
    return prefill, decode


def _expected(start: float, new_tokens: int, requests: int) -> float:
    v = start
    for _ in range(requests):
        v = (v + 1) * 2 ** (new_tokens - 1)
    return v


def _measure_options(**overrides) -> _C.MeasureOptions:
    o = {**_C.measure_defaults(), "mode": "latency", "device": 0, "max_time_s": 0.5, **overrides}
    return _C.MeasureOptions(**o)


@pytest.mark.gpuopt_gpu
def test_token_loop_replays_the_graphs_and_marks_every_token():
    x = torch.zeros(1, device="cuda", dtype=torch.float64)
    prefill, decode = _two_graphs(x)
    x.zero_()
    n = 5
    clock = _C.StepClock(0, n)
    loop = _C.TokenLoop(prefill.raw_cuda_graph_exec(), decode.raw_cuda_graph_exec(), 0, n, clock,
                        owner=(prefill, decode))
    assert loop.device == 0 and loop.new_tokens == n
    graph = weakref.ref(prefill)
    del clock, prefill, decode
    gc.collect()  # the loop keeps its clock and its owner (the graphs it replays) alive
    assert graph() is not None
    loop.run()
    torch.cuda.synchronize()
    assert x.item() == _expected(0, n, 1) == 16
    loop.run_many(3)
    torch.cuda.synchronize()
    assert x.item() == _expected(0, n, 4)


@pytest.mark.gpuopt_gpu
def test_device_clock_reads_the_loop_requests():
    x = torch.zeros(1, device="cuda", dtype=torch.float64)
    prefill, decode = _two_graphs(x)
    n = 6
    clock = _C.StepClock(0, n)
    loop = _C.TokenLoop(prefill.raw_cuda_graph_exec(), decode.raw_cuda_graph_exec(), 0, n, clock)
    loop.run_many(3)
    r = clock.requests()
    assert clock.n == 3 and r["tokens"] == [n, n, n] and len(r["itl_ms"]) == 3 * (n - 1)
    assert all(math.isfinite(v) and v >= 0 for v in r["ttft_ms"] + r["e2e_ms"] + r["itl_ms"])
    for i in range(3):
        gaps = r["itl_ms"][i * (n - 1):(i + 1) * (n - 1)]
        assert r["e2e_ms"][i] == pytest.approx(r["ttft_ms"][i] + sum(gaps), abs=0.01)
    with pytest.raises(RuntimeError, match="capturing a CUDA graph"), torch.cuda.graph(torch.cuda.CUDAGraph()):
        clock.begin()


@pytest.mark.gpuopt_gpu
def test_token_loop_refuses_a_clock_that_does_not_fit():
    x = torch.zeros(1, device="cuda")
    prefill, decode = _two_graphs(x)
    p, d = prefill.raw_cuda_graph_exec(), decode.raw_cuda_graph_exec()
    with pytest.raises(ValueError, match="clock must time the loop's device 0"):
        _C.TokenLoop(p, d, 0, 4, _C.StepClock(-1, 4))
    with pytest.raises(ValueError, match=r"new_tokens \(5\) must be <= the clock's max_tokens \(4\)"):
        _C.TokenLoop(p, d, 0, 5, _C.StepClock(0, 4))
    with pytest.raises(IndexError, match="TokenLoop: device must be in"):
        _C.TokenLoop(p, d, torch.cuda.device_count(), 4)


@pytest.mark.gpuopt_gpu
@pytest.mark.parametrize("mode", ["latency", "throughput", "host"])
def test_measure_token_loop_returns_samples(mode):
    x = torch.zeros(1, device="cuda")
    prefill, decode = _two_graphs(x)
    loop = _C.TokenLoop(prefill.raw_cuda_graph_exec(), decode.raw_cuda_graph_exec(), 0, 4)
    raw = _C.measure_token_loop(loop, _measure_options(mode=mode))
    assert raw["mode"] == mode and raw["device"] == 0
    assert len(raw["samples_ms"]) > 0 and all(v > 0 for v in raw["samples_ms"])


@pytest.mark.gpuopt_gpu
def test_measure_token_loop_in_graph_mode_runs_or_says_why():
    # mode="graph" captures loop.run(), i.e. graph launches into another graph: where the driver
    # refuses that, the engine's capture failure is a ValueError naming the mode, and nothing hangs.
    x = torch.zeros(1, device="cuda")
    prefill, decode = _two_graphs(x)
    loop = _C.TokenLoop(prefill.raw_cuda_graph_exec(), decode.raw_cuda_graph_exec(), 0, 4)
    try:
        raw = _C.measure_token_loop(loop, _measure_options(mode="graph"))
    except ValueError as e:
        assert 'mode="graph"' in str(e)
    else:
        assert raw["mode"] == "graph" and len(raw["samples_ms"]) > 0
    loop.run()  # usable afterwards either way
    torch.cuda.synchronize()


@pytest.mark.gpuopt_gpu
def test_measure_token_loop_with_a_clock_records_every_request():
    x = torch.zeros(1, device="cuda")
    prefill, decode = _two_graphs(x)
    clock = _C.StepClock(0, 4)
    loop = _C.TokenLoop(prefill.raw_cuda_graph_exec(), decode.raw_cuda_graph_exec(), 0, 4, clock)
    raw = _C.measure_token_loop(loop, _measure_options(warmup=2, iters=10))
    r = clock.requests()
    assert len(raw["samples_ms"]) == 10
    assert clock.n == raw["warmup_iters"] + 10 and set(r["tokens"]) == {4}
    with pytest.raises(ValueError, match=r"mode=\"graph\" would capture the loop's StepClock"):
        _C.measure_token_loop(loop, _measure_options(mode="graph"))
    with pytest.raises(ValueError, match=r"options.device \(-1\) must be the loop's device \(0\)"):
        _C.measure_token_loop(loop, _measure_options(mode="host", device=-1))
