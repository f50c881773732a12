"""Table cells as text: one way to show a value in the console, ``*.md`` and ``*.csv`` files of every report."""

from __future__ import annotations

import csv
import io
from typing import Iterable, Sequence


def fmt(v, spec: str = ".4f") -> str:
    """A cell as text: ``-`` for ``None``, a float with ``spec``, anything else with ``str``."""
    if v is None:
        return "-"
    return format(v, spec) if isinstance(v, float) else str(v)


def md_cell(v) -> str:
    """A markdown table cell (:func:`fmt`, with ``|`` escaped)."""
    return fmt(v).replace("|", "\\|")


def csv_text(rows: Iterable[dict], columns: Sequence[str]) -> str:
    """CSV text with a header of ``columns`` and one line per row (``None`` and missing keys as empty cells;
    keys outside ``columns`` ignored)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows({c: ("" if r.get(c) is None else r.get(c)) for c in columns} for r in rows)
    return buf.getvalue()
