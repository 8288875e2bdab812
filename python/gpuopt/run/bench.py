"""``benchmark()``: a model under several configs and batch sizes, every cell prepared, checked for
parity against FP32 and measured in each mode, into a :class:`~gpuopt.Results` table.

``plan_benchmark()`` validates everything first and runs nothing, so a caller (the CLI) can tell a
usage error (raised by the plan) from a failure during the run (recorded in the rows).

``devices=`` (several GPUs, or several CPU ranks) is run by :mod:`gpuopt.dist`, a layer above this one:
it registers itself here (:func:`register_distributed`) when imported, and ``import gpuopt`` imports it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from .._files import check_writable
from ..prepare.config import Config
from ..report.results import Results, Row
from .runner import ProgressBar, Runner
from .workload import (
    Workload,
    batch_of,
    check_measure_options,
    resolve_batch_sizes,
    resolve_configs,
    resolve_device,
    resolve_modes,
    workload,
)


@dataclass
class BenchmarkPlan:
    """A validated benchmark that has not run yet; :meth:`run` runs it."""

    work: Workload
    configs: list[Config]
    batch_sizes: list[int]
    modes: list[str]
    device: torch.device
    parity: bool
    measure_options: dict[str, Any]
    output_dir: str | None
    profile: bool
    progress: bool
    results: Results | None = None  # the rows so far, once run() started (also after an interrupt)
    # With devices=: what gpuopt.dist resolved them to, which runs the plan once per rank (None: this process).
    distributed: Callable[[BenchmarkPlan], Results] | None = None
    strategy: str = "replicas"  # with devices=: one of STRATEGIES

    def run(self) -> Results:
        """Every cell, recorded as a row (a failing cell or batch size with its reason); the results
        are saved to ``output_dir`` also when the run is interrupted."""
        if self.distributed is not None:
            return self.distributed(self)
        results = self.results = Results.new(spec=self.spec())
        bar = ProgressBar(len(self.batch_sizes) * len(self.configs), self.progress)
        profile_dir = str(Path(self.output_dir or ".") / "gpuopt-profiles") if self.profile else None
        runner = self.runner(results.add, profile_dir=profile_dir, progress=bar)
        try:
            for b in self.batch_sizes:
                runner.run_batch(b)
        finally:
            bar.close()
            results.profiles.update(runner.profiles)
            results.ceilings = runner.ceilings
            if self.output_dir is not None:
                results.save(self.output_dir)
        return results

    def spec(self) -> dict[str, Any]:
        """What the results record of this plan (``Results.spec``)."""
        return {"models": [self.work.name], "configs": [str(c) for c in self.configs],
                "config_labels": [c.label for c in self.configs], "batch_sizes": self.batch_sizes,
                "modes": self.modes, "parity": self.parity, "measure": self.measure_options}

    def runner(self, on_row: Callable[[Row], None], *, profile_dir: str | None,
               progress: Callable[[str, str], None] | None = None,
               before_mode: Callable[[], None] | None = None) -> Runner:
        """The Runner of this plan's cells, each row handed to ``on_row``: :meth:`run` drives it a batch size
        at a time, a rank of a distributed plan a config at a batch size at a time (``before_mode``: see
        :class:`Runner`)."""
        return Runner(self.work, self.configs, self.modes, parity=self.parity, device=self.device,
                      measure_options=self.measure_options, on_row=on_row, profile_dir=profile_dir,
                      progress=progress, before_mode=before_mode)

    def single(self, device: torch.device) -> BenchmarkPlan:
        """This plan in this process on ``device`` (what each rank of a distributed plan runs)."""
        return replace(self, device=device, results=None, distributed=None)


# How a plan runs on several devices: gpuopt.dist registers resolve(devices, plan, call), which validates
# ``devices`` (ValueError / TypeError naming it) and returns what runs the plan; ``call`` holds
# plan_benchmark's own arguments (what a launcher hands to fresh processes).
_Resolve = Callable[[Any, BenchmarkPlan, dict[str, Any]], Callable[[BenchmarkPlan], Results]]
_DISTRIBUTED: list[_Resolve] = []

# How devices= uses the devices: each rank its own batches (independent replicas), or one global batch
# scattered from rank 0 to all ranks and the outputs gathered back (split).
STRATEGIES = ("replicas", "split")
DEFAULT_MODES = ("latency", "throughput")


def register_distributed(resolve: _Resolve) -> None:
    """Let ``devices=`` of :func:`benchmark` run through ``resolve`` (called by :mod:`gpuopt.dist`)."""
    _DISTRIBUTED[:] = [resolve]


def plan_benchmark(
    model_or_name: torch.nn.Module | str,
    *,
    inputs: Any = None,
    input_shape: Sequence[int] | None = None,
    input_fn: Callable[[int], Any] | None = None,
    configs: str | Config | Sequence[str | Config] | None = None,
    batch_sizes: Sequence[int] | int = (1, 8, 16, 32),
    modes: Sequence[str] | str | None = None,
    parity: bool = True,
    train: bool = False,
    output_dir: str | None = None,
    device: str | torch.device | None = None,
    profile: bool = False,
    progress: bool = True,
    devices: str | int | Sequence[int] | None = None,
    strategy: str = "replicas",
    **measure_options: Any,
) -> BenchmarkPlan:
    """Validate the arguments of :func:`benchmark` (ValueError / TypeError naming the bad one, before
    anything runs) and return the plan; nothing is measured until ``plan.run()``."""
    for name, flag in (("parity", parity), ("train", train), ("profile", profile), ("progress", progress)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {flag!r}")
    modes = _strategy_modes(strategy, modes, devices=devices, train=train, inputs=inputs, profile=profile)
    work = workload(model_or_name, inputs=inputs, input_shape=input_shape, input_fn=input_fn)
    dev = resolve_device(device)
    cfgs = resolve_configs(configs, device=dev, train=train)
    batches = resolve_batch_sizes(batch_sizes) if work.make_inputs is not None else [batch_of(work.fixed_inputs)]
    mode_list = resolve_modes(modes, train, dev)
    opts = check_measure_options(dict(measure_options), mode_list, dev)
    if output_dir is not None:
        check_writable(output_dir)
    plan = BenchmarkPlan(work, cfgs, batches, mode_list, dev, parity, opts, output_dir, profile, progress,
                         strategy=strategy)
    if devices is not None:
        if not _DISTRIBUTED:
            raise ImportError("devices= is run by gpuopt.dist: import gpuopt (or gpuopt.dist) first")
        call = {"model_or_name": model_or_name, "inputs": inputs, "input_shape": input_shape, "input_fn": input_fn,
                "configs": configs, "batch_sizes": batch_sizes, "modes": modes, "parity": parity, "train": train,
                "output_dir": output_dir, "device": device, "profile": profile, "progress": progress,
                "strategy": strategy, **measure_options}
        plan.distributed = _DISTRIBUTED[0](devices, plan, call)
    return plan


def _strategy_modes(strategy: Any, modes: Sequence[str] | str | None, *, devices: Any, train: bool,
                    inputs: Any, profile: bool) -> Sequence[str] | str:
    """The modes a strategy measures (ValueError naming strategy, or modes, when they do not fit)."""
    if not isinstance(strategy, str) or strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(map(repr, STRATEGIES))}, got {strategy!r}")
    if strategy == "replicas":
        return DEFAULT_MODES if modes is None else modes
    if devices is None:
        raise ValueError("strategy='split' scatters one global batch over several devices: give devices= too "
                         "(e.g. devices=2)")
    if train:
        raise ValueError("strategy='split' times inference (scatter, forward, gather); train=True runs with "
                         "strategy='replicas'")
    if profile:
        raise ValueError("profile=True profiles each rank's replica, and strategy='split' has none: profile with "
                         "strategy='replicas'")
    if inputs is not None:
        raise ValueError("strategy='split' makes each rank's share of the batch itself: give a zoo model, "
                         "input_shape= or input_fn=, not fixed inputs=")
    if modes is not None and list([modes] if isinstance(modes, str) else modes) != ["host"]:
        raise ValueError(f"strategy='split' times each iteration end to end on rank 0 (scatter, forward, gather, "
                         f"then a device synchronize: host mode); modes must be 'host' or left out, got {modes!r}")
    return ["host"]


def benchmark(
    model_or_name: torch.nn.Module | str,
    *,
    inputs: Any = None,
    input_shape: Sequence[int] | None = None,
    input_fn: Callable[[int], Any] | None = None,
    configs: str | Config | Sequence[str | Config] | None = None,
    batch_sizes: Sequence[int] | int = (1, 8, 16, 32),
    modes: Sequence[str] | str | None = None,
    parity: bool = True,
    train: bool = False,
    output_dir: str | None = None,
    device: str | torch.device | None = None,
    profile: bool = False,
    progress: bool = True,
    devices: str | int | Sequence[int] | None = None,
    strategy: str = "replicas",
    **measure_options: Any,
) -> Results:
    """Benchmark a model under several configs and batch sizes; return a :class:`Results`.

    Every cell (config x batch size) is prepared (``Config.apply``), checked for parity against the
    FP32 reference on fresh inputs (a config that drifts is recorded as failed, never timed), then
    measured in each of ``modes`` (``latency``, ``throughput``, ``graph``, ``host``, ``end-to-end``: host
    batch in through :class:`gpuopt.InputPipeline`, result back on the host). ``train=True`` adds
    forward + backward + optimizer-step timing. A cell that fails (out of memory, compile error,
    parity) is recorded with its reason and the rest goes on; so is every cell of a batch size whose
    inputs or FP32 reference fail (e.g. out of memory), and the other batch sizes still run. Bad
    arguments raise ValueError or TypeError before anything runs. ``measure_options`` go to
    :func:`gpuopt.measure` (e.g. ``max_time_s=2``). ``output_dir`` saves JSON, CSV, Markdown and plots.
    ``devices`` (``"all"``, a number of GPUs or a list of indices; with ``device="cpu"`` a number of CPU
    ranks) runs one process per device through ``torch.distributed`` (:mod:`gpuopt.dist`): per-rank
    rows, an aggregate row and the scaling efficiency against one device measured in the same job.
    ``strategy`` with ``devices``: ``"replicas"`` (each rank its own batches) or ``"split"`` (each batch
    size is the global batch, scattered from rank 0 to the ranks and the outputs gathered back; one
    row per cell, timed on rank 0 in host mode, with the scatter and gather times). ``modes`` default:
    latency and throughput; host with ``strategy="split"``.
    ``configs`` default: the ``bench`` preset on CUDA, ``bench-cpu`` on the CPU, and with ``train=True``
    their ``-train`` variants (no inference-only backend), as ``gpuopt bench`` chooses.

    >>> r = gpuopt.benchmark("tiny-cnn", configs=["fp32", "bf16-amp"], batch_sizes=[1, 8],
    ...                      device="cpu", max_time_s=0.2)                       # doctest: +SKIP
    >>> print(r.to_markdown())                                                   # doctest: +SKIP
    """
    return plan_benchmark(model_or_name, inputs=inputs, input_shape=input_shape, input_fn=input_fn, configs=configs,
                          batch_sizes=batch_sizes, modes=modes, parity=parity, train=train, output_dir=output_dir,
                          device=device, profile=profile, progress=progress, devices=devices,
                          strategy=strategy, **measure_options).run()
