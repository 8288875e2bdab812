"""Cross-hardware report: gpuopt results from several devices side by side (``gpuopt report a.json
b.json ...``): throughput and its ratio against the first document's device, latency, and how close
each device came to its own roofline."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .results import Results, Row


def _device_name(res: Results, i: int) -> str:
    gpus = res.env.get("gpus") or []
    if gpus and isinstance(gpus[0], dict) and gpus[0].get("name"):
        return str(gpus[0]["name"])
    for row in res.rows:
        if row.device:
            return str(row.device)
    return f"document {i + 1}"


def _as_results(docs: Any) -> list[Results]:
    if not isinstance(docs, (list, tuple)):
        raise TypeError(f"docs must be a list of Results or gpuopt results documents (dicts), got "
                        f"{type(docs).__name__}")
    if not docs:
        raise ValueError("docs must hold at least one results document, got an empty list")
    out = []
    for i, doc in enumerate(docs, 1):
        if isinstance(doc, dict):
            try:
                doc = Results.from_dict(doc)
            except ValueError as exc:
                raise ValueError(f"document {i}, {exc}") from exc
        elif not isinstance(doc, Results):
            raise TypeError(f"document {i} must be Results or a dict (a gpuopt results JSON), got "
                            f"{type(doc).__name__}")
        if not doc.rows:
            raise ValueError(f"document {i} has no rows: a gpuopt results document needs at least one")
        out.append(doc)
    return out


def _cell_text(text: str, n: int = 60) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= n else text[: n - 3] + "..."


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _failed(row: Row | None) -> str | None:
    if row is not None and not row.ok:
        return f"failed: {_cell_text(row.error or row.status)}"
    return None


def _throughput(row: Row | None, base: Row | None, first: bool) -> str:
    if row is None:
        return "-"
    failed = _failed(row)
    if failed:
        return failed
    value = _number(row.throughput_items_per_s)
    if value is None:
        return "n/a"
    text = f"{value:.3g}" if value < 100 else f"{value:,.0f}"
    ref = _number(base.throughput_items_per_s) if base is not None and _failed(base) is None else None
    if not first and ref:
        text += f" ({value / ref:.2f}x)"
    return text


def _latency(row: Row | None) -> str:
    if row is None:
        return "-"
    failed = _failed(row)
    if failed:
        return "failed"
    p50 = _number((row.latency_ms or {}).get("p50"))
    return "n/a" if p50 is None else f"{p50:.3g}"


def _roofline(row: Row | None) -> str:
    if row is None:
        return "-"
    if _failed(row):
        return "failed"
    r = row.roofline
    if not isinstance(r, dict):
        return "n/a"
    shares = [f"{pct:.0f}% {what}" for what, pct in (("compute", _number(r.get("pct_of_compute_ceiling"))),
                                                      ("memory", _number(r.get("pct_of_memory_ceiling"))))
              if pct is not None]
    bound = r.get("bound")
    text = ", ".join(shares) or "n/a"
    return f"{text} ({bound})" if bound else text


def cross_hardware_markdown(docs: Sequence[Results | dict]) -> str:
    """Markdown comparing gpuopt results from different devices: :class:`Results`, or results
    documents as :meth:`Results.to_dict` writes them (this schema version or version 1).

    Cells with the same (model, config, batch_size, mode) are put side by side: throughput in items/s
    with its ratio against the first document's device, median latency, and each device's share of
    its own compute and memory ceilings (``Row.roofline``). A failed cell shows its error; a cell
    absent from a document shows "-".

    >>> doc = {"schema_version": 2, "env": {"gpus": [{"name": "GPU A"}]},
    ...        "rows": [{"model": "m", "config": "fp32", "batch_size": 1, "mode": "latency",
    ...                  "status": "ok", "throughput_items_per_s": 100.0}]}
    >>> "| m | fp32 | 1 | latency | 100 |" in cross_hardware_markdown([doc])
    True
    """
    results = _as_results(docs)
    names = [_device_name(res, i) for i, res in enumerate(results)]
    labels = [name if names.count(name) == 1 else f"{name} ({i + 1})" for i, name in enumerate(names)]
    # Every cell of any document, in the order first seen.
    order = list(dict.fromkeys(row.key for res in results for row in res.rows))

    lines = ["# Cross-hardware comparison", "", "| # | device | gpuopt | torch | driver | rows |",
             "|---:|---|---|---|---|---:|"]
    for i, (res, label) in enumerate(zip(results, labels), 1):
        env = res.env
        lines.append(f"| {i} | {_cell_text(label)} | {env.get('gpuopt', '-')} | {env.get('torch', '-')} "
                     f"| {env.get('driver') or '-'} | {len(res.rows)} |")
    head = "| model | config | batch | mode | " + " | ".join(_cell_text(lb, 40) for lb in labels) + " |"
    rule = "|---|---|---:|---|" + "---:|" * len(labels)

    def section(title: str, cell) -> list[str]:
        out = ["", f"## {title}", "", head, rule]
        for key in order:
            cells = [cell(res.find(*key), results[0].find(*key), i == 0) for i, res in enumerate(results)]
            out.append("| " + " | ".join(_cell_text(k, 40) for k in key) + " | " + " | ".join(cells) + " |")
        return out

    lines += section(f"Throughput (items/s; ratio against {_cell_text(labels[0])})", _throughput)
    lines += section("Median latency (ms)", lambda row, base, first: _latency(row))
    lines += section("Share of each device's own roofline", lambda row, base, first: _roofline(row))
    lines += ["", "'-': not run on that device. Ratios compare throughput with the first document's device; "
              "roofline shares are of that device's own ceilings (measured where available, else datasheet)."]
    return "\n".join(lines) + "\n"
