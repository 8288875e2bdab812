"""Sweeps: models x configs x batch sizes x modes from a spec (TOML, YAML, JSON or a dict), every
finished cell appended to ``cells.jsonl`` at once -- a crash or Ctrl-C loses no finished cell, and
``resume=True`` skips the cells already there when they were measured the same way (the folder's
fingerprint), so two different sweeps never mix."""

from __future__ import annotations

import functools
import importlib.util
import itertools
import json
import os
import sys
import time
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .._files import check_writable, write_atomic
from ..prepare.config import Config
from ..report.results import SCHEMA_VERSION, Key, Results, Row, read_cells
from ..timing.measurement import measure_defaults
from . import zoo
from .runner import ProgressBar, Runner
from .workload import (
    check_input_shape,
    check_measure_options,
    resolve_batch_sizes,
    resolve_configs,
    resolve_device,
    resolve_modes,
    workload,
)

SPEC_KEYS = {
    "name": "a title for the sweep",
    "models": "zoo names, or tables {name, input_shape}",
    "configs": "a preset name or a list of config strings",
    "batch_sizes": "a list of positive integers",
    "modes": "a list of modes (latency, throughput, graph, host, end-to-end)",
    "parity": "check parity against fp32 before timing (default true)",
    "train": "also time training steps (default false)",
    "device": "cuda, cuda:1 or cpu (default: cuda when available)",
    "measure": "options for gpuopt.measure, e.g. {max_time_s = 2}",
}
MODEL_KEYS = {"name", "input_shape", "batch_sizes"}


@dataclass
class SectionCell:
    """A cell of a spec section that an engine above this layer runs (``serve:``, registered by
    gpuopt.serving): the key of its row, what the sweep's fingerprint records of it, and ``run``, which
    returns its row; an exception there becomes :meth:`failed`'s row and the sweep goes on."""

    key: Key
    fingerprint: dict[str, Any]
    run: Callable[[], Row]
    facts: dict[str, Any] = field(default_factory=dict)  # of its failed row: item_unit, precision, device

    def failed(self, reason: str) -> Row:
        model, config, batch_size, mode = self.key
        return Row.failed(reason, model=model, config=config, batch_size=batch_size, mode=mode, **self.facts)


@dataclass(frozen=True)
class Section:
    """A spec key whose value an engine turns into cells: ``plan(value, device)`` returns them, or raises
    ValueError / TypeError naming the bad entry, before anything runs."""

    help: str
    plan: Callable[[Any, torch.device], list[SectionCell]]


# Sections of engines above ``run`` (it cannot import them): each registers itself when imported, and
# ``import gpuopt`` imports them all.
SECTIONS: dict[str, Section] = {}

# How a sweep runs over several devices: gpuopt.dist registers resolve(devices, plan, call), which validates
# ``devices`` (ValueError / TypeError naming it) and returns what runs the plan.
_Resolve = Callable[[Any, "SweepPlan", dict[str, Any]], Callable[["SweepPlan"], Results]]
_DISTRIBUTED: list[_Resolve] = []


def register_distributed(resolve: _Resolve) -> None:
    """Let ``devices=`` of :func:`sweep` run through ``resolve`` (called by :mod:`gpuopt.dist`)."""
    _DISTRIBUTED[:] = [resolve]


def register_section(name: str, section: Section) -> None:
    """Make ``name`` a sweep spec key run by ``section``."""
    if name in SPEC_KEYS:
        raise ValueError(f"{name!r} is a sweep spec key of its own")
    SECTIONS[name] = section


