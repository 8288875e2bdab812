"""The `gpuopt` command line.

Each subcommand is a function that adds its parser (``_add_<name>``) and a function that runs it.
Exit codes: 0 success; 1 the work ran but something in it failed (failed cells, or a run that
stopped: the results so far are written); 2 a usage error, found before anything runs; 130
interrupted (Ctrl-C: the cells finished so far are saved).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .run.bench import BenchmarkPlan
    from .run.sweeps import SweepPlan


class UsageError(Exception):
    """Bad arguments found after parsing (exit code 2)."""


def _gib(nbytes: int | None) -> str:
    return "?" if nbytes is None else f"{nbytes / 2**30:.1f} GiB"


def format_env(e: dict, build: dict) -> str:
    rows: list[tuple[str, str]] = [
        ("gpuopt", f"{e['gpuopt']} (built for torch {build['torch_version']}, {build['build_type']})"),
        ("CUDA compiled", f"yes, archs {build['cuda_archs']}, nvcc {build['nvcc_version']}"
         if build["cuda"] else f"no ({build['no_cuda_reason']})"),
        ("torch", f"{e['torch']} (CUDA {e['torch_cuda'] or 'none'}, cuDNN {e['cudnn'] or 'none'})"),
        ("Python", f"{e['python']} ({e['python_executable']})"),
        ("CPU", f"{e['cpu']} ({e['cpu_count']} logical cores)"),
        ("Platform", e["platform"]),
        ("NVIDIA driver", f"{e['driver'] or 'not found'} (CUDA {e['cuda_driver_api'] or '-'}); "
                          f"runtime CUDA {e['cuda_runtime'] or '-'}"),
        ("NVML", "yes" if e["nvml"] else f"no: {e.get('nvml_missing') or 'not available'}"),
    ]
    if not e["gpus"]:
        rows.append(("GPU", "none visible (torch.cuda.is_available() is False)"))
    for g in e["gpus"]:
        l2 = f", L2 {g['l2_cache_bytes'] / 2**20:.0f} MiB" if g.get("l2_cache_bytes") else ""
        rows.append((f"GPU {g['index']}", f"{g['name']}, sm_{g['compute_capability'].replace('.', '')}, "
                                         f"{_gib(g['memory_bytes'])}, {g['sm_count']} SMs{l2}"))
        if "clock_sm_mhz" in g:
            ecc = {True: "on", False: "off", None: "?"}[g.get("ecc_enabled")]
            pers = {True: "on", False: "off", None: "?"}[g.get("persistence_mode")]
            rows.append(("", f"SM clock {g['clock_sm_mhz']}/{g['max_clock_sm_mhz']} MHz, memory clock "
                             f"{g['clock_mem_mhz']}/{g['max_clock_mem_mhz']} MHz, power limit "
                             f"{g['power_limit_w']} W, persistence {pers}, ECC {ecc}, "
                             f"{g['temperature_c']} C"))
        if g.get("mig"):
            rows.append(("", format_mig(g["mig"])))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def format_mig(mig: dict) -> str:
    """One line for a GPU's MIG layout (gpuopt.timing.nvml.mig_layout)."""
    mode = mig.get("mode", "unavailable")
    if mode == "unavailable":
        return f"MIG: unknown ({mig.get('reason') or 'NVML unavailable'})"
    text = f"MIG {mode}" + (f" (pending {mig['pending']} after a GPU reset)" if mig.get("pending") else "")
    if mode == "enabled":
        parts = [f"{d['uuid'] or '?'}: {_gib(d['memory_bytes'])}" + ("" if d["sm_count"] is None else
                                                                      f", {d['sm_count']} SMs")
                 for d in mig.get("devices", [])]
        text += f", {len(parts)} MIG device(s)" + (": " + "; ".join(parts) if parts else "")
    return text


def _add_env(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("env", help="describe this machine (GPUs, driver, CUDA, torch, build)")
    p.add_argument("--json", action="store_true", help="print JSON (environment and build info)")
    p.set_defaults(run=_run_env)


def _run_env(args: argparse.Namespace) -> int:
    from ._ext import build_info
    from .timing.environment import env

    e, b = env(), build_info()
    if args.json:
        print(json.dumps({"env": e, "build": b}, indent=2))
    else:
        print(format_env(e, b))
    return 0


def _csv_list(value: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {value!r}")
    return items


def _int_list(value: str) -> list[int]:
    out = []
    for v in _csv_list(value):
        try:
            n = int(v)
        except ValueError:
            raise argparse.ArgumentTypeError(f"batch sizes must be positive integers, got {v!r}") from None
        if n <= 0:
            raise argparse.ArgumentTypeError(f"batch sizes must be positive integers, got {n}")
        out.append(n)
    return out


def _positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value!r}")
    return n


def _fraction(value: str) -> float:
    from .timing.comparison import check_min_effect

    try:
        return check_min_effect(float(value))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("min_effect=", "")) from None


