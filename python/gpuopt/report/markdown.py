"""Markdown reports of Results: tables like the seeds' (latency, throughput and memory per
configuration and batch size, and the speedups), then serving, LLM decode, roofline, training,
failures and the environment."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..timing.measurement import format_ms
from .llm_report import llm_markdown

if TYPE_CHECKING:
    from .results import Results, Row


def _table(header: list[str], rows: list[list[str]], align_right_from: int = 1,
           left_from: int | None = None) -> list[str]:
    """Columns from ``align_right_from`` (up to ``left_from``) are right-aligned: the numbers."""
    right = range(align_right_from, len(header) if left_from is None else left_from)
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join("---:" if i in right else "---" for i in range(len(header))) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def _grid(results: Results, model: str, mode: str, cell) -> list[str]:
    batches = results.batch_sizes(model)
    rows = []
    for cfg in results.configs(model):
        cells = []
        for b in batches:
            r = results.find(model, cfg, b, mode)
            cells.append("-" if r is None else ("failed" if not r.ok else cell(r)))
        rows.append([cfg, *cells])
    return _table(["config", *[f"batch {b}" for b in batches]], rows)


def _peak_bytes(row: Row) -> int | None:
    return (row.peak_memory or {}).get("max_allocated_bytes")


def _pick(results: Results, model: str, preferred: tuple[str, ...]) -> str | None:
    modes = results.modes(model)
    return next((m for m in preferred if m in modes), None)


def environment_lines(env: dict[str, Any], build: dict[str, Any] | None = None) -> list[str]:
    gpus = env.get("gpus") or []
    gpu = ", ".join(f"{g['name']} ({g['memory_bytes'] / 2**30:.0f} GiB, sm_{g['compute_capability'].replace('.', '')})"
                    for g in gpus) or "none (CPU)"
    lines = [f"- GPU: {gpu}",
             f"- driver {env.get('driver') or '-'}, CUDA runtime {env.get('cuda_runtime') or '-'}, "
             f"cuDNN {env.get('cudnn') or '-'}",
             f"- torch {env.get('torch')}, Python {env.get('python')}, gpuopt {env.get('gpuopt')}",
             f"- CPU: {env.get('cpu')} ({env.get('cpu_count')} logical cores)"]
    for g in gpus:
        if g.get("max_clock_sm_mhz"):
            lines.append(f"- GPU {g['index']}: max SM clock {g['max_clock_sm_mhz']} MHz, power limit "
                         f"{g.get('power_limit_w')} W, ECC {g.get('ecc_enabled')}")
    if build:
        lines.append(f"- gpuopt build: CUDA {'archs ' + build['cuda_archs'] if build.get('cuda') else 'not compiled'}, "
                     f"{build.get('compiler')}, {build.get('build_type')}")
    return lines


def markdown(results: Results, baseline: str | None = None) -> str:
    """The full report of ``results`` as Markdown."""
    lines = [f"# gpuopt results on {results.device}", "",
             f"{len(results.rows)} cells ({len(results.failed)} failed), {results.created}.", ""]
    speedups = results.speedups(baseline)
    served = [r for r in results.rows if r.is_serving]
    decoded = [r for r in results.rows if r.is_llm]
    everything = results
    if served or decoded:  # their own sections: the per-model tables are for measured cells
        results = results.select(lambda r: not r.is_serving and not r.is_llm)
    measured = results
    for model in results.models():
        unit = next((r.item_unit for r in results.rows if r.model == model), "items")
        lines += [f"## {model}", ""]
        tmode = _pick(results, model, ("throughput", "latency", "graph", "host", "end-to-end"))
        if tmode:
            lines += [f"### Throughput ({unit}/s, {tmode} mode)", ""]
            lines += _grid(results, model, tmode, lambda r: f"{r.throughput_items_per_s:,.0f}") + [""]
        lmode = _pick(results, model, ("latency", "graph", "host", "throughput"))
        if lmode:
            lines += [f"### Latency (ms per batch, {lmode} mode: p50 / p95 / p99)", ""]
            lines += _grid(results, model, lmode, lambda r: " / ".join(
                f"{r.latency_ms[k]:.3g}" for k in ("p50", "p95", "p99"))) + [""]
        if "end-to-end" in results.modes(model):
            lines += [f"### End to end ({unit}/s: host batch in, result on the host)", ""]
            lines += _grid(results, model, "end-to-end", lambda r: f"{r.throughput_items_per_s:,.0f}") + [""]
        if tmode and any(_peak_bytes(r) for r in results.rows if r.model == model):
            lines += ["### Peak memory (MiB allocated by torch)", ""]
            lines += _grid(results, model, tmode, lambda r: (
                f"{_peak_bytes(r) / 2**20:,.0f}" if _peak_bytes(r) else "-")) + [""]
        model_speedups = [s for s in speedups if s["model"] == model and s["mode"] == tmode]
        if model_speedups:
            base = model_speedups[0]["baseline"]
            lines += [f"### Speedup over {base} ({tmode} mode, 95% confidence interval)", ""]
            batches = results.batch_sizes(model)
            by_cell = {(x["config"], x["batch_size"]): x for x in model_speedups}
            rows = []
            for cfg in results.configs(model):
                if cfg == base:
                    continue
                cells = []
                for b in batches:
                    s = by_cell.get((cfg, b))
                    if s is None or s.get("speedup") is None:
                        cells.append("-")
                    else:
                        mark = {"faster": "", "slower": " (slower)", "no significant difference": " (n.s.)"}[s["verdict"]]
                        cells.append(f"{s['speedup']:.2f}x [{s['ci'][0]:.2f}, {s['ci'][1]:.2f}]{mark}")
                rows.append([cfg, *cells])
            lines += _table(["config", *[f"batch {b}" for b in batches]], rows) + [""]
        emode = next((m for m in (tmode, lmode) if m and any(
            (r.energy or {}).get("joules_per_item") for r in results.ok if r.model == model and r.mode == m)), None)
        if emode:
            lines += [f"### Energy ({emode} mode: J per {unit.rstrip('s') or 'item'} / {unit} per J / average W, % of "
                      "the power limit)", ""]
            lines += _grid(results, model, emode, _energy_cell) + [""]
            idle = next((e["idle_power_w"] for r in results.ok if r.model == model and (e := r.energy)
                         and e.get("idle_power_w")), None)
            methods = sorted({e["method"] for r in results.ok if r.model == model and (e := r.energy) and e["method"]})
            lines += [f"Method: {', '.join(methods)}" + (f"; the GPU idled at {idle:.0f} W before the run" if idle
                                                        else "") + ".", ""]
        if "train" in results.modes(model):
            lines += [f"### Training step (forward + backward + SGD step; ms per step / {unit}/s)", ""]
            lines += _grid(results, model, "train", lambda r: (
                f"{format_ms(r.latency_ms['p50'])} / {r.throughput_items_per_s:,.0f}")) + [""]
        lines += _costs(results, model)
    if served:
        lines += _serving(served)
    if decoded:
        lines += llm_markdown(decoded)
    results = everything
    failed = results.failed
    if failed:
        lines += ["## Failed cells", ""]
        lines += _table(["model", "config", "batch", "mode", "reason"],
                        [[r.model, r.config, str(r.batch_size), r.mode,
                          (r.error or "").replace("|", "\\|").replace("\n", " ")[:300]] for r in failed], 5) + [""]
    warned = results.warning_lines()
    if warned:
        lines += ["## Warnings", ""] + [f"- {w}" for w in warned] + [""]
    placed = [r.to_dict() for model in measured.models() for r in _largest_batch_rows(measured, model) if r.roofline]
    if placed:
        from ..analysis.roofline import roofline_markdown

        lines += [roofline_markdown(placed)]
    if results.profiles:
        lines += ["## Profiles", ""]
        for cell, prof in results.profiles.items():
            lines += [f"### {cell}", "", prof.get("markdown") or f"profiling failed: {prof.get('error')}", ""]
    lines += ["## Environment", ""] + environment_lines(results.env, results.build) + [""]
    return "\n".join(lines)


def _serving(rows: list[Row]) -> list[str]:
    """One table of serving runs: load, batcher, latency percentiles, queue vs compute, validity."""
    table = []
    for r in rows:
        s = r.serving or {}  # a cell that failed before its run has none
        settings = s.get("settings", {})
        batcher = f"{settings['path']}, max {settings['max_batch_size']}" if settings else "-"
        if "max_queue_delay_us" in settings:
            batcher += f", delay {settings['max_queue_delay_us']} us, {settings.get('instances', 1)} inst."
            if len(settings.get("devices") or []) > 1:
                batcher += f" x {len(settings['devices'])} GPUs"
        elif "max_wait_ms" in settings:
            batcher += f", wait {settings['max_wait_ms']:g} ms"
        counts = s.get("counts")
        answered = "-" if counts is None else f"{counts['ok']:,}/{counts['issued']:,}" + "".join(
            f", {counts[k]:,} {k.replace('_', ' ')}" for k in ("failed", "rejected", "timed_out", "lost")
            if counts.get(k))
        offered = f"{s['target_rate']:,.0f}" if s.get("target_rate") else "-"
        if r.ok:
            lat, q, c = r.latency_ms, s["queue_ms"], s["compute_ms"]
            figures = [f"{r.throughput_items_per_s:,.0f}", *(f"{lat[k]:.3g}" for k in ("p50", "p90", "p99", "p99.9")),
                       f"{q['p50']:.3g} / {c['p50']:.3g}",
                       _busy(s)]
            verdict = "yes" if s["valid"] else "no: " + "; ".join(s["invalid_reasons"])
        else:
            figures = ["-"] * 7
            verdict = f"failed: {r.error}"
        table.append([r.model, r.config, batcher, r.mode.removeprefix("serve:"), offered, *figures, answered,
                      verdict.replace("|", "\\|").replace("\n", " ")[:300]])
    header = ["model", "config", "batcher", "scenario", "offered req/s", "req/s", "p50 ms", "p90 ms", "p99 ms",
              "p99.9 ms", "queue / compute p50 ms", "busy", "answered", "valid"]
    return ["## Serving", "", "End-to-end latency counted from each request's scheduled arrival (no coordinated "
            "omission). A run is valid when it had the queries its early-stopping percentile needs, that "
            "percentile met the SLO, it kept up with its rate and every query was answered.", ""] + _table(header, table, 4, left_from=len(header) - 1) + [""]


def _energy_cell(row: Row) -> str:
    e = row.energy or {}
    if not e.get("joules_per_item"):
        return "-"
    share = e.get("share_of_power_limit")
    return (f"{e['joules_per_item']:.3g} / {e['items_per_joule']:,.1f} / {e['avg_power_w']:.0f} W"
            + (f", {100 * share:.0f}%" if share else ""))


def _busy(serving: dict) -> str:
    """The busy column of a serving row: the server's share of wall time with a batch in service, and
    each GPU's when it served on several."""
    if serving.get("gpu_busy") is None:
        return "-"
    text = f"{100 * serving['gpu_busy']:.0f}%"
    per_device = serving.get("gpu_busy_per_device")
    if per_device:  # the server's share is "a batch on any GPU"; each GPU's own follows
        text = f"any GPU {text} (" + ", ".join(f"{d} {100 * b:.0f}%" for d, b in per_device.items()) + ")"
    return text


def _largest_batch_rows(results: Results, model: str) -> list[Row]:
    """The rows the roofline section shows: largest batch, the throughput-like mode."""
    mode = _pick(results, model, ("throughput", "latency", "graph", "host"))
    b = max(results.batch_sizes(model))
    return [r for r in results.ok if r.model == model and r.batch_size == b and r.mode == mode]


def _costs(results: Results, model: str) -> list[str]:
    rows = []
    for cfg in results.configs(model):
        rs = [r for r in results.rows if r.model == model and r.config == cfg]
        prep = [r.prepare_s for r in rs if r.prepare_s is not None]
        first = [r.first_call_ms for r in rs if r.first_call_ms is not None]
        over = [r.runner_overhead_s for r in rs if r.runner_overhead_s is not None]
        if prep or over:
            rows.append([cfg, f"{max(prep):.2f}" if prep else "-", f"{max(first):.1f}" if first else "-",
                         f"{sum(over) / len(over):.2f}" if over else "-"])
    if not rows:
        return []
    return (["### Costs outside the timed regions", ""]
            + _table(["config", "prepare / compile (s, max)", "first call (ms, max)", "runner overhead per cell (s)"],
                     rows) + [""])
