"""The optimizer's batch-size ladder against synthetic curves: which batch sizes it measures, in what order,
that it finds the largest batch size within the budgets, and the reasons it gives for the others."""

from __future__ import annotations

import random

import pytest

from gpuopt.optimizer.ladder import Ladder

BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256]


def drive(ladder: Ladder, p99=None, gb=None, oom_from=None, fail_at=None, slo=None, mem=None,
          objective="throughput"):
    """Runs ``ladder`` against curves: p99(b) ms, gb(b), out of memory from ``oom_from``; returns the
    batch sizes it asked for, in order."""
    asked = []
    while (b := ladder.next()) is not None:
        asked.append(b)
        assert len(asked) <= len(BATCHES), "the ladder asked for more batch sizes than there are"
        if fail_at == b:
            ladder.stop(f"failed at batch {b}")
            continue
        if oom_from is not None and b >= oom_from:
            ladder.record_over(b)
            continue
        t = p99(b) if p99 else 1.0 + 0.05 * b
        g = gb(b) if gb else None
        if (slo is not None and t > slo) or (mem is not None and g is not None and g > mem):
            ladder.record_over(b)
            continue
        score = -t if objective == "latency" else b / t * 1e3
        ladder.record_ok(b, score, t, g)
    assert ladder.next() is None and ladder.next() is None  # the search polls a finished ladder again
    return asked


def test_without_a_budget_it_starts_at_the_largest_batch_and_stops_where_items_per_s_fall():
    lad = Ladder(BATCHES, objective="throughput")
    asked = drive(lad, p99=lambda b: 1.0 + 0.05 * b)  # 256: 18,551/s, 128: 17,297/s (6.8% below)
    assert asked == [256, 128]
    assert "below the walk from batch 256" in lad.why_not(64) and "6.8% below batch 256" in lad.why_not(1)


def test_a_flat_curve_is_walked_until_two_batch_sizes_do_not_beat_the_best():
    asked = drive(lad := Ladder(BATCHES, objective="throughput"), p99=lambda b: 1e-3 * b)  # items/s flat
    assert asked == [256, 128, 64]
    assert "did not beat batch 256 by 3%" in lad.why_not(32)


def test_out_of_memory_at_the_top_steps_down():
    asked = drive(Ladder(BATCHES, objective="throughput"), oom_from=128)
    assert asked == [256, 128, 64, 32]


def test_a_latency_budget_climbs_as_far_as_it_allows_and_measures_less_than_every_batch():
    lad = Ladder(BATCHES, objective="throughput", slo_p99_ms=5.0)
    asked = drive(lad, p99=lambda b: 2.0 + 0.05 * b, slo=5.0)  # feasible up to 60
    # 1; then 2 (5 ms in proportion to 2.05 ms); the line through (1, 2) predicts 60, at most 8x: 16;
    # the line through (2, 16) predicts 60: 32; then 64 is over; the walk down stops at 16 (36% below)
    assert asked == [1, 2, 16, 32, 64]
    assert lad.feasible_top == BATCHES.index(32)
    assert "walk from batch 32" in lad.why_not(8)
    assert "batch 64 was already over" in lad.why_not(128)


def test_the_smallest_batch_over_the_budget_ends_the_ladder():
    lad = Ladder(BATCHES, objective="throughput", slo_p99_ms=1.0)
    assert drive(lad, slo=1.0) == [1]
    assert "batch 1 was already over" in lad.why_not(2)


def test_a_memory_budget_uses_the_memory_line():
    lad = Ladder(BATCHES, objective="throughput", memory_gb=10.0)
    asked = drive(lad, gb=lambda b: 2.0 + 0.1 * b, mem=10.0)  # fits up to 80
    assert asked[-1] == 128 and BATCHES[lad.feasible_top] == 64 and len(asked) < 8


