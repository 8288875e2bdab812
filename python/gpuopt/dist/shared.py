"""Several processes on one GPU: N processes each benchmarking (``gpuopt.benchmark``, throughput mode) or
serving (a :class:`~gpuopt.serving.Server` under the load generator) the same model on ONE device, started
together, against one process doing the same total work in the same call.

Started by torchrun (:func:`gpuopt.dist.launch.torchrun`: a rank that dies is named, the rows finished so
far are kept); the processes align through a gloo group (CPU objects only, so it works for any number
of processes on one GPU, which NCCL refuses). Process 0 first does the whole work alone -- N times one
process's share: N x ``iters`` samples, or N x ``queries`` requests at N x the concurrency -- while the
others wait; then all N do their share at once. With ``nvidia-cuda-mps-control`` on PATH (and a GPU) an
MPS daemon of its own serves the run (:class:`MpsDaemon`), else the processes time-slice the GPU and
the results say why MPS was off.

The rows (one Results): process 0 alone (mode ``... @1 rank``), each process (``... @rank1/2``) and the
aggregate (``... @2 ranks``: summed throughput, pooled latency percentiles, ``vs_one_process`` = the
aggregate's throughput over one process's), their ``dist`` field naming ``processes``, ``mps`` and
``mps_reason``; Results.spec["shared_gpu"] says the same for the whole run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from .._checks import check_int
from ..report.results import Results
from . import worker
from ..run.workload import resolve_device
from .launch import environment, torchrun

WORKS = ("benchmark", "serve")
MPS_CONTROL = "nvidia-cuda-mps-control"
# The processes' module (run by torchrun; not imported here, so ``-m`` finds it unimported).
_WORKER_MODULE = "gpuopt.dist.shared_worker"


class MpsDaemon:
    """An MPS control daemon for one run, in a folder of its own: ``CUDA_MPS_PIPE_DIRECTORY`` and
    ``CUDA_MPS_LOG_DIRECTORY`` under ``root`` (:attr:`env` gives them to the processes that should use
    it), started with ``nvidia-cuda-mps-control -d`` and stopped with ``echo quit |
    nvidia-cuda-mps-control``; every call waits at most ``timeout_s``. ``with MpsDaemon(root):`` starts
    and stops it (stopping also when the run fails)."""

    def __init__(self, root: str | os.PathLike, *, control: str | None = None, timeout_s: float = 30.0):
        self.control = control or shutil.which(MPS_CONTROL)
        if self.control is None:
            raise FileNotFoundError(f"{MPS_CONTROL} is not on PATH (it comes with the NVIDIA driver's utilities)")
        root = Path(root)
        self.env = {"CUDA_MPS_PIPE_DIRECTORY": str(root / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(root / "log")}
        self.timeout_s = timeout_s
        self.running = False

    def _run(self, args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([self.control, *args], input=stdin, env={**os.environ, **self.env}, text=True,
                              capture_output=True, timeout=self.timeout_s, check=False)

    def start(self) -> None:
        for path in self.env.values():
            Path(path).mkdir(parents=True, exist_ok=True)
        done = self._run(["-d"])
        if done.returncode != 0:
            raise RuntimeError(f"{self.control} -d failed (exit code {done.returncode}): "
                               f"{(done.stderr or done.stdout).strip() or 'no output'}")
        self.running = True

    def stop(self) -> None:
        if not self.running:
            return
        self.running = False
        done = self._run([], stdin="quit\n")
        if done.returncode != 0:
            raise RuntimeError(f"echo quit | {self.control} failed (exit code {done.returncode}): "
                               f"{(done.stderr or done.stdout).strip() or 'no output'}")

    def __enter__(self) -> MpsDaemon:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _device(device: Any) -> torch.device:
    """The one device of the run (resolve_device's checks), a CUDA one with its index."""
    d = resolve_device(device)
    return torch.device("cuda", d.index or 0) if d.type == "cuda" else d


def shared_gpu(model: str, config: str = "fp32", *, processes: int = 2, work: str = "benchmark",
               device: Any = None, batch_size: int = 32, iters: int = 200, queries: int = 2000,
               concurrency: int = 32, instances: int = 2, input_shape: list[int] | None = None, mps: Any = "auto",
               output_dir: str | None = None, progress: bool = True, timeout_s: float | None = None,
               **options: Any) -> Results:
    """``processes`` processes doing ``work`` with zoo model ``model`` under ``config`` on one ``device``,
    against one process doing the same total work; returns the Results (see the module's docstring).

    - ``work="benchmark"``: each process ``gpuopt.benchmark`` in throughput mode at ``batch_size`` for
      exactly ``iters`` samples (process 0 alone: ``processes x iters``); ``options`` go to it (measure
      options, ``parity``).
    - ``work="serve"``: each process a Server (``max_batch_size=batch_size``, ``instances``) driven closed
      loop by ``concurrency`` clients for ``queries`` requests (alone: both times ``processes``); ``options``
      go to the Server.

    ``mps``: ``"auto"`` (an MPS daemon when ``nvidia-cuda-mps-control`` is on PATH and the device is a
    GPU), ``True`` (required: an error otherwise) or ``False``. On the CPU the processes share its cores.

    >>> r = gpuopt.dist.shared_gpu("tiny-cnn", processes=2, device="cpu", batch_size=8, iters=20)  # doctest: +SKIP
    >>> [row.mode for row in r.rows]                                                              # doctest: +SKIP
    ['throughput @1 rank', 'throughput @rank0/2', 'throughput @rank1/2', 'throughput @2 ranks']
    """
    if not isinstance(model, str):
        raise TypeError(f"model must be a zoo name (each process rebuilds it), got {type(model).__name__}")
    check_int("processes", processes)
    if work not in WORKS:
        raise ValueError(f"work must be one of {', '.join(map(repr, WORKS))}, got {work!r}")
    for name, value in (("batch_size", batch_size), ("iters", iters), ("queries", queries),
                        ("concurrency", concurrency), ("instances", instances)):
        check_int(name, value)
    if mps not in ("auto", True, False):
        raise ValueError(f"mps must be 'auto', True or False, got {mps!r}")
    dev = _device(device)
    spec = {"model": model, "config": str(config), "processes": processes, "work": work,
            "device": dev.type, "batch_size": batch_size, "iters": iters, "queries": queries,
            "concurrency": concurrency, "instances": instances, "input_shape": input_shape, "options": options}
    try:
        json.dumps(spec)
    except TypeError as exc:
        raise ValueError(f"shared_gpu hands its arguments to fresh processes as JSON; one is not: {exc}") from exc
    out = Path(output_dir or tempfile.mkdtemp(prefix="gpuopt-shared-"))
    env = environment([dev.index] if dev.type == "cuda" else None)  # the processes see only this GPU
    daemon, reason = _mps(mps, dev, out)
    try:
        if daemon is not None:
            try:
                daemon.start()
                env.update(daemon.env)
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
                if mps is True:
                    raise
                daemon, reason = None, f"the MPS daemon did not start ({exc}): the processes time-slice the GPU"
        spec.update(mps=daemon is not None, mps_reason=reason, device_name=str(dev), output_dir=str(out))
        spec_path = worker.ranks_dir(out) / "shared.json"
        spec_path.parent.mkdir(parents=True, exist_ok=True)
        spec_path.write_text(json.dumps(spec, indent=1))
        torchrun(["-m", _WORKER_MODULE, str(spec_path)], processes, output_dir=out, env=env, echo=progress,
                 timeout_s=timeout_s)
    except BaseException:
        if daemon is not None:  # the run's error is the one to see; a failing stop is only mentioned
            try:
                daemon.stop()
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
                print(f"gpuopt.dist.shared_gpu: stopping the MPS daemon also failed: {exc}", file=sys.stderr)
        raise
    if daemon is not None:
        daemon.stop()
    results = Results.load(out / "results.json")
    if output_dir is None:
        shutil.rmtree(out, ignore_errors=True)
    return results


def _mps(mps: Any, device: torch.device, out: Path) -> tuple[MpsDaemon | None, str]:
    """The daemon to run (None: none) and why (or why not)."""
    if mps is False:
        return None, "mps=False"
    if device.type != "cuda":
        if mps is True:
            raise ValueError("mps=True needs a CUDA device; the processes run on the CPU")
        return None, "the processes run on the CPU"
    if shutil.which(MPS_CONTROL) is None:
        if mps is True:
            raise FileNotFoundError(f"mps=True: {MPS_CONTROL} is not on PATH")
        return None, f"{MPS_CONTROL} is not on PATH: the processes time-slice the GPU"
    return MpsDaemon(out / "mps"), f"an MPS daemon of this run ({MPS_CONTROL} -d)"
