"""``benchmark()``: a model under several configs and batch sizes, every cell prepared, checked for
parity against FP32 and measured in each mode, into a :class:`~gpuopt.Results` table."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from .._files import check_writable
from ..prepare.config import Config
from ..report.results import Results
from .runner import ProgressBar, Runner
from .workload import (
    batch_of,
    check_measure_options,
    resolve_batch_sizes,
    resolve_configs,
    resolve_device,
    resolve_modes,
    workload,
)


def benchmark(
    model_or_name: torch.nn.Module | str,
    *,
    inputs: Any = None,
    input_shape: Sequence[int] | None = None,
    input_fn: Callable[[int], Any] | None = None,
    configs: str | Config | Sequence[str | Config] = "bench",
    batch_sizes: Sequence[int] | int = (1, 8, 16, 32),
    modes: Sequence[str] | str = ("latency", "throughput"),
    parity: bool = True,
    train: bool = False,
    output_dir: str | None = None,
    device: str | torch.device | None = None,
    profile: bool = False,
    progress: bool = True,
    **measure_options: Any,
):
    """Benchmark a model under several configs and batch sizes; return a :class:`Results`.

    Every cell (config x batch size) is prepared (``Config.apply``), checked for parity against the
    FP32 reference on fresh inputs (a config that drifts is recorded as failed, never timed), then
    measured in each of ``modes`` (``latency``, ``throughput``, ``graph``, ``host``, ``end-to-end``: host
    batch in through :class:`gpuopt.InputPipeline`, result back on the host). ``train=True`` adds
    forward + backward + optimizer-step timing. A cell that fails (out of memory, compile error,
    parity) is recorded with its reason and the rest goes on. ``measure_options`` go to
    :func:`gpuopt.measure` (e.g. ``max_time_s=2``). ``output_dir`` saves JSON, CSV, Markdown and plots.

    >>> r = gpuopt.benchmark("tiny-cnn", configs=["fp32", "bf16-amp"], batch_sizes=[1, 8],
    ...                      device="cpu", max_time_s=0.2)                       # doctest: +SKIP
    >>> print(r.to_markdown())                                                   # doctest: +SKIP
    """
    work = workload(model_or_name, inputs=inputs, input_shape=input_shape, input_fn=input_fn)
    cfgs = resolve_configs(configs)
    batches = resolve_batch_sizes(batch_sizes) if work.make_inputs is not None else [batch_of(work.fixed_inputs)]
    dev = resolve_device(device)
    mode_list = resolve_modes(modes, train, dev)
    opts = check_measure_options(dict(measure_options))
    for name, flag in (("parity", parity), ("train", train), ("profile", profile), ("progress", progress)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {flag!r}")
    if output_dir is not None:
        check_writable(output_dir)  # before the run, not after it
    results = Results.new(spec={"models": [work.name], "configs": [str(c) for c in cfgs],
                                "config_labels": [c.label for c in cfgs], "batch_sizes": batches,
                                "modes": mode_list, "parity": parity, "measure": opts})
    bar = ProgressBar(len(batches) * len(cfgs), progress)
    profile_dir = str(Path(output_dir or ".") / "gpuopt-profiles") if profile else None
    runner = Runner(work, cfgs, mode_list, parity=parity, device=dev, measure_options=opts,
                    on_row=results.add, profile_dir=profile_dir, progress=bar)
    try:
        for b in batches:
            runner.run_batch(b)
    finally:
        bar.close()
        results.profiles.update(runner.profiles)
        results.ceilings = runner.ceilings
        if output_dir is not None:
            results.save(output_dir)
    return results
