"""Regression checks of a measurement against its baseline: which statistics, their change with a
bootstrap interval and gpuopt's verdict from the C++ statistics, and the threshold syntax of
--gpuopt-compare-fail."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .._ext import _C
from ..timing.calibration import RunToRun
from ..timing.measurement import Measurement, format_ms

CONFIDENCE = 0.95  # of the intervals shown; resamples, seed and min_effect are gpuopt's defaults
# --gpuopt-compare-fail statistics -> the quantile bootstrapped (mean: the median's bootstrap).
STATISTICS = {"median": 0.5, "p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99, "mean": None}
_PERCENT = re.compile(r"(\d+(?:\.\d*)?|\.\d+)%")


def parse_thresholds(text: str) -> dict[str, float]:
    """``"median:10%,p95:15%"`` -> ``{"median": 0.10, "p95": 0.15}`` (p50 is the median); ValueError
    naming the entry and what is allowed otherwise."""
    out: dict[str, float] = {}
    for entry in (e.strip() for e in text.split(",")):
        stat, sep, value = (s.strip() for s in entry.partition(":"))
        if not sep:
            raise ValueError(f"entry {entry!r} must look like STAT:PERCENT%, e.g. median:10%")
        if stat.lower() not in STATISTICS:
            raise ValueError(f"unknown statistic {stat!r} in {entry!r}; allowed: {', '.join(STATISTICS)}")
        key = "median" if stat.lower() == "p50" else stat.lower()
        if key in out:
            raise ValueError(f"{entry!r} sets {key} a second time (p50 is the median)")
        m = _PERCENT.fullmatch(value)
        if m is None:
            raise ValueError(f"malformed percentage {value!r} for {stat}: write a number >= 0 followed by %, "
                             "e.g. 10%")
        out[key] = float(m.group(1)) / 100.0
    return out


@dataclass
class Check:
    """One statistic of a measurement against its baseline; change > 0 means slower."""

    stat: str
    baseline_ms: float
    current_ms: float
    change: float
    ci: tuple[float, float] | None  # of the change; None for the mean (its verdict is the median's)
    verdict: str  # gpuopt's verdict on the candidate: "faster", "slower" or "no significant difference"
    limit: float | None = None

    @property
    def significant(self) -> bool:
        """Slower by at least gpuopt's min_effect, with the bootstrap's confidence."""
        return self.verdict == "slower"

    @property
    def failed(self) -> bool:
        return self.limit is not None and self.significant and self.change > self.limit

    def describe(self) -> str:
        ci = f" [{CONFIDENCE:.0%} CI {self.ci[0]:+.1%} .. {self.ci[1]:+.1%}]" if self.ci else ""
        limit = "" if self.limit is None else f", limit {self.limit:.0%}"
        return (f"{self.stat} {self.change:+.1%}{ci}{limit}: {format_ms(self.baseline_ms)} -> "
                f"{format_ms(self.current_ms)}")

    def to_dict(self) -> dict[str, Any]:
        return {"stat": self.stat, "baseline_ms": self.baseline_ms, "current_ms": self.current_ms,
                "change": self.change, "ci": list(self.ci) if self.ci else None, "verdict": self.verdict,
                "significant": self.significant, "limit": self.limit, "failed": self.failed}


def regression_checks(base: Measurement, cur: Measurement, thresholds: dict[str, float],
                      run_to_run: RunToRun | None = None) -> list[Check]:
    """The median (always) and every thresholded statistic of ``cur`` against ``base``, each judged by
    gpuopt's one verdict (``_C.compare_samples``: the bootstrap interval and ``min_effect``, as
    :func:`gpuopt.compare` judges). A baseline is another run: the verdict is also widened by the
    run-to-run band (the baseline's A/A calibration, else :meth:`RunToRun.default`)."""
    band = (run_to_run or RunToRun.default(base)).rel
    checks: list[Check] = []
    verdicts: dict[float, dict[str, Any]] = {}
    for stat in dict.fromkeys(["median", *thresholds]):
        q = STATISTICS[stat]
        if q is None:
            b, c = base.mean, cur.mean
            change, ci, verdict = c / b - 1.0, None, verdicts[0.5]["verdict"]
        else:
            v = verdicts[q] = _C.compare_samples(base.samples_ms, cur.samples_ms, confidence=CONFIDENCE, q=q,
                                                 noise_floor_rel=band)
            b = _C.quantile(base.samples_ms, q)
            c = _C.quantile(cur.samples_ms, q)
            # The ratio is a speedup (base / current); its inverse minus one is the change in time.
            change, ci, verdict = 1.0 / v["ratio"] - 1.0, (1.0 / v["hi"] - 1.0, 1.0 / v["lo"] - 1.0), v["verdict"]
        checks.append(Check(stat, b, c, change, ci, verdict, thresholds.get(stat)))
    return checks