def load_spec(spec: str | os.PathLike | dict) -> dict[str, Any]:
    """The spec as a dict, from a TOML / YAML / JSON file or a dict; ValueError naming an unknown key."""
    if isinstance(spec, dict):
        doc = dict(spec)
    else:
        path = Path(spec)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ValueError(f"cannot read sweep spec {str(path)!r}: {exc.strerror or exc}") from exc
        if path.suffix == ".toml":
            try:
                import tomllib
            except ImportError:  # Python < 3.11
                import tomli as tomllib
            try:
                doc = tomllib.loads(text)
            except tomllib.TOMLDecodeError as exc:
                raise ValueError(f"{path}: invalid TOML: {exc}") from exc
        elif path.suffix in (".yaml", ".yml"):
            try:
                import yaml
            except ImportError as exc:
                raise ImportError("YAML sweep specs need pyyaml: pip install pyyaml (or use TOML)") from exc
            try:
                doc = yaml.safe_load(text)
            except yaml.YAMLError as exc:
                raise ValueError(f"{path}: invalid YAML: {exc}") from exc
        elif path.suffix == ".json":
            try:
                doc = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}: invalid JSON: {exc.msg}") from exc
        else:
            raise ValueError(f"sweep spec {str(path)!r} must end in .toml, .yaml, .yml or .json")
    keys = {**SPEC_KEYS, **{name: section.help for name, section in SECTIONS.items()}}
    if not isinstance(doc, dict):
        raise ValueError(f"a sweep spec is a table of keys ({', '.join(keys)}), got {type(doc).__name__}")
    unknown = sorted(set(doc) - set(keys))
    if unknown:
        allowed = "; ".join(f"{k}: {v}" for k, v in keys.items())
        raise ValueError(f"unknown sweep spec key(s) {', '.join(map(repr, unknown))}; allowed keys -- {allowed}")
    if isinstance(doc.get("models"), (str, dict)):
        doc["models"] = [doc["models"]]  # `models: tiny-cnn` means one model, not the letters of its name
    if not doc.get("models"):
        if any(doc.get(name) for name in SECTIONS):
            doc["models"] = []  # a sweep of serving cells alone
        else:
            raise ValueError("a sweep spec needs models = [...] (zoo names, see gpuopt.zoo.names())")
    if not isinstance(doc["models"], list):
        raise ValueError(f"models must be a list of zoo names or tables, got {doc['models']!r}")
    for m in doc["models"]:
        if isinstance(m, dict):
            bad = sorted(set(m) - MODEL_KEYS)
            if bad or "name" not in m:
                raise ValueError(f"a model table takes keys {sorted(MODEL_KEYS)} (name required), got {m!r}")
        elif not isinstance(m, str):
            raise ValueError(f"models must be zoo names or tables, got {m!r}")
    return doc


@dataclass
class SweepModel:
    """One model of a sweep: a zoo name, its item shape if the spec overrides it, its batch sizes."""

    name: str
    input_shape: tuple[int, ...] | None
    batch_sizes: list[int]


