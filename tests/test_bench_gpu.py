"""The main job on a real GPU: every mode, a training step, speedups, roofline placement, a real
out-of-memory cell in a sweep."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import gpuopt
from gpuopt.analysis.roofline import LOW_UTILIZATION_PCT, compute_ceiling, memory_ceiling

pytestmark = pytest.mark.gpuopt_gpu

FAST = {"max_time_s": 1.0, "progress": False}


@pytest.fixture(scope="module")
def resnet18(tmp_path_factory):
    pytest.importorskip("torchvision")
    out = tmp_path_factory.mktemp("bench-gpu")
    return gpuopt.benchmark("resnet18", configs=["fp32", "fp16-amp+channels_last"],
                            batch_sizes=[8], modes=["latency", "throughput", "graph", "end-to-end"], train=True,
                            output_dir=str(out), **FAST), out


def test_every_mode_measures_on_the_gpu(resnet18):
    res, out = resnet18
    ok = {(r.config, r.mode) for r in res.ok}
    for cfg in ("fp32", "fp16-amp+channels_last"):
        for mode in ("latency", "throughput", "graph", "end-to-end", "train"):
            assert (cfg, mode) in ok, (cfg, mode, [r.error for r in res.failed])
    for r in res.ok:
        assert r.peak_memory["max_allocated_bytes"] > 0
        assert r.device == torch.cuda.get_device_name()
    assert (out / "resnet18-throughput.png").exists() and (out / "report.md").exists()


def test_training_an_inference_only_backend_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(ValueError, match="configs fp16\\+channels_last\\+cudagraph use an inference-only backend"):
        gpuopt.benchmark("resnet18", configs=["fp32", "fp16+channels_last+cudagraph"], batch_sizes=[8], train=True,
                         output_dir=str(tmp_path), **FAST)
    assert not any(tmp_path.iterdir())


def test_fp16_is_faster_and_the_report_shows_it(resnet18):
    res, _ = resnet18
    s = [x for x in res.speedups() if x["config"] == "fp16-amp+channels_last" and x["mode"] == "latency"]
    assert s and s[0]["verdict"] == "faster" and s[0]["speedup"] > 1.2
    fp32 = res.find("resnet18", "fp32", 8, "latency").measurement.samples_ms
    fp16 = res.find("resnet18", "fp16-amp+channels_last", 8, "latency").measurement.samples_ms
    assert s[0]["speedup"] == pytest.approx(np.median(fp32) / np.median(fp16), rel=1e-9)
    md = res.to_markdown()
    assert "### Speedup over fp32" in md and "## Roofline" in md and "### Training step" in md


def test_rows_are_placed_on_the_roofline(resnet18):
    res, _ = resnet18
    row = res.find("resnet18", "fp16-amp+channels_last", 8, "throughput")
    roof = row.roofline
    # torchvision publishes 1.81 GFLOPS (multiply-adds) per 224x224 image for ResNet-18.
    assert row.flops_per_item == pytest.approx(2 * 1.81e9, rel=0.01)
    tput = 8 * 1e3 / np.median(row.measurement.samples_ms)
    assert row.throughput_items_per_s == pytest.approx(tput, rel=1e-9)
    tflops, gbps = row.flops_per_item * tput / 1e12, row.bytes_per_item_min * tput / 1e9
    peak, _ = compute_ceiling(res.ceilings, "fp16-amp")
    bandwidth, _ = memory_ceiling(res.ceilings)
    assert roof["achieved_tflops"] == pytest.approx(tflops, rel=1e-9)
    assert roof["pct_of_compute_ceiling"] == pytest.approx(100 * tflops / peak, rel=1e-9)
    assert roof["achieved_gbps"] == pytest.approx(gbps, rel=1e-9)
    assert roof["pct_of_memory_ceiling"] == pytest.approx(100 * gbps / bandwidth, rel=1e-9)
    assert 0 < roof["pct_of_compute_ceiling"] < 100 and 0 < roof["pct_of_memory_ceiling"] < 100  # below the roof
    if row.diagnosis == "launch-bound" or max(100 * tflops / peak, 100 * gbps / bandwidth) < LOW_UTILIZATION_PCT:
        expected = "latency/launch-bound"
    else:
        expected = "compute-bound" if tflops / gbps * 1e3 >= peak * 1e3 / bandwidth else "memory-bound"
    assert roof["bound"] == expected


def _batch_beyond_memory() -> int:
    """A batch of 2048x2048 images whose first convolution's output alone (tiny-cnn: 32 channels, fp32)
    is larger than the whole GPU: 167 on an 80 GB H100, 294 on a 141 GB H200 (a fixed 128 fit the H200
    and ran for minutes instead of failing)."""
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return math.ceil(1.05 * total / (32 * 2048 * 2048 * 4))


def test_a_real_out_of_memory_cell_is_recorded_and_the_sweep_goes_on(tmp_path):
    big = _batch_beyond_memory()
    spec = {"models": [{"name": "tiny-cnn", "input_shape": [3, 2048, 2048], "batch_sizes": [2, big, 4]}],
            "configs": ["fp32"], "modes": ["latency"], "measure": {"max_time_s": 0.5}}
    res = gpuopt.sweep(spec, tmp_path, progress=False)
    by_batch = {r.batch_size: r for r in res.rows}
    assert by_batch[big].status == "failed" and "out of memory" in by_batch[big].error, by_batch[big]
    assert by_batch[2].status == by_batch[4].status == "ok"


def test_a_real_out_of_memory_batch_is_recorded_and_benchmark_keeps_the_others(tmp_path):
    # The fp32 reference runs out of memory at the big batch (as above): benchmark() records that batch's
    # cells with the reason and keeps the batch sizes before and after it (gpuopt 0.1 raised and lost them).
    big = _batch_beyond_memory()
    res = gpuopt.benchmark("tiny-cnn", input_shape=(3, 2048, 2048), configs=["fp32", "fp16-amp"],
                           batch_sizes=[2, big, 4], modes=["latency"], output_dir=str(tmp_path), max_time_s=0.5,
                           progress=False)
    for cfg in ("fp32", "fp16-amp"):
        failed = res.find("tiny-cnn", cfg, big, "latency")
        assert failed.status == "failed", failed
        assert failed.error.startswith("out of memory") and f"at batch {big}" in failed.error, failed.error
        for b in (2, 4):
            assert res.find("tiny-cnn", cfg, b, "latency").status == "ok"
    assert len(gpuopt.Results.load(tmp_path / "results.json").rows) == 6
