"""Tidy tables of runs and sweeps as pandas DataFrames, and their Parquet copies in a run dir.

A finished run dir holds, beside its JSONL files (which stay the source of record), ``manifest.parquet`` (one row
per inserted span, the columns of ``manifest.jsonl``), ``items.parquet`` (one row per item, ``items.jsonl``) and
``evals.parquet`` (one row per item, step and eval: the per-item rows of every ``evals/step<N>/<eval>.json``),
written with pyarrow by :func:`write_run_tables`.

- :func:`load_run` returns the per-item eval rows of a run joined with its items: columns ``item_id``, ``step``,
  ``eval`` (the ``eval.tasks`` name), ``eval_type``, ``experiment``, ``dup_count``, the eval's own columns
  (``loss``, ``n_tokens``, ``exact_match``, ``matched_length``, ``acc``, ...; missing where an eval has none) and
  the item's (``index``, ``length``, ``sha256``, ``source``, ``text``).
- :func:`load_sweep` returns one row per job of a sweep (or of one run dir): ``job``, ``path``, ``status``
  (``done`` / ``failed``), ``reason``, ``run_name``, ``seed``, ``checkpoint_step``, ``step``, one column per
  override of the job's command line (:data:`OVERRIDE_PREFIX` + key), one per metric of the last evaluated step
  (``<eval>/<metric>``), and the ``per_dup``, ``by_step``, ``effects`` and ``contamination`` records of its
  ``results.json``.

The sweep report (:mod:`pretrain_exp.report.sweep`) is built on :func:`sweep_frame`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Sequence

import pandas as pd

from pretrain_exp.core.io import atomic_path, read_jsonl
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.report.failures import collect
from pretrain_exp.report.jobs import Job

#: prefix of the override columns of :func:`load_sweep`
OVERRIDE_PREFIX = "override:"
#: the leading columns of :func:`load_run`
RUN_COLUMNS = ["item_id", "step", "eval", "eval_type", "experiment", "dup_count"]


def _jsonl_frame(path: Path) -> pd.DataFrame:
    return pd.DataFrame([obj for _, obj in read_jsonl(path)]) if path.is_file() else pd.DataFrame()


def eval_rows_frame(run_dir: str | Path) -> pd.DataFrame:
    """The per-item rows of every ``evals/step<N>/<eval>.json`` of a run, with ``step``, ``eval`` and
    ``eval_type`` columns; sorted by step, eval and item. Empty (with the leading columns) if there are none."""
    frames = []
    rd = RunDir(run_dir)
    for step, _ in rd.eval_steps():
        for task, rec in rd.read_evals(step).items():
            if rec.get("rows"):
                df = pd.DataFrame(rec["rows"])
                df.insert(0, "step", int(rec.get("step", step)))
                df.insert(1, "eval", rec.get("task", task))
                df.insert(2, "eval_type", rec.get("type"))
                frames.append(df)
    if not frames:
        return pd.DataFrame(columns=RUN_COLUMNS[1:4])
    out = pd.concat(frames, ignore_index=True)
    keys = [k for k in ("step", "eval", "item_id") if k in out.columns]  # e.g. knowledge rows carry no item_id
    return out.sort_values(keys, kind="stable", ignore_index=True)


def write_run_tables(run_dir: str | Path) -> Dict[str, Path]:
    """Write ``manifest.parquet``, ``items.parquet`` and ``evals.parquet`` of a run dir (module docstring), each
    atomically (temp file + rename); a table whose JSON source is missing is skipped.

    :returns: table name (file stem) -> path written.
    """
    rd = RunDir(run_dir)
    out = {}
    tables = {table: _jsonl_frame(src) for table, src in (("manifest", rd.manifest), ("items", rd.items))
              if src.is_file()}
    tables["evals"] = eval_rows_frame(rd.path)
    for table, df in tables.items():
        with atomic_path(rd.parquet(table)) as tmp:
            df.to_parquet(tmp, index=False, engine="pyarrow")
        out[table] = rd.parquet(table)
    return out


def _fresh_parquet(p: Path, sources: Sequence[Path]) -> bool:
    return p.is_file() and all(s.stat().st_mtime_ns < p.stat().st_mtime_ns for s in sources)


def load_run(run_dir: str | Path) -> pd.DataFrame:
    """One row per item x step x eval of a run (module docstring), from its Parquet tables where they are current,
    else from its JSON files (a run still in progress).

    :raises FileNotFoundError: if ``run_dir`` is not a directory.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such directory")
    rd = RunDir(run_dir)
    evals_json = [f for step, _ in rd.eval_steps() for f in rd.eval_files(step)]
    rows = (pd.read_parquet(rd.parquet("evals")) if _fresh_parquet(rd.parquet("evals"), evals_json)
            else eval_rows_frame(run_dir))
    items = load_items(run_dir)
    if len(rows) and len(items) and "item_id" in rows:
        extra = ["item_id"] + [c for c in items.columns if c not in rows.columns]
        rows = rows.merge(items[extra], on="item_id", how="left", validate="many_to_one")
    first = [c for c in RUN_COLUMNS if c in rows.columns]
    return rows[first + [c for c in rows.columns if c not in first]]