@dataclass
class SweepPlan:
    """A validated sweep that has not run yet; :meth:`run` runs it."""

    spec: dict[str, Any]
    output_dir: Path
    models: list[SweepModel]
    configs: list[Config]
    modes: list[str]
    device: torch.device
    parity: bool
    measure_options: dict[str, Any]
    fingerprint: dict[str, Any]  # what makes cells comparable: resume only into a folder with the same one
    done: dict[Key, Row] | None  # the cells already in cells.jsonl to resume from; None: start over
    progress: bool
    results: Results | None = None  # the rows so far, once run() started (also after an interrupt)
    section_cells: list[SectionCell] = field(default_factory=list)  # serve: and other engines' cells
    # With devices=: what gpuopt.dist resolved them to, which runs the plan's cells over ranks.
    distributed: Callable[[SweepPlan], Results] | None = None

    @property
    def total_cells(self) -> int:
        return (sum(len(m.batch_sizes) for m in self.models) * len(self.configs) * len(self.modes)
                + len(self.section_cells))

    @property
    def resume_note(self) -> str | None:
        """"resumed: 12 of 40 cells already measured" when the folder holds cells of this sweep."""
        if not self.done:
            return None
        return (f"resumed: {len(self.done)} of {self.total_cells} cells already measured "
                f"(in {self.output_dir / 'cells.jsonl'})")

    def run(self) -> Results:
        """Every cell not already in ``cells.jsonl`` (with ``resume``), each appended there as it
        finishes; a failing cell or batch size is recorded with its reason and the sweep goes on. The
        results are saved to ``output_dir`` also when the sweep is interrupted. Without ``resume``, an
        earlier sweep's files are moved to ``output_dir/previous-<time>/`` first, never deleted."""
        if self.distributed is not None:
            return self.distributed(self)
        out = self.output_dir
        cells_path = out / "cells.jsonl"
        done = self.done or {}
        if self.done is None:
            moved = move_aside(out)
            if moved is not None and self.progress:
                print(f"the earlier sweep's files were moved to {moved}", file=sys.stderr)
        elif self.progress and self.resume_note:
            print(self.resume_note, file=sys.stderr)
        results = self.results = Results.new(spec=dict(self.spec))
        for row in done.values():
            results.add(row)
        self.write_header(results)
        units = self.units()
        todo = sum(not u.done(done, self.modes) for u in units)
        bar = ProgressBar(todo, self.progress)  # one step per config and batch size (or section cell) to run
        try:
            with CellsFile(cells_path) as cells:

                def record(row: Row) -> None:
                    cells.add(row)
                    results.add(row)

                self.run_units(units, done, record, bar)
        finally:
            bar.close()
            results.save(out)  # also after Ctrl-C: what finished is in the report
        return results

    def write_header(self, results: Results) -> None:
        """``sweep.json``: how the folder's cells were measured (the fingerprint a resume compares) and
        the environment of ``results``."""
        write_atomic(self.output_dir / "sweep.json", json.dumps(
            {"schema_version": SCHEMA_VERSION, "created": results.created, "env": results.env, "build": results.build,
             "spec": self.spec, "fingerprint": self.fingerprint}, indent=1, default=str))

    def units(self) -> list[SweepUnit]:
        """The sweep's work in order: each model's batch sizes, each config at each (all its modes:
        they share the preparation and parity), then the section cells."""
        return ([SweepUnit(m, b, c) for m in self.models for b in m.batch_sizes for c in self.configs]
                + [SweepUnit(section=cell) for cell in self.section_cells])

    def run_units(self, units: list[SweepUnit], done: Container[Key], record: Callable[[Row], None],
                  bar: Callable[[str, str], None]) -> None:
        """Run ``units`` (in their order) but the cells in ``done``, each row handed to ``record``; the
        consecutive units of a model at one batch size share its FP32 reference. A failing cell or batch
        size is recorded with its reason and the sweep goes on."""
        i = 0
        while i < len(units):
            u = units[i]
            if u.section is not None:
                if u.section.key not in done:
                    try:
                        row = u.section.run()
                    except Exception as exc:  # noqa: BLE001  (a failing cell is recorded with its reason)
                        row = u.section.failed(f"{type(exc).__name__}: {exc}")
                    record(row)
                    model, config, batch_size, mode = u.section.key
                    bar("done", f"{model} {config} {mode}" + ("" if row.ok else " (failed)"))
                i += 1
                continue
            run = list(itertools.takewhile(functools.partial(_same_model, u), units[i:]))
            i += len(run)
            if all(v.done(done, self.modes) for v in run):
                continue
            try:
                work = workload(u.model.name, input_shape=u.model.input_shape)
            except Exception as exc:  # noqa: BLE001  (a model that cannot be built fails its cells)
                self._fail_units(run, f"building the model failed: {type(exc).__name__}: {exc}", done, record, bar)
                continue
            runner = Runner(work, self.configs, self.modes, parity=self.parity, device=self.device,
                            measure_options=self.measure_options, on_row=record, skip=done.__contains__,
                            progress=bar)
            if self.results is not None:
                self.results.ceilings = runner.ceilings
            for batch, group in itertools.groupby(run, key=lambda v: v.batch):
                runner.run_batch(batch, [v.config for v in group])
            del runner, work

    def _fail_units(self, units: list[SweepUnit], reason: str, done: Container[Key], record, bar) -> None:
        for u in units:
            for mode in self.modes:
                if (u.model.name, u.config.label, u.batch, mode) not in done:
                    record(Row.failed(reason, model=u.model.name, config=u.config.label, batch_size=u.batch, mode=mode,
                                      precision=u.config.precision))
            bar("done", f"{u.model.name} b{u.batch} {u.config.label} (failed)")


