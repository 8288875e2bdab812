"""Results of a benchmark or sweep: one row per (model, config, batch size, mode), the environment,
speedups with confidence intervals, and every file format a report needs -- written atomically, so
an interrupted run never leaves a corrupt JSON or CSV."""

from __future__ import annotations

import csv
import datetime as _dt
import io
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .._files import check_writable, write_atomic
from ..timing.compare import Comparison, compare
from ..timing.measurement import Measurement, format_ms

SCHEMA_VERSION = 1

CSV_COLUMNS = [
    "model", "config", "precision", "batch_size", "mode", "status", "error", "p50_ms", "p95_ms", "p99_ms",
    "mean_ms", "throughput_items_per_s", "item_unit", "ci_rel", "peak_allocated_mib", "parity_passed",
    "parity_worst_rel_l2", "prepare_s", "first_call_ms", "runner_overhead_s", "achieved_tflops",
    "pct_of_compute_ceiling", "achieved_gbps", "bound", "diagnosis", "device",
]


def _flat(row: dict) -> dict[str, Any]:
    lat = row.get("latency_ms") or {}
    mem = row.get("peak_memory") or {}
    par = row.get("parity") or {}
    roof = row.get("roofline") or {}
    alloc = mem.get("max_allocated_bytes")
    return {
        "model": row["model"], "config": row.get("config_label", row["config"]), "precision": row.get("precision"),
        "batch_size": row["batch_size"], "mode": row["mode"], "status": row["status"], "error": row.get("error"),
        "p50_ms": lat.get("p50"), "p95_ms": lat.get("p95"), "p99_ms": lat.get("p99"), "mean_ms": lat.get("mean"),
        "throughput_items_per_s": row.get("throughput_items_per_s"), "item_unit": row.get("item_unit"),
        "ci_rel": row.get("ci_rel"), "peak_allocated_mib": None if alloc is None else alloc / 2**20,
        "parity_passed": par.get("passed"), "parity_worst_rel_l2": par.get("worst_rel_l2"),
        "prepare_s": row.get("prepare_s"), "first_call_ms": row.get("first_call_ms"),
        "runner_overhead_s": row.get("runner_overhead_s"), "achieved_tflops": roof.get("achieved_tflops"),
        "pct_of_compute_ceiling": roof.get("pct_of_compute_ceiling"), "achieved_gbps": roof.get("achieved_gbps"),
        "bound": roof.get("bound"), "diagnosis": row.get("diagnosis"), "device": row.get("device"),
    }


