"""gpuopt's pytest plugin in real inner pytest sessions (pytester), and gpuopt.testing's assertions.

Inner tests time host busy-loops (mode="host") or give samples directly, so all of it runs on any
machine; a regression is planted through an environment variable the inner test reads.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import gpuopt
from gpuopt import Measurement
from gpuopt.pytest.regression import parse_thresholds, regression_checks
from gpuopt.testing import (
    assert_faster,
    assert_latency,
    assert_parity,
    assert_throughput,
    environment_line,
)

HEADER = '''
import os
import time

import numpy as np
import pytest
import torch

from gpuopt import Measurement
from gpuopt.testing import assert_faster, assert_latency, assert_parity, assert_throughput


def spin(ms):
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


pytestmark = pytest.mark.gpuopt(mode="host", max_time_s=0.15, warmup_s=0)
'''


def write_tests(pytester: pytest.Pytester, body: str) -> None:
    pytester.makepyfile(test_perf=HEADER + textwrap.dedent(body))


@pytest.fixture(autouse=True)
def _inner_sessions(pytester, monkeypatch):
    monkeypatch.delenv("GPUOPT_REQUIRE_GPU", raising=False)  # the inner sessions decide for themselves
    pytester.makeini("[pytest]\naddopts = -p no:hypothesispytest\n")  # it imports hypothesis: 1.5 s a run


def baseline_file(pytester: pytest.Pytester, name: str = "main") -> dict:
    return json.loads((pytester.path / ".gpuopt" / "baselines" / f"{name}.json").read_text())


# ------------------------------------------------------------------------------- the plugin


def test_sessions_that_do_not_use_the_plugin_see_nothing_of_it(pytester):
    pytester.makepyfile(test_plain="def test_one():\n    assert True\n")
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("*= gpuopt =*")  # no report section
    help_text = pytester.runpytest("--help").stdout.str()
    assert "--gpuopt-save=NAME" in help_text and "--gpuopt-disable" in help_text


def test_markers_are_registered_for_strict_markers_and_p_no_gpuopt_disables_the_plugin(pytester):
    write_tests(pytester, '''
        @pytest.mark.gpuopt_gpu
        def test_gpu_marked():
            pass

        @pytest.mark.gpuopt(iters=5)
        def test_bench(gpuopt_bench):
            assert gpuopt_bench(lambda: None).n == 5
    ''')
    result = pytester.runpytest("--strict-markers", "-rs")
    result.assert_outcomes(passed=2 if torch.cuda.is_available() else 1, skipped=0 if torch.cuda.is_available() else 1)
    off = pytester.runpytest("-p", "no:gpuopt")
    off.assert_outcomes(passed=1, errors=1)
    off.stdout.fnmatch_lines(["*fixture 'gpuopt_bench' not found*"])


def test_a_projects_own_gpu_marker_is_left_alone(pytester):
    # Another project's `gpu` marker means what that project says: gpuopt neither registers nor skips it.
    pytester.makeini("[pytest]\naddopts = -p no:hypothesispytest\nmarkers =\n    gpu: this project's own\n")
    pytester.makepyfile(test_other="import pytest\n\n@pytest.mark.gpu\ndef test_mine():\n    pass\n")
    result = pytester.runpytest("--strict-markers", "-rs")
    result.assert_outcomes(passed=1)
    assert "CUDA" not in result.stdout.str()
    pytester.makeini("[pytest]\naddopts = -p no:hypothesispytest\n")  # unregistered: not gpuopt's either
    unknown = pytester.runpytest_subprocess("--strict-markers")  # in-process, pytest caches known markers
    assert unknown.ret == pytest.ExitCode.INTERRUPTED
    unknown.stdout.fnmatch_lines(["*'gpu' not found in `markers` configuration option*"])


PROBE = '''
import sys


def pytest_collection_finish(session):
    print("PROBE torch=%s gpuopt=%s plugin=%s" % ("torch" in sys.modules, "gpuopt" in sys.modules,
                                                  session.config.pluginmanager.has_plugin("gpuopt")))
'''


@pytest.mark.parametrize("test_file, args, imports", [
    ("def test_plain():\n    pass\n", [], False),
    ("import pytest\n\n@pytest.mark.gpuopt(iters=2)\ndef test_g(gpuopt_bench):\n    pass\n", ["--gpuopt-skip"], False),
    ("def test_plain():\n    pass\n", ["--gpuopt-only", "--gpuopt-group-by=module"], True),  # a session option
    ("def test_bench(gpuopt_bench):\n    pass\n", [], True),
    ("import pytest\n\n@pytest.mark.gpuopt_gpu\ndef test_g():\n    pass\n", [], True),
])
def test_gpuopt_and_torch_are_imported_only_for_sessions_that_use_them(tmp_path, test_file, args, imports):
    # A fresh interpreter, as an unrelated project would start pytest; the plugin is loaded (entry point)
    # either way, and imports gpuopt (and so torch) only when a test or an option needs it.
    (tmp_path / "conftest.py").write_text(PROBE)
    (tmp_path / "test_x.py").write_text(test_file)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-s", "-p", "no:cacheprovider",
                           "-p", "no:hypothesispytest", "-p", "no:anyio", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert proc.returncode in (0, 5), proc.stdout + proc.stderr
    assert f"PROBE torch={imports} gpuopt={imports} plugin=True" in proc.stdout, proc.stdout + proc.stderr


def test_only_and_skip_select_the_performance_tests(pytester):
    pytester.makepyfile(test_perf=textwrap.dedent('''
        import pytest

        def test_plain():
            pass

        @pytest.mark.gpuopt(iters=3)
        def test_marked():
            pass

        def test_fixture(gpuopt_bench):
            gpuopt_bench(lambda: None, iters=3)
    '''))
    only = pytester.runpytest("--gpuopt-only", "-v")
    only.assert_outcomes(passed=2, deselected=1)
    only.stdout.fnmatch_lines(["*test_marked PASSED*", "*test_fixture PASSED*"])
    skip = pytester.runpytest("--gpuopt-skip", "-v")
    skip.assert_outcomes(passed=1, deselected=2)
    skip.stdout.fnmatch_lines(["*test_plain PASSED*"])
    assert "= gpuopt =" not in skip.stdout.str()


def test_passing_assertions_marker_options_and_the_summary_table(pytester):
    write_tests(pytester, '''
        @pytest.mark.gpuopt(iters=12)
        def test_ok(gpuopt_bench):
            m = gpuopt_bench(lambda: spin(0.2))
            assert m.mode == "host" and m.n == 12  # module marker, then the test's own
            assert gpuopt_bench(lambda: spin(0.05), iters=7).n == 7  # the call's options win
            gpuopt_bench(lambda: spin(0.05), name="short")
            assert_latency(m, p50_ms=50, p95_ms=100)
            assert_throughput(m, min_per_s=100, items_per_call=4)
            c = assert_faster(lambda: spin(0.3), lambda: spin(0.15), min_speedup=1.5, mode="host",
                              max_time_s=0.2)
            gpuopt_bench.record(c.candidate_measurement, name="fast")
    ''')
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "*= gpuopt =*",
        "test * mode * median * p95 * median 95% CI * n",
        "test_perf.py::test_ok * host * us * .. * 12",  # p95 and the CI may reach ms on a loaded machine
        "test_perf.py::test_ok#1 * host *7",
        "test_perf.py::test_ok#short * host *",
        "test_perf.py::test_ok#fast * host *",
        "env: * torch *",
    ])


def test_failing_assertions_show_the_numbers_the_interval_and_the_environment(pytester):
    write_tests(pytester, '''
        def test_too_slow(gpuopt_bench):
            assert_latency(gpuopt_bench(lambda: spin(0.2)), p95_ms=0.01)

        def test_not_fast_enough():
            assert_faster(lambda: spin(0.3), lambda: spin(0.2), min_speedup=3, mode="host", max_time_s=0.2)
    ''')
    result = pytester.runpytest()
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines([
        "E * AssertionError: latency above its limit: p95 * > p95_ms=10 us",  # p95 may be ms under load
        "E * measured: median * us [[]95% CI * us .. * us], p95 *, n=*, mode host",
        "E * env: * driver *, torch *",
    ])
    result.stdout.fnmatch_lines([
        "E * AssertionError: candidate is not 3x faster than baseline: speedup 1.* is below min_speedup 3x",
        "E * speedup 1.*x [[]95% CI 1.*x .. 1.*x] (interleaved)",
        "E * baseline: * median * us *",
        "E * candidate: median * us *",
        "E * env: *",
    ])


SPIN_TESTS = '''
    def test_spin(gpuopt_bench):
        gpuopt_bench(lambda: spin(float(os.environ["SPIN_MS"])))
'''


def test_save_then_compare_fails_only_a_planted_regression(pytester, monkeypatch):
    write_tests(pytester, SPIN_TESTS + '''
    def test_gone(gpuopt_bench):
        gpuopt_bench(lambda: spin(0.05))
    ''')
    monkeypatch.setenv("SPIN_MS", "0.3")
    saved = pytester.runpytest("--gpuopt-save=main")
    saved.assert_outcomes(passed=2)
    saved.stdout.fnmatch_lines(["saved 2 measurement(s) as baseline 'main' in *main.json"])
    data = baseline_file(pytester)
    (entry,) = data["environments"]
    assert set(entry["fingerprint"]) >= {"gpu", "driver_major", "torch", "torch_cuda"}
    assert entry["fingerprint"]["torch"] == torch.__version__
    assert set(entry["measurements"]) == {"test_perf.py::test_spin", "test_perf.py::test_gone"}
    assert Measurement.from_dict(entry["measurements"]["test_perf.py::test_spin"]["measurement"]).mode == "host"
    assert [p.name for p in (pytester.path / ".gpuopt" / "baselines").iterdir()] == ["main.json"]  # no temp

    # test_gone is removed and test_new added: both reported, neither failed.
    write_tests(pytester, SPIN_TESTS + '''
    def test_new(gpuopt_bench):
        gpuopt_bench(lambda: spin(0.05))
    ''')
    monkeypatch.setenv("SPIN_MS", "0.45")  # 50% slower
    regressed = pytester.runpytest("--gpuopt-compare=main", "--gpuopt-compare-fail=median:10%,p95:15%")
    regressed.assert_outcomes(failed=1, passed=1)
    regressed.stdout.fnmatch_lines([
        "gpuopt: test_perf.py::test_spin regressed against baseline 'main' (beyond the threshold and "
        "significant):",
        "  median +*% [[]95% CI +*% .. +*%], limit 10%: * us -> * us",  # p95 may be noisy here
        "*env: *",
    ])
    regressed.stdout.fnmatch_lines([
        "test * vs main",
        "test_perf.py::test_spin *+*% [[]* .. *] slower FAILED median*",
        "test_perf.py::test_new * new",
        "no baseline in 'main' for: test_perf.py::test_new",
        "in baseline 'main' but not measured in this run *: test_perf.py::test_gone",
    ])
    # A regression within the threshold, or with no threshold given, is reported and passes.
    pytester.runpytest("--gpuopt-compare=main", "--gpuopt-compare-fail=median:80%").assert_outcomes(passed=2)
    pytester.runpytest("--gpuopt-compare=main").assert_outcomes(passed=2)

    monkeypatch.setenv("SPIN_MS", "0.3")
    same = pytester.runpytest("--gpuopt-compare=main", "--gpuopt-compare-fail=median:10%")
    same.assert_outcomes(passed=2)
    assert "FAILED" not in same.stdout.str()


def test_compare_without_a_name_uses_the_baseline_saved_last_with_its_commit(pytester, monkeypatch):
    write_tests(pytester, SPIN_TESTS)
    monkeypatch.setenv("SPIN_MS", "0.2")
    none_yet = pytester.runpytest("--gpuopt-compare")
    assert none_yet.ret == pytest.ExitCode.USAGE_ERROR
    none_yet.stderr.fnmatch_lines(["ERROR: --gpuopt-compare: no baseline saved yet in *baselines; save one first "
                                   "with --gpuopt-save=NAME"])
    for name, commit in [("zeta", "1111111"), ("alpha", "2222222")]:  # alpha is saved last: not by name order
        monkeypatch.setenv("GPUOPT_GIT_COMMIT", commit)
        pytester.runpytest(f"--gpuopt-save={name}").assert_outcomes(passed=1)
    (entry,) = baseline_file(pytester, "alpha")["environments"]
    assert entry["commit"] == "2222222" and entry["env"]["hostname"]
    assert abs(_dt.datetime.fromisoformat(entry["saved_at"]) - _dt.datetime.now(_dt.timezone.utc)).total_seconds() < 600
    assert baseline_file(pytester, "zeta")["environments"][0]["commit"] == "1111111"
    for args in (["--gpuopt-compare"], ["--gpuopt-compare=latest", "--gpuopt-sort=change"]):
        result = pytester.runpytest(*args)
        result.assert_outcomes(passed=1)
        result.stdout.fnmatch_lines(["test * vs alpha", "compared with baseline 'alpha' (commit 2222222, saved_at *)"])
    saving = pytester.runpytest("--gpuopt-save=latest")
    assert saving.ret == pytest.ExitCode.USAGE_ERROR
    saving.stderr.fnmatch_lines(["ERROR: --gpuopt-save: 'latest' is reserved *; choose another NAME"])
    pytester.runpytest("--gpuopt-json=r.json").assert_outcomes(passed=1)
    assert json.loads((pytester.path / "r.json").read_text())["commit"] == "2222222"


def test_the_summary_sorts_and_groups(pytester):
    write_tests(pytester, '''
        @pytest.mark.parametrize("ms", [0.4, 0.1])
        def test_a(gpuopt_bench, ms):
            gpuopt_bench(lambda: spin(ms), name="slow")
            gpuopt_bench(lambda: spin(ms / 8), name="fast")
    ''')
    median = pytester.runpytest("--gpuopt-sort=median")
    median.stdout.fnmatch_lines(["test * mode *", "*test_a[[]0.1]#fast *", "*test_a[[]0.4]#fast *",
                                 "*test_a[[]0.1]#slow *", "*test_a[[]0.4]#slow *"])
    grouped = pytester.runpytest("--gpuopt-group-by=name", "--gpuopt-sort=name")
    grouped.stdout.fnmatch_lines(["name fast:", "test * mode *", "*test_a[[]0.1]#fast *", "*test_a[[]0.4]#fast *",
                                  "name slow:", "test * mode *", "*test_a[[]0.1]#slow *", "*test_a[[]0.4]#slow *"])
    by_param = pytester.runpytest("--gpuopt-group-by=param")
    by_param.stdout.fnmatch_lines(["param [[]0.4]:", "*", "*#slow*", "*#fast*", "param [[]0.1]:"])
    bad = pytester.runpytest("--gpuopt-sort=speed")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--gpuopt-sort: invalid choice: 'speed' (choose from *run*name*median*"])
    change = pytester.runpytest("--gpuopt-sort=change")
    assert change.ret == pytest.ExitCode.USAGE_ERROR
    change.stderr.fnmatch_lines(["ERROR: --gpuopt-sort=change needs --gpuopt-compare*"])
    both = pytester.runpytest("--gpuopt-only", "--gpuopt-skip")
    assert both.ret == pytest.ExitCode.USAGE_ERROR
    both.stderr.fnmatch_lines(["ERROR: --gpuopt-only and --gpuopt-skip exclude each other: give one"])


def test_a_regression_beyond_the_threshold_fails_only_when_significant(pytester, monkeypatch):
    # Samples given directly: 20% slower with little noise is significant, with much noise it is not.
    write_tests(pytester, '''
        def test_given(gpuopt_bench):
            rng = np.random.default_rng(int(os.environ["SEED"]))
            n, sigma, factor = int(os.environ["N"]), float(os.environ["SIGMA"]), float(os.environ["FACTOR"])
            gpuopt_bench.record(Measurement.from_samples((factor * rng.lognormal(0, sigma, n)).tolist()))
    ''')
    for seed, n, sigma, factor, save in [(1, 400, 0.02, 1.0, True), (2, 400, 0.02, 1.2, False),
                                         (3, 12, 0.02, 1.0, True), (4, 12, 0.6, 1.2, False)]:
        monkeypatch.setenv("SEED", str(seed))
        monkeypatch.setenv("N", str(n))
        monkeypatch.setenv("SIGMA", str(sigma))
        monkeypatch.setenv("FACTOR", str(factor))
        if save:
            pytester.runpytest("--gpuopt-save=given").assert_outcomes(passed=1)
            continue
        result = pytester.runpytest("--gpuopt-compare=given", "--gpuopt-compare-fail=median:10%")
        if sigma < 0.1:
            result.assert_outcomes(failed=1)
        else:
            result.assert_outcomes(passed=1)
            result.stdout.fnmatch_lines(["test_perf.py::test_given * ~"])


def test_a_baseline_from_another_environment_is_skipped_with_a_warning(pytester, monkeypatch):
    write_tests(pytester, SPIN_TESTS)
    monkeypatch.setenv("SPIN_MS", "0.2")
    pytester.runpytest("--gpuopt-save=main").assert_outcomes(passed=1)
    path = pytester.path / ".gpuopt" / "baselines" / "main.json"
    data = json.loads(path.read_text())
    data["environments"][0]["fingerprint"]["gpu"] = "NVIDIA Imaginary GPU"
    path.write_text(json.dumps(data))
    monkeypatch.setenv("SPIN_MS", "0.4")  # would fail if compared
    result = pytester.runpytest("--gpuopt-compare=main", "--gpuopt-compare-fail=median:10%")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "*GpuoptBaselineWarning: baseline 'main' was saved on a different environment (gpu: baseline "
        "'NVIDIA Imaginary GPU', here *); comparison skipped",
    ])
    result.stdout.fnmatch_lines(["*= gpuopt =*", "*", "*", "env: *",
                                 "baseline 'main' was saved on a different environment*comparison skipped"])
    assert "vs main" not in result.stdout.str()


def test_without_cuda_the_fixture_falls_back_to_host_timing(pytester, monkeypatch):
    monkeypatch.setenv("EXPECTED_MODE", "latency" if torch.cuda.is_available() else "host")
    pytester.makepyfile(test_default='''
        import os

        import pytest
        import torch


        class Boom(torch.nn.Module):
            def forward(self, x):
                raise RuntimeError("boom in forward")


        @pytest.mark.gpuopt(max_time_s=0.1, warmup_s=0)
        def test_default_mode(gpuopt_bench):
            x = torch.randn(64, 64, device="cuda" if torch.cuda.is_available() else "cpu")
            assert gpuopt_bench(lambda: x @ x).mode == os.environ["EXPECTED_MODE"]
            m = gpuopt_bench(torch.nn.Linear(16, 4), "fp32", torch.randn(8, 16))
            assert m.mode == os.environ["EXPECTED_MODE"] and m.label == "fp32"


        def test_unpreparable_config(gpuopt_bench):
            gpuopt_bench(Boom(), "fp32", torch.randn(2, 2))
    ''')
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*gpuopt_bench: config fp32 could not be prepared: fp32: RuntimeError: "
                                 "*boom in forward*"])


@pytest.mark.skipif(torch.cuda.is_available() and gpuopt.build_info()["cuda"], reason="needs a machine without CUDA")
def test_gpu_marker_skips_with_a_reason_without_cuda(pytester, monkeypatch):
    pytester.makepyfile(test_gpu='import pytest\n\n@pytest.mark.gpuopt_gpu\ndef test_needs_gpu():\n    pass\n')
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED [[]1] test_gpu.py:*: *CUDA*"])
    monkeypatch.setenv("GPUOPT_REQUIRE_GPU", "1")
    required = pytester.runpytest()
    assert required.ret == pytest.ExitCode.USAGE_ERROR
    required.stderr.fnmatch_lines(["ERROR: GPUOPT_REQUIRE_GPU=1 but *"])


def test_disable_runs_bodies_once_and_skips_only_timing_assertions(pytester):
    write_tests(pytester, '''
        def test_functional(gpuopt_bench):
            calls = []
            m = gpuopt_bench(lambda: calls.append(1))
            assert calls == [1] and m.n == 1 and m.stop_reason == "disabled"
            assert_latency(m, p50_ms=1e-9)
            assert_throughput(m, min_per_s=1e15)
            c = assert_faster(lambda: calls.append(2), lambda: calls.append(3), min_speedup=100)
            assert c.verdict == "not timed" and calls == [1, 2, 3]
            assert gpuopt_bench(torch.nn.Linear(4, 2), "fp32", torch.randn(3, 4)).stop_reason == "disabled"

        def test_parity_still_checked():
            m = torch.nn.Linear(4, 2)
            assert_parity(lambda x: m(x) * 2, m, torch.randn(3, 4))
    ''')
    result = pytester.runpytest("--gpuopt-disable")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*outputs differ from the reference: parity FAILED*",
                                 "timing disabled (--gpuopt-disable): 2 benchmark call(s) ran once, untimed"])
    assert "median 95% CI" not in result.stdout.str()
    assert not gpuopt.testing.timing_disabled()  # restored when the inner session ended


def test_json_report_holds_measurements_environment_and_fingerprint(pytester):
    write_tests(pytester, '''
        @pytest.mark.parametrize("ms", [0.05, 0.1])
        def test_two(gpuopt_bench, ms):
            gpuopt_bench(lambda: spin(ms))
            gpuopt_bench(lambda: spin(ms), name="again", label="spin again")
    ''')
    result = pytester.runpytest("--gpuopt-json=out/report.json")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["wrote 4 measurement(s) to *report.json"])
    report = json.loads((pytester.path / "out" / "report.json").read_text())
    assert report["env"]["torch"] == torch.__version__ and report["fingerprint"]["torch"] == torch.__version__
    assert [m["key"] for m in report["measurements"]] == [
        "test_perf.py::test_two[0.05]", "test_perf.py::test_two[0.05]#again",
        "test_perf.py::test_two[0.1]", "test_perf.py::test_two[0.1]#again",
    ]
    first, again = (Measurement.from_dict(m["measurement"]) for m in report["measurements"][:2])
    assert first.mode == "host" and first.n > 10 and again.label == "spin again"
    assert report["measurements"][0]["outcome"] == "passed" and report["measurements"][0]["baseline"] is None


def test_bad_fixture_arguments_name_the_parameter(pytester):
    write_tests(pytester, '''
        def test_errors(gpuopt_bench):
            with pytest.raises(TypeError, match="fn must be callable, got int"):
                gpuopt_bench(42)
            with pytest.raises(TypeError, match="model must be a torch.nn.Module, got function"):
                gpuopt_bench(lambda x: x, "fp32", torch.randn(2))
            with pytest.raises(TypeError, match="config must be a gpuopt.Config or a string"):
                gpuopt_bench(torch.nn.Linear(2, 2), 3, torch.randn(2))
            with pytest.raises(TypeError, match="inputs are required with a config"):
                gpuopt_bench(torch.nn.Linear(2, 2), "fp32")
            with pytest.raises(ValueError, match="unknown config token 'fp33'"):
                gpuopt_bench(torch.nn.Linear(2, 2), "fp33", torch.randn(2))
            with pytest.raises(TypeError, match="unknown measure option.*itres"):
                gpuopt_bench(lambda: None, itres=3)
            with pytest.raises(TypeError, match="record needs a gpuopt.Measurement, got list"):
                gpuopt_bench.record([1.0])
            gpuopt_bench(lambda: None, name="x")
            with pytest.raises(ValueError, match="key 'test_perf.py::test_errors#x' is already used"):
                gpuopt_bench(lambda: None, name="x")

        @pytest.mark.gpuopt(5)
        def test_positional_marker(gpuopt_bench):
            with pytest.raises(TypeError, match="keywords only"):
                gpuopt_bench(lambda: None)
    ''')
    pytester.runpytest().assert_outcomes(passed=2)


@pytest.mark.parametrize(
    "args, match",
    [
        (["--gpuopt-compare-fail=median:10%"], "--gpuopt-compare-fail needs --gpuopt-compare=NAME*"),
        (["--gpuopt-compare=main", "--gpuopt-compare-fail=p42:10%"],
         "*unknown statistic 'p42' in 'p42:10%'; allowed: median, p50, p90, p95, p99, mean"),
        (["--gpuopt-compare=main", "--gpuopt-compare-fail=median:ten%"], "*malformed percentage 'ten%' for median*"),
        (["--gpuopt-compare=main", "--gpuopt-compare-fail=median:10"], "*malformed percentage '10' for median*"),
        (["--gpuopt-compare=main", "--gpuopt-compare-fail=median10%"], "*entry 'median10%' must look like STAT:*"),
        (["--gpuopt-compare=main", "--gpuopt-compare-fail=p50:5%,median:10%"], "*sets median a second time*"),
        (["--gpuopt-compare=nope"], "--gpuopt-compare=nope: no baseline file *nope.json; saved baselines: corrupt, main"),
        (["--gpuopt-compare=corrupt"], "--gpuopt-compare: baseline file *corrupt.json is unreadable or corrupt*"),
        (["--gpuopt-save=corrupt"], "--gpuopt-save: baseline file *corrupt.json is unreadable or corrupt*"),
        (["--gpuopt-save=../up"], "--gpuopt-save: NAME must be letters, digits*got '../up'"),
        (["--gpuopt-compare", "tests/"], "--gpuopt-compare: NAME must be *got 'tests/' (a bare --gpuopt-compare takes "
                                         "the next argument: write --gpuopt-compare=NAME)"),
        (["--gpuopt-calibrate=5"], "--gpuopt-calibrate needs --gpuopt-save=NAME*"),
        (["--gpuopt-save=new", "--gpuopt-calibrate=2"], "--gpuopt-calibrate: ROUNDS must be an integer >= 3, got 2"),
        (["--gpuopt-disable", "--gpuopt-json=x.json"], "--gpuopt-disable times nothing, so --gpuopt-json*"),
    ],
)
def test_bad_options_are_usage_errors(pytester, args, match):
    pytester.makepyfile(test_plain="def test_one():\n    pass\n")
    baselines = pytester.path / ".gpuopt" / "baselines"
    baselines.mkdir(parents=True)
    (baselines / "main.json").write_text(json.dumps({"schema_version": 1, "environments": []}))
    (baselines / "corrupt.json").write_text('{"environments": [{"fingerprint": ')
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {match}"])
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


def test_parse_thresholds():
    assert parse_thresholds("median:10%, p95:15.5%,mean:0%") == pytest.approx(
        {"median": 0.10, "p95": 0.155, "mean": 0.0})
    assert parse_thresholds("p50:.5%") == pytest.approx({"median": 0.005})


@pytest.mark.parametrize("slowdown, verdict", [(1.03, "slower"), (1.005, "no significant difference"),
                                               (0.97, "faster")])
def test_regression_checks_use_gpuopts_verdict_with_min_effect(np_rng, slowdown, verdict):
    # 0.1% noise: even a 0.5% slowdown has an interval wholly above 1, but it is below gpuopt's
    # min_effect (1%), so it is no regression -- the verdict compare() gives, not the interval alone.
    base = np_rng.lognormal(0.0, 0.001, 1000)
    cur = slowdown * np_rng.lognormal(0.0, 0.001, 1000)
    mb, mc = Measurement.from_samples(base.tolist()), Measurement.from_samples(cur.tolist())
    band = gpuopt.RunToRun(0.02, "given")  # a baseline is another run: a 3% change exceeds a 2% band
    median, p95, mean = regression_checks(mb, mc, {"median": 0.001, "p95": 0.001, "mean": 0.001}, band)
    assert median.verdict == p95.verdict == mean.verdict == verdict == gpuopt.compare(mb, mc, run_to_run=band).verdict
    assert median.change == pytest.approx(np.median(cur) / np.median(base) - 1, rel=1e-6)
    assert p95.change == pytest.approx(np.percentile(cur, 95) / np.percentile(base, 95) - 1, rel=1e-6)
    assert mean.change == pytest.approx(cur.mean() / base.mean() - 1, rel=1e-6) and mean.ci is None
    assert median.ci[0] <= median.change <= median.ci[1]
    if slowdown == 1.005:
        assert median.ci[0] > 0  # significant by the interval alone, yet not a regression
    assert [c.significant for c in (median, p95, mean)] == [verdict == "slower"] * 3
    assert [c.failed for c in (median, p95, mean)] == [verdict == "slower"] * 3


def test_regression_checks_are_widened_by_the_run_to_run_band(np_rng):
    base = np_rng.lognormal(0.0, 0.001, 1000)
    mb, mc = Measurement.from_samples(base.tolist()), Measurement.from_samples((1.03 * base).tolist())
    assert regression_checks(mb, mc, {})[0].verdict == "no significant difference"  # host default: 5%
    assert regression_checks(mb, mc, {}, gpuopt.RunToRun(0.02, "given"))[0].verdict == "slower"


def test_calibrate_saves_the_run_to_run_spread_and_compare_uses_it(pytester, monkeypatch):
    write_tests(pytester, SPIN_TESTS)
    monkeypatch.setenv("SPIN_MS", "0.2")
    result = pytester.runpytest("--gpuopt-save=main", "--gpuopt-calibrate=3")
    result.assert_outcomes(passed=1)
    entry = baseline_file(pytester)["environments"][0]
    cal = gpuopt.RunToRun.from_dict(entry["calibration"])
    assert (cal.source, cal.rounds, cal.workloads) == ("calibration", 3, len(entry["measurements"]))
    result.stdout.fnmatch_lines([f"run-to-run spread saved with it: ±{cal.rel:.1%} (A/A calibration, 3 rounds*"])
    compared = pytester.runpytest("--gpuopt-compare=main")
    compared.stdout.fnmatch_lines([f"cross-run comparison: widened by run-to-run spread ±{cal.rel:.1%} (A/A "
                                   "calibration, 3 rounds*"])
    # Saved again without calibrating, the calibration stays; without one, the default is named.
    pytester.runpytest("--gpuopt-save=main").assert_outcomes(passed=1)
    assert baseline_file(pytester)["environments"][0]["calibration"] == entry["calibration"]
    pytester.runpytest("--gpuopt-save=other").assert_outcomes(passed=1)
    pytester.runpytest("--gpuopt-compare=other").stdout.fnmatch_lines([
        "cross-run comparison: widened by run-to-run spread ±5.0% (a default, no A/A calibration of this "
        "environment); save the baseline with --gpuopt-calibrate=5 to measure it"])


# ------------------------------------------------------------------------------- gpuopt.testing


def lognormal(seed: int, scale: float = 1.0, sigma: float = 0.02, n: int = 300, **kw) -> Measurement:
    x = scale * np.random.default_rng(seed).lognormal(0.0, sigma, n)
    return Measurement.from_samples(x.tolist(), **kw)


def test_assert_latency():
    m = lognormal(0, label="model")  # median ~1 ms
    assert assert_latency(m, p50_ms=1.2) is m
    with pytest.raises(AssertionError) as info:
        assert_latency(m, p50_ms=0.5, p95_ms=2.0, p99_ms=0.9)
    msg = str(info.value)
    assert msg.startswith("latency above its limit: p50 ") and "> p50_ms=500 us" in msg and "p99_ms=900 us" in msg
    assert "p95_ms" not in msg.splitlines()[0]
    assert "model: median " in msg and "95% CI" in msg and environment_line() in msg


def test_assert_throughput():
    m = lognormal(1, scale=2.0)  # ~2 ms per call
    assert assert_throughput(m, min_per_s=10_000, items_per_call=32) == pytest.approx(16_000, rel=0.02)
    with pytest.raises(AssertionError, match=r"throughput 1.6\d*e\+04/s \[95% CI .* below min_per_s=20000/s "
                                             r"\(32 items per call\)"):
        assert_throughput(m, min_per_s=20_000, items_per_call=32)


def test_assert_faster_needs_the_speedup_and_significance():
    slow, fast = lognormal(2, scale=2.0), lognormal(3)
    c = assert_faster(slow, fast, min_speedup=1.8)
    assert c.verdict == "faster" and c.speedup == pytest.approx(2.0, rel=0.02)
    with pytest.raises(AssertionError, match=r"not 2.5x faster .* speedup [12]\.\d+x is below min_speedup 2.5x"):
        assert_faster(slow, fast, min_speedup=2.5)
    same = lognormal(4)
    with pytest.raises(AssertionError, match="verdict is 'no significant difference', not 'faster'") as info:
        assert_faster(lognormal(5), same, min_speedup=1.0)
    assert "(separate measurements)" in str(info.value) and "baseline:  median" in str(info.value)


def test_untimed_measurements_pass_timing_assertions():
    m = Measurement.from_samples([5.0], stop_reason="disabled")
    assert_latency(m, p50_ms=1e-6)
    assert assert_faster(m, m, min_speedup=10).verdict == "not timed"


def test_assert_parity():
    model = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8)
    assert assert_parity(model, model, x).passed
    with pytest.raises(AssertionError, match=r"(?s)parity FAILED.*output: relative L2 .*env: "):
        assert_parity(lambda t: model(t) + 1.0, model, x)
    assert assert_parity(lambda t: model(t) * 1.001, model, x, rtol=0.01).passed


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda m: assert_latency(m), ValueError, "needs at least one limit: p50_ms, p95_ms or p99_ms"),
        (lambda m: assert_latency(m, p95_ms=0), ValueError, "p95_ms must be a positive number of milliseconds, got 0"),
        (lambda m: assert_latency(m, p99_ms=-1.0), ValueError, "p99_ms must be a positive number"),
        (lambda m: assert_latency(m, p50_ms="1"), TypeError, "p50_ms must be a positive number"),
        (lambda m: assert_latency([1.0], p50_ms=1), TypeError, "m must be a gpuopt.Measurement, got list"),
        (lambda m: assert_throughput(m, min_per_s=0), ValueError, "min_per_s must be a positive number"),
        (lambda m: assert_throughput(m, 10, items_per_call=0), ValueError, "items_per_call must be a positive int"),
        (lambda m: assert_throughput(m, 10, items_per_call=2.5), TypeError, "items_per_call must be a positive int"),
        (lambda m: assert_faster(m, m, min_speedup=0), ValueError, "min_speedup must be a number >= 1"),
        (lambda m: assert_faster(m, m, min_speedup=0.9), ValueError, "min_speedup must be a number >= 1 .*got 0.9"),
        (lambda m: assert_faster(m, m, min_speedup="2"), TypeError, "min_speedup must be a number"),
        (lambda m: assert_faster(m, m, confidence=1.5), ValueError, r"confidence must be in \(0, 1\), got 1.5"),
        (lambda m: assert_faster(m, 3), TypeError, "candidate must be a gpuopt.Measurement or a callable, got int"),
        (lambda m: assert_faster(m, lambda: None), TypeError, "both be Measurements or both be callables"),
        (lambda m: assert_faster(m, m, mode="host"), TypeError, "apply only when comparing two callables"),
        (lambda m: assert_parity(m, m, None, rtol=-1), ValueError, "rtol must be a positive number"),
    ],
)
def test_bad_arguments_name_the_parameter(call, exc, match):
    with pytest.raises(exc, match=match):
        call(lognormal(6, n=20))
