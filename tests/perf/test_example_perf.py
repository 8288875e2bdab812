"""Performance tests of a model with gpuopt's pytest plugin: copy this file to start your own.

Speed requirements as tests: a ratio measured in the same run ("fp16 stays 1.8x faster than
fp32"), an absolute budget, and, through baselines, "no significant regression":

    pytest tests/perf --gpuopt-save=main                     # once, on the reference commit
    pytest tests/perf --gpuopt-compare=main --gpuopt-compare-fail=median:10%,p95:15%
    pytest tests/perf --gpuopt-disable                       # functional run: bodies once, untimed

Baselines are kept per environment (GPU, driver, torch, CUDA): a run on another GPU is compared with
nothing rather than failed. Without a usable GPU these tests are skipped, with the reason.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gpuopt
from gpuopt.testing import assert_faster, assert_latency, assert_parity

pytestmark = pytest.mark.gpuopt_gpu


def small_cnn() -> nn.Module:
    """A ResNet-like stack of 3x3 convolutions: enough arithmetic for tensor cores to matter."""

    def block(c_in: int, c_out: int, stride: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.BatchNorm2d(c_out),
                             nn.ReLU(inplace=True))

    return nn.Sequential(
        block(3, 64, 2), block(64, 64, 1), block(64, 64, 1),
        block(64, 128, 2), block(128, 128, 1), block(128, 128, 1),
        block(128, 256, 2), block(256, 256, 1), block(256, 256, 1),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 10),
    )


@pytest.fixture(scope="module")
def model() -> nn.Module:
    torch.manual_seed(0)
    return small_cnn().eval()


@pytest.fixture
def images() -> torch.Tensor:
    return torch.randn(32, 3, 128, 128)  # random and fresh per test: never time on zeros


def test_fp16_channels_last_stays_1_8x_faster_than_fp32(gpuopt_bench, model, images):
    fp32 = gpuopt.Config.parse("fp32").apply(model, images)
    fp16 = gpuopt.Config.parse("fp16-amp+channels_last").apply(model, images)
    assert fp32.ok and fp16.ok, (fp32.error, fp16.error)
    assert_parity(fp16, fp32, images)  # faster and still right
    # Two callables are timed interleaved: clock drift between separate runs cancels out.
    c = assert_faster(fp32.runner(images), fp16.runner(images), min_speedup=1.8, max_time_s=3,
                      labels=("fp32", "fp16-amp+channels_last"))
    gpuopt_bench.record(c.baseline_measurement, name="fp32")  # into the report and the baselines
    gpuopt_bench.record(c.candidate_measurement, name="fp16-amp+channels_last")


@pytest.mark.gpuopt(max_time_s=2)
def test_fp16_latency_budget(gpuopt_bench, model, images):
    m = gpuopt_bench(model, "fp16-amp+channels_last", images)
    assert_latency(m, p95_ms=50)  # a generous absolute budget; baselines catch smaller regressions
