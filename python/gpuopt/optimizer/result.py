"""What :func:`gpuopt.optimize` answers: the best config and batch size with its figures, the runner-up
and the interleaved comparison of the two, the Pareto fronts, the search log, the closest candidates
when nothing meets the budget, every measurement as :class:`~gpuopt.Results`, and the winner prepared."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..prepare.config import Prepared
from ..report.results import Results, Row
from ..timing.comparison import Comparison
from .space import OBJECTIVE_UNITS, request_p99, request_quantile


@dataclass
class LogEntry:
    """One step of the search: a candidate (config at a batch size) measured, pruned, failed, dropped by a
    rung, or found outside the constraints; why, and its figures when it was measured."""

    config: str
    batch_size: int
    rung: int | None
    # "measured", "remeasured", "undecided", "pruned", "failed", "dropped", "infeasible", "skipped",
    # "revisited", and at the end "chosen" / "kept second" (the interleaved run with the best, see the answer)
    action: str
    reason: str | None = None
    figures: dict[str, Any] | None = None
    at_s: float = 0.0  # seconds into the search

    def line(self) -> str:
        rung = f"rung {self.rung}" if self.rung is not None else "-"
        figs = _figures_text(self.figures) if self.figures else ""
        why = f": {self.reason}" if self.reason else ""
        return f"{self.at_s:7.1f} s  {rung:7}  {self.action:10}  {self.config} b{self.batch_size}{why}" + (
            f"  [{figs}]" if figs else "")


def _figures_text(f: dict[str, Any]) -> str:
    parts = []
    if f.get("items_per_s") is not None:
        parts.append(f"{f['items_per_s']:.4g} items/s")
    if f.get("p99_ms") is not None:
        parts.append(f"p99 {f['p99_ms']:.4g} ms")
    if f.get("memory_gb") is not None:
        parts.append(f"{f['memory_gb']:.3g} GB")
    if f.get("joules_per_item") is not None:
        parts.append(f"{f['joules_per_item']:.4g} J/item")
    return ", ".join(parts)


def figures(row: Row, gb: float | None, gb_source: str) -> dict[str, Any]:
    """A candidate's figures: ``p50_ms`` / ``p99_ms`` are a request's (the SLO's: :func:`space.request_p99`),
    ``device_p50_ms`` / ``device_p99_ms`` the device time's alone; items/s come from the device median."""
    lat = row.latency_ms or {}
    e = row.energy or {}
    return {"items_per_s": row.throughput_items_per_s, "p50_ms": request_quantile(row, 0.5),
            "p99_ms": request_p99(row), "device_p50_ms": lat.get("p50"), "device_p99_ms": lat.get("p99"),
            "memory_gb": gb, "memory_source": gb_source,
            "joules_per_item": e.get("joules_per_item"), "ci_rel": row.ci_rel,
            "samples": (row.timing or {}).get("n"), "mode": row.mode}


@dataclass
class Choice:
    """A candidate the search answers with: its config, batch size, the figures of its longest measurement
    and flags (e.g. far below its roofline)."""

    config: str
    batch_size: int
    objective_value: float
    figures: dict[str, Any]
    rung: int
    flags: list[str] = field(default_factory=list)
    row: Row | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("row")
        return d


@dataclass
class OptimizeResult:
    """The optimizer's answer. ``best`` is None when no candidate met the constraints: then ``closest``
    lists the candidates nearest to them and by how much they miss, and ``failures`` the reasons of every
    config that could not run at all."""

    model: str
    device: str
    objective: str
    constraints: dict[str, Any]
    mode: str
    best: Choice | None
    runner_up: Choice | None
    comparison: Comparison | None  # interleaved: runner-up (baseline) vs best (candidate)
    ratio: dict[str, Any] | None  # best / runner-up in the objective's unit, with the comparison's interval
    pareto: dict[str, list[dict[str, Any]]]
    log: list[LogEntry]
    results: Results
    prepared: Prepared | None = field(default=None, repr=False)
    closest: list[dict[str, Any]] = field(default_factory=list)
    failures: dict[str, list[str]] = field(default_factory=dict)
    stopped: str | None = None  # why the search ended before its end (budget_s)
    search_s: float = 0.0
    candidates: int = 0  # (config, batch) pairs in the space
    measured: int = 0  # of them, measured at least once
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def found(self) -> bool:
        return self.best is not None

    def summary(self) -> str:
        """A few lines: the answer (or the closest candidates), the runner-up and the interval."""
        unit = OBJECTIVE_UNITS[self.objective]
        cons = ", ".join(f"{k} <= {v:g}" for k, v in self.constraints.items() if v is not None) or "none"
        head = (f"optimize {self.model} on {self.device}: objective {self.objective} ({unit}), constraints {cons}; "
                f"{self.measured} of {self.candidates} candidates measured in {self.search_s:.1f} s")
        lines = [head]
        if self.stopped:
            lines.append(f"stopped early: {self.stopped}")
        if self.best is None:
            lines.append("no candidate meets the constraints")
            for c in self.closest[:5]:
                miss = ", ".join(f"{k.replace('_over', '')} over by {v:.3g}" for k, v in c["misses"].items())
                lines.append(f"  closest: {c['config']} b{c['batch_size']}: {miss} ({_figures_text(c['figures'])})")
            for cfg, reasons in self.failures.items():
                lines.append(f"  {cfg} failed: {reasons[0]}" + (f" (+{len(reasons) - 1} more)" if len(reasons) > 1
                                                                  else ""))
            return "\n".join(lines)
        b = self.best
        lines.append(f"best: {b.config} at batch {b.batch_size}: {b.objective_value:.4g} {unit} "
                     f"({_figures_text(b.figures)})")
        for flag in b.flags:
            lines.append(f"  note: {flag}")
        if self.runner_up is not None:
            r = self.runner_up
            lines.append(f"runner-up: {r.config} at batch {r.batch_size}: {r.objective_value:.4g} {unit}")
        if self.ratio is not None:
            lo, hi = self.ratio["ci"]
            lines.append(f"best vs runner-up: {self.ratio['value']:.3f}x [{self.ratio['confidence']:.0%} CI "
                         f"{lo:.3f} .. {hi:.3f}] ({self.ratio['what']}: {self.ratio['verdict']})")
        return "\n".join(lines)

    __str__ = summary

    def __repr__(self) -> str:
        return f"<OptimizeResult {self.summary().splitlines()[1] if self.found or self.stopped else 'no answer'}>"

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "device": self.device, "objective": self.objective,
                "constraints": self.constraints, "mode": self.mode,
                "best": self.best.to_dict() if self.best else None,
                "runner_up": self.runner_up.to_dict() if self.runner_up else None,
                "comparison": self.comparison.to_dict() if self.comparison else None, "ratio": self.ratio,
                "pareto": self.pareto, "log": [asdict(e) for e in self.log], "closest": self.closest,
                "failures": self.failures, "stopped": self.stopped, "search_s": self.search_s,
                "candidates": self.candidates, "measured": self.measured, "settings": self.settings}

    def to_markdown(self) -> str:
        """The answer, the Pareto front and the search log as Markdown."""
        out = [f"# optimize: {self.model} on {self.device}", "", "```", self.summary(), "```", ""]
        front = self.pareto.get("throughput_vs_p99", [])
        if front:
            out += ["## Pareto front: throughput vs p99 latency", "", "| config | batch | items/s | p99 ms | GB |",
                    "|---|---:|---:|---:|---:|"]
            for p in front:
                out.append(f"| {p['config']} | {p['batch_size']} | {_num(p['items_per_s'])} | {_num(p['p99_ms'])} "
                           f"| {_num(p['memory_gb'])} |")
            out.append("")
        front = self.pareto.get("throughput_vs_memory", [])
        if front:
            out += ["## Pareto front: throughput vs memory", "", "| config | batch | items/s | GB |",
                    "|---|---:|---:|---:|"]
            for p in front:
                out.append(f"| {p['config']} | {p['batch_size']} | {_num(p['items_per_s'])} | {_num(p['memory_gb'])} |")
            out.append("")
        out += ["## Search log", "", "```", *(e.line() for e in self.log), "```", ""]
        return "\n".join(out)

    def plot_front(self, ax=None, path=None):
        """Throughput against p99 latency of every measured candidate (grey), the Pareto front (a line), the
        SLO (a vertical line) and the best (a star). Needs matplotlib; returns the Figure."""
        from ..report import plots

        fig, ax = plots._axes(ax)
        pts = self.pareto.get("measured", [])
        if not pts:
            raise ValueError("no candidate was measured: there is no front to plot")
        ax.scatter([p["p99_ms"] for p in pts], [p["items_per_s"] for p in pts], color="0.7", s=14, label="measured")
        front = sorted(self.pareto["throughput_vs_p99"], key=lambda p: p["p99_ms"])
        ax.plot([p["p99_ms"] for p in front], [p["items_per_s"] for p in front], "o-", color="C0",
                label="Pareto front")
        for p in front:
            ax.annotate(f"{p['config']} b{p['batch_size']}", (p["p99_ms"], p["items_per_s"]), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")
        if self.constraints.get("slo_p99_ms") is not None:
            ax.axvline(self.constraints["slo_p99_ms"], color="firebrick", ls="--", label="p99 SLO")
        if self.best is not None and self.best.figures.get("p99_ms") is not None:
            ax.plot([self.best.figures["p99_ms"]], [self.best.figures["items_per_s"]], "*", color="C3", ms=14,
                    label="best")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("p99 latency per call (ms)")
        ax.set_ylabel("throughput (items/s)")
        ax.set_title(f"{self.model} on {self.device}: throughput vs p99 ({self.mode} mode)")
        ax.legend(fontsize=8)
        plots._save(fig, path)
        return fig


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def pareto_front(points: list[dict[str, Any]], maximize: str, minimize: str) -> list[dict[str, Any]]:
    """The points no other point beats on both keys (``maximize`` higher, ``minimize`` lower), sorted by
    ``minimize``; points missing either key are left out."""
    pts = [p for p in points if p.get(maximize) is not None and p.get(minimize) is not None]
    front = [p for p in pts if not any(
        q[maximize] >= p[maximize] and q[minimize] <= p[minimize] and (q[maximize] > p[maximize]
                                                                      or q[minimize] < p[minimize]) for q in pts)]
    return sorted(front, key=lambda p: p[minimize])
