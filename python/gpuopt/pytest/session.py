"""The pytest plugin's state for one session: options, recorded measurements, baseline comparison,
the files written at the end and the terminal summary."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from .. import testing
from .._ext import build_info
from ..timing.calibration import RunToRun
from ..timing.environment import env, git_commit
from ..timing.measurement import Measurement, format_ms
from .baselines import (
    BASELINE_DIR,
    BASELINE_SCHEMA,
    LATEST,
    NAME,
    GpuoptBaselineWarning,
    fingerprint,
    latest_baseline,
    load_baseline,
    write_json,
)
from .regression import CONFIDENCE, Check, parse_thresholds, regression_checks


@dataclass
class _Record:
    key: str
    test: str
    name: str | None
    measurement: Measurement
    status: str | None = None  # against the baseline: "compared", "new", "mode changed"
    checks: list[Check] = field(default_factory=list)

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
        self.sort: str = opt("gpuopt_sort") or "run"
        self.group_by: str = opt("gpuopt_group_by") or "none"
        self.calibrate_rounds: int | None = opt("gpuopt_calibrate")
        self.round_medians: dict[str, list[float]] = {}  # key -> medians of its calibration rounds
        self.run_to_run: RunToRun | None = None  # the compared baseline's calibration
        self.records: list[_Record] = []
        self.failed_tests: set[str] = set()
        self.untimed_calls = 0
        self.notes: list[str] = []
        self.baseline: dict[str, dict[str, Any]] | None = None  # key -> record, this environment's
        self._env: dict[str, Any] | None = None
        self.previous_disabled = False  # gpuopt.testing's flag before this session set it

        for name, value in (("--gpuopt-save", self.save), ("--gpuopt-compare", self.compare)):
            if value is not None and not NAME.fullmatch(value):
                # A bare --gpuopt-compare takes the next word as NAME: `--gpuopt-compare tests/` lands here.
                hint = " (a bare --gpuopt-compare takes the next argument: write --gpuopt-compare=NAME)" if (
                    name == "--gpuopt-compare") else ""
                raise pytest.UsageError(f"{name}: NAME must be letters, digits, '.', '-' or '_' (no path), "
                                        f"got {value!r}{hint}")
        if self.save == LATEST:
            raise pytest.UsageError(f"--gpuopt-save: {LATEST!r} is reserved (--gpuopt-compare={LATEST} means the "
                                    "baseline saved last); choose another NAME")
        if self.sort == "change" and self.compare is None:
            raise pytest.UsageError("--gpuopt-sort=change needs --gpuopt-compare: the baseline to change from")
        self.thresholds: dict[str, float] = {}
        if fail is not None:
            if self.compare is None:
                raise pytest.UsageError("--gpuopt-compare-fail needs --gpuopt-compare=NAME: the baseline "
                                        "to compare with")
            try:
                self.thresholds = parse_thresholds(fail)
            except ValueError as exc:
                raise pytest.UsageError(f"--gpuopt-compare-fail={fail}: {exc}") from None
        if self.calibrate_rounds is not None:
            if self.save is None:
                raise pytest.UsageError("--gpuopt-calibrate needs --gpuopt-save=NAME: the baseline the "
                                        "calibration is saved with")
            if self.calibrate_rounds < 3:
                raise pytest.UsageError(f"--gpuopt-calibrate: ROUNDS must be an integer >= 3, got "
                                        f"{self.calibrate_rounds}")
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
            load_baseline(self.path(self.save), "--gpuopt-save")  # refuse before the run, not after
        if self.compare is not None:
            self._load_comparison()

    def path(self, name: str) -> Path:
        return self.config.rootpath / BASELINE_DIR / f"{name}.json"

    def env(self) -> dict[str, Any]:
        if self._env is None:
            self._env = env()
        return self._env

    def _load_comparison(self) -> None:
        if self.compare == LATEST:
            name = latest_baseline(self.path(LATEST).parent, fingerprint(self.env()))
            if name is None:
                raise pytest.UsageError(f"--gpuopt-compare: no baseline saved yet in {self.path(LATEST).parent}; "
                                        "save one first with --gpuopt-save=NAME")
            self.compare = name
        path = self.path(self.compare)
        if not path.exists():
            saved = sorted(p.stem for p in path.parent.glob("*.json")) if path.parent.is_dir() else []
            have = f"saved baselines: {', '.join(saved)}" if saved else "none saved yet (--gpuopt-save=NAME)"
            raise pytest.UsageError(f"--gpuopt-compare={self.compare}: no baseline file {path}; {have}")
        data = load_baseline(path, "--gpuopt-compare")
        here = fingerprint(self.env())
        for entry in data["environments"]:
            if entry["fingerprint"] == here:
                self.baseline = entry["measurements"]
                saved = ", ".join(f"{k} {entry[k]}" for k in ("commit", "saved_at") if entry.get(k))
                self.notes.append(f"compared with baseline {self.compare!r}" + (f" ({saved})" if saved else ""))
                if entry.get("calibration"):
                    self.run_to_run = RunToRun.from_dict(entry["calibration"])
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
        rec.checks = regression_checks(base, cur, self.thresholds, self.run_to_run)

    def passed_records(self) -> list[_Record]:
        return [r for r in self.records if r.test not in self.failed_tests]

    # ---- end of session

    def write_files(self) -> None:
        if self.save is not None:
            self._save()
        if self.json_path is not None:
            path = self.config.invocation_params.dir / self.json_path
            e = self.env()
            write_json(path, {
                "schema_version": BASELINE_SCHEMA,
                "env": e,
                "build": build_info(),
                "fingerprint": fingerprint(e),
                "commit": git_commit(self.config.rootpath),
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
        data = load_baseline(path, "--gpuopt-save") if path.exists() else {"environments": []}
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
        entry.update(env=e, measurements=measurements, commit=git_commit(self.config.rootpath),
                     saved_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
        rounds = [self.round_medians[r.key] for r in keep if r.key in self.round_medians]
        if rounds:  # a new calibration replaces the environment's old one; without one it is kept
            entry["calibration"] = RunToRun.from_round_medians(rounds).to_dict()
        for x in data["environments"]:
            x["measurements"] = {k: {**v, "measurement": v["measurement"].to_dict()}
                                 for k, v in x["measurements"].items()}
        data["schema_version"] = BASELINE_SCHEMA
        data["name"] = self.save
        write_json(path, data)
        skipped = len(self.records) - len(keep)
        why = f"; {skipped} from failed tests not saved" if skipped else ""
        self.notes.append(f"saved {len(keep)} measurement(s) as baseline {self.save!r} in {path}{why}")
        if rounds:
            self.notes.append(f"run-to-run spread saved with it: {RunToRun.from_dict(entry['calibration']).describe()}")

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
            band = self.run_to_run or RunToRun.default(self.records[0].measurement if self.records else None)
            how = "" if self.run_to_run else "; save the baseline with --gpuopt-calibrate=5 to measure it"
            tr.write_line(f"cross-run comparison: widened by run-to-run spread {band.describe()}{how}")
            failed = [r.key for r in self.records if any(c.failed for c in r.checks)]
            if failed:
                tr.write_line(f"regressed beyond --gpuopt-compare-fail: {', '.join(failed)}", red=True)
        for note in self.notes:
            tr.write_line(note, yellow="different environment" in note)

    def _table(self, tr: Any) -> None:
        head = ["test", "mode", "median", "p95", f"median {CONFIDENCE:.0%} CI", "n"]
        if self.baseline is not None:
            head.append(f"vs {self.compare}")
        groups: dict[str, list[list[str]]] = {}
        for r in self._sorted():
            m = r.measurement
            row = [r.key, m.mode, format_ms(m.p50), format_ms(m.p95),
                   f"{format_ms(m.ci95[0])} .. {format_ms(m.ci95[1])}", str(m.n)]
            if self.baseline is not None:
                row.append(self._delta(r))
            groups.setdefault(_group_of(r, self.group_by), []).append(row)
        widths = [max(len(x) for x in col) for col in zip(head, *(row for rows in groups.values() for row in rows))]
        for title, rows in groups.items():
            if self.group_by != "none":
                tr.write_line(f"{self.group_by} {title}:", bold=True)
            for i, row in enumerate([head, *rows]):
                line = "  ".join(x.rjust(w) if 2 <= j <= 5 else x.ljust(w)  # numbers right-aligned
                                 for j, (x, w) in enumerate(zip(row, widths)))
                tr.write_line(line.rstrip(), bold=i == 0)

    def _sorted(self) -> list[_Record]:
        """The records in --gpuopt-sort order (stable: ties keep the order measured)."""
        if self.sort == "run":
            return list(self.records)
        if self.sort == "name":
            return sorted(self.records, key=lambda r: r.key)
        if self.sort == "change":  # largest slowdown first; records not compared last
            return sorted(self.records, key=lambda r: -r.checks[0].change if r.checks else float("inf"))
        stat = {"median": lambda m: m.p50, "p95": lambda m: m.p95, "n": lambda m: m.n}[self.sort]
        return sorted(self.records, key=lambda r: stat(r.measurement))

    @staticmethod
    def _delta(r: _Record) -> str:
        if r.status != "compared":
            return r.status or ""
        med = r.checks[0]
        word = med.verdict if med.verdict in ("faster", "slower") else "~"
        failed = [c.stat for c in r.checks if c.failed]
        return (f"{med.change:+.1%} [{med.ci[0]:+.1%} .. {med.ci[1]:+.1%}] {word}"
                + (f" FAILED {','.join(failed)}" if failed else ""))


def _group_of(r: _Record, by: str) -> str:
    """The --gpuopt-group-by title of a record: ``test_a.py::test_x[fp16-8]#warm`` is module
    ``test_a.py``, test ``test_a.py::test_x``, param ``[fp16-8]``, name ``warm``."""
    test, bracket, params = r.test.partition("[")
    return {
        "none": "",
        "module": r.test.split("::", 1)[0],
        "test": test,
        "param": f"[{params}" if bracket else "(no parameters)",
        "name": r.name or "(unnamed)",
        "mode": r.measurement.mode,
    }[by]


STATE = pytest.StashKey[_Session]()
REGRESSIONS = pytest.StashKey[list[str]]()  # a test's regression messages, set by Bench.record
