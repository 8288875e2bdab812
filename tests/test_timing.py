"""gpuopt.measure / Measurement / compare on the host (runs everywhere, CI included)."""

from __future__ import annotations

import ast
import functools
import inspect
import json
import re
import threading
import time

import numpy as np
import pytest
import torch

import gpuopt
from gpuopt import Measurement, compare, measure
from gpuopt._ext import _C
from gpuopt.timing.measurement import _MEASURE_DEFAULTS


def busy(ms: float):
    """A deterministic host workload: spin for `ms` (sleep overshoots too much to test against)."""
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


def test_host_mode_times_the_call():
    m = measure(lambda: busy(2.0), mode="host", max_time_s=2.0, warmup=1, warmup_s=0)
    assert m.mode == "host"
    assert 1.95 <= m.p50 <= 4.0, m
    assert m.min <= m.p25 <= m.p50 <= m.p75 <= m.p90 <= m.p95 <= m.p99 <= m.max
    assert m.ci95[0] <= m.p50 <= m.ci95[1]
    assert m.n == len(m.samples_ms) == len(m.enqueue_ms)
    assert m.enqueue["p50"] <= m.p50 + 1e-6


def test_fixed_iters_take_exactly_that_many_samples():
    m = measure(lambda: None, mode="host", iters=25, warmup=2, warmup_s=0)
    assert m.n == 25 and m.stop_reason == "iters" and m.warmup_iters == 2


def test_adaptive_stop_meets_the_target():
    m = measure(lambda: busy(0.2), mode="host", target_rel_ci=0.05, max_time_s=5.0)
    assert m.stop_reason == "target" and m.target_met
    assert m.ci_rel <= 0.05


def test_min_time_keeps_sampling_past_an_early_target():
    m = measure(lambda: busy(0.1), mode="host", target_rel_ci=0.5, min_time_s=0.3)
    assert m.stop_reason == "target" and m.sampling_s >= 0.3


def test_time_budget_stops_and_says_the_target_was_missed():
    rng = np.random.default_rng(0)
    m = measure(lambda: busy(float(rng.uniform(0.05, 0.5))), mode="host", target_rel_ci=1e-4,
                max_time_s=0.3, warmup_s=0)
    assert m.stop_reason == "max_time" and not m.target_met
    assert any(w.startswith("target not met") for w in m.warnings)
    assert 0.3 <= m.sampling_s < 1.0


def test_warmup_by_count_and_time():
    m = measure(lambda: busy(1.0), mode="host", warmup=2, warmup_s=0.05, iters=1)
    assert m.warmup_iters > 10 and m.warmup_s >= 0.05  # far more than warmup=2: the time bound ruled
    m = measure(lambda: busy(1.0), mode="host", warmup=7, warmup_s=0.0, iters=1)
    assert m.warmup_iters == 7


def test_inputs_rotate_through_argument_sets_including_kwargs():
    seen = []
    sets = [(1,), (2, 3), {"a": 4}, torch.tensor(5.0)]

    def fn(*args, **kwargs):
        seen.append((args, kwargs))

    measure(fn, mode="host", inputs=sets, iters=6, warmup=2, warmup_s=0)
    expected = [((1,), {}), ((2, 3), {}), ((), {"a": 4})]
    assert seen[:3] == expected
    assert len(seen) == 8 and seen[4:7] == expected  # warm-up and samples share one rotation
    assert float(seen[3][0][0]) == 5.0


