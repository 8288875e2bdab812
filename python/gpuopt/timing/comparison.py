"""``compare()``: how much faster one workload is than another, with a bootstrap confidence interval
and a verdict -- from two Measurements, or measured interleaved from two callables."""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

from .._ext import _C
from .calibration import RunToRun
from .measurement import Measurement, _setup, format_ms

# compare_samples()'s defaults, defined once in C++.
_DEFAULTS: dict[str, Any] = _C.compare_defaults()


@dataclass
class Comparison:
    """Speedup of ``candidate`` over ``baseline``: median(baseline) / median(candidate), with a
    percentile-bootstrap confidence interval and a verdict. For measurements from separate runs
    (``run_to_run`` given), the verdict was taken on ``judged_ci``: ``ci`` widened to the run-to-run
    band."""

    speedup: float
    ci: tuple[float, float]
    confidence: float
    verdict: str  # "faster", "slower" or "no significant difference"
    min_effect: float
    baseline_ms: float
    candidate_ms: float
    baseline_label: str | None = None
    candidate_label: str | None = None
    interleaved: bool = False  # measured A B, B A, ... and bootstrapped as pairs
    notes: list[str] = field(default_factory=list)
    run_to_run: dict[str, Any] | None = None  # RunToRun.to_dict() of a cross-run comparison
    judged_ci: tuple[float, float] | None = None  # the interval the verdict used
    # "time": speedup is median time baseline / candidate. "energy": speedup is joules per call
    # baseline / candidate (above 1: the candidate uses less energy), the verdict "less energy", "more
    # energy" or "no significant difference", and the joules per call are below.
    metric: str = "time"
    baseline_joules: float | None = None
    candidate_joules: float | None = None
    rounds: int | None = None  # an energy comparison of callables: the alternating rounds measured
    # The measurements an interleaved comparison took (None when Measurements were given; for an
    # energy comparison of callables, those of the last round).
    baseline_measurement: Measurement | None = field(default=None, repr=False, compare=False)
    candidate_measurement: Measurement | None = field(default=None, repr=False, compare=False)

    @property
    def significant(self) -> bool:
        return self.verdict != "no significant difference"

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self) if not f.name.endswith("_measurement")}
        d["ci"] = list(self.ci)
        d["judged_ci"] = list(self.judged_ci) if self.judged_ci else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Comparison:
        kwargs = {k: v for k, v in d.items() if k in {f.name for f in fields(cls)}}
        kwargs["ci"] = tuple(kwargs["ci"])
        if kwargs.get("judged_ci"):
            kwargs["judged_ci"] = tuple(kwargs["judged_ci"])
        return cls(**kwargs)

    def swapped(self) -> Comparison:
        """The same comparison with baseline and candidate exchanged: the speedup and its intervals
        inverted (a percentile interval of a ratio inverts exactly), the verdict turned round."""
        flip = {"faster": "slower", "slower": "faster", "less energy": "more energy", "more energy": "less energy"}
        lo, hi = self.ci
        return replace(
            self, speedup=1.0 / self.speedup, ci=(1.0 / hi, 1.0 / lo), verdict=flip.get(self.verdict, self.verdict),
            baseline_ms=self.candidate_ms, candidate_ms=self.baseline_ms,
            baseline_label=self.candidate_label, candidate_label=self.baseline_label,
            judged_ci=(1.0 / self.judged_ci[1], 1.0 / self.judged_ci[0]) if self.judged_ci else None,
            baseline_joules=self.candidate_joules, candidate_joules=self.baseline_joules,
            baseline_measurement=self.candidate_measurement, candidate_measurement=self.baseline_measurement,
            notes=list(self.notes))

    @property
    def cross_run_note(self) -> str | None:
        """``cross-run comparison: widened by run-to-run spread ±2.1% (A/A calibration, 5 rounds)``,
        or None for a comparison within one run."""
        if self.run_to_run is None:
            return None
        return f"cross-run comparison: widened by run-to-run spread {RunToRun.from_dict(self.run_to_run).describe()}"

    def __str__(self) -> str:
        a = self.baseline_label or "baseline"
        b = self.candidate_label or "candidate"
        if self.metric == "energy":
            how = f", {self.rounds} alternating rounds" if self.rounds else ""
            text = (f"{b} vs {a}: {self.speedup:.3f}x fewer joules per call [{self.confidence:.0%} CI "
                    f"{self.ci[0]:.3f} .. {self.ci[1]:.3f}] -> {self.verdict} ({_joules(self.baseline_joules)} -> "
                    f"{_joules(self.candidate_joules)} per call{how})")
            return "\n".join([text, *self.notes])
        how = ", interleaved" if self.interleaved else ""
        text = (f"{b} vs {a}: {self.speedup:.3f}x [{self.confidence:.0%} CI {self.ci[0]:.3f} .. "
                f"{self.ci[1]:.3f}] -> {self.verdict} ({format_ms(self.baseline_ms)} -> "
                f"{format_ms(self.candidate_ms)}{how})")
        return "\n".join([text, *([self.cross_run_note] if self.run_to_run else []), *self.notes])

    __repr__ = __str__

    def _repr_html_(self) -> str:
        """Jupyter's view: the two medians, the speedup with its interval, and the verdict."""
        import html

        a = html.escape(self.baseline_label or "baseline")
        b = html.escape(self.candidate_label or "candidate")
        color = {"faster": "green", "slower": "firebrick", "less energy": "green",
                 "more energy": "firebrick"}.get(self.verdict, "grey")
        if self.metric == "energy":
            return (f"<pre>{html.escape(str(self))}</pre>"
                    f"<span style='color:{color}'><b>{html.escape(self.verdict)}</b></span>")
        how = "measured interleaved" if self.interleaved else "two separate measurements"
        notes = "".join(f"<br><i>{html.escape(n)}</i>" for n in self.notes)
        return (
            "<table><tr><th></th><th>median</th></tr>"
            f"<tr><td>{a} (baseline)</td><td>{format_ms(self.baseline_ms)}</td></tr>"
            f"<tr><td>{b}</td><td>{format_ms(self.candidate_ms)}</td></tr>"
            f"<tr><td>speedup</td><td><b>{self.speedup:.3f}x</b> [{self.ci[0]:.3f}, {self.ci[1]:.3f}] "
            f"({self.confidence:.0%} CI)</td></tr>"
            f"<tr><td>verdict</td><td style='color:{color}'><b>{html.escape(self.verdict)}</b> "
            f"(min effect {self.min_effect:.0%}; {how})</td></tr></table>{notes}")


