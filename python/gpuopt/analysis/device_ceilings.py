"""Measured device ceilings: what this GPU actually does, for roofline placement of every result.

Bandwidths (HBM read/write/copy, L2), the CUDA-core FP32 rate, launch and CUDA-graph node overhead
come from gpuopt's own kernels (``csrc/cuda/ceilings.cu``); matrix peaks per dtype come from
cuBLAS/cuBLASLt through ``torch.matmul`` (``torch._scaled_mm`` for fp8, ``torch._int_mm`` for int8)
and transfers from ``Tensor.copy_``, all timed by gpuopt's C++ loop. Results are cached per device
under ``$GPUOPT_CACHE_DIR`` (default ``~/.cache/gpuopt``).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
from pathlib import Path
from typing import Any

import torch

from .._ext import _C
from .._files import write_atomic
from ..prepare.config import precision
from ..timing.inputs import device_index
from ..timing.measurement import measure
from .datasheet import lookup_dict

CACHE_VERSION = 1


def cache_dir() -> Path:
    return Path(os.environ.get("GPUOPT_CACHE_DIR") or Path.home() / ".cache" / "gpuopt")


def _cache_path(index: int) -> Path:
    props = torch.cuda.get_device_properties(index)
    slug = re.sub(r"[^a-z0-9]+", "-", props.name.lower()).strip("-")
    uuid = str(getattr(props, "uuid", "") or index)[:8]
    return cache_dir() / f"ceilings-{slug}-{uuid}.json"


def _tflops(fn, flops: float, quick: bool) -> float:
    m = measure(fn, mode="latency", max_time_s=0.5 if quick else 2.0, monitor=False)
    return flops / (m.p50 * 1e-3) / 1e12


def _gemm(index: int, quick: bool) -> dict[str, float | None]:
    n = 4096 if quick else 8192
    dev = torch.device("cuda", index)
    out: dict[str, float | None] = {}
    flops = 2.0 * n**3
    for name, dtype, mode in (("fp32", torch.float32, "fp32"), ("tf32", torch.float32, "tf32"),
                              ("fp16", torch.float16, "fp32"), ("bf16", torch.bfloat16, "fp32")):
        a = torch.randn(n, n, device=dev, dtype=dtype)
        b = torch.randn(n, n, device=dev, dtype=dtype)
        with precision(mode):
            out[name] = _tflops(lambda a=a, b=b: a @ b, flops, quick)
        del a, b
    major, minor = torch.cuda.get_device_capability(index)
    out["fp8"] = None
    if (major, minor) >= (8, 9) and hasattr(torch, "float8_e4m3fn"):
        try:
            a = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn)
            b = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt wants
            one = torch.ones((), device=dev)
            out["fp8"] = _tflops(lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16), flops, quick)
        except (RuntimeError, TypeError):
            out["fp8"] = None
    out["int8"] = None
    if major >= 8 and hasattr(torch, "_int_mm"):
        try:
            a = torch.randint(-100, 100, (n, n), device=dev, dtype=torch.int8)
            b = torch.randint(-100, 100, (n, n), device=dev, dtype=torch.int8)
            out["int8"] = _tflops(lambda: torch._int_mm(a, b), flops, quick)  # TOPS
        except RuntimeError:
            out["int8"] = None
    return out


def _transfers(index: int, quick: bool) -> dict[str, float]:
    nbytes = (64 if quick else 256) << 20
    dev = torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", index))
    out = {}
    for pinned in (True, False):
        host = torch.ones(nbytes, dtype=torch.uint8, pin_memory=pinned)
        kind = "pinned" if pinned else "pageable"
        for direction, fn in (("h2d", lambda h=host: dev.copy_(h, non_blocking=True)),
                              ("d2h", lambda h=host: h.copy_(dev, non_blocking=True))):
            m = measure(fn, mode="latency", max_time_s=0.5 if quick else 2.0, monitor=False)
            out[f"{direction}_{kind}_gbps"] = nbytes / (m.p50 * 1e-3) / 1e9
    return out


def ceilings(device: int | str | torch.device | None = None, *, refresh: bool = False, quick: bool = False,
             cached_only: bool = False) -> dict[str, Any] | None:
    """This GPU's measured ceilings, with the datasheet figures beside them.

    Measured once per device (tens of seconds) and cached; ``refresh=True`` measures again,
    ``quick=True`` uses small sizes (a smoke run, not a ceiling), ``cached_only=True`` returns the
    cache or None without measuring. Raises ValueError on a machine without a usable CUDA device.

    >>> c = gpuopt.ceilings()                        # doctest: +SKIP
    >>> c["measured"]["gemm_tflops"]["bf16"], c["datasheet"]["bf16_tflops"]  # doctest: +SKIP
    """
    if not (_C.cuda_compiled() and torch.cuda.is_available()):
        if cached_only:
            return None
        why = ("no CUDA device is visible (torch.cuda.is_available() is False)" if _C.cuda_compiled()
               else "this gpuopt was built without CUDA (gpuopt env says why)")
        raise ValueError(f"device ceilings need a CUDA device: {why}; datasheet figures of known GPUs: "
                         "gpuopt.datasheet.lookup(name)")
    index = device_index(device)
    path = _cache_path(index)
    if path.exists() and not refresh:
        try:
            doc = json.loads(path.read_text())
            if doc.get("cache_version") == CACHE_VERSION and doc.get("torch") == torch.__version__:
                return doc
        except (OSError, ValueError):
            pass  # a corrupt cache is measured again
    if cached_only:
        return None
    kernels = _C.kernel_ceilings(index, quick)
    measured = {
        "hbm_read_gbps": kernels["hbm_read_gbps"],
        "hbm_write_gbps": kernels["hbm_write_gbps"],
        "hbm_copy_gbps": kernels["hbm_copy_gbps"],
        "l2_gbps": kernels["l2_gbps"],
        "fp32_fma_tflops": kernels["fp32_fma_tflops"],
        "gemm_tflops": _gemm(index, quick),
        **_transfers(index, quick),
        "launch_overhead_us": kernels["launch_host_us"],
        "launch_device_us": kernels["launch_device_us"],
        "graph_node_us": kernels["graph_node_us"],
    }
    name = torch.cuda.get_device_name(index)
    from ..timing.environment import env

    doc = {
        "cache_version": CACHE_VERSION,
        "device": name,
        "quick": quick,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "gpuopt": _C.__version__,
        "measured": measured,
        "sizes": {"hbm_bytes": kernels["hbm_bytes"], "l2_bytes": kernels["l2_bytes"]},
        "datasheet": lookup_dict(name),
        "env": env(),
    }
    if not quick:
        write_atomic(path, json.dumps(doc, indent=2))
    return doc


_ROWS = [  # (label, measured key path, datasheet key, unit)
    ("HBM read", ("hbm_read_gbps",), "memory_bandwidth_gbps", "GB/s"),
    ("HBM write", ("hbm_write_gbps",), "memory_bandwidth_gbps", "GB/s"),
    ("HBM copy (read + write)", ("hbm_copy_gbps",), "memory_bandwidth_gbps", "GB/s"),
    ("L2 read", ("l2_gbps",), None, "GB/s"),
    ("FP32 FMA (CUDA cores)", ("fp32_fma_tflops",), "fp32_tflops", "TFLOP/s"),
    ("GEMM fp32 (TF32 off)", ("gemm_tflops", "fp32"), "fp32_tflops", "TFLOP/s"),
    ("GEMM tf32", ("gemm_tflops", "tf32"), "tf32_tflops", "TFLOP/s"),
    ("GEMM fp16", ("gemm_tflops", "fp16"), "fp16_tflops", "TFLOP/s"),
    ("GEMM bf16", ("gemm_tflops", "bf16"), "bf16_tflops", "TFLOP/s"),
    ("GEMM fp8", ("gemm_tflops", "fp8"), "fp8_tflops", "TFLOP/s"),
    ("GEMM int8", ("gemm_tflops", "int8"), "int8_tops", "TOPS"),
    ("host->device pinned", ("h2d_pinned_gbps",), None, "GB/s"),
    ("host->device pageable", ("h2d_pageable_gbps",), None, "GB/s"),
    ("device->host pinned", ("d2h_pinned_gbps",), None, "GB/s"),
    ("device->host pageable", ("d2h_pageable_gbps",), None, "GB/s"),
    ("kernel launch (host)", ("launch_overhead_us",), None, "us"),
    ("kernel back to back (device)", ("launch_device_us",), None, "us"),
    ("CUDA graph, per node", ("graph_node_us",), None, "us"),
]


def table(doc: dict[str, Any]) -> list[tuple[str, float | None, float | None, str]]:
    """(label, measured, datasheet, unit) rows of a ceilings document."""
    rows = []
    sheet = doc.get("datasheet") or {}
    for label, keys, sheet_key, unit in _ROWS:
        value: Any = doc["measured"]
        for k in keys:
            value = value.get(k) if isinstance(value, dict) else None
        rows.append((label, value, sheet.get(sheet_key) if sheet_key else None, unit))
    return rows


def format_ceilings(doc: dict[str, Any]) -> str:
    """A readable table: each ceiling measured, the datasheet figure beside it, and their ratio."""
    lines = [f"{doc['device']} (measured {doc['created']}{', quick' if doc.get('quick') else ''})"]
    if not doc.get("datasheet"):
        lines.append("not in gpuopt's datasheet: measured figures only")
    lines.append(f"{'':32s} {'measured':>12s} {'datasheet':>12s} {'ratio':>7s}")
    for label, value, sheet, unit in table(doc):
        v = "-" if value is None else f"{value:,.1f}" if value >= 10 else f"{value:.3g}"
        s = "-" if sheet is None else f"{sheet:,.0f}"
        r = f"{value / sheet:.0%}" if (value and sheet) else ""
        lines.append(f"{label:32s} {v:>12s} {s:>12s} {r:>7s}  {unit}")
    return "\n".join(lines)
