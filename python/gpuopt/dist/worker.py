"""One rank of a distributed benchmark, in a process started by torchrun (by gpuopt's launcher or the
user's own): join the process group, take the device of LOCAL_RANK, then

1. cell by cell (a config at a batch size, in every mode): rank 0 measures the cell alone while the
   others wait at a barrier (the one-device baseline), then every rank measures it on its replica. The
   ranks prepare the cell (and check parity) each at its own pace, then meet at a barrier right before
   each mode's timed part, so that warm-up and sampling start at once (the sampling windows, recorded
   per row, overlap mostly: warm-up and adaptive stopping may differ a little between ranks);
2. rank 0 gathers the rows with their raw samples and writes one Results: the baseline, one row per
   rank and cell, and the aggregate of each cell (:mod:`gpuopt.dist.aggregate`).

Interleaving keeps each wait short: a rank waits at most for one cell of rank 0 alone, never for the
whole plan, so long plans fit in a collective timeout (NCCL's watchdog aborts a longer wait).

With an output folder, each rank appends its rows to ``OUTPUT/ranks/rank<R>.jsonl`` as they finish and
keeps its state in ``rank<R>.json``, so a rank that dies takes none of the finished rows with it and the
others can say which rank stopped. Every collective waits at most ``GPUOPT_DIST_TIMEOUT_S``; the
other ranks wait for rank 0 to have written the results before they exit.

``python -m gpuopt.dist SPEC.json`` (:func:`main`) is what the launcher runs: SPEC holds the keyword arguments
of :func:`gpuopt.benchmark` as JSON, the model under ``model`` (``{"model": "resnet50", "devices": "all",
"batch_sizes": [1, 32], "output_dir": "out"}``).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from .._files import write_atomic
from ..prepare.config import Config
from ..report.results import Results, Row, dist_mode, read_cells
from ..run.bench import BenchmarkPlan, benchmark
from ..run.runner import ProgressBar
from ..timing import nvml
from . import split
from .aggregate import aggregate_row

TIMEOUT_ENV = "GPUOPT_DIST_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 1800.0


class RankFailedError(RuntimeError):
    """A rank of a distributed benchmark stopped; ``ranks`` are the ranks that stopped first."""

    def __init__(self, message: str, ranks: Sequence[int] = ()):
        super().__init__(message)
        self.ranks = list(ranks)


def timeout_s() -> float:
    """How long a collective (and so a rank waiting for another) may wait: ``GPUOPT_DIST_TIMEOUT_S``
    seconds, default 1800 -- longer than rank 0 needs to measure one cell alone (a config at a batch
    size: its preparation, parity and every mode)."""
    text = os.environ.get(TIMEOUT_ENV)
    if text is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise ValueError(f"{TIMEOUT_ENV} must be a positive number of seconds, got {text!r}")
    return value


def torchrun_env() -> tuple[int, int, int] | None:
    """``(rank, world_size, local_rank)`` when a launcher (torchrun) started this process, else None."""
    try:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    except (KeyError, ValueError):
        return None


# ---- the files of the ranks ------------------------------------------------------------------------
def ranks_dir(output_dir: str | os.PathLike) -> Path:
    return Path(output_dir) / "ranks"


class RankFiles:
    """One rank's files: its rows as they finish and its state (running, done, failed: its own error,
    aborted: a collective failed because another rank stopped). ``done`` is final: a rank whose part
    is complete (rank 0: the results written) stays done if another rank stops afterwards. With
    ``rows=False`` (a sweep: its ranks keep their cells files of their own) only the state."""

    def __init__(self, output_dir: str | os.PathLike, rank: int, rows: bool = True):
        self.dir, self.rank, self.current = ranks_dir(output_dir), rank, None
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rows_path = self.dir / f"rank{rank}.jsonl"
        if rows:
            self.rows_path.write_text("")
        self.state("running")

    def state(self, state: str, error: str | None = None) -> None:
        if self.current == "done":
            return
        self.current = state
        write_atomic(self.dir / f"rank{self.rank}.json", json.dumps(
            {"rank": self.rank, "state": state, "error": error, "pid": os.getpid(), "host": socket.gethostname()}))

    def add(self, row: Row) -> None:
        with self.rows_path.open("a") as f:
            f.write(json.dumps(row.to_dict(), default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())


def clear_rank_files(output_dir: str | os.PathLike) -> None:
    """Remove the rank files of an earlier job in this folder (a launcher does this before it starts one)."""
    for path in ranks_dir(output_dir).glob("rank*.json*"):
        path.unlink(missing_ok=True)


def reports(output_dir: str | os.PathLike, world_size: int) -> dict[int, dict[str, Any]]:
    """The state each rank below ``world_size`` last wrote, by rank (a larger earlier job's files are not
    this job's)."""
    out = {}
    for r in range(world_size):
        try:
            doc = json.loads((ranks_dir(output_dir) / f"rank{r}.json").read_text())
            out[int(doc["rank"])] = doc
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def save_rows_so_far(output_dir: str | os.PathLike, world_size: int, env: dict | None = None) -> Results:
    """Write the rows every rank finished (its ``rank<R>.jsonl``) as ``OUTPUT/results.json`` (and CSV,
    Markdown): what a run that stopped keeps, returned. When rank 0 finished (state ``done``), its
    complete ``results.json`` is kept as it is and returned."""
    saved = Path(output_dir) / "results.json"
    if reports(output_dir, 1).get(0, {}).get("state") == "done" and saved.exists():
        return Results.load(saved)
    rows = [row for r in range(world_size) if (path := ranks_dir(output_dir) / f"rank{r}.jsonl").exists()
            for row in read_cells(path)]
    results = Results(rows, env=env)
    results.save(output_dir, plots=False)
    return results


def stopped_ranks(output_dir: str | os.PathLike, world_size: int, *, but: int) -> list[tuple[int, str]]:
    """``(rank, why)`` of the ranks other than ``but`` that did not finish: those that failed on their
    own, or, when none did, those without a report (killed, crashed, or still running: suspects only
    while no rank says it failed)."""
    states = reports(output_dir, world_size)
    failed = [(r, states[r].get("error") or "failed") for r in range(world_size)
              if r != but and r in states and states[r]["state"] == "failed"]
    silent = [(r, "no report: it was killed, crashed or is still running") for r in range(world_size)
              if r != but and states.get(r, {}).get("state") in (None, "running")]
    return failed or silent


# ---- one rank ----------------------------------------------------------------------------------------
class Group:
    """The collectives of this rank, each turning a failure into a RankFailedError naming the rank
    that stopped (read from the ranks' files where there are some)."""

    def __init__(self, rank: int, world: int, files: RankFiles | None, output_dir: str | None, pg: Any = None):
        self.rank, self.world, self.files, self.output_dir = rank, world, files, output_dir
        self.pg = pg  # the process group of the collectives (None: the default one)
        self.t0 = time.monotonic()  # when this rank left the last aligning barrier

    def _run(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - gloo and NCCL raise RuntimeError subclasses of their own
            stopped = stopped_ranks(self.output_dir, self.world, but=self.rank) if self.output_dir else []
            who = "; ".join(f"rank {r} stopped: {why}" for r, why in stopped) or (
                f"another rank stopped or took longer than {TIMEOUT_ENV}={timeout_s():g} s")
            kept = f"; the rows finished so far are in {ranks_dir(self.output_dir)}/" if self.output_dir else ""
            if self.files is not None:
                self.files.state("aborted", f"{what} failed: {who}")
            raise RankFailedError(f"rank {self.rank}: {what} failed: {who}{kept} ({type(exc).__name__}: {exc})",
                                  [r for r, _ in stopped]) from exc

    def align(self, what: str = "the barrier") -> None:
        self._run(what, lambda: dist.barrier(group=self.pg))
        self.t0 = time.monotonic()

    def gather(self, payload: Any) -> list[Any] | None:
        out = [None] * self.world if self.rank == 0 else None
        self._run("gathering the rows on rank 0", lambda: dist.gather_object(payload, out, dst=0, group=self.pg))
        return out

    def all_gather(self, what: str, payload: Any) -> list[Any]:
        out = [None] * self.world
        self._run(what, lambda: dist.all_gather_object(out, payload, group=self.pg))
        return out

    def broadcast(self, what: str, payload: Any) -> Any:
        """Rank 0's ``payload``, on every rank."""
        box = [payload]
        self._run(what, lambda: dist.broadcast_object_list(box, src=0, group=self.pg))
        return box[0]


def _neighbours(index: int) -> list[str]:
    """The warning about other processes on this rank's GPU (NVML), if any."""
    others = nvml.other_processes(index)
    if not others:
        return []
    pids = ", ".join(str(p["pid"]) for p in others)
    return [f"{len(others)} other process(es) used cuda:{index} when the run started (pids {pids}): they share the "
            "GPU with this rank's replica and slow it down"]


def run_rank(plan: BenchmarkPlan, cuda_indices: Sequence[int] | None = None) -> Results:
    """This process's part of ``plan`` as one rank of the job torchrun started (see the module's
    docstring). Rank 0 returns (and writes to ``plan.output_dir``) the whole Results, the other ranks
    their own rows. ``cuda_indices``: the CUDA device of each local rank (default: cuda:LOCAL_RANK)."""
    rank, world, local = torchrun_env()
    warnings: list[str] = []
    if plan.device.type == "cuda":
        device = torch.device("cuda", cuda_indices[local] if cuda_indices else local)
        warnings = _neighbours(device.index)  # before this process uses the GPU
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    for w in warnings:
        print(f"gpuopt.dist rank {rank}: warning: {w}", file=sys.stderr, flush=True)
    created = not dist.is_initialized()
    if created:
        cuda = device.type == "cuda"
        dist.init_process_group("nccl" if cuda else "gloo", timeout=dt.timedelta(seconds=timeout_s()),
                                device_id=device if cuda else None)
    files = None
    try:
        if dist.get_world_size() != world:
            raise RuntimeError(f"the process group has {dist.get_world_size()} ranks, WORLD_SIZE says {world}")
        files = RankFiles(plan.output_dir, rank) if plan.output_dir is not None else None
        return _phases(plan, device, rank, world, local, warnings, files)
    except BaseException as exc:
        if files is not None and not isinstance(exc, RankFailedError):
            files.state("failed", f"{type(exc).__name__}: {exc}")
        if rank == 0 and plan.output_dir is not None:
            plan.results = save_rows_so_far(plan.output_dir, world)  # rank 0's results if it wrote them
        raise
    finally:
        if created:
            dist.destroy_process_group()


def _phases(plan: BenchmarkPlan, device: torch.device, rank: int, world: int, local: int, warnings: list[str],
            files: RankFiles | None) -> Results:
    group = Group(rank, world, files, plan.output_dir)
    host = socket.gethostname()
    one = plan.single(device)
    own = Results.new(spec=one.spec())

    def tagged(row: Row, role: str) -> Row:
        info: dict[str, Any] = {"role": role, "mode": row.mode, "rank": rank, "world_size": world,
                                "local_rank": local, "host": host}
        if role == "rank" and row.timing is not None:
            # seconds since all ranks left the barrier before this mode; sampling ended just before the row
            end = time.monotonic() - group.t0
            info["window_s"] = [end - row.timing["sampling_s"], end]
        row = replace(row, mode=dist_mode(row.mode, role, world, rank), dist=info, warnings=row.warnings + warnings)
        if files is not None:
            files.add(row)
        return row

    single: list[Row] = []
    mine: list[Row] = []

    def each(row: Row) -> None:
        mine.append(tagged(row, "rank"))

    def ready() -> None:  # every rank prepared the cell: its modes' timed parts start at once
        group.align("the barrier before a mode's timed part")

    cells = [(batch, config) for batch in plan.batch_sizes for config in plan.configs]
    bar = ProgressBar(2 * len(cells), plan.progress and rank == 0)
    alone = one.runner(lambda row: single.append(tagged(row, "single")), profile_dir=None,
                       progress=lambda event, cell: bar(event, f"rank 0 alone: {cell}")) if rank == 0 else None
    profiles = str(Path(plan.output_dir or ".") / "gpuopt-profiles" / f"rank{rank}") if plan.profile else None
    together = one.runner(each, profile_dir=profiles, progress=lambda event, cell: bar(event, f"{world} ranks: {cell}"),
                          before_mode=ready)
    try:
        for batch, config in cells:
            group.align()  # every rank done with the last cell (its profiling and clean-up included)
            if alone is not None:
                alone.run_batch(batch, [config])
            group.align()  # the other ranks wait here while rank 0 measures this cell alone
            if plan.strategy == "split":
                cell = f"{one.work.name} b{batch} {config.label} split over {world} ranks"
                bar("start", cell)
                row = split.run_cell(one, config, batch, single[-1] if single else None, group, device)
                if row is not None:
                    mine.append(row)
                    if files is not None:
                        files.add(row)
                bar("done", cell)
            else:
                together.run_batch(batch, [config])
    finally:
        bar.close()
    gathered = group.gather([r.to_dict() for r in mine])
    own.ceilings = together.ceilings
    own.profiles.update(together.profiles)
    if rank != 0:
        results = Results(mine, env=own.env, build=own.build, spec=own.spec, ceilings=own.ceilings,
                          profiles=own.profiles)
    else:
        results = (_combine_split(own, single, mine, world, device) if plan.strategy == "split" else
                   _combine(own, single, [[Row.from_dict(d) for d in rows] for rows in gathered], world, device))
        if plan.output_dir is not None:
            results.save(plan.output_dir)
    if files is not None:
        files.state("done")
    # The other ranks stay until rank 0 wrote the results: torchrun stops the whole job when one exits
    # with an error, rank 0 in the middle of writing them included.
    group.align("the last barrier (rank 0 writing the results)")
    return results


def _dist_spec(own: Results, world: int, device: torch.device, strategy: str) -> Results:
    return Results(env=own.env, build=own.build, ceilings=own.ceilings, profiles=own.profiles,
                   spec={**own.spec, "dist": {"world_size": world, "backend": dist.get_backend(),
                                              "device_type": device.type, "strategy": strategy}})


def _combine_split(own: Results, single: list[Row], split_rows: list[Row], world: int,
                   device: torch.device) -> Results:
    """Rank 0's Results of the split strategy: per cell the baseline (rank 0 alone, global batch) and
    the split row."""
    results = _dist_spec(own, world, device, "split")
    singles = {(r.model, r.config, r.batch_size): r for r in single}
    for row in split_rows:
        base = singles.get((row.model, row.config, row.batch_size))
        for r in ([base] if base is not None else []) + [row]:
            results.add(r)
    return results


def _combine(own: Results, single: list[Row], per_rank: list[list[Row]], world: int, device: torch.device) -> Results:
    """Rank 0's Results: per cell the baseline, each rank's row and their aggregate."""
    results = _dist_spec(own, world, device, "replicas")
    singles = {(r.model, r.config, r.batch_size, r.dist["mode"]): r for r in single}
    for cell in zip(*per_rank, strict=True):
        keys = {(r.model, r.config, r.batch_size, r.dist["mode"]) for r in cell}
        if len(keys) != 1:
            raise RuntimeError(f"the ranks ran different cells at the same step: {sorted(keys)}")
        base = singles.get(keys.pop())
        for row in ([base] if base is not None else []) + list(cell) + [aggregate_row(cell, base)]:
            results.add(row)
    return results


def spec_configs(configs: Any) -> Any:
    """The configs of a worker spec: preset names and config strings as they are, ``{"config": str,
    "name": label}`` entries as named Configs."""
    if isinstance(configs, list):
        return [Config.parse(c["config"], name=c.get("name")) if isinstance(c, dict) else c for c in configs]
    return configs


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gpuopt.dist SPEC.json`` (see the module's docstring)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: torchrun [...] -m gpuopt.dist SPEC.json  (SPEC: gpuopt.benchmark's keyword "
              "arguments as JSON, with devices)", file=sys.stderr)
        return 2
    spec = json.loads(Path(args[0]).read_text())
    model = spec.pop("model")
    spec["configs"] = spec_configs(spec.get("configs"))
    benchmark(model, **spec)
    return 0
