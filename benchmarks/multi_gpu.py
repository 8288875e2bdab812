"""Several GPUs and several processes on one GPU (issue 15 targets), in one run on one machine:

- replicas: ResNet-50 fp16 channels-last at batch 256, one process per GPU through torchrun (NCCL),
  aggregate throughput >= 1.9x one GPU measured in the same job (N = 2 here; any N works);
- split batch: a global batch of 512 scattered from rank 0 over the GPUs, outputs gathered back;
  efficiency against one GPU at the same global batch, with the scatter and gather times;
- two processes on one GPU against one process doing the same total work (MPS when the machine has
  it): aggregate throughput and p99, for gpuopt.benchmark and for a server under closed-loop load;
- serving over every GPU of the process: one Server, a replica per GPU, offline throughput against a
  one-GPU server and the per-GPU busy fractions.

For 4 and 8 GPUs (issue 16), with the parts of any N:

- scaling: the replicas at each N of ``--gpus`` (default 1,2,4,8, as many as are visible), each job with its
  own one-GPU baseline: scaling efficiency per N, >= 0.95 at the largest;
- sweep: a sweep sharded over every GPU against the same sweep on one GPU: wall times, and the cells
  identical in content (the same keys, none lost, none twice);
- serve_rate: the highest Poisson rate with p99 <= ``--slo-ms`` (10) of one Server over every GPU against a
  one-GPU server (gpuopt.max_rate).

A part that fails is recorded with its reason and the others still run.
"""

from __future__ import annotations

import tempfile
import time
import traceback

import torch
from _common import Target, parse_args, require_gpu, write

import gpuopt
from gpuopt.dist import shared_gpu
from gpuopt.dist.aggregate import MIN_OVERLAP

MODEL, CONFIG = "resnet50", "fp16+channels_last"


def _extra(p):
    p.add_argument("--parts", default="replicas,split,shared,serve",
                   help="replicas,split,shared,serve (two GPUs); scaling,sweep,serve_rate (any N)")
    p.add_argument("--gpus", default="1,2,4,8", help="the GPU counts of the scaling part")
    p.add_argument("--slo-ms", type=float, default=10.0, help="the p99 bound of the serve_rate part")
    p.add_argument("--batch", type=int, default=256, help="per-GPU batch of the replicas part")
    p.add_argument("--split-batch", type=int, default=512, help="global batch of the split part")


def _budget(args) -> dict:
    # At least 2 s of sampling: the ranks' common window is then long enough to be a throughput.
    return {"max_time_s": 1.5 if args.quick else 4.0, "min_time_s": 0.5 if args.quick else 2.0}


def part_replicas(args, results: dict, targets: list[Target]) -> None:
    n = torch.cuda.device_count()
    out = tempfile.mkdtemp(prefix="gpuopt-replicas-")
    r = gpuopt.benchmark(MODEL, configs=[CONFIG], batch_sizes=[args.batch], modes=("throughput",), devices="all",
                         parity=False, progress=False, output_dir=out, **_budget(args))
    single = r.find(MODEL, CONFIG, args.batch, "throughput @1 rank")
    agg = r.find(MODEL, CONFIG, args.batch, f"throughput @{n} ranks")
    per_rank = [r.find(MODEL, CONFIG, args.batch, f"throughput @rank{i}/{n}") for i in range(n)]
    d = {"gpus": n, "batch_per_gpu": args.batch, "single_img_s": single.throughput_items_per_s,
         "aggregate_img_s": agg.throughput_items_per_s, "per_rank_img_s": [x.throughput_items_per_s for x in per_rank],
         "scaling_efficiency": agg.dist.get("scaling_efficiency"), "overlap": agg.dist.get("overlap"),
         "common_interval_s": agg.dist.get("common_interval_s"), "warnings": agg.warnings,
         "aggregate_dist": agg.dist}
    results["replicas"] = d
    print(f"replicas: {n} GPUs {d['aggregate_img_s']:,.0f} img/s, one GPU {d['single_img_s']:,.0f} img/s, "
          f"efficiency {d['scaling_efficiency']:.3f}, ranks sampled at once for {d['common_interval_s']:.2f} s "
          f"(overlap {d['overlap']:.2f})", flush=True)
    # A sum of rates counts only where the ranks ran at once: the overlap is a target of its own.
    targets.append(_overlap_target(f"{MODEL} {CONFIG} b{args.batch} replicas", d["overlap"]))
    targets.append(Target(f"{MODEL} {CONFIG} b{args.batch} replicas: {n} GPUs / one GPU throughput",
                          d["aggregate_img_s"] / d["single_img_s"], ">=", 1.9 * n / 2, "x",
                          "one GPU, same job (rank 0 alone)"))


