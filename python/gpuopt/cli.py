"""The `gpuopt` command line.

Each subcommand is a function that adds its parser (``_add_<name>``) and a function that runs it.
Exit codes: 0 success, 1 the work ran but something in it failed, 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence


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
        ("NVML", "yes" if e["nvml"] else "no (pip install nvidia-ml-py for clocks, power, ECC)"),
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
    from . import build_info, env

    e, b = env(), build_info()
    if args.json:
        print(json.dumps({"env": e, "build": b}, indent=2))
    else:
        print(format_env(e, b))
    return 0


_SUBCOMMANDS = [_add_env]


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
        from . import __version__

        print(__version__)
        return 0
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.run(args))
    except UsageError as exc:
        parser.exit(2, f"gpuopt {args.command}: error: {exc}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
