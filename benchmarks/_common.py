"""Shared plumbing of gpuopt's benchmark scripts: arguments, the environment record, targets, and a
JSON file under benchmarks/results/ with everything needed to believe (or doubt) the numbers."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

import gpuopt
from gpuopt._files import write_atomic
from gpuopt.timing.environment import git_commit as _git_commit

RESULTS = Path(__file__).resolve().parent / "results"


def parse_args(name: str, extra=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=f"gpuopt benchmark: {name}")
    p.add_argument("--out", type=Path, default=None, help="JSON file to write (default: benchmarks/results/)")
    p.add_argument("--quick", action="store_true", help="smaller sizes and budgets, for a smoke run")
    if extra is not None:
        extra(p)
    args = p.parse_args()
    args.name = name
    return args


def git_commit() -> str:
    """The commit the results come from: GPUOPT_GIT_COMMIT when the caller knows it better (a copy of a
    working tree, whose .git may be another commit's), else the repository's HEAD."""
    return os.environ.get("GPUOPT_GIT_COMMIT") or _git_commit(Path(__file__).parent) or "unknown"


def require_gpu(name: str) -> None:
    if not (torch.cuda.is_available() and gpuopt.build_info()["cuda"]):
        print(f"SUMMARY {name}: skipped, needs a CUDA device and a CUDA build of gpuopt")
        sys.exit(0)


@dataclass
class Target:
    name: str
    value: float
    op: str  # "<=" or ">="
    threshold: float
    unit: str = ""
    baseline: str = ""  # what it is measured against, in the same run
    # Set when the target's premise does not hold on this device/host; then it is neither passed nor
    # failed, and the reason is printed and recorded.
    not_applicable: str = ""

    @property
    def passed(self) -> bool | None:
        if self.not_applicable:
            return None
        return self.value <= self.threshold if self.op == "<=" else self.value >= self.threshold

    def line(self) -> str:
        mark = {True: "PASS", False: "FAIL", None: "N/A "}[self.passed]
        why = f" -- {self.not_applicable}" if self.not_applicable else ""
        return (f"[{mark}] {self.name}: {self.value:.4g}{self.unit} (target {self.op} {self.threshold:g}{self.unit})"
                f"{why}")


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def write(args: argparse.Namespace, results: dict[str, Any], targets: list[Target], *, final: bool = True) -> int:
    """Writes the JSON record (atomically). ``final=False`` is a checkpoint of a run still going: the
    file says ``"complete": false`` and nothing is printed, so a run cut short keeps what it measured."""
    env = gpuopt.env()
    device = env["gpus"][0]["name"] if env["gpus"] else "cpu"
    record = {
        "complete": final,
        "benchmark": args.name,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "quick": bool(getattr(args, "quick", False)),
        "device": device,
        "env": env,
        "build": gpuopt.build_info(),
        "results": results,
        "targets": [asdict(t) | {"passed": t.passed} for t in targets],
    }
    out = args.out or RESULTS / f"{args.name}-{slug(device)}.json"
    write_atomic(out, json.dumps(record, indent=2, default=float))
    if not final:
        return 0
    for t in targets:
        print(t.line())
    applicable = [t for t in targets if t.passed is not None]
    passed = sum(bool(t.passed) for t in applicable)
    na = len(targets) - len(applicable)
    print(f"wrote {out}")
    print(f"SUMMARY {args.name} on {device}: {passed}/{len(applicable)} targets met"
          + (f" ({na} not applicable here)" if na else ""))
    return 0 if passed == len(applicable) else 1