def _overlap_target(what: str, overlap: float | None) -> Target:
    return Target(f"{what}: share of the sampling windows all ranks ran at once", overlap or 0.0, ">=",
                  MIN_OVERLAP, "", "the longest rank's sampling window")


def part_split(args, results: dict, targets: list[Target]) -> None:
    n = torch.cuda.device_count()
    out = tempfile.mkdtemp(prefix="gpuopt-split-")
    r = gpuopt.benchmark(MODEL, configs=[CONFIG], batch_sizes=[args.split_batch], devices="all", strategy="split",
                         parity=False, progress=False, output_dir=out, **_budget(args))
    row = r.find(MODEL, CONFIG, args.split_batch, f"host split @{n} ranks")
    single = r.find(MODEL, CONFIG, args.split_batch, "host @1 rank")
    if row is None or not row.ok:
        raise RuntimeError(f"no split row: {getattr(row, 'error', 'missing')}")
    d = {k: row.dist.get(k) for k in ("global_batch", "shard_batch", "scatter_ms", "compute_ms", "gather_ms",
                                      "compute_share", "compute_ms_per_rank", "speedup_vs_single",
                                      "scaling_efficiency", "phases_ms")}
    d |= {"gpus": n, "split_img_s": row.throughput_items_per_s,
          "single_img_s": single.throughput_items_per_s if single else None}
    results["split"] = d
    print(f"split b{args.split_batch} over {n}: {d['split_img_s']:,.0f} img/s vs one GPU {d['single_img_s']:,.0f}; "
          f"scatter {d['scatter_ms']:.2f} ms, compute {d['compute_ms']:.2f} ms, gather {d['gather_ms']:.2f} ms",
          flush=True)
    # The issue asks for this figure reported, with no threshold: printed and recorded, not a target.
    print(f"REPORT split over {n} GPUs at global batch {args.split_batch}: speed-up {d['speedup_vs_single']:.3f}x, "
          f"efficiency {d['scaling_efficiency']:.3f} (one GPU at the same global batch, same job)", flush=True)


def part_shared(args, results: dict, targets: list[Target]) -> None:
    out: dict = {}
    results["shared"] = out
    for work, kw in (("benchmark", {"batch_size": 64, "iters": 100 if args.quick else 300}),
                     ("serve", {"batch_size": 32, "queries": 2000 if args.quick else 6000, "concurrency": 32})):
        try:
            r = shared_gpu(MODEL, CONFIG + ("+cudagraph" if work == "serve" else ""), processes=2, work=work,
                           device="cuda:0", progress=False, **kw)
            agg = r.rows[-1]
            one = r.rows[0]
            cell = {"mps": agg.dist.get("mps"), "mps_reason": agg.dist.get("mps_reason"),
                    "one_process_items_s": one.throughput_items_per_s, "aggregate_items_s": agg.throughput_items_per_s,
                    "vs_one_process": agg.dist.get("vs_one_process"),
                    "one_process_p99_ms": (one.latency_ms or {}).get("p99"),
                    "per_process_p99_ms": [(x.latency_ms or {}).get("p99") for x in r.rows[1:-1]],
                    "aggregate_p99_ms": (agg.latency_ms or {}).get("p99"), "overlap": agg.dist.get("overlap"),
                    "warnings": agg.warnings, "dist": agg.dist}
            out[work] = cell
            print(f"two processes on one GPU ({work}, mps={cell['mps']}): {cell['aggregate_items_s']:,.0f}/s vs one "
                  f"process {cell['one_process_items_s']:,.0f}/s = {cell['vs_one_process']:.3f}x; p99 "
                  f"{cell['per_process_p99_ms']} vs {cell['one_process_p99_ms']} ms", flush=True)
            print(f"REPORT two processes on one GPU ({work}, mps={cell['mps']}): {cell['vs_one_process']:.3f}x one "
                  f"process's throughput (overlap {cell['overlap']:.2f})", flush=True)
            targets.append(_overlap_target(f"two processes on one GPU ({work})", cell["overlap"]))
        except Exception as exc:  # noqa: BLE001 - recorded; the other work still runs
            traceback.print_exc()
            out[work] = {"error": f"{type(exc).__name__}: {exc}"}
            results["errors"][f"shared_{work}"] = out[work]["error"]


