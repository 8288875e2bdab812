"""The sweep spec's ``serve:`` section on the CPU: serving cells appended to cells.jsonl beside the
measured cells, a failing cell recorded with its reason, resume by fingerprint, entries checked
before anything runs (CI)."""

from __future__ import annotations

import json

import pytest

import gpuopt
from gpuopt import Results, sweep

LOAD = {"min_queries": 500, "duration_s": 0.0, "samples": 8, "max_batch_size": 8}


def _spec(serve, **kw):
    return {"serve": serve, "device": "cpu", **kw}


def test_serve_cells_expand_lists_record_failures_and_resume(tmp_path, monkeypatch):
    spec = _spec([
        {"model": "tiny-cnn", "batcher": ["gpuopt", "naive"], "rate": [500, 1000], "slo_ms": 1000, **LOAD},
        {"model": "tiny-cnn", "config": "fp32+cudagraph", "rate": 100, **LOAD},  # no CUDA here: fails
        {"model": "tiny-cnn", "scenario": "closed-loop", "concurrency": 2, "max_queue_delay_us": [0, 500], **LOAD},
    ])
    res = sweep(spec, tmp_path, progress=False)
    assert [(r.config, r.mode, r.status) for r in res.rows] == [
        ("fp32", "serve:server @500/s", "ok"), ("fp32", "serve:server @1000/s", "ok"),
        ("fp32", "serve:server @500/s naive", "ok"), ("fp32", "serve:server @1000/s naive", "ok"),
        ("fp32+cudagraph", "serve:server @100/s", "failed"),
        ("fp32", "serve:closed-loop @2 clients max_queue_delay_us=0", "ok"),
        ("fp32", "serve:closed-loop @2 clients max_queue_delay_us=500", "ok"),
    ]
    failed = res.rows[4]
    assert "could not be prepared" in failed.error and "needs a CUDA device" in failed.error
    assert failed.item_unit == "requests" and failed.batch_size == 8
    assert [r.serving["settings"]["max_queue_delay_us"] for r in res.rows[5:]] == [0, 500]
    assert res.rows[2].serving["settings"]["path"] == "naive-python"
    assert all(r.serving["load"]["slo_ms"] == 1000 for r in res.rows[:4])
    assert len((tmp_path / "cells.jsonl").read_text().splitlines()) == 7
    assert "## Serving" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "tiny-cnn-latency-rate.png").exists()
    fingerprint = json.loads((tmp_path / "sweep.json").read_text())["fingerprint"]
    assert len(fingerprint["serve"]) == 7 and fingerprint["serve"][0]["load"]["rate"] == 500

    # Resumed: every cell is in cells.jsonl, the failed one included; nothing runs again.
    def never(*args, **kwargs):
        raise AssertionError("a serving cell ran")

    monkeypatch.setattr(gpuopt.serving.cells, "serve", never)
    again = sweep(spec, tmp_path, progress=False)
    assert [r.key for r in again.rows] == [r.key for r in res.rows]
    # Another serve section into the same folder: refused, naming the difference.
    other = _spec([{**spec["serve"][0], "slo_ms": 500}, *spec["serve"][1:]])
    with pytest.raises(ValueError, match="holds 7 cells of a different sweep.*serve: "):
        sweep(other, tmp_path, progress=False)


def test_a_sweep_of_models_and_serve_cells_resumes_the_cells_it_lacks(tmp_path, capsys):
    spec = _spec([{"model": "tiny-cnn", "scenario": "offline", **LOAD}], models=["tiny-cnn"], configs=["fp32"],
                 batch_sizes=[2], modes=["latency"], measure={"max_time_s": 0.1, "min_time_s": 0.01, "warmup_s": 0.0})
    sweep(spec, tmp_path, progress=False)
    lines = (tmp_path / "cells.jsonl").read_text().splitlines()
    assert [json.loads(line)["mode"] for line in lines] == ["host", "serve:offline"]
    (tmp_path / "cells.jsonl").write_text(lines[0] + "\n")  # as if stopped before the serving cell
    res = sweep(spec, tmp_path, progress=True)
    err = capsys.readouterr().err
    assert "resumed: 1 of 2 cells already measured" in err and "[1/1] tiny-cnn fp32 serve:offline" in err
    assert [r.mode for r in res.rows] == ["host", "serve:offline"]
    md = Results.load(tmp_path / "results.json").to_markdown()
    assert "### Latency" in md and "## Serving" in md


@pytest.mark.parametrize(
    "serve, error, match",
    [
        ([{"model": "tiny-cnn", "rat": 100}], ValueError, "serve: entry 1: unknown key\\(s\\) 'rat'; allowed: "),
        ([{"rate": 100}], ValueError, "serve: entry 1: a serve entry is a table with a model"),
        ("tiny-cnn", ValueError, "serve is a list of tables"),
        ([{"model": "resnet5", "rate": 100}], ValueError, "serve: entry 1: unknown model 'resnet5'"),
        ([{"model": "tiny-cnn", "rate": 100, "batcher": "fast"}], ValueError,
         "batcher must be one of 'gpuopt', 'naive'"),
        ([{"model": "tiny-cnn"}], ValueError, "serve: entry 1: the server scenario needs rate"),
        ([{"model": "tiny-cnn", "rate": [100, 100]}], ValueError,
         "rate must be a value or a non-empty list of distinct"),
        ([{"model": "tiny-cnn", "rate": 100, "max_batch_size": 0}], ValueError, "max_batch_size must be"),
        ([{"model": "tiny-cnn", "rate": 100, "config": "fp99"}], ValueError, "unknown config token 'fp99'"),
        ([{"model": "tiny-cnn", "rate": 100}, {"model": "tiny-cnn", "rate": 100, "instances": 1}], ValueError,
         "two cells of the sweep would both be the row \\('tiny-cnn', 'fp32', 32, 'serve:server @100/s'\\) "
         "\\(cells 1 and 2 of its sections\\); give them distinct labels"),
    ],
)
def test_bad_serve_entries_are_refused_before_anything_runs(serve, error, match, tmp_path, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("a serving cell ran")

    monkeypatch.setattr(gpuopt.serving.cells, "serve", never)
    with pytest.raises(error, match=match):
        sweep(_spec(serve), tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_labels_tell_apart_cells_at_the_same_point(tmp_path):
    plan = gpuopt.run.sweeps.plan_sweep(_spec([{"model": "tiny-cnn", "rate": 100, "label": "two"},
                                               {"model": "tiny-cnn", "rate": 100, "instances": 1, "label": "one"}]),
                                        tmp_path, progress=False)
    assert [c.key[3] for c in plan.section_cells] == ["serve:server @100/s two", "serve:server @100/s one"]
    assert plan.total_cells == 2 and plan.models == []
    with pytest.raises(ValueError, match="needs models"):
        sweep({"serve": [], "device": "cpu"}, tmp_path / "x", progress=False)
