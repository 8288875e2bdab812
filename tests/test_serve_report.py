"""Serving runs in the Results machinery on the CPU: row keys that keep a curve and its baseline
apart, JSON/CSV round trips, the Markdown serving table beside the measured tables, the latency-vs-load
plot and the batch-size histogram (CI)."""

from __future__ import annotations

import csv
import io

import pytest

import gpuopt
from gpuopt import Results, benchmark
from gpuopt.report.results import Row, serving_mode
from gpuopt.serving import RateSearch, build

LOAD = {"min_queries": 500, "duration_s": 0.0}  # p99 needs 459 queries for its bound


@pytest.fixture(scope="module")
def runs():
    """Two valid server runs at two rates, one run that misses a tiny SLO (invalid), an offline run
    and the naive baseline in a closed loop: real runs of tiny-cnn on the CPU."""
    server, name = build("tiny-cnn", "fp32", device="cpu", samples=8, max_batch_size=8, max_queue_delay_us=500)
    try:
        out = {
            "slow": server.run_load(scenario="server", rate=500.0, slo_ms=1000.0, model_name=name, **LOAD),
            "fast": server.run_load(scenario="server", rate=800.0, slo_ms=1000.0, model_name=name, **LOAD),
            "missed": server.run_load(scenario="server", rate=600.0, slo_ms=1e-4, model_name=name, **LOAD),
            "offline": server.run_load(scenario="offline", model_name=name, **LOAD),
        }
    finally:
        server.close()
    naive, _ = build("tiny-cnn", "fp32", batcher="naive", device="cpu", samples=8, max_batch_size=8)
    out["naive"] = naive.run_load(scenario="closed-loop", concurrency=2, model_name=name, **LOAD)
    return out


@pytest.fixture(scope="module")
def results(runs):
    return Results([r.row() for r in runs.values()])


def test_rows_are_keyed_by_load_point_and_batcher(runs, results):
    assert [r.mode for r in results.rows] == ["serve:server @500/s", "serve:server @800/s", "serve:server @600/s",
                                              "serve:offline", "serve:closed-loop @2 clients naive"]
    assert all(r.ok and r.item_unit == "requests" and r.batch_size == 8 and r.device == "cpu" for r in results.rows)
    assert runs["slow"].valid and runs["fast"].valid and not runs["missed"].valid
    missed = results.rows[2]
    assert missed.warnings == [f"invalid run: {x}" for x in runs["missed"].invalid_reasons] and missed.warnings
    # A label tells apart runs at the same point, e.g. two batcher settings.
    assert runs["slow"].row(label="delay=500us").mode == "serve:server @500/s delay=500us"
    gamma = {"scenario": "server", "rate": 1234.5678, "arrival": "gamma"}
    assert serving_mode(gamma) == "serve:server @1234.57/s gamma"
    assert serving_mode({"scenario": "server", "arrival": "trace"}) == "serve:server @trace"
    assert serving_mode({"scenario": "multi-stream", "concurrency": 1}) == "serve:multi-stream"


def test_serving_rows_round_trip_through_json_and_csv(results, tmp_path):
    paths = results.save(tmp_path)
    back = Results.load(paths["json"])
    assert [r.to_dict() for r in back.rows] == [r.to_dict() for r in results.rows]
    rows = list(csv.DictReader(io.StringIO(results.to_csv())))
    assert [r["mode"] for r in rows] == [r.mode for r in results.rows]
    for line, row in zip(rows, results.rows):
        assert float(line["p99_ms"]) == pytest.approx(row.latency_ms["p99"])
        assert float(line["p99_9_ms"]) == pytest.approx(row.latency_ms["p99.9"])
        assert line["valid"] == str(row.serving["valid"]) and line["item_unit"] == "requests"
    assert [line["offered_rate_per_s"] for line in rows] == ["500.0", "800.0", "600.0", "", ""]
    pd = pytest.importorskip("pandas")
    df = results.to_dataframe()
    assert df["valid"].dtype == pd.BooleanDtype() and df["valid"].tolist() == [True, True, False, True, True]


def test_markdown_has_a_serving_table_beside_the_measured_tables(results, tmp_path):
    measured = benchmark("tiny-cnn", configs=["fp32"], batch_sizes=[1, 2], modes=["latency"], device="cpu",
                         max_time_s=0.1, min_time_s=0.01, warmup=1, warmup_s=0.0, progress=False)
    failed = Row.failed("RuntimeError: boom | twice", model="tiny-cnn", config="fp16+cudagraph", batch_size=8,
                        mode="serve:server @50/s", item_unit="requests")
    mixed = Results([*measured.rows, *results.rows, failed])
    md = mixed.to_markdown()
    # the measured tables show the measured batch sizes only, not the batcher's maximum
    throughput = md.split("### Throughput")[1].split("###")[0]
    assert "| config | batch 1 | batch 2 |" in throughput and "batch 8" not in throughput
    serving = md.split("## Serving")[1].split("\n## ")[0]
    lines = [line for line in serving.splitlines() if line.startswith("| tiny-cnn")]
    assert len(lines) == 6
    assert lines[0].startswith("| tiny-cnn | fp32 | python, max 8, delay 500 us, 2 inst. | server @500/s | 500 |")
    slow = results.rows[0]
    figures = [f"{slow.throughput_items_per_s:,.0f}", *(f"{slow.latency_ms[k]:.3g}" for k in ("p50", "p90", "p99"))]
    assert f"| {' | '.join(figures)} |" in lines[0] and lines[0].endswith("| 500/500 | yes |")
    assert "| 500/500 | no: p99 estimate " in lines[2] and lines[2].endswith(" ms > slo 0.0001 ms |")
    assert "| offline | - |" in lines[3] and "naive-python, max 8, wait 1 ms" in lines[4]
    assert lines[5].endswith("| failed: RuntimeError: boom \\| twice |")
    assert "## Failed cells" in md and "## Environment" in md
    assert "| fp32 | python" in Results(results.rows).to_markdown()  # serving rows alone


