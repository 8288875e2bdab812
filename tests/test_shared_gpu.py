"""Several processes on one device (gpuopt.dist.shared_gpu): the MPS daemon's wiring with a fake
nvidia-cuda-mps-control on PATH, the choice and its reason, bad input, and two processes on the CPU end to
end (torchrun, gloo) in both works. The same on a GPU, with MPS where the driver has it, is in
test_shared_gpu_gpu at the end (marked)."""

from __future__ import annotations

import json
import os
import stat

import pytest
import torch

from gpuopt.dist import MpsDaemon, shared_gpu
from gpuopt.dist.shared import MPS_CONTROL, _mps

# The fake control program: records each call (its arguments, the MPS folders in its environment, what
# came on stdin for a call without arguments) as one JSON line; FAKE_MPS_FAIL=1 makes `-d` fail.
_FAKE = """#!/usr/bin/env python3
import json, os, sys
stdin = "" if sys.argv[1:] else sys.stdin.read()
with open(os.environ["FAKE_MPS_LOG"], "a") as f:
    f.write(json.dumps({"args": sys.argv[1:], "pipe": os.environ.get("CUDA_MPS_PIPE_DIRECTORY"),
                        "log": os.environ.get("CUDA_MPS_LOG_DIRECTORY"), "stdin": stdin}) + "\\n")
if sys.argv[1:] == ["-d"] and os.environ.get("FAKE_MPS_FAIL"):
    print("An instance of this daemon is already running", file=sys.stderr)
    sys.exit(1)
"""