def part_serve(args, results: dict, targets: list[Target]) -> None:
    model, _ = gpuopt.zoo.get(MODEL)
    g = torch.Generator().manual_seed(0)
    samples = [torch.randn(3, 224, 224, generator=g) for _ in range(64)]
    cfg = CONFIG + "+cudagraph"
    q = 6400 if args.quick else 32000
    out: dict = {}
    results["serve"] = out
    for label, kw in (("one_gpu", {"device": "cuda:0"}), ("all_gpus", {"devices": "all"})):
        t0 = time.perf_counter()
        s = gpuopt.Server(model, cfg, samples[0], max_batch_size=64, instances=2, **kw)
        s.add_samples(samples)
        try:
            res = s.run_load(scenario="offline", min_queries=q, duration_s=0.0, model_name=MODEL)
        finally:
            s.close(drain=False)
        out[label] = res.serving() | {"setup_s": time.perf_counter() - t0}
        print(res.summary(), "busy per GPU:", res.gpu_busy_per_device, "batches:", res.batches_per_device, flush=True)
    if "one_gpu" in out and "all_gpus" in out:
        n = torch.cuda.device_count()
        ratio = out["all_gpus"]["throughput"] / out["one_gpu"]["throughput"]
        out["speedup"] = ratio
        print(f"REPORT {MODEL} {cfg} server over {n} GPUs (least-loaded dispatch): {ratio:.3f}x the one-GPU "
              f"server's offline throughput (same run)", flush=True)


def part_scaling(args, results: dict, targets: list[Target]) -> None:
    visible = torch.cuda.device_count()
    counts = sorted({int(n) for n in args.gpus.split(",") if 2 <= int(n) <= visible})
    out: dict = {"visible": visible, "batch_per_gpu": args.batch, "by_gpus": {}}
    results["scaling"] = out
    for n in counts:
        folder = tempfile.mkdtemp(prefix=f"gpuopt-scaling{n}-")
        r = gpuopt.benchmark(MODEL, configs=[CONFIG], batch_sizes=[args.batch], modes=("throughput",),
                             devices=list(range(n)), parity=False, progress=False, output_dir=folder, **_budget(args))
        single = r.find(MODEL, CONFIG, args.batch, "throughput @1 rank")
        agg = r.find(MODEL, CONFIG, args.batch, f"throughput @{n} ranks")
        cell = {"single_img_s": single.throughput_items_per_s, "aggregate_img_s": agg.throughput_items_per_s,
                "scaling_efficiency": agg.dist.get("scaling_efficiency"), "overlap": agg.dist.get("overlap")}
        out["by_gpus"][n] = cell
        eff, ov = cell["scaling_efficiency"], cell["overlap"]
        print(f"REPORT scaling {MODEL} {CONFIG} b{args.batch}: {n} GPUs {cell['aggregate_img_s']:,.0f} img/s = "
              f"{cell['aggregate_img_s'] / cell['single_img_s']:.2f}x one GPU ({cell['single_img_s']:,.0f} img/s, same "
              f"job), efficiency {'n/a' if eff is None else f'{eff:.3f}'}, overlap {'n/a' if ov is None else f'{ov:.2f}'}",
              flush=True)
        targets.append(_overlap_target(f"scaling {n} GPUs", cell["overlap"]))
    if counts:
        n = counts[-1]
        targets.append(Target(f"{MODEL} {CONFIG} b{args.batch} replicas: scaling efficiency at {n} GPUs",
                              out["by_gpus"][n]["scaling_efficiency"] or 0.0, ">=", 0.95, "",
                              "one GPU alone in the same job (rank 0)"))


