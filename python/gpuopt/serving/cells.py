"""The ``serve:`` section of a sweep spec: serving runs as sweep cells, appended to ``cells.jsonl``
and resumed by the sweep's fingerprint like the measured cells.

Each entry is a table: ``model`` (a zoo name, required), ``config`` (default fp32), ``batcher``
(gpuopt or naive), ``label``, ``samples``, the server's settings (``max_batch_size``,
``max_queue_delay_us``, ``preferred_batch_sizes``, ``buckets``, ``instances``, ...) and the load's
(any :class:`LoadSpec` field: ``scenario``, ``rate``, ``slo_ms``, ``concurrency``, ``duration_s``,
``min_queries``, ...). A list for one of :data:`EXPANDED` makes a cell per value (``rate: [100, 200]``
is a curve)::

    serve:
      - model: resnet50
        config: fp16+channels_last+cudagraph
        batcher: [gpuopt, naive]
        rate: [500, 1000, 2000]
        slo_ms: 10
"""

from __future__ import annotations

import importlib.util
import inspect
import itertools
from typing import Any

import torch

from .._checks import check_int
from ..prepare.config import Config
from ..report.results import serving_mode
from ..run import zoo
from ..run.sweeps import Section, SectionCell, register_section
from .api import BATCHERS, serve
from .load import LoadSpec
from .server import Server, batcher_options

_LOAD_KEYS = set(LoadSpec.__dataclass_fields__)
_SERVER_DEFAULTS = {k: p.default for k, p in inspect.signature(Server).parameters.items()
                    if k in ("max_batch_size", "max_queue_delay_us", "preferred_batch_sizes", "buckets", "instances",
                             "max_queue_size", "priority_levels", "timeout_ms", "timeout_action", "executor", "idle_spin_us")}
_CELL_DEFAULTS = {"config": "fp32", "batcher": "gpuopt", "label": None, "samples": 64, "naive_max_wait_ms": 1.0}
KEYS = {"model", *_CELL_DEFAULTS, *_SERVER_DEFAULTS, *_LOAD_KEYS}
# Keys a list expands into a cell per value; the key of those the row's key does not show already
# (config, batch size, load point, naive) is added to its label.
EXPANDED = ("config", "batcher", "rate", "concurrency", "max_batch_size", "max_queue_delay_us", "instances")
_IN_ROW_KEY = ("config", "batcher", "rate", "concurrency", "max_batch_size")


def plan_cells(entries: Any, device: torch.device) -> list[SectionCell]:
    """The cells of a ``serve:`` section, every entry checked (model, config, batcher and load
    settings) before anything runs; ValueError / TypeError naming the entry and the problem."""
    if isinstance(entries, dict):
        entries = [entries]
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"serve is a list of tables {{model, config, scenario, rate, ...}}, got {entries!r}")
    cells = []
    for n, entry in enumerate(entries, 1):
        try:
            cells += _entry_cells(entry, device)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"entry {n}: {exc}") from exc
    return cells


def _entry_cells(entry: Any, device: torch.device) -> list[SectionCell]:
    if not isinstance(entry, dict) or "model" not in entry:
        raise ValueError(f"a serve entry is a table with a model (a zoo name), got {entry!r}")
    unknown = sorted(set(entry) - KEYS)
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(sorted(KEYS))}")
    needs = zoo.spec(entry["model"]).needs
    if needs is not None and importlib.util.find_spec(needs) is None:
        raise ImportError(f"model {entry['model']!r} needs {needs}: pip install {needs}")
    lists = {k: entry[k] for k in EXPANDED if isinstance(entry.get(k), list)}
    for k, values in lists.items():
        if not values or len(set(map(str, values))) != len(values):
            raise ValueError(f"{k} must be a value or a non-empty list of distinct values, got {values!r}")
    cells = []
    for combo in itertools.product(*lists.values()):
        one = {**_CELL_DEFAULTS, **entry, **dict(zip(lists, combo))}
        parts = [str(one["label"])] if one["label"] else []
        parts += [f"{k}={v}" for k, v in zip(lists, combo) if k not in _IN_ROW_KEY]
        one["label"] = " ".join(parts) or None
        cells.append(_cell(one, device))
    return cells


def _cell(entry: dict[str, Any], device: torch.device) -> SectionCell:
    model, label, samples = entry["model"], entry["label"], entry["samples"]
    config = Config.parse(entry["config"])
    batcher = entry["batcher"]
    if batcher not in BATCHERS:
        raise ValueError(f"batcher must be one of {', '.join(map(repr, BATCHERS))}, got {batcher!r}")
    check_int("samples", samples)
    load = LoadSpec(**{k: entry[k] for k in _LOAD_KEYS if k in entry})
    load.options()
    server = {k: entry.get(k, default) for k, default in _SERVER_DEFAULTS.items()}
    batcher_options(**{k: v for k, v in server.items() if k not in ("instances", "executor")})
    if batcher == "naive":
        server["naive_max_wait_ms"] = entry["naive_max_wait_ms"]
    key = (model, config.label, server["max_batch_size"], serving_mode(load.to_dict(), naive=batcher == "naive",
                                                                       label=label))

    def run() -> Any:
        kw = {k: v for k, v in load.to_dict().items() if k not in ("scenario", "rate", "slo_ms")}
        result = serve(model, config, scenario=load.scenario, rate=load.rate, slo_ms=load.slo_ms, batcher=batcher,
                       samples=samples, device=device, **server, **kw)
        return result.row(precision=config.precision, label=label)

    fingerprint = {"model": model, "config": [config.label, str(config)], "batcher": batcher, "label": label,
                   "samples": samples, "server": server, "load": load.to_dict()}
    return SectionCell(key, fingerprint, run, {"item_unit": "requests", "precision": config.precision,
                                               "device": str(device)})


register_section("serve", Section("serving runs: a list of {model, config, batcher, scenario, rate, slo_ms, ...} "
                                  "tables (gpuopt.serving.cells)", plan_cells))
