"""Truthful timing: ``measure()`` runs gpuopt's C++ sampling loop and returns a ``Measurement``;
``compare()`` puts a bootstrap confidence interval on the speedup between two measurements."""

from __future__ import annotations

import contextlib
import html
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch

from .._ext import _C
from . import nvml as _nvml
from .inputs import argument_sets, device_index

MODES = ("latency", "throughput", "graph", "host")
SCHEMA_VERSION = 1

# measure()'s defaults of the options the C++ loop takes, defined once in C++ (SamplerOptions).
_NATIVE_DEFAULTS: dict[str, Any] = _C.measure_defaults()

# Thresholds of the warnings a Measurement carries.
HIGH_CV = 0.05  # coefficient of variation above which timings are called noisy
LAUNCH_BOUND = 0.8  # host enqueue time / device time above which a workload is launch-bound
SLOW_CLOCK = 0.9  # median SM clock / max SM clock below which the GPU is called throttled


def format_ms(ms: float) -> str:
    """A duration in the unit that reads best: 4.52 us, 0.193 ms, 12.4 ms, 1.52 s."""
    if ms is None or not math.isfinite(ms):
        return str(ms)
    if ms < 1.0:
        return f"{ms * 1e3:.3g} us"
    if ms < 1000.0:
        return f"{ms:.4g} ms"
    return f"{ms / 1e3:.3g} s"


