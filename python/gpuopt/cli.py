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
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


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
    p.add_argument("--output", help="results folder (default gpuopt-results/<model>-<time>)")
    _measure_args(p)
    p.set_defaults(run=_run_bench)


def _run_bench(args: argparse.Namespace) -> int:
    import torch

    from .run.bench import plan_benchmark

    gpu = torch.cuda.is_available() and (args.device is None or not args.device.startswith("cpu"))
    model = args.model or ("resnet50" if gpu else "tiny-cnn")
    configs = args.configs or [None]  # None: benchmark() picks the preset for the device and --train
    out = args.output or _default_output(model)
    try:
        plan = plan_benchmark(model, configs=configs[0] if len(configs) == 1 else configs,
                              batch_sizes=args.batch_sizes or [1, 8, 16, 32],
                              modes=args.modes or ("latency", "throughput"), parity=not args.no_parity,
                              train=args.train, output_dir=out, device=args.device, profile=args.profile,
                              progress=not args.quiet, **_measure_options(args))
    except (ValueError, TypeError, ImportError) as exc:
        raise UsageError(str(exc)) from exc
    if not gpu and args.device is None and not args.quiet:  # after the usage checks: their error comes alone
        print("No CUDA GPU found: running the CPU flow (tiny model, CPU configs).", file=sys.stderr)
    return _run_plan(plan, "bench", out, args.quiet,
                     f"{out}/ (results.json, results.csv, report.md, plots)", "")


def _run_plan(plan: BenchmarkPlan | SweepPlan, command: str, out: str, quiet: bool, where: str,
              resume_hint: str) -> int:
    """Run a validated plan: 0 when every cell succeeded, 1 when one failed or the run stopped, 130
    when interrupted (the results so far are written in every case)."""
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
    return 1 if results.failed else 0


def _add_sweep(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="run a sweep spec (TOML/YAML/JSON), resumable")
    p.add_argument("spec", help="sweep spec file")
    p.add_argument("--output", required=True, help="results folder (cells.jsonl is appended cell by cell)")
    p.add_argument("--no-resume", action="store_true",
                   help="start over: an earlier sweep's files in --output are moved to previous-<time>/")
    p.add_argument("--quiet", "-q", action="store_true", help="print only the final summary and errors")
    p.set_defaults(run=_run_sweep)


def _run_sweep(args: argparse.Namespace) -> int:
    from .run.sweeps import plan_sweep

    try:
        plan = plan_sweep(args.spec, args.output, resume=not args.no_resume, progress=not args.quiet)
    except (ValueError, TypeError, ImportError) as exc:
        raise UsageError(str(exc)) from exc
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


_SUBCOMMANDS = [_add_env, _add_bench, _add_sweep, _add_report, _add_compare, _add_plot, _add_ceilings, _add_profile]


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
