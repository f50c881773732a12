"""Table cells as text: one way to show a value in the console, ``*.md`` and ``*.csv`` files of every report.

Intervals and p-values follow :mod:`pretrain_exp.core.stats`: a missing interval (``None`` in ``results.json``,
``nan`` in memory: fewer than 2 items, or no spread) prints ``n/a``, never a zero-width ``[v, v]``; a group of
fewer than ``MIN_ITEMS_PER_GROUP`` items prints its item count with a ``*``; every printed interval names its
method (:func:`method_label`).
"""

from __future__ import annotations

import csv
import io
import math
from typing import Iterable, Optional, Sequence

NA = "n/a"  #: a missing interval or p-value
SMALL_N_MARK = "*"  #: after the item count of a group of fewer than ``MIN_ITEMS_PER_GROUP`` items


def fmt(v, spec: str = ".4f") -> str:
    """A cell as text: ``-`` for ``None``, a float with ``spec``, anything else with ``str``."""
    if v is None:
        return "-"
    return format(v, spec) if isinstance(v, float) else str(v)


def missing(v) -> bool:
    """``True`` for ``None`` and a non-finite float (a missing estimate or interval bound)."""
    return v is None or (isinstance(v, float) and not math.isfinite(v))


def fmt_ci(low, high, spec: str = ".3f") -> str:
    """An interval as ``[low, high]``, or ``n/a`` when either bound is missing (:func:`missing`)."""
    return NA if missing(low) or missing(high) else f"[{format(low, spec)}, {format(high, spec)}]"


def fmt_p(p) -> str:
    """A p-value: ``-`` for ``None``, ``n/a`` for ``nan``, 3 decimals from 0.001 up, else 2 significant digits in
    scientific notation (``2.0e-04``)."""
    if p is None:
        return "-"
    if missing(p):
        return NA
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def fmt_items(n, small_n: Optional[bool] = None) -> str:
    """An item count, with :data:`SMALL_N_MARK` when ``small_n`` (a group below ``MIN_ITEMS_PER_GROUP``)."""
    return "-" if n is None else f"{n}{SMALL_N_MARK if small_n else ''}"


def method_label(methods: Iterable[Optional[str]]) -> str:
    """The interval methods of a column's rows as one label (``"t"``, ``"Welch t"``, ``"t / Wilson"``): the distinct
    methods in first-seen order, without the ``none (...)`` of rows that have no interval; ``""`` if none has one."""
    out: list = []
    for m in methods:
        if m and not str(m).startswith("none") and m not in out:
            out.append(m)
    return " / ".join(out)


def no_interval_reasons(methods: Iterable[Optional[str]]) -> str:
    """Why rows have no interval: the distinct ``none (...)`` reasons (``"n < 2; all values equal"``), ``""`` if
    every row has one."""
    out: list = []
    for m in methods:
        if m and str(m).startswith("none"):
            why = str(m)[4:].strip(" ()") or "no interval"
            if why not in out:
                out.append(why)
    return "; ".join(out)


def md_cell(v) -> str:
    """A markdown table cell (:func:`fmt`, with ``|`` escaped)."""
    return fmt(v).replace("|", "\\|")


def csv_text(rows: Iterable[dict], columns: Sequence[str]) -> str:
    """CSV text with a header of ``columns`` and one line per row (``None``, ``nan`` and missing keys as empty
    cells; keys outside ``columns`` ignored)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows({c: ("" if missing(r.get(c)) else r.get(c)) for c in columns} for r in rows)
    return buf.getvalue()
