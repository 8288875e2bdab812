"""The split-batch strategy (``benchmark(devices=..., strategy="split")``): per cell, one global batch
held by rank 0 (on its GPU) is scattered to every rank -- rank 0 keeps its own share --, each rank runs
its share through the prepared model, and the outputs are gathered back to rank 0 into one global
output. Every rank prepares the config at the per-rank batch (global batch / world size).

Rank 0 times whole iterations with gpuopt's engine in host mode: an iteration is a Python callable
(command, scatter, forward, gather) followed by a device synchronize, so the row's throughput is the
global batch over the median iteration, end to end. The phases come from the same iterations: a
:class:`gpuopt._C.StepClock` (CUDA events on rank 0's stream; the host clock on the CPU) marks the end
of the scatter, of the forward and of the gather, and the row reports their medians -- ``scatter_ms``,
``compute_ms``, ``gather_ms`` -- and ``compute_share`` = compute_ms / median iteration. Rank 0's gather
includes waiting for the slowest rank; each rank's own forward time is in ``compute_ms_per_rank``.

The other ranks follow rank 0: each iteration starts with a broadcast of a one-element command (run or
stop), so rank 0's engine alone decides when warm-up and sampling end, and the ranks stop with it. The
command is part of the timed scatter phase. A rank whose preparation fails (out of memory, a compile
error) makes the cell a failed row naming it -- the ranks agree before the first iteration; an error
during the iterations leaves the collectives out of step, so that rank raises and the job stops."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from .._ext import _C
from ..prepare.config import Config, Prepared
from ..report.results import Row, dist_mode
from ..timing.inputs import tensors_in
from ..timing.measurement import Measurement, measure

if TYPE_CHECKING:
    from ..run.bench import BenchmarkPlan

_RUN, _STOP = 1, 0
_PHASES = ("scatter", "compute", "gather")


def check_batches(batch_sizes: list[int], world_size: int) -> None:
    """ValueError naming batch_sizes and the world size when a global batch does not split evenly."""
    bad = [b for b in batch_sizes if b % world_size]
    if bad:
        raise ValueError(f"batch_sizes={batch_sizes}: with strategy='split' each is the global batch, split evenly "
                         f"over the {world_size} ranks (the world size); {bad} "
                         f"{'is' if len(bad) == 1 else 'are'} not divisible by {world_size}")


def flat(t: torch.Tensor) -> torch.Tensor:
    """A 1-D view of all of ``t``'s memory, for a tensor laid out densely with the batch outermost
    (contiguous, or channels-last): a rank's share of a batch is then one block of it.

    >>> flat(torch.arange(6.0).reshape(2, 3)).tolist()
    [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    """
    formats = [torch.contiguous_format] + ([torch.channels_last] if t.dim() == 4 else []) + (
        [torch.channels_last_3d] if t.dim() == 5 else [])
    if not any(t.is_contiguous(memory_format=f) for f in formats):
        raise ValueError(f"a tensor of shape {tuple(t.shape)} and strides {t.stride()} is neither contiguous nor "
                         "channels-last: its batch cannot be split into blocks")
    return t.as_strided((t.numel(),), (1,), t.storage_offset())


def _blocks(t: torch.Tensor, parts: int) -> list[torch.Tensor]:
    """``t``'s memory as ``parts`` equal blocks along the batch (views, no copy)."""
    whole, size = flat(t), t.numel() // parts
    return [whole[i * size:(i + 1) * size] for i in range(parts)]


def _format(t: torch.Tensor) -> torch.memory_format:
    if t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    if t.dim() == 5 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last_3d):
        return torch.channels_last_3d
    return torch.contiguous_format