def _default_output(model: str) -> str:
    import datetime as dt

    return f"gpuopt-results/{model}-{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"


def _measure_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-time-s", type=float, default=1.0,
                   help="sampling budget per cell and mode (default 1 s: the whole default run in about "
                        "two minutes; raise it for tighter intervals)")
    p.add_argument("--target-rel-ci", type=float, help="stop when the median's CI is within this (default 0.01)")
    p.add_argument("--iters", type=int, help="exactly this many samples per cell (no adaptive stop)")
    p.add_argument("--quiet", "-q", action="store_true", help="print only the final summary and errors")


def _measure_options(args: argparse.Namespace) -> dict:
    return {k: v for k, v in (("max_time_s", args.max_time_s), ("target_rel_ci", args.target_rel_ci),
                              ("iters", args.iters)) if v is not None}


def _add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark a model across configs and batch sizes (the main job)",
                       description="With no model: ResNet-50 with fp32, fp16-amp, fp16-amp+channels_last, "
                                   "TorchScript and torch.compile over batch sizes 1,8,16,32 on a GPU; a tiny "
                                   "CNN with CPU configs on a machine without one.")
    p.add_argument("model", nargs="?", help="a zoo model (gpuopt.zoo.names()); default resnet50 / tiny-cnn")
    p.add_argument("--configs", type=_csv_list, help="preset name or comma-separated configs, e.g. fp32,fp16-amp")
    p.add_argument("--batch-sizes", type=_int_list, help="comma-separated, e.g. 1,8,16,32")
    p.add_argument("--modes", type=_csv_list, help="latency,throughput,graph,host,end-to-end")
    p.add_argument("--train", action="store_true", help="also time training steps")
    p.add_argument("--no-parity", action="store_true", help="skip the parity gate against fp32")
    p.add_argument("--profile", action="store_true", help="profile each config at the largest batch")
    p.add_argument("--device", help="cuda, cuda:1 or cpu")
    p.add_argument("--gpus", type=_devices,
                   help="one process per GPU through torch.distributed: 'all', a count, or indices 0,2; with "
                        "--device cpu the number of CPU ranks (see README: Several GPUs)")
    p.add_argument("--strategy", default="replicas",
                   help="with --gpus: replicas (each rank its own batches, default) or split (each batch size is "
                        "the global batch, scattered over the ranks and gathered back)")
    p.add_argument("--output", help="results folder (default gpuopt-results/<model>-<time>)")
    _measure_args(p)
    p.set_defaults(run=_run_bench)


def _devices(value: str) -> str | int | list[int]:
    """--gpus: 'all', a count (2) or a comma-separated list of indices (0,2)."""
    if value == "all":
        return value
    try:
        return [int(v) for v in _csv_list(value)] if "," in value else int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'all', a number of GPUs or indices like 0,2; got {value!r}") from None


def _run_bench(args: argparse.Namespace) -> int:
    import torch

    from .run.bench import plan_benchmark

    gpu = torch.cuda.is_available() and (args.device is None or not args.device.startswith("cpu"))
    model = args.model or ("resnet50" if gpu else "tiny-cnn")
    configs = args.configs or [None]  # None: benchmark() picks the preset for the device and --train
    out = args.output or _default_output(model)
    if args.gpus is not None and args.device is None and not torch.cuda.is_available():
        raise UsageError("--gpus asks for GPUs and none is visible; for ranks on the CPU give --device cpu "
                         "(e.g. --gpus 2 --device cpu)")
    try:
        plan = plan_benchmark(model, configs=configs[0] if len(configs) == 1 else configs,
                              batch_sizes=args.batch_sizes or [1, 8, 16, 32],
                              modes=args.modes, parity=not args.no_parity,
                              train=args.train, output_dir=out, device=args.device, profile=args.profile,
                              progress=not args.quiet, devices=args.gpus, strategy=args.strategy,
                              **_measure_options(args))
    except (ValueError, TypeError, ImportError) as exc:
        raise UsageError(str(exc)) from exc
    if not gpu and args.device is None and not args.quiet:  # after the usage checks: their error comes alone
        print("No CUDA GPU found: running the CPU flow (tiny model, CPU configs).", file=sys.stderr)
    return _run_plan(plan, "bench", out, args.quiet,
                     f"{out}/ (results.json, results.csv, report.md, plots)", "")


