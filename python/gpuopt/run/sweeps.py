"""Sweeps: models x configs x batch sizes x modes from a spec (TOML, YAML, JSON or a dict), every
finished cell appended to ``cells.jsonl`` at once -- a crash or Ctrl-C loses no finished cell, and
``resume=True`` skips the cells already there."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from .._files import check_writable, write_atomic
from ..report.results import Results
from .runner import ProgressBar, Runner
from .workload import (
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
    if not isinstance(doc, dict):
        raise ValueError(f"a sweep spec is a table of keys ({', '.join(SPEC_KEYS)}), got {type(doc).__name__}")
    unknown = sorted(set(doc) - set(SPEC_KEYS))
    if unknown:
        allowed = "; ".join(f"{k}: {v}" for k, v in SPEC_KEYS.items())
        raise ValueError(f"unknown sweep spec key(s) {', '.join(map(repr, unknown))}; allowed keys -- {allowed}")
    if not doc.get("models"):
        raise ValueError("a sweep spec needs models = [...] (zoo names, see gpuopt.zoo.names())")
    for m in doc["models"]:
        if isinstance(m, dict):
            bad = sorted(set(m) - MODEL_KEYS)
            if bad or "name" not in m:
                raise ValueError(f"a model table takes keys {sorted(MODEL_KEYS)} (name required), got {m!r}")
        elif not isinstance(m, str):
            raise ValueError(f"models must be zoo names or tables, got {m!r}")
    return doc


def _key(row: dict) -> tuple:
    return (row["model"], row["config"], row["batch_size"], row["mode"])


def sweep(spec: str | os.PathLike | dict, output_dir: str | os.PathLike, *, resume: bool = True,
          progress: bool = True) -> Results:
    """Run a sweep into ``output_dir`` and return all its Results (also saved there).

    Cells are (model, config, batch size, mode). Each finished cell is appended to
    ``output_dir/cells.jsonl`` and flushed; with ``resume=True`` cells already there are skipped.
    A failing cell (out of memory, compile error, parity failure) is recorded with its reason and
    the sweep continues; after an out-of-memory error the CUDA caching allocator is emptied.

    Spec keys: name, models, configs, batch_sizes, modes, parity, train, device, measure. Example
    (TOML)::

        models = ["resnet50", "vit_b_16"]
        configs = ["fp32", "fp16-amp", "fp16-amp+channels_last"]
        batch_sizes = [1, 32, 128]
        modes = ["latency", "throughput"]
        measure = { max_time_s = 2 }
    """
    doc = load_spec(spec)
    out = check_writable(output_dir)
    configs = resolve_configs(doc.get("configs", "bench"))
    default_batches = resolve_batch_sizes(doc.get("batch_sizes", [1, 8, 16, 32]))
    train = bool(doc.get("train", False))
    device = resolve_device(doc.get("device"))
    modes = resolve_modes(doc.get("modes", ["latency", "throughput"]), train, device)
    options = check_measure_options(dict(doc.get("measure") or {}))
    parity = doc.get("parity", True)
    if not isinstance(parity, bool):
        raise ValueError(f"parity must be true or false, got {parity!r}")
    models = [m if isinstance(m, dict) else {"name": m} for m in doc["models"]]

    cells_path = out / "cells.jsonl"
    done: dict[tuple, dict] = {}
    if resume and cells_path.exists():
        for line in cells_path.read_text().splitlines():
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut short by a crash: that cell runs again
                done[_key(row)] = row
    elif cells_path.exists():
        cells_path.unlink()
    results = Results.new(spec={k: v for k, v in doc.items()})
    results.rows.extend(done.values())
    write_atomic(out / "sweep.json", json.dumps({"created": results.created, "env": results.env,
                                                  "build": results.build, "spec": doc}, indent=1, default=str))

    total = sum(len(resolve_batch_sizes(m.get("batch_sizes", default_batches))) for m in models) * len(configs)
    bar = ProgressBar(total, progress)
    with cells_path.open("a") as cells:
        def record(row: dict) -> None:
            cells.write(json.dumps(row, default=str) + "\n")
            cells.flush()
            os.fsync(cells.fileno())
            results.add(row)

        try:
            for m in models:
                work = workload(m["name"], input_shape=m.get("input_shape"))
                runner = Runner(work, configs, modes, parity=parity, device=device, measure_options=options,
                                on_row=record, skip=lambda key: _key(key) in done, progress=bar)
                results.ceilings = runner.ceilings
                for b in resolve_batch_sizes(m.get("batch_sizes", default_batches)):
                    try:
                        runner.run_batch(b)
                    except torch.OutOfMemoryError as exc:
                        if device.type == "cuda":
                            torch.cuda.empty_cache()
                        _fail_batch(record, work.name, configs, modes, b, f"out of memory: {str(exc).splitlines()[0]}")
                    except (RuntimeError, ValueError) as exc:
                        _fail_batch(record, work.name, configs, modes, b, f"{type(exc).__name__}: {exc}")
                del runner, work
        finally:
            bar.close()
            results.save(out)  # also after Ctrl-C: what finished is in the report
    return results


def _fail_batch(record, model: str, configs, modes, batch: int, reason: str) -> None:
    """A whole batch size failed before its cells could run (e.g. the fp32 reference ran out of memory)."""
    for c in configs:
        for mode in modes:
            record({"model": model, "config": str(c), "config_label": c.label, "precision": c.precision,
                    "batch_size": batch, "mode": mode, "status": "failed", "error": reason, "latency_ms": None,
                    "throughput_items_per_s": None, "measurement": None})