@dataclass
class Measurement:
    """Timing samples of one workload and everything needed to judge them.

    All times are milliseconds per call. ``samples_ms`` are raw samples (device time in the device
    modes, wall time in ``host`` mode); ``enqueue_ms`` the host time spent issuing each call.
    """

    mode: str
    samples_ms: list[float]
    enqueue_ms: list[float]
    n: int
    mean: float
    std: float
    min: float
    max: float
    p25: float
    p50: float
    p75: float
    p90: float
    p95: float
    p99: float
    iqr: float
    cv: float
    mad: float
    outliers: int
    ci95: tuple[float, float]
    ci_level: float  # the level the interval has: ci_requested, or the lower coverage too few samples reach
    ci_coverage: float
    ci_method: str
    ci_rel: float  # half-width of the median's CI relative to the median
    target_rel_ci: float
    target_met: bool
    stop_reason: str
    enqueue: dict[str, float]
    warmup_iters: int
    warmup_s: float
    sampling_s: float
    calls_per_sample: int
    device: int | None = None
    device_name: str | None = None
    label: str | None = None
    delay_us: float = 0.0
    delay_short: int = 0
    flush_l2_bytes: int = 0
    memory: dict[str, int | None] | None = None
    clocks: dict[str, Any] | None = None
    # The energy of the timed region (see energy_record): None for measurements made before gpuopt
    # measured energy, or from samples given by hand.
    energy: dict[str, Any] | None = None
    diagnosis: str | None = None
    warnings: list[str] = field(default_factory=list)
    ci_requested: float = _NATIVE_DEFAULTS["confidence"]  # the confidence asked for

    @property
    def median(self) -> float:
        return self.p50

    def ci_text(self) -> str:
        """The median's interval as a relative half-width, saying what coverage it has when too few
        samples gave less than the requested one: ``±1.20%``, ``±8.3% (75% CI: only 3 samples)``,
        ``no interval (1 sample)``."""
        if self.n < 2 or self.ci_level <= 0:
            return f"no interval ({self.n} sample{'s' if self.n != 1 else ''})"
        if self.ci_level < self.ci_requested:
            return f"±{self.ci_rel:.2%} ({self.ci_level * 100:.3g}% CI: only {self.n} samples)"
        return f"±{self.ci_rel:.2%}"

    def quantiles(self, q: float | Sequence[float] = (0.5, 0.2, 0.8)) -> list[float]:
        """Quantiles of the samples (ms per call) as plain floats, like triton's ``do_bench(...,
        quantiles=...)``; numpy's linear interpolation, computed in C++.

        >>> Measurement.from_samples([1.0, 2.0, 3.0, 4.0]).quantiles((0.5, 0.9))
        [2.5, 3.7]
        """
        qs = [q] if isinstance(q, (int, float)) and not isinstance(q, bool) else q
        try:
            qs = [float(x) for x in qs]
        except (TypeError, ValueError):
            raise TypeError(f"q must be a number or a sequence of numbers in [0, 1], got {q!r}") from None
        bad = [x for x in qs if not 0.0 <= x <= 1.0]
        if bad:
            raise ValueError(f"q must lie in [0, 1], got {bad[0]!r} in {q!r}")
        return [float(_C.quantile(self.samples_ms, x)) for x in qs]

    def per_second(self, items_per_call: int = 1) -> float:
        """Items per second at the median time per call."""
        return items_per_call * 1e3 / self.p50 if self.p50 > 0 else math.inf

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ci95"] = list(self.ci95)
        d["schema_version"] = SCHEMA_VERSION
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Measurement:
        version = d.get("schema_version", SCHEMA_VERSION)
        if version > SCHEMA_VERSION:
            raise ValueError(
                f"measurement schema_version {version} is newer than this gpuopt understands "
                f"({SCHEMA_VERSION}); upgrade gpuopt"
            )
        names = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in names}
        kwargs["ci95"] = tuple(kwargs["ci95"])
        if "ci_rel" not in kwargs:  # saved before ci_rel was stored
            kwargs["ci_rel"] = _C.rel_halfwidth(kwargs["p50"], *kwargs["ci95"])
        if "ci_requested" not in kwargs:  # saved when ci_level was the requested level, reached or not
            s = _C.summarize(kwargs["samples_ms"], kwargs["ci_level"], kwargs["target_rel_ci"])
            kwargs["ci_level"], kwargs["ci_requested"] = s["ci_level"], s["ci_requested"]
        return cls(**kwargs)

    @classmethod
    def from_samples(
        cls,
        samples_ms: Sequence[float],
        *,
        enqueue_ms: Sequence[float] | None = None,
        mode: str = "host",
        confidence: float = _NATIVE_DEFAULTS["confidence"],
        target_rel_ci: float = _NATIVE_DEFAULTS["target_rel_ci"],
        target_met: bool | None = None,
        stop_reason: str = "given",
        device: int | None = None,
        **meta: Any,
    ) -> Measurement:
        """A Measurement of given samples (ms per call), with gpuopt's statistics and warnings.

        ``measure()`` builds its results this way; it is also how timings taken elsewhere are
        compared with ``compare()``. ``target_met`` defaults to whether the CI meets ``target_rel_ci``
        (measure()'s stopping rule, decided in C++ like every statistic here).

        >>> m = Measurement.from_samples([1.0, 1.1, 0.9, 1.0, 1.05, 0.95])
        >>> round(m.p50, 3)
        1.0
        """
        samples = [float(x) for x in samples_ms]
        s = _C.summarize(samples, confidence, target_rel_ci)
        enqueue = [0.0] * len(samples) if enqueue_ms is None else [float(x) for x in enqueue_ms]
        if len(enqueue) != len(samples):
            raise ValueError(f"enqueue_ms must have one value per sample ({len(samples)}), got {len(enqueue)}")
        e = _C.summarize(enqueue, confidence)
        if target_met is None:
            target_met = s["target_met"]
        meta.setdefault("warmup_iters", 0)
        meta.setdefault("warmup_s", 0.0)
        meta.setdefault("sampling_s", 0.0)
        meta.setdefault("calls_per_sample", 1)
        m = cls(
            mode=mode, samples_ms=samples, enqueue_ms=enqueue,
            n=s["n"], mean=s["mean"], std=s["std"], min=s["min"], max=s["max"], p25=s["p25"], p50=s["p50"],
            p75=s["p75"], p90=s["p90"], p95=s["p95"], p99=s["p99"], iqr=s["iqr"], cv=s["cv"], mad=s["mad"],
            outliers=s["outliers"], ci95=(s["ci_lo"], s["ci_hi"]), ci_level=s["ci_level"],
            ci_requested=s["ci_requested"],
            ci_coverage=s["ci_coverage"], ci_method=s["ci_method"], ci_rel=s["ci_rel"],
            target_rel_ci=target_rel_ci, target_met=bool(target_met), stop_reason=stop_reason,
            enqueue={"p50": e["p50"], "mean": e["mean"], "p95": e["p95"], "max": e["max"]},
            device=device,
            device_name=torch.cuda.get_device_name(device) if device is not None else None,
            **meta,
        )
        m.warnings, m.diagnosis = _warnings(m, m.clocks)
        return m

    def _headline(self) -> str:
        lo, hi = self.ci95
        where = self.device_name or ("CPU" if self.device is None else f"cuda:{self.device}")
        name = f"{self.label}: " if self.label else ""
        if self.n < 2 or self.ci_level <= 0:
            ci = self.ci_text()
        else:
            short = f": only {self.n} samples" if self.ci_level < self.ci_requested else ""
            ci = f"{self.ci_level * 100:.3g}% CI {format_ms(lo)} .. {format_ms(hi)}{short}"
        return (
            f"{name}{self.mode} on {where}: median {format_ms(self.p50)} "
            f"[{ci}], p90 {format_ms(self.p90)}, "
            f"p99 {format_ms(self.p99)}, mean {format_ms(self.mean)}, cv {self.cv:.1%}, n={self.n}, "
            f"enqueue {format_ms(self.enqueue['p50'])}"
        )

    def __repr__(self) -> str:
        lines = [f"Measurement({self._headline()})"]
        lines += [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        lo, hi = self.ci95
        rows = [
            ("median", format_ms(self.p50)),
            (f"{self.ci_requested:.0%} CI of median", f"{format_ms(lo)} .. {format_ms(hi)} ({self.ci_text()})"),
            ("p90 / p95 / p99", " / ".join(format_ms(x) for x in (self.p90, self.p95, self.p99))),
            ("mean ± std", f"{format_ms(self.mean)} ± {format_ms(self.std)} (cv {self.cv:.1%})"),
            ("min / max", f"{format_ms(self.min)} / {format_ms(self.max)}"),
            ("host enqueue (median)", format_ms(self.enqueue["p50"])),
            ("samples", f"{self.n} ({self.stop_reason}; {self.outliers} MAD outliers, kept)"),
        ]
        if self.memory and self.memory.get("max_allocated_bytes") is not None:
            rows.append(("peak allocated", f"{self.memory['max_allocated_bytes'] / 2**20:.1f} MiB"))
        body = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                       for k, v in rows)
        title = html.escape(f"{self.label + ': ' if self.label else ''}{self.mode} on "
                            f"{self.device_name or 'CPU'}")
        warn = "".join(f"<li>{html.escape(w)}</li>" for w in self.warnings)
        return (f"<div><b>{title}</b><table>{body}</table>"
                + (f"<ul style='color:#a60'>{warn}</ul>" if warn else "") + "</div>")