def test_exception_in_fn_propagates_with_its_type_and_leaves_the_timer_usable():
    class Boom(Exception):
        pass

    calls = []

    def fn():
        calls.append(1)
        if len(calls) == 3:
            raise Boom("raised inside fn")

    with pytest.raises(Boom, match="raised inside fn"):
        measure(fn, mode="host", iters=10, warmup=1, warmup_s=0)
    assert measure(lambda: None, mode="host", iters=3).n == 3


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        ({"iters": 0}, ValueError, "iters must be a positive count"),
        ({"iters": -4}, ValueError, "got -4"),
        ({"mode": "fastest"}, ValueError, 'mode must be one of "latency", "throughput", "graph", "host"; got "fastest"'),
        ({"mode": 3}, TypeError, "mode must be a string"),
        ({"target_rel_ci": 0.0}, ValueError, r"target_rel_ci must be in \(0, 1\), got 0"),
        ({"target_rel_ci": 1.5}, ValueError, r"target_rel_ci must be in \(0, 1\), got 1.5"),
        ({"max_time_s": -1.0}, ValueError, "max_time_s must be a finite number of seconds > 0, got -1"),
        ({"warmup_s": -0.5}, ValueError, "warmup_s must be"),
        ({"warmup": -1}, ValueError, "warmup must be >= 0 calls, got -1"),
        ({"min_iters": 0}, ValueError, "min_iters must be >= 1"),
        ({"max_iters": 3, "min_iters": 5}, ValueError, "max_iters must be >= min_iters"),
        ({"confidence": 1.0}, ValueError, "confidence must be in"),
        ({"inputs": []}, ValueError, "inputs must hold at least one argument set"),
        ({"inputs": 5}, TypeError, "inputs must be a list"),
        ({"flush_l2": "yes"}, TypeError, "flush_l2 must be True or False"),
        ({"flush_l2": True, "mode": "host"}, ValueError, 'flush_l2=True applies to mode="latency" or "graph"'),
        ({"calls_per_sample": 0, "mode": "throughput"}, ValueError, "calls_per_sample must be >= 1"),
        ({"calls_per_sample": 4, "mode": "host"}, ValueError, "calls_per_sample applies to"),
        ({"device": 1.5}, TypeError, "device must be"),
        ({"device": "mps"}, ValueError, "device must be a CUDA device"),
        ({"min_time_s": 20.0}, ValueError, r"min_time_s must be in \[0, max_time_s=10\]"),
        ({"itres": 5}, TypeError, "unknown measure option.*itres"),
    ],
)
def test_bad_arguments_name_the_parameter(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        measure(lambda: None, **kwargs)


def test_non_callable_is_a_type_error():
    with pytest.raises(TypeError, match="fn must be callable, got int"):
        measure(42)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
@pytest.mark.parametrize("mode", ["latency", "throughput", "graph"])
def test_device_modes_without_cuda_name_the_missing_device(mode):
    with pytest.raises(ValueError, match=f'mode="{mode}" needs a CUDA'):
        measure(lambda: None, mode=mode)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only default")
def test_default_mode_without_cuda_is_host():
    assert measure(lambda: None, iters=3).mode == "host"


@pytest.mark.filterwarnings("ignore:`torch.jit.trace.*is deprecated:FutureWarning")
def test_torchscript_module_is_timed_in_cpp(monkeypatch):
    used = []
    real = gpuopt._ext._C.measure_script

    def spy(*args):
        used.append(True)
        return real(*args)

    monkeypatch.setattr(gpuopt._ext._C, "measure_script", spy)
    module = torch.jit.trace(torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU()), torch.randn(4, 32))
    m = measure(module, mode="host", inputs=[torch.randn(8, 32), torch.randn(8, 32)], iters=20)
    assert used and m.n == 20 and m.p50 > 0


def test_measurement_round_trips_through_json():
    m = measure(lambda: busy(0.1), mode="host", iters=12, label="spin")
    d = json.loads(json.dumps(m.to_dict()))
    assert d["schema_version"] == 1
    back = Measurement.from_dict(d)
    assert back == m
    assert "spin: host on " in repr(m) and "median" in repr(m)
    assert "<table>" in m._repr_html_()


def test_newer_schema_is_refused_clearly():
    d = Measurement.from_samples([1.0, 2.0, 3.0]).to_dict()
    d["schema_version"] = 99
    with pytest.raises(ValueError, match="schema_version 99 is newer"):
        Measurement.from_dict(d)


