"""``gpuopt sweep SPEC --gpus N`` / ``sweep(..., devices=...)``: a sweep's cells spread over one process
per device, started by torchrun -- gpuopt's launcher, or the user's own (several machines too:
``torchrun --nnodes 2 ... -m gpuopt sweep SPEC --output DIR`` on each).

Each rank measures its share of the cells on its own device, exactly as a one-device sweep would, and
appends every finished cell to its own ``DIR/cells-rank<R>.jsonl`` (flushed, fsynced). The shares are
taken, not fixed: the work not yet measured is cut into pieces (:func:`work_items`) -- a model's configs
at one batch size together, since they share the model and its FP32 reference, where there are at
least two such pieces per rank, else single units (a config at a batch size, all its modes); a section
cell alone -- and queued largest first by a cost proxy (batch size x modes, plus a fixed share for
preparing the config). Rank R starts with piece R; after that each rank takes the next piece from the
job's TCP store (an atomic counter) whenever it is free, so a piece that takes longer than its proxy
said delays only its own rank, and no rank idles while the others work through a share fixed by a
guess. Once a rank says it failed, the others take no more pieces. Which rank measured what is
recorded (``results.spec["dist"]["shares"]``, each rank's busy time under ``ranks``). More ranks than
pieces: the others idle.

Resume works per cell: the ranks pool the cells every one of them can read (``cells.jsonl`` and every
``cells-rank*.jsonl`` of its folder; checked against ``sweep.json``'s fingerprint as a one-device sweep
does) and share out only the rest. When all ranks are done, the ranks send rank 0 the cells it cannot
read (machines without a shared folder) and rank 0 writes the merged ``cells.jsonl`` and the results.

The coordination is gloo (objects, whatever the devices). Between the start and the merge the ranks
meet only in the job's TCP store (torchrun's): they take pieces from its queue and report their
progress there, and a rank that finds the queue empty waits there for the others -- at most
``GPUOPT_DIST_TIMEOUT_S`` without any of them finishing a cell, and not at all once one says it failed:
RankFailedError naming it (its finished cells stay in its file; rerunning the command resumes)."""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import socket
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from .._checks import cuda_indices
from .._files import write_atomic
from ..report.results import Key, Results, Row
from ..run.runner import ProgressBar
from ..run.sweeps import CellsFile, SweepPlan, SweepUnit, cells_in, differences, move_aside
from ..run.workload import TRAIN_MODE
from . import launch, worker
from .worker import Group, RankFailedError, RankFiles

PREPARE_COST = 64  # a unit's preparation and parity gate, in the cost proxy's units (items of batch per mode)
_POLL_S = 0.5


def rank_cells_path(output_dir: str | os.PathLike, rank: int) -> Path:
    return Path(output_dir) / f"cells-rank{rank}.jsonl"


def cost(unit: SweepUnit, modes: Sequence[str]) -> float:
    """The proxy of a unit's time that orders the queue of pieces (:func:`work_items`): batch size x
    modes (training counts three forward passes), plus :data:`PREPARE_COST`; a section cell (a serving
    run) counts as a unit at batch 64 in two modes."""
    if unit.section is not None:
        return PREPARE_COST + 2 * 64
    return PREPARE_COST + unit.batch * sum(3 if m == TRAIN_MODE else 1 for m in modes)


def work_items(units: Sequence[SweepUnit], modes: Sequence[str], world_size: int) -> list[list[int]]:
    """The pieces of work the ranks take from the queue (indices into ``units``, in their order), in the
    queue's order: largest first by :func:`cost`, ties in the units' order. A model's consecutive units
    at one batch size form one piece (its configs share the model and the FP32 reference) where there
    are at least two such pieces per rank; else each unit is a piece. A section cell is always alone.

    >>> from types import SimpleNamespace as N
    >>> m = N(name="m")
    >>> us = [SweepUnit(m, b, c) for b in (1, 8) for c in ("fp32", "fp16")]
    >>> work_items(us, ["latency"], 1), work_items(us, ["latency"], 2)
    ([[2, 3], [0, 1]], [[2], [3], [0], [1]])
    """
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    groups: list[list[int]] = []
    for i, u in enumerate(units):
        prev = units[groups[-1][-1]] if groups else None
        if (prev is not None and u.section is None and prev.section is None and u.model is prev.model
                and u.batch == prev.batch):
            groups[-1].append(i)
        else:
            groups.append([i])
    pieces = groups if len(groups) >= 2 * world_size else [[i] for g in groups for i in g]
    costs = [sum(cost(units[i], modes) for i in p) for p in pieces]
    return [pieces[k] for k in sorted(range(len(pieces)), key=lambda k: (-costs[k], k))]


