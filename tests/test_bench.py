"""The main job on the CPU: benchmark(), Results and its formats, one failure path for cells and batch
sizes, sweeps and resume, and reading version 1 files (CI)."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import gpuopt
from gpuopt import Results, benchmark, sweep
from gpuopt.report.results import SCHEMA_VERSION, Row, read_cells
from gpuopt.run.bench import plan_benchmark
from gpuopt.run.zoo import TinyCNN
from gpuopt.timing.measurement import Measurement

V1_RESULTS = (Path(__file__).resolve().parent.parent / "benchmarks" / "results"
              / "gpuopt-bench-resnet50-nvidia-h100-80gb-hbm3" / "results.json")

FAST = {"max_time_s": 0.2, "min_time_s": 0.01, "warmup": 1, "warmup_s": 0.0, "progress": False}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    return benchmark("tiny-cnn", configs=["fp32", "bf16-amp", "fp32+torchscript"], batch_sizes=[1, 4],
                     modes=["latency", "end-to-end"], device="cpu", output_dir=str(out), **FAST), out


def test_every_cell_is_a_row(results):
    res, _ = results
    # on the CPU latency is host mode
    assert len(res.rows) == 3 * 2 * 2
    assert {r.mode for r in res.rows} == {"host", "end-to-end"}
    assert not res.failed
    for r in res.ok:
        m = r.measurement
        assert r.latency_ms["p50"] == m.p50 == pytest.approx(float(np.median(m.samples_ms)))
        assert r.throughput_items_per_s == pytest.approx(r.batch_size * 1e3 / m.p50)
        assert m.n == len(m.samples_ms) > 0 and r.device == "cpu"
        assert r.parity["passed"] and r.prepare_s is not None and r.first_call_ms > 0
        assert r.runner_overhead_s >= 0
        assert r.flops_per_item > 0 and r.bytes_per_item_min > 0
        assert res.find(r.model, r.config, r.batch_size, r.mode) is r


def test_the_default_configs_follow_the_device_and_train(monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("planning measured something")

    monkeypatch.setattr(gpuopt.run.runner, "measure", never)
    for train, name in ((False, "bench-cpu"), (True, "bench-cpu-train")):
        plan = plan_benchmark("tiny-cnn", device="cpu", train=train, **FAST)
        assert plan.configs == gpuopt.preset(name)
    with pytest.raises(ValueError, match="configs fp32\\+torchscript use an inference-only backend \\(torchscript "
                                         "or cudagraph or onnxruntime or tensorrt\\) or precision \\(int8-wo or "
                                         "int8 or fp8\\) and cannot time training steps; with train=True"):
        plan_benchmark("tiny-cnn", configs=["fp32", "fp32+torchscript"], train=True, device="cpu")
    with pytest.raises(ValueError, match="configs fp32\\+torchscript use an inference-only"):
        plan_benchmark("tiny-cnn", configs="bench-cpu", train=True, device="cpu")


def test_training_with_the_default_configs_times_every_cell():
    res = benchmark("tiny-cnn", batch_sizes=[2], modes=["latency"], train=True, device="cpu", **FAST)
    assert [c for c in res.configs()] == [c.label for c in gpuopt.preset("bench-cpu-train")]
    assert not res.failed and {r.mode for r in res.rows} == {"host", "train"}
    train = [r for r in res.rows if r.mode == "train"]
    assert len(train) == len(res.configs()) and all(r.throughput_items_per_s > 0 for r in train)
    assert "### Training step" in res.to_markdown()


def test_files_are_written_and_read_back(results):
    res, out = results
    for name in ("results.json", "results.csv", "report.md", "tiny-cnn-throughput.png", "tiny-cnn-speedup.svg"):
        assert (out / name).exists(), name
    doc = json.loads((out / "results.json").read_text())
    assert doc["schema_version"] == SCHEMA_VERSION == 2
    assert all("config_label" not in r for r in doc["rows"])  # one label field
    back = Results.load(out / "results.json")
    assert [r.to_dict() for r in back.rows] == json.loads(json.dumps([r.to_dict() for r in res.rows], default=str))
    assert [r.measurement for r in back.rows] == [r.measurement for r in res.rows]
    assert back.env["torch"] == torch.__version__
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["config"], int(r["batch_size"]), r["mode"]) for r in rows] == [
        (r.config, r.batch_size, r.mode) for r in res.rows]
    assert res.to_dataframe().shape[0] == len(res.rows)


def test_plots_draw_into_given_axes_and_leave_out_an_empty_memory_plot(results):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res, out = results
    fig, axes = plt.subplots(2, 2)
    try:
        calls = [(gpuopt.plot.throughput_vs_batch, "lines"), (gpuopt.plot.latency_vs_batch, "lines"),
                 (gpuopt.plot.speedup_bars, "patches"), (gpuopt.plot.latency_distribution, "collections")]
        for ax, (fn, artists) in zip(axes.flat, calls):
            assert fn(res, ax=ax) is fig
            assert getattr(ax, artists), fn.__name__
        assert len(fig.axes) == 4 and len(plt.get_fignums()) == 1
    finally:
        plt.close(fig)
    # a CPU run records no device memory: no memory plot, drawn or saved
    with pytest.raises(ValueError, match="recorded device memory \\(a CPU run records none\\): no memory plot"):
        gpuopt.plot.memory_bars(res)
    assert not list(out.glob("*memory*")) and (out / "tiny-cnn-throughput.png").exists()


def test_markdown_has_the_seeds_tables(results):
    res, _ = results
    md = res.to_markdown()
    for section in ("### Throughput (images/s", "### Latency (ms per batch", "### Speedup over fp32",
                    "### End to end", "## Environment"):
        assert section in md, section
    assert "| fp32+torchscript |" in md


def _verdict_from_interval(speedup: float, lo: float, hi: float, min_effect: float = 0.01) -> str:
    """The verdict rule as gpuopt documents it, written out independently."""
    if lo > 1 and speedup >= 1 + min_effect:
        return "faster"
    if hi < 1 and speedup <= 1 / (1 + min_effect):
        return "slower"
    return "no significant difference"


def test_speedups_are_ratios_of_medians_with_the_documented_verdict(results):
    res, _ = results
    s = res.speedups()
    assert s and all(x["baseline"] == "fp32" for x in s)
    measured = [x for x in s if x.get("speedup") is not None]
    assert measured
    for x in measured:
        ref = res.find("tiny-cnn", "fp32", x["batch_size"], x["mode"]).measurement
        row = res.find("tiny-cnn", x["config"], x["batch_size"], x["mode"]).measurement
        assert x["speedup"] == pytest.approx(np.median(ref.samples_ms) / np.median(row.samples_ms), rel=1e-9)
        assert x["ci"][0] <= x["speedup"] <= x["ci"][1]
        # Too few samples for a 95% interval of either median: never significant.
        attained = ref.ci_level >= ref.ci_requested and row.ci_level >= row.ci_requested
        expected = _verdict_from_interval(x["speedup"], *x["ci"]) if attained else "no significant difference"
        assert x["verdict"] == expected


def _cell(model: str, config: str, samples: np.ndarray, batch: int = 4, mode: str = "latency") -> Row:
    return Row.measured(Measurement.from_samples(samples.tolist(), mode=mode), model=model, config=config,
                        batch_size=batch, mode=mode)


def test_the_results_name_the_device_the_rows_ran_on(np_rng):
    gpu = {"gpus": [{"name": "NVIDIA H200"}]}
    on_cpu = dataclasses.replace(_cell("m", "fp32", np_rng.lognormal(0, 0.1, 20)), device="cpu")
    # a CPU run on a machine with a GPU says CPU (its title and repr), not the machine's first GPU
    assert Results([on_cpu], env=gpu).device == "CPU" and "device CPU" in repr(Results([on_cpu], env=gpu))
    on_gpu = dataclasses.replace(_cell("m", "fp16", np_rng.lognormal(0, 0.1, 20)), device="NVIDIA H200")
    assert Results([on_gpu], env=gpu).device == "NVIDIA H200"
    assert Results([on_cpu, on_gpu], env=gpu).device == "NVIDIA H200"
    assert Results([_cell("m", "fp32", np_rng.lognormal(0, 0.1, 20))], env={}).device == "CPU"  # no GPU at all
    assert Results([_cell("m", "fp32", np_rng.lognormal(0, 0.1, 20))], env=gpu).device == "NVIDIA H200"


def test_the_dataframe_keeps_the_label_column_and_numbers_numeric(np_rng):
    pd = pytest.importorskip("pandas")
    samples = np_rng.lognormal(np.log(2.0), 0.05, 200)
    ok = _cell("m", "fast one", samples)
    res = Results([ok, Row.failed("boom", model="m", config="broken", batch_size=4, mode="latency")])
    df = res.to_dataframe()
    assert list(df["config"]) == [r.config for r in res.rows] == ["fast one", "broken"]
    for col in ("p50_ms", "p95_ms", "ci95_low_ms", "ci95_high_ms", "ci_rel", "throughput_items_per_s",
                "prepare_s", "achieved_tflops"):
        assert df[col].dtype == np.float64, col
    assert df["batch_size"].dtype == np.int64 and df["parity_passed"].dtype == pd.BooleanDtype()
    assert df.loc[0, "p50_ms"] == pytest.approx(float(np.median(samples)))
    assert [df.loc[0, "ci95_low_ms"], df.loc[0, "ci95_high_ms"]] == ok.ci95_ms
    assert df.loc[1, ["p50_ms", "ci95_low_ms", "throughput_items_per_s"]].isna().all()
    # a table of failed cells alone keeps the dtypes (all-missing columns are not object)
    only_failed = Results([Row.failed("boom", model="m", config="broken", batch_size=4, mode="latency")])
    assert only_failed.to_dataframe()["p50_ms"].dtype == np.float64


def test_a_comparison_shows_as_an_html_table_with_its_verdict(np_rng):
    fast = Measurement.from_samples(np_rng.lognormal(np.log(1.0), 0.02, 300).tolist(), label="new <b>")
    slow = Measurement.from_samples(np_rng.lognormal(np.log(2.0), 0.02, 300).tolist(), label="old")
    c = gpuopt.compare(slow, fast)
    html = c._repr_html_()
    assert html.startswith("<table>") and "faster" in html and f"{c.speedup:.3f}x" in html
    assert f"[{c.ci[0]:.3f}, {c.ci[1]:.3f}]" in html and "old (baseline)" in html
    assert "new &lt;b&gt;" in html and "two separate measurements" in html


def test_speedup_verdicts_follow_the_data(np_rng):
    # Lognormal timings with 2% noise: half the time is faster, twice the time slower.
    base = np_rng.lognormal(np.log(2.0), 0.02, 400)
    res = Results([_cell("m", "fp32", base),
                   _cell("m", "half", np_rng.lognormal(np.log(1.0), 0.02, 400)),
                   _cell("m", "double", np_rng.lognormal(np.log(4.0), 0.02, 400)),
                   _cell("m", "same", np_rng.lognormal(np.log(2.0), 0.02, 400))])
    by = {x["config"]: x for x in res.speedups()}
    assert by["half"]["verdict"] == "faster" and by["half"]["speedup"] == pytest.approx(2.0, rel=0.02)
    assert by["double"]["verdict"] == "slower" and by["double"]["speedup"] == pytest.approx(0.5, rel=0.02)
    # The same distribution: within min_effect (1%) of no change, whatever side of 1 the interval falls.
    assert by["same"]["verdict"] == "no significant difference" and by["same"]["speedup"] == pytest.approx(1, abs=0.01)
    for x in by.values():
        other = res.find("m", x["config"], 4, "latency").measurement.samples_ms
        assert x["speedup"] == pytest.approx(np.median(base) / np.median(other), rel=1e-9)


def test_a_failing_config_is_recorded_and_the_rest_goes_on():
    res = benchmark(TinyCNN(), input_shape=(3, 32, 32), configs=["fp32", "fp32+cudagraph", "bf16"],
                    batch_sizes=[2], modes=["latency"], device="cpu", **FAST)
    by = {r.config: r for r in res.rows}
    assert by["fp32+cudagraph"].status == "failed" and "needs a CUDA device" in by["fp32+cudagraph"].error
    assert by["fp32"].status == by["bf16"].status == "ok"
    assert "## Failed cells" in res.to_markdown()


def test_the_runner_calls_before_mode_once_per_cell_after_preparation_and_before_timing():
    """The hook a distributed rank aligns on: once per cell and mode -- a failed cell's too, so every
    rank calls it equally often -- after the cell's preparation and parity (the model already ran), right
    before the timed part."""
    events: list[str] = []

    class Logged(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 4)

        def forward(self, x):
            events.append("call")
            return self.lin(x)

    plan = plan_benchmark(Logged(), input_shape=(8,), configs=["fp32", "fp32+cudagraph", "bf16"], batch_sizes=[2],
                          modes=["host"], device="cpu", **FAST)
    rows: list[Row] = []
    runner = plan.runner(lambda row: (rows.append(row), events.append("row")), profile_dir=None,
                         before_mode=lambda: events.append("ready"))
    runner.run_batch(2)
    marks = [e for e in events if e != "call"]
    assert marks == ["ready", "row"] * 3, marks
    assert [r.status for r in rows] == ["ok", "failed", "ok"]
    # Each cell's events, up to its row: a measured cell's model ran before "ready" (its preparation)
    # and again after it (warm-up and the timed calls).
    cells = " ".join(events).split(" row")[:3]
    for row, cell in zip(rows, cells):
        before, after = cell.split("ready")
        if row.ok:
            assert "call" in before and after.count("call") > 1, cell


class Overflow(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        torch.nn.init.constant_(self.lin.weight, 1e3)

    def forward(self, x):
        return self.lin(x * 1e3)


def test_a_config_that_drifts_fails_the_parity_gate_and_is_not_timed():
    res = benchmark(Overflow(), input_shape=(8,), configs=["fp32", "fp16"], batch_sizes=[2], modes=["latency"],
                    device="cpu", **FAST)
    bad = res.find("Overflow", "fp16", 2, "host")
    assert bad.status == "failed" and bad.error.startswith("parity failed")
    assert bad.measurement is None and bad.parity["passed"] is False


def test_out_of_memory_in_one_cell_is_recorded(monkeypatch):
    real = gpuopt.run.runner.measure
    calls = {"n": 0}

    def flaky(fn, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return real(fn, **kw)

    monkeypatch.setattr(gpuopt.run.runner, "measure", flaky)
    res = benchmark("tiny-cnn", configs=["fp32", "bf16"], batch_sizes=[1, 2], modes=["latency"], device="cpu", **FAST)
    assert [r.status for r in res.rows].count("failed") == 1
    assert res.failed[0].error == "out of memory: CUDA out of memory. Tried to allocate 20.00 GiB"


class OutOfMemoryAt(torch.nn.Module):
    """A linear layer that runs out of memory at one batch size only (as a GPU would at a large one)."""

    def __init__(self, batch: int):
        super().__init__()
        self.batch = batch
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        if x.shape[0] == self.batch:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
        return self.lin(x)


def _check_failed_batch(res: Results, model: str, batches: list[int], failing: int) -> None:
    assert len(res.rows) == 2 * len(batches)
    for b in batches:
        for cfg in ("fp32", "bf16"):
            row = res.find(model, cfg, b, "host")
            if b == failing:
                assert row.status == "failed" and row.measurement is None, row
                assert row.error == (f"out of memory in the fp32 reference at batch {b}: CUDA out of memory. "
                                     "Tried to allocate 80.00 GiB")
            else:
                assert row.status == "ok" and row.measurement.n > 0, row.error


def test_a_reference_out_of_memory_fails_that_batch_and_benchmark_keeps_the_others(tmp_path):
    res = benchmark(OutOfMemoryAt(4), input_shape=(8,), configs=["fp32", "bf16"], batch_sizes=[2, 4, 8],
                    modes=["latency"], device="cpu", output_dir=str(tmp_path), **FAST)
    _check_failed_batch(res, "OutOfMemoryAt", [2, 4, 8], failing=4)
    saved = Results.load(tmp_path / "results.json")
    assert [r.to_dict() for r in saved.rows] == json.loads(json.dumps([r.to_dict() for r in res.rows]))
    assert "out of memory in the fp32 reference at batch 4" in saved.to_markdown()


def test_a_reference_out_of_memory_fails_that_batch_in_a_sweep_too(tmp_path, monkeypatch):
    model = OutOfMemoryAt(2)
    monkeypatch.setattr(gpuopt.run.sweeps, "workload",
                        lambda name, input_shape=None: gpuopt.run.workload.workload(model, input_shape=(8,)))
    res = sweep(_spec(batch_sizes=[1, 2, 3]), tmp_path, progress=False)
    _check_failed_batch(res, "OutOfMemoryAt", [1, 2, 3], failing=2)
    assert [r.key for r in read_cells(tmp_path / "cells.jsonl")] == [r.key for r in res.rows]


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        ({"model_or_name": "resnet5"}, ValueError, "unknown model 'resnet5' \\(did you mean 'resnet50'"),
        ({"batch_sizes": []}, ValueError, "batch_sizes must be a non-empty list"),
        ({"batch_sizes": [1, 0]}, ValueError, "positive integers, got 0"),
        ({"batch_sizes": [1.5]}, ValueError, "positive integers, got 1.5"),
        ({"modes": ["fastest"]}, ValueError, "modes must be a non-empty list of"),
        ({"modes": ["graph"]}, ValueError, "mode 'graph' needs a CUDA device"),
        ({"configs": []}, ValueError, "configs must be a preset name"),
        ({"configs": ["fp32", "fp99"]}, ValueError, "unknown config token 'fp99'"),
        ({"itres": 3}, TypeError, "unknown measure option\\(s\\) itres"),
        ({"model_or_name": 42}, TypeError, "model must be a zoo name"),
        ({"parity": "yes"}, TypeError, "parity must be True or False"),
    ],
)
def test_bad_arguments_are_clear_errors(kwargs, exc, match):
    args = {"model_or_name": "tiny-cnn", "device": "cpu", "batch_sizes": [1], **FAST, **kwargs}
    with pytest.raises(exc, match=match):
        benchmark(args.pop("model_or_name"), **args)


def test_inputs_that_do_not_fit_fail_their_cells_naming_the_model_and_the_shape():
    res = benchmark(torch.nn.Linear(4, 2), input_shape=(7,), configs=["fp32", "bf16"], batch_sizes=[2, 3],
                    modes=["latency"], device="cpu", **FAST)
    assert len(res.rows) == len(res.failed) == 4
    for r in res.rows:
        assert r.error.startswith(f"Linear: the fp32 reference failed on inputs of shape ({r.batch_size}, 7) "
                                  f"(batch {r.batch_size}): fp32: RuntimeError: mat1 and mat2 shapes cannot be "
                                  "multiplied"), r.error
    with pytest.raises(ValueError, match="input_shape must be a non-empty sequence of positive ints"):
        benchmark(torch.nn.Linear(4, 2), input_shape=(0,), device="cpu", **FAST)
    with pytest.raises(ValueError, match="give at most one of inputs, input_shape, input_fn"):
        benchmark(torch.nn.Linear(4, 2), input_shape=(4,), inputs=torch.randn(2, 4), device="cpu", **FAST)


def test_a_plan_validates_everything_and_runs_nothing(monkeypatch, tmp_path):
    def never(*args, **kwargs):
        raise AssertionError("planning measured something")

    monkeypatch.setattr(gpuopt.run.runner, "measure", never)
    plan = plan_benchmark("tiny-cnn", configs=["fp32", "bf16"], batch_sizes=[2, 1, 2], device="cpu",
                          output_dir=str(tmp_path / "out"), **FAST)
    assert [c.label for c in plan.configs] == ["fp32", "bf16"] and plan.batch_sizes == [2, 1]
    assert plan.modes == ["host"] and not (tmp_path / "out" / "results.json").exists()
    with pytest.raises(ValueError, match="unknown config token 'fp99'"):
        plan_benchmark("tiny-cnn", configs=["fp99"], device="cpu")


def test_results_find_cells_by_key_and_refuse_a_cell_twice(np_rng):
    row = _cell("m", "fp32", np_rng.lognormal(0, 0.1, 50))
    res = Results([row, _cell("m", "fp32", np_rng.lognormal(0, 0.1, 50), batch=8)])
    assert res.find("m", "fp32", 4, "latency") is row and res.find("m", "fp32", 2, "latency") is None
    with pytest.raises(ValueError, match="cell m fp32 batch 4 latency is already in these results"):
        res.add(_cell("m", "fp32", np_rng.lognormal(0, 0.1, 50)))
    with pytest.raises(ValueError, match="a failed row needs its reason"):
        Row.failed("", model="m", config="fp32", batch_size=1, mode="latency")
    with pytest.raises(TypeError, match="latency_ms cannot be given as facts of a row"):
        Row.failed("boom", model="m", config="fp32", batch_size=1, mode="latency", latency_ms={"p50": 1.0})


def test_unwritable_output_dir_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="output directory .* is not writable"):
        benchmark("tiny-cnn", batch_sizes=[1], device="cpu", output_dir=str(blocker / "sub"), **FAST)


def _spec(**kw):
    spec = {"models": ["tiny-cnn"], "configs": ["fp32", "bf16"], "batch_sizes": [1, 2], "modes": ["latency"],
            "device": "cpu", "measure": {k: v for k, v in FAST.items() if k != "progress"}}
    spec.update(kw)
    return spec


def test_sweep_appends_cells_and_resumes(tmp_path):
    res = sweep(_spec(), tmp_path, progress=False)
    lines = (tmp_path / "cells.jsonl").read_text().splitlines()
    assert len(lines) == len(res.rows) == 4 and all(r.status == "ok" for r in res.rows)
    assert (tmp_path / "results.json").exists() and (tmp_path / "report.md").exists()
    again = sweep(_spec(), tmp_path, progress=False)  # nothing left to run
    assert len((tmp_path / "cells.jsonl").read_text().splitlines()) == 4 and len(again.rows) == 4
    assert json.loads((tmp_path / "sweep.json").read_text())["fingerprint"]["measure"]["max_time_s"] == 0.2


def test_a_sweep_refuses_to_resume_a_folder_of_another_sweep_and_names_the_differences(tmp_path, monkeypatch):
    sweep(_spec(), tmp_path, progress=False)
    before = (tmp_path / "cells.jsonl").read_text()

    def never(*args, **kwargs):
        raise AssertionError("a cell ran")

    monkeypatch.setattr(gpuopt.run.runner, "measure", never)
    other = _spec(batch_sizes=[1, 2, 3], measure={**_spec()["measure"], "max_time_s": 0.3})
    with pytest.raises(ValueError) as info:
        sweep(other, tmp_path, progress=False)
    msg = str(info.value)
    assert "holds 4 cells of a different sweep" in msg
    assert "measure.max_time_s: 0.2 -> 0.3" in msg
    assert "'batch_sizes': [1, 2]" in msg and "'batch_sizes': [1, 2, 3]" in msg  # the models entry, old -> new
    assert "--no-resume" in msg and "a new --output folder" in msg
    assert "configs" not in msg and "device" not in msg  # only what differs
    # A default written out is the same sweep: max_time_s 10 is measure()'s default.
    plan = gpuopt.run.sweeps.plan_sweep(_spec(measure={}), tmp_path / "b", progress=False)
    assert plan.fingerprint == gpuopt.run.sweeps.plan_sweep(
        _spec(measure={"max_time_s": 10.0}), tmp_path / "b", progress=False).fingerprint
    assert (tmp_path / "cells.jsonl").read_text() == before  # refused before anything was written


def test_a_folder_without_a_fingerprint_is_not_resumed(tmp_path):
    first = sweep(_spec(), tmp_path / "a", progress=False)
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "cells.jsonl").write_text("\n".join(json.dumps(r.to_dict()) for r in first.rows) + "\n")
    with pytest.raises(ValueError, match="holds 4 measured cells without the record of how they were measured"):
        sweep(_spec(), tmp_path / "old", progress=False)


def test_resume_false_moves_the_earlier_sweep_aside_and_starts_over(tmp_path, capsys):
    first = sweep(_spec(), tmp_path, progress=False)
    old_cells = (tmp_path / "cells.jsonl").read_text()
    res = sweep(_spec(configs=["fp32"]), tmp_path, resume=False, progress=True)
    assert "the earlier sweep's files were moved to" in capsys.readouterr().err
    (previous,) = tmp_path.glob("previous-*")
    assert (previous / "cells.jsonl").read_text() == old_cells  # measured data kept, byte for byte
    assert {p.name for p in previous.iterdir()} >= {"cells.jsonl", "sweep.json", "results.json", "report.md",
                                                    "tiny-cnn-throughput.png", "tiny-cnn-speedup.svg"}
    assert [r.key for r in Results.load(previous / "results.json").rows] == [r.key for r in first.rows]
    assert len(res.rows) == 2 and len((tmp_path / "cells.jsonl").read_text().splitlines()) == 2


def test_a_resumed_sweep_says_how_many_cells_it_reused(tmp_path, capsys):
    sweep(_spec(batch_sizes=[1]), tmp_path / "a", progress=False)
    lines = (tmp_path / "a" / "cells.jsonl").read_text().splitlines()
    (tmp_path / "a" / "cells.jsonl").write_text(lines[0] + "\n")  # as if stopped after the first cell
    res = sweep(_spec(batch_sizes=[1]), tmp_path / "a", progress=True)
    err = capsys.readouterr().err
    assert "resumed: 1 of 2 cells already measured" in err and "[1/1] tiny-cnn b1 bf16" in err
    assert len(res.rows) == 2


def test_sweep_spec_strings_are_one_element_lists(tmp_path):
    yaml = pytest.importorskip("yaml")
    y = tmp_path / "spec.yaml"
    y.write_text(yaml.safe_dump({**_spec(), "models": "tiny-cnn", "configs": "fp32", "batch_sizes": 1}))
    res = sweep(y, tmp_path / "out", progress=False)
    assert [r.key for r in res.rows] == [("tiny-cnn", "fp32", 1, "host")]


@pytest.mark.parametrize(
    "measure, error, match",
    [
        ({"max_time_s": -1}, ValueError, "measure: max_time_s must be a finite number of seconds > 0, got -1"),
        ({"target_rel_ci": 0}, ValueError, r"measure: target_rel_ci must be in \(0, 1\), got 0"),
        ({"iters": 0}, ValueError, "measure: iters must be a positive count"),
        ({"max_time_s": "2"}, TypeError, "measure: max_time_s must be a number, got '2'"),
        ({"max_tme_s": 2}, TypeError, "measure: unknown measure option\\(s\\) max_tme_s"),
        ({"flush_l2": True}, ValueError, "flush_l2=True applies to mode=\"latency\" or \"graph\""),
    ],
)
def test_bad_measure_options_in_a_spec_fail_before_anything_runs(tmp_path, measure, error, match):
    with pytest.raises(error, match=match):
        sweep(_spec(measure=measure), tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"max_time_s": 0}, ValueError, "max_time_s must be a finite number of seconds > 0, got 0"),
        ({"iters": -3}, ValueError, "iters must be a positive count"),
        ({"warmup": 1.5}, TypeError, "warmup must be an integer, got 1.5"),
        ({"device": "gpu"}, ValueError, "device must be 'cpu', 'cuda' or 'cuda:N', got 'gpu'"),
        ({"device": 3}, TypeError, "device must be 'cpu', 'cuda', 'cuda:N' or a torch.device, got 3"),
    ],
)
def test_benchmark_checks_its_options_before_anything_runs(kwargs, error, match):
    with pytest.raises(error, match=match):
        plan_benchmark("tiny-cnn", configs=["fp32"], batch_sizes=[1], **{"device": "cpu", **kwargs})


def test_measure_validates_its_options_in_one_place():
    with pytest.raises(ValueError, match="max_time_s must be a finite number of seconds > 0, got -1"):
        gpuopt.measure(lambda: None, mode="host", max_time_s=-1)
    with pytest.raises(TypeError, match="unknown measure option\\(s\\) max_tme_s"):
        gpuopt.timing.validate_measure_options({"max_tme_s": 1})
    opts = {"max_time_s": 0.5, "iters": 5}
    assert gpuopt.timing.validate_measure_options(opts, ["host", "throughput"]) is opts


def test_an_interrupted_sweep_loses_no_finished_cell(tmp_path, monkeypatch):
    real = gpuopt.run.runner.measure
    calls = {"n": 0}

    def interrupted(fn, **kw):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(fn, **kw)

    monkeypatch.setattr(gpuopt.run.runner, "measure", interrupted)
    with pytest.raises(KeyboardInterrupt):
        sweep(_spec(), tmp_path, progress=False)
    assert len((tmp_path / "cells.jsonl").read_text().splitlines()) == 2
    assert Results.load(tmp_path / "results.json").rows  # the partial report was written
    monkeypatch.setattr(gpuopt.run.runner, "measure", real)
    done = sweep(_spec(), tmp_path, progress=False)
    assert len(done.rows) == 4 and all(r.status == "ok" for r in done.rows)


def test_a_model_that_cannot_be_built_fails_its_cells_and_the_sweep_goes_on(tmp_path, monkeypatch):
    real = gpuopt.run.sweeps.workload

    def broken(name, **kw):
        if name == "tiny-cnn":
            raise RuntimeError("CUDA out of memory while building")
        return real(name, **kw)

    monkeypatch.setattr(gpuopt.run.sweeps, "workload", broken)
    res = sweep(_spec(models=["tiny-cnn", "tiny-transformer"]), tmp_path, progress=False)
    failed = [r for r in res.rows if r.model == "tiny-cnn"]
    assert len(failed) == 4 and all(r.status == "failed" for r in failed)
    assert all("building the model failed: RuntimeError: CUDA out of memory while building" in r.error for r in failed)
    measured = [r for r in res.rows if r.model == "tiny-transformer"]
    assert len(measured) == 4 and all(r.status == "ok" for r in measured)
    assert len((tmp_path / "cells.jsonl").read_text().splitlines()) == 8


def test_a_sweep_rejects_a_model_listed_twice_before_running(tmp_path):
    spec = _spec(models=["tiny-cnn", {"name": "tiny-cnn", "input_shape": [3, 16, 16]}])
    with pytest.raises(ValueError, match="model 'tiny-cnn' is listed twice in models"):
        sweep(spec, tmp_path, progress=False)
    assert not (tmp_path / "cells.jsonl").exists()


def test_a_sweep_needing_a_missing_package_fails_before_running(tmp_path, monkeypatch):
    real = gpuopt.run.sweeps.importlib.util.find_spec
    monkeypatch.setattr(gpuopt.run.sweeps.importlib.util, "find_spec",
                        lambda name, *a: None if name == "transformers" else real(name, *a))
    with pytest.raises(ImportError, match="model 'bert-base' needs transformers: pip install transformers"):
        sweep(_spec(models=["tiny-cnn", "bert-base"]), tmp_path, progress=False)
    assert not (tmp_path / "cells.jsonl").exists()


def _as_version_1(row: Row, canonical: str) -> dict:
    """A row as gpuopt 0.1 wrote it: the canonical config string in "config", the label beside it."""
    d = row.to_dict()
    d["config_label"] = d["config"]
    d["config"] = canonical
    return d


def test_a_sweep_resumes_from_version_1_cells_and_a_line_a_crash_cut_short(tmp_path, monkeypatch):
    first = sweep(_spec(), tmp_path / "new", progress=False)
    old = [json.dumps(_as_version_1(r, r.config)) for r in first.rows[:2]]
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "sweep.json").write_text((tmp_path / "new" / "sweep.json").read_text())  # same sweep
    (tmp_path / "old" / "cells.jsonl").write_text("\n".join(old) + "\n" + old[0][:40])  # cut short by a crash
    ran = []
    real = gpuopt.run.runner.measure
    monkeypatch.setattr(gpuopt.run.runner, "measure", lambda fn, **kw: ran.append(kw["label"]) or real(fn, **kw))
    res = sweep(_spec(), tmp_path / "old", progress=False)
    assert len(ran) == 2 and len(res.rows) == 4  # only the two cells not in the old file ran
    assert [r.to_dict() for r in res.rows[:2]] == [r.to_dict() for r in first.rows[:2]]
    lines = (tmp_path / "old" / "cells.jsonl").read_text().splitlines()
    assert len(lines) == 5 and lines[2] == old[0][:40]  # the cut line stays, ended; new rows on their own lines
    assert [r.key for r in Results.load(tmp_path / "old" / "cells.jsonl").rows] == [r.key for r in res.rows]


def test_version_1_documents_are_read(np_rng, tmp_path):
    named = Row.measured(Measurement.from_samples(np_rng.lognormal(0, 0.05, 60).tolist()), model="m",
                         config="fast", batch_size=2, mode="host", precision="fp16-amp")
    base = _cell("m", "fp32", np_rng.lognormal(0, 0.05, 60), batch=2, mode="host")
    doc = {"schema_version": 1, "env": {}, "rows": [_as_version_1(base, "fp32"),
                                                    _as_version_1(named, "fp16-amp+channels_last")]}
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(doc))
    res = Results.load(path)
    assert res.configs() == ["fp32", "fast"]  # the label is the config
    assert res.find("m", "fast", 2, "host").measurement == named.measurement
    assert [x["config"] for x in res.speedups()] == ["fast"] and "| fast |" in res.to_markdown()
    res.save(tmp_path / "again", plots=False)
    assert json.loads((tmp_path / "again" / "results.json").read_text())["rows"][1]["config"] == "fast"
    doc["schema_version"] = 2  # a version 2 document has no config_label
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="row 1 has unknown field\\(s\\) config_label"):
        Results.load(path)


def test_the_committed_h100_results_of_gpuopt_0_1_are_read():
    doc = json.loads(V1_RESULTS.read_text())
    assert doc["schema_version"] == 1
    res = Results.load(V1_RESULTS)
    assert len(res.rows) == len(doc["rows"]) == 40 and not res.failed
    for d in doc["rows"]:
        row = res.find(d["model"], d["config_label"], d["batch_size"], d["mode"])
        assert row.throughput_items_per_s == d["throughput_items_per_s"]
        assert row.measurement.samples_ms == d["measurement"]["samples_ms"]
    assert "### Speedup over fp32" in res.to_markdown()


def test_sweep_specs_from_toml_and_yaml(tmp_path):
    toml = tmp_path / "spec.toml"
    toml.write_text('models = ["tiny-cnn"]\nconfigs = ["fp32"]\nbatch_sizes = [1]\nmodes = ["latency"]\n'
                    'device = "cpu"\nmeasure = { max_time_s = 0.2, min_time_s = 0.01 }\n')
    assert len(sweep(toml, tmp_path / "a", progress=False).rows) == 1
    yaml = pytest.importorskip("yaml")
    y = tmp_path / "spec.yaml"
    y.write_text(yaml.safe_dump(_spec(configs=["fp32"], batch_sizes=[1])))
    assert len(sweep(y, tmp_path / "b", progress=False).rows) == 1


@pytest.mark.parametrize(
    "spec, match",
    [
        ({"models": ["tiny-cnn"], "batchsizes": [1]}, "unknown sweep spec key\\(s\\) 'batchsizes'"),
        ({"configs": ["fp32"]}, "needs models"),
        ({"models": [{"nme": "tiny-cnn"}]}, "a model table takes keys"),
        ({"models": ["tiny-cnn"], "parity": "no"}, "parity must be true or false"),
    ],
)
def test_bad_sweep_specs_name_the_problem(tmp_path, spec, match):
    with pytest.raises(ValueError, match=match):
        sweep(spec, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()  # refused before anything ran or was written


def test_an_unknown_model_late_in_a_sweep_is_refused_before_the_first_runs(tmp_path, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("a cell ran")

    monkeypatch.setattr(gpuopt.run.runner, "measure", never)
    with pytest.raises(ValueError, match="unknown model 'resnet5'"):
        sweep(_spec(models=["tiny-cnn", "resnet5"]), tmp_path / "out", progress=False)
    with pytest.raises(ValueError, match="input_shape must be a non-empty sequence"):
        sweep(_spec(models=[{"name": "tiny-cnn", "input_shape": [0]}]), tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_load_rejects_corrupt_and_foreign_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="is not valid JSON"):
        Results.load(bad)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"rows": [], "schema_version": 99}))
    with pytest.raises(ValueError, match=r"schema_version 99 is not one this gpuopt reads \(1 to 2\)"):
        Results.load(other)
    with pytest.raises(ValueError, match="cannot read results file"):
        Results.load(tmp_path / "missing.json")


# ---- pretrained weights, loaded through the libraries' own loaders (nothing is downloaded here) ----

def test_a_hugging_face_model_saved_to_a_folder_is_benchmarked_with_its_weights(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=40)
    saved = transformers.BertModel(cfg).eval()
    saved.save_pretrained(tmp_path / "tiny-bert")
    folder = str(tmp_path / "tiny-bert")
    for name in (f"hf:{folder}", folder):  # with or without the prefix
        model, make_inputs = gpuopt.zoo.get(name)
        for k, v in saved.state_dict().items():
            assert torch.equal(model.state_dict()[k], v), k
        x = make_inputs(3)
        assert set(x) == {"input_ids", "attention_mask"}
        assert x["input_ids"].shape == (3, 40) and int(x["input_ids"].min()) >= 0 and int(x["input_ids"].max()) < 97
    res = benchmark(f"hf:{folder}", configs=["fp32", "fp32+torchscript"], batch_sizes=[2], modes=["latency"],
                    device="cpu", **FAST)
    assert not res.failed and res.models() == [f"hf:{folder}"]
    assert {r.config for r in res.rows} == {"fp32", "fp32+torchscript"} and res.rows[0].item_unit == "sequences"


def test_a_hugging_face_model_that_cannot_load_names_the_id_and_the_way_out(tmp_path):
    pytest.importorskip("transformers")
    with pytest.raises(ValueError, match=f"cannot load Hugging Face model '{tmp_path}/missing'.*offline, only a "
                                         "model downloaded before .* loads; or benchmark a zoo name for random"):
        benchmark(f"hf:{tmp_path}/missing", device="cpu", **FAST)


def test_torchvision_weights_names_are_checked_and_loaded_through_torchvision(monkeypatch):
    tv = pytest.importorskip("torchvision")
    with pytest.raises(ValueError, match="unknown weights 'IMAGENET9K' for torchvision model 'resnet18'; allowed: "
                                         "IMAGENET1K_V1, DEFAULT"):
        gpuopt.zoo.spec("resnet18:IMAGENET9K")
    with pytest.raises(ValueError, match="unknown torchvision model 'resnet81' in 'resnet81:DEFAULT' \\(did you "
                                         "mean 'resnet18'"):
        gpuopt.zoo.spec("resnet81:DEFAULT")
    with pytest.raises(ValueError, match="pretrained weights: hf:<Hugging Face id or folder>, <torchvision model>"):
        gpuopt.zoo.spec("resnet-fifty")
    # The weights torchvision would download, replaced by a seeded model's (no network in tests).
    torch.manual_seed(3)
    trained = tv.models.resnet18(weights=None).state_dict()
    monkeypatch.setattr(tv.models.ResNet18_Weights, "get_state_dict", lambda self, *a, **k: trained)
    model, make_inputs = gpuopt.zoo.get("resnet18:IMAGENET1K_V1")
    for k, v in trained.items():
        assert torch.equal(model.state_dict()[k], v), k
    assert make_inputs(2).shape == (2, 3, 224, 224) and not model.training

    def offline(self, *args, **kwargs):
        import urllib.error

        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(tv.models.ResNet18_Weights, "get_state_dict", offline)
    with pytest.raises(ValueError, match="cannot load torchvision weights resnet18:IMAGENET1K_V1 .*Temporary failure"
                                         ".*connect to the network once, or benchmark 'resnet18' for random weights"):
        gpuopt.zoo.get("resnet18:DEFAULT")
