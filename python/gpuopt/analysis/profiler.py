"""Where the time goes: ``profile()`` runs a workload under ``torch.profiler`` and summarises the
trace (top kernels, GPU idle time, launch gaps, copies), exporting it for Perfetto and TensorBoard.

GPU figures are read from the exported Chrome trace (events of category ``kernel``, ``gpu_memcpy``
and ``gpu_memset``), the format Perfetto, TensorBoard and Holistic Trace Analysis read too.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .._checks import check_int
from ..prepare.config import Prepared
from ..timing.inputs import split_inputs
from ..timing.measurement import format_ms

_GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


@dataclass
class ProfileSummary:
    """What one profiled run spent its time on. Times are milliseconds per iteration unless named
    otherwise; the GPU fields are None when no GPU activity was recorded (a CPU run).

    - ``cpu_time_ms``: self CPU time of all recorded ops and annotations per iteration (host busy time).
    - ``gpu_time_ms``: summed duration of kernels, memcpys and memsets per iteration.
    - ``step_ms``: mean wall time of one profiler step (one iteration, as the host saw it).
    - ``top_kernels``: by total GPU time: ``name``, ``total_ms`` (over all active iterations),
      ``share`` (of all kernel time), ``calls``. ``top_cpu_ops``: the same by self CPU time.
    - ``gpu_idle_fraction``: 1 - (union of kernel/memcpy/memset intervals) / (first GPU start to
      last GPU end) over the active window.
    - ``kernels_per_iter``; ``mean_launch_gap_us``: mean idle gap between consecutive kernels
      (overlapping kernels count as 0); ``memcpy_ms``: memcpy time per iteration.
    """

    steps: int
    warmup: int
    device: str
    cpu_time_ms: float
    step_ms: float | None
    top_cpu_ops: list[dict[str, Any]]
    gpu_time_ms: float | None = None
    top_kernels: list[dict[str, Any]] | None = None
    gpu_idle_fraction: float | None = None
    kernels_per_iter: float | None = None
    mean_launch_gap_us: float | None = None
    memcpy_ms: float | None = None
    trace_path: str | None = None
    tensorboard_dir: str | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def _headline(self) -> list[tuple[str, str]]:
        rows = [("device", self.device), ("iterations", f"{self.steps} profiled after {self.warmup} warm-up"),
                ("step wall time", format_ms(self.step_ms) if self.step_ms is not None else "-"),
                ("CPU time / iter", format_ms(self.cpu_time_ms))]
        if self.gpu_time_ms is not None:
            rows += [("GPU time / iter", format_ms(self.gpu_time_ms)),
                     ("GPU idle", f"{self.gpu_idle_fraction:.1%}" if self.gpu_idle_fraction is not None else "-"),
                     ("kernels / iter", f"{self.kernels_per_iter:.1f}"),
                     ("mean launch gap", f"{self.mean_launch_gap_us:.2f} us"
                      if self.mean_launch_gap_us is not None else "-"),
                     ("memcpy / iter", format_ms(self.memcpy_ms))]
        if self.trace_path:
            rows.append(("trace (Perfetto / chrome://tracing)", self.trace_path))
        if self.tensorboard_dir:
            rows.append(("TensorBoard", f"tensorboard --logdir {self.tensorboard_dir}"))
        return rows

    def _top(self) -> tuple[str, list[dict[str, Any]]]:
        if self.top_kernels is not None:
            return "GPU kernels", self.top_kernels
        return "CPU ops (self time)", self.top_cpu_ops

    def to_markdown(self) -> str:
        lines = ["| | |", "|---|---|"]
        lines += [f"| {k} | {v.replace('|', '/')} |" for k, v in self._headline()]
        what, top = self._top()
        lines += ["", f"Top {what}, {self.steps} iterations:", "",
                  "| name | total | share | calls |", "|---|---:|---:|---:|"]
        lines += [f"| `{_short(t['name'], 90).replace('|', '/')}` | {format_ms(t['total_ms'])} | {t['share']:.1%} "
                  f"| {t['calls']} |" for t in top]
        lines += [f"\nNote: {n}" for n in self.notes]
        return "\n".join(lines) + "\n"

    def __str__(self) -> str:
        rows = self._headline()
        width = max(len(k) for k, _ in rows)
        lines = [f"{k:<{width}}  {v}" for k, v in rows]
        what, top = self._top()
        lines.append(f"top {what}:")
        lines += [f"  {t['share']:6.1%}  {format_ms(t['total_ms']):>10}  {t['calls']:>6}x  {_short(t['name'], 100)}"
                  for t in top]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def _short(name: str, n: int) -> str:
    return name if len(name) <= n else name[: n - 3] + "..."


def _runner(target: Any, inputs: Any) -> Callable[[], Any]:
    if isinstance(target, Prepared):
        if inputs is None:
            raise ValueError("profiling a Prepared needs inputs (as given to Config.apply)")
        return target.runner(inputs)
    if isinstance(target, torch.nn.Module):
        args, kwargs = split_inputs(inputs)

        def run():
            with torch.inference_mode():
                return target(*args, **kwargs)

        return run
    if callable(target):
        if inputs is not None:
            raise TypeError("a callable target takes no inputs: bind them, e.g. lambda: fn(x)")
        return target
    raise TypeError(f"target must be a gpuopt.Prepared, an nn.Module or a zero-argument callable, "
                    f"got {type(target).__name__}")


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, -float("inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def _gpu_summary(events: list[dict], steps: int, row_limit: int) -> dict[str, Any]:
    """GPU figures of the Chrome trace's complete events ("ph": "X", times in microseconds)."""
    gpu = [e for e in events if e.get("ph") == "X" and str(e.get("cat", "")).lower() in _GPU_CATEGORIES]
    if not gpu:
        return {}
    kernels = [e for e in gpu if str(e["cat"]).lower() == "kernel"]
    intervals = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in gpu]
    span = max(e for _, e in intervals) - min(s for s, _ in intervals)
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        by_name.setdefault(e.get("name", "?"), []).append(float(e.get("dur", 0)))
    kernel_us = sum(sum(d) for d in by_name.values())
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:row_limit]
    ordered = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in kernels)
    gaps = [max(0.0, b[0] - a[1]) for a, b in zip(ordered, ordered[1:])]
    memcpy_us = sum(float(e.get("dur", 0)) for e in gpu if str(e["cat"]).lower() == "gpu_memcpy")
    return {
        "gpu_time_ms": sum(e - s for s, e in intervals) / 1e3 / steps,
        "top_kernels": [{"name": name, "total_ms": sum(d) / 1e3, "share": sum(d) / kernel_us if kernel_us else 0.0,
                         "calls": len(d)} for name, d in top],
        "gpu_idle_fraction": min(1.0, max(0.0, 1.0 - _union_us(intervals) / span)) if span > 0 else 0.0,
        "kernels_per_iter": len(kernels) / steps,
        "mean_launch_gap_us": sum(gaps) / len(gaps) if gaps else None,
        "memcpy_ms": memcpy_us / 1e3 / steps,
    }