SWEEP_MODELS = ("resnet18", "resnet50", "mobilenet_v3_large", "vit_b_16")
SWEEP_CONFIGS = ("fp32", "tf32", "fp16-amp", "fp16-amp+channels_last", "bf16-amp", "fp16+channels_last+cudagraph")
SWEEP_BATCHES = (1, 8, 32, 128)


def part_sweep(args, results: dict, targets: list[Target]) -> None:
    models, configs, batches = ((SWEEP_MODELS[:2], SWEEP_CONFIGS[:2], SWEEP_BATCHES[:2]) if args.quick
                                else (SWEEP_MODELS, SWEEP_CONFIGS, SWEEP_BATCHES))
    spec = {"models": list(models), "configs": list(configs), "batch_sizes": list(batches), "modes": ["latency"],
            "measure": {"max_time_s": 0.3, "min_time_s": 0.05}}
    n = torch.cuda.device_count()
    out: dict = {"gpus": n, "spec": spec}
    results["sweep"] = out
    runs = {}
    for label, devices in (("one_gpu", None), ("all_gpus", n)):
        folder = tempfile.mkdtemp(prefix=f"gpuopt-sweep-{label}-")
        t0 = time.perf_counter()
        r = gpuopt.sweep(spec, folder, progress=False, devices=devices)
        out[f"{label}_wall_s"] = time.perf_counter() - t0
        out[f"{label}_cells"] = len(r.rows)
        out[f"{label}_failed"] = len(r.failed)
        runs[label] = r
        torch.cuda.empty_cache()  # what this process cached on cuda:0 is not rank 0's to lose
    one, every = [x.key for x in runs["one_gpu"].rows], [x.key for x in runs["all_gpus"].rows]
    out["same_cells"] = sorted(one) == sorted(every)
    out["duplicated"] = len(every) - len(set(every))
    out["speedup"] = out["one_gpu_wall_s"] / out["all_gpus_wall_s"]
    out["failed_cells"] = {label: {f"{x.model} {x.config} b{x.batch_size} {x.mode}": x.error for x in r.failed}
                           for label, r in runs.items()}
    # Where the N-GPU wall time went: each rank's busy time (its pieces), when it finished (from the
    # ranks' common start), and the rest -- torchrun's start, imports, the merge -- as the launch's share.
    ranks = runs["all_gpus"].spec.get("dist", {}).get("ranks", [])
    out["ranks"] = ranks
    out["pieces"] = runs["all_gpus"].spec.get("dist", {}).get("pieces")
    if ranks:
        busy = [x["busy_s"] for x in ranks]
        out["busy_max_over_mean"] = max(busy) / (sum(busy) / len(busy))
        out["outside_ranks_s"] = out["all_gpus_wall_s"] - max(x["end_s"] for x in ranks)
        print(f"sweep ranks: busy {', '.join(f'{b:.1f}' for b in busy)} s (max / mean {out['busy_max_over_mean']:.2f}), "
              f"units {[x['units'] for x in ranks]}, {out['pieces']} pieces; launch and merge "
              f"{out['outside_ranks_s']:.1f} s of {out['all_gpus_wall_s']:.1f} s", flush=True)
    print(f"REPORT sweep of {len(one)} cells: {n} GPUs {out['all_gpus_wall_s']:.0f} s, one GPU "
          f"{out['one_gpu_wall_s']:.0f} s = {out['speedup']:.2f}x; same cells: {out['same_cells']}, duplicated: "
          f"{out['duplicated']}, failed {out['all_gpus_failed']} / {out['one_gpu_failed']}", flush=True)
    targets.append(Target(f"sweep over {n} GPUs: cells identical to one GPU's (none lost or twice)",
                          float(out["same_cells"] and out["duplicated"] == 0), ">=", 1.0, "", "the one-GPU sweep"))
    targets.append(Target(f"sweep over {n} GPUs: wall-time speedup", out["speedup"], ">=", 0.7 * n, "x",
                          "the same sweep on one GPU, same run"))


