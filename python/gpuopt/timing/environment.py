"""The runtime environment: the record every gpuopt result carries."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from typing import Any

import torch

from .._ext import _C
from . import nvml as _nvml


def _cuda_version(v: int) -> str | None:
    """13000 -> '13.0'; 0 -> None."""
    return f"{v // 1000}.{(v % 1000) // 10}" if v else None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _driver_version() -> str | None:
    v = _nvml.driver_version()
    if v:
        return v
    try:
        with open("/proc/driver/nvidia/version") as f:
            m = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?([0-9][0-9.]+)", f.read())
            return m.group(1) if m else None
    except OSError:
        return None


def _gpu(index: int) -> dict[str, Any]:
    p = torch.cuda.get_device_properties(index)
    gpu = {
        "index": index,
        "name": p.name,
        "compute_capability": f"{p.major}.{p.minor}",
        "memory_bytes": int(p.total_memory),
        "sm_count": int(p.multi_processor_count),
        "l2_cache_bytes": int(getattr(p, "L2_cache_size", 0)) or None,
        "uuid": str(getattr(p, "uuid", "")) or None,
    }
    gpu.update(_nvml.device_facts(index))
    gpu["mig"] = _nvml.mig_layout(index)
    return gpu


def env() -> dict[str, Any]:
    """Describe this machine for the record: GPUs, driver, CUDA, cuDNN, torch, Python, CPU.

    With nvidia-ml-py installed, each GPU also carries current and max clocks, power limit,
    persistence mode, ECC state and temperature, and each GPU its MIG layout (``mig``: mode and MIG
    devices, see :func:`gpuopt.timing.nvml.mig_layout`). JSON-serialisable.

    >>> import gpuopt
    >>> e = gpuopt.env()
    >>> e["torch"] == torch.__version__
    True
    """
    cuda_ok = torch.cuda.is_available()
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "gpuopt": _C.__version__,
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "hostname": platform.node(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": cudnn,
        "cuda_runtime": _cuda_version(_C.cuda_runtime_version()),
        "cuda_driver_api": _cuda_version(_C.cuda_driver_version()),
        "driver": _driver_version(),
        "nvml": _nvml.available(),
        "nvml_missing": _nvml.unavailable_reason(),
        "gpus": [_gpu(i) for i in range(torch.cuda.device_count())] if cuda_ok else [],
    }


def git_commit(path: str | os.PathLike) -> str | None:
    """The git commit checked out at ``path`` (``<sha>-dirty`` with uncommitted changes), for the
    record beside results; ``GPUOPT_GIT_COMMIT`` overrides it (a copied tree without ``.git``), and
    None when neither says."""
    override = os.environ.get("GPUOPT_GIT_COMMIT")
    if override:
        return override
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, cwd=path)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10, cwd=path).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("-dirty" if dirty else "")
