"""gpuopt.dist on the CPU: two gloo ranks started by torchrun (gpuopt's launcher or the test's own), each
measuring its replica on the CPU; the aggregate's pure functions; the validation of ``devices``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace

import numpy as np
import pytest
import torch

import gpuopt
from gpuopt import Measurement, Results, Row
from gpuopt.cli import main
from gpuopt.dist import RankFailedError, aggregate_row, common_interval, pooled, scaling_efficiency
from gpuopt.dist.launch import _failure, _of_job, exit_codes
from gpuopt.dist.worker import reports, save_rows_so_far, stopped_ranks
from gpuopt.report.results import dist_mode, read_cells

TIMEOUT_S = "60"  # each collective; the launcher waits three of these and two minutes at most
FAST = {"configs": ["fp32"], "modes": ["latency"], "parity": False, "progress": False, "max_time_s": 0.1}


@pytest.fixture(autouse=True)
def _short_timeouts(monkeypatch):
    monkeypatch.setenv("GPUOPT_DIST_TIMEOUT_S", TIMEOUT_S)


def _measurement(rng: np.random.Generator, n: int, scale: float) -> Measurement:
    return Measurement.from_samples(list(scale * (1 + rng.exponential(0.2, n))), stop_reason="max_time")


def _rank_row(m: Measurement, rank: int, world: int, window=(0.0, 1.0), mode="host") -> Row:
    row = Row.measured(m, model="tiny-cnn", config="fp32", batch_size=4, mode=dist_mode(mode, "rank", world, rank),
                       precision="fp32", items_per_call=4, device="cpu")
    return replace(row, dist={"role": "rank", "mode": mode, "rank": rank, "world_size": world,
                              "window_s": list(window)})


# ---- aggregate.py ----------------------------------------------------------------------------------------
def test_pooled_percentiles_are_those_of_the_concatenated_raw_samples(np_rng):
    parts = [_measurement(np_rng, int(np_rng.integers(5, 60)), s) for s in (1.0, 1.3, 0.8)]
    every = np.concatenate([m.samples_ms for m in parts])
    p = pooled(parts)
    assert p.n == len(every)
    for q, value in ((25, p.p25), (50, p.p50), (90, p.p90), (95, p.p95), (99, p.p99)):
        assert value == pytest.approx(np.percentile(every, q), rel=1e-12)
    assert p.mean == pytest.approx(every.mean())
    # never an average of the ranks' percentiles
    assert p.p99 != pytest.approx(np.mean([m.p99 for m in parts]))
    with pytest.raises(ValueError, match="different modes"):
        pooled([parts[0], Measurement.from_samples([1.0, 2.0], mode="latency")])


def test_common_interval_and_scaling_efficiency():
    assert common_interval([(0.0, 2.0), (0.5, 2.5), (1.0, 3.0)]) == (1.0, 0.5)
    assert common_interval([(0.0, 1.0), (2.0, 3.0)]) == (0.0, 0.0)
    assert scaling_efficiency(360.0, 100.0, 4) == pytest.approx(0.9)
    with pytest.raises(ValueError, match="world_size"):
        scaling_efficiency(1.0, 0.0, 2)


def test_aggregate_row_sums_throughput_pools_latency_and_divides_by_n_singles(np_rng):
    ranks = [_rank_row(_measurement(np_rng, 40, 1.0 + 0.1 * r), r, 3, (0.01 * r, 1.0 + 0.01 * r)) for r in range(3)]
    single = Row.measured(_measurement(np_rng, 40, 0.9), model="tiny-cnn", config="fp32", batch_size=4,
                          mode=dist_mode("host", "single", 3), precision="fp32")
    agg = aggregate_row(ranks, single)
    assert agg.ok and agg.mode == "host @3 ranks" and agg.dist["role"] == "aggregate"
    total = sum(r.throughput_items_per_s for r in ranks)
    assert agg.throughput_items_per_s == pytest.approx(total)
    assert agg.dist["scaling_efficiency"] == pytest.approx(total / (3 * single.throughput_items_per_s))
    every = np.concatenate([r.measurement.samples_ms for r in ranks])
    assert agg.latency_ms["p95"] == pytest.approx(np.percentile(every, 95))
    assert agg.dist["pooled_samples"] == len(every)
    assert agg.dist["overlap"] == pytest.approx(0.98 / 1.0)
    assert not any("concurrently" in w for w in agg.warnings)
    apart = aggregate_row([_rank_row(ranks[0].measurement, 0, 2, (0, 1)), _rank_row(ranks[1].measurement, 1, 2, (0.5, 1.5))])
    assert any("did not run concurrently" in w for w in apart.warnings)
    assert "scaling_efficiency" not in apart.dist  # no single-device row to divide by


def test_aggregate_of_a_cell_that_failed_on_a_rank_is_failed_naming_it(np_rng):
    ok = _rank_row(_measurement(np_rng, 20, 1.0), 0, 2)
    bad = Row.failed("out of memory", model="tiny-cnn", config="fp32", batch_size=4, mode="host @rank1/2",
                     dist={"role": "rank", "mode": "host", "rank": 1, "world_size": 2})
    agg = aggregate_row([ok, bad])
    assert not agg.ok and agg.error == "rank 1: out of memory" and agg.mode == "host @2 ranks"


def test_dist_rows_round_trip_through_json_and_csv(np_rng):
    row = _rank_row(_measurement(np_rng, 10, 1.0), 1, 2)
    res = Results([row])
    back = Results.from_dict(json.loads(res.to_json()))
    assert back.rows[0].dist == row.dist and back.rows[0].is_dist
    header, line = res.to_csv().splitlines()[:2]
    values = dict(zip(header.split(","), line.split(","), strict=True))
    assert values["rank"] == "1" and values["world_size"] == "2"
    with pytest.raises(ValueError, match="role"):
        dist_mode("host", "replica", 2)


def test_exit_codes_read_torchruns_failure_summary():
    text = textwrap.dedent("""\
        torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
        ============================================================
        gpuopt.dist.worker FAILED
        ------------------------------------------------------------
        Failures:
        [1]:
          time      : 2025-01-01_00:00:01
          host      : vm
          rank      : 0 (local_rank: 0)
          exitcode  : 1 (pid: 11)
          error_file: <N/A>
          traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
        ------------------------------------------------------------
        Root Cause (first observed failure):
        [0]:
          time      : 2025-01-01_00:00:00
          host      : vm
          rank      : 1 (local_rank: 1)
          exitcode  : -9 (pid: 12)
          error_file: <N/A>
        """)
    assert exit_codes(text) == (1, {0: 1, 1: -9})
    assert exit_codes("all good") == (None, {})


def test_the_blame_spares_ranks_that_had_finished_or_only_waited(tmp_path, np_rng):
    text = ("Failures:\n[1]:\n  rank      : 0 (local_rank: 0)\n  exitcode  : 1 (pid: 11)\n"
            "Root Cause (first observed failure):\n[0]:\n  rank      : 1 (local_rank: 1)\n  exitcode  : 3 (pid: 12)\n")
    _rank_files(tmp_path, np_rng, 2, {0: "done", 1: "failed"})  # rank 0 exited 1 at the last barrier
    error = _failure(text, 2, 1, tmp_path, tmp_path / "torchrun.log")
    assert error.ranks == [1] and "rank 0 had finished" in str(error)
    _rank_files(tmp_path, np_rng, 3, {0: "aborted", 1: "failed", 2: "running"})
    assert [r for r, _ in stopped_ranks(tmp_path, 3, but=0)] == [1]  # rank 2 still measures: not a suspect
    # Rank 0 aborted on rank 1's failure and exited first; torchrun then stopped rank 1 as it unwound: the
    # blame is rank 1's with its own error, not torchrun's SIGTERM.
    text = ("Failures:\n[1]:\n  rank      : 1 (local_rank: 1)\n  exitcode  : -15 (pid: 12)\n"
            "Root Cause (first observed failure):\n[0]:\n  rank      : 0 (local_rank: 0)\n  exitcode  : 1 (pid: 11)\n")
    _rank_files(tmp_path, np_rng, 2, {0: "aborted", 1: "failed"})
    error = _failure(text, 2, 1, tmp_path, tmp_path / "torchrun.log")
    assert error.ranks == [1] and str(error).startswith("rank 1 stopped: ") and "SIGTERM" not in str(error)
    _rank_files(tmp_path, np_rng, 3, {0: "aborted", 1: "done", 2: "running"})
    assert stopped_ranks(tmp_path, 3, but=0) == [(2, "no report: it was killed, crashed or is still running")]


# ---- devices= validation (nothing is started) --------------------------------------------------------------
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the errors of a machine without a GPU")
def test_gpus_asked_on_a_machine_without_one_name_devices_and_the_count():
    with pytest.raises(ValueError, match=r"devices=2 asks for GPUs and 0 are visible.*device='cpu'"):
        gpuopt.benchmark("tiny-cnn", devices=2, **FAST)


@pytest.mark.parametrize(("devices", "device", "error", "match"), [
    (0, "cpu", ValueError, "devices must be at least 1"),
    ("most", "cpu", ValueError, "devices must be 'all'"),
    (True, "cpu", TypeError, "devices must be"),
    (2.0, "cpu", TypeError, "devices must be"),
    ("all", "cpu", ValueError, "on the CPU devices is the number of ranks"),
    ([0, 1], "cpu", ValueError, "on the CPU devices is the number of ranks"),
])
def test_bad_devices_are_refused_before_anything_runs(devices, device, error, match):
    with pytest.raises(error, match=match):
        gpuopt.benchmark("tiny-cnn", devices=devices, device=device, **FAST)


def test_more_gpus_than_visible_and_missing_nccl(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ValueError, match=r"devices=4 asks for 4 GPUs; 2 visible \(cuda:0 to cuda:1\)"):
        gpuopt.dist.launch.resolve(4, _plan("cuda"), {"device": "cuda"})
    with pytest.raises(ValueError, match=r"devices=\[0, 3\] names GPU\(s\) \[3\]; 2 visible"):
        gpuopt.dist.launch.resolve([0, 3], _plan("cuda"), {"device": "cuda"})
    with pytest.raises(ValueError, match="names one GPU"):
        gpuopt.dist.launch.resolve(2, _plan("cuda:1"), {"device": "cuda:1"})
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: False)
    with pytest.raises(ImportError, match="NCCL"):
        gpuopt.dist.launch.resolve(2, _plan("cuda"), {"device": "cuda"})


def _plan(device: str):
    from gpuopt.run.bench import plan_benchmark

    plan = plan_benchmark("tiny-cnn", **FAST)
    plan.device = torch.device(device)
    return plan


def test_own_modules_need_torchrun_and_a_bad_timeout_is_named(monkeypatch):
    with pytest.raises(ValueError, match="zoo name.*torchrun"):
        gpuopt.benchmark(torch.nn.Linear(4, 4), input_shape=(4,), devices=2, device="cpu", **FAST)
    monkeypatch.setenv("GPUOPT_DIST_TIMEOUT_S", "soon")
    with pytest.raises(ValueError, match="GPUOPT_DIST_TIMEOUT_S"):
        gpuopt.benchmark("tiny-cnn", devices=2, device="cpu", **FAST)


def test_under_torchrun_devices_must_match_the_world_size(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(ValueError, match=r"devices=3, but this process is one of 2 ranks .*WORLD_SIZE"):
        gpuopt.benchmark("tiny-cnn", devices=3, device="cpu", **FAST)


@pytest.mark.parametrize(("args", "message"), [
    (["--gpus", "two"], "expected 'all', a number of GPUs or indices"),
    (["--gpus", "0", "--device", "cpu"], "devices must be at least 1"),
])
def test_gpus_usage_errors_exit_2(args, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "tiny-cnn", "--output", str(tmp_path / "out"), *args])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_without_gpus_the_cli_still_raises_a_model_build_failure(monkeypatch, tmp_path):
    def broken(*args, **kwargs):
        raise RuntimeError("the checkpoint is corrupt")

    monkeypatch.setattr("gpuopt.run.bench.workload", broken)
    with pytest.raises(RuntimeError, match="checkpoint is corrupt"):  # not a usage error (exit 2)
        main(["bench", "tiny-cnn", "--device", "cpu", "--output", str(tmp_path / "out")])


def test_cli_gpus_without_a_gpu_names_the_device_flag(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exc:
        main(["bench", "tiny-cnn", "--gpus", "2", "--output", str(tmp_path / "out")])
    assert exc.value.code == 2
    assert "none is visible; for ranks on the CPU give --device cpu" in capsys.readouterr().err


# ---- the rank files ------------------------------------------------------------------------------------------
def _rank_files(out, np_rng, world: int, states: dict[int, str]) -> None:
    ranks = out / "ranks"
    ranks.mkdir(parents=True, exist_ok=True)
    for r in range(world):
        (ranks / f"rank{r}.jsonl").write_text(json.dumps(_rank_row(_measurement(np_rng, 5, 1.0), r, world).to_dict()) + "\n")
        if r in states:
            (ranks / f"rank{r}.json").write_text(json.dumps({"rank": r, "state": states[r], "error": None, "pid": 1}))


def test_rows_so_far_read_only_the_ranks_of_this_job(tmp_path, np_rng):
    _rank_files(tmp_path, np_rng, 3, {0: "failed", 1: "running", 2: "failed"})  # rank 2: a 3-rank job before
    assert sorted(reports(tmp_path, 2)) == [0, 1]
    kept = save_rows_so_far(tmp_path, 2)
    assert [r.dist["rank"] for r in kept.rows] == [0, 1]
    assert len(Results.load(tmp_path / "results.json").rows) == 2


def test_rank_0s_complete_results_are_not_overwritten_by_rows_so_far(tmp_path, np_rng):
    _rank_files(tmp_path, np_rng, 2, {0: "done", 1: "failed"})
    complete = Results([_rank_row(_measurement(np_rng, 5, 1.0), r, 2, mode=m) for r in (0, 1) for m in ("host", "latency")])
    complete.save(tmp_path, plots=False)
    assert len(save_rows_so_far(tmp_path, 2).rows) == 4
    assert len(Results.load(tmp_path / "results.json").rows) == 4


def test_only_workers_of_the_job_are_killed():
    child = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
                             env={**os.environ, "TORCHELASTIC_RUN_ID": "job-a"}, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "up\n"  # its environment is the new one only once it runs (exec)
        assert _of_job(child.pid, "job-a")
        assert not _of_job(child.pid, "job-b") and not _of_job(os.getpid(), "job-a") and not _of_job(None, "job-a")
    finally:
        child.kill()
        child.communicate()
    assert not _of_job(child.pid, "job-a")


# ---- two ranks end to end ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist") / "out"
    # the folder of an earlier 3-rank job: its rank files must not mix in
    _rank_files(out, np.random.default_rng(0), 3, {0: "done", 1: "done", 2: "failed"})
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GPUOPT_DIST_TIMEOUT_S", TIMEOUT_S)
        mp.chdir(out.parent)  # where profiles went before they had a folder per rank
        results = gpuopt.benchmark("tiny-cnn", batch_sizes=[1, 2], devices=2, device="cpu", output_dir=str(out),
                                   profile=True, **FAST)
    return results, out


def test_two_cpu_ranks_give_rows_per_rank_an_aggregate_and_the_efficiency(two_ranks):
    results, out = two_ranks
    assert not results.failed
    assert results.modes() == ["host @1 rank", "host @rank0/2", "host @rank1/2", "host @2 ranks"]
    assert results.spec["dist"] == {"world_size": 2, "backend": "gloo", "device_type": "cpu",
                                   "strategy": "replicas"}
    for b in (1, 2):
        single = results.find("tiny-cnn", "fp32", b, "host @1 rank")
        ranks = [results.find("tiny-cnn", "fp32", b, f"host @rank{r}/2") for r in (0, 1)]
        agg = results.find("tiny-cnn", "fp32", b, "host @2 ranks")
        assert [r.dist["rank"] for r in ranks] == [0, 1] and single.dist["role"] == "single"
        every = np.concatenate([r.measurement.samples_ms for r in ranks])
        assert agg.measurement.n == len(every)
        for q in ("p50", "p95", "p99"):
            assert agg.latency_ms[q] == pytest.approx(np.percentile(every, int(q[1:])), rel=1e-12)
        total = sum(r.throughput_items_per_s for r in ranks)
        assert agg.throughput_items_per_s == pytest.approx(total)
        assert agg.dist["scaling_efficiency"] == pytest.approx(total / (2 * single.throughput_items_per_s))
        assert all(len(r.dist["window_s"]) == 2 for r in ranks)
        # the ranks meet right before each timed part: their sampling windows overlap
        assert agg.dist["common_interval_s"] > 0 and agg.dist["overlap"] > 0, agg.dist
    saved = Results.load(out / "results.json")
    assert [r.key for r in saved.rows] == [r.key for r in results.rows]
    assert sorted(os.listdir(out / "ranks")) == ["rank0.json", "rank0.jsonl", "rank1.json", "rank1.jsonl",
                                                 "spec.json", "torchrun.log"]
    assert json.loads((out / "ranks" / "rank1.json").read_text())["state"] == "done"
    assert "found in sys.modules" not in (out / "ranks" / "torchrun.log").read_text()  # -m gpuopt.dist


def _order(out, rank: int) -> list[tuple[str, int]]:
    """(role, batch size) of the rows of ``rank`` in the order it recorded them."""
    return [(r.dist["role"], r.batch_size) for r in read_cells(out / "ranks" / f"rank{rank}.jsonl")]


def test_rank_0_measures_each_cell_alone_just_before_all_ranks_do(two_ranks):
    _, out = two_ranks
    assert _order(out, 0) == [("single", 1), ("rank", 1), ("single", 2), ("rank", 2)]
    assert _order(out, 1) == [("rank", 1), ("rank", 2)]


def test_with_profile_each_rank_profiles_into_a_folder_of_its_own(two_ranks):
    results, out = two_ranks
    for r in (0, 1):
        assert sorted(os.listdir(out / "gpuopt-profiles" / f"rank{r}")) == ["tiny-cnn-b1-fp32", "tiny-cnn-b2-fp32"]
    assert sorted(results.profiles) == ["tiny-cnn b1 fp32", "tiny-cnn b2 fp32"]
    assert not (out.parent / "gpuopt-profiles").exists()


def test_the_others_wait_for_one_cell_of_rank_0_alone_not_the_whole_baseline(tmp_path, monkeypatch):
    # Rank 0 alone takes about 1.5 s per cell and longer than the collective timeout for the six: a
    # rank waiting for the whole baseline at one barrier would time out.
    monkeypatch.setenv("GPUOPT_DIST_TIMEOUT_S", "8")
    out = tmp_path / "out"
    results = gpuopt.benchmark("tiny-cnn", batch_sizes=[1, 2, 3, 4, 5, 6], devices=2, device="cpu",
                               output_dir=str(out), **{**FAST, "min_time_s": 1.5, "max_time_s": 1.5})
    assert not results.failed and len(results.rows) == 6 * 4
    singles = [r for r in results.rows if r.dist["role"] == "single"]
    assert sum(r.timing["sampling_s"] for r in singles) > 8
    assert _order(out, 0) == [(role, b) for b in range(1, 7) for role in ("single", "rank")]


# ---- a script of the user's under torchrun ------------------------------------------------------------------
SCRIPT = '''
import os, sys
import torch
import gpuopt

out, fail = sys.argv[1], sys.argv[2:] == ["fail"]
time_s = float(os.environ.get("USER_SCRIPT_TIME_S", "0.1"))  # each cell samples this long

def inputs(batch):
    if fail and batch == 2 and os.environ["RANK"] == "1":
        raise SystemExit("rank 1 gives up at batch 2")
    return torch.randn(batch, 8)

results = gpuopt.benchmark(torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU()), input_fn=inputs,
                           batch_sizes=[1, 2], devices="all", device="cpu", output_dir=out, configs=["fp32"],
                           modes=["latency"], parity=False, progress=False, min_time_s=time_s, max_time_s=time_s)
print(f"rank {os.environ['RANK']}: {len(results.rows)} rows")
if sys.argv[2:] == ["fail-after"] and os.environ["RANK"] == "1":
    raise SystemExit("rank 1 fails after benchmark() returned")
'''


@pytest.fixture
def user_script(tmp_path, monkeypatch):
    (tmp_path / "user_dist_script.py").write_text(SCRIPT)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p))
    return tmp_path


def test_a_users_own_torchrun_job_joins_and_rank_0_writes_the_results(user_script):
    out = user_script / "out"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend",
                           "c10d", "--rdzv-endpoint", "localhost:0", "-m", "user_dist_script", str(out)],
                          capture_output=True, text=True, timeout=300, env=os.environ)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rank 0: 8 rows" in proc.stdout and "rank 1: 2 rows" in proc.stdout
    saved = Results.load(out / "results.json")
    assert saved.models() == ["Sequential"]
    assert {r.mode for r in saved.rows} == {"host @1 rank", "host @rank0/2", "host @rank1/2", "host @2 ranks"}
    assert all(r.ok for r in saved.rows)


@pytest.mark.parametrize("time_s", [0.1, 2.0])  # 2 s: rank 0 still samples when torchrun stops it
def test_a_rank_that_raises_is_named_and_the_finished_rows_are_kept(user_script, monkeypatch, time_s):
    monkeypatch.setenv("USER_SCRIPT_TIME_S", str(time_s))
    out = user_script / "out"
    with pytest.raises(RankFailedError, match=r"rank 1 stopped \(exit code 1\): SystemExit: rank 1 gives up") as exc:
        gpuopt.dist.torchrun(["-m", "user_dist_script", str(out), "fail"], 2, output_dir=out, echo=False)
    assert exc.value.ranks == [1] and "rank 0" not in str(exc.value)
    assert f"rows finished so far are in {out / 'results.json'}" in str(exc.value)
    kept = Results.load(out / "results.json")
    modes = {(r.batch_size, r.mode) for r in kept.rows}
    # rank 0 alone measured both batch sizes; both ranks finished batch 1 together before rank 1 stopped
    assert {(1, "host @1 rank"), (2, "host @1 rank"), (1, "host @rank0/2"), (1, "host @rank1/2")} <= modes
    assert (2, "host @rank1/2") not in modes


def test_a_rank_that_fails_after_the_gather_leaves_rank_0s_complete_results(user_script):
    # Without the last barrier rank 1 would exit while rank 0 still writes, and torchrun would stop rank 0.
    out = user_script / "out"
    with pytest.raises(RankFailedError, match=r"rank 1 stopped \(exit code 1\): it had finished its part") as exc:
        gpuopt.dist.torchrun(["-m", "user_dist_script", str(out), "fail-after"], 2, output_dir=out, echo=False)
    assert exc.value.ranks == [1]
    assert f"rank 0 had finished: the complete results are in {out / 'results.json'}" in str(exc.value)
    saved = Results.load(out / "results.json")  # rank 0's, not the rows so far: aggregates included
    assert saved.spec["dist"]["world_size"] == 2
    assert sorted((r.batch_size, r.mode) for r in saved.rows if r.dist["role"] == "aggregate") == [
        (1, "host @2 ranks"), (2, "host @2 ranks")]
    assert len(saved.rows) == 8


def test_ctrl_c_stops_the_ranks_and_keeps_the_rows_so_far(tmp_path):
    # Every mode samples its whole 2 s (a CI it cannot reach), so the job is still running when the
    # first row appears: adaptive stopping let an idle machine finish before the signal.
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "gpuopt", "bench", "tiny-cnn", "--device", "cpu", "--gpus", "2",
                             "--configs", "fp32", "--modes", "latency", "--batch-sizes", "1,2", "--no-parity",
                             "--max-time-s", "2", "--target-rel-ci", "1e-6", "--quiet", "--output", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ,
                            # a shell's background job inherits SIGINT ignored, and Python then never
                            # raises KeyboardInterrupt: the child gets the default, as under a terminal
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    first = out / "ranks" / "rank0.jsonl"
    deadline = time.monotonic() + 240
    while not (first.exists() and first.read_text().strip()) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "interrupted; 1 cells saved" in err or "interrupted; 2 cells saved" in err, err
    kept = Results.load(out / "results.json")
    assert (1, "host @1 rank") in {(r.batch_size, r.mode) for r in kept.rows}
    for state in reports(out, 2).values():  # every worker of the job is gone
        assert not os.path.exists(f"/proc/{state['pid']}")


def test_a_runner_reads_the_idle_power_before_any_before_mode_hook_and_only_with_energy_on(monkeypatch):
    # Read at a rank's first measurement (after the hook where the ranks align), the 0.5 s idle reading
    # started ranks 1..N-1 that much after rank 0: the 4-GPU windows overlapped only 77-79%.
    import gpuopt.run.runner as runner_module
    from gpuopt.run.workload import workload
    from gpuopt.timing import nvml

    events = []
    monkeypatch.setattr(nvml, "idle_power_w", lambda index, meter=None: events.append(("idle", index)))
    monkeypatch.setattr(runner_module, "device_ceilings_for", lambda device: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "fake")
    work = workload(torch.nn.Linear(4, 4), input_shape=(4,))

    def make(device, options):
        return runner_module.Runner(work, [], ["latency"], parity=False, device=torch.device(device),
                                    measure_options=options, on_row=lambda row: None,
                                    before_mode=lambda: events.append(("hook", None)))

    make("cuda:3", {"max_time_s": 1.0}).before_mode()
    assert events == [("idle", 3), ("hook", None)]
    events.clear()
    make("cuda:1", {"energy": False})
    make("cpu", {})
    assert events == []


def test_idle_power_without_a_meter_is_none_at_once_and_cached(monkeypatch):
    import time

    from gpuopt.timing import nvml

    class Inactive:
        active = False

        def power_w(self):
            raise AssertionError("an inactive meter is not read")

    monkeypatch.setattr(nvml, "_IDLE_POWER", {})
    t = time.perf_counter()
    assert nvml.idle_power_w(5, Inactive()) is None
    assert time.perf_counter() - t < nvml.IDLE_INTERVAL_S  # no sleeping between readings that cannot come
    assert nvml._IDLE_POWER == {5: None}