def _same_model(a: SweepUnit, b: SweepUnit) -> bool:
    return b.section is None and b.model is a.model


@dataclass(frozen=True)
class SweepUnit:
    """A piece of a sweep that runs as one: a config at a batch size of a model, in every mode (they
    share its preparation and parity gate), or a section cell (``serve:``)."""

    model: SweepModel | None = None
    batch: int | None = None
    config: Config | None = None
    section: SectionCell | None = None

    def keys(self, modes: list[str]) -> list[Key]:
        if self.section is not None:
            return [self.section.key]
        return [(self.model.name, self.config.label, self.batch, mode) for mode in modes]

    def done(self, done: Container[Key], modes: list[str]) -> bool:
        return all(k in done for k in self.keys(modes))

    def __str__(self) -> str:
        if self.section is not None:
            return " ".join(str(x) for x in self.section.key)
        return f"{self.model.name} b{self.batch} {self.config.label}"


class CellsFile:
    """A cells file opened for appending: one JSON row per line, each flushed and fsynced as it is
    added, so a crash loses no finished cell. A line a crash cut short is ended first."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self) -> CellsFile:
        cut_short = _ends_without_newline(self.path)
        self.file = self.path.open("a")
        if cut_short:
            self.file.write("\n")  # end the line a crash cut short, so the next row starts a line of its own
        return self

    def add(self, row: Row) -> None:
        self.file.write(json.dumps(row.to_dict(), default=str) + "\n")
        self.file.flush()
        os.fsync(self.file.fileno())

    def __exit__(self, *exc: Any) -> None:
        self.file.close()


# What a sweep writes into its folder (plots aside): moved together by resume=False.
_SWEEP_FILES = ("cells.jsonl", "sweep.json", "results.json", "results.csv", "report.md")


def move_aside(out: Path) -> Path | None:
    """Move an earlier sweep's files (and its plots) into ``out/previous-<time>/``; None when there
    were none. Measured data is never deleted."""
    files = [p for p in cells_files(out) if p.stat().st_size > 0]
    if not files:
        return None
    models = {row.model for p in files for row in read_cells(p)}
    plots = [p for p in out.iterdir() if p.suffix in (".png", ".svg") and any(p.name.startswith(f"{m}-")
                                                                                   for m in models)]
    dest = out / f"previous-{time.strftime('%Y%m%d-%H%M%S')}"
    n = 1
    while dest.exists():
        n += 1
        dest = out / f"previous-{time.strftime('%Y%m%d-%H%M%S')}-{n}"
    dest.mkdir()
    for p in [out / name for name in _SWEEP_FILES] + cells_files(out) + plots:
        if p.exists():
            os.replace(p, dest / p.name)
    return dest


def cells_files(out: Path) -> list[Path]:
    """A sweep folder's cells files: ``cells.jsonl`` and, from a sweep over several devices, each
    rank's ``cells-rank<R>.jsonl``."""
    return [p for p in [out / "cells.jsonl", *sorted(out.glob("cells-rank*.jsonl"))] if p.is_file()]


def cells_in(out: Path) -> dict[Key, Row]:
    """Every cell in a sweep folder's cells files, by key (each once)."""
    return {row.key: row for path in cells_files(out) for row in read_cells(path)}