def _resolve_mode(mode, cuda_usable: bool) -> str:
    if mode is None:
        return "latency" if cuda_usable else "host"
    if not isinstance(mode, str):
        raise TypeError(f"mode must be a string, one of {', '.join(MODES)}; got {mode!r}")
    return mode


def _warnings(m: Measurement, clocks: dict | None) -> tuple[list[str], str | None]:
    out: list[str] = []
    diagnosis = None
    if m.cv > HIGH_CV:
        what = "the GPU may be shared or throttling" if m.device is not None else "the machine may be busy"
        out.append(f"high variation: cv {m.cv:.1%} (above {HIGH_CV:.0%}); {what}, or fn does variable work")
    if not m.target_met:
        ci = m.ci_text()
        if m.ci_level >= m.ci_requested:
            what = f"the {m.ci_requested:.0%} CI of the median is {ci}, wider than target_rel_ci={m.target_rel_ci:g}"
        else:
            what = f"no {m.ci_requested:.0%} CI of the median: {ci}"
        out.append(f"target not met: {what} (stopped by {m.stop_reason} after {m.n} "
                   f"sample{'s' if m.n != 1 else ''}); raise max_time_s or max_iters for a tighter figure")
    enq = m.enqueue["p50"]
    if m.mode == "latency" and enq >= LAUNCH_BOUND * m.p50:
        diagnosis = "launch-bound"
        out.append(f"launch-bound: the host needs {format_ms(enq)} to issue work the GPU runs in "
                   f"{format_ms(m.p50)}; CUDA graphs (mode='graph', or a 'cudagraph' config) or "
                   "torch.compile(mode='reduce-overhead') remove most of that overhead")
    elif m.mode == "throughput" and enq >= 0.9 * m.p50:
        diagnosis = "launch-bound"
        out.append(f"launch-bound pipeline: issuing a call takes {format_ms(enq)} of host time and a call "
                   f"completes every {format_ms(m.p50)}: the GPU waits for the host; CUDA graphs or "
                   "torch.compile(mode='reduce-overhead') help")
    if m.delay_short > 0.05 * m.n:
        out.append(f"{m.delay_short} of {m.n} samples took the host longer to enqueue than the "
                   f"{m.delay_us:.0f} us spin queued ahead of them; those samples may include host gaps")
    if clocks:
        mx, mhz = clocks.get("max_sm_mhz"), clocks.get("sm_mhz_median")
        if mx and mhz is not None and mhz < SLOW_CLOCK * mx:
            why = ", ".join(clocks["throttle_reasons"]) or "no reason reported"
            out.append(f"SM clock ran at {mhz} MHz of {mx} MHz max during the run "
                       f"({why}); results may not reproduce at full clocks")
        if clocks.get("compute_processes", 0) > 1:
            out.append(f"{clocks['compute_processes']} processes used the GPU during the run; other work "
                       "may have disturbed these timings")
    return out, diagnosis