def _joules(j: float | None) -> str:
    if j is None:
        return "n/a"
    return f"{j * 1e3:.4g} mJ" if j < 1 else f"{j:.4g} J"


METRICS = ("time", "energy")
ENERGY_ROUNDS = 8  # the fewest alternating rounds whose paired interval attains 95% with room to spare


def check_min_effect(min_effect: Any, name: str = "min_effect") -> float:
    """``min_effect`` is a fraction everywhere in gpuopt (compare(), the CLI's --min-effect, the pytest
    plugin): 0.05 means 5%. Checked again in C++; here so that a bad value -- a percentage such as
    5 -- fails before anything is measured, saying which form is expected."""
    if isinstance(min_effect, bool) or not isinstance(min_effect, (int, float)):
        raise TypeError(f"{name} must be a number, a fraction in [0, 1) (0.05 means 5%), got {min_effect!r}")
    if not 0 <= min_effect < 1:
        raise ValueError(f"{name}={min_effect:g} must be a fraction in [0, 1) (0.05 means 5%)")
    return float(min_effect)


def compare(
    baseline: Measurement | Callable[..., Any],
    candidate: Measurement | Callable[..., Any],
    *,
    confidence: float = _DEFAULTS["confidence"],
    resamples: int = _DEFAULTS["resamples"],
    min_effect: float = _DEFAULTS["min_effect"],
    seed: int | None = None,
    labels: tuple[str, str] | None = None,
    run_to_run: RunToRun | float | None = None,
    metric: str = "time",
    rounds: int | None = None,
    **measure_options: Any,
) -> Comparison:
    """How much faster ``candidate`` is than ``baseline``, with a bootstrap confidence interval.

    Given two :class:`Measurement` objects, their samples are block-bootstrapped independently, each
    in the batches its own interval used (correlated samples are resampled together), and the
    interval is never narrower than the two medians' own intervals allow.
    Given two callables, they are measured *interleaved* (A B, B A, ... sample by sample, with
    ``measure_options`` as in :func:`measure`; modes latency, graph, host) and bootstrapped as
    pairs: drift of the GPU's clocks between runs, which no single run can see, then cancels. Prefer
    callables whenever both workloads are at hand.

    The verdict is "faster" when the interval lies above 1 and the speedup is at least
    ``1 + min_effect``; "slower" when it lies below 1 and the slowdown is at least as large;
    otherwise "no significant difference" (also when a measurement has too few samples for an
    interval at ``confidence``). ``min_effect`` (a fraction: default 0.01, 1%) keeps differences
    smaller than GPU timings reproduce from being reported as speedups.

    Measurements from *separate runs* (a saved baseline, two results files) also differ by the drift
    between runs that neither run sees: pass ``run_to_run`` (a :class:`RunToRun` from
    :func:`gpuopt.calibrate`, ``RunToRun.default(m)``, or a fraction such as 0.02), and a difference is
    significant only if it also exceeds that band. The bootstrap and the verdict are
    gpuopt's one implementation in C++ (``compare_samples``), shared with ``Results.speedups`` and
    the pytest plugin.

    ``metric="energy"`` compares joules per call (NVML's energy counter, see :func:`measure`): the
    ratio baseline / candidate, above 1 when the candidate uses less energy, and the verdict "less
    energy", "more energy" or "no significant difference". The counter gives one reading per timed
    region, so two callables are measured in ``rounds`` [8] alternating rounds (A B, B A, ...; each a
    full :func:`measure` of at least ``min_energy_s``) and the rounds' joules per call are bootstrapped
    as pairs. Two Measurements hold one reading each: the ratio is given, but no interval and so no
    significant difference. Energy needs a GPU with NVML: elsewhere a ValueError says why.

    >>> import gpuopt, torch
    >>> x = torch.randn(128, 128)
    >>> gpuopt.compare(lambda: x @ x, lambda: x @ x, mode="host", max_time_s=0.3).verdict
    'no significant difference'
    """
    check_min_effect(min_effect)
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
    if rounds is not None and metric != "energy":
        raise TypeError("rounds applies to metric='energy' (alternating measurements of two callables)")
    if labels is not None and not (isinstance(labels, (tuple, list)) and len(labels) == 2):
        raise TypeError(f"labels must be a pair of strings (baseline, candidate), got {labels!r}")
    kinds = [isinstance(x, Measurement) for x in (baseline, candidate)]
    funcs = [callable(x) and not k for x, k in zip((baseline, candidate), kinds)]
    if (kinds[0] and funcs[1]) or (funcs[0] and kinds[1]):
        raise TypeError("baseline and candidate must both be Measurements or both be callables")
    pair = all(funcs)
    if isinstance(run_to_run, (int, float)) and not isinstance(run_to_run, bool):
        run_to_run = RunToRun(float(run_to_run), "given")
    if run_to_run is not None and not isinstance(run_to_run, RunToRun):
        raise TypeError(f"run_to_run must be a gpuopt.RunToRun, a fraction or None, got {type(run_to_run).__name__}")
    if run_to_run is not None and pair:
        raise TypeError("run_to_run applies to Measurements from separate runs; an interleaved compare of two "
                        "callables sees the same drift in both and needs none")
    if metric == "energy":
        if run_to_run is not None:
            raise TypeError("run_to_run applies to time; an energy comparison of Measurements has no interval")
        return _compare_energy(baseline, candidate, pair, labels, confidence=confidence, resamples=resamples,
                               min_effect=min_effect, seed=seed, rounds=rounds, measure_options=measure_options)
    if pair:
        run = _setup(measure_options)
        with run.monitor or contextlib.nullcontext():
            raw = _C.measure_pair(baseline, candidate, run.calls, run.options)
        la, lb = labels or ("baseline", "candidate")
        baseline, candidate = run.measurement(raw["a"], la), run.measurement(raw["b"], lb)
    else:
        if measure_options:
            raise TypeError(f"measure options ({', '.join(sorted(measure_options))}) apply only when "
                            "comparing two callables")
        for name, m in (("baseline", baseline), ("candidate", candidate)):
            if not isinstance(m, Measurement):
                raise TypeError(f"{name} must be a gpuopt.Measurement or a callable, got {type(m).__name__}")
    r = _C.compare_samples(baseline.samples_ms, candidate.samples_ms, confidence=confidence,
                           resamples=resamples, seed=_DEFAULTS["seed"] if seed is None else seed,
                           paired=pair, min_effect=min_effect,
                           noise_floor_rel=run_to_run.rel if run_to_run is not None else 0.0)
    notes = []
    if not r["attained"]:
        notes.append(f"too few samples for a {confidence:.0%} interval (baseline {baseline.ci_text()}, candidate "
                     f"{candidate.ci_text()}): no difference is called significant")
    if baseline.mode != candidate.mode:
        notes.append(f"modes differ: baseline {baseline.mode}, candidate {candidate.mode}")
    if baseline.device_name != candidate.device_name:
        notes.append(f"devices differ: {baseline.device_name} vs {candidate.device_name}")
    return Comparison(
        speedup=r["ratio"], ci=(r["lo"], r["hi"]), confidence=confidence, verdict=r["verdict"],
        min_effect=min_effect,
        run_to_run=run_to_run.to_dict() if run_to_run is not None else None,
        judged_ci=(r["judged_lo"], r["judged_hi"]) if run_to_run is not None else None,
        baseline_ms=baseline.p50, candidate_ms=candidate.p50,
        baseline_label=labels[0] if labels else baseline.label,
        candidate_label=labels[1] if labels else candidate.label, interleaved=pair, notes=notes,
        baseline_measurement=baseline if pair else None, candidate_measurement=candidate if pair else None,
    )


