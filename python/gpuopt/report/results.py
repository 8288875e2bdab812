"""Results of a benchmark or sweep: one typed :class:`Row` per cell (model, config, batch size, mode),
the environment, speedups with confidence intervals, and every file format a report needs -- written
atomically, so an interrupted run never leaves a corrupt JSON or CSV."""

from __future__ import annotations

import csv
import datetime as _dt
import io
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from .._files import check_writable, write_atomic
from ..timing.comparison import Comparison, compare
from ..timing.measurement import Measurement, format_ms

# 2: one label field ("config" is what the user sees; version 1 rows also carried the canonical string
# in "config" and the label in "config_label").
SCHEMA_VERSION = 2
STATUSES = ("ok", "failed")
Key = tuple[str, str, int, str]  # (model, config, batch_size, mode)


@dataclass(frozen=True)
class Row:
    """One cell of a benchmark -- ``(model, config, batch_size, mode)`` -- and what happened there.

    Built by :meth:`measured` or :meth:`failed` (the runner, the sweep and the readers of saved files
    all go through these); ``error`` says why a failed cell failed.
    """

    model: str
    config: str  # the config's label: its name if it was given one, else its canonical string
    batch_size: int
    mode: str
    status: str  # "ok" or "failed"
    error: str | None = None
    precision: str | None = None
    device: str | None = None
    item_unit: str = "items"
    items_per_call: int | None = None
    # One forward call's cost per item (None where it could not be counted).
    flops_per_item: float | None = None
    bytes_per_item_min: float | None = None
    bytes_per_item_max: float | None = None
    # Preparing the config and its parity gate, outside the timed region.
    prepare_s: float | None = None
    first_call_ms: float | None = None
    notes: list[str] = field(default_factory=list)
    parity: dict[str, Any] | None = None  # Parity.to_dict(), with "error" when the gate failed
    parity_s: float | None = None
    # The measurement and the figures the reports read from it.
    measurement: Measurement | None = None
    latency_ms: dict[str, float] | None = None  # p50, p95, p99, mean, min
    throughput_items_per_s: float | None = None
    ci95_ms: list[float] | None = None
    ci_rel: float | None = None
    peak_memory: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)
    diagnosis: str | None = None
    timing: dict[str, Any] | None = None
    runner_overhead_s: float | None = None
    roofline: dict[str, Any] | None = None  # analysis.roofline.place() of the throughput
    # A serving run (mode "serve:<scenario>"): load, batcher settings, counts, latency split, validity.
    serving: dict[str, Any] | None = None
    # An LLM decode cell (mode "llm:p<prompt>+n<new tokens>"): TTFT, TPOT, ITL, tokens/s, bytes and
    # bandwidth, the prefill's roofline placement (gpuopt.llm.DecodeResult.llm_dict()).
    llm: dict[str, Any] | None = None
    # A row of a distributed benchmark (mode "<mode> @rank1/4", "<mode> @4 ranks", "<mode> @1 rank" or
    # "host split @4 ranks", see dist_mode): role ("rank", "aggregate", "single", "split"), strategy, rank,
    # world size, host, sampling window; the aggregate's per-rank throughputs, common interval and scaling
    # efficiency; a split row's global and per-rank batch and its phases (scatter, compute, gather) (gpuopt.dist).
    dist: dict[str, Any] | None = None

    @property
    def energy(self) -> dict[str, Any] | None:
        """The measurement's energy record (``Measurement.energy``: method, joules, ``joules_per_call``,
        ``avg_power_w``, ``share_of_power_limit``, ``idle_power_w``, reason), with ``joules_per_item`` and
        ``items_per_joule`` of this row's items per call; None where energy was not measured."""
        e = self.measurement.energy if self.measurement is not None else None
        if e is None:
            return None
        per_call, items = e.get("joules_per_call"), self.items_per_call or self.batch_size
        per_item = per_call / items if per_call and items else None
        return {**e, "joules_per_item": per_item, "items_per_joule": 1.0 / per_item if per_item else None}

    @property
    def key(self) -> Key:
        return (self.model, self.config, self.batch_size, self.mode)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def is_serving(self) -> bool:
        """The row of a serving run (mode ``serve:...``), answered or failed."""
        return self.mode.startswith("serve:")

    @property
    def is_llm(self) -> bool:
        """The row of an LLM decode cell (mode ``llm:...``), measured or failed."""
        return self.mode.startswith("llm:")

    @property
    def is_dist(self) -> bool:
        """A row of a distributed benchmark: one rank's, the aggregate or the one-device baseline."""
        return self.dist is not None

    @classmethod
    def measured(cls, m: Measurement, *, model: str, config: str, batch_size: int, mode: str,
                 **facts: Any) -> Row:
        """The row of a measured cell; ``facts`` are the fields that do not come from the measurement
        (precision, device, prepare_s, parity, ...)."""
        _check_facts(facts)
        return cls(
            model=model, config=config, batch_size=batch_size, mode=mode, status="ok", measurement=m,
            latency_ms={"p50": m.p50, "p95": m.p95, "p99": m.p99, "mean": m.mean, "min": m.min},
            throughput_items_per_s=batch_size * 1e3 / m.p50 if m.p50 > 0 else None,
            ci95_ms=list(m.ci95), ci_rel=m.ci_rel, peak_memory=m.memory, warnings=list(m.warnings),
            diagnosis=m.diagnosis,
            timing={"n": m.n, "warmup_s": m.warmup_s, "sampling_s": m.sampling_s, "stop_reason": m.stop_reason,
                    "target_met": m.target_met, "mode": m.mode},
            **facts)

    @classmethod
    def served(cls, serving: dict[str, Any], *, model: str, config: str, batch_size: int, label: str | None = None,
               **facts: Any) -> Row:
        """The row of a serving run (``gpuopt.serve``): mode ``serve:<scenario>`` and the load point
        (:func:`serving_mode`), requests per second and end-to-end latency percentiles from the load
        generator; a run that answered no query is a failed row with the reasons. An invalid run
        (LoadGen's sense) keeps its figures and says why in ``warnings``."""
        _check_facts(facts)
        mode = serving_mode(serving["load"], naive=serving["settings"].get("path") == NAIVE_PATH, label=label)
        if serving["counts"]["ok"] == 0:
            reason = "; ".join(serving["invalid_reasons"]) or "no query was answered"
            return cls.failed(reason, model=model, config=config, batch_size=batch_size, mode=mode,
                              item_unit="requests", serving=serving, **facts)
        lat = serving["latency_ms"]
        return cls(model=model, config=config, batch_size=batch_size, mode=mode, status="ok", item_unit="requests",
                   latency_ms={k: lat[k] for k in ("p50", "p90", "p95", "p99", "p99.9", "mean", "max")},
                   throughput_items_per_s=serving["throughput"],
                   warnings=[] if serving["valid"] else [f"invalid run: {r}" for r in serving["invalid_reasons"]],
                   serving=serving, **facts)

    @classmethod
    def decoded(cls, m: Measurement, llm: dict[str, Any], *, model: str, config: str, batch_size: int,
                **facts: Any) -> Row:
        """The row of an LLM decode cell (``gpuopt.llm.measure_decode``): mode ``llm:p<prompt>+n<new>``
        (:func:`llm_mode`), latency = time per output token (TPOT) percentiles, throughput = tokens/s
        while decoding (batch / mean TPOT); ``measurement`` holds whole requests, ``llm`` the rest
        (TTFT, inter-token latency, bytes, bandwidth, the prefill's roofline)."""
        row = cls.measured(m, model=model, config=config, batch_size=batch_size,
                           mode=llm_mode(llm["prompt_len"], llm["new_tokens"]), item_unit="tokens", llm=llm, **facts)
        tpot = llm.get("tpot_ms")
        return replace(row, latency_ms={k: tpot[k] for k in ("p50", "p90", "p95", "p99", "mean", "min") if k in tpot}
                       if tpot else None,
                       throughput_items_per_s=llm.get("decode_tokens_per_s"))

    @classmethod
    def failed(cls, reason: str, *, model: str, config: str, batch_size: int, mode: str, **facts: Any) -> Row:
        """The row of a cell that failed (out of memory, compile error, parity, ...) and why."""
        _check_facts(facts)
        if not isinstance(reason, str) or not reason:
            raise ValueError(f"a failed row needs its reason as a non-empty string, got {reason!r}")
        return cls(model=model, config=config, batch_size=batch_size, mode=mode, status="failed", error=reason,
                   **facts)

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["measurement"] = self.measurement.to_dict() if self.measurement is not None else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], version: int = SCHEMA_VERSION) -> Row:
        """A row from :meth:`to_dict` (``version`` 2) or from a version 1 document, where ``config`` was
        the canonical string and ``config_label`` the label."""
        if not isinstance(d, dict):
            raise TypeError(f"a result row is a dict, got {type(d).__name__}")
        d = dict(d)
        if version == 1 and "config_label" in d:
            label = d.pop("config_label")
            d["config"] = label or d.get("config")
        lacking = [k for k in ("model", "config", "batch_size", "mode", "status") if k not in d]
        if lacking:
            raise ValueError(f"lacks {', '.join(lacking)}")
        unknown = sorted(set(d) - _FIELDS)
        if unknown:
            raise ValueError(f"has unknown field(s) {', '.join(unknown)} (schema version {version})")
        for name in ("model", "config", "mode"):
            if not isinstance(d[name], str):
                raise ValueError(f"{name} must be a string, got {d[name]!r}")
        if isinstance(d["batch_size"], bool) or not isinstance(d["batch_size"], int):
            raise ValueError(f"batch_size must be an integer, got {d['batch_size']!r}")
        if d["status"] not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {d['status']!r}")
        if d.get("measurement") is not None:
            d["measurement"] = Measurement.from_dict(d["measurement"])
        for name in ("notes", "warnings"):
            if d.get(name) is None:
                d.pop(name, None)
        return cls(**d)


