"""`gpuopt llm` on the CPU: a real run of a tiny model writing results like `gpuopt bench`, a failed cell
as exit 1 with the results written, --list-models, and usage errors before anything runs (CI)."""

from __future__ import annotations

import csv
import json

import pytest
import torch

pytest.importorskip("transformers")

import gpuopt  # noqa: E402
from gpuopt import Results  # noqa: E402
from gpuopt.cli import main  # noqa: E402
from gpuopt.llm import api  # noqa: E402

# Small cells: 8 prompt tokens, 4 new, at least 3 whole requests in 0.2 s.
QUICK = ["tiny-gpt2", "--device", "cpu", "--precisions", "fp32", "--prompt", "8", "--new-tokens", "4",
         "--max-time-s", "0.2", "--parity-tokens", "4"]


def test_a_run_prints_a_line_per_cell_and_a_table_and_writes_results(tmp_path, capsys):
    code = main(["llm", *QUICK, "--paths", "static", "--batch-sizes", "1,2", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    # a line per cell as it goes, then the table, then where the results are
    assert out.count("tiny-gpt2 fp32+static bs1 p8+n4: TTFT p50 ") == 1
    assert out.count("tiny-gpt2 fp32+static bs2 p8+n4: TTFT p50 ") == 1
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("model "))
    assert lines[head].split()[:6] == ["model", "config", "batch", "prompt+new", "TTFT", "p50"]
    assert [line.split()[:4] for line in lines[head + 2:head + 4]] == [["tiny-gpt2", "fp32+static", "1", "8+4"],
                                                                       ["tiny-gpt2", "fp32+static", "2", "8+4"]]
    assert f"results: {tmp_path}/ (results.json, results.csv, report.md, plots)" in out
    res = Results.load(tmp_path / "results.json")
    assert [(r.batch_size, r.mode, r.config) for r in res.rows] == [(1, "llm:p8+n4", "fp32+static"),
                                                                    (2, "llm:p8+n4", "fp32+static")]
    assert all(r.ok and r.item_unit == "tokens" and r.device == "cpu" for r in res.rows)
    assert all(r.llm["parity"]["passed"] and r.llm["parity"]["teacher_forced"] for r in res.rows)
    assert res.spec["kind"] == "llm" and res.spec["parity_tokens"] == 4
    assert "## LLM decode" in (tmp_path / "report.md").read_text()
    lines = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert [float(line["tpot_p50_ms"]) for line in lines] == pytest.approx(
        [r.llm["tpot_ms"]["p50"] for r in res.rows])
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (tmp_path / "llm-tokens-vs-batch.png").exists() and (tmp_path / "llm-tpot-vs-context.png").exists()
    assert not (tmp_path / "tiny-gpt2-throughput.png").exists()


def test_a_failed_cell_is_exit_1_with_its_reason_and_the_results_written(tmp_path, monkeypatch, capsys):
    real = api.measure_decode

    def flaky(models, **kw):
        if kw["batch_size"] == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 40.00 GiB")
        return real(models, **kw)

    monkeypatch.setattr(api, "measure_decode", flaky)
    code = main(["llm", *QUICK, "--paths", "static", "--batch-sizes", "1,2", "--no-parity", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1
    assert "tiny-gpt2 fp32+static bs2 p8+n4: out of memory: CUDA out of memory" in out  # as it goes
    assert "failed (below)" in out and "failed cells:" in out
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [r["status"] for r in rows] == ["ok", "failed"] and rows[0]["llm"]["parity"] is None
    report = (tmp_path / "report.md").read_text()
    assert "| failed: out of memory: CUDA out of memory. Tried to allocate 40.00 GiB |" in report


def test_cpu_defaults_are_the_generate_and_static_paths(tmp_path, monkeypatch, capsys):
    seen = {}

    def record(models, **kw):
        seen.update(kw, models=models)
        return Results()

    monkeypatch.setattr(gpuopt.llm, "decode_sweep", record)
    assert main(["llm", "tiny-opt", "tiny-llama", "--device", "cpu", "--out", str(tmp_path)]) == 0
    assert seen["models"] == ["tiny-opt", "tiny-llama"] and seen["paths"] == ["hf-generate", "static"]
    assert seen["precisions"] == ["fp16"] and seen["batch_sizes"] == [1, 8, 32]
    assert seen["prompt_lens"] == [128] and seen["new_tokens"] == [128] and seen["parity"] is True
    assert seen["parity_tokens"] == 32 and seen["seed"] == 0 and "max_time_s" not in seen
    assert main(["llm", "tiny-opt", "--device", "cpu", "--prompt", "16,32", "--no-parity", "--seed", "7",
                 "--max-time-s", "2", "--output", str(tmp_path)]) == 0
    assert seen["prompt_lens"] == [16, 32] and seen["parity"] is False and seen["seed"] == 7
    assert seen["max_time_s"] == 2.0


def test_list_models_names_every_built_in_model_path_and_precision(capsys):
    assert main(["llm", "--list-models"]) == 0
    out = capsys.readouterr().out
    for name, what in gpuopt.llm.describe_models().items():
        assert name in out and what in out
    assert f"paths: {', '.join(gpuopt.llm.PATHS)}" in out
    assert f"precisions: {', '.join(gpuopt.llm.PRECISIONS)}" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["opt-13b"], "unknown model 'opt-13b'; built-in causal LMs: opt-125m, opt-1.3b"),
        ([], "give at least one MODEL (gpuopt llm --list-models lists them)"),
        (["tiny-gpt2", "--list-models"], "--list-models lists the built-in models: give no MODEL with it"),
        (["tiny-gpt2", "--paths", "vllm"], "path must be one of hf-generate, hf-static-compile, static"),
        (["tiny-gpt2", "--paths", "static-graph"], "path 'static-graph' replays CUDA graphs and needs a CUDA device"),
        (["tiny-gpt2", "--precisions", "int4"], "precision must be one of fp32, fp16, bf16, int8wo, got 'int4'"),
        (["tiny-gpt2", "--prompt", "200", "--new-tokens", "100"],
         "prompt_len + new_tokens = 200 + 100 = 300 exceeds tiny-gpt2's maximum positions (256)"),
        (["tiny-gpt2", "--batch-sizes", "1,1"], "batch_sizes must not repeat a value"),
        (["tiny-gpt2", "--batch-sizes", "0"], "argument --batch-sizes: expected comma-separated positive integers"),
        (["tiny-gpt2", "--prompt", "abc"], "argument --prompt: expected comma-separated positive integers"),
        (["tiny-gpt2", "--new-tokens", "-4"], "argument --new-tokens: expected comma-separated positive integers"),
        (["tiny-gpt2", "--max-time-s", "0"], "argument --max-time-s: must be a positive number, got '0'"),
        (["tiny-gpt2", "--parity-tokens", "0"], "argument --parity-tokens: must be a positive integer"),
        (["tiny-gpt2", "--device", "gpu"], "device must be 'cpu', 'cuda' or 'cuda:N', got 'gpu'"),
    ],
)
def test_bad_arguments_are_usage_errors_before_anything_runs(args, message, monkeypatch, capsys, tmp_path):
    def never(*a, **kw):
        raise AssertionError("a model was built")

    monkeypatch.setattr(api, "Models", never)
    monkeypatch.chdir(tmp_path)
    device = [] if "--device" in args else ["--device", "cpu"]
    with pytest.raises(SystemExit) as info:
        main(["llm", *args, *device, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert info.value.code == 2 and message in err, err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_an_out_path_that_is_a_file_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "taken").write_text("")
    with pytest.raises(SystemExit) as info:
        main(["llm", "tiny-gpt2", "--device", "cpu", "--out", str(tmp_path / "taken")])
    assert info.value.code == 2 and "exists and is not a folder" in capsys.readouterr().err