# Every measure() option with its default: the C++ loop's, and those only Python handles.
_MEASURE_DEFAULTS: dict[str, Any] = {
    "mode": None,  # chosen at run time: latency with a usable GPU, else host
    **_NATIVE_DEFAULTS,
    "inputs": None,
    "device": None,
    "monitor": True,
    "energy": True,
}


def measure_defaults() -> dict[str, Any]:
    """Every :func:`measure` option with its default (None: chosen at run time)."""
    return dict(_MEASURE_DEFAULTS)


@dataclass
class _Run:
    """What measure() and the interleaved compare() set up before entering the C++ loop."""

    options: Any
    calls: list[tuple[tuple, dict]]
    index: int | None
    on_gpu: bool
    monitor: _C.ClockMonitor | None
    confidence: float
    target_rel_ci: float
    meter: Any = None  # the energy counter handed to the C++ loop (None: energy off or unavailable)
    energy_reason: str = ""  # why there is no meter
    idle_power_w: float | None = None
    min_energy_s: float = 0.0

    def measurement(self, raw: dict, label: str | None) -> Measurement:
        clocks = self.monitor.summary(skip_s=raw["warmup_s"]) if self.monitor is not None else None
        memory = None
        if self.on_gpu:
            memory = {
                "max_allocated_bytes": int(torch.cuda.max_memory_allocated(self.index)),
                "max_reserved_bytes": int(torch.cuda.max_memory_reserved(self.index)),
                "nvml_used_bytes": _nvml.memory_used_bytes(self.index),
            }
        return Measurement.from_samples(
            raw["samples_ms"],
            enqueue_ms=raw["enqueue_ms"],
            mode=raw["mode"],
            confidence=self.confidence,
            target_rel_ci=self.target_rel_ci,
            target_met=raw["target_met"],
            stop_reason=raw["stop_reason"],
            warmup_iters=raw["warmup_iters"],
            warmup_s=raw["warmup_s"],
            sampling_s=raw["sampling_s"],
            calls_per_sample=raw["calls_per_sample"],
            device=None if raw["device"] < 0 else raw["device"],
            label=label,
            delay_us=raw["delay_us"],
            delay_short=raw["delay_short"],
            flush_l2_bytes=raw["flush_bytes"],
            memory=memory,
            clocks=clocks,
            energy=self.energy_record(raw, clocks),
        )

    def energy_record(self, raw: dict, clocks: dict | None) -> dict[str, Any] | None:
        """What the timed region used (see :func:`energy_record`)."""
        return energy_record(raw, clocks, meter=self.meter, reason=self.energy_reason,
                             idle_power_w=self.idle_power_w, min_energy_s=self.min_energy_s)