def test_from_samples_computes_gpuopt_statistics():
    x = np.random.default_rng(3).lognormal(0.0, 0.1, 500)
    m = Measurement.from_samples(x.tolist())
    assert m.p50 == pytest.approx(np.median(x))
    assert m.p99 == pytest.approx(np.percentile(x, 99))
    assert m.std == pytest.approx(np.std(x, ddof=1))
    assert m.cv == pytest.approx(np.std(x, ddof=1) / np.mean(x))


def _pair(rng, n, ratio, sigma=0.05):
    a = rng.lognormal(np.log(ratio), sigma, n)
    b = rng.lognormal(0.0, sigma, n)
    return Measurement.from_samples(a.tolist()), Measurement.from_samples(b.tolist())


def test_compare_calibration_identical_distributions():
    rng = np.random.default_rng(11)
    trials = 200
    false_pos = sum(compare(*_pair(rng, 150, 1.0), min_effect=0.0, resamples=1000).significant for _ in range(trials))
    # A 95% interval should exclude 1 about 5% of the time; 200 trials have a standard error of 1.5%.
    assert false_pos / trials <= 0.09
    rng = np.random.default_rng(11)  # the same pairs again: min_effect can only remove verdicts
    with_effect = sum(compare(*_pair(rng, 150, 1.0), resamples=1000).significant for _ in range(trials))
    assert with_effect <= false_pos


def test_compare_detects_a_five_percent_difference_both_ways():
    rng = np.random.default_rng(12)
    faster = [compare(*_pair(rng, 150, 1.05), resamples=1000) for _ in range(50)]
    assert sum(c.verdict == "faster" for c in faster) >= 48
    assert all(c.ci[0] <= c.speedup <= c.ci[1] for c in faster)
    assert np.median([c.speedup for c in faster]) == pytest.approx(1.05, rel=0.01)
    slower = compare(*reversed(_pair(rng, 150, 1.05)), resamples=1000)
    assert slower.verdict == "slower" and slower.speedup == pytest.approx(1 / 1.05, rel=0.02)


def test_a_swapped_comparison_is_the_comparison_the_other_way_round():
    rng = np.random.default_rng(13)
    a, b = _pair(rng, 150, 1.05)
    ab, ba = compare(a, b, labels=("a", "b"), resamples=2000), compare(b, a, labels=("b", "a"), resamples=2000)
    s = ab.swapped()
    assert ab.verdict == "faster" and s.verdict == ba.verdict == "slower"
    assert s.speedup == pytest.approx(ba.speedup, rel=1e-12) and s.speedup == pytest.approx(1 / ab.speedup)
    assert s.ci == pytest.approx((1 / ab.ci[1], 1 / ab.ci[0])) and s.ci[0] <= s.speedup <= s.ci[1]
    assert s.ci == pytest.approx(ba.ci, rel=0.02)  # the other way round bootstraps the same ratio, inverted
    assert (s.baseline_label, s.candidate_label, s.baseline_ms, s.candidate_ms) == \
        ("b", "a", ab.candidate_ms, ab.baseline_ms)
    back = s.swapped()
    assert (back.verdict, back.baseline_label, back.candidate_ms) == (ab.verdict, ab.baseline_label, ab.candidate_ms)
    assert back.speedup == pytest.approx(ab.speedup, rel=1e-12) and back.ci == pytest.approx(ab.ci, rel=1e-12)


def test_interleaved_compare_of_callables():
    c = compare(lambda: busy(0.3), lambda: busy(0.2), mode="host", max_time_s=1.0, labels=("slow", "fast"))
    assert c.interleaved and c.verdict == "faster" and c.speedup == pytest.approx(1.5, rel=0.1)
    assert c.baseline_measurement.label == "slow" and c.candidate_measurement.n == c.baseline_measurement.n
    assert "interleaved" in str(c)
    same = compare(lambda: busy(0.2), lambda: busy(0.2), mode="host", max_time_s=1.0)
    assert same.verdict == "no significant difference" and same.speedup == pytest.approx(1.0, abs=0.01)


