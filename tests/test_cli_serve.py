"""`gpuopt serve` on the CPU (the Python executor path): one run, a curve, a maximum-rate search and
the naive baseline, results written like `gpuopt bench`; usage errors before anything runs (CI)."""

from __future__ import annotations

import json

import pytest

import gpuopt
from gpuopt import Results
from gpuopt.cli import main

# Small runs: 500 queries (p99 needs 459 for its early-stopping bound), no minimum duration, 8 samples.
QUICK = ["tiny-cnn", "--device", "cpu", "--min-queries", "500", "--duration-s", "0", "--samples", "8",
         "--max-batch-size", "8"]


def test_a_closed_loop_run_prints_its_summary_and_writes_results(tmp_path, capsys):
    code = main(["serve", *QUICK, "--scenario", "closed-loop", "--concurrency", "4", "--max-queue-delay-us", "200",
                 "--output", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "tiny-cnn fp32 [python] closed-loop:" in out and f"results: {tmp_path}/" in out
    (row,) = Results.load(tmp_path / "results.json").rows
    assert row.ok and row.mode == "serve:closed-loop @4 clients" and row.batch_size == 8
    assert row.item_unit == "requests" and row.device == "cpu" and row.precision == "fp32"
    s = row.serving
    assert s["counts"]["ok"] == s["counts"]["issued"] >= 500 and s["valid"]
    assert s["settings"]["max_queue_delay_us"] == 200 and s["settings"]["path"] == "python"
    # every answered request rode in a batch of 1 to 8
    counts = s["batch_size_counts"]
    assert sum(counts) == s["counts"]["ok"] and not counts[0] and len(counts) <= 9
    assert "## Serving" in (tmp_path / "report.md").read_text()
    assert "serve:closed-loop @4 clients" in (tmp_path / "results.csv").read_text()
    for plot in ("tiny-cnn-latency-rate.png", "tiny-cnn-batch-sizes.png"):
        assert (tmp_path / plot).exists(), plot
    assert not (tmp_path / "tiny-cnn-throughput.png").exists()  # no batch-size sweep to plot


def test_a_curve_of_rates_is_a_row_per_rate_and_the_naive_baseline_says_so(tmp_path, capsys):
    assert main(["serve", *QUICK, "--curve", "500", "1000", "--slo-ms", "1000", "--output", str(tmp_path / "a")]) == 0
    rows = Results.load(tmp_path / "a" / "results.json").rows
    assert [r.mode for r in rows] == ["serve:server @500/s", "serve:server @1000/s"]
    assert [r.serving["target_rate"] for r in rows] == [500, 1000]
    assert all(r.serving["load"]["slo_ms"] == 1000 for r in rows)
    out = capsys.readouterr().out
    assert out.count("tiny-cnn fp32 [python] server:") == 2
    assert main(["serve", *QUICK, "--scenario", "closed-loop", "--curve", "1", "2", "--batcher", "naive",
                 "--max-queue-delay-us", "500", "--output", str(tmp_path / "b")]) == 0
    rows = Results.load(tmp_path / "b" / "results.json").rows
    assert [r.mode for r in rows] == ["serve:closed-loop @1 clients naive", "serve:closed-loop @2 clients naive"]
    assert all(r.serving["settings"]["path"] == "naive-python" and r.serving["settings"]["max_wait_ms"] == 0.5
               for r in rows)
    assert "[naive-python] closed-loop" in capsys.readouterr().out


def test_find_max_rate_bisects_with_valid_runs_under_the_slo(tmp_path, capsys):
    code = main(["serve", *QUICK, "--find-max-rate", "--slo-ms", "500", "--output", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "max rate under p99 <= 500.0 ms:" in out
    rows = Results.load(tmp_path / "results.json").rows
    assert rows[0].mode == "serve:offline" and len(rows) >= 2
    steps = rows[1:]
    assert all(r.mode.startswith("serve:server @") for r in steps)
    best = max((r for r in steps if r.serving["valid"]), key=lambda r: r.serving["target_rate"])
    assert f"{best.serving['target_rate']:,.0f} req/s" in out
    assert best.serving["early_stop"]["estimate_ms"] <= 500


def test_no_rate_under_the_slo_is_exit_1_and_names_the_closest(tmp_path, monkeypatch, capsys):
    from gpuopt.serving import RateSearch

    real = gpuopt.serving.max_rate

    def one_failed_step(target, *, slo_ms, model_name, **load):
        step = target.run_load(model_name=model_name, scenario="server", rate=1000.0, slo_ms=slo_ms, **load)
        assert not step.valid
        return RateSearch(slo_ms, None, [step])

    monkeypatch.setattr(gpuopt.serving, "max_rate", one_failed_step)
    code = main(["serve", *QUICK, "--find-max-rate", "--slo-ms", "0.0001", "--output", str(tmp_path)])
    monkeypatch.setattr(gpuopt.serving, "max_rate", real)
    out = capsys.readouterr().out
    assert code == 1 and "no rate met p99 <= 0.0001 ms; closest:" in out and "INVALID" in out
    (row,) = Results.load(tmp_path / "results.json").rows
    assert row.ok and not row.serving["valid"] and any("invalid run" in w for w in row.warnings)


def test_a_config_that_cannot_be_prepared_is_exit_1_with_a_failed_row(tmp_path, capsys):
    code = main(["serve", *QUICK, "--config", "fp32+cudagraph", "--rate", "100", "--output", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 1 and "gpuopt serve: the run stopped: RuntimeError: config fp32+cudagraph could not be " \
                         "prepared" in err
    (row,) = Results.load(tmp_path / "results.json").rows
    assert not row.ok and row.mode == "serve:server @100/s" and "needs a CUDA device" in row.error
    assert "fp32+cudagraph" in (tmp_path / "report.md").read_text()


def test_an_error_during_a_curve_is_exit_1_with_the_results_written(tmp_path, monkeypatch, capsys):
    def broken(self, *args, **kwargs):
        raise RuntimeError("the load generator broke")

    monkeypatch.setattr(gpuopt.serving.Server, "run_load", broken)
    assert main(["serve", *QUICK, "--curve", "100", "200", "--output", str(tmp_path)]) == 1
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    # Each point of the curve is recorded with its reason; the curve went on to the next point.
    assert len(rows) == 2 and len({r["mode"] for r in rows}) == 2
    assert all(r["status"] == "failed" and r["mode"].startswith("serve:server") and "broke" in r["error"]
               for r in rows)


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "the server scenario needs rate (queries per second)"),
        (["--find-max-rate"], "--find-max-rate needs --slo-ms"),
        (["--find-max-rate", "--slo-ms", "5", "--rate", "100"], "picks the server scenario's rates itself"),
        (["--find-max-rate", "--slo-ms", "5", "--curve", "1"], "--find-max-rate and --curve are two different runs"),
        (["--scenario", "offline", "--rate", "100"], "rate applies to the server scenario only"),
        (["--scenario", "offline", "--curve", "1", "2"], "--curve gives rates (--scenario server) or client counts"),
        (["--curve", "100", "100"], "--curve points must differ"),
        (["--scenario", "closed-loop", "--curve", "1.5"], "closed-loop --curve points are client counts"),
        (["--rate", "100", "--max-queue-delay-us", "-1"], "max_queue_delay_us must be an integer >= 0, got -1"),
        (["--rate", "100", "--max-queue-size", "-1"], "max_queue_size must be an integer >= 0"),
        (["--rate", "100", "--preferred-batch-sizes", "4,64"], "preferred_batch_sizes"),
        (["--rate", "100", "--arrival", "trace"], "arrival='trace' needs exactly one of intervals_s or trace_file"),
        (["--rate", "100", "--trace-file", "no-such-file.txt"], "trace file 'no-such-file.txt' does not exist"),
        (["--rate", "0"], "argument --rate: must be a positive number, got '0'"),
        (["--rate", "100", "--scenario", "bogus"], "argument --scenario: invalid choice: 'bogus'"),
        (["--rate", "100", "--config", "fp99"], "unknown config token 'fp99'"),
        (["--rate", "100", "--device", "gpu"], "device must be 'cpu', 'cuda' or 'cuda:N', got 'gpu'"),
    ],
)
def test_bad_arguments_are_usage_errors_before_anything_runs(args, message, monkeypatch, capsys, tmp_path):
    def never(*a, **kw):
        raise AssertionError("a model was prepared")

    monkeypatch.setattr(gpuopt.serving, "build", never)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(["serve", *QUICK, *args, "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert info.value.code == 2 and message in err, err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_an_unknown_model_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["serve", "resnet5", "--rate", "10"])
    assert info.value.code == 2 and "did you mean 'resnet50'" in capsys.readouterr().err
