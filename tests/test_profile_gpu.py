"""profile() and roofline placement on a real GPU: ResNet-50's kernels, launch gaps, and a big GEMM
and a big copy placed against the datasheet ceilings of the GPU in hand."""

from __future__ import annotations

import json
import re

import pytest
import torch

import gpuopt
from gpuopt import Config
from gpuopt.analysis.profiler import profile
from gpuopt.analysis.roofline import count_flops, datasheet_ceilings, place

pytestmark = pytest.mark.gpuopt_gpu

CONV_LIKE = re.compile(r"conv|cudnn|implicit|gemm|sm90|xmma|cutlass", re.IGNORECASE)


@pytest.fixture(scope="module")
def resnet_profile(tmp_path_factory):
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.resnet50(weights=None)
    x = torch.randn(32, 3, 224, 224)
    prepared = Config("fp16-amp").apply(model, x, device="cuda")
    assert prepared.ok, prepared.error
    out = tmp_path_factory.mktemp("resnet50-profile")
    return profile(prepared, x, steps=5, warmup=2, output_dir=str(out), row_limit=20), out


def test_resnet50_fp16_profile_names_cudnn_and_convolution_kernels(resnet_profile):
    # Seen on an H100 (torch 2.11, eager, batch 32): cuDNN's inference BatchNorm leads (~30% of GPU
    # time), then cuDNN's NCHW<->NHWC transposes and ReLU; the convolutions' implicit-GEMM kernels
    # follow at a few percent each, spread over several tile variants.
    s, out = resnet_profile
    assert s.device == torch.cuda.get_device_name()
    top3 = [k["name"] for k in s.top_kernels[:3]]
    assert any(CONV_LIKE.search(name) for name in top3), top3
    names = [k["name"] for k in s.top_kernels]
    assert any(re.search(r"conv|fprop|implicit", name, re.IGNORECASE) for name in names), names
    assert 0.0 <= s.gpu_idle_fraction <= 1.0
    assert s.kernels_per_iter > 50
    assert s.gpu_time_ms > 0 and s.step_ms > 0 and s.cpu_time_ms > 0
    assert s.mean_launch_gap_us is not None and s.mean_launch_gap_us >= 0
    assert s.memcpy_ms is not None and s.memcpy_ms >= 0  # inputs were converted once, before profiling
    shares = [k["share"] for k in s.top_kernels]
    assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1.0 + 1e-9
    assert all(k["calls"] >= 1 and k["total_ms"] > 0 for k in s.top_kernels)
    trace = json.loads((out / "trace.json").read_text())
    assert any(e.get("cat") == "kernel" for e in trace["traceEvents"])
    assert list((out / "tensorboard").glob("gpuopt.*.pt.trace.json"))
    assert "GPU time / iter" in s.to_markdown() and "top GPU kernels:" in str(s)
    print(s)


def test_many_tiny_kernels_leave_the_gpu_idle_between_launches():
    x = torch.randn(1024, device="cuda")

    def tiny():
        for _ in range(200):
            x.add_(1.0)

    s = profile(tiny, steps=3, warmup=2)
    assert s.kernels_per_iter == 200
    assert s.gpu_idle_fraction > 0.3, s  # the host issues each ~2 us kernel slower than it runs
    assert s.mean_launch_gap_us > 0.5
    assert s.top_kernels[0]["calls"] == 600


def test_a_cpu_target_on_a_gpu_machine_has_no_gpu_fields():
    s = profile(torch.nn.Linear(32, 32), torch.randn(4, 32), steps=2, warmup=1)
    assert s.top_kernels is None and s.gpu_idle_fraction is None and s.device == "CPU"
    assert any("ran on the CPU" in n for n in s.notes)


@pytest.fixture
def ceilings():
    c = datasheet_ceilings()
    if c["datasheet"] is None:
        pytest.skip(f"{c['device']} is not in gpuopt's datasheet table")
    return c


def test_big_bf16_matmul_is_compute_bound(ceilings):
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    flops = count_flops(torch.matmul, (a, b))
    assert flops == 2 * n**3
    m = gpuopt.measure(lambda: a @ b, mode="latency", max_time_s=3)
    r = place(flops_per_item=flops, bytes_per_item=3 * n * n * 2, items_per_s=m.per_second(),
              precision="bf16", ceilings=ceilings, diagnosis=m.diagnosis)
    assert r["compute_source"] == r["memory_source"] == "datasheet"
    assert r["bound"] == "compute-bound", r["reason"]
    assert 25 < r["pct_of_compute_ceiling"] < 110, r["reason"]


def test_big_copy_is_memory_bound(ceilings):
    x = torch.randn(64 << 20, device="cuda")  # 256 MiB
    y = torch.empty_like(x)
    m = gpuopt.measure(lambda: y.copy_(x), mode="latency", max_time_s=3)
    r = place(flops_per_item=0, bytes_per_item=2 * x.numel() * x.element_size(), items_per_s=m.per_second(),
              precision="fp32", ceilings=ceilings, diagnosis=m.diagnosis)
    assert r["bound"] == "memory-bound", r["reason"]
    assert 25 < r["pct_of_memory_ceiling"] < 110, r["reason"]
