"""A grid of many measurements in one table, like ``torch.utils.benchmark.Compare``: rows and
columns named by the caller, each cell the median with its interval, in one time unit for the table."""

from __future__ import annotations

from collections.abc import Mapping

from ..timing.measurement import Measurement
from .table import text_table

_UNITS = (("us", 1e-3), ("ms", 1.0), ("s", 1e3))  # (name, milliseconds per unit)


def _unit(medians_ms: list[float]) -> tuple[str, float]:
    smallest = min(medians_ms)
    for name, ms in reversed(_UNITS):
        if smallest >= ms:
            return name, ms
    return _UNITS[0]


def _cell(m: Measurement, scale_ms: float, digits: int) -> str:
    value = f"{m.p50 / scale_ms:.{digits}g}"
    if m.n < 2 or m.ci_level <= 0:
        return f"{value} (n=1)"
    mark = "" if m.ci_level >= m.ci_requested else f" ({m.ci_level * 100:.3g}% CI)"
    return f"{value} ±{m.ci_rel:.1%}{mark}"


def grid(cells: Mapping[tuple[str, str], Measurement], *, title: str | None = None, digits: int = 3) -> str:
    """A plain-text table of ``{(row, column): Measurement}``: each cell the median (``digits``
    significant figures, one unit for the table) and the relative half-width of its interval, marked
    with its coverage when too few samples gave less than the requested one. Empty cells print ``-``.

    >>> a = Measurement.from_samples([1.0, 1.1, 0.9, 1.0, 1.05, 0.95], label="mm")
    >>> print(grid({("matmul", "fp32"): a, ("matmul", "bf16"): a}))   # doctest: +NORMALIZE_WHITESPACE
           fp32     bf16
    ------------------------
    matmul 1 ±10.0% 1 ±10.0%
    median in ms; ±: the 95% interval of the median
    """
    if not isinstance(cells, Mapping) or not cells:
        raise TypeError("cells must be a non-empty mapping {(row, column): Measurement}")
    for key, m in cells.items():
        if not (isinstance(key, tuple) and len(key) == 2):
            raise TypeError(f"each key must be a (row, column) pair, got {key!r}")
        if not isinstance(m, Measurement):
            raise TypeError(f"cell {key!r} must be a gpuopt.Measurement, got {type(m).__name__}")
    if isinstance(digits, bool) or not isinstance(digits, int) or digits < 1:
        raise ValueError(f"digits must be a positive integer, got {digits!r}")
    rows = list(dict.fromkeys(str(r) for r, _ in cells))
    cols = list(dict.fromkeys(str(c) for _, c in cells))
    unit, scale = _unit([m.p50 for m in cells.values()])
    text = {(str(r), str(c)): _cell(m, scale, digits) for (r, c), m in cells.items()}
    body = [[r, *(text.get((r, c), "-") for c in cols)] for r in rows]
    lines = [title] if title else []
    lines.append(text_table(["", *cols], body))
    level = min(m.ci_requested for m in cells.values())
    lines.append(f"median in {unit}; ±: the {level:.0%} interval of the median")
    return "\n".join(lines)