def load_items(run_dir: str | Path) -> pd.DataFrame:
    """One row per item of a run (``items.parquet`` where it is current, else ``items.jsonl``); empty if neither."""
    rd = RunDir(run_dir)
    fresh = _fresh_parquet(rd.parquet("items"), [rd.items])
    return pd.read_parquet(rd.parquet("items")) if fresh else _jsonl_frame(rd.items)


def load_manifest(run_dir: str | Path) -> pd.DataFrame:
    """One row per inserted span of a run (``manifest.parquet`` where it is current, else ``manifest.jsonl``);
    empty if neither."""
    rd = RunDir(run_dir)
    fresh = _fresh_parquet(rd.parquet("manifest"), [rd.manifest])
    return pd.read_parquet(rd.parquet("manifest")) if fresh else _jsonl_frame(rd.manifest)


def sweep_frame(jobs: Sequence[Job]) -> pd.DataFrame:
    """One row per job (module docstring) of jobs read by :func:`pretrain_exp.report.jobs.load_job`."""
    records: List[dict] = []
    for j in jobs:
        res = j.results or {}
        model = res.get("model") or j.config.get("model") or {}
        rec = {"job": j.name, "path": str(j.path), "status": "done" if j.results is not None else "failed",
               "reason": j.reason or None, "run_name": res.get("run_name", j.config.get("run_name")),
               "seed": res.get("seed", j.config.get("seed")),
               "checkpoint_step": model.get("checkpoint_step"), "step": res.get("step"),
               **{OVERRIDE_PREFIX + k: v for k, v in j.overrides.items()}}
        for task, metrics in (res.get("metrics") or {}).items():
            rec.update({f"{task}/{k}": v for k, v in metrics.items()})
        rec["per_dup"] = res.get("per_dup") or []
        rec["by_step"] = res.get("by_step") or {}
        rec["effects"] = res.get("effects") or []
        rec["contamination"] = res.get("contamination") or {}
        records.append(rec)
    if not records:
        return pd.DataFrame(columns=["job", "path", "status", "reason", "run_name", "seed", "checkpoint_step", "step",
                                     "per_dup", "by_step", "effects", "contamination"])
    df = pd.DataFrame(records)
    for c in ("seed", "checkpoint_step", "step"):  # integers, missing where a job has no results (nullable Int64)
        df[c] = df[c].astype("Int64")
    return df


def py(value):
    """A DataFrame cell as a plain Python value: ``None`` for a missing one (``NaN``, ``pd.NA``), numpy scalars as
    Python numbers; lists and dicts as they are."""
    if isinstance(value, (list, dict, str)) or value is None:
        return value
    if pd.isna(value):
        return None
    return value.item() if hasattr(value, "item") else value


def load_sweep(root: str | Path) -> pd.DataFrame:
    """One row per job dir under ``root`` (a sweep dir, a CPDT run dir or one run dir), finished or not.

    :raises FileNotFoundError: if ``root`` is not a directory.
    """
    root = Path(root).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such directory")
    return sweep_frame(collect(root)[0])
