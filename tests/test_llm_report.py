"""LLM decode cells in the Results machinery on the CPU: the Markdown "LLM decode" section beside the
measured tables (failed cells with their reasons), the terminal table, the CSV columns, and the plots
(tokens/s vs batch size, TPOT vs context, the prefill/decode roofline) from synthetic GPU rows built
through DecodeResult.to_row, and from a real tiny run (CI)."""

from __future__ import annotations

import csv
import io

import numpy as np
import pytest

pytest.importorskip("transformers")

import gpuopt  # noqa: E402
from gpuopt import Results  # noqa: E402
from gpuopt.analysis.roofline import place  # noqa: E402
from gpuopt.llm import DecodeParity, DecodeResult  # noqa: E402
from gpuopt.report.llm_report import llm_text_table, parity_text  # noqa: E402
from gpuopt.report.results import Row, llm_mode  # noqa: E402
from gpuopt.timing.measurement import Measurement  # noqa: E402

H100 = "NVIDIA H100 80GB HBM3"
HBM_GBPS = 3350.0  # its datasheet figure
WEIGHT_BYTES = 250e6  # opt-125m in fp16
KV_PER_TOKEN = 2 * 12 * 12 * 64 * 2  # layers x heads x head_dim x (K, V) x fp16


def _stats(np_rng, center_ms: float, n: int = 40) -> dict[str, float]:
    x = center_ms * np_rng.lognormal(0.0, 0.05, n)
    return {"p50": float(np.percentile(x, 50)), "p90": float(np.percentile(x, 90)),
            "p99": float(np.percentile(x, 99)), "mean": float(x.mean()), "min": float(x.min()),
            "max": float(x.max()), "n": n}


def _parity(np_rng, path: str, b: int, **changes) -> DecodeParity:
    fields = dict(reference="fp32 hf-generate", teacher_forced=path.startswith("static"), steps=32, sequences=b,
                  tokens_equal=32 * b, tokens_compared=32 * b, matched_prefix=32, first_mismatch=None, excused=0,
                  unexcused=0, worst_logits_rel_err=float(np_rng.uniform(1e-3, 5e-3)), rtol=3e-2, passed=True)
    return DecodeParity(**{**fields, **changes})


def _decoded(np_rng, path: str, b: int, p: int = 128, n: int = 64, *, model: str = "opt-125m",
             parity: DecodeParity | str | None = "passed", parity_error: str | None = None) -> Row:
    """A GPU decode cell as measure_decode makes it: TPOT slower on the generate path, longer with the
    batch and the context; bandwidth, floor and both roofline placements from the same counts."""
    tpot_center = (0.6 if path.startswith("static") else 4.0) * (1 + b / 16) * (1 + p / 2048)
    tpot = _stats(np_rng, tpot_center)
    ttft = _stats(np_rng, 3 * tpot_center)
    e2e_ms = [ttft["mean"] + (n - 1) * tpot["mean"] * f for f in np_rng.lognormal(0.0, 0.02, 12)]
    e2e = _stats(np_rng, ttft["mean"] + (n - 1) * tpot["mean"])
    per_step = WEIGHT_BYTES + b * KV_PER_TOKEN * (p + n / 2)
    achieved = per_step / (tpot["mean"] * 1e-3) / 1e9
    flops = 2.0 * 125e6 * b * p
    doc = {"device": H100}
    r = DecodeResult(
        model=model, path=path, precision="fp16", batch_size=b, prompt_len=p, new_tokens=n, device=H100,
        measurement=Measurement.from_samples(e2e_ms, mode="latency"), requests=12, ttft_ms=ttft, tpot_ms=tpot,
        itl_ms=_stats(np_rng, tpot_center), e2e_ms=e2e, output_tokens_per_s=b * n * 1e3 / e2e["mean"],
        decode_tokens_per_s=b * 1e3 / tpot["mean"], kv_cache_bytes=None if path.startswith("hf") else
        b * KV_PER_TOKEN * (p + n), kv_bytes_per_token=KV_PER_TOKEN, weight_bytes_per_step=int(WEIGHT_BYTES),
        bytes_per_step=per_step, achieved_gbps=achieved, hbm_read_gbps=HBM_GBPS, hbm_read_source="datasheet",
        pct_of_hbm_read=100 * achieved / HBM_GBPS, floor_tpot_ms=per_step / (HBM_GBPS * 1e9) * 1e3,
        prefill_flops=flops,
        prefill_roofline=place(flops_per_item=flops, bytes_per_item=WEIGHT_BYTES + b * p * KV_PER_TOKEN,
                               items_per_s=1e3 / ttft["mean"], precision="fp16", ceilings=doc),
        decode_roofline=place(flops_per_item=2.0 * 125e6 * b, bytes_per_item=per_step, items_per_s=1e3 / tpot["mean"],
                              precision="fp16", ceilings=doc),
        peak_memory_bytes=int(WEIGHT_BYTES * 1.5), host_ms_per_request=float(np_rng.uniform(1, 2)),
        diagnosis=f"TPOT {tpot['mean']:.3g} ms: memory-bound | near the floor", build_s=0.5,
        parity=_parity(np_rng, path, b) if parity == "passed" else parity, parity_error=parity_error)
    return r.to_row()


