"""Plots of Results (matplotlib, an optional dependency). Every function draws into ``ax`` when given
(to compose figures: ``fig, (a, b) = plt.subplots(1, 2); throughput_vs_batch(r, ax=a)``), else into a
new figure, returns the Figure (so it shows in notebooks) and, given ``path``, saves it as PNG and
SVG. Titles and axes carry the model, the device and the units; log axes are labelled with plain
numbers."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._files import atomic_path
from ..analysis.roofline import plain_log_ticks

if TYPE_CHECKING:
    from .results import Results, Row


def _plt():
    try:
        import matplotlib

        if matplotlib.get_backend().lower().startswith(("qt", "tk", "gtk", "wx", "macos")) and not _interactive():
            matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("gpuopt's plots need matplotlib: pip install matplotlib") from exc
    return plt


def _interactive() -> bool:
    import sys

    return hasattr(sys, "ps1") or "ipykernel" in sys.modules


def _save(fig, path: str | Path | None) -> None:
    if path is None:
        return
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    stem = p.with_suffix("") if p.suffix in (".png", ".svg") else p
    for fmt, kw in (("png", {"dpi": 130}), ("svg", {})):
        with atomic_path(stem.with_suffix(f".{fmt}")) as tmp:  # a Ctrl-C leaves no half-written plot
            fig.savefig(tmp, format=fmt, bbox_inches="tight", **kw)


def _axes(ax, figsize=(7, 4.5)):
    """(figure, axes): the caller's axes, or a new figure's."""
    if ax is None:
        return _plt().subplots(figsize=figsize)
    return ax.figure, ax


def _batch_axis(ax, batches: list[int]) -> None:
    """Log2 batch axis labelled with the batch sizes themselves."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.minorticks_off()
    ax.set_xlabel("batch size")


def _legend(ax, **kw) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kw)