def test_the_latency_objective_walks_up_from_the_smallest_batch():
    lad = Ladder([1, 2, 4, 8], objective="latency")
    assert drive(lad, p99=lambda b: 1.0 + 0.5 * b, objective="latency") == [1, 2]
    assert "above the walk from batch 1" in lad.why_not(4)


def test_an_upward_only_ladder_from_a_start_never_goes_below_it():
    lad = Ladder(BATCHES, objective="throughput", slo_p99_ms=5.0, start=16, descend=False)
    assert drive(lad, p99=lambda b: 6.0, slo=5.0) == [16]
    lad = Ladder(BATCHES, objective="throughput", slo_p99_ms=5.0, start=16, descend=False)
    asked = drive(lad, p99=lambda b: 1.0 + 0.02 * b, slo=5.0)  # feasible up to 200
    assert asked[0] == 16 and min(asked) == 16 and BATCHES[lad.feasible_top] == 128
    assert "where this config's search began" in lad.why_not(8)
    assert asked == [16, 32, 128, 256] and "jumped from batch 32 to 128" in lad.why_not(64)


def test_misses_of_the_host_guide_the_climb_without_counting_as_feasible():
    # A compiled config's eager twin: requests over the 10 ms SLO from batch 16 by the host's issuing (device
    # time within it up to batch 64), over by the device from 128. The climb goes on by the device time to
    # where it breaks the SLO (what the compiled config starts from); the feasible top is still searched for
    # below the first miss, and the walk does not start from a batch size that missed.
    request = {1: 4.0, 2: 4.1, 4: 4.3, 8: 6.0, 16: 10.5, 32: 11.0, 64: 12.0, 128: 14.0, 256: 25.0}
    device = {1: 1.0, 2: 1.2, 4: 1.6, 8: 2.4, 16: 4.0, 32: 6.0, 64: 9.5, 128: 14.0, 256: 25.0}
    lad = Ladder(BATCHES, objective="throughput", slo_p99_ms=10.0)
    asked = []
    while (b := lad.next()) is not None:
        asked.append(b)
        if device[b] > 10.0:
            lad.record_over(b)
        elif request[b] > 10.0:
            lad.record_probe(b, device[b])
        else:
            lad.record_ok(b, b / request[b], request[b])
    assert 128 in asked and 256 not in asked  # climbed past the host's misses to the device's
    assert {8, 16} <= set(asked) and BATCHES[lad.feasible_top] == 8  # the feasible top, bracketed below 16
    assert len(asked) <= 8 and len(set(asked)) == len(asked)  # of 9, and it learnt both tops
    for b in set(BATCHES) - set(asked):
        assert lad.why_not(b).startswith("not run")
    assert "already over the budgets" in lad.why_not(256)


def test_a_batch_predicted_over_is_named_so():
    lad = Ladder(BATCHES, objective="throughput", slo_p99_ms=5.0, start=16, descend=False)
    assert lad.next() == 16
    lad.record_ok(16, 100.0, 2.0)
    nxt = lad.next()
    lad.record_over(nxt, predicted=True)
    assert lad.next() is None
    assert f"batch {nxt} was predicted over the budgets" in lad.why_not(256)


def test_a_start_that_is_a_guess_steps_down_when_over_the_budget_there():
    # A compiled config starts where its eager twin's device time met the SLO (a guess): over it there,
    # it steps down one batch size at a time to the first that meets it, and never climbs above the start.
    lad = Ladder(BATCHES, objective="throughput", slo_p99_ms=5.0, start=64, descend=False, below_start=True)
    assert drive(lad, p99=lambda b: 1.0 + 0.2 * b, slo=5.0) == [64, 32, 16]  # 16: 4.2 ms, 32: 7.4 ms
    assert BATCHES[lad.feasible_top] == 16
    assert "the first under the budgets on the way down from batch 64" in lad.why_not(8)
    assert "already over the budgets" in lad.why_not(128)
    lad = Ladder(BATCHES, objective="throughput", slo_p99_ms=5.0, start=4, descend=False, below_start=True)
    assert drive(lad, p99=lambda b: 9.0, slo=5.0) == [4, 2, 1] and lad.feasible_top is None
    lad = Ladder(BATCHES, objective="throughput", slo_p99_ms=5.0, start=16, descend=False, below_start=True)
    assert drive(lad, p99=lambda b: 1.0 + 0.02 * b, slo=5.0)[:2] == [16, 32]  # under it at the start: climbs


