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

import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from . import testing
from ._ext import _C, build_info
from .config import Config
from .env import env
from .timing import Measurement, format_ms, measure

BASELINE_SCHEMA = 1
BASELINE_DIR = Path(".gpuopt") / "baselines"
CONFIDENCE = 0.95
RESAMPLES = 2000
# --gpuopt-compare-fail statistics -> the quantile bootstrapped (mean: the median's bootstrap).
STATISTICS = {"median": 0.5, "p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99, "mean": None}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_PERCENT = re.compile(r"(\d+(?:\.\d*)?|\.\d+)%")


class GpuoptBaselineWarning(pytest.PytestWarning):
    """A baseline could not be used (saved on another environment)."""


# ---------------------------------------------------------------------------------------- options


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
    group.addoption("--gpuopt-json", metavar="PATH",
                    help="write all measurements, the environment and its fingerprint to PATH")
    group.addoption("--gpuopt-disable", action="store_true", default=False,
                    help="run benchmark bodies once without timing; timing assertions pass unchecked")


def parse_thresholds(text: str) -> dict[str, float]:
    """``"median:10%,p95:15%"`` -> ``{"median": 0.10, "p95": 0.15}`` (p50 is the median); ValueError
    naming the entry and what is allowed otherwise."""
    out: dict[str, float] = {}
    for entry in (e.strip() for e in text.split(",")):
        stat, sep, value = (s.strip() for s in entry.partition(":"))
        if not sep:
            raise ValueError(f"entry {entry!r} must look like STAT:PERCENT%, e.g. median:10%")
        if stat.lower() not in STATISTICS:
            raise ValueError(f"unknown statistic {stat!r} in {entry!r}; allowed: {', '.join(STATISTICS)}")
        key = "median" if stat.lower() == "p50" else stat.lower()
        if key in out:
            raise ValueError(f"{entry!r} sets {key} a second time (p50 is the median)")
        m = _PERCENT.fullmatch(value)
        if m is None:
            raise ValueError(f"malformed percentage {value!r} for {stat}: write a number >= 0 followed by %, "
                             "e.g. 10%")
        out[key] = float(m.group(1)) / 100.0
    return out


def fingerprint(e: dict[str, Any]) -> dict[str, Any]:
    """What must match for two timings to be comparable: GPU model, driver major version, torch and
    its CUDA version (and the CPU model when there is no GPU); from :func:`gpuopt.env`."""
    gpu = None
    if e["gpus"]:
        index = torch.cuda.current_device()
        gpu = (e["gpus"][index] if index < len(e["gpus"]) else e["gpus"][0])["name"]
    fp = {
        "gpu": gpu,
        "driver_major": e["driver"].split(".")[0] if e["driver"] else None,
        "torch": e["torch"],
        "torch_cuda": e["torch_cuda"],
    }
    if gpu is None:
        fp["cpu"] = e["cpu"]
    return fp


def _atomic_write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _load_baseline(path: Path, option: str) -> dict[str, Any]:
    """A baseline file, checked; UsageError naming the option and the problem otherwise."""
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or not isinstance(data.get("environments"), list):
            raise ValueError("no 'environments' list")
        if data.get("schema_version", BASELINE_SCHEMA) > BASELINE_SCHEMA:
            raise ValueError(f"schema_version {data['schema_version']} is newer than this gpuopt understands "
                             f"({BASELINE_SCHEMA}); upgrade gpuopt")
        for entry in data["environments"]:
            if not isinstance(entry.get("fingerprint"), dict) or not isinstance(entry.get("measurements"), dict):
                raise ValueError("an environment lacks 'fingerprint' or 'measurements'")
            for key, rec in entry["measurements"].items():
                if not isinstance(rec.get("test"), str):
                    raise ValueError(f"measurement {key!r} lacks 'test'")
                rec["measurement"] = Measurement.from_dict(rec["measurement"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise pytest.UsageError(f"{option}: baseline file {path} is unreadable or corrupt ({exc}); "
                                "delete it and save it again with --gpuopt-save") from None
    return data


# ---------------------------------------------------------------------------------------- state


@dataclass
class _Check:
    """One statistic of a measurement against its baseline; change > 0 means slower."""

    stat: str
    baseline_ms: float
    current_ms: float
    change: float
    ci: tuple[float, float] | None  # of the change; None for the mean (its significance is the median's)
    significant: bool  # slower with the bootstrap's confidence
    limit: float | None = None

    @property
    def failed(self) -> bool:
        return self.limit is not None and self.significant and self.change > self.limit

    def describe(self) -> str:
        ci = f" [{CONFIDENCE:.0%} CI {self.ci[0]:+.1%} .. {self.ci[1]:+.1%}]" if self.ci else ""
        limit = "" if self.limit is None else f", limit {self.limit:.0%}"
        return (f"{self.stat} {self.change:+.1%}{ci}{limit}: {format_ms(self.baseline_ms)} -> "
                f"{format_ms(self.current_ms)}")

    def to_dict(self) -> dict[str, Any]:
        return {"stat": self.stat, "baseline_ms": self.baseline_ms, "current_ms": self.current_ms,
                "change": self.change, "ci": list(self.ci) if self.ci else None,
                "significant": self.significant, "limit": self.limit, "failed": self.failed}


@dataclass
class _Record:
    key: str
    test: str
    name: str | None
    measurement: Measurement
    status: str | None = None  # against the baseline: "compared", "new", "mode changed"
    checks: list[_Check] = field(default_factory=list)

    def to_dict(self, outcome: str) -> dict[str, Any]:
        return {"key": self.key, "test": self.test, "name": self.name, "outcome": outcome,
                "measurement": self.measurement.to_dict(),
                "baseline": None if self.status is None else {
                    "status": self.status, "checks": [c.to_dict() for c in self.checks]}}


class _Session:
    """The plugin's state for one pytest config (inner pytester sessions get their own)."""

    def __init__(self, config: pytest.Config):
        self.config = config
        opt = config.getoption
        self.disabled: bool = opt("gpuopt_disable")
        self.save: str | None = opt("gpuopt_save")
        self.compare: str | None = opt("gpuopt_compare")
        self.json_path: str | None = opt("gpuopt_json")
        fail: str | None = opt("gpuopt_compare_fail")
        self.records: list[_Record] = []
        self.failed_tests: set[str] = set()
        self.untimed_calls = 0
        self.notes: list[str] = []
        self.baseline: dict[str, dict[str, Any]] | None = None  # key -> record, this environment's
        self._env: dict[str, Any] | None = None
        self.previous_disabled = False  # gpuopt.testing's flag before this session set it

        for name, value in (("--gpuopt-save", self.save), ("--gpuopt-compare", self.compare)):
            if value is not None and not _NAME.fullmatch(value):
                raise pytest.UsageError(f"{name}: NAME must be letters, digits, '.', '-' or '_' (no path), "
                                        f"got {value!r}")
        self.thresholds: dict[str, float] = {}
        if fail is not None:
            if self.compare is None:
                raise pytest.UsageError("--gpuopt-compare-fail needs --gpuopt-compare=NAME: the baseline "
                                        "to compare with")
            try:
                self.thresholds = parse_thresholds(fail)
            except ValueError as exc:
                raise pytest.UsageError(f"--gpuopt-compare-fail={fail}: {exc}") from None
        used = [o for o, v in (("--gpuopt-save", self.save), ("--gpuopt-compare", self.compare),
                               ("--gpuopt-json", self.json_path)) if v is not None]
        if self.disabled and used:
            raise pytest.UsageError(f"--gpuopt-disable times nothing, so {' and '.join(used)} would have "
                                    "nothing to use; drop one or the other")
        if used and config.getoption("numprocesses", None):
            # Each xdist worker records its own tests (none reach this process), and workers timing
            # side by side disturb one another.
            raise pytest.UsageError(f"{' and '.join(used)} cannot run under pytest-xdist (-n): run "
                                    "performance tests in one process")
        if self.save is not None and self.path(self.save).exists():
            _load_baseline(self.path(self.save), "--gpuopt-save")  # refuse before the run, not after
        if self.compare is not None:
            self._load_comparison()

    def path(self, name: str) -> Path:
        return self.config.rootpath / BASELINE_DIR / f"{name}.json"

    def env(self) -> dict[str, Any]:
        if self._env is None:
            self._env = env()
        return self._env

    def _load_comparison(self) -> None:
        path = self.path(self.compare)
        if not path.exists():
            saved = sorted(p.stem for p in path.parent.glob("*.json")) if path.parent.is_dir() else []
            have = f"saved baselines: {', '.join(saved)}" if saved else "none saved yet (--gpuopt-save=NAME)"
            raise pytest.UsageError(f"--gpuopt-compare={self.compare}: no baseline file {path}; {have}")
        data = _load_baseline(path, "--gpuopt-compare")
        here = fingerprint(self.env())
        for entry in data["environments"]:
            if entry["fingerprint"] == here:
                self.baseline = entry["measurements"]
                return
        if data["environments"]:
            there = data["environments"][0]["fingerprint"]
            diff = "; ".join(f"{k}: baseline {there.get(k)!r}, here {here.get(k)!r}"
                             for k in sorted(set(there) | set(here)) if there.get(k) != here.get(k))
        else:
            diff = "the file holds no environment"
        msg = (f"baseline {self.compare!r} was saved on a different environment ({diff}); "
               "comparison skipped")
        self.notes.append(msg)
        self.config.issue_config_time_warning(GpuoptBaselineWarning(msg), stacklevel=2)

    # ---- recording

    def record(self, test: str, key: str, name: str | None, m: Measurement) -> _Record:
        rec = _Record(key, test, name, m)
        if self.baseline is not None:
            self._compare(rec)
        self.records.append(rec)
        return rec

    def _compare(self, rec: _Record) -> None:
        old = self.baseline.get(rec.key)
        if old is None:
            rec.status = "new"
            return
        base, cur = old["measurement"], rec.measurement
        if base.mode != cur.mode:
            rec.status = f"mode changed ({base.mode} -> {cur.mode})"
            return
        rec.status = "compared"
        _, _, med_hi = _C.bootstrap_speedup(base.samples_ms, cur.samples_ms, CONFIDENCE, RESAMPLES, q=0.5)
        for stat in dict.fromkeys(["median", *self.thresholds]):
            q = STATISTICS[stat]
            if q is None:
                b, c = base.mean, cur.mean
                change, ci, significant = c / b - 1.0, None, med_hi < 1.0
            else:
                ratio, lo, hi = _C.bootstrap_speedup(base.samples_ms, cur.samples_ms, CONFIDENCE, RESAMPLES,
                                                     q=q)
                b = _C.quantile(base.samples_ms, q)
                c = _C.quantile(cur.samples_ms, q)
                change, ci, significant = 1.0 / ratio - 1.0, (1.0 / hi - 1.0, 1.0 / lo - 1.0), hi < 1.0
            rec.checks.append(_Check(stat, b, c, change, ci, significant, self.thresholds.get(stat)))

    def passed_records(self) -> list[_Record]:
        return [r for r in self.records if r.test not in self.failed_tests]

    # ---- end of session

    def write_files(self) -> None:
        if self.save is not None:
            self._save()
        if self.json_path is not None:
            path = self.config.invocation_params.dir / self.json_path
            e = self.env()
            _atomic_write_json(path, {
                "schema_version": BASELINE_SCHEMA,
                "env": e,
                "build": build_info(),
                "fingerprint": fingerprint(e),
                "baseline": self.compare,
                "notes": list(self.notes),
                "measurements": [r.to_dict("failed" if r.test in self.failed_tests else "passed")
                                 for r in self.records],
            })
            self.notes.append(f"wrote {len(self.records)} measurement(s) to {path}")

    def _save(self) -> None:
        keep = self.passed_records()
        if not keep:
            self.notes.append(f"baseline {self.save!r} not saved: no measurement of a passing test")
            return
        path = self.path(self.save)
        data = _load_baseline(path, "--gpuopt-save") if path.exists() else {"environments": []}
        e = self.env()
        here = fingerprint(e)
        entry = next((x for x in data["environments"] if x["fingerprint"] == here), None)
        if entry is None:
            entry = {"fingerprint": here, "measurements": {}}
            data["environments"].append(entry)
        ran = {r.test for r in keep}  # a test that passed replaces all its entries; others are kept
        measurements = {k: v for k, v in entry["measurements"].items() if v["test"] not in ran}
        measurements.update({r.key: {"test": r.test, "name": r.name, "measurement": r.measurement}
                             for r in keep})
        entry.update(env=e, measurements=measurements)
        for x in data["environments"]:
            x["measurements"] = {k: {**v, "measurement": v["measurement"].to_dict()}
                                 for k, v in x["measurements"].items()}
        data["schema_version"] = BASELINE_SCHEMA
        data["name"] = self.save
        _atomic_write_json(path, data)
        skipped = len(self.records) - len(keep)
        why = f"; {skipped} from failed tests not saved" if skipped else ""
        self.notes.append(f"saved {len(keep)} measurement(s) as baseline {self.save!r} in {path}{why}")

    def summary(self, tr: Any) -> None:
        if not (self.records or self.untimed_calls or self.notes or self.compare or self.save):
            return
        tr.write_sep("=", "gpuopt")
        if self.disabled:
            tr.write_line(f"timing disabled (--gpuopt-disable): {self.untimed_calls} benchmark call(s) ran once, "
                          "untimed")
        if self.records:
            self._table(tr)
            device = next((r.measurement.device_name for r in self.records if r.measurement.device_name), None)
            tr.write_line(testing.environment_line(device))
        if self.baseline is not None:
            seen = {r.key for r in self.records}
            new = [r.key for r in self.records if r.status == "new"]
            gone = [k for k in self.baseline if k not in seen]
            if new:
                tr.write_line(f"no baseline in {self.compare!r} for: {', '.join(new)}")
            if gone:
                tr.write_line(f"in baseline {self.compare!r} but not measured in this run (removed, renamed "
                              f"or not selected): {', '.join(gone)}")
            failed = [r.key for r in self.records if any(c.failed for c in r.checks)]
            if failed:
                tr.write_line(f"regressed beyond --gpuopt-compare-fail: {', '.join(failed)}", red=True)
        for note in self.notes:
            tr.write_line(note, yellow="different environment" in note)

    def _table(self, tr: Any) -> None:
        head = ["test", "mode", "median", "p95", f"median {CONFIDENCE:.0%} CI", "n"]
        if self.baseline is not None:
            head.append(f"vs {self.compare}")
        rows = []
        for r in self.records:
            m = r.measurement
            row = [r.key, m.mode, format_ms(m.p50), format_ms(m.p95),
                   f"{format_ms(m.ci95[0])} .. {format_ms(m.ci95[1])}", str(m.n)]
            if self.baseline is not None:
                row.append(self._delta(r))
            rows.append(row)
        widths = [max(len(x) for x in col) for col in zip(head, *rows)]
        for i, row in enumerate([head, *rows]):
            line = "  ".join(x.rjust(w) if 2 <= j <= 5 else x.ljust(w)  # numbers right-aligned
                             for j, (x, w) in enumerate(zip(row, widths)))
            tr.write_line(line.rstrip(), bold=i == 0)

    @staticmethod
    def _delta(r: _Record) -> str:
        if r.status != "compared":
            return r.status or ""
        med = r.checks[0]
        word = "slower" if med.significant else ("faster" if med.ci[1] < 0 else "~")
        failed = [c.stat for c in r.checks if c.failed]
        return (f"{med.change:+.1%} [{med.ci[0]:+.1%} .. {med.ci[1]:+.1%}] {word}"
                + (f" FAILED {','.join(failed)}" if failed else ""))


_STATE = pytest.StashKey[_Session]()


# ---------------------------------------------------------------------------------------- hooks


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device (gpuopt skips it with a reason when none "
                                       "is usable; GPUOPT_REQUIRE_GPU=1 makes that an error)")
    config.addinivalue_line("markers", "gpuopt(**measure_options): default gpuopt.measure options for the "
                                       "gpuopt_bench fixture in this test")
    state = _Session(config)
    config.stash[_STATE] = state
    state.previous_disabled = testing._set_timing_disabled(state.disabled)


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(_STATE, None)
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


_REGRESSIONS = pytest.StashKey[list[str]]()  # a test's regression messages, set by Bench.record


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call":
        return
    regressions = item.stash.get(_REGRESSIONS, [])
    if regressions and report.passed:
        # Failed after the body ran, so every measurement of the test is taken and reported.
        report.outcome = "failed"
        report.longrepr = "\n".join(regressions)
    if report.failed:  # its measurements are not saved as a baseline
        item.config.stash[_STATE].failed_tests.add(item.nodeid)


def pytest_sessionfinish(session: pytest.Session) -> None:
    session.config.stash[_STATE].write_files()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    config.stash[_STATE].summary(terminalreporter)


# ---------------------------------------------------------------------------------------- fixture


class Bench:
    """What the ``gpuopt_bench`` fixture gives a test: call it to measure, ``record`` to add a
    Measurement taken otherwise (e.g. by :func:`gpuopt.testing.assert_faster`) to the report."""

    def __init__(self, item: pytest.Item, state: _Session):
        self._item = item
        self._state = state
        self._index = 0
        self._keys: set[str] = set()

    @property
    def options(self) -> dict[str, Any]:
        """The test's ``gpuopt(...)`` marker options, nearest marker winning."""
        merged: dict[str, Any] = {}
        for mark in reversed(list(self._item.iter_markers("gpuopt"))):
            if mark.args:
                raise TypeError(f"@pytest.mark.gpuopt takes measure options as keywords only, got positional "
                                f"{mark.args!r}")
            merged.update(mark.kwargs)
        return merged

    def __call__(self, target: Any, config: Config | str | None = None, inputs: Any = None, *,
                 name: str | None = None, **measure_options: Any) -> Measurement:
        """``bench(fn, **measure_options)`` times a callable; ``bench(model, config, inputs,
        **measure_options)`` prepares ``model`` under ``config`` (a :class:`~gpuopt.Config` or a
        string for :meth:`~gpuopt.Config.parse`) and times it on ``inputs``. ``name`` keys the
        measurement in the report and baselines (default: the test id, then ``#1``, ``#2``...)."""
        __tracebackhide__ = True
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a string, got {type(name).__name__}")
        if name == "":
            raise ValueError("name must be a non-empty string")
        options = {**self.options, **measure_options}
        label = options.pop("label", None) or name
        if config is not None:
            if not isinstance(target, torch.nn.Module):
                raise TypeError(f"gpuopt_bench(model, config, inputs): model must be a torch.nn.Module, "
                                f"got {type(target).__name__}")
            if inputs is None:
                raise TypeError("gpuopt_bench(model, config, inputs): inputs are required with a config")
            if "inputs" in options:
                raise TypeError("gpuopt_bench(model, config, inputs): inputs are given positionally; drop "
                                "the inputs= measure option")
            if not isinstance(config, (Config, str)):
                raise TypeError(f"config must be a gpuopt.Config or a string like 'fp16-amp+channels_last', "
                                f"got {type(config).__name__}")
            cfg = Config.parse(config)
            prepared = cfg.apply(target, inputs, device=options.get("device"))
            if not prepared.ok:
                pytest.fail(f"gpuopt_bench: config {cfg.label} could not be prepared: {prepared.error}",
                            pytrace=False)
            fn, label = prepared.runner(inputs), label or cfg.label
        else:
            if inputs is not None:
                raise TypeError("gpuopt_bench(fn, ...): positional inputs go with a model and a config; "
                                "for a callable pass inputs=[...] as a measure option")
            if not callable(target):
                raise TypeError(f"gpuopt_bench(fn): fn must be callable, got {type(target).__name__}")
            fn = target
        if self._state.disabled:
            self._state.untimed_calls += 1
            return testing._run_once(fn, options.get("inputs"), label)
        return self.record(measure(fn, label=label, **options), name=name)

    def record(self, m: Measurement, *, name: str | None = None) -> Measurement:
        """Add ``m`` to the session's report (and baseline comparison); returns ``m``.

        >>> c = assert_faster(fp32_fn, fp16_fn, min_speedup=1.8)      # doctest: +SKIP
        >>> gpuopt_bench.record(c.candidate_measurement, name="fp16")  # doctest: +SKIP
        """
        __tracebackhide__ = True
        if not isinstance(m, Measurement):
            raise TypeError(f"record needs a gpuopt.Measurement, got {type(m).__name__}")
        if testing.untimed(m):
            return m
        test = self._item.nodeid
        if name is None:
            key = test if self._index == 0 else f"{test}#{self._index}"
            self._index += 1
        else:
            key = f"{test}#{name}"
        if key in self._keys:
            raise ValueError(f"measurement key {key!r} is already used in this test; pass another name=")
        self._keys.add(key)
        rec = self._state.record(test, key, name, m)
        failed = [c for c in rec.checks if c.failed]
        if failed:
            self._item.stash.setdefault(_REGRESSIONS, []).append("\n".join([
                f"gpuopt: {rec.key} regressed against baseline {self._state.compare!r} (beyond the "
                "threshold and significant):",
                *(f"  {c.describe()}" for c in failed),
                f"  {testing.environment_line(m.device_name)}",
            ]))
        return m


@pytest.fixture
def gpuopt_bench(request: pytest.FixtureRequest) -> Bench:
    """Measure with gpuopt and record the result for the session's report and baselines.

    ``gpuopt_bench(fn, **measure_options)`` or ``gpuopt_bench(model, config, inputs,
    **measure_options)``; ``name=`` keys a measurement when a test takes several. Options from
    ``@pytest.mark.gpuopt(...)`` apply first, the call's own override them.

    >>> @pytest.mark.gpuopt(max_time_s=2)                       # doctest: +SKIP
    ... def test_resnet_fp16(gpuopt_bench):
    ...     m = gpuopt_bench(model, "fp16-amp+channels_last", x)
    ...     assert_latency(m, p95_ms=5)
    """
    return Bench(request.node, request.config.stash[_STATE])