ENERGY_METHODS = ("nvml-energy-counter", "nvml-power-samples", "power-x-time-estimate")


def energy_record(raw: dict, clocks: dict | None, *, meter: Any, reason: str, idle_power_w: float | None,
                  min_energy_s: float) -> dict[str, Any] | None:
    """The energy of a measurement's timed region, from what the C++ loop read (``raw["energy"]``: NVML's
    energy counter at the region's edges) or, where the counter gave nothing, the clock monitor's power
    readings. ``method`` is one of :data:`ENERGY_METHODS` or None (then ``reason`` says why; never 0 J):

    - ``nvml-energy-counter``: the counter's difference over the sampled span, aligned to the counter's
      steps at both ends when ``aligned``;
    - ``power-x-time-estimate``: a fixed number of samples shorter than ``min_energy_s``, whose end is not
      aligned to a step: the monitor's mean power x the span;
    - ``nvml-power-samples``: no counter (an older GPU): the monitor's mean power x the span.

    Per call: ``joules_per_call`` (the span's calls are samples x calls per sample); ``avg_power_w``;
    ``power_limit_w`` and ``share_of_power_limit``; ``idle_power_w`` (the device with nothing of ours on it,
    measured once per process). None for a measurement off the GPU without a reason to give."""
    if meter is None and not reason:
        return None
    out: dict[str, Any] = {"method": None, "joules": None, "window_s": None, "aligned": False, "calls": None,
                           "joules_per_call": None, "avg_power_w": None, "power_limit_w": None,
                           "share_of_power_limit": None, "idle_power_w": idle_power_w, "reason": reason}
    if meter is None:
        return out
    got = raw.get("energy")
    calls = len(raw["samples_ms"]) * max(1, int(raw.get("calls_per_sample") or 1))
    power = (clocks or {}).get("power_w_mean")
    n_power = (clocks or {}).get("power_samples", 0)
    if got is None:
        out["reason"] = f"this mode does not measure energy (an interleaved comparison): {raw.get('mode')}"
        return out
    joules, window, why = got["joules"], got["window_s"], got["reason"]
    method = "nvml-energy-counter" if joules is not None else None
    if joules is not None and not got["aligned"] and window < min_energy_s and power is not None:
        joules, method = power * window, "power-x-time-estimate"
        why = (f"{why}; the span ({window:.3g} s) is shorter than min_energy_s={min_energy_s:g}: estimated as "
               f"the mean of {n_power} power readings x the span")
    elif joules is None and power is not None and window > 0:
        joules, method = power * window, "nvml-power-samples"
        why = f"{why}; estimated as the mean of {n_power} power readings x the span"
    out.update(method=method, window_s=window, aligned=bool(got["aligned"]) and method == "nvml-energy-counter",
               calls=calls, reason=why)
    if joules is not None and joules > 0 and window > 0:
        limit = meter.power_limit_w()
        out.update(joules=joules, joules_per_call=joules / calls, avg_power_w=joules / window, power_limit_w=limit,
                   share_of_power_limit=(joules / window) / limit if limit else None)
    elif method is not None:
        out.update(method=None, reason=f"{why}; no positive energy was measured")
    return out


