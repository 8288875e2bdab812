"""Load specifications (MLPerf LoadGen's scenarios and arrival processes) and what a load run
measured. The generator itself is C++ (``csrc/core/loadgen.cpp``): it times every query from its
scheduled arrival, so queueing in a stalled server is never hidden (no coordinated omission)."""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .._checks import check_int
from .._ext import _C
from ..report.results import Row

SCENARIOS = ("single-stream", "multi-stream", "server", "offline", "closed-loop")
ARRIVALS = ("constant", "poisson", "gamma", "ramp", "spike", "trace")
# The percentile each scenario reports by default, as MLPerf LoadGen does.
DEFAULT_PERCENTILE = {"single-stream": 0.9, "multi-stream": 0.99, "server": 0.99, "offline": 0.99,
                      "closed-loop": 0.99}


def _number(name: str, value: Any, *, low: float = 0.0, inclusive: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (value < low if inclusive else value <= low):
        raise ValueError(f"{name} must be a finite number {'>=' if inclusive else '>'} {low:g}, got {value!r}")
    return float(value)


def read_trace(path: str | os.PathLike) -> list[float]:
    """Gaps between arrivals, in seconds, one per line (blank lines and ``#`` comments skipped)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"trace file {str(p)!r} does not exist")
    out = []
    for n, line in enumerate(p.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            v = float(line)
        except ValueError:
            raise ValueError(f"trace file {str(p)!r} line {n}: {line!r} is not a number of seconds") from None
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"trace file {str(p)!r} line {n}: a gap must be >= 0 seconds, got {v}")
        out.append(v)
    if not out or not any(out):
        raise ValueError(f"trace file {str(p)!r} holds no positive gap")
    return out


@dataclass
class LoadSpec:
    """What load to apply.

    - ``scenario``: ``single-stream`` (one query at a time), ``multi-stream`` (groups of
      ``samples_per_query``), ``server`` (open loop at ``rate`` queries/s from the ``arrival`` process),
      ``offline`` (``min_queries`` at once), ``closed-loop`` (``concurrency`` clients, each sending its
      next query when its last one is answered).
    - ``arrival`` (server): ``poisson`` (default), ``constant``, ``gamma`` (``burstiness`` = squared
      coefficient of variation of the gaps), ``ramp`` (``rate`` to ``ramp_to_rate`` over
      ``ramp_duration_s``), ``spike`` (``spike_rate`` during ``[spike_start_s, +spike_duration_s)``),
      ``trace`` (``intervals_s``, or a ``trace_file`` of gaps in seconds, cycled).
    - A run issues until both ``min_queries`` and ``duration_s`` are reached (or ``max_queries`` /
      ``max_duration_s``), then waits up to ``drain_timeout_s`` for the answers.
    - ``percentile`` (default by scenario: 0.9 single-stream, 0.99 otherwise) is reported with LoadGen's
      early stopping at ``confidence``; with ``slo_ms`` a run whose estimate exceeds it is invalid.
    """

    scenario: str = "server"
    rate: float | None = None
    arrival: str = "poisson"
    burstiness: float = 1.0
    ramp_to_rate: float | None = None
    ramp_duration_s: float | None = None
    spike_rate: float | None = None
    spike_start_s: float = 0.0
    spike_duration_s: float | None = None
    intervals_s: list[float] | None = None
    trace_file: str | None = None
    concurrency: int = 1
    samples_per_query: int = 8
    min_queries: int = 1024
    max_queries: int = 0
    duration_s: float = 1.0
    max_duration_s: float = 0.0
    percentile: float | None = None
    confidence: float = 0.99
    slo_ms: float | None = None
    priority_weights: list[float] | None = None
    drain_timeout_s: float = 30.0
    seed: int = 0

    def options(self) -> Any:
        """The C++ generator's options, every value checked and named (ValueError)."""
        if self.scenario not in SCENARIOS:
            raise ValueError(f"scenario must be one of {', '.join(map(repr, SCENARIOS))}, got {self.scenario!r}")
        if self.arrival not in ARRIVALS:
            raise ValueError(f"arrival must be one of {', '.join(map(repr, ARRIVALS))}, got {self.arrival!r}")
        o = _C.LoadOptions()
        o.scenario = self.scenario
        if self.scenario == "server":
            o.arrival = self.arrival
            if self.arrival == "trace":
                if (self.intervals_s is None) == (self.trace_file is None):
                    raise ValueError("arrival='trace' needs exactly one of intervals_s or trace_file")
                o.intervals_s = (read_trace(self.trace_file) if self.trace_file is not None
                                 else [_number(f"intervals_s[{i}]", v, inclusive=True)
                                       for i, v in enumerate(self.intervals_s)])
                gaps = list(o.intervals_s)
                o.rate = len(gaps) / sum(gaps) if sum(gaps) > 0 else 0.0
            else:
                if self.rate is None:
                    raise ValueError("the server scenario needs rate (queries per second), e.g. rate=1000")
                o.rate = _number("rate", self.rate)
            o.burstiness = _number("burstiness", self.burstiness)
            if self.arrival == "ramp":
                if self.ramp_to_rate is None or self.ramp_duration_s is None:
                    raise ValueError("arrival='ramp' needs ramp_to_rate and ramp_duration_s")
                o.ramp_to_rate = _number("ramp_to_rate", self.ramp_to_rate)
                o.ramp_duration_s = _number("ramp_duration_s", self.ramp_duration_s)
            if self.arrival == "spike":
                if self.spike_rate is None or self.spike_duration_s is None:
                    raise ValueError("arrival='spike' needs spike_rate and spike_duration_s (and spike_start_s)")
                o.spike_rate = _number("spike_rate", self.spike_rate)
                o.spike_start_s = _number("spike_start_s", self.spike_start_s, inclusive=True)
                o.spike_duration_s = _number("spike_duration_s", self.spike_duration_s)
        elif self.rate is not None:
            raise ValueError(f"rate applies to the server scenario only, not {self.scenario!r} (use concurrency "
                             f"for closed-loop)")
        o.concurrency = check_int("concurrency", self.concurrency, 1)
        o.samples_per_query = check_int("samples_per_query", self.samples_per_query, 1)
        o.min_queries = check_int("min_queries", self.min_queries, 1)
        o.max_queries = check_int("max_queries", self.max_queries, 0)
        if o.max_queries and o.max_queries < o.min_queries:
            raise ValueError(f"max_queries ({self.max_queries}) must be 0 (no cap) or >= min_queries ({self.min_queries})")
        o.min_duration_s = _number("duration_s", self.duration_s, inclusive=True)
        o.max_duration_s = _number("max_duration_s", self.max_duration_s, inclusive=True)
        p = DEFAULT_PERCENTILE[self.scenario] if self.percentile is None else self.percentile
        if not (isinstance(p, float) and 0 < p < 1):
            raise ValueError(f"percentile must be a fraction in (0, 1) such as 0.99, got {self.percentile!r}")
        o.percentile = p
        if not (isinstance(self.confidence, float) and 0 < self.confidence < 1):
            raise ValueError(f"confidence must be a fraction in (0, 1) such as 0.99, got {self.confidence!r}")
        o.confidence = self.confidence
        o.slo_ms = 0.0 if self.slo_ms is None else _number("slo_ms", self.slo_ms)
        if self.priority_weights is not None:
            o.priority_weights = [_number(f"priority_weights[{i}]", w, inclusive=True)
                                  for i, w in enumerate(self.priority_weights)]
        o.drain_timeout_s = _number("drain_timeout_s", self.drain_timeout_s)
        o.seed = check_int("seed", self.seed, 0)
        o.validate()
        return o

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


STATUS_NAMES = ("pending", "ok", "failed", "rejected", "timed-out", "cancelled", "lost")


@dataclass
class ServeResult:
    """One load run against one server (or the naive baseline): the generator's figures (``result``),
    the server's counters, the settings, and optionally every query's record (``records``: columns of
    CPU tensors, not saved with the row)."""

    model: str
    config: str
    load: LoadSpec
    settings: dict[str, Any]
    result: dict[str, Any]
    server: dict[str, Any] = field(default_factory=dict)
    records: dict[str, Any] | None = field(default=None, repr=False)
    verification: dict[str, Any] | None = None

    @classmethod
    def failed(cls, reason: str, *, model: str, config: str, load: LoadSpec, settings: dict[str, Any]) -> ServeResult:
        """A run that could not happen (the target raised): no query answered, the reason kept, so a
        curve or a sweep records it and goes on."""
        nan = float("nan")
        empty = {"n": 0, "mean": nan, "p50": nan, "p90": nan, "p95": nan, "p99": nan, "p99.9": nan, "max": nan}
        result = {"scenario": load.scenario, "issued": 0, "ok": 0, "failed": 0, "rejected": 0, "timed_out": 0,
                  "cancelled": 0, "lost": 0, "duplicated": 0, "unknown": 0, "duration_s": 0.0, "issue_span_s": 0.0,
                  "target_rate": float(load.rate or 0.0), "scheduled_rate": 0.0, "throughput": 0.0,
                  "latency_ms": empty, "queue_ms": dict(empty), "compute_ms": dict(empty), "issue_lag_p99_ms": 0.0,
                  "early_stop": {"percentile": load.percentile or 0.99, "confidence": load.confidence, "queries": 0,
                                 "min_queries": 0, "enough": False, "order": 0, "estimate_ms": None},
                  "valid": False, "invalid_reasons": [reason], "batch_size_counts": [], "errors": [reason]}
        return cls(model=model, config=config, load=load, settings=dict(settings), result=result)

    @property
    def scenario(self) -> str:
        return self.result["scenario"]

    @property
    def valid(self) -> bool:
        return bool(self.result["valid"])

    @property
    def invalid_reasons(self) -> list[str]:
        return list(self.result["invalid_reasons"])

    @property
    def throughput(self) -> float:
        """Answered queries (samples, for multi-stream) per second."""
        return float(self.result["throughput"])

    @property
    def latency_ms(self) -> dict[str, float]:
        return dict(self.result["latency_ms"])

    @property
    def p99_ms(self) -> float:
        return float(self.result["latency_ms"]["p99"])

    @property
    def gpu_busy(self) -> float | None:
        """Share of the run's wall time with a batch in service (None for targets that do not say). For
        a server over several GPUs: with a batch in service on ANY of them -- 100% does not mean every
        GPU was busy; :attr:`gpu_busy_per_device` has each GPU's share."""
        busy, wall = self.result.get("busy_s"), self.result.get("wall_s")
        return None if busy is None or not wall else min(1.0, busy / wall)

    @property
    def gpu_busy_per_device(self) -> dict[str, float] | None:
        """Per device of a server over several (``devices=``): the share of the run's wall time with a
        batch in service on it, keyed by device name (None for one device or targets that do not say)."""
        busy, wall = self.result.get("busy_s_per_device"), self.result.get("wall_s")
        names = self.settings.get("devices") or []
        if not busy or not wall or len(busy) < 2 or len(names) != len(busy):
            return None
        return {name: min(1.0, b / wall) for name, b in zip(names, busy)}

    @property
    def batches_per_device(self) -> dict[str, int] | None:
        """Batches each device served during the run (None for one device)."""
        counts, names = self.result.get("batches_per_device"), self.settings.get("devices") or []
        if not counts or len(counts) < 2 or len(names) != len(counts):
            return None
        return dict(zip(names, (int(c) for c in counts)))

    def serving(self) -> dict[str, Any]:
        """What a result row keeps of the run (everything but the per-query records)."""
        r = self.result
        return {
            "scenario": r["scenario"], "load": self.load.to_dict(), "settings": dict(self.settings),
            "valid": r["valid"], "invalid_reasons": list(r["invalid_reasons"]),
            "counts": {k: r[k] for k in ("issued", "ok", "failed", "rejected", "timed_out", "cancelled", "lost",
                                         "duplicated", "unknown")},
            "target_rate": r["target_rate"], "scheduled_rate": r["scheduled_rate"], "throughput": r["throughput"],
            "duration_s": r["duration_s"], "latency_ms": dict(r["latency_ms"]), "queue_ms": dict(r["queue_ms"]),
            "compute_ms": dict(r["compute_ms"]), "early_stop": dict(r["early_stop"]),
            "issue_lag_p99_ms": r["issue_lag_p99_ms"], "batch_size_counts": list(r["batch_size_counts"]),
            "gpu_busy": self.gpu_busy, "gpu_busy_per_device": self.gpu_busy_per_device,
            "batches_per_device": self.batches_per_device, "errors": list(r["errors"]), "server": dict(self.server),
            "verification": self.verification,
        }

    def row(self, *, device: str | None = None, precision: str | None = None, label: str | None = None) -> Row:
        """This run as a :class:`~gpuopt.report.results.Row` (``mode`` ``serve:<scenario>`` and the load
        point, then ``label`` if given: see :func:`~gpuopt.report.results.serving_mode`; ``batch_size``
        the batcher's maximum; ``device`` the server's unless given), for ``Results``, reports and plots."""
        return Row.served(self.serving(), model=self.model, config=self.config,
                          batch_size=int(self.settings.get("max_batch_size", 1)),
                          device=device or self.settings.get("device"), precision=precision, label=label)

    def summary(self) -> str:
        r = self.result
        lat = r["latency_ms"]
        es = r["early_stop"]
        est = (f"{es['estimate_ms']:.2f} ms" if es.get("estimate_ms") is not None
               else f"n/a (needs {es['min_queries']} queries)")
        head = (f"{self.model} {self.config} [{self.settings.get('path', '?')}] {r['scenario']}: "
                f"{r['throughput']:,.0f} req/s, p50 {lat['p50']:.2f} ms, p99 {lat['p99']:.2f} ms "
                f"(early-stopping p{100 * es['percentile']:g} {est}), {r['ok']}/{r['issued']} ok")
        per_device = self.gpu_busy_per_device
        if self.gpu_busy is not None:
            head += f", busy {100 * self.gpu_busy:.0f}%" + (" on any GPU" if per_device else "")
        if per_device:
            batches = self.batches_per_device or {}
            head += " (" + ", ".join(f"{d} {100 * b:.0f}%, {batches.get(d, 0)} batches" for d, b in per_device.items()) + ")"
        return head + ("" if r["valid"] else f" -- INVALID: {'; '.join(r['invalid_reasons'])}")


def load_spec(spec: LoadSpec | None, fields: dict[str, Any]) -> LoadSpec:
    """``spec`` as given, or a :class:`LoadSpec` from keyword fields (not both)."""
    if spec is not None:
        if fields:
            raise TypeError(f"give a LoadSpec or its fields as keywords, not both (got {sorted(fields)})")
        if not isinstance(spec, LoadSpec):
            raise TypeError(f"spec must be a gpuopt.LoadSpec, got {type(spec).__name__}")
        return spec
    known = set(LoadSpec.__dataclass_fields__)
    unknown = sorted(set(fields) - known)
    if unknown:
        raise TypeError(f"unknown load option(s) {', '.join(unknown)}; allowed: {', '.join(sorted(known))}")
    return LoadSpec(**fields)


# Relative tolerance of an answer's checksums against a direct call's, by precision, relative to the
# checksum's L2 scale (see checksum_weights): batching changes the kernels (and their rounding) but
# never which request an output belongs to.
CHECKSUM_RTOL = {"fp32": 1e-4, "tf32": 1e-2, "fp16-amp": 2e-2, "bf16-amp": 5e-2, "fp16": 2e-2, "bf16": 5e-2}

# Independent checksums per answer: a swap between two samples hides only when all of them agree.
# The C++ server's serve::kChecksums.
CHECKSUMS = _C.CHECKSUMS


def checksum_weights(numel: int, device: Any = None) -> Any:
    """The weights of an answer's checksums, ``[numel, CHECKSUMS]`` float64 in [-1, 1), made by the
    C++ server's own ``checksum_weights`` (``csrc/torch/server.cpp``): weight j of output element k is
    ``mix32(k * CHECKSUMS + j) / 2^32 * 2 - 1``, mix32 a 32-bit integer mixer (xorshift-multiply,
    "lowbias32"), so outputs that sum to about zero (a LayerNorm's) or are permutations of each other
    still get distinct checksums.

    Checksum j of an output ``out`` (flattened) is ``out.double() @ w[:, j]``; its scale is
    ``sqrt((out.double() ** 2) @ w[:, j] ** 2)``, the L2 norm of the weighted terms: rounding
    differences between two runs are small per-element relative errors of mixed signs, so the
    checksum's error grows like eps times that scale (not eps times the L1 sum of the terms, which
    is about sqrt(numel) times larger and would hide every swap in a large output).
    """
    return _C.checksum_weights(int(numel), "cpu" if device is None else str(device))


def verify_checksums(records: dict[str, Any], expected: tuple[Any, Any], precision: str) -> dict[str, Any]:
    """Every answered query's output checksums (``records["checksum"]``, ``[queries, CHECKSUMS]``)
    against its sample's direct-call checksums (``expected``: sums and scales, ``[samples,
    CHECKSUMS]`` each, as :meth:`Server.expected_checksums` gives them): counts of answered,
    mismatched, lost and duplicated queries, and the worst relative error (``|got - want| / scale``,
    the largest of the checksums). An answer is a mismatch when any of its checksums is off by more
    than ``rtol``.

    An answer swapped between two samples shows only when some checksum of theirs differs by more than
    the tolerance: ``swap_detection`` is the fraction of sample pairs for which one of them differs by
    more than twice ``rtol`` times the larger scale (the chance a swap between two random samples is
    caught), ``ambiguous_pairs`` the pairs where none does, and ``conclusive`` is True when
    ``swap_detection`` is at least 0.99."""

    sums, scales = (_as_columns(t) for t in expected)
    status = records["status"]
    ok = status == STATUS_NAMES.index("ok")
    sample = records["sample"][ok]
    got = _as_columns(records["checksum"])[ok]
    want, scale = sums[sample], scales[sample]
    err = (got - want).abs() / scale.clamp_min(1e-30)
    rtol = CHECKSUM_RTOL.get(precision, 2e-2)
    bad = ~(err <= rtol).all(dim=1)  # NaN counts as a mismatch
    ambiguous, pairs = _ambiguous_pairs(sums, scales, 2 * rtol)
    detection = 1.0 - ambiguous / pairs if pairs else 1.0
    return {
        "answered": int(ok.sum()), "mismatched": int(bad.sum()), "rtol": rtol,
        "max_rel_error": float(err.max()) if err.numel() else None,
        "lost": int((status == STATUS_NAMES.index("lost")).sum()),
        "duplicated": int((records["completions"] > 1).sum()),
        "ambiguous_pairs": ambiguous, "swap_detection": detection, "conclusive": detection >= 0.99,
    }


def _as_columns(t: Any) -> Any:
    """A [n] tensor as [n, 1] (one checksum); [n, K] as it is."""
    return t.unsqueeze(1) if t.dim() == 1 else t


def _ambiguous_pairs(sums: Any, scales: Any, tol: float) -> tuple[int, int]:
    """Pairs (i < j) of samples whose checksums all lie within ``tol`` x the larger scale of each
    other (``sums``, ``scales``: [n] or [n, K]), and the number of pairs in all.

    Samples go into a grid over their first two checksums, cells as wide as the largest tolerance of
    each, so an ambiguous pair lies in one cell or two neighbouring ones; only those candidates are
    checked, on every checksum, exactly. Vectorised, in chunks: 10^5 samples whose checksums spread
    over many tolerances (what a useful checksum does) take seconds at most."""
    import torch

    s, m = _as_columns(sums), _as_columns(scales)
    n = int(s.shape[0])
    if n < 2:
        return 0, 0
    dims = min(2, int(s.shape[1]))
    width = tol * m[:, :dims].amax(dim=0)
    width = torch.where(torch.isfinite(width) & (width > 0), width, torch.ones_like(width))
    cells = (s[:, :dims] / width).nan_to_num(0.0).clamp(-(2.0**30), 2.0**30).floor().long()
    a = cells[:, 0] - cells[:, 0].min()
    b = cells[:, 1] - cells[:, 1].min() + 1 if dims == 2 else torch.ones_like(a)  # room for b - 1
    span = int(b.max()) + 2
    key = a * span + b
    order = torch.argsort(key)
    key, s, m = key[order], s[order], m[order]
    pos = torch.arange(n)
    ambiguous = 0
    # The same cell (later positions only), then the cells after it: (a, b + 1), (a + 1, b - 1 .. b + 1).
    for delta in (0, 1, span - 1, span, span + 1):
        lo = pos + 1 if delta == 0 else torch.searchsorted(key, key + delta)
        hi = torch.searchsorted(key, key + delta, right=True)
        ambiguous += _close_in_ranges(s, m, tol, lo, (hi - lo).clamp_min(0))
    return ambiguous, n * (n - 1) // 2


def _close_in_ranges(s: Any, m: Any, tol: float, start: Any, count: Any, chunk: int = 1 << 22) -> int:
    """How many pairs (i, j), j in start[i] .. start[i] + count[i] - 1, have every checksum within
    ``tol`` x the larger scale; candidates expanded a chunk at a time."""
    import torch

    cum = torch.cumsum(count, 0)
    total = int(cum[-1])
    close, done, first = 0, 0, 0
    n = int(count.numel())
    while done < total:
        last = max(int(torch.searchsorted(cum, done + chunk, right=True)), first + 1)
        c = count[first:last]
        i = torch.repeat_interleave(torch.arange(first, last), c)
        j = torch.repeat_interleave(start[first:last] - (cum[first:last] - c), c) + torch.arange(
            int(cum[first - 1]) if first else 0, int(cum[last - 1]))
        close += int(((s[j] - s[i]).abs() <= tol * torch.maximum(m[j], m[i])).all(dim=1).sum())
        done, first = int(cum[last - 1]), last
        if first >= n:
            break
    return close