# The naive baseline's executor path (gpuopt.serving.NaiveBatcher.path, a layer above this one).
NAIVE_PATH = "naive-python"


def llm_mode(prompt_len: int, new_tokens: int) -> str:
    """An LLM decode row's mode: ``llm:p128+n256`` (prompt tokens, generated tokens).

    >>> llm_mode(128, 256)
    'llm:p128+n256'
    """
    return f"llm:p{int(prompt_len)}+n{int(new_tokens)}"


def serving_mode(load: dict[str, Any], *, naive: bool = False, label: str | None = None) -> str:
    """A serving row's mode: ``serve:<scenario>``, then its load point -- ``@1200/s`` (server, with the
    arrival process unless Poisson: ``@1200/s gamma``, ``@trace``), ``@16 clients`` (closed loop) --
    then ``naive`` for the naive baseline and the caller's ``label``. Rows are keyed by model, config,
    batch size and mode, so a latency curve, its naive baseline and differently tuned batchers are
    rows of one Results.

    >>> serving_mode({"scenario": "server", "rate": 1200.0, "arrival": "poisson"}, naive=True)
    'serve:server @1200/s naive'
    """
    scenario = load["scenario"]
    parts = [f"serve:{scenario}"]
    arrival = load.get("arrival", "poisson")
    if scenario == "server":
        if arrival == "trace":
            parts.append("@trace")
        elif load.get("rate") is not None:
            parts.append(f"@{load['rate']:.6g}/s" + ("" if arrival == "poisson" else f" {arrival}"))
    elif scenario == "closed-loop":
        parts.append(f"@{load.get('concurrency', 1)} clients")
    if naive:
        parts.append("naive")
    if label:
        parts.append(str(label))
    return " ".join(parts)


