"""gpuopt's pytest plugin: performance tests timed by gpuopt, with baselines and a report.

pytest-benchmark times with the host clock, knows nothing of GPUs and has no significance test, so
"fp16 stays 1.8x faster" or "p95 does not regress by more than 10%" cannot be trusted as tests with
it. This plugin brings gpuopt's timer and statistics into pytest:

- fixture ``gpuopt_bench``: ``gpuopt_bench(fn, **measure_options)`` or
  ``gpuopt_bench(model, config, inputs, **measure_options)`` returns a :class:`~gpuopt.Measurement`
  and records it for the report; marker ``@pytest.mark.gpuopt(**measure_options)`` sets defaults;
- marker ``@pytest.mark.gpuopt_gpu``: skipped with a reason when no CUDA device is usable
  (``GPUOPT_REQUIRE_GPU=1`` makes that an error instead);
- ``--gpuopt-save=NAME`` / ``--gpuopt-compare[=NAME]``: baselines in ``<rootdir>/.gpuopt/baselines``,
  keyed by test and environment, with the git commit and the machine; ``--gpuopt-compare`` alone
  compares with the baseline saved last; ``--gpuopt-compare-fail=median:10%,p95:15%`` fails a test
  only for a regression beyond the threshold that is also statistically significant;
- ``--gpuopt-json=PATH`` writes every measurement with the environment; ``--gpuopt-disable`` runs
  the test bodies once, untimed, for fast functional runs; ``--gpuopt-sort`` / ``--gpuopt-group-by``
  arrange the summary table.

The entry point (:mod:`gpuopt_pytest`) owns the options, markers, fixture and hooks and calls the
functions here only once a session uses gpuopt (an option, the fixture or a marker): importing this
module imports torch, which unrelated test sessions must not pay for.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from .. import testing
from .._ext import build_info
from .fixture import Bench
from .session import REGRESSIONS, STATE, _Session


def configure(config: pytest.Config) -> None:
    state = _Session(config)
    config.stash[STATE] = state
    state.previous_disabled = testing._set_timing_disabled(state.disabled)


def unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(STATE, None)
    if state is not None:
        testing._set_timing_disabled(state.previous_disabled)


def _gpu_unavailable_reason() -> str | None:
    info = build_info()
    if not info["cuda"]:
        return f"gpuopt was built without CUDA ({info['no_cuda_reason']})"
    if not torch.cuda.is_available():
        return "no CUDA device visible"
    return None


def modify_items(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip (or, with GPUOPT_REQUIRE_GPU=1, refuse) ``gpuopt_gpu`` tests without a usable GPU."""
    gpu_items = [i for i in items if i.get_closest_marker("gpuopt_gpu") is not None]
    if not gpu_items:
        return
    reason = _gpu_unavailable_reason()
    if reason is None:
        return
    if os.environ.get("GPUOPT_REQUIRE_GPU") == "1":
        raise pytest.UsageError(f"GPUOPT_REQUIRE_GPU=1 but {reason}")
    skip = pytest.mark.skip(reason=reason)
    for item in gpu_items:
        item.add_marker(skip)


def makereport(item: pytest.Item, report: pytest.TestReport) -> None:
    if report.when != "call":
        return
    regressions = item.stash.get(REGRESSIONS, [])
    if regressions and report.passed:
        # Failed after the body ran, so every measurement of the test is taken and reported.
        report.outcome = "failed"
        report.longrepr = "\n".join(regressions)
    if report.failed:  # its measurements are not saved as a baseline
        item.config.stash[STATE].failed_tests.add(item.nodeid)


def sessionfinish(config: pytest.Config) -> None:
    config.stash[STATE].write_files()


def terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    config.stash[STATE].summary(terminalreporter)


def bench(request: pytest.FixtureRequest) -> Bench:
    """The ``gpuopt_bench`` fixture's value (the fixture itself is defined in :mod:`gpuopt_pytest`)."""
    return Bench(request.node, request.config.stash[STATE])
