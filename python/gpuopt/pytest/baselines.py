"""Baseline storage of the pytest plugin: files under <rootdir>/.gpuopt/baselines, one entry per
environment fingerprint, read with clear errors for corrupt files."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from .._files import write_atomic
from ..timing.calibration import RunToRun
from ..timing.measurement import Measurement

BASELINE_SCHEMA = 1
BASELINE_DIR = Path(".gpuopt") / "baselines"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
LATEST = "latest"  # --gpuopt-compare's name for the baseline saved last; no file may be called so


class GpuoptBaselineWarning(pytest.PytestWarning):
    """A baseline could not be used (saved on another environment)."""


def fingerprint(e: dict[str, Any]) -> dict[str, Any]:
    """What must match for two timings to be comparable: GPU model, driver major version, torch and
    its CUDA version (and the CPU model when there is no GPU); from :func:`gpuopt.env`."""
    gpu = None
    if e["gpus"]:
        index = torch.cuda.current_device()
        gpu = (e["gpus"][index] if index < len(e["gpus"]) else e["gpus"][0])["name"]
    fp = {
        "gpu": gpu,
        "driver_major": e["driver"].split(".")[0] if e["driver"] else None,
        "torch": e["torch"],
        "torch_cuda": e["torch_cuda"],
    }
    if gpu is None:
        fp["cpu"] = e["cpu"]
    return fp


def write_json(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=1))


def load_baseline(path: Path, option: str) -> dict[str, Any]:
    """A baseline file, checked; UsageError naming the option and the problem otherwise."""
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or not isinstance(data.get("environments"), list):
            raise ValueError("no 'environments' list")
        if data.get("schema_version", BASELINE_SCHEMA) > BASELINE_SCHEMA:
            raise ValueError(f"schema_version {data['schema_version']} is newer than this gpuopt understands "
                             f"({BASELINE_SCHEMA}); upgrade gpuopt")
        for entry in data["environments"]:
            if not isinstance(entry.get("fingerprint"), dict) or not isinstance(entry.get("measurements"), dict):
                raise ValueError("an environment lacks 'fingerprint' or 'measurements'")
            if entry.get("calibration") is not None:
                RunToRun.from_dict(entry["calibration"])  # checked; kept as saved
            for key, rec in entry["measurements"].items():
                if not isinstance(rec.get("test"), str):
                    raise ValueError(f"measurement {key!r} lacks 'test'")
                rec["measurement"] = Measurement.from_dict(rec["measurement"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise pytest.UsageError(f"{option}: baseline file {path} is unreadable or corrupt ({exc}); "
                                "delete it and save it again with --gpuopt-save") from None
    return data


def latest_baseline(directory: Path, here: dict[str, Any]) -> str | None:
    """The name of the baseline saved last with an entry for environment ``here`` (by the entry's
    ``saved_at``, else the file's time), else of the file written last; None when there is none."""
    files = sorted(directory.glob("*.json")) if directory.is_dir() else []
    if not files:
        return None

    def saved(path: Path) -> tuple[bool, str, float]:
        stamp, matches = "", False
        try:
            data = json.loads(path.read_text())
            for entry in data.get("environments", []):
                if entry.get("fingerprint") == here:
                    matches, stamp = True, str(entry.get("saved_at", ""))
        except (OSError, ValueError, AttributeError):
            pass  # a corrupt file is reported when it is loaded, if it is the one chosen
        return matches, stamp, path.stat().st_mtime
    return max(files, key=saved).stem