@pytest.fixture
def fake_mps(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / MPS_CONTROL
    script.write_text(_FAKE)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_MPS_LOG", str(log))
    return lambda: [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_mps_daemon_starts_with_its_own_folders_and_quits(fake_mps, tmp_path):
    root = tmp_path / "mps"
    with MpsDaemon(root) as daemon:
        assert daemon.env == {"CUDA_MPS_PIPE_DIRECTORY": str(root / "pipe"),
                              "CUDA_MPS_LOG_DIRECTORY": str(root / "log")}
        assert (root / "pipe").is_dir() and (root / "log").is_dir()
        assert [c["args"] for c in fake_mps()] == [["-d"]]
    calls = fake_mps()
    assert [c["args"] for c in calls] == [["-d"], []]
    assert calls[1]["stdin"].strip() == "quit"
    assert all(c["pipe"] == str(root / "pipe") and c["log"] == str(root / "log") for c in calls)


def test_mps_daemon_quits_when_the_run_fails_and_a_failed_start_is_named(fake_mps, tmp_path, monkeypatch):
    with pytest.raises(KeyError), MpsDaemon(tmp_path / "a"):
        raise KeyError("the run failed")
    assert [c["args"] for c in fake_mps()] == [["-d"], []]
    monkeypatch.setenv("FAKE_MPS_FAIL", "1")
    with pytest.raises(RuntimeError, match=r"-d failed \(exit code 1\): An instance of this daemon is already"):
        MpsDaemon(tmp_path / "b").start()


def test_without_the_control_program_mps_is_off_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    daemon, reason = _mps("auto", torch.device("cuda", 0), tmp_path)
    assert daemon is None and f"{MPS_CONTROL} is not on PATH" in reason
    with pytest.raises(FileNotFoundError, match="mps=True"):
        _mps(True, torch.device("cuda", 0), tmp_path)
    with pytest.raises(FileNotFoundError, match="not on PATH"):
        MpsDaemon(tmp_path)
    assert _mps("auto", torch.device("cpu"), tmp_path) == (None, "the processes run on the CPU")
    assert _mps(False, torch.device("cuda", 0), tmp_path) == (None, "mps=False")
    with pytest.raises(ValueError, match="mps=True needs a CUDA device"):
        _mps(True, torch.device("cpu"), tmp_path)


def test_with_the_control_program_a_gpu_run_gets_a_daemon(fake_mps, tmp_path):
    daemon, reason = _mps("auto", torch.device("cuda", 0), tmp_path)
    assert isinstance(daemon, MpsDaemon) and "MPS daemon" in reason
    assert daemon.env["CUDA_MPS_PIPE_DIRECTORY"].startswith(str(tmp_path))


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"processes": 0}, ValueError, "processes must be an integer >= 1, got 0"),
    ({"work": "train"}, ValueError, "work must be one of 'benchmark', 'serve', got 'train'"),
    ({"iters": 1.5}, TypeError, "iters must be an integer"),
    ({"mps": "yes"}, ValueError, "mps must be 'auto', True or False"),
    ({"device": "cuda:7"}, ValueError, "device 'cuda:7'"),
])
def test_bad_input_is_refused_before_any_process_starts(kwargs, error, match, monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(error, match=match):
        shared_gpu("tiny-cnn", **{"device": "cpu", **kwargs})
    with pytest.raises(TypeError, match="zoo name"):
        shared_gpu(torch.nn.Linear(2, 2), device="cpu")


def _check_rows(r, processes: int, mode: str):
    modes = [row.mode for row in r.rows]
    assert modes[1:] == [*(f"{mode} @rank{i}/{processes}" for i in range(processes)), f"{mode} @{processes} ranks"]
    assert modes[0].endswith(" @1 rank")  # serving alone: N times the clients, so its own load point
    assert all(row.ok for row in r.rows), [row.error for row in r.rows]
    single, *each, agg = r.rows
    assert all(row.dist["processes"] == processes and row.dist["mps"] is False for row in r.rows)
    assert agg.dist["mps_reason"] == "the processes run on the CPU"
    assert agg.throughput_items_per_s == pytest.approx(sum(row.throughput_items_per_s for row in each))
    assert agg.dist["vs_one_process"] == pytest.approx(agg.throughput_items_per_s / single.throughput_items_per_s)
    assert len(agg.dist["p99_ms_per_process"]) == processes and agg.dist["p99_ms_one_process"] > 0
    assert r.spec["shared_gpu"]["processes"] == processes and r.spec["shared_gpu"]["mps"] is False
    return single, each, agg


def test_two_processes_benchmarking_on_the_cpu_against_one(tmp_path):
    r = shared_gpu("tiny-cnn", processes=2, device="cpu", batch_size=4, iters=12, output_dir=str(tmp_path),
                   progress=False, max_time_s=5)
    mode = r.rows[1].dist["mode"]
    assert mode in ("throughput", "host")  # throughput mode on the CPU is host time
    single, each, agg = _check_rows(r, 2, mode)
    assert single.measurement.n == 24 and [row.measurement.n for row in each] == [12, 12]  # same total work
    assert agg.measurement.n == 24  # the pooled samples of both processes
    assert (tmp_path / "results.json").exists()


def test_two_processes_serving_on_the_cpu_against_one(tmp_path):
    r = shared_gpu("tiny-cnn", processes=2, work="serve", device="cpu", batch_size=4, queries=60, concurrency=4,
                   progress=False)
    mode = r.rows[1].dist["mode"]
    assert mode.startswith("serve:")
    single, each, agg = _check_rows(r, 2, mode)
    assert single.mode == "serve:closed-loop @8 clients @1 rank"
    assert single.serving["counts"]["ok"] >= 120 and all(row.serving["counts"]["ok"] >= 60 for row in each)
    assert agg.measurement.n == sum(row.serving["counts"]["ok"] for row in each)  # every request's latency


@pytest.mark.gpuopt_gpu
@pytest.mark.parametrize("work", ["benchmark", "serve"])
def test_shared_gpu_gpu(work, tmp_path):
    """Two processes on cuda:0 (MPS when the driver's control program is on PATH)."""
    r = shared_gpu("resnet18", "fp16-amp+channels_last", processes=2, work=work, device="cuda:0", batch_size=32,
                   iters=50, queries=500, output_dir=str(tmp_path), progress=False)
    agg = r.rows[-1]
    assert all(row.ok for row in r.rows), [row.error for row in r.rows]
    assert agg.dist["vs_one_process"] > 0 and agg.dist["mps"] == r.spec["shared_gpu"]["mps"]
    assert isinstance(agg.dist["mps_reason"], str) and agg.dist["mps_reason"]