def _failed(reason: str, path: str, b: int, p: int = 128, n: int = 64, model: str = "opt-125m") -> Row:
    """A failed cell as decode_sweep records it."""
    return Row.failed(reason, model=model, config=f"fp16+{path}", batch_size=b, mode=llm_mode(p, n), precision="fp16",
                      item_unit="tokens", llm={"path": path, "precision": "fp16", "prompt_len": p, "new_tokens": n})


def _sweep(np_rng) -> Results:
    rows = [_decoded(np_rng, path, b) for path in ("hf-generate", "static-graph") for b in (1, 8, 32)]
    rows.append(_decoded(np_rng, "static-graph", 1, p=512, n=64))
    rows.append(_failed("out of memory: CUDA out of memory. Tried to allocate 40.00 GiB", "hf-generate", 64))
    return Results(rows, ceilings={"device": H100})


def _bench_row(np_rng, b: int) -> Row:
    return Row.measured(Measurement.from_samples(np_rng.lognormal(0, 0.05, 30).tolist(), mode="latency"),
                        model="tiny-cnn", config="fp32", batch_size=b, mode="latency")


# -- Markdown ---------------------------------------------------------------------------------------------

def test_markdown_has_an_llm_decode_section_and_keeps_llm_rows_out_of_the_measured_tables(np_rng):
    res = _sweep(np_rng)
    mixed = Results([_bench_row(np_rng, 1), _bench_row(np_rng, 2), *res.rows], ceilings=res.ceilings)
    md = mixed.to_markdown()
    # The measured tables show tiny-cnn's batch sizes only; the decode model has no per-model tables.
    assert "## tiny-cnn" in md and "## opt-125m" not in md
    latency = md.split("### Latency")[1].split("###")[0]
    assert "| config | batch 1 | batch 2 |" in latency and "batch 8" not in latency
    section = md.split("## LLM decode")[1].split("\n## ")[0]
    assert "TPOT: per request, (end-to-end - TTFT) / (output tokens - 1)" in section
    assert ("| model | config | batch | prompt+new | TTFT p50 ms | TPOT p50 / p99 ms | ITL p99 ms | decode tok/s | "
            "output tok/s | GB/s | % of HBM read | floor TPOT ms | parity | diagnosis |") in section
    lines = [line for line in section.splitlines() if line.startswith("| opt-125m")]
    assert len(lines) == len(res.rows) == 8
    for line, row in zip(lines, res.rows):
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        llm = row.llm
        assert cells[:4] == ["opt-125m", row.config, str(row.batch_size), f"{llm['prompt_len']}+{llm['new_tokens']}"]
        if not row.ok:
            assert cells[4:12] == ["-"] * 8
            assert cells[-1] == "failed: out of memory: CUDA out of memory. Tried to allocate 40.00 GiB"
            continue
        assert cells[4] == f"{llm['ttft_ms']['p50']:.3g}"
        assert cells[5] == f"{llm['tpot_ms']['p50']:.3g} / {llm['tpot_ms']['p99']:.3g}"
        assert cells[6] == f"{llm['itl_ms']['p99']:.3g}"
        # rates: whole numbers from 100 up, else three significant digits
        for cell, value in ((cells[7], llm["decode_tokens_per_s"]), (cells[8], llm["output_tokens_per_s"]),
                            (cells[9], llm["achieved_gbps"])):
            assert float(cell.replace(",", "")) == pytest.approx(value, rel=5e-3, abs=0.5)
        assert cells[10] == f"{llm['pct_of_hbm_read']:.0f}%"
        assert cells[11] == f"{llm['floor_tpot_ms']:.3g}"
        mode = "teacher-forced" if row.config.endswith("static-graph") else "free-running"
        assert cells[12] == (f"passed: {32 * row.batch_size}/{32 * row.batch_size} tokens equal, logits error "
                             f"{llm['parity']['worst_logits_rel_err']:.1e} (tolerance 3e-02), {mode}")
        assert cells[13] == row.diagnosis.replace("|", "\\|")
    assert f"HBM read bandwidth of {H100}: 3,350 GB/s (datasheet)." in section
    # The failed cell is listed with the others too, and the roofline section shows tiny-cnn's rows alone.
    assert "## Failed cells" in md and "| opt-125m | fp16+hf-generate | 64 | llm:p128+n64 | out of memory" in md
    assert "## Roofline" not in md  # the decode cells' placements are drawn, not put in the measured table
    assert "## LLM decode" in Results(res.rows).to_markdown()  # decode rows alone