def test_latency_vs_rate_draws_each_batcher_with_the_slo_and_marks_invalid_runs(runs, results):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2)
    try:
        assert gpuopt.plot.latency_vs_rate(results, slo_ms=20.0, ax=a) is fig
        labels = [line.get_label() for line in a.get_lines()]
        assert labels == ["fp32 [python] p99", "fp32 [python] p50", "fp32 [naive-python] p99",
                          "fp32 [naive-python] p50", "SLO 20 ms"]  # offline left out
        p99 = a.get_lines()[0]
        want = sorted((r.throughput, r.latency_ms["p99"]) for r in (runs["slow"], runs["fast"], runs["missed"]))
        assert list(p99.get_xdata()) == pytest.approx([w[0] for w in want])
        assert list(p99.get_ydata()) == pytest.approx([w[1] for w in want])
        assert a.get_lines()[-1].get_ydata()[0] == 20.0
        (crosses,) = a.collections
        assert crosses.get_label() == "invalid run"
        assert crosses.get_offsets().tolist() == [[runs["missed"].throughput, runs["missed"].latency_ms["p99"]]]
        # ServeResults, offered rate on x, the p99.9, and the SLO the runs share
        gpuopt.plot.latency_vs_rate([runs["slow"], runs["fast"]], percentile="p99.9", x="rate", ax=b)
        assert b.get_lines()[0].get_xdata().tolist() == [500.0, 800.0]
        assert b.get_lines()[-1].get_label() == "SLO 1000 ms"
        assert b.get_xlabel() == "offered rate (requests/s)"
        # a max_rate search: its steps, and its SLO
        b.clear()
        gpuopt.plot.latency_vs_rate(RateSearch(20.0, runs["slow"], [runs["slow"], runs["missed"]]), ax=b)
        assert b.get_lines()[0].get_xdata().tolist() == sorted([runs["slow"].throughput, runs["missed"].throughput])
        assert b.get_lines()[-1].get_label() == "SLO 20 ms"
    finally:
        plt.close(fig)
    with pytest.raises(ValueError, match="percentile must be one of p50, p90, p95, p99, p99.9, got 'p42'"):
        gpuopt.plot.latency_vs_rate(results, percentile="p42")
    with pytest.raises(ValueError, match="no answered serving run to plot"):
        gpuopt.plot.latency_vs_rate([runs["offline"]])
    with pytest.raises(TypeError, match="expected Results, a Row, a ServeResult"):
        gpuopt.plot.latency_vs_rate("results.json")


def test_batch_size_histogram_counts_requests_per_batch_size(runs):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = runs["offline"]
    counts = run.result["batch_size_counts"]
    fig, ax = plt.subplots()
    try:
        assert gpuopt.plot.batch_size_histogram(run, ax=ax) is fig
        bars = {round(p.get_x() + p.get_width() / 2): p.get_height() for p in ax.patches}
        assert bars == {b: n for b, n in enumerate(counts) if n}
        assert sum(bars.values()) == run.result["ok"]
        mean = sum(b * n for b, n in bars.items()) / sum(bars.values())
        assert ax.get_lines()[0].get_label() == f"mean {mean:.1f}"
    finally:
        plt.close(fig)
    with pytest.raises(ValueError, match="shows one serving run \\(a ServeResult or a Row\\), got 5"):
        gpuopt.plot.batch_size_histogram(Results([r.row() for r in runs.values()]))


def test_save_all_writes_the_serving_plots(results, tmp_path):
    pytest.importorskip("matplotlib")
    paths = gpuopt.plot.save_all(results, tmp_path)
    assert set(paths) == {"tiny-cnn-latency-rate", "tiny-cnn-batch-sizes"}
    assert all(p.exists() and p.with_suffix(".svg").exists() for p in paths.values())


def test_plots_without_matplotlib_say_how_to_get_it(results, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match="gpuopt's plots need matplotlib: pip install matplotlib"):
        gpuopt.plot.latency_vs_rate(results)
    with pytest.raises(ImportError, match="gpuopt's plots need matplotlib"):
        gpuopt.plot.batch_size_histogram(results.rows[0])