def profile(target: Any, inputs: Any = None, *, steps: int = 5, warmup: int = 2, output_dir: str | None = None,
            record_shapes: bool = False, row_limit: int = 10) -> ProfileSummary:
    """Profile ``warmup + steps`` iterations of ``target`` with ``torch.profiler`` (CPU, and CUDA
    when available; schedule wait=0, warmup, active=steps) and summarise the active ones.

    ``target``: a :class:`gpuopt.Prepared` (runs ``target.runner(inputs)``), an ``nn.Module`` (called
    with ``inputs`` under ``torch.inference_mode()``: a tensor is one positional argument, a
    tuple/list positional arguments, a dict keyword arguments) or a zero-argument callable
    (``inputs`` None). Errors raised by the target propagate unchanged.

    With ``output_dir``, writes ``trace.json`` (Chrome trace: open in https://ui.perfetto.dev) and a
    TensorBoard trace under ``output_dir/tensorboard``.

    >>> import torch
    >>> from gpuopt.profile import profile
    >>> s = profile(torch.nn.Linear(64, 64), torch.randn(8, 64), steps=2, warmup=1)
    >>> s.steps, s.top_cpu_ops[0]["calls"] >= 2
    (2, True)
    """
    from torch.profiler import ProfilerActivity, schedule, tensorboard_trace_handler

    steps = check_int("steps", steps, 1)
    warmup = check_int("warmup", warmup, 0)
    row_limit = check_int("row_limit", row_limit, 1)
    if not isinstance(record_shapes, bool):
        raise TypeError(f"record_shapes must be True or False, got {record_shapes!r}")
    run = _runner(target, inputs)
    cuda = torch.cuda.is_available()
    if not cuda:
        # Kineto probes for GPUs even for a CPU-only trace and logs "gpuGetDeviceCount failed" as an
        # ERROR on a CUDA build without a device; the CPU profile is fine. Its level is read lazily.
        os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    scratch = tempfile.mkdtemp(prefix="gpuopt-profile-") if output_dir is None else None
    trace_dir = output_dir if output_dir is not None else scratch
    os.makedirs(trace_dir, exist_ok=True)
    trace_path = os.path.join(trace_dir, "trace.json")
    tb_dir = os.path.join(output_dir, "tensorboard") if output_dir is not None else None

    def ready(prof) -> None:
        # A profiler saves its trace once: TensorBoard's handler writes it, and it is copied.
        if tb_dir is not None:
            pattern = os.path.join(tb_dir, "gpuopt.*.pt.trace.json")
            before = set(glob.glob(pattern))
            tensorboard_trace_handler(tb_dir, worker_name="gpuopt")(prof)
            written = sorted(set(glob.glob(pattern)) - before, key=os.path.getmtime)
            shutil.copyfile(written[-1], trace_path)
        else:
            prof.export_chrome_trace(trace_path)

    try:
        with warnings.catch_warnings():
            # One cycle (repeat=1): torch's note that events do not accumulate across cycles is moot.
            warnings.filterwarnings("ignore", message="Warning: Profiler clears events")
            with torch.profiler.profile(activities=activities, record_shapes=record_shapes,
                                        schedule=schedule(wait=0, warmup=warmup, active=steps, repeat=1),
                                        on_trace_ready=ready) as prof:
                for i in range(warmup + steps):
                    run()
                    if cuda and i == warmup + steps - 1:
                        torch.cuda.synchronize()  # the last step's kernels complete inside the window
                    prof.step()
        averages = prof.key_averages()
        with open(trace_path) as f:
            events = json.load(f).get("traceEvents", [])
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)

    self_cpu_us = sum(e.self_cpu_time_total for e in averages)
    ops = sorted((e for e in averages if not e.key.startswith("ProfilerStep")),
                 key=lambda e: -e.self_cpu_time_total)[:row_limit]
    step_us = [float(e["dur"]) for e in events
               if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")]
    gpu = _gpu_summary(events, steps, row_limit)
    summary = ProfileSummary(
        steps=steps, warmup=warmup,
        device=torch.cuda.get_device_name() if gpu else "CPU",
        cpu_time_ms=self_cpu_us / 1e3 / steps,
        step_ms=sum(step_us) / len(step_us) / 1e3 if step_us else None,
        top_cpu_ops=[{"name": e.key, "total_ms": e.self_cpu_time_total / 1e3,
                      "share": e.self_cpu_time_total / self_cpu_us if self_cpu_us else 0.0, "calls": e.count}
                     for e in ops],
        trace_path=trace_path if output_dir is not None else None,
        tensorboard_dir=tb_dir,
        **gpu,
    )
    if cuda and summary.top_kernels is None:
        summary.notes.append("CUDA is available but no GPU activity was recorded: the target ran on the CPU")
    return summary