def test_parity_is_shown_passed_failed_or_not_checked(np_rng):
    failed = _parity(np_rng, "hf-generate", 2, tokens_equal=50, first_mismatch=7, excused=3, unexcused=11,
                     passed=False, worst_logits_rel_err=0.25)
    rows = [_decoded(np_rng, "hf-generate", 2, parity=failed),
            _decoded(np_rng, "static-graph", 2, parity=None,
                     parity_error="RuntimeError: the reference ran out of memory"),
            _decoded(np_rng, "static-graph", 4, parity=None)]
    assert parity_text(rows[0].llm) == ("FAILED: 50/64 tokens equal (3 near-ties excused), logits error 2.5e-01 "
                                        "(tolerance 3e-02), free-running")
    assert parity_text(rows[0].llm, compact=True) == "FAILED 50/64, err 2.5e-01"
    assert parity_text(rows[1].llm) == "not checked: RuntimeError: the reference ran out of memory"
    assert rows[1].parity == {"passed": False, "error": "RuntimeError: the reference ran out of memory"}
    assert parity_text(rows[2].llm) == "-" and rows[2].parity is None
    md = Results(rows).to_markdown()
    assert "| FAILED: 50/64 tokens equal" in md and "| not checked: RuntimeError" in md


def test_the_terminal_table_has_a_line_per_cell_and_the_reasons_below(np_rng):
    res = _sweep(np_rng)
    text = llm_text_table(res)
    lines = text.splitlines()
    assert lines[0].split() == ["model", "config", "batch", "prompt+new", "TTFT", "p50", "TPOT", "p50", "TPOT", "p99",
                                "tok/s", "GB/s", "%", "HBM", "parity"]
    body = [line for line in lines if line.startswith("opt-125m")]
    assert len(body) == 8 and body[-1].endswith("failed (below)")
    assert body[0].endswith(f"passed {32}/{32}, err {res.rows[0].llm['parity']['worst_logits_rel_err']:.1e}")
    assert "failed cells:" in text and "out of memory: CUDA out of memory" in text.split("failed cells:")[1]
    assert "diagnosis:" in text and "memory-bound" in text.split("diagnosis:")[1]
    assert "failed cells:" not in llm_text_table(res, details=False)


# -- CSV ---------------------------------------------------------------------------------------------------