def _native(o: dict[str, Any], mode: str, index: int | None, meter: Any = None) -> _C.MeasureOptions:
    return _C.MeasureOptions(
        mode=mode, warmup=o["warmup"], warmup_s=o["warmup_s"], iters=o["iters"], min_iters=o["min_iters"],
        max_iters=o["max_iters"], min_time_s=o["min_time_s"], max_time_s=o["max_time_s"],
        target_rel_ci=o["target_rel_ci"], confidence=o["confidence"], flush_l2=o["flush_l2"],
        device=-1 if index is None else index, calls_per_sample=o["calls_per_sample"],
        block_target_ms=o["block_target_ms"], energy=meter, min_energy_s=float(o["min_energy_s"]),
    )


def validate_measure_options(options: dict[str, Any], modes: Sequence[str] | None = None) -> dict[str, Any]:
    """Check :func:`measure` options before anything runs, for each of ``modes`` (default: the mode
    measure() would use): TypeError for an unknown name or a value of the wrong type, ValueError for
    one out of range -- the C++ loop's own checks, so ``max_time_s=-1`` fails here, not in every cell.
    Returns ``options`` unchanged. measure(), compare(), benchmark(), sweep() and the CLI call it.

    >>> validate_measure_options({"max_time_s": -1})
    Traceback (most recent call last):
    ValueError: max_time_s must be a finite number of seconds > 0, got -1
    """
    if not isinstance(options, dict):
        raise TypeError(f"measure options must be a dict, got {type(options).__name__}")
    unknown = sorted(set(options) - set(_MEASURE_DEFAULTS))
    if unknown:
        raise TypeError(f"unknown measure option(s) {', '.join(unknown)}; "
                        f"allowed: {', '.join(sorted(_MEASURE_DEFAULTS))}")
    o = {**_MEASURE_DEFAULTS, **options}
    for name, default in _NATIVE_DEFAULTS.items():
        v = o[name]
        if isinstance(default, bool):
            ok = isinstance(v, bool)
            kind = "True or False"
        elif isinstance(default, float):
            ok = isinstance(v, (int, float)) and not isinstance(v, bool)
            kind = "a number"
        else:  # counts; None where chosen at run time (iters, calls_per_sample)
            ok = (v is None and default is None) or (isinstance(v, int) and not isinstance(v, bool))
            kind = "an integer" + (" or None" if default is None else "")
        if not ok:
            raise TypeError(f"{name} must be {kind}, got {v!r}")
    for name in ("monitor", "energy"):
        if not isinstance(o[name], bool):
            raise TypeError(f"{name} must be True or False, got {o[name]!r}")
    e = o["min_energy_s"]
    if not isinstance(e, (int, float)) or isinstance(e, bool):
        raise TypeError(f"min_energy_s must be a number of seconds, got {e!r}")
    if not (math.isfinite(e) and 0 <= e <= 60):
        raise ValueError(f"min_energy_s must be in [0, 60] seconds (0: no minimum energy window), got {e!r}")
    if modes is None:
        modes = [_resolve_mode(o["mode"], _C.cuda_compiled() and torch.cuda.is_available())]
    for mode in modes:
        _C.validate_measure_options(_native(o, mode, None))
    return options


def _setup(options: dict[str, Any]) -> _Run:
    validate_measure_options(options)
    o = {**_MEASURE_DEFAULTS, **options}
    cuda_usable = _C.cuda_compiled() and torch.cuda.is_available()
    mode = _resolve_mode(o["mode"], cuda_usable)
    index = device_index(o["device"])
    calls = argument_sets(o["inputs"])
    on_gpu = cuda_usable and index is not None
    meter, why, idle = None, "", None
    if not on_gpu:
        why = "no energy off the GPU (NVML measures GPUs)" if o["energy"] else ""
    elif not o["energy"]:
        why = "energy=False"
    else:
        meter = _nvml.energy_meter(index)
        if not meter.active:
            meter, why = None, f"NVML is not available: {meter.reason}"
        else:
            idle = _nvml.idle_power_w(index, meter)  # once per device, before anything of this run
    native = _native(o, mode, index, meter)
    if on_gpu:
        torch.cuda.reset_peak_memory_stats(index)
    # The monitor also reads power: the energy fallback where the GPU has no counter (none with monitor=False).
    monitor = _nvml.clock_monitor(index) if (on_gpu and o["monitor"] and mode != "host") else None
    return _Run(native, calls, index, on_gpu, monitor, o["confidence"], o["target_rel_ci"], meter=meter,
                energy_reason=why, idle_power_w=idle, min_energy_s=float(o["min_energy_s"]))


