"""Plain-text tables for the terminal: every column as wide as its widest cell, so no name or number
is ever cut; text too long for a table (error messages) goes below it, wrapped."""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Sequence


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool] | None = None) -> str:
    """``header`` and ``rows`` (strings) as aligned columns under a rule; ``right[i]`` right-aligns
    column i (numbers). The last column is not padded, so a long note does not pad every line.

    >>> print(text_table(["config", "ms"], [["fp32", "1.5"], ["fp16-amp+channels_last", "0.8"]], [False, True]))
    config                  ms
    --------------------------
    fp32                   1.5
    fp16-amp+channels_last 0.8
    """
    n = len(header)
    if any(len(r) != n for r in rows):
        raise ValueError(f"every row needs {n} cells (one per header)")
    right = list(right) if right is not None else [False] * n
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]

    def line(cells: Sequence[str]) -> str:
        out = [str(c).rjust(w) if r else str(c).ljust(w) for c, w, r in zip(cells, widths, right)]
        return " ".join(out).rstrip()

    head = line(header)
    return "\n".join([head, "-" * max(len(head), sum(widths) + n - 1), *(line(r) for r in rows)])


def wrapped(prefix: str, text: str, width: int | None = None) -> str:
    """``prefix`` + ``text`` wrapped to the terminal's width, continuation lines indented."""
    width = width or shutil.get_terminal_size((100, 24)).columns
    return textwrap.fill(" ".join(text.split()), width=max(width, 40), initial_indent=prefix,
                         subsequent_indent="    ", break_long_words=False, break_on_hyphens=False)
