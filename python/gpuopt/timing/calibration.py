"""Run-to-run spread: how far the medians of two *separate* runs of the same workload drift apart,
beyond anything one run sees. Cross-run comparisons (a baseline file, two results files) are widened
by it; an interleaved ``compare(fn_a, fn_b)`` needs none.

Measured by an A/A calibration (:func:`calibrate`: the same workloads measured in separate rounds,
their log medians' spread pooled in C++), or, where none exists, a documented conservative default
(:meth:`RunToRun.default`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .._ext import _C
from .measurement import Measurement, measure

_DEFAULTS: dict[str, Any] = _C.compare_defaults()


@dataclass(frozen=True)
class RunToRun:
    """The band ``rel`` (a fraction: 0.021 is ±2.1%) within which two separate runs of the same
    workload agree at ``confidence``, and how it was obtained (``source``)."""

    rel: float
    source: str  # "calibration" (measured here), "given" (a number the user passed) or "default"
    rounds: int | None = None
    workloads: int | None = None
    confidence: float = _DEFAULTS["confidence"]

    def __post_init__(self) -> None:
        if isinstance(self.rel, bool) or not isinstance(self.rel, (int, float)) or not 0 <= self.rel < math.inf:
            raise ValueError(f"run-to-run rel must be a finite fraction >= 0 (0.02 is 2%), got {self.rel!r}")
        if self.source not in ("calibration", "given", "default"):
            raise ValueError(f"run-to-run source must be 'calibration', 'given' or 'default', got {self.source!r}")

    @classmethod
    def default(cls, m: Measurement | None = None) -> RunToRun:
        """The band assumed without a calibration: 3% for GPU timings, 5% for host (CPU) timings
        (``_C.compare_defaults()``; separately measured A/A GEMM pairs on an H100 differed by up to
        2-3%)."""
        host = m is not None and (m.mode == "host" or m.device is None)
        return cls(_DEFAULTS["run_to_run_rel_host" if host else "run_to_run_rel_gpu"], "default")

    def describe(self) -> str:
        """e.g. ``±2.1% (A/A calibration, 5 rounds x 3 workloads)``."""
        if self.source == "default":
            return f"±{self.rel:.1%} (a default, no A/A calibration of this environment)"
        if self.source == "given":
            return f"±{self.rel:.1%} (given)"
        many = f" x {self.workloads} workloads" if self.workloads and self.workloads > 1 else ""
        return f"±{self.rel:.1%} (A/A calibration, {self.rounds} rounds{many})"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunToRun:
        if not isinstance(d, Mapping) or "rel" not in d or "source" not in d:
            raise ValueError(f"a run-to-run calibration is a dict with 'rel' and 'source', got {d!r}")
        return cls(**{k: d[k] for k in ("rel", "source", "rounds", "workloads", "confidence") if k in d})

    @classmethod
    def from_round_medians(cls, round_medians: Sequence[Sequence[float]],
                           confidence: float = _DEFAULTS["confidence"]) -> RunToRun:
        """The band of an A/A calibration from each workload's medians in separate rounds (C++)."""
        r = _C.run_to_run_spread([[float(x) for x in w] for w in round_medians], confidence)
        return cls(r["rel"], "calibration", r["rounds"], r["workloads"], confidence)


def calibrate(workloads: Callable[..., Any] | Sequence[Callable[..., Any]], *, rounds: int = 5,
              pause_s: float = 0.5, **measure_options: Any) -> RunToRun:
    """Measure the run-to-run spread of this environment: each workload measured ``rounds`` times, in
    separate :func:`measure` runs taken round by round (every workload once per round, ``pause_s``
    idle between rounds so clocks and power settle as between runs), and the spread of the medians
    pooled. A calibration of the workloads you compare is best; it sees drift between runs of one
    process (clocks, power, warm-up), not what changes across reboots or driver updates.

    >>> import gpuopt, torch
    >>> x = torch.randn(64, 64)
    >>> r = gpuopt.calibrate(lambda: x @ x, rounds=3, pause_s=0, mode="host", max_time_s=0.1)
    >>> r.source, r.rounds
    ('calibration', 3)
    """
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 3:
        raise ValueError(f"rounds must be an integer >= 3 (a spread needs a few separate runs), got {rounds!r}")
    medians = round_medians(workloads, rounds=rounds, pause_s=pause_s, **measure_options)
    return RunToRun.from_round_medians(medians, measure_options.get("confidence", _DEFAULTS["confidence"]))


def round_medians(workloads: Callable[..., Any] | Sequence[Callable[..., Any]], *, rounds: int,
                  pause_s: float = 0.5, **measure_options: Any) -> list[list[float]]:
    """Each workload's median (ms) in ``rounds`` separate :func:`measure` runs, round by round with
    ``pause_s`` idle between rounds: the measurements behind :func:`calibrate`."""
    fns = [workloads] if callable(workloads) else list(workloads)
    if not fns or not all(callable(f) for f in fns):
        raise TypeError("workloads must be a callable or a non-empty list of callables")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive integer, got {rounds!r}")
    if not (isinstance(pause_s, (int, float)) and math.isfinite(pause_s) and pause_s >= 0):
        raise ValueError(f"pause_s must be a finite number of seconds >= 0, got {pause_s!r}")
    medians: list[list[float]] = [[] for _ in fns]
    for r in range(rounds):
        if r:
            time.sleep(pause_s)
        for f, out in zip(fns, medians):
            out.append(measure(f, **measure_options).p50)
    return medians