def _ends_without_newline(path: Path) -> bool:
    if not path.exists() or path.stat().st_size == 0:
        return False
    with path.open("rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b"\n"


def _fingerprint(models: list[SweepModel], configs: list[Config], modes: list[str], parity: bool,
                 device: torch.device, options: dict[str, Any],
                 sections: dict[str, list[SectionCell]] | None = None, per_rank: bool = False) -> dict[str, Any]:
    """The sweep as it will be measured -- resolved models, configs (label and canonical string),
    modes, parity, every measure option with its default, the cells of sections such as ``serve``,
    the device and its name, gpuopt's and torch's versions -- and nothing else (no times): two sweeps
    whose fingerprints match measure comparable cells."""
    from .._ext import build_info

    measure = {k: v for k, v in {**measure_defaults(), **options}.items() if k not in ("mode", "inputs", "device")}
    return {
        **{name: [c.fingerprint for c in cells] for name, cells in (sections or {}).items()},
        "models": [{"name": m.name, "input_shape": list(m.input_shape) if m.input_shape else None,
                    "batch_sizes": m.batch_sizes} for m in models],
        "configs": [[c.label, str(c)] for c in configs],
        "modes": list(modes),
        "parity": parity,
        "measure": measure,
        "device": ("cuda (one GPU per rank)" if per_rank else
                   f"cuda:{torch.cuda.current_device() if device.index is None else device.index}")
                  if device.type == "cuda" else "cpu",
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "gpuopt": build_info()["gpuopt_version"],
        "torch": torch.__version__,
    }


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``key: old -> new`` for each fingerprint entry that differs (measure options one by one)."""
    out = []
    for key in dict.fromkeys([*old, *new]):
        a, b = old.get(key), new.get(key)
        if key == "measure" and isinstance(a, dict) and isinstance(b, dict):
            out += [f"measure.{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in dict.fromkeys([*a, *b]) if a.get(k) != b.get(k)]
        elif a != b:
            out.append(f"{key}: {a!r} -> {b!r}")
    return out


def _resumable(out: Path, fingerprint: dict[str, Any]) -> dict[Key, Row]:
    """The cells of ``out`` to resume from; ValueError naming every difference when they were
    measured under another spec, options, device or gpuopt (or when the folder does not say)."""
    done = cells_in(out)
    if not done:
        return {}
    header_path = out / "sweep.json"
    try:
        old = json.loads(header_path.read_text()).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        old = None
    way_out = ("use a new --output folder (output_dir), or --no-resume (resume=False), which moves the "
               f"measured files to {out}/previous-<time>/ and starts over")
    if not isinstance(old, dict):
        raise ValueError(f"{out} holds {len(done)} measured cells without the record of how they were measured "
                         f"(a sweep.json fingerprint: written by gpuopt 0.1 or by hand), so they cannot be "
                         f"resumed safely; {way_out}")
    diff = differences(old, fingerprint)
    if diff:
        raise ValueError(f"{out} holds {len(done)} cells of a different sweep; resuming would mix them with "
                         f"this one (folder -> now: {'; '.join(diff)}); {way_out}")
    return done


def plan_sweep(spec: str | os.PathLike | dict, output_dir: str | os.PathLike, *, resume: bool = True,
               progress: bool = True, devices: str | int | Sequence[int] | None = None) -> SweepPlan:
    """Validate a sweep (the spec, every model name, batch sizes, modes, measure options, the output
    folder and, with ``resume``, that the cells already there were measured the same way) and return
    its plan; ValueError / TypeError naming the problem before anything runs. ``devices``: see
    :func:`sweep`."""
    doc = load_spec(spec)
    for name, flag in (("resume", resume), ("progress", progress)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {flag!r}")
    parity, train = doc.get("parity", True), doc.get("train", False)
    for name, flag in (("parity", parity), ("train", train)):
        if not isinstance(flag, bool):
            raise ValueError(f"{name} must be true or false, got {flag!r}")
    default_batches = resolve_batch_sizes(doc.get("batch_sizes", [1, 8, 16, 32]))
    device = resolve_device(doc.get("device"))
    configs = resolve_configs(doc.get("configs"), device=device, train=train)  # one default-preset rule
    modes = resolve_modes(doc.get("modes", ["latency", "throughput"]), train, device)
    measure = doc.get("measure") or {}
    if not isinstance(measure, dict):
        raise ValueError(f"measure must be a table of gpuopt.measure options, e.g. {{max_time_s = 2}}; got {measure!r}")
    try:
        options = check_measure_options(dict(measure), modes, device)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"measure: {exc}") from exc
    models = []
    for m in doc["models"]:
        m = m if isinstance(m, dict) else {"name": m}
        needs = zoo.spec(m["name"]).needs  # an unknown name fails here, not after the models before it ran
        if needs is not None and importlib.util.find_spec(needs) is None:
            raise ImportError(f"model {m['name']!r} needs {needs}: pip install {needs}")
        if any(m["name"] == seen.name for seen in models):
            raise ValueError(f"model {m['name']!r} is listed twice in models; cells are keyed by (model, config, "
                             "batch size, mode): list each model once, and run a separate sweep for another input "
                             "shape")
        shape = check_input_shape(m["input_shape"]) if m.get("input_shape") is not None else None
        models.append(SweepModel(m["name"], shape, resolve_batch_sizes(m.get("batch_sizes", default_batches))))
    sections: dict[str, list[SectionCell]] = {}
    for name, section in SECTIONS.items():
        if name in doc:
            try:
                sections[name] = section.plan(doc[name], device)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"{name}: {exc}") from exc
    cells = [c for cs in sections.values() for c in cs]
    seen: dict[Key, int] = {}
    for i, c in enumerate(cells):
        if c.key in seen:
            raise ValueError(f"two cells of the sweep would both be the row {c.key} (cells {seen[c.key] + 1} and "
                             f"{i + 1} of its sections); give them distinct labels")
        seen[c.key] = i
    fingerprint = _fingerprint(models, configs, modes, parity, device, options, sections,
                               per_rank=devices is not None)
    out = Path(output_dir)
    done = _resumable(out, fingerprint) if resume and out.is_dir() else ({} if resume else None)
    check_writable(out)
    plan = SweepPlan(doc, out, models, configs, modes, device, parity, options, fingerprint, done, progress,
                     section_cells=cells)
    if devices is not None:
        if not _DISTRIBUTED:
            raise ImportError("devices= is run by gpuopt.dist: import gpuopt (or gpuopt.dist) first")
        plan.distributed = _DISTRIBUTED[0](devices, plan, {"spec": spec, "resume": resume})
    return plan


def sweep(spec: str | os.PathLike | dict, output_dir: str | os.PathLike, *, resume: bool = True,
          progress: bool = True, devices: str | int | Sequence[int] | None = None) -> Results:
    """Run a sweep into ``output_dir`` and return all its Results (also saved there).

    Cells are (model, config, batch size, mode). Each finished cell is appended to
    ``output_dir/cells.jsonl`` and flushed. With ``resume=True`` the cells already there are skipped
    when the folder's fingerprint (``sweep.json``: the resolved spec, every measure option, the
    device, gpuopt's and torch's versions) matches this sweep's; otherwise ValueError naming each
    difference, before anything runs. ``resume=False`` moves an earlier sweep's files to
    ``output_dir/previous-<time>/`` and starts over. A failing cell (out of memory, compile error, parity failure)
    is recorded with its reason and the sweep continues, as is every cell of a batch size whose FP32
    reference fails; after an out-of-memory error the CUDA caching allocator is emptied. A bad spec
    raises ValueError or TypeError before anything runs (see :func:`plan_sweep`).

    ``devices`` (``"all"``, a number of GPUs or a list of indices; with ``device = "cpu"`` a number of
    CPU ranks) spreads the cells over one process per device through torchrun (:mod:`gpuopt.dist.sweep`):
    each rank measures its share on its own device, appending to ``cells-rank<R>.jsonl``, and rank 0
    merges them into the results. Inside a torchrun job (yours, several machines too) ``"all"`` joins it.

    Spec keys: name, models, configs, batch_sizes, modes, parity, train, device, measure, and the
    sections of engines above ``run``: ``serve`` (serving runs, see :mod:`gpuopt.serving.cells`;
    a spec of serving runs alone needs no models). Example (TOML)::

        models = ["resnet50", "vit_b_16"]
        configs = ["fp32", "fp16-amp", "fp16-amp+channels_last"]
        batch_sizes = [1, 32, 128]
        modes = ["latency", "throughput"]
        measure = { max_time_s = 2 }
    """
    return plan_sweep(spec, output_dir, resume=resume, progress=progress, devices=devices).run()
