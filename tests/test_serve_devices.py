"""Serving over several GPUs, the parts that run on the CPU: devices= checked (against device=, the
GPUs visible, the CPU), the executors' devices, per-device stats and their place in results and the
report. The two-GPU path itself is in test_serve_gpu.py."""

from __future__ import annotations

import pytest
import torch

from gpuopt import _C
from gpuopt._checks import cuda_indices
from gpuopt.cli import main
from gpuopt.report.markdown import _busy
from gpuopt.serving import LoadSpec, Server, ServeResult, serve


def _model():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def test_devices_and_device_together_are_refused():
    with pytest.raises(ValueError, match=r"device= \(one device\) or devices= .*not both.*device='cpu'"):
        Server(_model(), "fp32", torch.randn(8), device="cpu", devices=[0, 1])


def test_devices_without_a_gpu_name_the_value_and_the_cpu_alternative(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"devices=\[0, 1\] spreads the server over GPUs and none is visible"):
        Server(_model(), "fp32", torch.randn(8), devices=[0, 1])
    with pytest.raises(ValueError, match="applies to batcher='gpuopt'"):
        serve(_model(), "fp32", lambda i: torch.randn(8), scenario="offline", batcher="naive", devices=[0, 1])


def test_cuda_indices_against_the_gpus_visible(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert cuda_indices("devices", "all") == [0, 1]
    assert cuda_indices("devices", 2) == [0, 1]
    assert cuda_indices("devices", [1, 0]) == [1, 0]
    with pytest.raises(ValueError, match=r"devices=3 asks for 3 GPUs; 2 visible \(cuda:0 to cuda:1\)"):
        cuda_indices("devices", 3)
    with pytest.raises(ValueError, match=r"devices=\[0, 5\] names GPU\(s\) \[5\]; 2 visible"):
        cuda_indices("devices", [0, 5])
    with pytest.raises(ValueError, match=r"list of distinct GPU indices, got \[0, 0\]"):
        cuda_indices("devices", [0, 0])
    with pytest.raises(ValueError, match="devices must be 'all'"):
        cuda_indices("devices", "most")
    with pytest.raises(TypeError, match="devices must be 'all'"):
        cuda_indices("devices", 1.5)
    with pytest.raises(ValueError, match="at least 1, got 0"):
        cuda_indices("devices", 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(ValueError, match="devices='all' asks for GPUs; none visible"):
        cuda_indices("devices", "all")


def test_executor_devices_interleave_instances_per_device():
    assert _C.executor_devices([0, 1], 2) == [0, 1, 0, 1]
    assert _C.executor_devices([1], 3) == [1, 1, 1]
    with pytest.raises(ValueError, match="distinct, got 1 twice"):
        _C.executor_devices([1, 1], 1)
    with pytest.raises(ValueError, match="instances must be >= 1 per device, got 0"):
        _C.executor_devices([0], 0)


def test_a_cpu_server_refuses_executor_devices():
    """The C++ server itself: executor devices are CUDA devices, never given to a CPU server."""
    from gpuopt.memory.pools import PinnedPool
    from gpuopt.serving.server import batcher_options

    o = batcher_options(max_batch_size=4, max_queue_delay_us=0, preferred_batch_sizes=None, buckets=None,
                        max_queue_size=0, priority_levels=1, timeout_ms=None, timeout_action="reject")
    with pytest.raises(ValueError, match=r"executor devices are CUDA devices; a CPU server \(device -1\)"):
        _C.Server(batcher=o, device=-1, inputs=[(torch.float32, [8], "contiguous")], instances=2,
                  fn=lambda x: x, pinned_pool=PinnedPool(name="t")._native, devices=[0, 1])


def test_one_device_stats_have_per_device_figures_matching_the_totals(rng):
    with Server(_model(), "fp32", torch.randn(8), device="cpu", instances=2, max_batch_size=4) as s:
        s.add_samples([torch.randn(8, generator=rng) for _ in range(8)])
        r = s.run_load(LoadSpec(scenario="closed-loop", concurrency=4, min_queries=200, duration_s=0.0))
        st = s.stats()
    assert st["devices"] == [-1]
    assert st["batches_per_device"] == [st["batches"]] and st["batches"] > 0
    assert len(st["busy_s_per_device"]) == 1 and st["busy_s_per_device"][0] == pytest.approx(st["busy_s"], rel=1e-6)
    assert len(r.result["batches_per_device"]) == 1 and 0 < r.result["batches_per_device"][0] <= st["batches"]
    assert 0 < r.result["busy_s_per_device"][0] <= r.result["wall_s"]
    assert r.gpu_busy_per_device is None and r.serving()["gpu_busy_per_device"] is None  # one device: no split
    assert s.describe()["devices"] == ["cpu"]


def _two_gpu_result() -> ServeResult:
    result = {"scenario": "offline", "issued": 10, "ok": 10, "failed": 0, "rejected": 0, "timed_out": 0,
              "cancelled": 0, "lost": 0, "duplicated": 0, "unknown": 0, "duration_s": 2.0, "issue_span_s": 0.0,
              "target_rate": 0.0, "scheduled_rate": 0.0, "throughput": 5.0,
              "latency_ms": {k: 1.0 for k in ("n", "mean", "p50", "p90", "p95", "p99", "p99.9", "max")},
              "queue_ms": {"p50": 0.5}, "compute_ms": {"p50": 0.5}, "issue_lag_p99_ms": 0.0,
              "early_stop": {"percentile": 0.99, "queries": 10, "min_queries": 0, "enough": True, "order": 1,
                             "estimate_ms": 1.0, "confidence": 0.99},
              "valid": True, "invalid_reasons": [], "batch_size_counts": [], "errors": [],
              "busy_s": 1.8, "busy_s_per_device": [1.6, 0.8], "batches_per_device": [30, 14], "wall_s": 2.0}
    settings = {"path": "cuda-graph", "max_batch_size": 8, "max_queue_delay_us": 0, "instances": 2,
                "device": "cuda:0", "devices": ["cuda:0", "cuda:1"]}
    return ServeResult(model="m", config="fp16", load=LoadSpec(scenario="offline"), settings=settings, result=result)


def test_per_gpu_busy_fractions_reach_the_row_the_summary_and_the_report():
    r = _two_gpu_result()
    assert r.gpu_busy_per_device == {"cuda:0": pytest.approx(0.8), "cuda:1": pytest.approx(0.4)}
    assert r.batches_per_device == {"cuda:0": 30, "cuda:1": 14}
    assert "cuda:0 80%, 30 batches, cuda:1 40%, 14 batches" in r.summary()
    row = r.row()
    assert row.serving["gpu_busy_per_device"] == r.gpu_busy_per_device
    assert row.serving["batches_per_device"] == {"cuda:0": 30, "cuda:1": 14}
    assert _busy(row.serving) == "any GPU 90% (cuda:0 80%, cuda:1 40%)"
    assert _busy({"gpu_busy": 0.5}) == "50%" and _busy({}) == "-"


@pytest.mark.parametrize(("args", "message"), [
    (["--gpus", "2", "--device", "cpu"], "--gpus serves on several GPUs and --device names one"),
    (["--gpus", "2", "--batcher", "naive"], "--gpus applies to --batcher gpuopt"),
])
def test_serve_gpus_usage_errors_exit_2(args, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["serve", "tiny-cnn", *args])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_serve_gpus_without_a_gpu_is_a_usage_error(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exc:
        main(["serve", "tiny-cnn", "--gpus", "2"])
    assert exc.value.code == 2
    assert "--gpus 2 serves on GPUs and none is visible" in capsys.readouterr().err
