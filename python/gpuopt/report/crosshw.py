"""Cross-hardware report: gpuopt results from several devices side by side (``gpuopt report a.json
b.json ...``): throughput and its ratio against the first document's device, latency, and how close
each device came to its own roofline."""

from __future__ import annotations

from typing import Any

SCHEMA_VERSION = 1
_KEY = ("model", "config", "batch_size", "mode")


def _device_name(doc: dict, i: int) -> str:
    gpus = (doc.get("env") or {}).get("gpus") or []
    if gpus and isinstance(gpus[0], dict) and gpus[0].get("name"):
        return str(gpus[0]["name"])
    for row in doc["rows"]:
        if row.get("device"):
            return str(row["device"])
    return f"document {i + 1}"


def _validate(docs: Any) -> None:
    if not isinstance(docs, (list, tuple)):
        raise TypeError(f"docs must be a list of gpuopt results documents (dicts), got {type(docs).__name__}")
    if not docs:
        raise ValueError("docs must hold at least one results document, got an empty list")
    for i, doc in enumerate(docs, 1):
        if not isinstance(doc, dict):
            raise TypeError(f"document {i} must be a dict (a gpuopt results JSON), got {type(doc).__name__}")
        version = doc.get("schema_version", SCHEMA_VERSION)
        if not isinstance(version, int) or version > SCHEMA_VERSION:
            raise ValueError(f"document {i} has schema_version {version!r}, newer than this gpuopt understands "
                             f"({SCHEMA_VERSION}); upgrade gpuopt")
        rows = doc.get("rows")
        if not isinstance(rows, list) or not rows:
            raise ValueError(f"document {i} has no rows: a gpuopt results document needs a non-empty 'rows' list")
        for j, row in enumerate(rows, 1):
            if not isinstance(row, dict):
                raise TypeError(f"document {i}, row {j} must be a dict, got {type(row).__name__}")
            lacking = [k for k in _KEY if k not in row]
            if lacking:
                raise ValueError(f"document {i}, row {j} lacks {', '.join(lacking)}")


def _cell_text(text: str, n: int = 60) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= n else text[: n - 3] + "..."


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _failed(row: dict | None) -> str | None:
    if row is not None and row.get("status", "ok") != "ok":
        return f"failed: {_cell_text(row.get('error') or row.get('status'))}"
    return None


def _throughput(row: dict | None, base: dict | None, first: bool) -> str:
    if row is None:
        return "-"
    failed = _failed(row)
    if failed:
        return failed
    value = _number(row.get("throughput_items_per_s"))
    if value is None:
        return "n/a"
    text = f"{value:.3g}" if value < 100 else f"{value:,.0f}"
    ref = _number(base.get("throughput_items_per_s")) if base is not None and _failed(base) is None else None
    if not first and ref:
        text += f" ({value / ref:.2f}x)"
    return text


def _latency(row: dict | None) -> str:
    if row is None:
        return "-"
    failed = _failed(row)
    if failed:
        return "failed"
    p50 = _number((row.get("latency_ms") or {}).get("p50"))
    return "n/a" if p50 is None else f"{p50:.3g}"


def _roofline(row: dict | None) -> str:
    if row is None:
        return "-"
    if _failed(row):
        return "failed"
    r = row.get("roofline")
    if not isinstance(r, dict):
        return "n/a"
    shares = [f"{pct:.0f}% {what}" for what, pct in (("compute", _number(r.get("pct_of_compute_ceiling"))),
                                                      ("memory", _number(r.get("pct_of_memory_ceiling"))))
              if pct is not None]
    bound = r.get("bound")
    text = ", ".join(shares) or "n/a"
    return f"{text} ({bound})" if bound else text


def cross_hardware_markdown(docs: list[dict]) -> str:
    """Markdown comparing gpuopt results documents from different devices.

    Rows with the same (model, config, batch_size, mode) are put side by side: throughput in items/s
    with its ratio against the first document's device, median latency, and each device's share of
    its own compute and memory ceilings (``row["roofline"]``). A failed row shows its error; a row
    absent from a document shows "-".

    >>> doc = {"schema_version": 1, "env": {"gpus": [{"name": "GPU A"}]},
    ...        "rows": [{"model": "m", "config": "fp32", "batch_size": 1, "mode": "latency",
    ...                  "status": "ok", "throughput_items_per_s": 100.0}]}
    >>> "| m | fp32 | 1 | latency | 100 |" in cross_hardware_markdown([doc])
    True
    """
    _validate(docs)
    names = [_device_name(doc, i) for i, doc in enumerate(docs)]
    labels = [name if names.count(name) == 1 else f"{name} ({i + 1})" for i, name in enumerate(names)]
    tables: list[dict[tuple, dict]] = []
    order: list[tuple] = []
    for doc in docs:
        table: dict[tuple, dict] = {}
        for row in doc["rows"]:
            key = tuple(row[k] for k in _KEY)
            table.setdefault(key, row)  # a repeated key: the first row counts
            if key not in order:
                order.append(key)
        tables.append(table)

    lines = ["# Cross-hardware comparison", "", "| # | device | gpuopt | torch | driver | rows |",
             "|---:|---|---|---|---|---:|"]
    for i, (doc, label) in enumerate(zip(docs, labels), 1):
        env = doc.get("env") or {}
        lines.append(f"| {i} | {_cell_text(label)} | {env.get('gpuopt', '-')} | {env.get('torch', '-')} "
                     f"| {env.get('driver') or '-'} | {len(doc['rows'])} |")
    head = "| model | config | batch | mode | " + " | ".join(_cell_text(lb, 40) for lb in labels) + " |"
    rule = "|---|---|---:|---|" + "---:|" * len(labels)

    def section(title: str, cell) -> list[str]:
        out = ["", f"## {title}", "", head, rule]
        for key in order:
            cells = [cell(t.get(key), tables[0].get(key), i == 0) for i, t in enumerate(tables)]
            out.append("| " + " | ".join(_cell_text(k, 40) for k in key) + " | " + " | ".join(cells) + " |")
        return out

    lines += section(f"Throughput (items/s; ratio against {_cell_text(labels[0])})", _throughput)
    lines += section("Median latency (ms)", lambda row, base, first: _latency(row))
    lines += section("Share of each device's own roofline", lambda row, base, first: _roofline(row))
    lines += ["", "'-': not run on that device. Ratios compare throughput with the first document's device; "
              "roofline shares are of that device's own ceilings (measured where available, else datasheet)."]
    return "\n".join(lines) + "\n"