@pytest.mark.parametrize("objective", ["throughput", "energy"])
def test_a_batch_over_the_budget_on_the_walk_down_ends_the_walk(objective):
    # Smaller batches score better here (p99 grows faster than the batch), so the walk down from the top
    # (16) goes on -- until a p99 blip puts batch 4 over the SLO below the top: the walk ends there, the top
    # stays 16, nothing raises.
    lad = Ladder(BATCHES, objective=objective, slo_p99_ms=5.0)
    asked = drive(lad, p99=lambda b: 9.0 if b == 4 else 0.1 * b ** 1.2, slo=5.0, objective=objective)
    assert asked == [1, 8, 16, 32, 4]
    assert BATCHES[lad.feasible_top] == 16 and lad.lowest_over == BATCHES.index(32)
    assert "batch 4 did not run within the budgets" in lad.why_not(2)


def test_a_batch_over_the_budget_on_the_latency_walk_up_ends_it():
    lad = Ladder([1, 2, 4], objective="latency", slo_p99_ms=3.0)
    asked = drive(lad, p99=lambda b: 1.0 if b == 1 else 1.02 if b == 2 else 9.0, slo=3.0, objective="latency")
    assert asked == [1, 2, 4] and lad.feasible_top == 0


def test_past_the_first_over_it_searches_by_halves():
    dense = list(range(1, 129))
    lad = Ladder(dense, objective="throughput", slo_p99_ms=5.0)
    asked = []
    while (b := lad.next()) is not None:
        asked.append(b)
        t = 0.5 + b / 20 + max(0, b - 60) ** 2  # linear, then steep past 60: feasible up to 61
        if t > 5.0:
            lad.record_over(b)
        else:
            lad.record_ok(b, b / t, t)
    assert dense[lad.feasible_top] == 61
    assert len(asked) <= 16  # an ascending scan takes 62


def test_a_failure_stops_the_ladder_and_is_the_reason_for_the_rest():
    lad = Ladder(BATCHES, objective="throughput")
    assert drive(lad, fail_at=128) == [256, 128]
    assert lad.next() is None and "failed at batch 128" in lad.why_not(64)


def test_bad_arguments():
    with pytest.raises(ValueError, match="start=3 is not one of the batch sizes"):
        Ladder(BATCHES, objective="throughput", start=3)
    lad = Ladder(BATCHES, objective="throughput")
    with pytest.raises(ValueError, match="batch 4 was not handed out"):
        lad.record_ok(4, 1.0)


@pytest.mark.parametrize("seed", range(40))
def test_on_random_affine_latencies_it_finds_the_largest_feasible_batch_in_fewer_steps(seed):
    rng = random.Random(seed)
    a, c = rng.uniform(0.2, 5.0), rng.uniform(1e-3, 1.0)
    slo = rng.uniform(0.5, 20.0)
    lad = Ladder(BATCHES, objective="throughput", slo_p99_ms=slo)
    asked = drive(lad, p99=lambda b: a + c * b, slo=slo)
    feasible = [b for b in BATCHES if a + c * b <= slo]
    assert len(asked) == len(set(asked))
    if not feasible:
        assert asked == [1] and lad.feasible_top is None
        return
    assert BATCHES[lad.feasible_top] == max(feasible)  # items/s grows with the batch here: the best
    ascending = len(feasible) + (1 if max(feasible) < BATCHES[-1] else 0)  # every batch up to the first over
    assert len(asked) <= ascending + 1