@dataclass
class SplitStep:
    """One rank's part of the split iterations of a cell, set up by :meth:`prepare`: the prepared
    model bound to the tensors it reads (which the scatter fills), and on rank 0 the global batch cut
    into the ranks' shares and the global output the gather fills (``outputs``)."""

    rank: int
    world: int
    device: torch.device
    run: Callable[[], Any]
    receive: list[torch.Tensor]  # flat views of the batched tensors the model reads
    shares: list[list[torch.Tensor]] | None = None  # rank 0: per batched input, each rank's block of the global one
    outputs: list[torch.Tensor] | None = None  # rank 0: the gathered global outputs
    output_blocks: list[list[torch.Tensor]] | None = None  # rank 0: per output, each rank's block of it
    keep: list[Any] = field(default_factory=list)  # what the bound callable and the views need alive

    @classmethod
    def prepare(cls, prepared: Prepared, local_inputs: Any, global_inputs: Any, *, rank: int, world: int,
                batch: int) -> SplitStep:
        """Bind ``prepared`` to ``local_inputs`` (a share's worth, ``batch // world``) and, on rank 0,
        cut ``global_inputs`` (the global batch) into the ranks' shares; ValueError when the inputs or
        outputs cannot be split along the batch."""
        shard = batch // world
        run, bound = prepared.bound(local_inputs)
        local = tensors_in(bound)
        if rank == 0:
            whole = tensors_in(prepared.convert_inputs(global_inputs))
            if len(whole) != len(local):
                raise ValueError(f"the inputs at batch {batch} hold {len(whole)} tensors, at batch {shard} "
                                 f"{len(local)}: cannot split them")
            pairs = [(mine, g) for mine, g in zip(local, whole, strict=True) if g.dim() > 0 and g.shape[0] == batch]
            for mine, g in pairs:
                if (mine.shape[0], mine.shape[1:], mine.dtype, mine.stride()[1:]) != (shard, g.shape[1:], g.dtype,
                                                                                    g.stride()[1:]):
                    raise ValueError(f"an input of the global batch ({tuple(g.shape)}, {g.dtype}) and of one rank's "
                                     f"share ({tuple(mine.shape)}, {mine.dtype}) differ beyond the batch")
            batched = [mine for mine, _ in pairs]
            shares = [_blocks(g, world) for _, g in pairs]
            keep = [whole]
        else:
            batched = [t for t in local if t.dim() > 0 and t.shape[0] == shard]
            shares, keep = None, []
        if not batched:
            raise ValueError("the inputs hold no tensor with a batch dimension to split")
        step = cls(rank, world, prepared.device, run, [flat(t) for t in batched], shares, keep=[prepared, bound, *keep])
        out = tensors_in(run())
        bad = [tuple(t.shape) for t in out if t.dim() == 0 or t.shape[0] != shard]
        if not out or bad:
            raise ValueError(f"the model's outputs must each hold the batch ({shard}) in their first dimension to be "
                             f"gathered; got shapes {bad or 'none'}")
        for t in out:
            flat(t)  # a layout that can be gathered
        if rank == 0:
            step.outputs = [torch.empty((batch, *t.shape[1:]), dtype=t.dtype, device=t.device,
                                        memory_format=_format(t)) for t in out]
            step.output_blocks = [_blocks(t, world) for t in step.outputs]
        return step

    def iteration(self, clock: Any, command: torch.Tensor) -> bool:
        """One iteration on this rank: the command (rank 0 sends it, the others read it: False when it
        says stop), scatter, forward, gather; ``clock`` (a StepClock) begins before the command and gets
        a mark after each phase."""
        clock.begin()
        dist.broadcast(command, src=0)
        if self.rank != 0 and int(command.item()) == _STOP:
            return False
        for i, buf in enumerate(self.receive):
            dist.scatter(buf, self.shares[i] if self.shares is not None else None, src=0)
        clock.mark()
        out = tensors_in(self.run())
        clock.mark()
        for i, t in enumerate(out):
            dist.gather(flat(t), self.output_blocks[i] if self.output_blocks is not None else None, dst=0)
        clock.mark()
        return True


def _phase_times(clock: Any, n: int) -> dict[str, list[float]]:
    """The phases of the last ``n`` iterations a clock timed (the samples; those before warmed up)."""
    times = clock.requests()
    gaps = times["itl_ms"]  # the marks' gaps, pooled: compute, gather, compute, gather, ...
    return {"scatter": list(times["ttft_ms"][-n:]), "compute": list(gaps[0::2][-n:]), "gather": list(gaps[1::2][-n:])}


def _clock(device: torch.device) -> Any:
    return _C.StepClock(device.index if device.type == "cuda" else -1, len(_PHASES))


def lead(step: SplitStep, label: str, options: dict[str, Any]) -> tuple[Measurement, dict[str, Measurement]]:
    """Rank 0: time the split iterations with gpuopt's engine (host mode: each iteration, then a device
    synchronize), then tell the ranks to stop. Returns the iterations' Measurement and one Measurement
    per phase (scatter, compute, gather) of the sampled iterations. An exception leaves the ranks
    inside an iteration: no stop is sent, and the job is to end."""
    clock = _clock(step.device)
    command = torch.full((1,), _RUN, dtype=torch.int32, device=step.device)
    m = measure(lambda: step.iteration(clock, command), mode="host", device=step.device, label=label, **options)
    command.fill_(_STOP)
    dist.broadcast(command, src=0)
    return m, {name: Measurement.from_samples(v, mode="host") for name, v in _phase_times(clock, m.n).items()}


