"""The benches' tables as aligned text: a run's figures in declared columns, each cell padded.

A column is declared as (header, key, format): its header, the key of the figure in a run's
row, and the format the figure is shown in.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from typing import Any

Column = tuple[str, str, str]  # header, key, format


def formatted(row: dict[str, Any], columns: Sequence[Column]) -> list[str]:
    """The row's figures, one per column in its format; ``?`` for a figure the row lacks."""
    return ["?" if row.get(key) is None else fmt.format(row[key]) for _, key, fmt in columns]


def padded(table: list[list[str]], left: Container[int] = ()) -> list[list[str]]:
    """Every cell padded to its column's width: aligned right, but in the columns ``left`` holds."""
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    return [
        [t.ljust(w) if i in left else t.rjust(w) for i, (t, w) in enumerate(zip(line, widths, strict=True))]
        for line in table
    ]
