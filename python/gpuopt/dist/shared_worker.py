"""One process of :func:`gpuopt.dist.shared.shared_gpu`, started by torchrun:
``python -m torch.distributed.run ... -m gpuopt.dist.shared_worker OUTPUT/ranks/shared.json``.

Process 0 does the whole work alone while the others wait at a barrier, then every process does its
share at once: each sets up (builds, prepares and warms up its model or server) at its own pace and the
timed parts start together at a barrier; process 0 gathers the rows (and, serving, every answered
request's latency) and writes OUTPUT/results.json. Each process keeps its state and rows in
OUTPUT/ranks/ as a benchmark rank does, so one that dies is named and the finished rows are kept.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..report.results import Results, Row, dist_mode
from ..run.bench import plan_benchmark
from ..serving.api import build
from ..serving.load import STATUS_NAMES, LoadSpec
from ..timing.measurement import Measurement
from . import worker
from .aggregate import aggregate_row

_OK = STATUS_NAMES.index("ok")


def _benchmark(spec: dict[str, Any], device: torch.device, share: int,
               ready: Callable[[], None]) -> tuple[Row, dict[str, list[float]]]:
    """One throughput cell of exactly ``share`` x ``iters`` samples; its row (no requests to pool: the
    row's measurement has the samples). ``ready`` runs after the preparation, right before the timed
    part (warm-up and sampling)."""
    options = {"parity": False, **spec["options"]}
    plan = plan_benchmark(spec["model"], configs=[spec["config"]], batch_sizes=[spec["batch_size"]],
                          modes=["throughput"], device=device, progress=False, input_shape=spec["input_shape"],
                          iters=share * spec["iters"], **options)
    rows: list[Row] = []
    plan.runner(rows.append, profile_dir=None, before_mode=ready).run_batch(plan.batch_sizes[0])
    return rows[0], {}


def _serve(spec: dict[str, Any], device: torch.device, share: int,
           ready: Callable[[], None]) -> tuple[Row, dict[str, list[float]]]:
    """One closed-loop serving run of ``share`` x ``queries`` requests from ``share`` x ``concurrency``
    clients; its row and every answered request's end-to-end latency, queue and compute time (ms).
    ``ready`` runs once the server is built and warmed up, right before the load starts."""
    server, name = None, None
    try:
        server, name = build(spec["model"], spec["config"], device=device, max_batch_size=spec["batch_size"],
                             instances=spec["instances"], **spec["options"])
    finally:
        ready()  # also when the build failed: the other processes must not wait for this one in vain
    try:
        load = LoadSpec(scenario="closed-loop", concurrency=share * spec["concurrency"],
                        min_queries=share * spec["queries"], duration_s=0.0)
        result = server.run_load(load, records=True, model_name=name)
    finally:
        server.close(drain=False)
    rec = result.records
    ok = rec["status"] == _OK
    times = {"latency": ((rec["completed_s"] - rec["scheduled_s"])[ok] * 1e3).tolist(),
             "queue": (rec["queue_us"][ok] / 1e3).tolist(), "compute": (rec["compute_us"][ok] / 1e3).tolist()}
    row = result.row(precision=server.config.precision)
    return replace(row, timing={"sampling_s": float(result.result["wall_s"])}), times


def _tag(row: Row, role: str, rank: int, world: int, spec: dict[str, Any], t0: float) -> Row:
    info: dict[str, Any] = {"role": role, "mode": row.mode, "rank": rank, "world_size": world, "processes": world,
                            "mps": spec["mps"], "mps_reason": spec["mps_reason"], "work": spec["work"],
                            "device": spec["device_name"]}
    if role == "rank" and row.timing is not None:
        end = time.monotonic() - t0
        info["window_s"] = [end - row.timing["sampling_s"], end]
    return replace(row, mode=dist_mode(row.mode, role, world, rank), dist=info)


_PERCENTILES = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99, "p99.9": 0.999}


def _percentiles(values: list[float]) -> dict[str, float]:
    m = Measurement.from_samples(values)
    return {**dict(zip(_PERCENTILES, m.quantiles(list(_PERCENTILES.values())))), "mean": m.mean, "max": max(values)}


def _served_aggregate(row: Row, ranks: list[Row], times: list[dict[str, list[float]]]) -> Row:
    """The aggregate's serving record: the processes' counts and throughputs summed, the percentiles of
    every answered request of all of them."""
    first = ranks[0].serving
    pooled = {k: [x for t in times for x in t[k]] for k in ("latency", "queue", "compute")}
    latency = _percentiles(pooled["latency"])
    serving = {**first, "counts": {k: sum(r.serving["counts"][k] for r in ranks) for k in first["counts"]},
               "throughput": sum(r.serving["throughput"] for r in ranks), "latency_ms": latency,
               "queue_ms": _percentiles(pooled["queue"]), "compute_ms": _percentiles(pooled["compute"]),
               "valid": all(r.serving["valid"] for r in ranks), "gpu_busy": None,
               "invalid_reasons": [f"process {i}: {why}" for i, r in enumerate(ranks)
                                   for why in r.serving["invalid_reasons"]]}
    return replace(row, serving=serving, latency_ms={k: latency[k] for k in ("p50", "p90", "p95", "p99", "p99.9",
                                                                                 "mean", "max")})


def _aggregate(ranks: list[Row], single: Row | None, times: list[dict[str, list[float]]],
               spec: dict[str, Any]) -> Row:
    """The aggregate of the processes: aggregate_row's (summed throughput, pooled percentiles, overlap) --
    serving, those of every answered request -- and ``vs_one_process``."""
    serving = spec["work"] == "serve" and all(r.ok and t.get("latency") for r, t in zip(ranks, times))
    if serving:
        ranks = [replace(r, measurement=Measurement.from_samples(t["latency"])) for r, t in zip(ranks, times)]
    row = aggregate_row(ranks, None)
    if serving and row.ok:
        row = _served_aggregate(row, ranks, times)
    info = dict(row.dist, processes=len(ranks), mps=spec["mps"], mps_reason=spec["mps_reason"], work=spec["work"],
                device=spec["device_name"])
    if row.ok and single is not None and single.ok and single.throughput_items_per_s:
        info.update(single_items_per_s=single.throughput_items_per_s,
                    vs_one_process=row.throughput_items_per_s / single.throughput_items_per_s,
                    p99_ms_per_process=[r.latency_ms["p99"] if r.latency_ms else None for r in ranks],
                    p99_ms_one_process=single.latency_ms["p99"] if single.latency_ms else None)
    return replace(row, dist=info)


def run(spec: dict[str, Any]) -> Results | None:
    rank, world, _ = worker.torchrun_env()
    device = torch.device("cuda", 0) if spec["device"] == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    out = spec["output_dir"]
    dist.init_process_group("gloo", timeout=dt.timedelta(seconds=worker.timeout_s()))
    files = worker.RankFiles(out, rank)
    try:
        group = worker.Group(rank, world, files, out)
        do = _benchmark if spec["work"] == "benchmark" else _serve
        single = None
        group.align()
        if rank == 0:  # the whole work, alone
            row, _ = do(spec, device, world, lambda: None)
            single = _tag(row, "single", 0, world, spec, group.t0)
            files.add(single)
        group.align("the barrier after process 0 alone")
        # Each process sets up at its own pace; the timed parts start at once (the barrier in ready).
        row, latencies = do(spec, device, 1, lambda: group.align("the barrier before the timed part"))
        mine = _tag(row, "rank", rank, world, spec, group.t0)
        files.add(mine)
        gathered = group.gather((mine.to_dict(), latencies))
        results = None
        if rank == 0:
            ranks = [Row.from_dict(d) for d, _ in gathered]
            results = Results(spec={"shared_gpu": {k: spec[k] for k in (
                "model", "config", "processes", "work", "device_name", "batch_size", "iters", "queries",
                "concurrency", "instances", "mps", "mps_reason")}})
            for r in [single, *ranks, _aggregate(ranks, single, [per for _, per in gathered], spec)]:
                results.add(r)
            results.save(out, plots=False)
        files.state("done")
        group.align("the last barrier (process 0 writing the results)")
        return results
    except BaseException as exc:
        if not isinstance(exc, worker.RankFailedError):
            files.state("failed", f"{type(exc).__name__}: {exc}")
        raise
    finally:
        dist.destroy_process_group()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: torchrun [...] -m gpuopt.dist.shared_worker SPEC.json  (written by gpuopt.dist.shared_gpu)",
              file=sys.stderr)
        return 2
    run(json.loads(Path(args[0]).read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
