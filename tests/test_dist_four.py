"""Four ranks on the CPU (gloo): the code paths for any N that a 4- or 8-GPU machine takes -- replicas with
per-rank rows and an aggregate over four, and a sweep sharded over four ranks whose merged cells equal a
one-process sweep's (none lost, none twice)."""

from __future__ import annotations

import numpy as np
import pytest

import gpuopt
from gpuopt.report.results import read_cells

FAST = {"max_time_s": 0.05, "min_time_s": 0.0}


@pytest.fixture(autouse=True)
def _short_timeouts(monkeypatch):
    monkeypatch.setenv("GPUOPT_DIST_TIMEOUT_S", "90")


def test_four_replicas_give_four_rank_rows_and_one_aggregate(tmp_path):
    r = gpuopt.benchmark("tiny-cnn", batch_sizes=[2], devices=4, device="cpu", output_dir=str(tmp_path / "out"),
                         progress=False, parity=False, **FAST)
    assert not r.failed
    assert r.modes() == ["host @1 rank", "host @rank0/4", "host @rank1/4", "host @rank2/4", "host @rank3/4",
                         "host @4 ranks"]
    assert r.spec["dist"]["world_size"] == 4
    ranks = [r.find("tiny-cnn", "fp32", 2, f"host @rank{i}/4") for i in range(4)]
    agg = r.find("tiny-cnn", "fp32", 2, "host @4 ranks")
    assert [x.dist["rank"] for x in ranks] == [0, 1, 2, 3]
    assert agg.throughput_items_per_s == pytest.approx(sum(x.throughput_items_per_s for x in ranks))
    assert agg.measurement.n == sum(x.measurement.n for x in ranks)
    single = r.find("tiny-cnn", "fp32", 2, "host @1 rank")
    assert agg.dist["scaling_efficiency"] == pytest.approx(agg.throughput_items_per_s / (4 * single.throughput_items_per_s))


SPEC = {"models": ["tiny-cnn", "tiny-transformer"], "configs": ["fp32", "bf16-amp"], "batch_sizes": [1, 2, 4],
        "modes": ["host"], "parity": False, "device": "cpu", "measure": FAST}


def test_a_sweep_over_four_ranks_has_exactly_the_cells_of_one_process(tmp_path):
    one = gpuopt.sweep(SPEC, tmp_path / "one", progress=False)
    four = gpuopt.sweep(SPEC, tmp_path / "four", devices=4, progress=False)
    keys_one, keys_four = [row.key for row in one.rows], [row.key for row in four.rows]
    assert len(keys_one) == 12 and sorted(keys_four) == sorted(keys_one) and len(set(keys_four)) == len(keys_four)
    shares = four.spec["dist"]["shares"]
    assert len(shares) == 12 and sorted(set(shares.values())) == [0, 1, 2, 3]  # each rank started with a piece
    per_rank = [[c.key for c in read_cells(tmp_path / "four" / f"cells-rank{r}.jsonl")] for r in range(4)]
    assert sorted(k for cells in per_rank for k in cells) == sorted(keys_one)  # each cell once, on one rank
    assert [sum(v == r for v in shares.values()) for r in range(4)] == [len(c) for c in per_rank]
    assert all(np.isfinite(row.measurement.p50) for row in four.rows)