def part_serve_rate(args, results: dict, targets: list[Target]) -> None:
    model, _ = gpuopt.zoo.get(MODEL)
    g = torch.Generator().manual_seed(0)
    samples = [torch.randn(3, 224, 224, generator=g) for _ in range(64)]
    cfg = CONFIG + "+cudagraph"
    n = torch.cuda.device_count()
    out: dict = {"slo_p99_ms": args.slo_ms, "gpus": n}
    results["serve_rate"] = out
    for label, kw in (("one_gpu", {"device": "cuda:0"}), ("all_gpus", {"devices": "all"})):
        s = gpuopt.Server(model, cfg, samples[0], max_batch_size=64, instances=2, **kw)
        s.add_samples(samples)
        try:
            search = gpuopt.max_rate(s, slo_ms=args.slo_ms, model_name=MODEL, duration_s=1.0 if args.quick else 3.0)
        finally:
            s.close(drain=False)
        out[label] = {"max_rate": search.max_rate, "steps": len(search.steps),
                      "offline": search.offline.throughput if search.offline else None}
        print(f"serve_rate {label}: {search.max_rate} req/s under p99 <= {args.slo_ms} ms", flush=True)
    a, b = out["one_gpu"]["max_rate"], out["all_gpus"]["max_rate"]
    out["speedup"] = (b / a) if a and b else None
    oa, ob = out["one_gpu"]["offline"], out["all_gpus"]["offline"]
    out["offline_speedup"] = (ob / oa) if oa and ob else None
    if out["speedup"]:
        # The rate ratio can pass N: N GPUs behind one queue hold a p99 at a higher share of their
        # capacity than one GPU does (queueing: pooled servers wait less at the same load), so the
        # offline (capacity) ratio is printed beside it.
        share = f"{a / oa:.0%} / {b / ob:.0%}" if oa and ob else "n/a"
        print(f"REPORT {MODEL} {cfg} max rate under p99 <= {args.slo_ms} ms: {n} GPUs {b:,.0f} req/s = "
              f"{out['speedup']:.2f}x one GPU ({a:,.0f} req/s); offline capacity {out['offline_speedup'] or 0:.2f}x; "
              f"max rate as a share of offline: {share} (one GPU / {n} GPUs)", flush=True)
    targets.append(Target(f"serving over {n} GPUs: max rate under p99 <= {args.slo_ms:g} ms / one GPU",
                          out["speedup"] or 0.0, ">=", 0.9 * n, "x", "a one-GPU server, same run"))


def main() -> int:
    args = parse_args("multi_gpu", _extra)
    require_gpu("multi_gpu")
    results: dict = {"errors": {}, "gpus": torch.cuda.device_count()}
    targets: list[Target] = []
    parts = {"replicas": part_replicas, "split": part_split, "shared": part_shared, "serve": part_serve,
             "scaling": part_scaling, "sweep": part_sweep, "serve_rate": part_serve_rate}
    for name in args.parts.split(","):
        if name not in parts:
            raise SystemExit(f"unknown part {name!r}; parts: {', '.join(parts)}")
        if name in ("replicas", "split", "serve", "scaling", "sweep", "serve_rate") and torch.cuda.device_count() < 2:
            results["errors"][name] = f"needs 2 or more GPUs, {torch.cuda.device_count()} visible"
            continue
        t0 = time.perf_counter()
        try:
            parts[name](args, results, targets)
        except Exception as exc:  # noqa: BLE001 - recorded; the other parts still run
            traceback.print_exc()
            results["errors"][name] = f"{type(exc).__name__}: {exc}"
            targets.append(Target(f"{name}: ran without error", 0.0, ">=", 1.0, "", str(exc)[:200]))
        print(f"[{name}: {time.perf_counter() - t0:.0f}s]", flush=True)
        write(args, results, targets, final=False)
    return write(args, results, targets)


if __name__ == "__main__":
    raise SystemExit(main())