def _run_plan(plan: BenchmarkPlan | SweepPlan, command: str, out: str, quiet: bool, where: str,
              resume_hint: str, failed_cells: int = 1) -> int:
    """Run a validated plan: 0 when every cell succeeded, ``failed_cells`` when one failed, 1 when the
    run stopped, 130 when interrupted (the results so far are written in every case)."""
    try:
        results = plan.run()
    except KeyboardInterrupt:
        saved = len(plan.results.rows) if plan.results is not None else 0
        print(f"\ngpuopt {command}: interrupted; {saved} cells saved in {out}/{resume_hint}", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - not a usage error: the run had started
        print(f"gpuopt {command}: the run stopped: {type(exc).__name__}: {exc}\nresults so far: {where}",
              file=sys.stderr)
        return 1
    if quiet:
        from .report.table import wrapped

        n = len(results.rows)
        print(f"{n} cell{'' if n == 1 else 's'}, {len(results.failed)} failed; results: {where}")
        for r in results.failed:
            print(wrapped(f"failed: {r.model} b{r.batch_size} {r.config} {r.mode}: ", r.error or ""),
                  file=sys.stderr)
    else:
        print(results.table())
        print(f"\nresults: {where}")
    return failed_cells if results.failed else 0


def _add_sweep(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="run a sweep spec (TOML/YAML/JSON), resumable")
    p.add_argument("spec", help="sweep spec file")
    p.add_argument("--output", required=True, help="results folder (cells.jsonl is appended cell by cell)")
    p.add_argument("--no-resume", action="store_true",
                   help="start over: an earlier sweep's files in --output are moved to previous-<time>/")
    p.add_argument("--quiet", "-q", action="store_true", help="print only the final summary and errors")
    p.add_argument("--gpus", type=_devices,
                   help="spread the cells over one process per GPU through torchrun: 'all', a count, or indices "
                        "0,2; with device = 'cpu' in the spec the number of CPU ranks. Inside a torchrun job "
                        "(yours, several machines too) the default is 'all': its ranks (see README: Several GPUs)")
    p.set_defaults(run=_run_sweep)


def _run_sweep(args: argparse.Namespace) -> int:
    from .dist.worker import torchrun_env
    from .run.sweeps import plan_sweep

    devices = args.gpus if args.gpus is not None or torchrun_env() is None else "all"
    try:
        plan = plan_sweep(args.spec, args.output, resume=not args.no_resume, progress=not args.quiet,
                          devices=devices)
    except (ValueError, TypeError, ImportError) as exc:
        raise UsageError(str(exc)) from exc
    joined = torchrun_env()
    if joined is not None:  # one rank of several: a line of its own; rank 0 merged every rank's cells
        rank, world, _ = joined
        where = f"{args.output}/ ({'merged by this rank, 0' if rank == 0 else f'rank {rank}'} of {world})"
        # exit 0 with failed cells: a rank's error status would make torchrun stop the job
        return _run_plan(plan, f"sweep (rank {rank})", args.output, True, where,
                         f" (cells-rank{rank}.jsonl); rerun the same command to resume", failed_cells=0)
    return _run_plan(plan, "sweep", args.output, args.quiet, f"{args.output}/",
                     " (cells.jsonl); rerun the same command to resume")


def _load_results(paths: list[str]):
    from .report.results import Results

    try:
        return [Results.load(p) for p in paths]
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def _add_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="Markdown report of a results file; several files: cross-hardware report")
    p.add_argument("results", nargs="+", help="results.json file(s)")
    p.add_argument("--baseline", help="config the speedups are against (default: the first)")
    p.add_argument("--output", help="write the report here instead of printing it")
    p.set_defaults(run=_run_report)


def _run_report(args: argparse.Namespace) -> int:
    from ._files import write_atomic

    loaded = _load_results(args.results)
    if len(loaded) == 1:
        try:
            loaded[0].speedups(args.baseline)  # checks the baseline names a config (and caches the bootstraps)
        except ValueError as exc:
            raise UsageError(f"--baseline: {exc}") from exc
        text = loaded[0].to_markdown(baseline=args.baseline)
    else:
        if args.baseline is not None:
            raise UsageError("--baseline applies to the report of one results file; a cross-hardware report "
                             "compares each config across the files")
        from .report.crosshw import cross_hardware_markdown

        try:
            text = cross_hardware_markdown(loaded)
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
    if args.output:
        write_atomic(args.output, text)
        print(f"wrote {args.output}")
    else:
        print(text)
    return 0