def _energy_per_call(m: Measurement, name: str) -> float:
    e = m.energy or {}
    j = e.get("joules_per_call")
    if j is None:
        why = e.get("reason") or ("it was measured without energy (energy=False, off the GPU, or before gpuopt "
                                  "measured energy)")
        raise ValueError(f"metric='energy': the {name} has no energy reading: {why}")
    return float(j)


def _compare_energy(baseline: Any, candidate: Any, pair: bool, labels: tuple[str, str] | None, *,
                    confidence: float, resamples: int, min_effect: float, seed: int | None, rounds: int | None,
                    measure_options: dict[str, Any]) -> Comparison:
    from .measurement import measure

    notes: list[str] = []
    if pair:
        if rounds is None:
            rounds = ENERGY_ROUNDS
        if isinstance(rounds, bool) or not isinstance(rounds, int) or not 2 <= rounds <= 1000:
            raise ValueError(f"rounds must be an integer in [2, 1000] (alternating rounds of each callable), "
                             f"got {rounds!r}")
        if measure_options.get("energy", True) is not True:
            raise ValueError("metric='energy' measures energy: energy must be True (or left out)")
        if measure_options.get("mode") == "host":
            raise ValueError("metric='energy' needs a GPU mode (latency, throughput or graph): NVML measures GPUs")
        la, lb = labels or ("baseline", "candidate")
        fns = {"a": baseline, "b": candidate}
        got: dict[str, list[Measurement]] = {"a": [], "b": []}
        for r in range(rounds):
            for key in ("ab" if r % 2 == 0 else "ba"):  # A B, B A, ...: drift within a pair cancels
                m = measure(fns[key], label=la if key == "a" else lb, **{**measure_options, "energy": True})
                _energy_per_call(m, "baseline" if key == "a" else "candidate")
                got[key].append(m)
        ja = [_energy_per_call(m, "baseline") for m in got["a"]]
        jb = [_energy_per_call(m, "candidate") for m in got["b"]]
        last_a, last_b = got["a"][-1], got["b"][-1]
        time_a = statistics.median(m.p50 for m in got["a"])
        time_b = statistics.median(m.p50 for m in got["b"])
        methods = {m.energy["method"] for m in got["a"] + got["b"]}
    else:
        if measure_options:
            raise TypeError(f"measure options ({', '.join(sorted(measure_options))}) apply only when "
                            "comparing two callables")
        if rounds is not None:
            raise TypeError("rounds applies to callables; Measurements hold one energy reading each")
        for name, m in (("baseline", baseline), ("candidate", candidate)):
            if not isinstance(m, Measurement):
                raise TypeError(f"{name} must be a gpuopt.Measurement or a callable, got {type(m).__name__}")
        ja, jb = [_energy_per_call(baseline, "baseline")], [_energy_per_call(candidate, "candidate")]
        last_a, last_b = baseline, candidate
        time_a, time_b = baseline.p50, candidate.p50
        methods = {baseline.energy["method"], candidate.energy["method"]}
        la = labels[0] if labels else baseline.label
        lb = labels[1] if labels else candidate.label
        notes.append("one energy reading per Measurement: no interval, so no difference is called significant; "
                     "compare the two callables (metric='energy') for alternating rounds")
    r = _C.compare_samples(ja, jb, confidence=confidence, resamples=resamples,
                           seed=_DEFAULTS["seed"] if seed is None else seed, paired=pair, min_effect=min_effect)
    if pair and not r["attained"]:
        notes.append(f"too few rounds ({len(ja)}) for a {confidence:.0%} interval: no difference is called "
                     "significant")
    if len(methods) > 1 or methods - {"nvml-energy-counter"}:
        notes.append(f"energy methods: {', '.join(sorted(str(x) for x in methods))}")
    if last_a.device_name != last_b.device_name:
        notes.append(f"devices differ: {last_a.device_name} vs {last_b.device_name}")
    verdict = {"faster": "less energy", "slower": "more energy"}.get(r["verdict"], r["verdict"])
    mid_a, mid_b = statistics.median(ja), statistics.median(jb)
    return Comparison(
        speedup=r["ratio"], ci=(r["lo"], r["hi"]), confidence=confidence, verdict=verdict, min_effect=min_effect,
        baseline_ms=time_a, candidate_ms=time_b, baseline_label=la, candidate_label=lb, interleaved=pair,
        notes=notes, metric="energy", baseline_joules=mid_a, candidate_joules=mid_b,
        rounds=len(ja) if pair else None,
        baseline_measurement=last_a if pair else None, candidate_measurement=last_b if pair else None,
    )