def test_interleaved_compare_cancels_drift_that_fools_separate_runs():
    # A host workload that slows down over time (like a GPU heating up): measured separately, the
    # second run looks slower; measured interleaved, the two identical workloads tie.
    start = time.perf_counter()

    def drifting():
        busy(0.1 * (1.0 + 5.0 * (time.perf_counter() - start)))

    a = measure(drifting, mode="host", iters=300, warmup=0, warmup_s=0)
    b = measure(drifting, mode="host", iters=300, warmup=0, warmup_s=0)
    assert compare(a, b).verdict == "slower"
    paired = compare(drifting, drifting, mode="host", iters=300, warmup=0, warmup_s=0)
    assert paired.verdict == "no significant difference", paired


def test_compare_round_trips_and_rejects_bad_input():
    a = Measurement.from_samples([1.0, 1.1, 0.9] * 10, label="a")
    c = compare(a, a)
    assert c.verdict == "no significant difference" and "a vs a" in str(c)
    assert type(c).from_dict(json.loads(json.dumps(c.to_dict()))) == c
    with pytest.raises(TypeError, match="candidate must be a gpuopt.Measurement or a callable"):
        compare(a, [1.0])
    with pytest.raises(TypeError, match="both be Measurements or both be callables"):
        compare(a, lambda: None)
    with pytest.raises(TypeError, match="apply only when comparing two callables"):
        compare(a, a, mode="host")
    with pytest.raises(ValueError, match="interleaved comparisons support"):
        compare(lambda: None, lambda: None, mode="throughput")
    with pytest.raises(ValueError, match=r"min_effect=2 must be a fraction in \[0, 1\) \(0.05 means 5%\)"):
        compare(a, a, min_effect=2)
    with pytest.raises(TypeError, match="min_effect must be a number"):
        compare(a, a, min_effect="5%")


def test_measure_defaults_are_defined_once_in_cpp():
    native = _C.measure_defaults()
    python_only = {"mode": None, "inputs": None, "device": None, "monitor": True, "energy": True}
    assert {k: v for k, v in _MEASURE_DEFAULTS.items() if k not in python_only} == native
    assert {k: _MEASURE_DEFAULTS[k] for k in python_only} == python_only
    # The defaults measure()'s docstring states in brackets are the C++ ones.
    doc = " ".join(measure.__doc__.split())
    for name, value in native.items():
        if name == "iters":  # no default count: adaptive
            assert value is None
            continue
        found = re.search(rf"``±?{name}`` \[([^\]:]+)", doc)
        assert found, f"measure() does not document the default of {name}"
        stated = found.group(1)
        assert (stated == "auto") if value is None else (ast.literal_eval(stated) == value), (name, stated, value)
    params = inspect.signature(Measurement.from_samples).parameters
    assert params["confidence"].default == native["confidence"]
    assert params["target_rel_ci"].default == native["target_rel_ci"]
    params = inspect.signature(compare).parameters
    for name, value in _C.compare_defaults().items():
        if name.startswith("run_to_run_rel_"):  # RunToRun.default's bands (README: 3% GPU, 5% host), not parameters
            assert value == {"run_to_run_rel_gpu": 0.03, "run_to_run_rel_host": 0.05}[name]
        elif name != "seed":  # compare(seed=None) means the C++ default seed
            assert params[name].default == value, name


def test_measure_reports_the_ci_and_the_target_as_cpp_decides_them():
    m = measure(lambda: busy(0.05), mode="host", target_rel_ci=0.02, max_time_s=0.5)
    x = np.asarray(m.samples_ms)
    lo, hi = m.ci95
    assert m.ci_rel == pytest.approx(max(np.median(x) - lo, hi - np.median(x)) / np.median(x), rel=1e-12)
    s = _C.summarize(m.samples_ms, m.ci_level, m.target_rel_ci)
    assert m.target_met == s["target_met"] == (m.ci_rel <= 0.02)  # n >= 40 here: the CI is attained
    assert m.n >= 40


