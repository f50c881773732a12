"""Training a finished run further (``parent=<run dir>``, :mod:`pretrain_exp.app.parent`) through the CLI on real
tiny runs: the child starts at the parent's last global step from its final model, measures the parent's items
and controls at each of its segments, joins the parent's evaluated steps into one loss-over-steps curve, resumes,
and refuses what a continuation cannot change with one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pretrain_exp.insertion.plan import Plan
from tests.integration.test_release import run_module, tiny_run

pytestmark = pytest.mark.slow

PARENT_STEPS = 4  #: the parent trains steps 1..4 in two segments (tiny_run)


def continue_run(runs: Path, parent: Path, *overrides: str, check: bool = True):
    return run_module("pretrain_exp", f"parent={parent}", *overrides, "training.num_threads=1",
                      env={"PRETRAIN_EXP_RUNS": str(runs)}, check=check)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def parent(runs, tiny_model_dir) -> Path:
    return tiny_run(runs, "experiment=tiny")


@pytest.fixture(scope="module")
def child(runs, parent) -> tuple:
    proc = continue_run(runs, parent, "training.num_steps=4")
    return Path(proc.stdout.strip().splitlines()[-1].removeprefix("run dir: ")), proc


def test_child_starts_at_the_parents_last_step_from_its_final_model(parent, child):
    run_dir, proc = child
    cfg = json.loads((run_dir / "results.json").read_text())
    assert run_dir.name.startswith(f"tiny-tiny_llama-step{PARENT_STEPS}-seed0-")
    assert cfg["model"]["checkpoint_step"] == PARENT_STEPS
    assert Path(cfg["model"]["path"]) == parent / "checkpoints" / "checkpoint-4"
    assert cfg["parent"] == {"run_dir": str(parent), "run_name": parent.name, "step": PARENT_STEPS, "start_step": 0}
    # the window continues where the parent's ended; nothing is inserted again
    assert cfg["plan"]["window"] == [PARENT_STEPS * 8 * 128, (PARENT_STEPS + 4) * 8 * 128]
    assert cfg["plan"]["num_items"] == 0 and cfg["plan"]["experiments"] == []
    out = proc.stdout + proc.stderr
    assert f"parent: continuing {parent} from its final model at step {PARENT_STEPS}" in out
    assert "override: training.num_steps" not in out  # the parent trained 4 steps too: no override
    assert "override: training.num_threads=1 (the parent run has 0)" not in out  # both set it to 1


def test_child_measures_the_parents_items_at_each_segment(parent, child):
    run_dir, _ = child
    parent_plan = Plan.load(parent / "plan.npz")
    for step in (6, 8):
        rows = json.loads((run_dir / "evals" / f"step{step}" / "insertion_loss.json").read_text())["rows"]
        assert sorted(r["item_id"] for r in rows) == list(range(parent_plan.num_items))
        dups = {r["item_id"]: r["dup_count"] for r in rows}
        assert dups == {i: int(d) for i, d in enumerate(parent_plan.item_dup_count)}
    # the same items as the parent measured, scored by the child's models: the losses moved
    before = pd.read_parquet(parent / "evals.parquet")
    after = pd.read_parquet(run_dir / "evals.parquet")
    b = before[(before.step == PARENT_STEPS) & (before["eval"] == "insertion_loss")].set_index("item_id")["loss"]
    a = after[(after.step == 8) & (after["eval"] == "insertion_loss")].set_index("item_id")["loss"]
    assert list(a.index.sort_values()) == list(b.index.sort_values())
    assert not np.allclose(a.sort_index(), b.sort_index())


def test_results_join_parent_and_child_into_one_curve(parent, child):
    run_dir, _ = child
    res = json.loads((run_dir / "results.json").read_text())
    parent_res = json.loads((parent / "results.json").read_text())
    assert sorted(res["by_step"], key=int) == ["2", "4", "6", "8"]
    for step in ("2", "4"):  # the parent's own evaluations, as it recorded them
        assert res["by_step"][step] == parent_res["by_step"][step]
    curve = {s: res["by_step"][s]["insertion_loss"]["fictional_bios/dup4/mean_loss"] for s in res["by_step"]}
    assert len(set(curve.values())) == 4
    # the change since the parent's last step, tested against the controls
    assert {r["dup_count"] for r in res["did_effects"]} == {1, 4}
    assert all(r["baseline_step"] == PARENT_STEPS for r in res["did_effects"])
    assert (run_dir / "plots" / "loss_vs_step.png").stat().st_size > 10_000


def test_child_rerun_resumes_and_trains_nothing(runs, parent, child):
    run_dir, _ = child
    saved = {p: p.stat().st_mtime_ns for p in (run_dir / "evals").rglob("*.json")}
    log = run_dir / "pretrain_exp.log"
    trained = log.read_text().count("training steps")
    proc = continue_run(runs, parent, "training.num_steps=4")
    assert proc.stdout.strip().splitlines()[-1] == f"run dir: {run_dir}"
    assert trained == 2 and log.read_text().count("training steps") == trained
    assert f"resuming from {run_dir / 'checkpoints' / 'checkpoint-4'} (step 8)" in log.read_text()
    assert {p: p.stat().st_mtime_ns for p in (run_dir / "evals").rglob("*.json")} == saved


@pytest.mark.parametrize("overrides, line", [
    (["training.sequence_length=64"], "error: training.sequence_length: a continued run keeps its parent's value 128"),
    (["model=smollm2_135m"], "error: model: a continued run starts from its parent's final model"),
    (["insertion=fictional_bios_small"], "error: insertion.experiments.fictional_bios: the parent run"),
    (["framework=olmo_core"], "error: framework: the parent run"),
])
def test_refusals_are_one_line(runs, parent, overrides, line):
    proc = continue_run(runs, parent, *overrides, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith(line), lines[-3:]
    assert "Traceback" not in proc.stderr


def test_a_dir_that_is_no_finished_run_is_refused(runs, tmp_path):
    proc = continue_run(runs, tmp_path, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (f"error: parent: {tmp_path} is not a run dir (no "
                                                    "config.resolved.yaml); give the dir of a finished run (the last "
                                                    "line its command printed: run dir: ...)")
    assert "Traceback" not in proc.stderr
