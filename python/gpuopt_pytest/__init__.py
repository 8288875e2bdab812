"""Entry point of gpuopt's pytest plugin (pytest11 name "gpuopt"; ``-p no:gpuopt`` turns it off).

pytest loads every installed plugin in every session, so this shim stays out of the way of projects
that do not use gpuopt: it imports neither torch nor gpuopt, registers only its options and its own
markers (``gpuopt_gpu``, ``gpuopt``), and loads the plugin (:mod:`gpuopt.pytest.plugin`) only when
a ``--gpuopt-*`` option is given or a collected test uses the ``gpuopt_bench`` fixture or one of its
markers. If gpuopt cannot be imported then (say torch was upgraded and gpuopt not rebuilt), those
tests fail with the reason and every other test runs as usual.
"""

from __future__ import annotations

from typing import Any

import pytest

SORT_KEYS = ("run", "name", "median", "p95", "n", "change")
GROUP_KEYS = ("none", "module", "test", "name", "param", "mode")
# Options that need the plugin's session (baselines, report); --gpuopt-only/-skip only select tests.
_SESSION_OPTIONS = ("gpuopt_save", "gpuopt_compare", "gpuopt_compare_fail", "gpuopt_calibrate", "gpuopt_json", "gpuopt_disable",
                    "gpuopt_sort", "gpuopt_group_by")
_MARKERS = ("gpuopt_gpu", "gpuopt")
_PLUGIN = pytest.StashKey[Any]()  # gpuopt.pytest.plugin once loaded
_BROKEN = pytest.StashKey[str]()  # why it could not be loaded
_NEEDS = pytest.StashKey[bool]()  # on items that need the plugin


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpuopt", "gpuopt performance tests")
    group.addoption("--gpuopt-save", metavar="NAME",
                    help="save this session's measurements as baseline NAME in "
                         "<rootdir>/.gpuopt/baselines/NAME.json, with the git commit and the machine")
    group.addoption("--gpuopt-compare", metavar="NAME", nargs="?", const="latest",
                    help="compare measurements with baseline NAME (reported in the summary); without NAME, "
                         "or NAME=latest: the baseline saved last on this environment")
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
    group.addoption("--gpuopt-only", action="store_true", default=False,
                    help="run only gpuopt performance tests (those using gpuopt_bench or @pytest.mark.gpuopt); "
                         "deselect the others")
    group.addoption("--gpuopt-skip", action="store_true", default=False,
                    help="deselect gpuopt performance tests (those using gpuopt_bench or @pytest.mark.gpuopt)")
    group.addoption("--gpuopt-sort", metavar="KEY", choices=SORT_KEYS, default=None,
                    help=f"order of the summary table: {', '.join(SORT_KEYS)} (default run: the order "
                         "measured; change: the change against --gpuopt-compare, largest slowdown first)")
    group.addoption("--gpuopt-group-by", metavar="KEY", choices=GROUP_KEYS, default=None,
                    help=f"split the summary table into groups: {', '.join(GROUP_KEYS)} (test: parametrized "
                         "cases together; param: the same parameters across tests)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpuopt_gpu: needs a CUDA device (gpuopt skips it with a reason when "
                                       "none is usable; GPUOPT_REQUIRE_GPU=1 makes that an error)")
    config.addinivalue_line("markers", "gpuopt(**measure_options): default gpuopt.measure options for the "
                                       "gpuopt_bench fixture in this test")
    if config.getoption("gpuopt_only") and config.getoption("gpuopt_skip"):
        raise pytest.UsageError("--gpuopt-only and --gpuopt-skip exclude each other: give one")
    given = [name for name in _SESSION_OPTIONS if config.getoption(name) not in (None, False)]
    if given:
        plugin = _load(config)
        if plugin is None:
            raise pytest.UsageError(f"--{given[0].replace('_', '-')} needs gpuopt, which cannot be imported "
                                    f"({config.stash[_BROKEN]})")


def _load(config: pytest.Config) -> Any:
    """gpuopt.pytest.plugin, configured for this session; None (and the reason stashed) when gpuopt
    cannot be imported."""
    if _PLUGIN in config.stash:
        return config.stash[_PLUGIN]
    if _BROKEN in config.stash:
        return None
    try:
        from gpuopt.pytest import plugin
    except ImportError as exc:
        config.stash[_BROKEN] = f"{type(exc).__name__}: {exc}"
        return None
    plugin.configure(config)
    config.stash[_PLUGIN] = plugin
    return plugin


def _uses_gpuopt(item: pytest.Item) -> bool:
    return ("gpuopt_bench" in getattr(item, "fixturenames", ())
            or any(item.get_closest_marker(m) is not None for m in _MARKERS))


def _is_perf_test(item: pytest.Item) -> bool:
    return "gpuopt_bench" in getattr(item, "fixturenames", ()) or item.get_closest_marker("gpuopt") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    only, skip = config.getoption("gpuopt_only"), config.getoption("gpuopt_skip")
    if only or skip:
        keep = [i for i in items if _is_perf_test(i) == only]
        dropped = [i for i in items if _is_perf_test(i) != only]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = keep
    needing = [i for i in items if _uses_gpuopt(i)]
    if not needing:
        return
    plugin = _load(config)
    if plugin is None:
        for item in needing:
            item.stash[_NEEDS] = True
        return
    plugin.modify_items(config, needing)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.stash.get(_NEEDS, False) and _BROKEN in item.config.stash:
        pytest.fail(f"gpuopt's pytest plugin is off: gpuopt cannot be imported ({item.config.stash[_BROKEN]})",
                    pytrace=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any):
    outcome = yield
    plugin = item.config.stash.get(_PLUGIN, None)
    if plugin is not None:
        plugin.makereport(item, outcome.get_result())


def pytest_sessionfinish(session: pytest.Session) -> None:
    plugin = session.config.stash.get(_PLUGIN, None)
    if plugin is not None:
        plugin.sessionfinish(session.config)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    plugin = config.stash.get(_PLUGIN, None)
    if plugin is not None:
        plugin.terminal_summary(terminalreporter, config)


def pytest_unconfigure(config: pytest.Config) -> None:
    plugin = config.stash.get(_PLUGIN, None)
    if plugin is not None:
        plugin.unconfigure(config)


@pytest.fixture
def gpuopt_bench(request: pytest.FixtureRequest) -> Any:
    """Measure with gpuopt and record the result for the session's report and baselines.

    ``gpuopt_bench(fn, **measure_options)`` or ``gpuopt_bench(model, config, inputs,
    **measure_options)``; ``name=`` keys a measurement when a test takes several. Options from
    ``@pytest.mark.gpuopt(...)`` apply first, the call's own override them.

    >>> @pytest.mark.gpuopt(max_time_s=2)                       # doctest: +SKIP
    ... def test_resnet_fp16(gpuopt_bench):
    ...     m = gpuopt_bench(model, "fp16-amp+channels_last", x)
    ...     assert_latency(m, p95_ms=5)
    """
    plugin = _load(request.config)  # loaded at collection already, unless requested dynamically
    if plugin is None:
        pytest.fail(f"gpuopt_bench: gpuopt cannot be imported ({request.config.stash[_BROKEN]})", pytrace=False)
    return plugin.bench(request)