DIST_ROLES = ("rank", "aggregate", "single", "split")


def dist_mode(mode: str, role: str, world_size: int, rank: int = 0) -> str:
    """A distributed row's mode: ``throughput @rank1/4`` (one rank's replica), ``throughput @4 ranks``
    (the aggregate of all ranks), ``throughput @1 rank`` (rank 0 alone: the baseline of the scaling
    efficiency), ``host split @4 ranks`` (one global batch split over the ranks, timed on rank 0).
    Rows are keyed by model, config, batch size and mode, so all of them fit one Results.

    >>> dist_mode("throughput", "rank", 4, rank=1), dist_mode("throughput", "aggregate", 4)
    ('throughput @rank1/4', 'throughput @4 ranks')
    >>> dist_mode("host", "split", 2)
    'host split @2 ranks'
    """
    if role == "rank":
        return f"{mode} @rank{rank}/{world_size}"
    if role == "aggregate":
        return f"{mode} @{world_size} ranks"
    if role == "split":
        return f"{mode} split @{world_size} ranks"
    if role == "single":
        return f"{mode} @1 rank"
    raise ValueError(f"role must be one of {', '.join(DIST_ROLES)}, got {role!r}")


_FIELDS = {f.name for f in fields(Row)}
_MEASURED = {"status", "error", "measurement", "latency_ms", "throughput_items_per_s", "ci95_ms", "ci_rel",
             "peak_memory", "warnings", "diagnosis", "timing"}


