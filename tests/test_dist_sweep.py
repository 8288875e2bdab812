"""A sweep spread over ranks on the CPU (gloo): gpuopt's launcher, resume from the ranks' cells files,
two "machines" (two torchrun launches sharing a rendezvous) with folders of their own, a rank that
stops, and the shares."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

import gpuopt
from gpuopt import Results
from gpuopt.cli import main
from gpuopt.dist import RankFailedError
from gpuopt.dist.sweep import cost, work_items
from gpuopt.report.results import read_cells

SPEC = {"models": ["tiny-cnn"], "configs": ["fp32", "bf16-amp"], "batch_sizes": [1, 2], "modes": ["host"],
        "parity": False, "device": "cpu", "measure": {"max_time_s": 0.05, "min_time_s": 0.0}}
CELLS = {("tiny-cnn", c, b, "host") for c in ("fp32", "bf16-amp") for b in (1, 2)}


@pytest.fixture(autouse=True)
def _short_timeouts(monkeypatch):
    monkeypatch.setenv("GPUOPT_DIST_TIMEOUT_S", "60")


@pytest.fixture
def spec(tmp_path):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(SPEC))
    return path


def test_work_items_group_a_models_configs_at_a_batch_size_when_there_are_enough_pieces():
    from gpuopt.run.sweeps import SweepUnit

    a, b = object(), object()
    units = [SweepUnit(m, batch, c) for m in (a, b) for batch in (1, 32) for c in ("fp32", "fp16", "bf16")]
    costs = lambda pieces: [sum(cost(units[i], ["latency"]) for i in p) for p in pieces]  # noqa: E731
    # Four groups, enough for two ranks: whole, largest first, ties in the units' order.
    two = work_items(units, ["latency"], 2)
    assert two == [[3, 4, 5], [9, 10, 11], [0, 1, 2], [6, 7, 8]] == work_items(units, ["latency"], 1)
    assert costs(two) == sorted(costs(two), reverse=True)
    # Fewer than two groups per rank: single units, so every rank gets work; still largest first.
    three = work_items(units, ["latency"], 3)
    assert sorted(i for piece in three for i in piece) == list(range(12)) and all(len(p) == 1 for p in three)
    assert [units[p[0]].batch for p in three] == [32] * 6 + [1] * 6
    # Training counts three passes: a batch of 8 trained outweighs a batch of 16 timed once.
    assert cost(SweepUnit(a, 8, "fp32"), ["train"]) > cost(SweepUnit(a, 16, "fp32"), ["latency"])
    with pytest.raises(ValueError, match="world_size"):
        work_items(units, ["latency"], 0)


def _progress(store, rank: int, world: int):
    from gpuopt.dist.sweep import _Progress

    p = _Progress.__new__(_Progress)  # the store of a job without starting one
    p.store, p.rank, p.world, p.cells, p.started = store, rank, world, 0, False
    return p


def test_rank_r_starts_with_piece_r_then_the_queue_hands_each_piece_out_once():
    import torch.distributed as dist

    store = dist.HashStore()
    r0, r1 = _progress(store, 0, 2), _progress(store, 1, 2)
    assert [r1.take(5), r0.take(5)] == [1, 0]  # the first round by rank, whoever comes first
    assert [r1.take(5), r1.take(5), r0.take(5), r0.take(5), r1.take(5)] == [2, 3, 4, None, None]
    assert _progress(dist.HashStore(), 3, 4).take(2) is None  # more ranks than pieces: idle


def test_once_a_rank_says_it_failed_the_others_take_no_more_pieces():
    import torch.distributed as dist

    store = dist.HashStore()
    r0, r1 = _progress(store, 0, 2), _progress(store, 1, 2)
    assert r0.take(10) == 0
    r1.set("failed", "RuntimeError: boom")
    assert r0.take(10) is None  # it goes on to wait_all, which names rank 1


def _keys(path) -> list:
    return [r.key for r in read_cells(path)]


def test_two_ranks_share_the_cells_and_rank_0_merges_them_once(spec, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["sweep", str(spec), "--output", str(out), "--gpus", "2", "--quiet"]) == 0
    results = Results.load(out / "results.json")
    assert {r.key for r in results.rows} == CELLS and len(results.rows) == len(CELLS) and not results.failed
    shares = results.spec["dist"]["shares"]
    assert results.spec["dist"]["world_size"] == 2 and sorted(set(shares.values())) == [0, 1] and len(shares) == 4
    ranks = [set(_keys(out / f"cells-rank{r}.jsonl")) for r in (0, 1)]
    assert ranks[0] | ranks[1] == CELLS and not ranks[0] & ranks[1]
    # What each rank took from the queue is what it measured, and its busy time is recorded.
    stats = results.spec["dist"]["ranks"]
    assert [s["rank"] for s in stats] == [0, 1] and [s["cells"] for s in stats] == [len(x) for x in ranks]
    assert sum(s["units"] for s in stats) == 4 and all(0 <= s["busy_s"] <= s["end_s"] for s in stats)
    assert sum(v == 1 for v in shares.values()) == len(ranks[1])
    assert sorted(_keys(out / "cells.jsonl")) == sorted(CELLS)  # merged: every cell once
    assert "4 cells, 0 failed" in capsys.readouterr().out

    # Resume: rank 1's file is gone and nothing was merged; rank 0's cells are kept, not measured again.
    kept = {r.key: r.measurement.samples_ms for r in read_cells(out / "cells-rank0.jsonl")}
    assert 0 < len(kept) < len(CELLS)  # each rank started with a piece of its own
    for name in ("cells-rank1.jsonl", "cells.jsonl", "results.json"):
        (out / name).unlink()
    assert main(["sweep", str(spec), "--output", str(out), "--gpus", "2", "--quiet"]) == 0
    again = Results.load(out / "results.json")
    assert {r.key for r in again.rows} == CELLS and len(again.rows) == len(CELLS)
    for key, samples in kept.items():
        assert again.find(*key).measurement.samples_ms == samples
    lines = [line for r in (0, 1) for line in (out / f"cells-rank{r}.jsonl").read_text().splitlines()]
    assert len(lines) == len(CELLS)  # only rank 1's lost cells were measured again, each once


def test_more_ranks_than_units_leave_some_idle(tmp_path):
    results = gpuopt.sweep({**SPEC, "configs": ["fp32"], "batch_sizes": [1]}, tmp_path / "out", devices=2,
                           progress=False)
    assert [r.key for r in results.rows] == [("tiny-cnn", "fp32", 1, "host")]
    assert _keys(tmp_path / "out" / "cells-rank1.jsonl") == []  # one piece: rank 0's
    assert [s["units"] for s in results.spec["dist"]["ranks"]] == [1, 0]


def test_a_models_configs_at_a_batch_size_go_to_one_rank_when_there_are_enough_of_them(tmp_path):
    spec = {**SPEC, "batch_sizes": [1, 2, 3, 4]}  # 4 groups of 2 configs over 2 ranks: grouped
    results = gpuopt.sweep(spec, tmp_path / "out", devices=2, progress=False)
    assert len(results.rows) == 8 and not results.failed
    d = results.spec["dist"]
    assert d["pieces"] == 4  # one per batch size, its two configs together
    assert sum(s["units"] for s in d["ranks"]) == 8 and sorted(d["shares"]) == sorted(
        f"tiny-cnn b{b} {c}" for b in (1, 2, 3, 4) for c in ("fp32", "bf16-amp"))
    for b in (1, 2, 3, 4):  # a whole piece: both configs on the rank that took it
        assert d["shares"][f"tiny-cnn b{b} fp32"] == d["shares"][f"tiny-cnn b{b} bf16-amp"]
    assert d["shares"]["tiny-cnn b4 fp32"] == 0 and d["shares"]["tiny-cnn b3 fp32"] == 1  # the first round


def test_a_rank_stopped_by_another_ranks_failure_says_aborted_not_failed(tmp_path, monkeypatch):
    # A rank that finished its share first learns of the failure while waiting (RankFailedError) and
    # exits 1 before torchrun stops it: its file must say "aborted", so the blame spares it.
    from gpuopt.dist import sweep as dist_sweep
    from gpuopt.dist.worker import reports
    from gpuopt.run.sweeps import plan_sweep

    port = _free_port()
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(name, value)

    def other_rank_failed(*args):
        raise RankFailedError("rank 1 (on here) stopped: IsADirectoryError", [1])

    monkeypatch.setattr(dist_sweep, "_share", other_rank_failed)
    plan = plan_sweep(SPEC, tmp_path / "out", progress=False)
    with pytest.raises(RankFailedError, match="rank 1"):
        dist_sweep.run_rank(plan)
    state = reports(tmp_path / "out", 1)[0]
    assert state["state"] == "aborted" and "rank 1" in state["error"]


def test_a_rank_that_stops_is_named_and_the_finished_cells_are_kept(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "cells-rank1.jsonl").mkdir()  # rank 1 cannot open its cells file
    # Its exit code shows unless rank 0, aborting on its report, exited first and torchrun stopped it.
    with pytest.raises(RankFailedError, match=r"rank 1 stopped( \(exit code 1\))?: IsADirectoryError") as exc:
        gpuopt.sweep(SPEC, out, devices=2, progress=False)
    assert exc.value.ranks == [1]
    kept = Results.load(out / "results.json")  # whatever rank 0 finished before the job stopped
    assert {r.key for r in kept.rows} <= CELLS


@pytest.mark.parametrize(("args", "message"), [
    (["--gpus", "2"], "asks for GPUs and 0 are visible; for ranks on the CPU give device = 'cpu'"),
    (["--gpus", "0"], "devices must be at least 1"),
])
def test_sweep_gpus_usage_errors_exit_2(args, message, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 0)  # a machine without a GPU, on a GPU machine too
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({k: v for k, v in SPEC.items() if k != "device"} if args == ["--gpus", "2"] else SPEC))
    with pytest.raises(SystemExit) as exc:
        main(["sweep", str(spec), "--output", str(tmp_path / "out"), *args])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_no_resume_inside_a_torchrun_job_is_refused(spec, tmp_path, capsys, monkeypatch):
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exc:
        main(["sweep", str(spec), "--output", str(tmp_path / "out"), "--no-resume"])
    assert exc.value.code == 2
    assert "--no-resume) is refused inside a torchrun job" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_two_machines_with_folders_of_their_own_merge_every_cell_once(spec, tmp_path):
    port = _free_port()
    procs = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}", "--rdzv-id", "two-nodes",
               "--max-restarts", "0", "-m", "gpuopt", "sweep", str(spec), "--output", str(tmp_path / f"node{node}")]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=os.environ))
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(logs)
    merged = [n for n in (0, 1) if (tmp_path / f"node{n}" / "results.json").exists()]
    assert len(merged) == 1, logs  # rank 0's machine
    results = Results.load(tmp_path / f"node{merged[0]}" / "results.json")
    assert sorted(r.key for r in results.rows) == sorted(CELLS)  # every cell once, from both machines
    other = tmp_path / f"node{1 - merged[0]}"
    theirs = _keys(next(other.glob("cells-rank*.jsonl")))
    assert theirs  # the other machine measured its share there (it started with a piece of its own)
    shares = results.spec["dist"]["shares"]
    assert sorted(theirs) == sorted(k for k in CELLS if shares[f"tiny-cnn b{k[2]} {k[1]}"] == 1)
    assert (other / "sweep.json").exists()  # and can resume from its folder
    assert sorted(_keys(tmp_path / f"node{merged[0]}" / "cells.jsonl")) == sorted(CELLS)
