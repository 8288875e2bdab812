"""gpuopt's pytest plugin: performance tests timed by gpuopt, with baselines and a report.

pytest-benchmark times with the host clock, knows nothing of GPUs and has no significance test, so
"fp16 stays 1.8x faster" or "p95 does not regress by more than 10%" cannot be trusted as tests with
it. This plugin brings gpuopt's timer and statistics into pytest:

- fixture ``gpuopt_bench``: ``gpuopt_bench(fn, **measure_options)`` or
  ``gpuopt_bench(model, config, inputs, **measure_options)`` returns a :class:`~gpuopt.Measurement`
  and records it for the report; marker ``@pytest.mark.gpuopt(**measure_options)`` sets defaults;
- marker ``@pytest.mark.gpu``: skipped with a reason when no CUDA device is usable
  (``GPUOPT_REQUIRE_GPU=1`` makes that an error instead);
- ``--gpuopt-save=NAME`` / ``--gpuopt-compare=NAME``: baselines in ``<rootdir>/.gpuopt/baselines``,
  keyed by test and environment; ``--gpuopt-compare-fail=median:10%,p95:15%`` fails a test only
  for a regression beyond the threshold that is also statistically significant;
- ``--gpuopt-json=PATH`` writes every measurement with the environment; ``--gpuopt-disable`` runs
  the test bodies once, untimed, for fast functional runs.

Registered through the ``pytest11`` entry point, so it is active wherever gpuopt is installed
(``-p no:gpuopt`` turns it off). A session that neither uses the fixture nor passes an option sees
nothing of it but the two markers.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from .. import testing
from .._ext import build_info
from .fixture import gpuopt_bench  # noqa: F401  (the fixture, registered with the plugin)
from .session import REGRESSIONS, STATE, _Session


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpuopt", "gpuopt performance tests")
    group.addoption("--gpuopt-save", metavar="NAME",
                    help="save this session's measurements as baseline NAME in "
                         "<rootdir>/.gpuopt/baselines/NAME.json")
    group.addoption("--gpuopt-compare", metavar="NAME",
                    help="compare measurements with baseline NAME (reported in the summary)")
    group.addoption("--gpuopt-compare-fail", metavar="STAT:PCT%,...",
                    help="with --gpuopt-compare, fail a test whose STAT (median, p50, p90, p95, p99, "
                         "mean) regressed by more than PCT and significantly, e.g. median:10%%,p95:15%%")
    group.addoption("--gpuopt-calibrate", metavar="ROUNDS", type=int, default=None,
                    help="with --gpuopt-save, measure every benchmark in ROUNDS (>= 3) separate runs and "
                         "save their run-to-run spread with the baseline: --gpuopt-compare widens its "
                         "verdicts by it (default without: 3%% on GPU, 5%% on CPU)")
    group.addoption("--gpuopt-json", metavar="PATH",
                    help="write all measurements, the environment and its fingerprint to PATH")
    group.addoption("--gpuopt-disable", action="store_true", default=False,
                    help="run benchmark bodies once without timing; timing assertions pass unchecked")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device (gpuopt skips it with a reason when none "
                                       "is usable; GPUOPT_REQUIRE_GPU=1 makes that an error)")
    config.addinivalue_line("markers", "gpuopt(**measure_options): default gpuopt.measure options for the "
                                       "gpuopt_bench fixture in this test")
    state = _Session(config)
    config.stash[STATE] = state
    state.previous_disabled = testing._set_timing_disabled(state.disabled)


def pytest_unconfigure(config: pytest.Config) -> None:
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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [i for i in items if i.get_closest_marker("gpu") is not None]
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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call":
        return
    regressions = item.stash.get(REGRESSIONS, [])
    if regressions and report.passed:
        # Failed after the body ran, so every measurement of the test is taken and reported.
        report.outcome = "failed"
        report.longrepr = "\n".join(regressions)
    if report.failed:  # its measurements are not saved as a baseline
        item.config.stash[STATE].failed_tests.add(item.nodeid)


def pytest_sessionfinish(session: pytest.Session) -> None:
    session.config.stash[STATE].write_files()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    config.stash[STATE].summary(terminalreporter)