def test_csv_has_ttft_tpot_and_share_of_hbm_read(np_rng, tmp_path):
    res = Results([_bench_row(np_rng, 1), *_sweep(np_rng).rows])
    lines = list(csv.DictReader(io.StringIO(res.to_csv())))
    assert {"ttft_p50_ms", "tpot_p50_ms", "pct_of_hbm_read"} <= set(lines[0])
    bench, *decoded = lines
    assert bench["ttft_p50_ms"] == bench["tpot_p50_ms"] == bench["pct_of_hbm_read"] == ""
    for line, row in zip(decoded, res.rows[1:]):
        assert line["mode"] == row.mode and line["item_unit"] == "tokens"
        if not row.ok:
            assert line["ttft_p50_ms"] == line["tpot_p50_ms"] == line["pct_of_hbm_read"] == ""
            continue
        assert float(line["ttft_p50_ms"]) == pytest.approx(row.llm["ttft_ms"]["p50"])
        assert float(line["tpot_p50_ms"]) == pytest.approx(row.llm["tpot_ms"]["p50"]) == float(line["p50_ms"])
        assert float(line["pct_of_hbm_read"]) == pytest.approx(row.llm["pct_of_hbm_read"])
        assert float(line["achieved_gbps"]) == pytest.approx(row.llm["achieved_gbps"])
        assert float(line["throughput_items_per_s"]) == pytest.approx(row.llm["decode_tokens_per_s"])
    back = Results.load(res.save(tmp_path, plots=False)["json"])
    assert back.to_csv() == res.to_csv()
    pd = pytest.importorskip("pandas")
    df = res.to_dataframe()
    assert all(df[c].dtype == np.float64 for c in ("ttft_p50_ms", "tpot_p50_ms", "pct_of_hbm_read"))
    assert df["tpot_p50_ms"].isna().tolist() == [True] + [False] * 7 + [True]
    assert isinstance(df, pd.DataFrame)


# -- plots ---------------------------------------------------------------------------------------------------

@pytest.fixture
def plt():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    yield plt
    plt.close("all")


def test_tokens_vs_batch_draws_a_line_per_config_and_shape(np_rng, plt):
    res = _sweep(np_rng)
    fig, (a, b) = plt.subplots(1, 2)
    assert gpuopt.plot.tokens_vs_batch(res, ax=a) is fig
    labels = [line.get_label() for line in a.get_lines()]
    assert labels == ["fp16+hf-generate p128+n64", "fp16+static-graph p128+n64", "fp16+static-graph p512+n64"]
    static = a.get_lines()[1]
    rows = [r for r in res.ok if r.config == "fp16+static-graph" and r.mode == "llm:p128+n64"]
    assert static.get_xdata().tolist() == [1, 8, 32]  # the failed batch 64 is left out
    assert static.get_ydata().tolist() == pytest.approx([r.llm["decode_tokens_per_s"] for r in rows])
    assert a.get_xscale() == "log" and a.get_ylabel().startswith("decode tokens/s")
    assert H100 in a.get_title()
    # output tokens/s, from DecodeResult-made rows of two models: the model names each line
    other = _decoded(np_rng, "static-graph", 1, model="llama-1b")
    gpuopt.plot.tokens_vs_batch([*res.rows, other], rate="output", ax=b)
    assert "llama-1b fp16+static-graph p128+n64" in [line.get_label() for line in b.get_lines()]
    assert b.get_lines()[0].get_ydata()[0] == pytest.approx(res.rows[0].llm["output_tokens_per_s"])
    with pytest.raises(ValueError, match="rate must be one of decode, output, got 'prefill'"):
        gpuopt.plot.tokens_vs_batch(res, rate="prefill")
    with pytest.raises(ValueError, match="no measured LLM decode cell to plot"):
        gpuopt.plot.tokens_vs_batch(Results([res.rows[-1], _bench_row(np_rng, 1)]))
    with pytest.raises(TypeError, match="expected Results, a Row, a DecodeResult"):
        gpuopt.plot.tokens_vs_batch("results.json")