def _add_compare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="per-cell speedups of B over A with significance")
    p.add_argument("a", help="baseline results.json")
    p.add_argument("b", help="candidate results.json")
    p.add_argument("--min-effect", type=_fraction, default=0.01,
                   help="smallest relative change called a difference, as a fraction (default 0.01: 1%%)")
    p.add_argument("--run-to-run", type=float, default=None, metavar="FRACTION",
                   help="run-to-run spread of this environment, e.g. 0.02 from gpuopt.calibrate(); the two "
                        "files are separate runs, so a difference must exceed it too (default: 0.03 on GPU, "
                        "0.05 on CPU)")
    p.set_defaults(run=_run_compare)


def _run_compare(args: argparse.Namespace) -> int:
    from .report.table import text_table
    from .timing.calibration import RunToRun
    from .timing.comparison import compare

    if args.run_to_run is not None and not 0 <= args.run_to_run < float("inf"):
        raise UsageError(f"--run-to-run must be a finite fraction >= 0 (0.02 is 2%), got {args.run_to_run}")
    a, b = _load_results([args.a, args.b])
    rows = []
    band = None
    for ra in a.ok:
        rb = b.find(*ra.key)
        if rb is None or rb.measurement is None or ra.measurement is None:
            continue
        if band is None:
            band = (RunToRun(args.run_to_run, "given") if args.run_to_run is not None
                    else RunToRun.default(ra.measurement))
        c = compare(ra.measurement, rb.measurement, min_effect=args.min_effect, run_to_run=band)
        rows.append([ra.model, ra.config, str(ra.batch_size), ra.mode, f"{c.speedup:.3f}x",
                     f"[{c.ci[0]:.3f}, {c.ci[1]:.3f}]", c.verdict])
    if not rows:
        raise UsageError("the two results files have no successful cell in common (model, config, batch, mode)")
    print(f"A: {args.a} ({a.device})\nB: {args.b} ({b.device})\n")
    print(text_table(["model", "config", "batch", "mode", "B vs A", "95% CI", "verdict"], rows,
                     [False, False, True, False, True, True, False]))
    print(f"\ncross-run comparison: widened by run-to-run spread {band.describe()}"
          + ("" if args.run_to_run is not None else "; pass --run-to-run from gpuopt.calibrate() to use a measured one"))
    return 0