def follow(step: SplitStep) -> Any:
    """A rank other than 0: iterations until rank 0 says stop; returns the clock that timed them."""
    clock = _clock(step.device)
    command = torch.empty(1, dtype=torch.int32, device=step.device)
    while step.iteration(clock, command):
        pass
    return clock


def run_cell(plan: BenchmarkPlan, config: Config, batch: int, base: Row | None, group: Any,
             device: torch.device) -> Row | None:
    """One cell of the split strategy on every rank (collective): rank 0 returns its row, the others
    None. ``base``: rank 0's row of the cell alone at the global batch (its failure skips the cell)."""
    rank, world = group.rank, group.world
    shard = batch // world
    work = plan.work
    where = {"model": work.name, "config": config.label, "batch_size": batch, "mode": dist_mode("host", "split", world)}
    facts = {"precision": config.precision, "items_per_call": batch, "item_unit": work.item_unit,
             "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
    if base is not None:
        facts.update({k: getattr(base, k) for k in ("flops_per_item", "bytes_per_item_min", "bytes_per_item_max")})
    info: dict[str, Any] = {"role": "split", "strategy": "split", "mode": "host", "world_size": world,
                            "ranks": list(range(world)), "global_batch": batch, "shard_batch": shard}
    # Rank 0 alone decided whether the config runs at all (preparation, parity): every rank learns it first.
    skip = [None if base is None or base.ok else f"rank 0 alone failed, so the split did not run: {base.error}"]
    group._run("sharing rank 0's baseline outcome", lambda: dist.broadcast_object_list(skip, src=0))
    if skip[0] is not None:
        return Row.failed(skip[0], **where, **facts, dist=info) if rank == 0 else None
    step, error, prepared = None, None, None
    try:
        prepared = config.apply(plan.work.model, work.inputs(shard), device=device)
        if not prepared.ok:
            raise RuntimeError(prepared.error)
        step = SplitStep.prepare(prepared, work.inputs(shard), work.inputs(batch) if rank == 0 else None,
                                 rank=rank, world=world, batch=batch)
    except Exception as exc:  # noqa: BLE001 - the ranks agree below and the cell is a failed row
        error = f"{type(exc).__name__}: {exc}"
    errors = [None] * world
    group._run("agreeing that every rank prepared the cell", lambda: dist.all_gather_object(errors, error))
    failed = [(r, e) for r, e in enumerate(errors) if e is not None]
    if failed:
        del step, prepared
        _release(device)
        if rank != 0:
            return None
        return Row.failed("; ".join(f"rank {r}: {e}" for r, e in failed), **where, **facts, dist=info)
    label = f"{work.name} b{batch} {config.label} split over {world}"
    t0 = time.perf_counter()
    n: list[int | None] = [None]
    if rank == 0:
        m, phases = group._run("the split iterations", lambda: lead(step, label, plan.measure_options))
        n[0], own = m.n, phases["compute"].p50
        group._run("sending the number of sampled iterations", lambda: dist.broadcast_object_list(n, src=0))
    else:
        clock = group._run("the split iterations", lambda: follow(step))
        group._run("sending the number of sampled iterations", lambda: dist.broadcast_object_list(n, src=0))
        own = Measurement.from_samples(_phase_times(clock, n[0])["compute"], mode="host").p50
    per_rank = [None] * world if rank == 0 else None
    group._run("gathering the ranks' forward times", lambda: dist.gather_object(own, per_rank, dst=0))
    elapsed = time.perf_counter() - t0
    prepare_s, first_call_ms = prepared.prepare_s, prepared.first_call_ms
    del step, prepared
    _release(device)
    if rank != 0:
        return None
    info.update({f"{name}_ms": phases[name].p50 for name in _PHASES})
    info.update(phases_ms={name: {"p50": p.p50, "p99": p.p99} for name, p in phases.items()},
                compute_share=phases["compute"].p50 / m.p50 if m.p50 > 0 else None, compute_ms_per_rank=per_rank,
                elapsed_s=elapsed)
    if base is not None and base.ok and base.throughput_items_per_s:
        speedup = m.per_second(batch) / base.throughput_items_per_s
        info.update(single_items_per_s=base.throughput_items_per_s, speedup_vs_single=speedup,
                    scaling_efficiency=speedup / world)
    return Row.measured(m, **where, **facts, prepare_s=prepare_s, first_call_ms=first_call_ms, dist=info)


def _release(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