# ---- validation and the launcher ---------------------------------------------------------------------
def resolve(devices: Any, plan: SweepPlan, call: dict[str, Any]) -> Any:
    """Check ``devices`` (ValueError / TypeError naming it) and return what runs the sweep: this process
    as one rank of a running torchrun job, or a torchrun job started here."""
    if not dist.is_available():
        raise ImportError("devices= runs through torch.distributed, which this torch build lacks")
    worker.timeout_s()
    cuda = plan.device.type == "cuda"
    if cuda and plan.device.index is not None:
        raise ValueError(f"device = {str(plan.device)!r} names one GPU; with devices (--gpus) give device = 'cuda' "
                         "(or none) and the GPUs in devices, e.g. --gpus 0,2")
    joined = worker.torchrun_env()
    if joined is not None:
        if not call["resume"]:
            raise ValueError("resume=False (--no-resume) is refused inside a torchrun job: ranks on several machines "
                             "cannot move one folder aside safely; give a new output folder, or move the old files "
                             "yourself")
        return functools.partial(run_rank, cuda_indices=launch.joined_devices(devices, cuda, joined[1]))
    if not cuda and plan.spec.get("device") is None:
        raise ValueError(f"devices={devices!r} asks for GPUs and {torch.cuda.device_count()} are visible; for ranks "
                         "on the CPU give device = 'cpu' in the spec")
    indices = cuda_indices("devices", devices) if cuda else list(range(launch.cpu_ranks(devices)))
    if cuda:
        names = {i: torch.cuda.get_device_name(i) for i in indices}
        if len(set(names.values())) > 1:
            raise ValueError(f"devices={devices!r} names GPUs of different kinds ({names}): the cells of one sweep "
                             "must be comparable; give GPUs of one kind")
    try:
        json.dumps(plan.spec)
    except TypeError as exc:
        raise ValueError(f"devices= hands the spec to fresh processes as JSON; a value is not: {exc}") from exc
    return functools.partial(launch_sweep, nproc=len(indices), cuda_indices=indices if cuda else None)


def launch_sweep(plan: SweepPlan, *, nproc: int, cuda_indices: Sequence[int] | None) -> Results:
    """Run the sweep as ``nproc`` ranks of a torchrun job (``-m gpuopt sweep SPEC --output DIR`` on
    each) and return the merged Results. After a failure, a timeout or Ctrl-C the cells finished so far
    are merged into ``DIR/results.json`` here."""
    out = plan.output_dir
    if plan.done is None:  # resume=False: moved aside once, here, before any rank starts
        moved = move_aside(out) if out.is_dir() else None
        if moved is not None and plan.progress:
            print(f"the earlier sweep's files were moved to {moved}", file=sys.stderr)
    spec_path = worker.ranks_dir(out) / "sweep-spec.json"
    spec_path.parent.mkdir(parents=True, exist_ok=True)
    spec_path.write_text(json.dumps(plan.spec, indent=1))
    units = len(plan.units())
    timeout_s = (units + 2) * worker.timeout_s() + launch.START_S  # a rank may take any number of the units
    target = ["-m", "gpuopt", "sweep", str(spec_path), "--output", str(out)] + ([] if plan.progress else ["--quiet"])
    try:
        launch.torchrun(target, nproc, output_dir=out, env=launch.environment(cuda_indices), echo=plan.progress,
                        timeout_s=timeout_s, keep=functools.partial(merge_so_far, plan))
    except BaseException:
        if (out / "results.json").exists():
            plan.results = Results.load(out / "results.json")
        raise
    return Results.load(out / "results.json")


def merge_so_far(plan: SweepPlan) -> int:
    """Merge the cells in the folder's cells files into ``results.json`` (what a stopped job keeps,
    written by the launcher); rank 0's complete results, when it wrote them, stay. Returns the count."""
    out = plan.output_dir
    if worker.reports(out, 1).get(0, {}).get("state") == "done" and (out / "results.json").exists():
        return len(Results.load(out / "results.json").rows)
    results = Results.new(spec=dict(plan.spec))
    for row in _in_plan_order(plan, cells_in(out)):
        results.add(row)
    results.save(out, plots=False)
    return len(results.rows)


