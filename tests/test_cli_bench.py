"""The gpuopt CLI's main-job commands, in subprocesses (CI)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import gpuopt
from gpuopt import Results
from gpuopt.cli import main


def cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuopt", *args], capture_output=True, text=True, timeout=600,
                          cwd=cwd)


FAST = ["--max-time-s", "0.2"]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("cli")
    runs = []
    for name in ("a", "b"):
        out = base / name
        proc = cli("bench", "tiny-cnn", "--device", "cpu", "--configs", "fp32,fp32+torchscript", "--batch-sizes",
                   "1,2", *FAST, "--output", str(out))
        assert proc.returncode == 0, proc.stderr
        runs.append(out)
    return runs


def test_bench_writes_a_results_folder_and_prints_the_table(two_runs):
    out = two_runs[0]
    for name in ("results.json", "results.csv", "report.md"):
        assert (out / name).exists()
    assert json.loads((out / "results.json").read_text())["rows"]


def test_report_compare_and_plot(two_runs, tmp_path):
    a, b = (str(p / "results.json") for p in two_runs)
    rep = cli("report", a)
    assert rep.returncode == 0 and "### Throughput" in rep.stdout
    cmp = cli("compare", a, b)
    assert cmp.returncode == 0 and "fp32+torchscript" in cmp.stdout and "x [" in cmp.stdout
    # Two files are two runs: the verdicts are widened by the run-to-run band, and the output says so.
    assert ("cross-run comparison: widened by run-to-run spread ±5.0% (a default, no A/A calibration of this "
            "environment); pass --run-to-run") in cmp.stdout
    given = cli("compare", a, b, "--run-to-run", "0.02")
    assert given.returncode == 0 and "widened by run-to-run spread ±2.0% (given)" in given.stdout
    bad = cli("compare", a, b, "--run-to-run", "-1")
    assert bad.returncode == 2 and "--run-to-run must be a finite fraction >= 0 (0.02 is 2%), got -1" in bad.stderr
    plots = cli("plot", a, "--output", str(tmp_path / "plots"))
    assert plots.returncode == 0 and (tmp_path / "plots" / "tiny-cnn-throughput.png").exists()


def test_bench_train_on_the_cpu_exits_0(tmp_path):
    # the default configs on the CPU with --train: the training preset, no inference-only backend
    proc = cli("bench", "tiny-cnn", "--train", "--device", "cpu", "--batch-sizes", "1", *FAST, "--output",
               str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert {r["config"] for r in rows} == {str(c) for c in gpuopt.preset("bench-cpu-train")}
    assert {r["mode"] for r in rows} == {"host", "train"} and all(r["status"] == "ok" for r in rows)


def test_a_failing_cell_gives_exit_code_1(tmp_path):
    proc = cli("bench", "tiny-cnn", "--device", "cpu", "--configs", "fp32,fp32+cudagraph", "--batch-sizes", "1",
               *FAST, "--output", str(tmp_path))
    assert proc.returncode == 1, proc.stderr
    assert "needs a CUDA device" in proc.stdout
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert {(r["config"], r["status"]) for r in rows} == {("fp32", "ok"), ("fp32+cudagraph", "failed")}


def test_an_error_during_the_run_is_exit_1_with_the_results_so_far_written(tmp_path, monkeypatch, capsys):
    # A ValueError raised once cells have run is a failure of the run, not a usage error (exit 2).
    real = gpuopt.run.runner.Runner.run_batch

    def second_batch_breaks(self, batch):
        if batch == 2:
            raise ValueError("the disk went away")
        real(self, batch)

    monkeypatch.setattr(gpuopt.run.runner.Runner, "run_batch", second_batch_breaks)
    code = main(["bench", "tiny-cnn", "--device", "cpu", "--configs", "fp32", "--batch-sizes", "1,2", *FAST,
                 "--output", str(tmp_path)])
    assert code == 1
    assert "gpuopt bench: the run stopped: ValueError: the disk went away" in capsys.readouterr().err
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [(r["batch_size"], r["status"]) for r in rows] == [(1, "ok")]


def test_usage_errors_are_found_before_anything_runs(tmp_path, monkeypatch, capsys):
    def never(self, batch):
        raise AssertionError("a batch ran")

    monkeypatch.setattr(gpuopt.run.runner.Runner, "run_batch", never)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SystemExit) as info:
        main(["bench", "tiny-cnn", "--device", "cpu", "--output", str(blocker / "out")])
    assert info.value.code == 2 and "is not writable" in capsys.readouterr().err
    spec = tmp_path / "s.toml"
    spec.write_text('models = ["tiny-cnn", "resnet5"]\ndevice = "cpu"\n')
    with pytest.raises(SystemExit) as info:
        main(["sweep", str(spec), "--output", str(tmp_path / "sweep")])
    assert info.value.code == 2 and "unknown model 'resnet5'" in capsys.readouterr().err
    assert not (tmp_path / "sweep").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["bench", "tiny-cnn", "--device", "cpu", "--max-time-s", "-1"],
         "max_time_s must be a finite number of seconds > 0, got -1"),
        (["bench", "tiny-cnn", "--device", "cpu", "--target-rel-ci", "0"], "target_rel_ci must be in (0, 1), got 0"),
        (["bench", "tiny-cnn", "--device", "cpu", "--iters", "0"], "iters must be a positive count"),
        (["bench", "--max-time-s", "0"], "max_time_s must be a finite number of seconds > 0, got 0"),
        (["bench", "tiny-cnn", "--device", "gpu"], "device must be 'cpu', 'cuda' or 'cuda:N', got 'gpu'"),
        (["compare", "a.json", "b.json", "--min-effect", "5"],
         "argument --min-effect: 5 must be a fraction in [0, 1) (0.05 means 5%)"),
        (["profile", "tiny-cnn", "--steps", "0"], "argument --steps: must be a positive integer, got '0'"),
    ],
)
def test_bad_options_are_one_line_usage_errors_before_anything_runs(args, message, monkeypatch, capsys, tmp_path):
    def never(self, batch):
        raise AssertionError("a batch ran")

    monkeypatch.setattr(gpuopt.run.runner.Runner, "run_batch", never)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(args)
    err = capsys.readouterr().err
    assert info.value.code == 2 and message in err, err
    assert "Traceback" not in err and "No CUDA GPU found" not in err  # the error comes alone
    assert not (tmp_path / "gpuopt-results").exists()


def _spec_file(tmp_path, **kw):
    spec = {"models": ["tiny-cnn"], "configs": ["fp32"], "batch_sizes": [1, 2], "modes": ["latency"],
            "device": "cpu", "measure": {"max_time_s": 0.2, "min_time_s": 0.01, "warmup_s": 0.0}}
    spec.update(kw)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return str(path)


def test_a_bad_measure_table_in_a_spec_is_a_usage_error(tmp_path, capsys):
    spec = _spec_file(tmp_path, measure={"max_time_s": -1})
    with pytest.raises(SystemExit) as info:
        main(["sweep", spec, "--output", str(tmp_path / "out")])
    assert info.value.code == 2
    assert "measure: max_time_s must be a finite number of seconds > 0, got -1" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_sweep_resume_interrupt_and_no_resume_from_the_command_line(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    spec = _spec_file(tmp_path, batch_sizes=[1, 2, 3, 4])
    real = gpuopt.run.runner.Runner.run_batch

    def interrupted_after_two(self, batch, configs=None):
        if batch == 3:
            raise KeyboardInterrupt
        real(self, batch, configs)

    monkeypatch.setattr(gpuopt.run.runner.Runner, "run_batch", interrupted_after_two)
    assert main(["sweep", spec, "--output", str(out)]) == 130
    err = capsys.readouterr().err
    assert f"interrupted; 2 cells saved in {out}/ (cells.jsonl); rerun the same command to resume" in err
    assert "Traceback" not in err
    assert len((out / "cells.jsonl").read_text().splitlines()) == 2
    assert len(Results.load(out / "results.json").rows) == 2  # the partial report is whole
    monkeypatch.setattr(gpuopt.run.runner.Runner, "run_batch", real)
    assert main(["sweep", spec, "--output", str(out)]) == 0
    captured = capsys.readouterr()
    assert "resumed: 2 of 4 cells already measured" in captured.err
    assert len((out / "cells.jsonl").read_text().splitlines()) == 4
    # Another spec into the same folder: refused, naming the difference and the way out.
    with pytest.raises(SystemExit) as info:
        main(["sweep", _spec_file(tmp_path, batch_sizes=[1, 2, 3, 4], configs=["bf16"]), "--output", str(out)])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "configs: [['fp32', 'fp32']] -> [['bf16', 'bf16']]" in err and "--no-resume" in err
    assert main(["sweep", _spec_file(tmp_path, batch_sizes=[1], configs=["bf16"]), "--output", str(out),
                 "--no-resume", "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"1 cell, 0 failed; results: {out}/\n"  # --quiet: the summary alone
    assert "moved to" not in captured.err and "[1/1]" not in captured.err
    (previous,) = out.glob("previous-*")
    assert len((previous / "cells.jsonl").read_text().splitlines()) == 4


def test_report_with_an_unknown_baseline_names_the_configs(two_runs, capsys):
    with pytest.raises(SystemExit) as info:
        main(["report", str(two_runs[0] / "results.json"), "--baseline", "nosuch"])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert "baseline 'nosuch' is not a config of these results; configs: fp32, fp32+torchscript" in err


def test_plot_of_results_where_every_cell_failed_says_so(tmp_path, capsys):
    code = main(["bench", "tiny-cnn", "--device", "cpu", "--configs", "fp32+cudagraph", "--batch-sizes", "1", *FAST,
                 "--output", str(tmp_path / "r"), "--quiet"])
    assert code == 1
    out, err = capsys.readouterr()
    assert out.startswith("1 cell, 1 failed; results:") and "failed: tiny-cnn b1 fp32+cudagraph" in err
    assert main(["plot", str(tmp_path / "r" / "results.json"), "--output", str(tmp_path / "p")]) == 1
    err = capsys.readouterr().err
    assert "every cell in" in err and "failed (1 cells): nothing to plot" in err


def test_the_table_sizes_its_columns_and_puts_errors_below(tmp_path, capsys):
    code = main(["bench", "tiny-transformer", "--device", "cpu", "--configs", "fp32,fp32+cudagraph",
                 "--batch-sizes", "1", *FAST, "--output", str(tmp_path), "--no-parity"])
    out = capsys.readouterr().out
    assert code == 1
    lines = out.splitlines()
    assert any(line.startswith("tiny-transformer fp32+cudagraph") for line in lines)  # never cut
    assert "failed (below)" in out and "failed cells:" in out
    reason = json.loads((tmp_path / "results.json").read_text())["rows"][-1]["error"]
    assert " ".join(reason.split()) in " ".join(out.split())  # the whole reason, wrapped


@pytest.mark.parametrize(
    "args, message",
    [
        (["bench", "resnet5"], "did you mean 'resnet50'"),
        (["bench", "tiny-cnn", "--batch-sizes", "0"], "batch sizes must be positive integers"),
        (["bench", "tiny-cnn", "--batch-sizes", "a,b"], "batch sizes must be positive integers"),
        (["bench", "tiny-cnn", "--configs", "fp99"], "unknown config token 'fp99'"),
        (["report", "nonexistent.json"], "cannot read results file"),
        (["sweep", "spec.txt", "--output", "x"], "cannot read sweep spec"),
        (["bench", "--frobnicate"], "unrecognized arguments"),
        (["bench", "tiny-cnn", "--device", "cpu", "--modes", "graph"], "mode 'graph' needs a CUDA device"),
    ],
)
def test_usage_errors_exit_2(args, message):
    proc = cli(*args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert message in proc.stderr


def test_sweep_spec_with_an_unknown_key_exits_2(tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text('models = ["tiny-cnn"]\nbach_sizes = [1]\n')
    proc = cli("sweep", str(spec), "--output", str(tmp_path / "out"))
    assert proc.returncode == 2 and "'bach_sizes'" in proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only default")
def test_bench_without_a_model_on_cpu_runs_the_small_flow_and_says_so(tmp_path):
    proc = cli("bench", "--batch-sizes", "1", *FAST, "--output", str(tmp_path))
    assert proc.returncode in (0, 1), proc.stderr
    assert "No CUDA GPU found" in proc.stderr and "tiny-cnn" in proc.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_ceilings_without_a_gpu_is_a_clear_usage_error():
    proc = cli("ceilings")
    assert proc.returncode == 2 and "need a CUDA device" in proc.stderr
    why = "no CUDA device is visible" if gpuopt._C.cuda_compiled() else "built without CUDA"
    assert why in proc.stderr
