"""Performance assertions for test suites.

A speed requirement ("fp16 stays at least 1.8x faster than fp32", "p95 under 20 ms") is only worth a
test if the test can tell a real change from noise. These assertions use gpuopt's timer and its
statistics: ``assert_faster`` demands a significant speedup, not a lucky point estimate, and every
failure message carries the numbers, the confidence interval and the environment, so a red CI job
can be read without re-running it. They work in any test runner; gpuopt's pytest plugin
(:mod:`gpuopt.pytest_plugin`) adds the ``gpuopt_bench`` fixture, baselines and a report.

Under ``pytest --gpuopt-disable`` nothing is timed: Measurements from the fixture carry
``stop_reason == "disabled"``, the timing assertions pass without checking, and callables given to
``assert_faster`` run once each. ``assert_parity`` always checks.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch

from .prepare.gate import Parity, parity
from .timing.comparison import Comparison, compare
from .timing.environment import env
from .timing.inputs import argument_sets
from .timing.measurement import Measurement, format_ms

DISABLED = "disabled"  # stop_reason of a Measurement taken with timing disabled

_timing_disabled = False  # set by the pytest plugin for the session under --gpuopt-disable


def timing_disabled() -> bool:
    """Whether timing is switched off for this session (``pytest --gpuopt-disable``)."""
    return _timing_disabled


def _set_timing_disabled(flag: bool) -> bool:
    """Switch timing off or on; returns the previous state (the plugin restores it)."""
    global _timing_disabled
    previous, _timing_disabled = _timing_disabled, bool(flag)
    return previous


def untimed(m: Measurement) -> bool:
    """Whether ``m`` was taken with timing disabled; timing assertions let such a Measurement pass."""
    return m.stop_reason == DISABLED


def _run_once(fn: Callable[..., Any], inputs: Any = None, label: str | None = None) -> Measurement:
    """Call ``fn`` once on its first argument set, host-timed: the stand-in for a measurement when
    timing is disabled, flagged so that timing assertions skip it."""
    args, kwargs = argument_sets(inputs)[0]
    t0 = time.perf_counter()
    fn(*args, **kwargs)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    m = Measurement.from_samples([(time.perf_counter() - t0) * 1e3], mode="host", stop_reason=DISABLED,
                                 target_met=False, label=label)
    m.warnings = ["timing disabled (--gpuopt-disable): one call, host-timed, not a measurement"]
    return m


def environment_line(device_name: str | None = None) -> str:
    """One line naming what a timing ran on: GPU (or CPU), driver and torch, for failure messages.

    >>> "torch " + torch.__version__ in environment_line()
    True
    """
    e = env()
    if device_name is None and e["gpus"]:
        index = torch.cuda.current_device()
        device_name = e["gpus"][index]["name"] if index < len(e["gpus"]) else e["gpus"][0]["name"]
    where = f"GPU {device_name}" if device_name else f"no GPU (CPU {e['cpu']})"
    cuda = f" (CUDA {e['torch_cuda']})" if e["torch_cuda"] else ""
    return f"env: {where}, driver {e['driver'] or 'n/a'}, torch {e['torch']}{cuda}"


def _summary(m: Measurement) -> str:
    lo, hi = m.ci95
    return (f"median {format_ms(m.p50)} [{m.ci_level:.0%} CI {format_ms(lo)} .. {format_ms(hi)}], "
            f"p95 {format_ms(m.p95)}, p99 {format_ms(m.p99)}, n={m.n}, mode {m.mode}")


def _failure(headline: str, measurements: list[tuple[str, Measurement]]) -> AssertionError:
    width = max(len(name) for name, _ in measurements)
    lines = [headline]
    for name, m in measurements:
        lines.append(f"  {name + ':':<{width + 1}} {_summary(m)}")
        lines += [f"  {'':<{width + 1}} warning: {w}" for w in m.warnings]
    device = next((m.device_name for _, m in measurements if m.device_name), None)
    lines.append("  " + environment_line(device))
    return AssertionError("\n".join(lines))


def _check_measurement(name: str, m: Any) -> None:
    if not isinstance(m, Measurement):
        raise TypeError(f"{name} must be a gpuopt.Measurement, got {type(m).__name__}")


def _positive(name: str, value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a positive number of {what}, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive number of {what}, got {value!r}")
    return float(value)


def assert_faster(
    baseline: Measurement | Callable[..., Any],
    candidate: Measurement | Callable[..., Any],
    min_speedup: float = 1.5,
    confidence: float = 0.95,
    **measure_options: Any,
) -> Comparison:
    """Assert that ``candidate`` is at least ``min_speedup`` times faster than ``baseline``.

    Both are :class:`~gpuopt.Measurement` objects or both callables. Prefer callables: they are
    measured interleaved by :func:`gpuopt.compare` (``measure_options`` as in :func:`gpuopt.measure`,
    plus compare's ``labels``, ``resamples``, ``seed``, ``min_effect``), so clock drift between two
    separate runs cannot fake or hide a speedup. The assertion passes when the speedup's point
    estimate is at least ``min_speedup`` *and* the comparison's verdict is ``"faster"`` (its
    ``confidence`` interval lies above 1). Returns the :class:`~gpuopt.Comparison`.

    >>> import time
    >>> def spin(ms):
    ...     end = time.perf_counter() + ms / 1e3
    ...     while time.perf_counter() < end:
    ...         pass
    >>> c = assert_faster(lambda: spin(0.4), lambda: spin(0.2), min_speedup=1.5, mode="host",
    ...                   max_time_s=0.3)
    >>> c.verdict
    'faster'
    """
    __tracebackhide__ = True
    if isinstance(min_speedup, bool) or not isinstance(min_speedup, (int, float)):
        raise TypeError(f"min_speedup must be a number >= 1 (baseline time / candidate time), "
                        f"got {min_speedup!r}")
    if not (math.isfinite(min_speedup) and min_speedup >= 1.0):
        raise ValueError(f"min_speedup must be a number >= 1 (baseline time / candidate time), "
                         f"got {min_speedup!r}")
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    given = [isinstance(x, Measurement) for x in (baseline, candidate)]
    for name, x, is_m in (("baseline", baseline, given[0]), ("candidate", candidate, given[1])):
        if not is_m and not callable(x):
            raise TypeError(f"{name} must be a gpuopt.Measurement or a callable, got {type(x).__name__}")
    if given[0] != given[1]:
        raise TypeError("baseline and candidate must both be Measurements or both be callables")
    pair = not given[0]
    if pair and timing_disabled():
        inputs = measure_options.get("inputs")
        baseline, candidate = _run_once(baseline, inputs, "baseline"), _run_once(candidate, inputs, "candidate")
        pair, measure_options = False, {}
    c = compare(baseline, candidate, confidence=confidence, **measure_options)
    a = c.baseline_measurement if pair else baseline
    b = c.candidate_measurement if pair else candidate
    if untimed(a) or untimed(b):
        c.verdict = "not timed"
        c.notes.append("timing disabled (--gpuopt-disable): nothing was asserted")
        c.baseline_measurement, c.candidate_measurement = a, b
        return c
    problems = []
    if c.speedup < min_speedup:
        problems.append(f"speedup {c.speedup:.3f}x is below min_speedup {min_speedup:g}x")
    if c.verdict != "faster":
        problems.append(f"verdict is {c.verdict!r}, not 'faster'")
    if problems:
        how = "interleaved" if pair else "separate measurements"
        raise _failure(
            f"candidate is not {min_speedup:g}x faster than baseline: {'; '.join(problems)}\n"
            f"  speedup {c.speedup:.3f}x [{confidence:.0%} CI {c.ci[0]:.3f}x .. {c.ci[1]:.3f}x] ({how})"
            + "".join(f"\n  note: {n}" for n in c.notes),
            [("baseline", a), ("candidate", b)],
        )
    return c


def assert_latency(
    m: Measurement, p50_ms: float | None = None, p95_ms: float | None = None, p99_ms: float | None = None
) -> Measurement:
    """Assert that ``m``'s median / p95 / p99 time per call is at most the given milliseconds.

    At least one limit is required. Returns ``m``.

    >>> m = Measurement.from_samples([1.0, 1.1, 0.9, 1.0, 1.2, 1.0])
    >>> assert_latency(m, p50_ms=2.0, p99_ms=5.0).n
    6
    """
    __tracebackhide__ = True
    _check_measurement("m", m)
    limits = {"p50_ms": p50_ms, "p95_ms": p95_ms, "p99_ms": p99_ms}
    if all(v is None for v in limits.values()):
        raise ValueError("assert_latency needs at least one limit: p50_ms, p95_ms or p99_ms "
                         "(milliseconds per call)")
    limits = {k: _positive(k, v, "milliseconds") for k, v in limits.items() if v is not None}
    if untimed(m):
        return m
    values = {"p50_ms": m.p50, "p95_ms": m.p95, "p99_ms": m.p99}
    over = [f"{k[:3]} {format_ms(values[k])} > {k}={format_ms(v)}" for k, v in limits.items() if values[k] > v]
    if over:
        raise _failure(f"latency above its limit: {'; '.join(over)}", [(m.label or "measured", m)])
    return m


def assert_throughput(m: Measurement, min_per_s: float, items_per_call: int = 1) -> float:
    """Assert that ``m`` processes at least ``min_per_s`` items per second at its median time per
    call (``items_per_call`` items each: the batch size). Returns the rate.

    >>> m = Measurement.from_samples([2.0, 2.1, 1.9, 2.0])  # ms per call
    >>> assert_throughput(m, min_per_s=10_000, items_per_call=32)
    16000.0
    """
    __tracebackhide__ = True
    _check_measurement("m", m)
    min_per_s = _positive("min_per_s", min_per_s, "items per second")
    if isinstance(items_per_call, bool) or not isinstance(items_per_call, int):
        raise TypeError(f"items_per_call must be a positive int, got {items_per_call!r}")
    if items_per_call < 1:
        raise ValueError(f"items_per_call must be a positive int, got {items_per_call!r}")
    rate = m.per_second(items_per_call)
    if untimed(m) or rate >= min_per_s:
        return rate
    lo, hi = m.ci95
    rate_lo, rate_hi = items_per_call * 1e3 / hi, (items_per_call * 1e3 / lo if lo > 0 else math.inf)
    raise _failure(
        f"throughput {rate:.4g}/s [{m.ci_level:.0%} CI {rate_lo:.4g} .. {rate_hi:.4g}/s] is below "
        f"min_per_s={min_per_s:g}/s ({items_per_call} items per call)",
        [(m.label or "measured", m)],
    )


def assert_parity(candidate: Any, reference: Any, inputs: Any, rtol: float | None = None) -> Parity:
    """Assert that ``candidate``'s outputs match ``reference``'s on ``inputs`` (:func:`gpuopt.parity`:
    relative L2 error per output within ``rtol`` or the default for the candidate's precision).

    Checked also under ``--gpuopt-disable``. Returns the :class:`~gpuopt.Parity`.

    >>> m = torch.nn.Linear(8, 4)
    >>> assert_parity(m, m, torch.randn(2, 8)).passed
    True
    """
    __tracebackhide__ = True
    p = parity(candidate, reference, inputs, rtol=rtol)
    if not p.passed:
        lines = [f"outputs differ from the reference: {p}"]
        for o in p.outputs:
            err = "n/a" if o.rel_l2 is None else f"{o.rel_l2:.3e}"
            lines.append(f"  {o.path}: relative L2 {err}, max abs {o.max_abs:.3e}"
                         f"{'' if o.finite else ', NON-FINITE values'}")
        lines.append("  " + environment_line())
        raise AssertionError("\n".join(lines))
    return p