def _in_plan_order(plan: SweepPlan, rows: dict[Key, Row]) -> list[Row]:
    keys = [k for u in plan.units() for k in u.keys(plan.modes)]
    known = set(keys)
    return [rows[k] for k in keys if k in rows] + [r for k, r in rows.items() if k not in known]


# ---- one rank --------------------------------------------------------------------------------------
class _Progress:
    """The ranks' progress in the job's TCP store (torchrun's, at MASTER_ADDR:MASTER_PORT): each rank
    writes ``{state, cells, error}`` under a key of this job's own, and reads the others' while it waits."""

    def __init__(self, job: str, rank: int, world: int):
        base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                             timeout=dt.timedelta(seconds=60))
        self.store, self.rank, self.world = dist.PrefixStore(f"gpuopt-sweep/{job}/", base), rank, world
        self.cells, self.started = 0, False

    def set(self, state: str, error: str | None = None) -> None:
        self.store.set(f"rank{self.rank}", json.dumps({"state": state, "cells": self.cells, "error": error,
                                                         "host": socket.gethostname()}))
        if state == "failed":  # the others take no more pieces (they learn who failed while they wait)
            self.store.add("failed", 1)

    def cell(self) -> None:
        self.cells += 1
        self.set("running")

    def take(self, count: int) -> int | None:
        """The next piece of the queue (``0 .. count - 1``) for this rank, or None when every piece has been
        taken or a rank said it failed. Rank R's first piece is piece R (every rank starts at once, none
        is left without work by a slow start); the rest go through the store's atomic counter, so each
        piece goes to exactly one rank."""
        if self.store.add("failed", 0):
            return None
        if not self.started:
            self.started = True
            k = self.rank
        else:
            k = self.world + self.store.add("next-piece", 1) - 1
        return k if k < count else None

    def finished_units(self) -> int:
        """A unit finished by this rank; returns how many the job's ranks finished so far."""
        return self.store.add("units-done", 1)

    def wait_all(self, timeout_s: float) -> None:
        """Until every rank is done: RankFailedError at once naming a rank that failed, or naming those
        that finished no cell for ``timeout_s`` seconds."""
        seen: dict[int, tuple[Any, float]] = {}
        while True:
            states = {r: json.loads(self.store.get(f"rank{r}")) for r in range(self.world)}
            failed = [(r, s) for r, s in states.items() if s["state"] == "failed"]
            if failed:
                raise RankFailedError("; ".join(f"rank {r} (on {s['host']}) stopped: {s['error']}" for r, s in failed)
                                      + "; its finished cells are in its cells-rank<R>.jsonl: rerun the same command "
                                        "to resume", [r for r, _ in failed])
            now = time.monotonic()
            running = [r for r, s in states.items() if s["state"] != "done"]
            if not running:
                return
            for r in running:
                if seen.get(r, (None,))[0] != states[r]["cells"]:
                    seen[r] = (states[r]["cells"], now)
            stuck = [r for r in running if now - seen[r][1] > timeout_s]
            if stuck:
                raise RankFailedError(
                    "; ".join(f"rank {r} (on {states[r]['host']}) finished no cell for {timeout_s:g} s "
                              f"({worker.TIMEOUT_ENV}) after its {states[r]['cells']} cells" for r in stuck)
                    + ": it hangs or died; the finished cells are in the cells-rank<R>.jsonl files: rerun the same "
                      "command to resume", stuck)
            time.sleep(_POLL_S)


def run_rank(plan: SweepPlan, cuda_indices: Sequence[int] | None = None) -> Results:
    """This process's share of the sweep as one rank of the torchrun job (see the module's docstring).
    Rank 0 returns the merged Results (also written to the folder), the others the cells they measured."""
    rank, world, local = worker.torchrun_env()
    if plan.device.type == "cuda":
        device = torch.device("cuda", cuda_indices[local] if cuda_indices else local)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    plan = replace(plan, device=device, distributed=None, results=None)
    timeout = dt.timedelta(seconds=worker.timeout_s())
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", timeout=timeout)
    pg = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo", timeout=timeout)
    files = RankFiles(plan.output_dir, rank, rows=False)
    group = Group(rank, world, files, str(plan.output_dir), pg=pg)
    progress = None
    try:
        if dist.get_world_size() != world:
            raise RuntimeError(f"the process group has {dist.get_world_size()} ranks, WORLD_SIZE says {world}")
        job = group.broadcast("starting the sweep", uuid.uuid4().hex)
        progress = _Progress(job, rank, world)
        progress.set("running")
        return _share(plan, group, progress, files, local)
    except BaseException as exc:
        if isinstance(exc, RankFailedError):  # stopping because another rank did: not a culprit itself
            if files.current != "aborted":
                files.state("aborted", str(exc))
        else:
            files.state("failed", f"{type(exc).__name__}: {exc}")
            if progress is not None:
                progress.set("failed", f"{type(exc).__name__}: {exc}")
        raise
    finally:
        if created:
            dist.destroy_process_group()


