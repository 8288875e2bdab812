"""The main job on the CPU: benchmark(), Results and its formats, sweeps and resume (CI)."""

from __future__ import annotations

import csv
import json

import pytest
import torch

import gpuopt
from gpuopt import Results, benchmark, sweep
from gpuopt.run.zoo import TinyCNN

FAST = {"max_time_s": 0.2, "min_time_s": 0.01, "warmup": 1, "warmup_s": 0.0, "progress": False}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    return benchmark("tiny-cnn", configs=["fp32", "bf16-amp", "fp32+torchscript"], batch_sizes=[1, 4],
                     modes=["latency", "end-to-end"], train=True, device="cpu", output_dir=str(out), **FAST), out


def test_every_cell_is_a_row(results):
    res, _ = results
    # on the CPU latency is host mode; torchscript is inference-only, so its train rows fail
    assert len(res.rows) == 3 * 2 * 3
    assert {r["mode"] for r in res.rows} == {"host", "end-to-end", "train"}
    failed = res.failed
    assert {(r["config"], r["mode"]) for r in failed} == {("fp32+torchscript", "train")}
    assert all("inference-only" in r["error"] for r in failed)
    for r in res.ok:
        assert r["latency_ms"]["p50"] > 0 and r["throughput_items_per_s"] > 0
        assert r["measurement"]["n"] > 0 and r["device"] == "cpu"
        if r["mode"] != "train":
            assert r["parity"]["passed"] and r["prepare_s"] is not None and r["first_call_ms"] > 0
        assert r["runner_overhead_s"] >= 0
        assert r["flops_per_item"] > 0 and r["bytes_per_item_min"] > 0


def test_files_are_written_and_read_back(results):
    res, out = results
    for name in ("results.json", "results.csv", "report.md", "tiny-cnn-throughput.png", "tiny-cnn-speedup.svg"):
        assert (out / name).exists(), name
    back = Results.load(out / "results.json")
    assert back.rows == json.loads(json.dumps(res.rows, default=str))
    assert back.env["torch"] == torch.__version__
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(res.rows) and rows[0]["model"] == "tiny-cnn"
    assert res.to_dataframe().shape[0] == len(res.rows)


def test_markdown_has_the_seeds_tables(results):
    res, _ = results
    md = res.to_markdown()
    for section in ("### Throughput (images/s", "### Latency (ms per batch", "### Speedup over fp32",
                    "### End to end", "### Training step", "## Failed cells", "## Environment"):
        assert section in md, section
    assert "| fp32+torchscript |" in md


def test_speedups_carry_intervals_and_verdicts(results):
    res, _ = results
    s = res.speedups()
    assert s and all(x["baseline"] == "fp32" for x in s)
    measured = [x for x in s if x.get("speedup") is not None]
    assert all(x["ci"][0] <= x["speedup"] <= x["ci"][1] for x in measured)
    assert {x["verdict"] for x in measured} <= {"faster", "slower", "no significant difference"}


def test_a_failing_config_is_recorded_and_the_rest_goes_on():
    res = benchmark(TinyCNN(), input_shape=(3, 32, 32), configs=["fp32", "fp32+cudagraph", "bf16"],
                    batch_sizes=[2], modes=["latency"], device="cpu", **FAST)
    by = {r["config"]: r for r in res.rows}
    assert by["fp32+cudagraph"]["status"] == "failed" and "needs a CUDA device" in by["fp32+cudagraph"]["error"]
    assert by["fp32"]["status"] == by["bf16"]["status"] == "ok"


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
    bad = next(r for r in res.rows if r["config"] == "fp16")
    assert bad["status"] == "failed" and bad["error"].startswith("parity failed")
    assert bad["measurement"] is None and bad["parity"]["passed"] is False


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
    assert [r["status"] for r in res.rows].count("failed") == 1
    assert next(r for r in res.rows if r["status"] == "failed")["error"].startswith("out of memory")


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
        ({"itres": 3}, TypeError, "unknown option"),
        ({"model_or_name": 42}, TypeError, "model must be a zoo name"),
        ({"parity": "yes"}, TypeError, "parity must be True or False"),
    ],
)
def test_bad_arguments_are_clear_errors(kwargs, exc, match):
    args = {"model_or_name": "tiny-cnn", "device": "cpu", "batch_sizes": [1], **FAST, **kwargs}
    with pytest.raises(exc, match=match):
        benchmark(args.pop("model_or_name"), **args)


def test_inputs_that_do_not_fit_name_the_model_and_the_shape():
    with pytest.raises(ValueError, match=r"Linear: inputs of shape \(2, 7\) \(batch 2\) do not fit the model"):
        benchmark(torch.nn.Linear(4, 2), input_shape=(7,), batch_sizes=[2], device="cpu", **FAST)
    with pytest.raises(ValueError, match="input_shape must be a non-empty sequence of positive ints"):
        benchmark(torch.nn.Linear(4, 2), input_shape=(0,), device="cpu", **FAST)
    with pytest.raises(ValueError, match="give at most one of inputs, input_shape, input_fn"):
        benchmark(torch.nn.Linear(4, 2), input_shape=(4,), inputs=torch.randn(2, 4), device="cpu", **FAST)


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
    assert len(lines) == len(res.rows) == 4 and all(r["status"] == "ok" for r in res.rows)
    assert (tmp_path / "results.json").exists() and (tmp_path / "report.md").exists()
    again = sweep(_spec(), tmp_path, progress=False)  # nothing left to run
    assert len((tmp_path / "cells.jsonl").read_text().splitlines()) == 4 and len(again.rows) == 4
    more = sweep(_spec(batch_sizes=[1, 2, 3]), tmp_path, progress=False)  # only the new cells run
    assert len((tmp_path / "cells.jsonl").read_text().splitlines()) == 6 and len(more.rows) == 6


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
    assert len(done.rows) == 4 and all(r["status"] == "ok" for r in done.rows)


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
        sweep(spec, tmp_path, progress=False)


def test_load_rejects_corrupt_and_foreign_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="is not valid JSON"):
        Results.load(bad)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"rows": [], "schema_version": 99}))
    with pytest.raises(ValueError, match="schema_version 99"):
        Results.load(other)
    with pytest.raises(ValueError, match="cannot read results file"):
        Results.load(tmp_path / "missing.json")
