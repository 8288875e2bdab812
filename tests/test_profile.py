"""profile(): targets, the summary, trace export and errors on the CPU; the GPU arithmetic of the
summary on a synthetic Chrome trace (CI)."""

from __future__ import annotations

import json

import pytest
import torch

from gpuopt import Config
from gpuopt.analysis.profiler import ProfileSummary, _gpu_summary, profile


def small_cnn() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(8, 5),
    ).eval()


def test_profile_a_cpu_module_writes_traces_and_summarises(tmp_path, rng):
    x = torch.randn(4, 3, 32, 32, generator=rng)
    s = profile(small_cnn(), x, steps=3, warmup=1, output_dir=str(tmp_path), row_limit=5)
    assert isinstance(s, ProfileSummary) and s.steps == 3 and s.warmup == 1
    assert s.cpu_time_ms > 0 and s.step_ms > 0
    assert len(s.top_cpu_ops) == 5
    names = [op["name"] for op in s.top_cpu_ops]
    assert any("conv" in n for n in names), names
    assert all(op["calls"] >= 1 and op["total_ms"] >= 0 for op in s.top_cpu_ops)
    assert [op["total_ms"] for op in s.top_cpu_ops] == sorted((op["total_ms"] for op in s.top_cpu_ops), reverse=True)
    assert 0 < sum(op["share"] for op in s.top_cpu_ops) <= 1.0 + 1e-9
    conv = next(op for op in s.top_cpu_ops if "conv" in op["name"])
    assert conv["calls"] % 3 == 0  # once per profiled step: warm-up steps are not recorded
    # A CPU run records no GPU activity.
    assert s.device == "CPU"
    assert s.top_kernels is s.gpu_time_ms is s.gpu_idle_fraction is s.kernels_per_iter is None
    assert s.mean_launch_gap_us is s.memcpy_ms is None
    # Chrome/Perfetto trace and TensorBoard trace.
    assert s.trace_path == str(tmp_path / "trace.json")
    trace = json.loads((tmp_path / "trace.json").read_text())
    steps = [e for e in trace["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]
    assert len(steps) == 3
    tb = list((tmp_path / "tensorboard").glob("gpuopt.*.pt.trace.json"))
    assert len(tb) == 1 and s.tensorboard_dir == str(tmp_path / "tensorboard")
    # Serialisable, printable.
    d = json.loads(json.dumps(s.to_dict()))
    assert d["steps"] == 3 and d["top_cpu_ops"][0]["name"] == s.top_cpu_ops[0]["name"]
    md = s.to_markdown()
    assert "| CPU time / iter |" in md and "Top CPU ops (self time), 3 iterations" in md
    assert f"`{s.top_cpu_ops[0]['name']}`" in md
    text = str(s)
    assert "top CPU ops (self time):" in text and "tensorboard --logdir" in text


def test_profile_targets_prepared_callable_and_kwargs(rng):
    x = torch.randn(2, 3, 16, 16, generator=rng)
    prepared = Config("fp32").apply(small_cnn(), x, device="cpu")
    with pytest.warns(UserWarning, match="warmup"):  # torch's own warning: no warm-up asked for
        s = profile(prepared, x, steps=2, warmup=0)
    assert s.steps == 2 and s.trace_path is None and s.tensorboard_dir is None
    assert any("conv" in op["name"] for op in s.top_cpu_ops)
    calls = []
    w = torch.randn(64, 64, generator=rng)
    s = profile(lambda: calls.append(w @ w), steps=4, warmup=2, record_shapes=True)
    assert len(calls) == 6
    mm = [op for op in s.top_cpu_ops if op["name"] == "aten::mm"]  # other ops may rank first on a GPU host
    assert mm and mm[0]["calls"] == 4, s.top_cpu_ops
    lin = torch.nn.Linear(6, 2)
    s = profile(lin, {"input": torch.randn(3, 6, generator=rng)}, steps=1, warmup=1)
    assert any(op["name"] == "aten::addmm" for op in s.top_cpu_ops)


class Broken(torch.nn.Module):
    def forward(self, x):
        raise ValueError("bad input shape from the model itself")


def test_a_raising_target_propagates_its_own_error(tmp_path, rng):
    with pytest.raises(ValueError, match="bad input shape from the model itself"):
        profile(Broken(), torch.randn(2, generator=rng), output_dir=str(tmp_path))
    with pytest.raises(ZeroDivisionError):
        profile(lambda: 1 / 0)
    # The profiler was closed: another profile works.
    assert profile(lambda: torch.ones(3).sum(), steps=1).steps == 1


@pytest.mark.parametrize(
    "target, inputs, kwargs, error, match",
    [
        (42, None, {}, TypeError, "target must be a gpuopt.Prepared, an nn.Module or a zero-argument callable"),
        (lambda: 1, torch.ones(1), {}, TypeError, "a callable target takes no inputs"),
        (lambda: 1, None, {"steps": 0}, ValueError, "steps must be an integer >= 1, got 0"),
        (lambda: 1, None, {"warmup": -1}, ValueError, "warmup must be an integer >= 0"),
        (lambda: 1, None, {"row_limit": 2.5}, TypeError, "row_limit must be an integer >= 1"),
        (lambda: 1, None, {"record_shapes": "yes"}, TypeError, "record_shapes must be True or False"),
    ],
)
def test_bad_arguments_name_the_problem(target, inputs, kwargs, error, match):
    with pytest.raises(error, match=match):
        profile(target, inputs, **kwargs)


def test_profiling_a_prepared_needs_inputs(rng):
    x = torch.randn(2, 3, 8, 8, generator=rng)
    with pytest.raises(ValueError, match="profiling a Prepared needs inputs"):
        profile(Config("fp32").apply(small_cnn(), x, device="cpu"))


def _event(cat, name, ts, dur):
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur}


def test_gpu_summary_of_a_synthetic_trace():
    # Two iterations on the GPU timeline (microseconds): 100 us of span, 30 us of it idle.
    events = [
        _event("kernel", "sm90_xmma_gemm_bf16", 0.0, 20.0),
        _event("kernel", "elementwise_kernel", 25.0, 5.0),    # gap 5
        _event("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 30.0, 10.0),
        _event("kernel", "sm90_xmma_gemm_bf16", 50.0, 20.0),  # gap 20 after the elementwise kernel
        _event("kernel", "elementwise_kernel", 65.0, 10.0),   # overlaps the GEMM: gap 0
        _event("gpu_memset", "Memset (Device)", 80.0, 5.0),
        _event("kernel", "reduce_kernel", 95.0, 5.0),          # gap 20 after 75
        _event("cpu_op", "aten::mm", 0.0, 500.0),              # host events are not GPU time
        {"ph": "i", "cat": "kernel", "name": "instant", "ts": 1.0},
    ]
    g = _gpu_summary(events, steps=2, row_limit=2)
    busy = 20 + 5 + 10 + 25 + 5 + 5  # union of [0,20] [25,40] [50,75] [80,85] [95,100]
    assert g["gpu_idle_fraction"] == pytest.approx(1 - busy / 100)
    assert g["gpu_time_ms"] == pytest.approx((20 + 5 + 10 + 20 + 10 + 5 + 5) / 1e3 / 2)
    assert g["kernels_per_iter"] == 2.5
    assert g["mean_launch_gap_us"] == pytest.approx((5 + 20 + 0 + 20) / 4)
    assert g["memcpy_ms"] == pytest.approx(10 / 1e3 / 2)
    top = g["top_kernels"]
    assert [t["name"] for t in top] == ["sm90_xmma_gemm_bf16", "elementwise_kernel"]
    assert top[0]["total_ms"] == pytest.approx(0.040) and top[0]["calls"] == 2
    assert top[0]["share"] == pytest.approx(40 / 60) and top[1]["share"] == pytest.approx(15 / 60)
    assert _gpu_summary([_event("cpu_op", "aten::mm", 0.0, 5.0)], steps=1, row_limit=5) == {}
