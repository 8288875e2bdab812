"""Entry point of gpuopt's pytest plugin (pytest11 name "gpuopt"; ``-p no:gpuopt`` turns it off).

It lives outside the ``gpuopt`` package on purpose: pytest loads every installed plugin in every
session, and importing ``gpuopt`` loads its compiled extension. If that fails (say torch was upgraded
and gpuopt not rebuilt), unrelated test sessions must keep working: the markers are still registered
and a warning says why gpuopt's plugin is off.
"""

import pytest

try:
    from gpuopt.pytest.plugin import (  # noqa: F401  (hooks and the fixture, re-exported for pytest)
        gpuopt_bench,
        pytest_addoption,
        pytest_collection_modifyitems,
        pytest_configure,
        pytest_runtest_makereport,
        pytest_sessionfinish,
        pytest_terminal_summary,
        pytest_unconfigure,
    )
except ImportError as _exc:
    _REASON = f"{type(_exc).__name__}: {_exc}"

    def pytest_configure(config):  # noqa: F811
        config.addinivalue_line("markers", "gpu: needs a CUDA device")
        config.addinivalue_line("markers", "gpuopt(**measure_options): gpuopt.measure options for gpuopt_bench")
        config.issue_config_time_warning(
            pytest.PytestConfigWarning(f"gpuopt's pytest plugin is off: gpuopt cannot be imported ({_REASON})"),
            stacklevel=2)