class Results:
    """Rows of a benchmark with its environment; see :func:`gpuopt.benchmark`.

    >>> r = Results.load("results.json")        # doctest: +SKIP
    >>> r.speedups(baseline="fp32")             # doctest: +SKIP
    """

    def __init__(self, rows: list[dict] | None = None, *, env: dict | None = None, build: dict | None = None,
                 spec: dict | None = None, created: str | None = None, profiles: dict | None = None,
                 ceilings: dict | None = None):
        self.rows: list[dict] = list(rows or [])
        self.env = env or {}
        self.build = build or {}
        self.spec = spec or {}
        self.created = created or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        self.profiles: dict[str, dict] = dict(profiles or {})
        self.ceilings = ceilings  # what the roofline placement used (measured or datasheet), if any
        self._speedups: dict[tuple, list[dict]] = {}  # bootstraps are not free: report and plots share them

    @classmethod
    def new(cls, spec: dict | None = None) -> Results:
        from .._ext import build_info
        from ..timing.environment import env

        return cls(env=env(), build=build_info(), spec=spec)

    def add(self, row: dict) -> None:
        self.rows.append(row)

    # ---- views -------------------------------------------------------------------------------------
    @property
    def device(self) -> str:
        gpus = self.env.get("gpus") or []
        return gpus[0]["name"] if gpus else "CPU"

    @property
    def ok(self) -> list[dict]:
        return [r for r in self.rows if r["status"] == "ok"]

    @property
    def failed(self) -> list[dict]:
        return [r for r in self.rows if r["status"] != "ok"]

    def models(self) -> list[str]:
        return list(dict.fromkeys(r["model"] for r in self.rows))

    def configs(self, model: str | None = None) -> list[str]:
        return list(dict.fromkeys(r.get("config_label", r["config"]) for r in self.rows
                                  if model is None or r["model"] == model))

    def batch_sizes(self, model: str | None = None) -> list[int]:
        return sorted({r["batch_size"] for r in self.rows if model is None or r["model"] == model})

    def modes(self, model: str | None = None) -> list[str]:
        return list(dict.fromkeys(r["mode"] for r in self.rows if model is None or r["model"] == model))

    def find(self, model: str, config: str, batch_size: int, mode: str) -> dict | None:
        for r in self.rows:
            if (r["model"], r.get("config_label", r["config"]), r["batch_size"], r["mode"]) == (
                    model, config, batch_size, mode):
                return r
        return None

    @staticmethod
    def measurement(row: dict) -> Measurement | None:
        return Measurement.from_dict(row["measurement"]) if row.get("measurement") else None

    def baseline_config(self, model: str | None = None) -> str | None:
        cfgs = self.configs(model)
        return cfgs[0] if cfgs else None

    def speedups(self, baseline: str | None = None) -> list[dict]:
        """Per model, batch size and mode: each config's speedup over ``baseline`` (default: the first
        config) -- the ratio of medians with its 95% block-bootstrap interval and verdict."""
        key = (baseline, len(self.rows))
        if key not in self._speedups:
            self._speedups[key] = self._compute_speedups(baseline)
        return self._speedups[key]

    def _compute_speedups(self, baseline: str | None) -> list[dict]:
        out = []
        for model in self.models():
            base = baseline or self.baseline_config(model)
            for b in self.batch_sizes(model):
                for mode in self.modes(model):
                    ref = self.find(model, base, b, mode)
                    m_ref = self.measurement(ref) if ref else None
                    if m_ref is None:
                        continue
                    for cfg in self.configs(model):
                        row = self.find(model, cfg, b, mode)
                        if cfg == base or row is None:
                            continue
                        m = self.measurement(row)
                        if m is None:
                            out.append({"model": model, "config": cfg, "baseline": base, "batch_size": b, "mode": mode,
                                        "speedup": None, "error": row.get("error")})
                            continue
                        c: Comparison = compare(m_ref, m)
                        out.append({"model": model, "config": cfg, "baseline": base, "batch_size": b, "mode": mode,
                                    "speedup": c.speedup, "ci": list(c.ci), "verdict": c.verdict})
        return out

    # ---- formats -----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "created": self.created, "device": self.device, "env": self.env,
                "build": self.build, "spec": self.spec, "rows": self.rows, "profiles": self.profiles,
                "ceilings": self.ceilings}

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=1, default=str)
        if path is not None:
            write_atomic(path, text)
        return text

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Results:
        if not isinstance(doc, dict) or "rows" not in doc:
            raise ValueError("not a gpuopt results document: no 'rows'")
        version = doc.get("schema_version")
        if not isinstance(version, int) or version > SCHEMA_VERSION:
            raise ValueError(f"results schema_version {version!r} is not one this gpuopt reads "
                             f"(<= {SCHEMA_VERSION}); upgrade gpuopt")
        return cls(doc["rows"], env=doc.get("env"), build=doc.get("build"), spec=doc.get("spec"),
                   created=doc.get("created"), profiles=doc.get("profiles"), ceilings=doc.get("ceilings"))

    @classmethod
    def load(cls, path: str | os.PathLike) -> Results:
        """Read a results JSON (from :meth:`to_json` / :meth:`save`) or a sweep's cells JSONL."""
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ValueError(f"cannot read results file {str(path)!r}: {exc.strerror or exc}") from exc
        if path.suffix == ".jsonl":
            rows = []
            for i, line in enumerate(text.splitlines(), 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise ValueError(f"{path}:{i}: not a JSON line ({exc.msg})") from exc
            header = json.loads((path.parent / "sweep.json").read_text()) if (path.parent / "sweep.json").exists() else {}
            return cls(rows, env=header.get("env"), build=header.get("build"), spec=header.get("spec"),
                       created=header.get("created"))
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno})") from exc
        return cls.from_dict(doc)

    def to_csv(self, path: str | os.PathLike | None = None) -> str:
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for r in self.rows:
            w.writerow(_flat(r))
        if path is not None:
            write_atomic(path, buf.getvalue())
        return buf.getvalue()

    def to_dataframe(self):
        """A pandas DataFrame with the CSV columns (pandas is an optional dependency)."""
        try:
            import pandas as pd
        except ImportError as exc:
            raise ImportError("Results.to_dataframe needs pandas: pip install pandas") from exc
        return pd.DataFrame([_flat(r) for r in self.rows], columns=CSV_COLUMNS)

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
    def table(self) -> str:
        """A plain-text table of every row (what `gpuopt bench` prints)."""
        head = f"{'model':12s} {'config':32s} {'batch':>5s} {'mode':11s} {'p50':>10s} {'p95':>10s} {'items/s':>10s}  note"
        lines = [head, "-" * len(head)]
        for r in self.rows:
            lat = r.get("latency_ms") or {}
            tput = r.get("throughput_items_per_s")
            note = (r.get("error") or "")[:70] if r["status"] != "ok" else (r.get("diagnosis") or "")
            lines.append(f"{r['model'][:12]:12s} {r.get('config_label', r['config'])[:32]:32s} {r['batch_size']:>5d} "
                         f"{r['mode']:11s} {format_ms(lat['p50']) if lat else '-':>10s} "
                         f"{format_ms(lat['p95']) if lat else '-':>10s} {f'{tput:,.0f}' if tput else '-':>10s}  {note}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"Results({len(self.rows)} rows, {len(self.failed)} failed, models {self.models()}, "
                f"device {self.device})")

    def _repr_html_(self) -> str:
        import html

        rows = "".join(
            "<tr>" + "".join(f"<td>{html.escape(str(v) if v is not None else '-')}</td>" for v in (
                r["model"], r.get("config_label", r["config"]), r["batch_size"], r["mode"],
                format_ms((r.get("latency_ms") or {}).get("p50")) if r.get("latency_ms") else "-",
                f"{r['throughput_items_per_s']:,.0f}" if r.get("throughput_items_per_s") else "-",
                r["status"] if r["status"] == "ok" else (r.get("error") or "")[:80])) + "</tr>"
            for r in self.rows)
        head = "".join(f"<th>{h}</th>" for h in ("model", "config", "batch", "mode", "p50", "items/s", "status"))
        return f"<div><b>{html.escape(repr(self))}</b><table><tr>{head}</tr>{rows}</table></div>"


def merge(results: Iterable[Results]) -> Results:
    """Rows of several Results in one (environment of the first)."""
    items = list(results)
    if not items:
        raise ValueError("nothing to merge")
    out = Results(env=items[0].env, build=items[0].build, spec=items[0].spec, created=items[0].created)
    for r in items:
        out.rows.extend(r.rows)
        out.profiles.update(r.profiles)
    return out
