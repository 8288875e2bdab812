"""Roofline analysis: how much work a model does (FLOPs, bytes), how close a measured run comes to
the device's ceilings, and whether it is compute-, memory- or launch-bound.

Ceilings come as a dict (what ``gpuopt.ceilings()`` measures), any value of which may be missing::

    {"device": "NVIDIA H100 80GB HBM3",
     "measured": {"hbm_copy_gbps": ..., "fp32_fma_tflops": ...,
                  "gemm_tflops": {"fp32": ..., "tf32": ..., "fp16": ..., "bf16": ..., "fp8": ..., "int8": ...},
                  ...},
     "datasheet": DeviceSpec.to_dict() or None}

A measured figure is preferred; the datasheet fills in what was not measured, and every figure
reports which one it came from.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from .._files import atomic_path
from .counting import count_bytes, count_flops  # noqa: F401  (re-exported: part of the roofline API)
from .datasheet import PRECISIONS, DeviceSpec, lookup_dict, peak_tflops

# Below this share of both ceilings neither compute nor memory is what the run waits for.
LOW_UTILIZATION_PCT = 25.0

_GEMM_KEY = {"fp32": "fp32", "tf32": "tf32", "fp16": "fp16", "fp16-amp": "fp16", "bf16": "bf16",
             "bf16-amp": "bf16", "fp8": "fp8", "int8": "int8", "int8-wo": "bf16"}
BOUNDS = ("compute-bound", "memory-bound", "latency/launch-bound", "unknown")


def _positive(value: Any) -> float | None:
    """A usable ceiling: a finite number above zero (a failed benchmark may leave 0 or NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and value > 0 else None


def _check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}; got {precision!r}")


def _check_ceilings(ceilings: Any) -> dict:
    if ceilings is None:
        return {}
    if not isinstance(ceilings, dict):
        raise TypeError(f"ceilings must be a dict like gpuopt.ceilings() returns, got {type(ceilings).__name__}")
    return ceilings


def _datasheet(ceilings: dict) -> dict | None:
    sheet = ceilings.get("datasheet")
    if isinstance(sheet, DeviceSpec):
        return sheet.to_dict()
    if isinstance(sheet, dict):
        return sheet
    device = ceilings.get("device")
    return lookup_dict(device) if isinstance(device, str) else None


def datasheet_ceilings(device_name: str | None = None) -> dict:
    """Ceilings from the datasheet alone (nothing measured) for ``device_name`` (default: the
    current CUDA device). ``datasheet`` is None for a GPU not in the table.

    >>> datasheet_ceilings("NVIDIA L4")["datasheet"]["memory_bandwidth_gbps"]
    300
    """
    if device_name is None:
        if not torch.cuda.is_available():
            raise ValueError("device_name is needed when no CUDA device is visible")
        device_name = torch.cuda.get_device_name()
    return {"device": device_name, "measured": {}, "datasheet": lookup_dict(device_name)}


def compute_ceiling(ceilings: dict | None, precision: str) -> tuple[float | None, str | None]:
    """(TFLOP/s, "measured" | "datasheet") that matmuls under ``precision`` can reach, or (None, None).

    The measured GEMM figure of the precision comes first; for ``fp32`` (TF32 off) the larger of
    the measured fp32 GEMM and the FP32 FMA micro-benchmark. Otherwise the datasheet's figure (of
    ``ceilings["datasheet"]``, or looked up by ``ceilings["device"]``).

    >>> compute_ceiling({"measured": {"gemm_tflops": {"bf16": 790.0}}}, "bf16-amp")
    (790.0, 'measured')
    >>> compute_ceiling({"device": "NVIDIA H100 80GB HBM3"}, "bf16-amp")
    (989.5, 'datasheet')
    """
    _check_precision(precision)
    ceilings = _check_ceilings(ceilings)
    measured = ceilings.get("measured") or {}
    gemm = measured.get("gemm_tflops") or {}
    candidates = [gemm.get(_GEMM_KEY[precision])]
    if precision == "fp32":
        candidates.append(measured.get("fp32_fma_tflops"))
    values = [v for v in map(_positive, candidates) if v is not None]
    if values:
        return max(values), "measured"
    sheet = _datasheet(ceilings)
    value = _positive(peak_tflops(sheet, precision)) if sheet is not None else None
    return (value, "datasheet") if value is not None else (None, None)


def memory_ceiling(ceilings: dict | None) -> tuple[float | None, str | None]:
    """(GB/s, "measured" | "datasheet") of device memory, or (None, None): the measured copy
    bandwidth (bytes read + written), else the datasheet's memory bandwidth.

    >>> memory_ceiling({"measured": {"hbm_copy_gbps": None}, "datasheet": {"memory_bandwidth_gbps": 3350}})
    (3350.0, 'datasheet')
    """
    ceilings = _check_ceilings(ceilings)
    measured = _positive((ceilings.get("measured") or {}).get("hbm_copy_gbps"))
    if measured is not None:
        return measured, "measured"
    sheet = _datasheet(ceilings)
    value = _positive(sheet.get("memory_bandwidth_gbps")) if sheet is not None else None
    return (value, "datasheet") if value is not None else (None, None)