def _check_facts(facts: dict[str, Any]) -> None:
    bad = sorted(set(facts) - (_FIELDS - _MEASURED))
    if bad:
        raise TypeError(f"{', '.join(bad)} cannot be given as facts of a row (unknown, or set by the constructor)")


def read_cells(path: str | os.PathLike) -> list[Row]:
    """The rows of a sweep's ``cells.jsonl``, one JSON row per line (version 1 lines, with
    ``config_label``, are read too). A line that is not JSON was cut short by a crash: it is skipped,
    so its cell counts as not run; a later line of the same cell replaces an earlier one."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read cells file {str(path)!r}: {exc.strerror or exc}") from exc
    rows: dict[Key, Row] = {}
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            continue
        try:
            row = Row.from_dict(d, version=1 if isinstance(d, dict) and "config_label" in d else SCHEMA_VERSION)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}:{i}: row {exc}") from exc
        rows[row.key] = row
    return list(rows.values())


CSV_COLUMNS = [
    "model", "config", "precision", "batch_size", "mode", "status", "error", "p50_ms", "p95_ms", "p99_ms",
    "mean_ms", "ci95_low_ms", "ci95_high_ms", "throughput_items_per_s", "item_unit", "ci_rel",
    "peak_allocated_mib", "parity_passed", "parity_worst_rel_l2", "prepare_s", "first_call_ms",
    "runner_overhead_s", "achieved_tflops", "pct_of_compute_ceiling", "achieved_gbps", "bound", "diagnosis",
    "device", "p90_ms", "p99_9_ms", "offered_rate_per_s", "valid", "ttft_p50_ms", "tpot_p50_ms", "pct_of_hbm_read",
    "rank", "world_size", "scaling_efficiency", "strategy", "scatter_ms", "gather_ms", "compute_share",
    "joules_per_item", "items_per_joule", "avg_power_w", "share_of_power_limit", "energy_method",
    "parity_top1_agreement",
]
# The DataFrame's dtypes: numbers stay numbers (NaN where a cell failed or a figure is missing).
_FLOAT_COLUMNS = [
    "p50_ms", "p95_ms", "p99_ms", "mean_ms", "ci95_low_ms", "ci95_high_ms", "throughput_items_per_s", "ci_rel",
    "peak_allocated_mib", "parity_worst_rel_l2", "prepare_s", "first_call_ms", "runner_overhead_s",
    "achieved_tflops", "pct_of_compute_ceiling", "achieved_gbps", "p90_ms", "p99_9_ms", "offered_rate_per_s",
    "ttft_p50_ms", "tpot_p50_ms", "pct_of_hbm_read", "scaling_efficiency", "scatter_ms", "gather_ms",
    "compute_share", "joules_per_item", "items_per_joule", "avg_power_w", "share_of_power_limit",
    "parity_top1_agreement",
]


def _flat(row: Row) -> dict[str, Any]:
    lat = row.latency_ms or {}
    par = row.parity or {}
    roof = row.roofline or {}
    alloc = (row.peak_memory or {}).get("max_allocated_bytes")
    ci = row.ci95_ms or [None, None]
    serving = row.serving or {}
    llm = row.llm or {}
    dist = row.dist or {}
    energy = row.energy or {}
    return {
        "model": row.model, "config": row.config, "precision": row.precision, "batch_size": row.batch_size,
        "mode": row.mode, "status": row.status, "error": row.error, "p50_ms": lat.get("p50"),
        "p95_ms": lat.get("p95"), "p99_ms": lat.get("p99"), "mean_ms": lat.get("mean"),
        "ci95_low_ms": ci[0], "ci95_high_ms": ci[1],
        "throughput_items_per_s": row.throughput_items_per_s, "item_unit": row.item_unit, "ci_rel": row.ci_rel,
        "peak_allocated_mib": None if alloc is None else alloc / 2**20, "parity_passed": par.get("passed"),
        "parity_worst_rel_l2": par.get("worst_rel_l2"), "parity_top1_agreement": par.get("top1_agreement"),
        "prepare_s": row.prepare_s,
        "first_call_ms": row.first_call_ms, "runner_overhead_s": row.runner_overhead_s,
        "achieved_tflops": roof.get("achieved_tflops"), "pct_of_compute_ceiling": roof.get("pct_of_compute_ceiling"),
        "achieved_gbps": roof.get("achieved_gbps", llm.get("achieved_gbps")), "bound": roof.get("bound"),
        "diagnosis": row.diagnosis, "device": row.device, "p90_ms": lat.get("p90"), "p99_9_ms": lat.get("p99.9"),
        "offered_rate_per_s": serving.get("target_rate") or None, "valid": serving.get("valid"),
        "ttft_p50_ms": (llm.get("ttft_ms") or {}).get("p50"), "tpot_p50_ms": (llm.get("tpot_ms") or {}).get("p50"),
        "pct_of_hbm_read": llm.get("pct_of_hbm_read"),
        "rank": dist.get("rank"), "world_size": dist.get("world_size"),
        "scaling_efficiency": dist.get("scaling_efficiency"), "strategy": dist.get("strategy"),
        "scatter_ms": dist.get("scatter_ms"), "gather_ms": dist.get("gather_ms"),
        "compute_share": dist.get("compute_share"),
        "joules_per_item": energy.get("joules_per_item"), "items_per_joule": energy.get("items_per_joule"),
        "avg_power_w": energy.get("avg_power_w"), "share_of_power_limit": energy.get("share_of_power_limit"),
        "energy_method": energy.get("method"),
    }


class Results:
    """Rows of a benchmark with its environment, one per cell; see :func:`gpuopt.benchmark`.

    >>> r = Results.load("results.json")        # doctest: +SKIP
    >>> r.find("resnet50", "fp16-amp", 32, "throughput").throughput_items_per_s   # doctest: +SKIP
    >>> r.speedups(baseline="fp32")             # doctest: +SKIP
    """

    def __init__(self, rows: Iterable[Row] = (), *, env: dict | None = None, build: dict | None = None,
                 spec: dict | None = None, created: str | None = None, profiles: dict | None = None,
                 ceilings: dict | None = None):
        self._rows: dict[Key, Row] = {}
        self.env = env or {}
        self.build = build or {}
        self.spec = spec or {}
        self.created = created or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        self.profiles: dict[str, dict] = dict(profiles or {})
        self.ceilings = ceilings  # what the roofline placement used (measured or datasheet), if any
        self._speedups: dict[str | None, list[dict]] = {}  # bootstraps are not free: report and plots share them
        for row in rows:
            self.add(row)

    @classmethod
    def new(cls, spec: dict | None = None) -> Results:
        from .._ext import build_info
        from ..timing.environment import env

        return cls(env=env(), build=build_info(), spec=spec)

    def add(self, row: Row) -> None:
        """Add the row of a cell not yet in these results (ValueError naming the cell otherwise)."""
        if not isinstance(row, Row):
            raise TypeError(f"Results hold gpuopt Row objects (Row.measured / Row.failed), got {type(row).__name__}")
        if row.key in self._rows:
            raise ValueError(f"cell {row.model} {row.config} batch {row.batch_size} {row.mode} is already in "
                             "these results")
        self._rows[row.key] = row
        self._speedups.clear()

    # ---- views -------------------------------------------------------------------------------------
    @property
    def rows(self) -> list[Row]:
        """Every row, in the order the cells were added."""
        return list(self._rows.values())

    @property
    def device(self) -> str:
        """What the rows ran on: the one device every row that names one ran on ("CPU" for the CPU, on a machine
        with GPUs too), else the first GPU of the environment ("CPU" without one)."""
        ran = {r.device for r in self._rows.values() if r.device}
        if len(ran) == 1:
            (one,) = ran
            return "CPU" if one == "cpu" else one
        gpus = self.env.get("gpus") or []
        return gpus[0]["name"] if gpus else "CPU"

    @property
    def ok(self) -> list[Row]:
        return [r for r in self._rows.values() if r.ok]

    @property
    def failed(self) -> list[Row]:
        return [r for r in self._rows.values() if not r.ok]

    def models(self) -> list[str]:
        return list(dict.fromkeys(r.model for r in self._rows.values()))

    def configs(self, model: str | None = None) -> list[str]:
        return list(dict.fromkeys(r.config for r in self._rows.values() if model is None or r.model == model))

    def batch_sizes(self, model: str | None = None) -> list[int]:
        return sorted({r.batch_size for r in self._rows.values() if model is None or r.model == model})

    def modes(self, model: str | None = None) -> list[str]:
        return list(dict.fromkeys(r.mode for r in self._rows.values() if model is None or r.model == model))

    def select(self, keep: Callable[[Row], bool]) -> Results:
        """The rows ``keep`` accepts, with this environment: e.g. the serving runs alone,
        ``results.select(lambda r: r.serving is not None)``."""
        return Results([r for r in self._rows.values() if keep(r)], env=self.env, build=self.build, spec=self.spec,
                       created=self.created, profiles=self.profiles, ceilings=self.ceilings)

    def find(self, model: str, config: str, batch_size: int, mode: str) -> Row | None:
        """The row of one cell (``config`` is the label the rows show), or None."""
        return self._rows.get((model, config, batch_size, mode))

    def baseline_config(self, model: str | None = None) -> str | None:
        cfgs = self.configs(model)
        return cfgs[0] if cfgs else None

    def speedups(self, baseline: str | None = None) -> list[dict]:
        """Per model, batch size and mode: each config's speedup over ``baseline`` (default: the first
        config) -- the ratio of medians with its 95% block-bootstrap interval and the verdict of
        :func:`gpuopt.compare`. ValueError naming the configs there are when ``baseline`` is none of them."""
        if baseline is not None and baseline not in self.configs():
            raise ValueError(f"baseline {baseline!r} is not a config of these results; configs: "
                             f"{', '.join(self.configs()) or 'none'}")
        if baseline not in self._speedups:
            self._speedups[baseline] = self._compute_speedups(baseline)
        return self._speedups[baseline]

    def _compute_speedups(self, baseline: str | None) -> list[dict]:
        out = []
        for model in self.models():
            base = baseline or self.baseline_config(model)
            for b in self.batch_sizes(model):
                for mode in self.modes(model):
                    ref = self.find(model, base, b, mode)
                    if ref is None or ref.measurement is None:
                        continue
                    for cfg in self.configs(model):
                        row = self.find(model, cfg, b, mode)
                        if cfg == base or row is None:
                            continue
                        cell = {"model": model, "config": cfg, "baseline": base, "batch_size": b, "mode": mode}
                        if row.measurement is None:
                            out.append({**cell, "speedup": None, "error": row.error})
                            continue
                        c: Comparison = compare(ref.measurement, row.measurement)
                        out.append({**cell, "speedup": c.speedup, "ci": list(c.ci), "verdict": c.verdict})
        return out

    # ---- formats -----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "created": self.created, "device": self.device, "env": self.env,
                "build": self.build, "spec": self.spec, "rows": [r.to_dict() for r in self._rows.values()],
                "profiles": self.profiles, "ceilings": self.ceilings}

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=1, default=str)
        if path is not None:
            write_atomic(path, text)
        return text

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Results:
        """Results from :meth:`to_dict`, or from a version 1 document (gpuopt 0.1)."""
        if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
            raise ValueError("not a gpuopt results document: no 'rows' list")
        version = doc.get("schema_version", 1)
        if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= SCHEMA_VERSION:
            raise ValueError(f"results schema_version {version!r} is not one this gpuopt reads "
                             f"(1 to {SCHEMA_VERSION}); upgrade gpuopt")
        rows = []
        for i, d in enumerate(doc["rows"], 1):
            try:
                rows.append(Row.from_dict(d, version))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"row {i} {exc}") from exc
        return cls(rows, env=doc.get("env"), build=doc.get("build"), spec=doc.get("spec"),
                   created=doc.get("created"), profiles=doc.get("profiles"), ceilings=doc.get("ceilings"))

    @classmethod
    def load(cls, path: str | os.PathLike) -> Results:
        """Read a results JSON (from :meth:`to_json` / :meth:`save`) or a sweep's ``cells.jsonl`` (with
        the environment from the ``sweep.json`` beside it), of this schema version or version 1."""
        path = Path(path)
        if path.suffix == ".jsonl":
            header_path = path.parent / "sweep.json"
            header = json.loads(header_path.read_text()) if header_path.exists() else {}
            return cls(read_cells(path), env=header.get("env"), build=header.get("build"), spec=header.get("spec"),
                       created=header.get("created"))
        try:
            text = path.read_text()
        except OSError as exc:
            raise ValueError(f"cannot read results file {str(path)!r}: {exc.strerror or exc}") from exc
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno})") from exc
        try:
            return cls.from_dict(doc)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from exc

    def to_csv(self, path: str | os.PathLike | None = None) -> str:
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for r in self._rows.values():
            w.writerow(_flat(r))
        if path is not None:
            write_atomic(path, buf.getvalue())
        return buf.getvalue()

    def to_dataframe(self):
        """A pandas DataFrame with the CSV columns (pandas is an optional dependency): the label in
        ``config`` as in the rows, timings and throughput as float64 (NaN for a failed cell),
        ``batch_size`` int64, ``parity_passed`` and ``valid`` (serving rows) nullable booleans, ``rank`` and
        ``world_size`` (distributed rows) nullable integers.

        >>> df = Results.load("results.json").to_dataframe()   # doctest: +SKIP
        >>> df.groupby("config")["throughput_items_per_s"].max()   # doctest: +SKIP
        """
        try:
            import pandas as pd
        except ImportError as exc:
            raise ImportError("Results.to_dataframe needs pandas: pip install pandas") from exc
        df = pd.DataFrame([_flat(r) for r in self._rows.values()], columns=CSV_COLUMNS)
        df[_FLOAT_COLUMNS] = df[_FLOAT_COLUMNS].astype("float64")
        return df.astype({"batch_size": "int64", "parity_passed": "boolean", "valid": "boolean", "rank": "Int64",
                          "world_size": "Int64"})

    def to_markdown(self, baseline: str | None = None) -> str:
        from .markdown import markdown

        return markdown(self, baseline=baseline)

    def save(self, output_dir: str | os.PathLike, *, plots: bool = True) -> dict[str, Path]:
        """Write results.json, results.csv, report.md and (with matplotlib) PNG and SVG plots."""
        out = check_writable(output_dir)
        paths = {"json": out / "results.json", "csv": out / "results.csv", "markdown": out / "report.md"}
        self.to_json(paths["json"])
        self.to_csv(paths["csv"])
        write_atomic(paths["markdown"], self.to_markdown())
        if plots and self.ok:
            try:
                from .plots import save_all

                paths.update(save_all(self, out))
            except ImportError:
                pass  # matplotlib is optional; the tables stand alone
        return paths

    # ---- display -----------------------------------------------------------------------------------
    def warning_lines(self, limit: int = 50) -> list[str]:
        """The measurements' warnings (noise, target not met, launch-bound, throttled clocks), one
        line per cell and warning, at most ``limit`` and a count of the rest: what the report's
        Warnings section and the terminal table show."""
        warned = [f"{r.model} b{r.batch_size} {r.config} {r.mode}: {w}" for r in self.ok for w in r.warnings]
        return warned[:limit] + ([f"... and {len(warned) - limit} more"] if len(warned) > limit else [])

    def table(self, *, details: bool = True) -> str:
        """A plain-text table of every row (what `gpuopt bench` prints), columns sized to their
        content; then, with ``details``, each failed cell's reason and the warnings, wrapped."""
        from .table import text_table, wrapped

        rows = []
        for r in self._rows.values():
            lat = r.latency_ms or {}
            tput = r.throughput_items_per_s
            rows.append([r.model, r.config, str(r.batch_size), r.mode,
                         format_ms(lat["p50"]) if lat else "-", format_ms(lat["p95"]) if lat else "-",
                         f"±{r.ci_rel:.1%}" if r.ci_rel is not None else "-", f"{tput:,.0f}" if tput else "-",
                         "failed (below)" if not r.ok else (r.diagnosis or "")])
        lines = [text_table(["model", "config", "batch", "mode", "p50", "p95", "p50 CI", "items/s", "note"], rows,
                            [False, False, True, False, True, True, True, True, False])]
        if details and self.failed:
            lines += ["", "failed cells:"]
            lines += [wrapped(f"  {r.model} b{r.batch_size} {r.config} {r.mode}: ", r.error or "") for r in self.failed]
        warnings = self.warning_lines() if details else []
        if warnings:
            lines += ["", "warnings:"] + [wrapped("  ", w) for w in warnings]
        return "\n".join(lines)

    def grid(self, mode: str | None = None) -> str:
        """The measured cells of one ``mode`` (default: the first) as a grid, like
        ``torch.utils.benchmark.Compare``: a row per model and config, a column per batch size, each cell
        the median with its interval (see :func:`gpuopt.report.grid_table.grid`)."""
        from .grid_table import grid

        modes = list(dict.fromkeys(r.mode for r in self.ok))
        if not modes:
            raise ValueError("no measured cell to show in a grid")
        mode = modes[0] if mode is None else mode
        if mode not in modes:
            raise ValueError(f"mode {mode!r} has no measured cell; measured modes: {', '.join(modes)}")
        cells = {(f"{r.model} {r.config}", f"batch {r.batch_size}"): r.measurement
                 for r in self.ok if r.mode == mode and r.measurement is not None}
        return grid(cells, title=f"{mode} on {self.device}")

    def __repr__(self) -> str:
        return (f"Results({len(self._rows)} rows, {len(self.failed)} failed, models {self.models()}, "
                f"device {self.device})")

    def _repr_html_(self) -> str:
        import html

        rows = "".join(
            "<tr>" + "".join(f"<td>{html.escape(str(v) if v is not None else '-')}</td>" for v in (
                r.model, r.config, r.batch_size, r.mode,
                format_ms(r.latency_ms["p50"]) if r.latency_ms else "-",
                f"{r.throughput_items_per_s:,.0f}" if r.throughput_items_per_s else "-",
                r.status if r.ok else (r.error or "")[:80])) + "</tr>"
            for r in self._rows.values())
        head = "".join(f"<th>{h}</th>" for h in ("model", "config", "batch", "mode", "p50", "items/s", "status"))
        return f"<div><b>{html.escape(repr(self))}</b><table><tr>{head}</tr>{rows}</table></div>"


def merge(results: Iterable[Results]) -> Results:
    """Rows of several Results in one (environment of the first); a cell present twice is a ValueError."""
    items = list(results)
    if not items:
        raise ValueError("nothing to merge")
    out = Results(env=items[0].env, build=items[0].build, spec=items[0].spec, created=items[0].created)
    for r in items:
        for row in r.rows:
            out.add(row)
        out.profiles.update(r.profiles)
    return out
