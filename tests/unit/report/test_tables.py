"""``pretrain_exp.load_run``: per-item eval rows (as the experiment loop writes them, from a real eval of a tiny
model) as one DataFrame row per item x step x eval, read from the run's Parquet tables while they are current and
from its JSON files otherwise (a run still in progress)."""

from __future__ import annotations

import os
from dataclasses import asdict

import numpy as np
import pandas as pd
import pytest

import pretrain_exp
from pretrain_exp.core.io import write_json
from pretrain_exp.evals.base import EvalContext
from pretrain_exp.evals.registry import EVALS, run_eval
from pretrain_exp.report import tables
from tests.conftest import make_plan, random_item, tiny_model


def _evaluate(run_dir, model, plan, step):
    """What the experiment loop writes for one eval at one step (``evals/step<N>/<task>.json``)."""
    ctx = EvalContext(model=model, tokenizer=None, plan=plan, held_out=np.empty((0, 8), np.int64), step=step,
                      batch_size=5, seed=0)
    res = run_eval(EVALS["insertion_loss"].config(), ctx)
    write_json(run_dir / "evals" / f"step{step}" / "loss.json",
               {"task": "loss", "type": "insertion_loss", "step": step, **asdict(res), "seconds": 0.1})
    return res


def test_load_run_reads_current_parquet_tables_else_the_json_files(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    plan = make_plan([(random_item(rng), d, e) for d, e in ((0, 0), (2, 0), (4, 0), (0, 1), (1, 1))],
                     experiments=("bios", "facts"))
    model = tiny_model(0)
    res = {s: _evaluate(tmp_path, model, plan, s) for s in (2, 4)}

    df = pretrain_exp.load_run(tmp_path)
    assert list(df.columns[:6]) == ["item_id", "step", "eval", "eval_type", "experiment", "dup_count"]
    assert len(df) == 5 * 2 and df["step"].tolist() == [2] * 5 + [4] * 5 and set(df["eval"]) == {"loss"}
    want = pd.DataFrame(res[2].rows + res[4].rows)
    assert df["loss"].tolist() == want["loss"].tolist() and df["item_id"].tolist() == want["item_id"].tolist()
    assert df.groupby("dup_count")["loss"].mean()[4] == pytest.approx(res[4].rows[2]["loss"])

    paths = tables.write_run_tables(tmp_path)
    assert sorted(paths) == ["evals"]  # no manifest/items JSONL in this dir: no table of them
    monkeypatch.setattr(tables, "eval_rows_frame", lambda d: pytest.fail("read the JSON despite current Parquet"))
    pd.testing.assert_frame_equal(pretrain_exp.load_run(tmp_path), df)
    monkeypatch.undo()

    _evaluate(tmp_path, model, plan, 6)  # a later eval: the Parquet copy is stale, the JSON files are read
    newer = paths["evals"].stat().st_mtime_ns + 1
    os.utime(tmp_path / "evals" / "step6" / "loss.json", ns=(newer, newer))
    assert pretrain_exp.load_run(tmp_path)["step"].tolist() == [2] * 5 + [4] * 5 + [6] * 5
    with pytest.raises(FileNotFoundError, match="no such directory"):
        pretrain_exp.load_run(tmp_path / "nope")
