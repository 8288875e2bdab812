"""LLM decode cells in reports: the Markdown section and the terminal table (``gpuopt llm``), one line
per cell -- TTFT, TPOT, ITL, tokens/s, the bandwidth a decode step achieves against the HBM read
ceiling, the bandwidth floor, parity against the fp32 reference and the diagnosis; a failed cell
with its reason in the same line."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..timing.measurement import format_ms

if TYPE_CHECKING:
    from .results import Results, Row

# What the section's columns mean, vLLM's definitions (benchmarks/benchmark_serving.py).
DEFINITIONS = (
    "TTFT: from a request's start to its first generated token (the prefill). TPOT: per request, (end-to-end - "
    "TTFT) / (output tokens - 1). ITL: every gap between two consecutive tokens, all requests pooled. Decode "
    "tokens/s: batch / mean TPOT; output tokens/s: batch x new tokens / mean end-to-end. GB/s: the bytes a decode "
    "step must read (weights + the KV cache so far, mean over the steps) / mean TPOT, as a share of the HBM read "
    "bandwidth; floor TPOT: those bytes at that bandwidth. Parity: greedy tokens equal to the fp32 reference's "
    "(teacher-forced on the static paths, free-running up to the first difference on the hf paths; near-ties "
    "excused) and the worst logits error relative to the reference's largest logit.")


def _cell(text: Any, n: int = 300) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= n else text[: n - 3] + "..."


def _ms(stats: dict | None, key: str) -> str:
    return f"{stats[key]:.3g}" if stats and stats.get(key) is not None else "-"


def _rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _shape(row: Row) -> str:
    llm = row.llm or {}
    if llm.get("prompt_len") is not None and llm.get("new_tokens") is not None:
        return f"{llm['prompt_len']}+{llm['new_tokens']}"
    return row.mode.removeprefix("llm:")


def parity_text(llm: dict[str, Any] | None, compact: bool = False) -> str:
    """A decode cell's parity in words: ``passed: 32/32 tokens equal, logits error 1.2e-03 (tolerance
    3e-02), teacher-forced``; ``-`` when not checked, ``not checked: <why>`` when the check failed."""
    llm = llm or {}
    p = llm.get("parity")
    if not p:
        err = llm.get("parity_error")
        return f"not checked: {err}" if err else "-"
    verdict = "passed" if p.get("passed") else "FAILED"
    equal = f"{p.get('tokens_equal')}/{p.get('tokens_compared')}"
    err = p.get("worst_logits_rel_err")
    err_text = "-" if err is None else f"{err:.1e}"
    if compact:
        return f"{verdict} {equal}, err {err_text}"
    excused = f" ({p['excused']} near-ties excused)" if p.get("excused") else ""
    mode = "teacher-forced" if p.get("teacher_forced") else "free-running"
    tol = f" (tolerance {p['rtol']:.0e})" if p.get("rtol") is not None else ""
    return f"{verdict}: {equal} tokens equal{excused}, logits error {err_text}{tol}, {mode}"


def _bandwidth_lines(rows: list[Row]) -> list[str]:
    seen = dict.fromkeys((r.device or "?", r.llm.get("hbm_read_gbps"), r.llm.get("hbm_read_source"))
                         for r in rows if r.ok and r.llm and r.llm.get("hbm_read_gbps"))
    return [f"HBM read bandwidth of {device}: {gbps:,.0f} GB/s ({source})." for device, gbps, source in seen]


def llm_markdown(rows: list[Row]) -> list[str]:
    """The report's "LLM decode" section (Markdown lines): a line per decode cell, failed ones with
    their reason."""
    table = []
    for r in rows:
        llm = r.llm or {}
        head = [_cell(r.model, 60), _cell(r.config, 60), str(r.batch_size), _shape(r)]
        if r.ok:
            tpot = llm.get("tpot_ms")
            pct = llm.get("pct_of_hbm_read")
            floor = llm.get("floor_tpot_ms")
            figures = [_ms(llm.get("ttft_ms"), "p50"), f"{_ms(tpot, 'p50')} / {_ms(tpot, 'p99')}" if tpot else "-",
                       _ms(llm.get("itl_ms"), "p99"), _rate(llm.get("decode_tokens_per_s")),
                       _rate(llm.get("output_tokens_per_s")), _rate(llm.get("achieved_gbps")),
                       "-" if pct is None else f"{pct:.0f}%", "-" if floor is None else f"{floor:.3g}",
                       _cell(parity_text(llm)), _cell(r.diagnosis or "")]
        else:
            figures = ["-"] * 8 + ["-", _cell(f"failed: {r.error}")]
        table.append(head + figures)
    header = ["model", "config", "batch", "prompt+new", "TTFT p50 ms", "TPOT p50 / p99 ms", "ITL p99 ms",
              "decode tok/s", "output tok/s", "GB/s", "% of HBM read", "floor TPOT ms", "parity", "diagnosis"]
    right = range(2, 12)
    lines = ["## LLM decode", "", DEFINITIONS, "",
             "| " + " | ".join(header) + " |",
             "|" + "|".join("---:" if i in right else "---" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in table]
    bandwidth = _bandwidth_lines(rows)
    return lines + ([""] + bandwidth if bandwidth else []) + [""]


def llm_text_table(results: Results, *, details: bool = True) -> str:
    """The decode cells of ``results`` as a terminal table (what ``gpuopt llm`` prints at the end);
    then, with ``details``, each failed cell's reason and the warnings, wrapped."""
    from .table import text_table, wrapped

    rows = [r for r in results.rows if r.is_llm]
    lines = []
    for r in rows:
        llm = r.llm or {}
        ok = r.ok
        tpot = llm.get("tpot_ms") if ok else None
        pct = llm.get("pct_of_hbm_read") if ok else None
        fmt = lambda stats, key: format_ms(stats[key]) if stats else "-"  # noqa: E731
        lines.append([r.model, r.config, str(r.batch_size), _shape(r),
                      fmt(llm.get("ttft_ms"), "p50") if ok else "-", fmt(tpot, "p50"), fmt(tpot, "p99"),
                      _rate(llm.get("decode_tokens_per_s")) if ok else "-",
                      _rate(llm.get("achieved_gbps")) if ok else "-", "-" if pct is None else f"{pct:.0f}%",
                      parity_text(llm, compact=True) if ok else "failed (below)"])
    out = [text_table(["model", "config", "batch", "prompt+new", "TTFT p50", "TPOT p50", "TPOT p99", "tok/s",
                       "GB/s", "% HBM", "parity"], lines,
                      [False, False, True, True, True, True, True, True, True, True, False])]
    diagnosed = [r for r in rows if r.ok and r.diagnosis]
    if details and diagnosed:
        out += ["", "diagnosis:"]
        out += [wrapped(f"  {r.model} b{r.batch_size} {r.config} {r.mode}: ", r.diagnosis) for r in diagnosed]
    failed = [r for r in rows if not r.ok]
    if details and failed:
        out += ["", "failed cells:"]
        out += [wrapped(f"  {r.model} b{r.batch_size} {r.config} {r.mode}: ", r.error or "") for r in failed]
    warnings = results.select(lambda r: r.is_llm).warning_lines() if details else []
    if warnings:
        out += ["", "warnings:"] + [wrapped("  ", w) for w in warnings]
    return "\n".join(out)


__all__ = ["DEFINITIONS", "llm_markdown", "llm_text_table", "parity_text"]