def _count(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0 or None, got {value!r}")
    return float(value)


def place(*, flops_per_item: float | None, bytes_per_item: float | None, items_per_s: float | None,
          precision: str, ceilings: dict | None, diagnosis: str | None = None) -> dict[str, Any]:
    """Place a measured run on the device's roofline and say what bounds it.

    ``bytes_per_item`` should be the minimum traffic (``count_bytes(...)["min_bytes"]`` per item).
    Achieved TFLOP/s and GB/s follow from ``items_per_s``; the arithmetic intensity is FLOP/byte and
    the ridge point is compute ceiling / memory ceiling (FLOP/byte). Percentages are 0-100.

    Rules, in order:

    1. ``diagnosis == "launch-bound"`` (gpuopt.measure found the host slower than the GPU):
       ``latency/launch-bound``.
    2. A FLOP count, byte count, throughput or ceiling missing: ``unknown``, with what is missing.
    3. Below 25% of both the compute and the memory ceiling: ``latency/launch-bound`` (neither
       resource is busy: launches, synchronisation, small or serial kernels).
    4. Arithmetic intensity at or above the ridge point: ``compute-bound``; below it: ``memory-bound``.

    >>> r = place(flops_per_item=2 * 8192**3, bytes_per_item=3 * 2 * 8192**2, items_per_s=600,
    ...           precision="bf16-amp", ceilings={"device": "NVIDIA H100 80GB HBM3"})
    >>> r["bound"], round(r["pct_of_compute_ceiling"])
    ('compute-bound', 67)
    """
    _check_precision(precision)
    ceilings = _check_ceilings(ceilings)
    flops = _count("flops_per_item", flops_per_item)  # 0 is a count: a copy does no FLOPs
    nbytes = _count("bytes_per_item", bytes_per_item) or None
    rate = _count("items_per_s", items_per_s) or None
    peak, compute_source = compute_ceiling(ceilings, precision)
    bandwidth, memory_source = memory_ceiling(ceilings)
    achieved_tflops = flops * rate / 1e12 if flops is not None and rate else None
    achieved_gbps = nbytes * rate / 1e9 if nbytes is not None and rate else None
    intensity = flops / nbytes if flops is not None and nbytes else None
    ridge = peak * 1e3 / bandwidth if peak and bandwidth else None
    pct_compute = 100.0 * achieved_tflops / peak if achieved_tflops is not None and peak else None
    pct_memory = 100.0 * achieved_gbps / bandwidth if achieved_gbps is not None and bandwidth else None

    numbers = []
    if achieved_tflops is not None:
        numbers.append(f"{achieved_tflops:.3g} TFLOP/s" + (
            f" = {pct_compute:.0f}% of the {peak:.4g} TFLOP/s {precision} ceiling ({compute_source})"
            if pct_compute is not None else ""))
    if achieved_gbps is not None:
        numbers.append(f"{achieved_gbps:.4g} GB/s" + (
            f" = {pct_memory:.0f}% of the {bandwidth:.4g} GB/s memory ceiling ({memory_source})"
            if pct_memory is not None else ""))
    facts = "; ".join(numbers)
    missing = [what for what, value in (("FLOP count", flops), ("byte count", nbytes), ("throughput", rate),
                                        (f"{precision} compute ceiling", peak), ("memory ceiling", bandwidth))
               if value is None]
    if diagnosis == "launch-bound":
        bound = "latency/launch-bound"
        reason = "the timing found the host slower to issue work than the GPU to run it" + (
            f"; {facts}" if facts else "")
    elif missing:
        bound = "unknown"
        reason = f"no {', no '.join(missing)}" + (f"; {facts}" if facts else "")
    elif pct_compute < LOW_UTILIZATION_PCT and pct_memory < LOW_UTILIZATION_PCT:
        bound = "latency/launch-bound"
        reason = (f"below {LOW_UTILIZATION_PCT:.0f}% of both ceilings ({facts}): neither compute nor "
                  "memory is busy; launches, synchronisation or small kernels take the time")
    elif intensity >= ridge:
        bound = "compute-bound"
        reason = (f"{intensity:.4g} FLOP/B is at or above the ridge point {ridge:.4g} FLOP/B; {facts}")
    else:
        bound = "memory-bound"
        reason = f"{intensity:.4g} FLOP/B is below the ridge point {ridge:.4g} FLOP/B; {facts}"
    return {
        "precision": precision,
        "achieved_tflops": achieved_tflops,
        "compute_ceiling_tflops": peak,
        "compute_source": compute_source,
        "pct_of_compute_ceiling": pct_compute,
        "achieved_gbps": achieved_gbps,
        "memory_ceiling_gbps": bandwidth,
        "memory_source": memory_source,
        "pct_of_memory_ceiling": pct_memory,
        "arithmetic_intensity": intensity,
        "ridge_point": ridge,
        "bound": bound,
        "reason": f"{bound}: {reason}",
    }


def roofline_points(rows: list[dict]) -> list[dict]:
    """Plot points of gpuopt result rows that carry a placed roofline (see :func:`plot_roofline`)."""
    points = []
    for row in rows:
        r = row.get("roofline") or {}
        if r.get("arithmetic_intensity") and r.get("achieved_tflops"):
            label = " ".join(str(row[k]) for k in ("model", "config") if row.get(k) is not None)
            if row.get("batch_size") is not None:
                label += f" bs{row['batch_size']}"
            points.append({"label": label, "arithmetic_intensity": r["arithmetic_intensity"],
                           "achieved_tflops": r["achieved_tflops"]})
    return points


def plain_log_ticks(axis: Any) -> None:
    """Label a log axis with plain numbers (0.1, 1, 10, 1,000) instead of powers of ten, minor ticks
    unlabelled: the plots' one tick style."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def declutter(texts: list, renderer: Any, step_pt: float = 10.0, tries: int = 60) -> None:
    """Move annotations (text offsets in points) up or down, in turn, until none overlaps one placed
    before it: a plain greedy de-overlap, judged on the rendered bounding boxes of the texts (without
    their leader lines)."""
    from matplotlib.text import Text

    placed = []
    for t in texts:
        x0, y0 = t.get_position()
        for i in range(tries):
            box = Text.get_window_extent(t, renderer)
            if not any(box.overlaps(b) for b in placed):
                break
            shift = (i // 2 + 1) * step_pt * (1 if i % 2 == 0 else -1)
            t.set_position((x0, y0 + shift))
        placed.append(Text.get_window_extent(t, renderer))


def plot_roofline(points: list[dict], ceilings: dict | None, precision: str, title: str | None = None,
                  path: str | Path | None = None, ax: Any = None) -> Any:
    """A log-log roofline: the memory slope and the ``precision`` compute roof (labelled with their
    values and whether measured or from the datasheet) and each point ``{"label",
    "arithmetic_intensity", "achieved_tflops"}``, labelled (labels moved apart so none overlaps
    another; the legend sits below the axes so it covers no point). Draws into ``ax`` when given
    (to compose figures), else into a new Figure. Returns the Figure; with ``path`` (with or without
    ``.png``) also writes ``<path>.png`` and ``<path>.svg``.

    >>> fig = plot_roofline([{"label": "gemm", "arithmetic_intensity": 2730, "achieved_tflops": 700}],
    ...                     {"device": "NVIDIA H100 80GB HBM3"}, "bf16-amp")
    >>> fig.axes[0].get_xlabel()
    'arithmetic intensity (FLOP/byte)'
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("plot_roofline needs matplotlib: pip install matplotlib") from None
    _check_precision(precision)
    ceilings = _check_ceilings(ceilings)
    if not isinstance(points, (list, tuple)):
        raise TypeError(f"points must be a list of dicts, got {type(points).__name__}")
    peak, compute_source = compute_ceiling(ceilings, precision)
    bandwidth, memory_source = memory_ceiling(ceilings)
    ridge = peak * 1e3 / bandwidth if peak and bandwidth else None
    shown = [p for p in points if (_positive(p.get("arithmetic_intensity")) and _positive(p.get("achieved_tflops")))]

    xs = [p["arithmetic_intensity"] for p in shown] + ([ridge] if ridge else [])
    lo = 10 ** math.floor(math.log10(min(xs)) - 1) if xs else 0.1
    hi = 10 ** math.ceil(math.log10(max(xs)) + 1) if xs else 1e4
    if ax is None:
        fig = Figure(figsize=(8, 5.5), layout="constrained")
        FigureCanvasAgg(fig)  # a renderer for the label placement
        ax = fig.add_subplot()
    fig = ax.figure
    ax.set_xscale("log")
    ax.set_yscale("log")
    if bandwidth:
        x_end = ridge or hi
        ax.plot([lo, x_end], [bandwidth * lo / 1e3, bandwidth * x_end / 1e3], color="tab:blue", lw=2,
                label=f"memory {bandwidth:,.0f} GB/s ({memory_source})")
    if peak:
        ax.plot([ridge or lo, hi], [peak, peak], color="tab:red", lw=2,
                label=f"{precision} compute {peak:,.1f} TFLOP/s ({compute_source})")
    if ridge:
        ax.axvline(ridge, color="grey", ls=":", lw=1, label=f"ridge point {ridge:,.0f} FLOP/B")
    labels = []
    for p in sorted(shown, key=lambda p: (-p["achieved_tflops"], p["arithmetic_intensity"])):
        ax.scatter([p["arithmetic_intensity"]], [p["achieved_tflops"]], s=30, zorder=3)
        labels.append(ax.annotate(str(p.get("label", "")), (p["arithmetic_intensity"], p["achieved_tflops"]),
                                  textcoords="offset points", xytext=(6, 4), fontsize=8,
                                  arrowprops={"arrowstyle": "-", "color": "grey", "lw": 0.5, "shrinkA": 0,
                                              "shrinkB": 3}))
    if len(shown) < len(points):
        ax.text(0.01, 0.01, f"{len(points) - len(shown)} point(s) without a positive intensity and TFLOP/s not shown (log axes)",
                transform=ax.transAxes, fontsize=8, color="grey")
    ax.set_xlim(lo, hi)
    plain_log_ticks(ax.xaxis)
    plain_log_ticks(ax.yaxis)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("performance (TFLOP/s)")
    device = ceilings.get("device") or "unknown device"
    ax.set_title(title or f"Roofline: {device}, {precision}")
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        # below the axes: it covers no point, and labels moved past the right edge do not reach it
        ax.legend(loc="upper left", bbox_to_anchor=(0.0, -0.13), borderaxespad=0.0, fontsize=8, ncol=2)
    if labels and hasattr(fig.canvas, "get_renderer"):  # Agg-based canvases: ours, pyplot's, Jupyter's
        fig.draw_without_rendering()  # the layout settles before the labels are measured
        declutter(labels, fig.canvas.get_renderer())
    if path is not None:
        path = Path(path)
        base = path.with_suffix("") if path.suffix.lower() in (".png", ".svg") else path
        for fmt, kw in (("png", {"dpi": 150}), ("svg", {})):
            with atomic_path(f"{base}.{fmt}") as tmp:  # a Ctrl-C leaves no half-written plot
                fig.savefig(tmp, format=fmt, bbox_inches="tight", **kw)
    return fig


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def roofline_markdown(rows: list[dict]) -> str:
    """The roofline section of a Markdown report: one line per result row that carries
    ``row["roofline"]`` (as :func:`place` returns), with the ceilings used and the reason."""
    if not isinstance(rows, (list, tuple)):
        raise TypeError(f"rows must be a list of result rows, got {type(rows).__name__}")
    placed = [r for r in rows if isinstance(r.get("roofline"), dict)]
    if not placed:
        return "## Roofline\n\nNo row carries a roofline placement (FLOPs, bytes or ceilings missing).\n"
    lines = [
        "## Roofline", "",
        "| model | config | batch | TFLOP/s | % of compute | compute ceiling | GB/s | % of memory "
        "| memory ceiling | FLOP/B | ridge | bound |",
        "|---|---|---:|---:|---:|---|---:|---:|---|---:|---:|---|",
    ]
    for row in placed:
        r = row["roofline"]
        peak = (f"{r['compute_ceiling_tflops']:.4g} TFLOP/s ({r['compute_source']})"
                if r.get("compute_ceiling_tflops") else "-")
        bw = f"{r['memory_ceiling_gbps']:.4g} GB/s ({r['memory_source']})" if r.get("memory_ceiling_gbps") else "-"
        lines.append(
            f"| {row.get('model', '-')} | {row.get('config', '-')} | {row.get('batch_size', '-')} "
            f"| {_fmt(r.get('achieved_tflops'), '.3g')} | {_fmt(r.get('pct_of_compute_ceiling'), '.0f')} | {peak} "
            f"| {_fmt(r.get('achieved_gbps'), '.4g')} | {_fmt(r.get('pct_of_memory_ceiling'), '.0f')} | {bw} "
            f"| {_fmt(r.get('arithmetic_intensity'), '.3g')} | {_fmt(r.get('ridge_point'), '.3g')} "
            f"| {r.get('bound', '-')} |")
    lines += ["", "Why:", ""]
    lines += [f"- {row.get('model', '-')} {row.get('config', '-')} bs{row.get('batch_size', '-')}: "
              f"{row['roofline'].get('reason', '')}" for row in placed]
    lines.append("")
    lines.append(f"Bound rules: launch-bound timing diagnosis, or under {LOW_UTILIZATION_PCT:.0f}% of both "
                 "ceilings -> latency/launch-bound; otherwise compute-bound at or above the ridge point, "
                 "memory-bound below it. Bytes are the minimum traffic estimate.")
    return "\n".join(lines) + "\n"