def _style(i: int) -> dict[str, str]:
    """Line i's colour, and a dash pattern once the ten colours repeat."""
    return {"color": f"C{i % 10}", "linestyle": ("-", "--", ":", "-.")[i // 10 % 4]}


def _many_lines_legend(ax) -> None:
    """The legend inside the axes for a few lines, beside them for many (it would cover the data)."""
    if len(ax.get_legend_handles_labels()[0]) > 6:
        _legend(ax, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    else:
        _legend(ax, fontsize=7)


def _model(results: Results, model: str | None) -> str:
    models = results.models()
    if model is None:
        if not models:
            raise ValueError("the results hold no rows to plot")
        return models[0]
    if model not in models:
        raise ValueError(f"model {model!r} is not in these results; models: {', '.join(models)}")
    return model


def _mode(results: Results, model: str, mode: str | None, preferred: tuple[str, ...]) -> str:
    modes = results.modes(model)
    if mode is not None:
        if mode not in modes:
            raise ValueError(f"mode {mode!r} is not in these results for {model}; modes: {', '.join(modes)}")
        return mode
    measured = [m for m in modes if not m.startswith(("serve:", "llm:"))]
    if not measured:
        raise ValueError(f"{model} has serving runs or LLM decode cells only in these results: plot them with "
                         "latency_vs_rate and batch_size_histogram, or tokens_vs_batch, tpot_vs_context and "
                         "llm_roofline")
    return next((m for m in preferred if m in measured), measured[0])


def _unit(results: Results, model: str) -> str:
    return next((r.item_unit for r in results.rows if r.model == model), "items") or "items"


def throughput_vs_batch(results: Results, model: str | None = None, mode: str | None = None, path=None,
                        ax=None):
    """Items/s against batch size, one line per config."""
    model = _model(results, model)
    mode = _mode(results, model, mode, ("throughput", "latency", "graph", "end-to-end"))
    fig, ax = _axes(ax)
    for cfg in results.configs(model):
        pts = [(r.batch_size, r.throughput_items_per_s) for b in results.batch_sizes(model)
               if (r := results.find(model, cfg, b, mode)) and r.ok]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=cfg)
    _batch_axis(ax, results.batch_sizes(model))
    ax.set_ylabel(f"{_unit(results, model)}/s")
    ax.set_title(f"{model}: throughput ({mode} mode) on {results.device}")
    ax.grid(True, alpha=0.3)
    _legend(ax, fontsize=8)
    _save(fig, path)
    return fig


def energy_vs_batch(results: Results, model: str | None = None, mode: str | None = None, path=None, ax=None):
    """Items per joule against batch size, one line per config (cells with a measured energy only;
    ValueError when no cell has one)."""
    model = _model(results, model)
    mode = _mode(results, model, mode, ("throughput", "latency", "graph", "end-to-end"))
    lines = {cfg: [(r.batch_size, r.energy["items_per_joule"]) for b in results.batch_sizes(model)
                   if (r := results.find(model, cfg, b, mode)) and r.ok and (r.energy or {}).get("items_per_joule")]
             for cfg in results.configs(model)}
    if not any(lines.values()):
        raise ValueError(f"no {model} cell in {mode} mode has a measured energy")
    fig, ax = _axes(ax)
    for cfg, pts in lines.items():
        if pts:
            ax.plot(*zip(*pts), marker="o", label=cfg)
    _batch_axis(ax, results.batch_sizes(model))
    ax.set_ylabel(f"{_unit(results, model)} per joule")
    ax.set_title(f"{model}: energy efficiency ({mode} mode) on {results.device}")
    ax.grid(True, alpha=0.3)
    _legend(ax, fontsize=8)
    _save(fig, path)
    return fig


def latency_vs_batch(results: Results, model: str | None = None, mode: str | None = None, path=None, ax=None):
    """p50 (solid) and p95 (dashed) latency per batch against batch size, per config."""
    model = _model(results, model)
    mode = _mode(results, model, mode, ("latency", "graph", "throughput"))
    fig, ax = _axes(ax)
    for i, cfg in enumerate(results.configs(model)):
        rows = [r for b in results.batch_sizes(model) if (r := results.find(model, cfg, b, mode)) and r.ok]
        if not rows:
            continue
        color = f"C{i % 10}"
        xs = [r.batch_size for r in rows]
        ax.plot(xs, [r.latency_ms["p50"] for r in rows], marker="o", color=color, label=f"{cfg} p50")
        ax.plot(xs, [r.latency_ms["p95"] for r in rows], linestyle="--", color=color, label=f"{cfg} p95")
    ax.set_yscale("log")
    plain_log_ticks(ax.yaxis)
    _batch_axis(ax, results.batch_sizes(model))
    ax.set_ylabel("latency per batch (ms)")
    ax.set_title(f"{model}: latency ({mode} mode) on {results.device}")
    ax.grid(True, alpha=0.3, which="both")
    _legend(ax, fontsize=7, ncol=2)
    _save(fig, path)
    return fig


def speedup_bars(results: Results, model: str | None = None, batch_size: int | None = None, mode: str | None = None,
                 baseline: str | None = None, path=None, ax=None):
    """Speedup of each config over the baseline with 95% confidence-interval error bars."""
    model = _model(results, model)
    mode = _mode(results, model, mode, ("throughput", "latency", "graph"))
    batch_size = batch_size or max(results.batch_sizes(model))
    s = [x for x in results.speedups(baseline) if x["model"] == model and x["mode"] == mode
         and x["batch_size"] == batch_size and x.get("speedup") is not None]
    fig, ax = _axes(ax)
    if s:
        names = [x["config"] for x in s]
        vals = [x["speedup"] for x in s]
        err = [[v - x["ci"][0] for v, x in zip(vals, s)], [x["ci"][1] - v for v, x in zip(vals, s)]]
        colors = ["C2" if x["verdict"] == "faster" else "C3" if x["verdict"] == "slower" else "C7" for x in s]
        ax.bar(names, vals, yerr=err, capsize=4, color=colors)
        for i, v in enumerate(vals):
            ax.annotate(f"{v:.2f}x", (i, v), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
        ax.axhline(1.0, color="black", linewidth=0.8)
        base = s[0]["baseline"]
    else:
        base = baseline or results.baseline_config(model)
        ax.text(0.5, 0.5, "no measured speedups", ha="center", transform=ax.transAxes)
    ax.set_ylabel(f"speedup over {base} (x)")
    ax.set_title(f"{model}, batch {batch_size}: speedup ({mode} mode, 95% CI) on {results.device}")
    _save(fig, path)
    return fig


def memory_bars(results: Results, model: str | None = None, batch_size: int | None = None, path=None, ax=None):
    """Peak device memory allocated by torch per config, at one batch size; ValueError (nothing drawn)
    when no row recorded any (a CPU run)."""
    model = _model(results, model)
    batch_size = batch_size or max(results.batch_sizes(model))
    vals = []
    for cfg in results.configs(model):
        peaks = [(r.peak_memory or {}).get("max_allocated_bytes") for mode in results.modes(model)
                 if (r := results.find(model, cfg, batch_size, mode)) and r.ok]
        peaks = [p for p in peaks if p]
        if peaks:
            vals.append((cfg, max(peaks) / 2**20))
    if not vals:
        raise ValueError(f"no {model} row at batch {batch_size} recorded device memory (a CPU run records none): "
                         "no memory plot")
    fig, ax = _axes(ax)
    ax.bar([v[0] for v in vals], [v[1] for v in vals], color="C0")
    ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    ax.set_ylabel("peak memory allocated (MiB)")
    ax.set_title(f"{model}, batch {batch_size}: peak memory on {results.device}")
    _save(fig, path)
    return fig


def latency_distribution(results: Results, model: str | None = None, batch_size: int | None = None,
                         mode: str | None = None, path=None, ax=None):
    """Violin plots of the raw latency samples of each config."""
    model = _model(results, model)
    mode = _mode(results, model, mode, ("latency", "graph", "throughput"))
    batch_size = batch_size or min(results.batch_sizes(model))
    data = []
    for cfg in results.configs(model):
        r = results.find(model, cfg, batch_size, mode)
        if r and r.ok and r.measurement is not None:
            data.append((cfg, r.measurement.samples_ms))
    fig, ax = _axes(ax)
    if data:
        ax.violinplot([d[1] for d in data], showmedians=True)
        ax.set_xticks(range(1, len(data) + 1), [d[0] for d in data], rotation=30, fontsize=8)
        ax.set_yscale("log")
        plain_log_ticks(ax.yaxis)
    ax.set_ylabel("latency per call (ms)")
    ax.set_title(f"{model}, batch {batch_size}: latency distribution ({mode} mode) on {results.device}")
    _save(fig, path)
    return fig


def roofline(results: Results, model: str | None = None, mode: str | None = None, precision: str | None = None,
             path=None, ax=None):
    """The results of one precision (default: the first) on the device's roofline for that precision
    (measured ceilings when cached, else the datasheet): a point per config and batch size."""
    from ..analysis.roofline import plot_roofline, roofline_points

    model = _model(results, model)
    mode = _mode(results, model, mode, ("throughput", "latency", "graph"))
    if not results.ceilings:
        raise ValueError("these results carry no device ceilings (CPU run, or a GPU missing from the datasheet)")
    rows = [r for r in results.ok if r.model == model and r.mode == mode]
    precisions = list(dict.fromkeys(r.precision or "fp32" for r in rows))
    precision = precision or (precisions[0] if precisions else "fp32")
    points = roofline_points([r.to_dict() for r in rows if (r.precision or "fp32") == precision])
    if not points:
        raise ValueError(f"no {model} row in {mode} mode with precision {precision} carries a roofline placement")
    return plot_roofline(points, results.ceilings, precision,
                         title=f"{model}, {precision}, on {results.device} ({mode} mode)", path=path, ax=ax)


def _serving_rows(source: Any) -> list[Row]:
    """The serving rows of Results, a Row, a ServeResult (anything with ``row()``), a RateSearch (its
    steps) or an iterable of these."""
    from .results import Results, Row

    if isinstance(source, Results):
        return [r for r in source.rows if r.serving is not None]
    if isinstance(source, Row):
        return [source] if source.serving is not None else []
    if hasattr(source, "steps") and hasattr(source, "slo_ms"):  # gpuopt.serving.RateSearch
        return _serving_rows(source.steps)
    if callable(getattr(source, "row", None)):  # gpuopt.ServeResult
        return [source.row()]
    if isinstance(source, (list, tuple)):
        return [r for item in source for r in _serving_rows(item)]
    raise TypeError(f"expected Results, a Row, a ServeResult, a RateSearch or a list of them, got "
                    f"{type(source).__name__}")


PERCENTILES = ("p50", "p90", "p95", "p99", "p99.9")


def latency_vs_rate(source: Any, slo_ms: float | None = None, percentile: str = "p99", x: str = "throughput",
                    path=None, ax=None):
    """Serving runs' latency against load: ``percentile`` (solid) and p50 (dashed) against achieved
    throughput (``x="throughput"``) or the offered Poisson rate (``x="rate"``, server runs only), a
    line per model, config and batcher path; runs that LoadGen's rules call invalid (the server fell
    behind its rate, or the estimate missed the SLO) are crossed out; ``slo_ms`` (default: the runs'
    own, when they share one) is a horizontal line. ``source``: Results, ServeResults (a
    latency_curve), a RateSearch, or rows. Offline runs are left out: their latency is queueing of
    the whole load."""
    if percentile not in PERCENTILES:
        raise ValueError(f"percentile must be one of {', '.join(PERCENTILES)}, got {percentile!r}")
    if x not in ("throughput", "rate"):
        raise ValueError(f"x must be 'throughput' or 'rate', got {x!r}")
    if slo_ms is None and hasattr(source, "slo_ms") and hasattr(source, "steps"):
        slo_ms = source.slo_ms
    rows = [r for r in _serving_rows(source) if r.ok and r.serving["scenario"] != "offline"
            and (x == "throughput" or r.serving["scenario"] == "server")]
    if not rows:
        raise ValueError("no answered serving run to plot" + (" (x='rate' plots server runs)" if x == "rate" else ""))
    if slo_ms is None:
        slos = {r.serving["load"].get("slo_ms") for r in rows}
        slo_ms = slos.pop() if len(slos) == 1 else None
    models = list(dict.fromkeys(r.model for r in rows))
    groups: dict[tuple[str, str, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.model, r.config, r.serving["settings"].get("path", "?")), []).append(r)
    fig, ax = _axes(ax)
    invalid_label = "invalid run"
    for i, ((model, cfg, path_name), rs) in enumerate(groups.items()):
        rs.sort(key=lambda r: _load_x(r, x))
        xs = [_load_x(r, x) for r in rs]
        color = f"C{i % 10}"
        name = f"{cfg} [{path_name}]" if len(models) == 1 else f"{model} {cfg} [{path_name}]"
        ax.plot(xs, [r.latency_ms[percentile] for r in rs], marker="o", color=color, label=f"{name} {percentile}")
        ax.plot(xs, [r.latency_ms["p50"] for r in rs], linestyle="--", marker=".", color=color, label=f"{name} p50")
        bad = [(xv, r.latency_ms[percentile]) for xv, r in zip(xs, rs) if not r.serving["valid"]]
        if bad:
            ax.scatter(*zip(*bad), marker="x", s=80, color="black", zorder=3, label=invalid_label)
            invalid_label = None  # one legend entry
    if slo_ms is not None:
        ax.axhline(slo_ms, color="C3", linestyle=":", linewidth=1.5, label=f"SLO {slo_ms:g} ms")
    ax.set_yscale("log")
    plain_log_ticks(ax.yaxis)
    ax.set_xlabel("achieved throughput (requests/s)" if x == "throughput" else "offered rate (requests/s)")
    ax.set_ylabel("end-to-end latency (ms)")
    devices = {r.device for r in rows if r.device}
    on = f" on {devices.pop()}" if len(devices) == 1 else ""
    ax.set_title(f"{', '.join(models)}: latency vs load{on}")
    ax.grid(True, alpha=0.3, which="both")
    _legend(ax, fontsize=7)
    _save(fig, path)
    return fig


def _load_x(row: Row, x: str) -> float:
    return float(row.serving["throughput"] if x == "throughput" else row.serving["target_rate"])


def batch_size_histogram(source: Any, path=None, ax=None):
    """Requests per batch size of one serving run (a ServeResult or its Row): how full the batcher's
    batches were, with the mean batch size a request rode in."""
    rows = _serving_rows(source)
    if len(rows) != 1:
        raise ValueError(f"batch_size_histogram shows one serving run (a ServeResult or a Row), got {len(rows)}")
    (row,) = rows
    counts = list(row.serving.get("batch_size_counts") or [])
    sizes = [b for b, n in enumerate(counts) if n > 0]
    if not sizes:
        raise ValueError(f"{row.model} {row.config} {row.mode}: no answered request, no batch sizes to show")
    fig, ax = _axes(ax)
    ax.bar(sizes, [counts[b] for b in sizes], width=0.8, color="C0")
    total = sum(counts[b] for b in sizes)
    mean = sum(b * counts[b] for b in sizes) / total
    ax.axvline(mean, color="C3", linestyle="--", linewidth=1, label=f"mean {mean:.1f}")
    ax.set_xlabel("batch size")
    ax.set_ylabel("requests")
    ax.set_xlim(0.4, max(sizes[-1], row.batch_size) + 0.6)
    path_name = row.serving["settings"].get("path", "?")
    point = row.mode.removeprefix("serve:")
    ax.set_title(f"{row.model} {row.config} [{path_name}], {point}: requests per batch size")
    _legend(ax, fontsize=8)
    _save(fig, path)
    return fig


def _llm_rows(source: Any) -> list[Row]:
    """The LLM decode rows of Results, a Row, a DecodeResult (anything with ``llm_dict()`` and
    ``to_row()``) or an iterable of these."""
    from .results import Results, Row

    if isinstance(source, Results):
        return [r for r in source.rows if r.is_llm]
    if isinstance(source, Row):
        return [source] if source.is_llm else []
    if callable(getattr(source, "llm_dict", None)) and callable(getattr(source, "to_row", None)):
        return [source.to_row()]  # gpuopt.llm.DecodeResult
    if isinstance(source, (list, tuple)):
        return [r for item in source for r in _llm_rows(item)]
    raise TypeError(f"expected Results, a Row, a DecodeResult or a list of them, got {type(source).__name__}")


def _measured_llm_rows(source: Any) -> list[Row]:
    rows = [r for r in _llm_rows(source) if r.ok and r.llm]
    if not rows:
        raise ValueError("no measured LLM decode cell to plot (gpuopt.decode_sweep / measure_decode rows)")
    return rows


def _on_device(rows: list[Row]) -> str:
    devices = {r.device for r in rows if r.device}
    return f" on {devices.pop()}" if len(devices) == 1 else ""


def _llm_shape(row: Row) -> str:
    return f"p{row.llm['prompt_len']}+n{row.llm['new_tokens']}"


TOKEN_RATES = {"decode": ("decode_tokens_per_s", "decode tokens/s (batch / mean TPOT)"),
               "output": ("output_tokens_per_s", "output tokens/s (batch x new tokens / mean end-to-end)")}


def tokens_vs_batch(source: Any, rate: str = "decode", path=None, ax=None):
    """LLM tokens/s against batch size: a line per model, config (precision + path) and prompt/new
    tokens; ``rate="decode"`` (batch / mean TPOT, the decode steps alone) or ``"output"`` (every
    generated token over the whole request, prefill included). ``source``: Results, DecodeResults
    or rows."""
    if rate not in TOKEN_RATES:
        raise ValueError(f"rate must be one of {', '.join(TOKEN_RATES)}, got {rate!r}")
    key, label = TOKEN_RATES[rate]
    rows = _measured_llm_rows(source)
    models = list(dict.fromkeys(r.model for r in rows))
    groups: dict[tuple[str, str, str], list[Row]] = {}
    for r in rows:
        if r.llm.get(key):
            groups.setdefault((r.model, r.config, _llm_shape(r)), []).append(r)
    if not groups:
        raise ValueError(f"no LLM decode cell has {key} (one new token has no decode step)")
    fig, ax = _axes(ax)
    for i, ((model, cfg, shape), rs) in enumerate(groups.items()):
        rs.sort(key=lambda r: r.batch_size)
        name = f"{cfg} {shape}" if len(models) == 1 else f"{model} {cfg} {shape}"
        ax.plot([r.batch_size for r in rs], [r.llm[key] for r in rs], marker="o", label=name, **_style(i))
    ax.set_yscale("log")
    plain_log_ticks(ax.yaxis)
    _batch_axis(ax, sorted({r.batch_size for rs in groups.values() for r in rs}))
    ax.set_ylabel(label)
    ax.set_title(f"{', '.join(models)}: {rate} throughput vs batch size{_on_device(rows)}")
    ax.grid(True, alpha=0.3, which="both")
    _many_lines_legend(ax)
    _save(fig, path)
    return fig


TPOT_PERCENTILES = ("p50", "p90", "p99", "mean")


def tpot_vs_context(source: Any, percentile: str = "p50", path=None, ax=None):
    """Time per output token against the context a decode step attends to (prompt + new tokens / 2,
    the mean over the steps): a line per model, config and batch size. ``source``: Results,
    DecodeResults or rows."""
    if percentile not in TPOT_PERCENTILES:
        raise ValueError(f"percentile must be one of {', '.join(TPOT_PERCENTILES)}, got {percentile!r}")
    rows = [r for r in _measured_llm_rows(source) if r.llm.get("tpot_ms")]
    if not rows:
        raise ValueError("no LLM decode cell has a TPOT (one new token has no decode step)")
    models = list(dict.fromkeys(r.model for r in rows))
    groups: dict[tuple[str, str, int], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.model, r.config, r.batch_size), []).append(r)
    fig, ax = _axes(ax)
    for i, ((model, cfg, b), rs) in enumerate(groups.items()):
        pts = sorted((_context(r), r.llm["tpot_ms"][percentile]) for r in rs)
        name = f"{cfg} bs{b}" if len(models) == 1 else f"{model} {cfg} bs{b}"
        ax.plot(*zip(*pts), marker="o", label=name, **_style(i))
    contexts = sorted({_context(r) for r in rows})
    ax.set_xscale("log", base=2)
    ax.set_xticks(contexts, [f"{c:g}" for c in contexts])
    ax.minorticks_off()
    ax.set_yscale("log")
    plain_log_ticks(ax.yaxis)
    ax.set_xlabel("context (prompt + new tokens / 2: the mean a decode step attends to)")
    ax.set_ylabel(f"TPOT {percentile} (ms per output token)")
    ax.set_title(f"{', '.join(models)}: time per output token vs context{_on_device(rows)}")
    ax.grid(True, alpha=0.3, which="both")
    _many_lines_legend(ax)
    _save(fig, path)
    return fig


def _context(row: Row) -> float:
    return row.llm["prompt_len"] + row.llm["new_tokens"] / 2


def llm_roofline(source: Any, precision: str | None = None, ceilings: dict | None = None, path=None, ax=None):
    """Prefill and decode of LLM decode cells on the device's roofline: a prefill point (the whole
    prompt, once per request) and a decode point (one step: weights and the KV cache read for each
    token) per cell, of one roofline precision (default: the first; int8wo computes in fp16).
    ``ceilings``: default the Results' own, else the datasheet of the rows' device."""
    from ..analysis.roofline import plot_roofline

    _plt()  # the plots' one message when matplotlib is missing
    rows = _measured_llm_rows(source)
    placed = [(r, phase, r.llm[f"{phase}_roofline"]) for r in rows for phase in ("prefill", "decode")
              if r.llm.get(f"{phase}_roofline")]
    if not placed:
        raise ValueError("no LLM decode cell carries a roofline placement (CPU runs have none)")
    precisions = list(dict.fromkeys(p["precision"] for _, _, p in placed))
    precision = precision or precisions[0]
    if precision not in precisions:
        raise ValueError(f"no LLM decode cell is placed on the {precision} roofline; placed: {', '.join(precisions)}")
    models = list(dict.fromkeys(r.model for r, _, _ in placed))
    points = [{"label": f"{'' if len(models) == 1 else r.model + ' '}{r.config} bs{r.batch_size} {_llm_shape(r)} "
                        f"{phase}",
               "arithmetic_intensity": p.get("arithmetic_intensity"), "achieved_tflops": p.get("achieved_tflops")}
              for r, phase, p in placed if p["precision"] == precision]
    if ceilings is None:
        from .results import Results

        ceilings = source.ceilings if isinstance(source, Results) else None
        if not ceilings:
            device = next((r.device for r, _, _ in placed if r.device), None)
            ceilings = {"device": device} if device else None
    device = (ceilings or {}).get("device") or next((r.device for r in rows if r.device), "unknown device")
    return plot_roofline(points, ceilings, precision,
                         title=f"{', '.join(models)}: prefill and decode, {precision}, on {device}", path=path, ax=ax)


def save_all(results: Results, out: str | Path) -> dict[str, Path]:
    """Every plot of every model into ``out`` (PNG + SVG); returns the PNG paths. Serving runs get the
    latency-vs-load plot and the batch-size histogram of their busiest valid run; LLM decode cells
    (all models in one figure each) tokens/s vs batch size, TPOT vs context and the prefill/decode
    roofline per precision; the other plots show the measured cells alone."""
    plt = _plt()
    out = Path(out)
    paths: dict[str, Path] = {}
    special = any(r.is_serving or r.is_llm for r in results.rows)
    measured = results.select(lambda r: not r.is_serving and not r.is_llm) if special else results
    for model in results.models():
        kinds: dict[str, Any] = {"throughput": throughput_vs_batch, "latency": latency_vs_batch,
                                 "speedup": speedup_bars, "memory": memory_bars, "distribution": latency_distribution,
                                 "energy": energy_vs_batch}
        if measured.ceilings:
            for prec in dict.fromkeys(r.precision or "fp32" for r in measured.ok if r.model == model):
                kinds[f"roofline-{prec}"] = lambda res, m, path, prec=prec: roofline(res, m, precision=prec, path=path)
        served = [r for r in results.ok if r.model == model and r.is_serving]
        if served:
            busiest = max(served, key=lambda r: (r.serving["scenario"] != "offline", r.serving["valid"],
                                                 r.throughput_items_per_s or 0))
            kinds["latency-rate"] = lambda res, m, path, rows=served: latency_vs_rate(rows, path=path)
            kinds["batch-sizes"] = lambda res, m, path, row=busiest: batch_size_histogram(row, path=path)
        for kind, fn in kinds.items():
            path = out / f"{model}-{kind}"
            try:
                fig = fn(measured, model, path=path)
            except (ValueError, KeyError):
                continue
            plt.close(fig)
            paths[f"{model}-{kind}"] = path.with_suffix(".png")
    decoded = [r for r in results.ok if r.is_llm and r.llm]
    if decoded:
        kinds = {"llm-tokens-vs-batch": lambda path: tokens_vs_batch(results, path=path),
                 "llm-tpot-vs-context": lambda path: tpot_vs_context(results, path=path)}
        for prec in dict.fromkeys(p["precision"] for r in decoded for phase in ("prefill", "decode")
                                  if (p := r.llm.get(f"{phase}_roofline"))):
            kinds[f"llm-roofline-{prec}"] = lambda path, prec=prec: llm_roofline(results, precision=prec, path=path)
        for kind, fn in kinds.items():
            path = out / kind
            try:
                fig = fn(path)
            except (ValueError, KeyError):
                continue
            plt.close(fig)
            paths[kind] = path.with_suffix(".png")
    return paths