# Sampling for 0.3 s (an unreachable target), whatever one call costs.
_FOR_300_MS = {"mode": "host", "target_rel_ci": 1e-6, "max_time_s": 0.3, "warmup": 1, "warmup_s": 0}


def _runs(kind: str, fn):
    if kind == "measure":
        return measure(fn, **_FOR_300_MS)
    return compare(fn, fn, **_FOR_300_MS).baseline_measurement


@pytest.mark.parametrize("kind", ["measure", "compare"])
def test_measure_and_compare_start_no_python_thread(kind):
    before = {t.ident for t in threading.enumerate()}
    seen = []
    _runs(kind, lambda: seen.append({t.ident for t in threading.enumerate()}))
    assert len(seen) > 200 and all(s == before for s in seen)


def _longest_pause_of_another_thread(run) -> tuple[float, object]:
    """Runs `run()` while a Python thread stamps the time as fast as it can; returns the longest
    pause between its stamps -- the longest time it could not get the GIL -- and run's result."""
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
        result = run()
    finally:
        stop.set()
        t.join(timeout=10)
    return float(np.diff(stamps).max()), result


@pytest.mark.parametrize("kind", ["measure", "compare"])
def test_the_gil_is_held_across_the_timed_loop(kind):
    # A builtin runs no bytecode, so the interpreter never forces a switch inside it: with the GIL
    # held across the loop the other thread is shut out for all of it. Re-taken for every call (the
    # old behaviour), the GIL went to the other thread between calls, at most a few ms apart.
    fn = functools.partial(sum, range(20000))
    pause, m = _longest_pause_of_another_thread(lambda: _runs(kind, fn))
    assert m.sampling_s >= 0.3 and m.n > 100
    assert pause >= m.sampling_s, (pause, m.sampling_s)


@pytest.mark.filterwarnings("ignore:`torch.jit.trace.*is deprecated:FutureWarning")
def test_a_torchscript_module_is_timed_without_the_gil():
    module = torch.jit.trace(torch.nn.Linear(64, 64), torch.randn(8, 64))
    x = torch.randn(8, 64)
    measure(module, inputs=[x], **_FOR_300_MS)  # one-time costs (JIT optimisation) with the GIL held
    pause, m = _longest_pause_of_another_thread(lambda: measure(module, inputs=[x], **_FOR_300_MS))
    assert m.sampling_s >= 0.3 and m.n >= 20  # enough samples to see a pause (a loaded machine gives fewer)
    assert pause < 0.25 * m.sampling_s, (pause, m.sampling_s)


def test_the_clock_monitor_without_nvml_or_device_is_inactive_and_harmless():
    mon = gpuopt.timing.nvml.clock_monitor(0)
    if mon.active:
        pytest.skip("NVML and a device are present: tests/test_timing_gpu.py covers the active monitor")
    assert mon.reason  # says why: no libnvidia-ml, or no such device
    with mon:
        time.sleep(0.01)
    assert mon.summary(0.0) is None and mon.error == "" and mon.stop()
    with pytest.raises(ValueError, match="interval_ms must be a finite number of milliseconds > 0, got 0"):
        _C.ClockMonitor(0, None, 0.0)


def test_a_negative_device_index_is_refused_and_cpu_names_the_cpu():
    from gpuopt.timing.inputs import device_index

    with pytest.raises(ValueError, match=r"device must be a CUDA device index >= 0 \(or 'cpu' for the CPU alone\), got -1"):
        device_index(-1)
    with pytest.raises(ValueError, match="got -1"):
        measure(lambda: None, mode="host", device=-1, max_time_s=0.01, min_time_s=0.0)
    assert device_index("cpu") is None and device_index(torch.device("cpu")) is None
    m = measure(lambda: None, mode="host", device="cpu", max_time_s=0.01, min_time_s=0.0)
    assert m.n >= 1 and m.device is None