def measure(fn: Callable[..., Any], *, label: str | None = None, **options: Any) -> Measurement:
    """Time ``fn`` with gpuopt's C++ loop and return a :class:`Measurement`.

    Options (defaults in brackets):

    - ``mode`` [None: ``"latency"`` with a usable GPU, else ``"host"``]:

      - ``"latency"``: each call alone between CUDA events on the current stream, synchronized per
        sample. A spin kernel queued ahead keeps the GPU busy while the host enqueues the call, so
        the figure is device time without launch gaps; the host's enqueue time is recorded beside it
        and a ``launch-bound`` diagnosis is given when it approaches the device time.
      - ``"throughput"``: blocks of back-to-back calls (pipelined steady state), per-call block time.
      - ``"graph"``: ``calls_per_sample`` calls captured into one CUDA graph, replays timed.
      - ``"host"``: steady clock around call + device synchronize (end to end; works without CUDA).
    - ``warmup`` [3] calls and ``warmup_s`` [0.05] seconds, both at least.
    - stopping: when the ``confidence`` [0.95] interval of the median is within ``±target_rel_ci``
      [0.01] of it, after at least ``min_iters`` [10] samples and ``min_time_s`` [0.1] seconds; or
      exactly ``iters`` samples when given; at most ``max_iters`` [100000] samples and ``max_time_s``
      [10] seconds. The interval accounts for correlation between neighbouring samples (batch
      medians), so it does not shrink below what the device's drift allows.
    - ``inputs`` [None]: argument sets rotated between calls: a tuple/list is positional arguments,
      a dict keyword arguments, anything else one positional argument.
    - ``flush_l2`` [False]: overwrite twice the L2 before each latency/graph sample, untimed.
    - ``device`` [current; ``"cpu"``: host mode times the CPU alone and synchronizes no GPU], ``calls_per_sample`` [auto: throughput block / calls per graph],
      ``block_target_ms`` [2.0], ``monitor`` [True: NVML clocks and processes, when the driver's
      NVML library is present; read by a C++ thread].
    - ``energy`` [True]: on a GPU, the energy of the timed region from NVML's energy counter, read by the
      C++ loop at the region's edges, aligned to the counter's steps; an adaptive run samples at least
      ``min_energy_s`` [0.3] seconds for it (a few of the counter's steps). See :func:`energy_record` (``Measurement.energy``).

    A Python ``fn`` runs with the GIL held across the whole timed loop, so no other Python thread
    takes turns between calls (gpuopt starts none). A TorchScript module with tensor inputs, and a
    :class:`gpuopt._C.TokenLoop` (LLM decoding's CUDA-graph token loop), are timed entirely in C++,
    without the GIL.

    >>> import torch, gpuopt
    >>> x = torch.randn(256, 256)
    >>> m = gpuopt.measure(lambda: x @ x, mode="host", max_time_s=0.5)
    >>> m.p50 > 0
    True
    """
    loop = isinstance(fn, _C.TokenLoop)
    if not (callable(fn) or loop):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    run = _setup(options)
    script = isinstance(fn, torch.jit.ScriptModule) and all(
        not kw and all(isinstance(a, torch.Tensor) for a in args) for args, kw in run.calls
    )
    with run.monitor or contextlib.nullcontext():
        if loop:
            raw = _C.measure_token_loop(fn, run.options)
        elif script:
            raw = _C.measure_script(fn._c, [list(args) for args, _ in run.calls], run.options)
        else:
            raw = _C.measure_callable(fn, run.calls, run.options)
    return run.measurement(raw, label)