def _add_plot(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot", help="PNG and SVG plots of a results file")
    p.add_argument("results", help="results.json")
    p.add_argument("--output", required=True, help="folder for the plots")
    p.set_defaults(run=_run_plot)


def _run_plot(args: argparse.Namespace) -> int:
    from ._files import check_writable
    from .report.plots import save_all

    (res,) = _load_results([args.results])
    if not res.ok:
        print(f"gpuopt plot: every cell in {args.results} failed ({len(res.rows)} cells): nothing to plot; "
              f"`gpuopt report {args.results}` lists the reasons", file=sys.stderr)
        return 1
    try:
        paths = save_all(res, check_writable(args.output))
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0


def _add_ceilings(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ceilings", help="measure this GPU's bandwidth, FLOP/s and overhead ceilings (cached)")
    p.add_argument("--refresh", action="store_true", help="measure again instead of reading the cache")
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke run, not a ceiling")
    p.add_argument("--device", help="cuda:N")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=_run_ceilings)


def _run_ceilings(args: argparse.Namespace) -> int:
    from .analysis.device_ceilings import ceilings, format_ceilings

    try:
        doc = ceilings(args.device, refresh=args.refresh, quick=args.quick)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    print(json.dumps(doc, indent=2) if args.json else format_ceilings(doc))
    return 0


def _add_profile(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="torch.profiler summary (and traces) of a model under a config")
    p.add_argument("model", help="a zoo model")
    p.add_argument("--config", default="fp32", help="config string (default fp32)")
    p.add_argument("--batch-size", type=_positive_int, default=8)
    p.add_argument("--steps", type=_positive_int, default=5, help="profiled iterations")
    p.add_argument("--device", help="cuda, cuda:1 or cpu")
    p.add_argument("--output", help="folder for Chrome/Perfetto and TensorBoard traces")
    p.set_defaults(run=_run_profile)


def _run_profile(args: argparse.Namespace) -> int:
    from .analysis.profiler import profile
    from .prepare.config import Config
    from .run.workload import resolve_device
    from .run.zoo import get

    try:
        model, make = get(args.model)
        config = Config.parse(args.config)
        device = resolve_device(args.device)
    except (ValueError, TypeError) as exc:
        raise UsageError(str(exc)) from exc
    inputs = make(args.batch_size)
    prepared = config.apply(model, inputs, device=device)
    if not prepared.ok:
        print(f"config {config.label} failed: {prepared.error}", file=sys.stderr)
        return 1
    summary = profile(prepared, inputs, steps=args.steps, output_dir=args.output)
    print(summary)
    return 0


def _positive_float(value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        x = 0.0
    if not 0 < x < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {value!r}")
    return x


def _sizes(value: str) -> list[int]:
    try:
        out = [int(v) for v in _csv_list(value)]
    except ValueError:
        out = [0]
    if min(out) <= 0:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {value!r}")
    return out


def _add_serve(sub: argparse._SubParsersAction) -> None:
    from .serving import ARRIVALS, BATCHERS, SCENARIOS

    p = sub.add_parser(
        "serve", help="serve a model with gpuopt's dynamic batcher under a LoadGen-style load",
        description="One load run, a maximum-rate search under an SLO (--find-max-rate) or a latency curve "
                    "(--curve). Exit 0 when every run answered its queries (a run that could not keep up is "
                    "printed INVALID, as LoadGen marks it); 1 when a run failed or no rate met the SLO.")
    p.add_argument("model", help="a zoo model (gpuopt.zoo.names())")
    p.add_argument("--config", default="fp32", help="config string (default fp32), e.g. fp16+channels_last+cudagraph")
    p.add_argument("--scenario", choices=SCENARIOS, default="server", help="default server")
    p.add_argument("--rate", type=_positive_float, help="server: queries per second")
    p.add_argument("--slo-ms", type=_positive_float, help="latency bound of the reported percentile (p99)")
    p.add_argument("--batcher", choices=BATCHERS, default="gpuopt", help="gpuopt (default) or naive, the Python "
                   "baseline")
    p.add_argument("--max-batch-size", type=_positive_int, default=32)
    p.add_argument("--max-queue-delay-us", type=int, help="how long a request may wait for a fuller batch "
                   "(default 0; naive: its gather window, default 1000)")
    p.add_argument("--preferred-batch-sizes", type=_sizes, help="comma-separated, e.g. 8,16,32")
    p.add_argument("--buckets", type=_sizes, help="sequence-length buckets, e.g. 32,64,128")
    p.add_argument("--instances", type=_positive_int, default=2, help="model executors (default 2)")
    p.add_argument("--max-queue-size", type=int, default=0, help="requests beyond it are rejected (default 0: "
                   "unbounded)")
    p.add_argument("--timeout-ms", type=_positive_float, help="a request still queued after it is rejected")
    p.add_argument("--concurrency", type=_positive_int, help="closed-loop clients")
    p.add_argument("--arrival", choices=ARRIVALS, help="server arrivals (default poisson; trace with --trace-file)")
    p.add_argument("--burstiness", type=_positive_float, help="gamma arrivals: squared coefficient of variation")
    p.add_argument("--trace-file", help="gaps between arrivals in seconds, one per line")
    p.add_argument("--duration-s", type=float, help="issue for at least this long")
    p.add_argument("--min-queries", type=_positive_int, help="issue at least this many queries")
    p.add_argument("--samples", type=_positive_int, default=64, help="distinct request inputs (default 64)")
    p.add_argument("--device", help="cuda, cuda:1 or cpu")
    p.add_argument("--gpus", type=_devices,
                   help="serve a replica on each of several GPUs: 'all', a count, or indices 0,2; --instances "
                        "executors per GPU, the first free one takes the next batch (see README: Several GPUs)")
    p.add_argument("--find-max-rate", action="store_true",
                   help="bisect for the highest Poisson rate whose p99 stays under --slo-ms")
    p.add_argument("--curve", type=_positive_float, nargs="+", metavar="POINT",
                   help="a run per point: rates (server) or client counts (closed-loop)")
    p.add_argument("--output", help="results folder (results.json, results.csv, report.md, plots)")
    p.set_defaults(run=_run_serve)


def _serve_plan(args: argparse.Namespace):
    """Everything checked before the model is prepared: (config, device, load fields, server
    keywords); UsageError naming the problem."""
    from .prepare.config import Config
    from .run import zoo
    from .run.workload import resolve_device
    from .serving import LoadSpec
    from .serving.server import batcher_options

    if args.find_max_rate and args.curve:
        raise UsageError("--find-max-rate and --curve are two different runs: give one")
    if args.find_max_rate and (args.slo_ms is None or args.scenario != "server" or args.rate is not None):
        raise UsageError("--find-max-rate needs --slo-ms, and picks the server scenario's rates itself (no --rate, "
                         "no other --scenario)")
    if args.curve:
        if args.scenario not in ("server", "closed-loop"):
            raise UsageError(f"--curve gives rates (--scenario server) or client counts (--scenario closed-loop), "
                             f"not points of {args.scenario!r}")
        if args.rate is not None or args.concurrency is not None:
            raise UsageError("--curve gives the rates or client counts: leave out --rate and --concurrency")
        if args.scenario == "closed-loop" and any(c != int(c) for c in args.curve):
            raise UsageError(f"closed-loop --curve points are client counts (integers), got {args.curve}")
        if len(set(args.curve)) != len(args.curve):
            raise UsageError(f"--curve points must differ, got {args.curve}")
    load = {k: v for k, v in (("arrival", args.arrival), ("burstiness", args.burstiness),
                              ("trace_file", args.trace_file), ("duration_s", args.duration_s),
                              ("min_queries", args.min_queries), ("concurrency", args.concurrency)) if v is not None}
    if args.trace_file is not None and args.arrival is None:
        load["arrival"] = "trace"
    server_kw = {"max_batch_size": args.max_batch_size, "preferred_batch_sizes": args.preferred_batch_sizes,
                 "buckets": args.buckets, "instances": args.instances, "max_queue_size": args.max_queue_size,
                 "timeout_ms": args.timeout_ms}
    if args.gpus is not None:
        if args.device is not None:
            raise UsageError("--gpus serves on several GPUs and --device names one: give one of them")
        if args.batcher == "naive":
            raise UsageError("--gpus applies to --batcher gpuopt (the naive baseline serves on one device)")
    try:
        zoo.spec(args.model)
        config = Config.parse(args.config)
        device = resolve_device(args.device) if args.gpus is None else None
        if args.gpus is not None:
            import torch

            from ._checks import cuda_indices

            if not torch.cuda.is_available():
                raise ValueError(f"--gpus {args.gpus} serves on GPUs and none is visible")
            server_kw["devices"] = cuda_indices("--gpus", args.gpus)
        probe = {"scenario": args.scenario, "rate": 1.0 if args.find_max_rate else args.rate, "slo_ms": args.slo_ms,
                 **load}
        if args.curve:  # its first point stands for all
            probe["rate" if args.scenario == "server" else "concurrency"] = (
                args.curve[0] if args.scenario == "server" else int(args.curve[0]))
        LoadSpec(**probe).options()
        delay = args.max_queue_delay_us
        batcher_options(max_queue_delay_us=0 if delay is None else delay, timeout_action="reject", priority_levels=1,
                        **{k: v for k, v in server_kw.items() if k != "instances"})
        if delay is not None:
            server_kw["naive_max_wait_ms" if args.batcher == "naive" else "max_queue_delay_us"] = (
                delay / 1e3 if args.batcher == "naive" else delay)
        if args.output:
            from ._files import check_writable

            check_writable(args.output)
    except (ValueError, TypeError, FileNotFoundError) as exc:
        raise UsageError(str(exc)) from exc
    return config, device, load, server_kw


def _run_serve(args: argparse.Namespace) -> int:
    from .report.results import Results, Row, serving_mode
    from .serving import Server, build, latency_curve, max_rate

    config, device, load, server_kw = _serve_plan(args)
    results = Results.new(spec={k: v for k, v in vars(args).items() if k not in ("run", "version")})
    runs = []
    status = 0
    target = None
    try:
        target, name = build(args.model, config, batcher=args.batcher, samples=args.samples, device=device,
                             **server_kw)
        if args.find_max_rate:
            search = max_rate(target, slo_ms=args.slo_ms, model_name=name, **load)
            runs = ([search.offline] if search.offline else []) + search.steps
            print("\n".join(r.summary() for r in runs))
            print(search.summary())
            status = 0 if search.best is not None else 1
        elif args.curve:
            points = {"rates": args.curve} if args.scenario == "server" else {
                "concurrencies": [int(c) for c in args.curve]}
            runs = latency_curve(target, model_name=name, slo_ms=args.slo_ms, **points,
                                 **{k: v for k, v in load.items() if k != "concurrency"})
            print("\n".join(r.summary() for r in runs))
        else:
            runs = [target.run_load(model_name=name, scenario=args.scenario, rate=args.rate, slo_ms=args.slo_ms,
                                    **load)]
            print(runs[0].summary())
    except KeyboardInterrupt:
        print("\ngpuopt serve: interrupted", file=sys.stderr)
        status = 130
    except Exception as exc:  # noqa: BLE001 - not a usage error: the run had started
        # The searches return their runs at the end: the row of a run that stopped is the failure itself.
        reason = f"{type(exc).__name__}: {exc}"
        print(f"gpuopt serve: the run stopped: {reason}", file=sys.stderr)
        mode = serving_mode({"scenario": args.scenario, "rate": args.rate, **load}, naive=args.batcher == "naive")
        results.add(Row.failed(reason, model=args.model, config=config.label, batch_size=args.max_batch_size,
                               mode=mode, item_unit="requests", device=str(device or "cuda"),
                               precision=config.precision))
        status = 1
    finally:
        if isinstance(target, Server):
            target.close(drain=False)
    for r in runs:
        results.add(r.row(precision=config.precision))
    if any(not r.ok for r in results.rows):
        status = status or 1
    if args.output:
        results.save(args.output)
        print(f"results: {args.output}/ (results.json, results.csv, report.md, plots)")
    return status


def _add_llm(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "llm", help="LLM prefill/decode: TTFT, TPOT, tokens/s and bandwidth per decode path, precision and shape",
        description="Measures every combination of models, paths, precisions, batch sizes, prompt lengths and "
                    "new tokens (random prompts, greedy decoding, random weights: nothing is downloaded), each "
                    "cell checked against the fp32 reference's tokens and logits. Prints a line per cell as it "
                    "goes and a table at the end, and writes results.json, results.csv, report.md and plots to "
                    "--out. Exit 0 when every cell ran; 1 when a cell failed (the results are written); 2 for a "
                    "usage error, found before anything runs.")
    p.add_argument("models", nargs="*", metavar="MODEL", help="built-in causal LMs (--list-models lists them)")
    p.add_argument("--paths", type=_csv_list,
                   help="decode paths (default hf-generate,static-graph on a GPU, hf-generate,static on a CPU)")
    p.add_argument("--precisions", type=_csv_list, default=["fp16"], help="fp32, fp16, bf16, int8wo (default fp16)")
    p.add_argument("--batch-sizes", type=_sizes, default=[1, 8, 32], help="comma-separated (default 1,8,32)")
    p.add_argument("--prompt", type=_sizes, default=[128], metavar="TOKENS",
                   help="prompt lengths, comma-separated (default 128)")
    p.add_argument("--new-tokens", type=_sizes, default=[128], metavar="TOKENS",
                   help="tokens generated per request, comma-separated (default 128)")
    p.add_argument("--device", help="cuda, cuda:N or cpu (default cuda when visible)")
    p.add_argument("--out", "--output", dest="out",
                   help="results folder (default gpuopt-results/llm-<model>-<time>); results.json is written "
                        "after each cell")
    p.add_argument("--max-time-s", type=_positive_float,
                   help="sampling budget per cell, in seconds of whole requests (default 10)")
    p.add_argument("--no-parity", action="store_true", help="skip the parity check against the fp32 reference")
    p.add_argument("--parity-tokens", type=_positive_int, default=32,
                   help="generated tokens compared with the reference per cell (default 32)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights and prompts (default 0)")
    p.add_argument("--list-models", action="store_true", help="list the built-in models, paths and precisions")
    p.set_defaults(run=_run_llm)


def _list_llm_models() -> str:
    from .llm import PATHS, PRECISIONS, describe_models
    from .report.table import text_table

    table = text_table(["model", "what it is"], [[k, v] for k, v in describe_models().items()])
    return f"{table}\n\npaths: {', '.join(PATHS)}\nprecisions: {', '.join(PRECISIONS)}"


def _check_out(path: str) -> None:
    """UsageError when ``path`` cannot become a results folder; creates nothing (a later usage error
    leaves no empty folder behind)."""
    import os

    p = Path(path).absolute()
    if p.exists() and not p.is_dir():
        raise UsageError(f"--out {path!r} exists and is not a folder")
    parent = next(a for a in [p, *p.parents] if a.exists())
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"--out {path!r}: {str(parent)!r} is not writable")


def _run_llm(args: argparse.Namespace) -> int:
    from .llm import decode_sweep
    from .report.llm_report import llm_text_table
    from .report.results import Results
    from .run.workload import resolve_device

    if args.list_models:
        if args.models:
            raise UsageError("--list-models lists the built-in models: give no MODEL with it")
        print(_list_llm_models())
        return 0
    if not args.models:
        raise UsageError("give at least one MODEL (gpuopt llm --list-models lists them)")
    try:
        device = resolve_device(args.device)
    except (ValueError, TypeError) as exc:
        raise UsageError(str(exc)) from exc
    gpu = device.type == "cuda"
    paths = args.paths or (["hf-generate", "static-graph"] if gpu else ["hf-generate", "static"])
    out = args.out or _default_output(f"llm-{args.models[0]}")
    _check_out(out)
    options = {} if args.max_time_s is None else {"max_time_s": args.max_time_s}

    def say(line: str) -> None:
        print(line, flush=True)

    try:
        results = decode_sweep(args.models, paths=paths, precisions=args.precisions, batch_sizes=args.batch_sizes,
                               prompt_lens=args.prompt, new_tokens=args.new_tokens, device=device, seed=args.seed,
                               parity=not args.no_parity, parity_tokens=args.parity_tokens, out=out, progress=say,
                               **options)
    except (ValueError, TypeError, ImportError) as exc:
        # decode_sweep checks every name, length and option before the first cell, and records what
        # fails in a cell as a failed row: what it raises is a usage error.
        raise UsageError(str(exc)) from exc
    except KeyboardInterrupt:
        saved = Path(out) / "results.json"
        if saved.exists():
            Results.load(saved).save(out, plots=False)
        print(f"\ngpuopt llm: interrupted; the cells finished so far are in {out}/", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - not a usage error: the run had started
        print(f"gpuopt llm: the run stopped: {type(exc).__name__}: {exc}\nresults so far: {out}/results.json",
              file=sys.stderr)
        return 1
    results.save(out)
    print()
    print(llm_text_table(results))
    print(f"\nresults: {out}/ (results.json, results.csv, report.md, plots)")
    return 1 if results.failed else 0


def _add_optimize(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("optimize", help="search configs x batch sizes for the best one under latency / memory budgets",
                       description="Successive halving over the device's configs and batch sizes (gpuopt.optimize): "
                                   "short measurements rank the candidates, longer ones confirm the best; prints the "
                                   "answer, the runner-up with a confidence interval and the search log.")
    p.add_argument("model", help="a zoo model (gpuopt.zoo.names())")
    p.add_argument("--objective", default="throughput", help="throughput (default), latency or energy")
    p.add_argument("--slo-p99-ms", type=float, help="p99 latency per call at most this many ms")
    p.add_argument("--memory-gb", type=float, help="peak allocated memory at most this many GB")
    p.add_argument("--configs", type=_csv_list, help="preset name or comma-separated configs (default: the "
                                                      "device's candidate set)")
    p.add_argument("--batch-sizes", type=_int_list, help="comma-separated (default 1,2,4,...,256; 1 for latency)")
    p.add_argument("--budget-s", type=float, help="stop the search after this many seconds with the best so far")
    p.add_argument("--device", help="cuda, cuda:1 or cpu")
    p.add_argument("--no-parity", action="store_true", help="skip the parity gate against fp32")
    p.add_argument("--quick", action="store_true", help="shorter measurements (a smoke run)")
    p.add_argument("--output", help="folder for optimize.json, report.md, the front plot and the results "
                                    "(default gpuopt-results/<model>-optimize-<time>)")
    p.add_argument("--quiet", "-q", action="store_true", help="print only the answer")
    p.set_defaults(run=_run_optimize)


def _run_optimize(args: argparse.Namespace) -> int:
    from ._files import check_writable, write_atomic
    from .optimizer import optimize

    out = args.output or _default_output(f"{args.model}-optimize")
    configs = args.configs
    if configs is not None and len(configs) == 1:
        configs = configs[0]
    quick = {"rung_options": [{"max_time_s": 0.05, "min_time_s": 0.01, "target_rel_ci": 0.05}],
             "confirm_options": {"max_time_s": 0.2, "min_time_s": 0.05, "target_rel_ci": 0.02}} if args.quick else {}
    try:
        check_writable(out)
        result = optimize(args.model, None, objective=args.objective, slo_p99_ms=args.slo_p99_ms,
                          memory_gb=args.memory_gb, configs=configs, batch_sizes=args.batch_sizes,
                          budget_s=args.budget_s, device=args.device, parity=not args.no_parity,
                          progress=not args.quiet, **quick)
    except (ValueError, TypeError, ImportError) as exc:
        raise UsageError(str(exc)) from exc
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    result.results.save(folder / "results", plots=False)
    write_atomic(folder / "optimize.json", json.dumps(result.to_dict(), indent=2, default=str))
    write_atomic(folder / "report.md", result.to_markdown())
    try:
        if result.pareto["measured"]:
            import matplotlib.pyplot as plt

            plt.close(result.plot_front(path=folder / "front"))  # a command leaves no figure open
    except ImportError:
        pass  # matplotlib is optional: the report has the front as a table
    print(result.summary())
    print(f"\nresults: {folder}/ (optimize.json, report.md, front.png, results/)")
    return 0 if result.found else 1


_SUBCOMMANDS = [_add_env, _add_bench, _add_sweep, _add_report, _add_compare, _add_plot, _add_ceilings, _add_profile,
                _add_serve, _add_llm, _add_optimize]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuopt",
        description="Measure and optimize PyTorch models on NVIDIA GPUs.",
    )
    parser.add_argument("--version", action="store_true", help="print gpuopt's version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in _SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # exits with status 2 on unknown commands or options
    if args.version:
        from ._ext import build_info

        print(build_info()["gpuopt_version"])
        return 0
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.run(args))
    except UsageError as exc:
        parser.exit(2, f"gpuopt {args.command}: error: {exc}\n")
    except KeyboardInterrupt:  # before a run started (loading models, measuring ceilings)
        print(f"\ngpuopt {args.command}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
