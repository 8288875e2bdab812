"""What the ranks of a distributed benchmark add up to -- pure functions of their rows.

Latency percentiles come from the pooled raw samples of every rank (gpuopt's C++ statistics on the
concatenation; percentiles of percentiles are never averaged). Throughput is the sum of the ranks'
throughputs (each its batch size over its median latency); the scaling efficiency divides it by N
times one device measured alone in the same job. The ranks start each cell together, but preparation,
parity and warm-up come before sampling, so their sampling windows overlap only mostly: the aggregate
says for how long they all sampled at once (``common_interval_s``, ``overlap``) and warns below
``MIN_OVERLAP``, where the sum partly adds rates that did not run concurrently.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..report.results import Row, dist_mode
from ..timing.measurement import Measurement

# Below this share of the longest sampling window measured by all ranks at once, the aggregate is
# partly a sum of rates that did not run concurrently: the row says so.
MIN_OVERLAP = 0.8


def pooled(measurements: Sequence[Measurement]) -> Measurement:
    """One Measurement of the raw samples of every rank, concatenated (rank 0's first).

    >>> a, b = Measurement.from_samples([1.0, 2.0]), Measurement.from_samples([3.0, 4.0])
    >>> pooled([a, b]).p50
    2.5
    """
    if not measurements:
        raise ValueError("pooled() needs the measurement of at least one rank")
    modes = {m.mode for m in measurements}
    if len(modes) != 1:
        raise ValueError(f"the ranks measured in different modes ({', '.join(sorted(modes))}); cannot pool them")
    first = measurements[0]
    return Measurement.from_samples(
        [x for m in measurements for x in m.samples_ms], enqueue_ms=[x for m in measurements for x in m.enqueue_ms],
        mode=first.mode, target_rel_ci=first.target_rel_ci, confidence=first.ci_requested,
        target_met=all(m.target_met for m in measurements),
        stop_reason=" / ".join(sorted({m.stop_reason for m in measurements})), label=first.label,
        calls_per_sample=first.calls_per_sample, warmup_s=max(m.warmup_s for m in measurements),
        sampling_s=max(m.sampling_s for m in measurements))


def common_interval(windows: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """``(seconds, share)``: how long every rank sampled at once -- the intersection of the
    ``(start, end)`` windows, on a clock the ranks share -- and that as a share of the longest window.

    >>> common_interval([(0.0, 1.0), (0.2, 1.1)])
    (0.8, 0.7272727272727273)
    """
    if not windows:
        raise ValueError("common_interval() needs at least one window")
    start, end = max(w[0] for w in windows), min(w[1] for w in windows)
    longest = max(w[1] - w[0] for w in windows)
    both = max(0.0, end - start)
    return both, (both / longest if longest > 0 else 0.0)


def scaling_efficiency(aggregate_items_per_s: float, single_items_per_s: float, world_size: int) -> float:
    """``aggregate / (world_size x single)``: 1.0 is perfect scaling.

    >>> scaling_efficiency(390.0, 100.0, 4)
    0.975
    """
    if world_size < 1 or single_items_per_s <= 0:
        raise ValueError(f"scaling_efficiency needs world_size >= 1 and a positive single-device throughput, "
                         f"got {world_size} and {single_items_per_s}")
    return aggregate_items_per_s / (world_size * single_items_per_s)


def aggregate_row(ranks: Sequence[Row], single: Row | None = None) -> Row:
    """The aggregate of one cell over all ranks (``ranks`` in rank order, their ``dist`` windows set):
    pooled latency percentiles, summed throughput, the windows' overlap and, with the ``single`` row of
    rank 0 alone, the scaling efficiency. A cell that failed on some rank is a failed row naming it."""
    world = len(ranks)
    first = ranks[0]
    base_mode = first.dist["mode"]
    where = {"model": first.model, "config": first.config, "batch_size": first.batch_size,
             "mode": dist_mode(base_mode, "aggregate", world)}
    facts = {"precision": first.precision, "device": first.device, "item_unit": first.item_unit,
             "items_per_call": first.items_per_call, "flops_per_item": first.flops_per_item,
             "bytes_per_item_min": first.bytes_per_item_min, "bytes_per_item_max": first.bytes_per_item_max}
    info = {"role": "aggregate", "mode": base_mode, "world_size": world, "ranks": [r.dist["rank"] for r in ranks]}
    failed = [r for r in ranks if not r.ok or r.measurement is None]
    if failed:
        reason = "; ".join(f"rank {r.dist['rank']}: {r.error or 'no measurement'}" for r in failed)
        return Row.failed(reason, **where, **facts, dist=info)
    per_rank = [r.throughput_items_per_s or 0.0 for r in ranks]
    total = sum(per_rank)
    seconds, share = common_interval([tuple(r.dist["window_s"]) for r in ranks])
    info.update(throughput_per_rank=per_rank, common_interval_s=seconds, overlap=share,
                pooled_samples=sum(r.measurement.n for r in ranks))
    warnings = []  # the ranks' own warnings stay on their rows
    if share < MIN_OVERLAP:
        warnings.append(f"the ranks sampled at once for {seconds:.3g} s, {share:.0%} of the longest window: the "
                        "summed throughput partly adds rates that did not run concurrently")
    if single is not None and single.ok and single.throughput_items_per_s:
        info.update(single_items_per_s=single.throughput_items_per_s,
                    scaling_efficiency=scaling_efficiency(total, single.throughput_items_per_s, world))
    row = Row.measured(pooled([r.measurement for r in ranks]), **where, **facts, dist=info)
    return replace(row, throughput_items_per_s=total, warnings=row.warnings + warnings)