def _share(plan: SweepPlan, group: Group, progress: _Progress, files: RankFiles, local: int) -> Results:
    rank, world, out = group.rank, group.world, plan.output_dir
    fingerprint = dict(plan.fingerprint)
    if plan.device.type == "cuda":
        fingerprint["device_name"] = torch.cuda.get_device_name(plan.device)
    prints = group.all_gather("comparing the ranks' fingerprints", fingerprint)
    odd = {r: differences(prints[0], f) for r, f in enumerate(prints) if f != prints[0]}
    if odd:
        raise ValueError("the ranks would measure cells that do not compare (rank 0 -> rank R): " + "; ".join(
            f"rank {r}: {', '.join(d)}" for r, d in odd.items()))
    done = set().union(*group.all_gather("pooling the finished cells", sorted(plan.done or {})))
    results = Results.new(spec=dict(plan.spec))
    if local == 0:  # each machine's folder says how its cells were measured (a resume there checks it)
        plan.write_header(results)
    pending = [u for u in plan.units() if not u.done(done, plan.modes)]
    items = work_items(pending, plan.modes, world)
    if plan.progress and rank == 0:
        print(f"gpuopt sweep: {len(pending)} units left to measure in {len(items)} pieces over {world} ranks"
              + (f" ({len(done)} cells already measured)" if done else ""), file=sys.stderr, flush=True)
    group.align("the start of the sweep")
    measured: list[Row] = []
    taken: list[int] = []
    busy_s = 0.0
    bar = ProgressBar(len(pending), plan.progress)

    def job_progress(event: str, cell: str) -> None:  # the count is the job's: every rank's finished units
        if plan.progress and event == "done":
            bar.set_done(progress.finished_units() - 1)
        bar(event, f"rank {rank}: {cell}")

    try:
        with CellsFile(rank_cells_path(out, rank)) as cells:

            def record(row: Row) -> None:
                cells.add(row)
                measured.append(row)
                progress.cell()

            while (k := progress.take(len(items))) is not None:
                taken.append(k)
                t = time.monotonic()
                plan.run_units([pending[i] for i in items[k]], done, record, job_progress)
                busy_s += time.monotonic() - t
    finally:
        bar.close()
    mine = {"rank": rank, "host": socket.gethostname(), "units": sum(len(items[k]) for k in taken),
            "cells": len(measured), "busy_s": busy_s, "end_s": time.monotonic() - group.t0}
    progress.set("done")
    progress.wait_all(worker.timeout_s())
    # Every rank is done: rank 0 gets the cells it cannot read itself (another machine's folder).
    seen = set(cells_in(out)) if rank == 0 else None
    seen = group.broadcast("sharing the cells rank 0 can read", seen)
    missing = [r.to_dict() for r in cells_in(out).values() if r.key not in seen]
    gathered = group.gather((missing, mine, taken))
    if rank == 0:
        rows = cells_in(out)
        for part, _, _ in gathered:
            for d in part:
                row = Row.from_dict(d)
                rows.setdefault(row.key, row)
        results.spec["dist"] = {"world_size": world, "backend": "gloo", "device_type": plan.device.type,
                                "strategy": "sweep", "pieces": len(items),
                                "shares": {str(pending[i]): r for r, (_, _, ks) in enumerate(gathered)
                                           for k in ks for i in items[k]},
                                "ranks": [stats for _, stats, _ in gathered]}
        for row in _in_plan_order(plan, rows):
            results.add(row)
        write_atomic(out / "cells.jsonl", "".join(json.dumps(r.to_dict(), default=str) + "\n" for r in results.rows))
        results.save(out)
    else:
        results = Results(measured, env=results.env, build=results.build, spec=results.spec)
    files.state("done")
    group.align("the last barrier (rank 0 writing the results)")
    return results
