"""The split-batch strategy on the CPU: two gloo ranks, one global batch scattered from rank 0 and the
outputs gathered back; its validation; the views that cut a batch into the ranks' shares."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import gpuopt
from gpuopt import Results
from gpuopt.cli import main
from gpuopt.dist.split import check_batches, flat

FAST = {"configs": ["fp32"], "parity": False, "progress": False, "max_time_s": 0.2}


@pytest.fixture(autouse=True)
def _short_timeouts(monkeypatch):
    monkeypatch.setenv("GPUOPT_DIST_TIMEOUT_S", "60")


def test_flat_views_cut_contiguous_and_channels_last_batches_into_blocks(rng):
    x = torch.randn(4, 3, 5, 6, generator=rng)
    for t in (x, x.contiguous(memory_format=torch.channels_last)):
        f = flat(t)
        assert f.data_ptr() == t.data_ptr() and f.numel() == t.numel()  # a view: nothing copied
        item = t[0].numel()
        for i in range(4):  # each item is one block of the flat view, in the tensor's own layout
            block = f[i * item:(i + 1) * item]
            assert torch.equal(block, flat(t[i:i + 1].clone(memory_format=torch.preserve_format)))
    with pytest.raises(ValueError, match="neither contiguous nor channels-last"):
        flat(x.transpose(0, 1))


def test_a_global_batch_that_does_not_split_evenly_names_batch_sizes_and_the_world_size():
    check_batches([2, 8], 2)
    with pytest.raises(ValueError, match=r"batch_sizes=\[4, 6\].*over the 4 ranks \(the world size\); \[6\] is not "
                                         r"divisible by 4"):
        check_batches([4, 6], 4)
    with pytest.raises(ValueError, match=r"batch_sizes=\[3\].*2 ranks"):
        gpuopt.benchmark("tiny-cnn", batch_sizes=[3], devices=2, device="cpu", strategy="split", **FAST)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"strategy": "pipeline", "devices": 2}, ValueError, r"strategy must be one of 'replicas', 'split', got 'pipeline'"),
    ({"strategy": None, "devices": 2}, ValueError, r"strategy must be one of 'replicas', 'split', got None"),
    ({"strategy": "split"}, ValueError, r"strategy='split' scatters one global batch .* give devices="),
    ({"strategy": "split", "devices": 2, "modes": ["latency"]}, ValueError, r"modes must be 'host' or left out"),
    ({"strategy": "split", "devices": 2, "train": True}, ValueError, r"train=True runs with strategy='replicas'"),
    ({"strategy": "split", "devices": 2, "profile": True}, ValueError, r"profile with strategy='replicas'"),
])
def test_bad_strategies_are_refused_before_anything_runs(kwargs, error, match):
    with pytest.raises(error, match=match):
        gpuopt.benchmark("tiny-cnn", batch_sizes=[2], device="cpu", **{**FAST, **kwargs})


def test_cli_unknown_strategy_exits_2(capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "tiny-cnn", "--device", "cpu", "--gpus", "2", "--strategy", "zigzag",
              "--output", str(tmp_path / "out")])
    assert exc.value.code == 2
    assert "strategy must be one of 'replicas', 'split', got 'zigzag'" in capsys.readouterr().err


def test_two_cpu_ranks_split_each_global_batch_and_report_its_phases(tmp_path):
    out = tmp_path / "out"
    results = gpuopt.benchmark("tiny-cnn", batch_sizes=[2, 8], devices=2, device="cpu", strategy="split",
                               output_dir=str(out), **FAST)
    assert not results.failed, [r.error for r in results.failed]
    assert results.modes() == ["host @1 rank", "host split @2 ranks"]
    assert results.spec["dist"]["strategy"] == "split" and results.spec["dist"]["world_size"] == 2
    for b in (2, 8):
        base = results.find("tiny-cnn", "fp32", b, "host @1 rank")
        row = results.find("tiny-cnn", "fp32", b, "host split @2 ranks")
        d = row.dist
        assert (d["role"], d["strategy"], d["global_batch"], d["shard_batch"]) == ("split", "split", b, b // 2)
        assert row.items_per_call == b and row.throughput_items_per_s == pytest.approx(b * 1e3 / row.latency_ms["p50"])
        for phase in ("scatter", "compute", "gather"):
            assert d[f"{phase}_ms"] > 0 and d["phases_ms"][phase]["p99"] >= d[f"{phase}_ms"]
        # the phases lie inside the iteration (its median is no shorter than their medians' sum, give or take)
        assert d["scatter_ms"] + d["compute_ms"] + d["gather_ms"] < 1.5 * row.latency_ms["p50"]
        assert 0 < d["compute_share"] <= 1.0
        assert len(d["compute_ms_per_rank"]) == 2 and all(t > 0 for t in d["compute_ms_per_rank"])
        assert d["compute_ms_per_rank"][0] == pytest.approx(d["compute_ms"])
        assert d["speedup_vs_single"] == pytest.approx(row.throughput_items_per_s / base.throughput_items_per_s)
        assert d["scaling_efficiency"] == pytest.approx(d["speedup_vs_single"] / 2)
        assert base.dist["role"] == "single" and base.items_per_call == b
    saved = Results.load(out / "results.json")
    assert [r.key for r in saved.rows] == [r.key for r in results.rows]
    header, *lines = (out / "results.csv").read_text().splitlines()
    columns = header.split(",")
    assert {"strategy", "scatter_ms", "gather_ms", "compute_share"} <= set(columns)
    split_line = next(dict(zip(columns, line.split(","), strict=False)) for line in lines if "split" in line)
    assert split_line["strategy"] == "split" and float(split_line["scatter_ms"]) > 0


# ---- the scatter and gather carry rank 0's batch: a user's script under torchrun ----------------------------
SCRIPT = '''
import os, sys
import torch
import torch.distributed as dist
import gpuopt
from gpuopt.dist.split import SplitStep, lead, follow

cuda = sys.argv[1] == "cuda"
device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(device)
dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)  # the same weights on every rank
model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU()).to(device)
torch.manual_seed(100 + rank)  # but each rank its own inputs: only rank 0's may reach the output
batch = 6 * world
for config in sys.argv[2].split(","):
    prepared = gpuopt.Config.parse(config).apply(model, torch.randn(batch // world, 3, 5, 5), device=device)
    assert prepared.ok, prepared.error
    whole = torch.randn(batch, 3, 5, 5) if rank == 0 else None
    step = SplitStep.prepare(prepared, torch.randn(batch // world, 3, 5, 5), whole, rank=rank, world=world,
                             batch=batch)
    if rank == 0:
        m, phases = lead(step, "check", {"iters": 3, "warmup": 1, "warmup_s": 0.0})
        with torch.no_grad():
            expected = model(whole.to(device))
        got = step.outputs[0]
        assert got.shape == expected.shape and got.device == expected.device, (got.shape, expected.shape)
        assert torch.allclose(got, expected, atol=1e-4), (got - expected).abs().max()
        assert m.n == 3 and phases["compute"].n == 3
        print(f"{config}: gathered output == model(global batch); layout channels_last:",
              got.is_contiguous(memory_format=torch.channels_last) and not got.is_contiguous())
    else:
        follow(step)
dist.destroy_process_group()
'''


def _check_split(tmp_path, device: str, configs: list[str], nproc: int) -> str:
    (tmp_path / "split_check.py").write_text(SCRIPT)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                           "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", str(tmp_path / "split_check.py"),
                           device, ",".join(configs)], capture_output=True, text=True, timeout=300, env=os.environ)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_the_gathered_output_is_the_models_output_on_rank_0s_global_batch(tmp_path):
    out = _check_split(tmp_path, "cpu", ["fp32", "fp32+channels_last"], 2)
    assert "fp32: gathered output == model(global batch); layout channels_last: False" in out
    assert "fp32+channels_last: gathered output == model(global batch); layout channels_last: True" in out


# ---- on GPUs: NCCL, the global batch on rank 0's GPU (one GPU: a world of one; two on a 2-GPU machine) -------
def _gpus() -> int:
    return min(2, torch.cuda.device_count())


@pytest.mark.gpuopt_gpu
def test_on_the_gpus_the_gathered_output_is_the_models_output(tmp_path):
    configs = ["fp32", "fp32+channels_last", "fp32+channels_last+cudagraph"]
    out = _check_split(tmp_path, "cuda", configs, _gpus())
    for config in configs:
        assert f"{config}: gathered output == model(global batch)" in out


@pytest.mark.gpuopt_gpu
def test_split_on_the_gpus_reports_scatter_gather_and_the_speedup(tmp_path):
    pytest.importorskip("torchvision")
    n = _gpus()
    results = gpuopt.benchmark("resnet18", configs=["fp16-amp+channels_last", "fp16+channels_last+cudagraph"],
                               batch_sizes=[64 * n], devices=n, strategy="split", output_dir=str(tmp_path / "out"),
                               max_time_s=1.0, progress=False)
    assert not results.failed, [r.error for r in results.failed]
    assert results.spec["dist"]["backend"] == "nccl"
    for config in ("fp16-amp+channels_last", "fp16+channels_last+cudagraph"):
        row = results.find("resnet18", config, 64 * n, f"host split @{n} ranks")
        d = row.dist
        assert d["shard_batch"] == 64 and d["scatter_ms"] > 0 and d["gather_ms"] > 0 and d["compute_ms"] > 0
        assert 0 < d["compute_share"] <= 1.0 and d["speedup_vs_single"] > 0
        assert len(d["compute_ms_per_rank"]) == n
        print(config, {k: d[k] for k in ("scatter_ms", "compute_ms", "gather_ms", "compute_share",
                                          "speedup_vs_single", "scaling_efficiency")})