def test_tpot_vs_context_puts_the_mean_context_on_x(np_rng, plt):
    res = _sweep(np_rng)
    fig, ax = plt.subplots()
    gpuopt.plot.tpot_vs_context(res, percentile="p99", ax=ax)
    by_label = {line.get_label(): line for line in ax.get_lines()}
    assert set(by_label) == {f"fp16+{p} bs{b}" for p in ("hf-generate", "static-graph") for b in (1, 8, 32)}
    one = by_label["fp16+static-graph bs1"]
    assert one.get_xdata().tolist() == [128 + 32, 512 + 32]
    want = [r.llm["tpot_ms"]["p99"] for r in res.ok if r.config == "fp16+static-graph" and r.batch_size == 1]
    assert one.get_ydata().tolist() == pytest.approx(want)
    assert ax.get_ylabel() == "TPOT p99 (ms per output token)" and "prompt + new tokens / 2" in ax.get_xlabel()
    with pytest.raises(ValueError, match="percentile must be one of p50, p90, p99, mean"):
        gpuopt.plot.tpot_vs_context(res, percentile="p95")


def test_llm_roofline_has_a_prefill_and_a_decode_point_per_cell(np_rng, plt):
    res = _sweep(np_rng)
    fig = gpuopt.plot.llm_roofline(res)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.texts if t.get_text().endswith(("prefill", "decode"))]
    assert len(labels) == 2 * len(res.ok) == 14
    assert "fp16+static-graph bs32 p128+n64 decode" in labels and "fp16+hf-generate bs1 p128+n64 prefill" in labels
    assert len(ax.collections) == 14 and "fp16" in ax.get_title() and H100 in ax.get_title()
    # the datasheet roofline of the rows' device when the results carry no ceilings
    assert gpuopt.plot.llm_roofline(res.rows[:2]).axes[0].get_title().endswith(f"on {H100}")
    with pytest.raises(ValueError, match="no LLM decode cell is placed on the bf16 roofline; placed: fp16"):
        gpuopt.plot.llm_roofline(res, precision="bf16")


def test_save_writes_the_llm_plots_and_leaves_the_measured_ones_out(np_rng, tmp_path):
    pytest.importorskip("matplotlib")
    res = _sweep(np_rng)
    paths = res.save(tmp_path)
    assert {"llm-tokens-vs-batch", "llm-tpot-vs-context", "llm-roofline-fp16"} <= set(paths)
    assert all(paths[k].exists() and paths[k].with_suffix(".svg").exists()
               for k in ("llm-tokens-vs-batch", "llm-tpot-vs-context", "llm-roofline-fp16"))
    assert not any(k.startswith("opt-125m-") for k in paths)  # no throughput/latency/speedup plots of requests
    assert "## LLM decode" in paths["markdown"].read_text()
    back = Results.load(paths["json"])
    assert back.to_markdown().split("## LLM decode")[1] == res.to_markdown().split("## LLM decode")[1]


def test_llm_plots_without_matplotlib_say_how_to_get_it(np_rng, monkeypatch):
    import sys

    res = _sweep(np_rng)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    for plot in (gpuopt.plot.tokens_vs_batch, gpuopt.plot.tpot_vs_context, gpuopt.plot.llm_roofline):
        with pytest.raises(ImportError, match="gpuopt's plots need matplotlib: pip install matplotlib"):
            plot(res)


# -- a real run ----------------------------------------------------------------------------------------------

@pytest.mark.skipif(not hasattr(gpuopt._C, "StepClock"), reason="gpuopt._C was built without StepClock")
def test_a_real_tiny_sweep_reports_and_plots(tmp_path):
    res = gpuopt.decode_sweep("tiny-gpt2", paths="static", precisions="fp32", batch_sizes=[1, 2], prompt_lens=8,
                              new_tokens=4, device="cpu", parity_tokens=4, progress=None, max_time_s=0.1, min_iters=3)
    assert len(res.ok) == 2
    md = res.to_markdown()
    lines = [line for line in md.split("## LLM decode")[1].splitlines() if line.startswith("| tiny-gpt2")]
    assert len(lines) == 2 and all("| passed: " in line and "teacher-forced" in line for line in lines)
    assert "HBM read bandwidth of" not in md  # a CPU run has no HBM ceiling
    pytest.importorskip("matplotlib")
    paths = res.save(tmp_path)
    assert {"llm-tokens-vs-batch", "llm-tpot-vs-context"} <= set(paths)
    assert not any("roofline" in k for k in paths)  # no placement on the CPU
