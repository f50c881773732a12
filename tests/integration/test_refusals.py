"""Every refusal to reuse a run dir, as a table: what triggers it, and the one ``error:`` line it gives, which names
what differs (a config key old -> new, an input file whose content changed) and the one way out, a run dir of
its own (``name=<new name>``). Each case runs the real entry point (``pretrain-exp``, ``pretrain-exp-eval``, a
sweep) in this process on one tiny run started once (no training steps, no evals)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

import pretrain_exp.app.experiment as experiment
from pretrain_exp.core.errors import CheckpointError
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.core.runlock import process_start
from pretrain_exp.insertion.plan import Plan
from tests.conftest import CACHE_DIR, run_entry_point

pytestmark = pytest.mark.slow

NAME = "myexp"
RUN = f"{NAME}-tiny_llama-step0-seed0"
SAMPLE = Path(experiment.__file__).parents[1] / "insertion" / "types" / "sample_texts.jsonl"


@dataclasses.dataclass
class Started:
    """A run started with ``argv`` under the runs dir ``root/runs`` (its items file ``items``)."""

    root: Path
    items: Path
    argv: list

    @property
    def run_dir(self) -> Path:
        return self.root / "runs" / RUN


@pytest.fixture(scope="module")
def started(tmp_path_factory) -> Started:
    root = tmp_path_factory.mktemp("refusals")
    items = root / "items.jsonl"
    items.write_text("".join(SAMPLE.read_text().splitlines(keepends=True)[:8]))
    argv = ["experiment=tiny", "insertion=texts", f"insertion.experiments.texts.file={items}", f"name={NAME}",
            "training.num_steps=0", "eval=[]", "wandb=disabled", "insertion.audit=off", f"cache_dir={CACHE_DIR}"]
    with pytest.MonkeyPatch.context() as mp:
        assert run_entry_point(mp, root, argv, experiment.run, exits=False) is None
    assert RunDir(root / "runs" / RUN).plan.is_file()
    return Started(root, items, argv)


@contextlib.contextmanager
def edited(path: Path):
    """``path`` with its first text changed, restored afterwards."""
    before = path.read_text()
    rows = before.splitlines()
    rows[0] = json.dumps({"text": "Edited. " + json.loads(rows[0])["text"]})
    path.write_text("\n".join(rows) + "\n")
    try:
        yield
    finally:
        path.write_text(before)


def cli(mp, s: Started, *argv) -> int:
    return run_entry_point(mp, s.root, list(argv), experiment.run)


def config_changed(mp, s):
    return cli(mp, s, *s.argv, "training.num_steps=3")


def config_changed_in_a_pinned_run_dir(mp, s):
    return cli(mp, s, *s.argv, "training.num_steps=3", f"hydra.run.dir={s.run_dir}")


def items_file_changed(mp, s):
    with edited(s.items):
        return cli(mp, s, *s.argv)


def items_file_changed_eval(mp, s):
    from pretrain_exp.app.evaluate import main

    with edited(s.items), pytest.raises(SystemExit) as e:
        main([str(s.run_dir)])
    return e.value.code


def plan_changed(mp, s):
    other = s.root / "runs" / "planx-tiny_llama-step0-seed0"
    shutil.rmtree(other, ignore_errors=True)
    shutil.copytree(s.run_dir, other)
    plan = Plan.load(RunDir(other).plan)
    dataclasses.replace(plan, item_dup_count=plan.item_dup_count + 1).save(RunDir(other).plan)
    return cli(mp, s, *s.argv, "name=planx")


def additions_of_another_plan(mp, s):
    from pretrain_exp.insertion.dynamic import apply_additions

    plan = Plan.load(RunDir(s.run_dir).plan)
    with pytest.raises(CheckpointError) as e:
        apply_additions(plan, {"plan_digest": "0" * 64, "item_ids": [], "positions": []}, "dynamic/step4.json")
    print(f"error: {e.value}", file=sys.stderr)  # as the entry points print it
    return 2


def run_dir_in_use(mp, s):
    lock = s.run_dir / RunDir.LOCK
    holder = os.getppid()  # a live process that is not this one
    lock.write_text(json.dumps({"host": os.uname().nodename, "pid": holder, "start": process_start(holder),
                                "slurm_job": None, "slurm_restart": None, "taken": 0}))
    try:
        return cli(mp, s, *s.argv)
    finally:
        lock.unlink()


def sweep_first_job(mp, s):
    sweep = s.root / "sweep"
    (sweep / "0").mkdir(parents=True, exist_ok=True)
    shutil.copy(RunDir(s.run_dir).config, RunDir(sweep / "0").config)
    return cli(mp, s, "-m", *s.argv, "training.num_steps=3", "seed=0,1", f"hydra.sweep.dir={sweep}")


#: (the refusal, what triggers it, what its line says besides the way out)
REFUSALS = [
    ("config", config_changed, [f"{RUN} holds another run", "training.num_steps changes (0 -> 3)",
                                "re-run its own command to resume that run", "give this run its own run dir: "
                                "name=<new name>"]),
    ("config, hydra.run.dir", config_changed_in_a_pinned_run_dir,
     ["training.num_steps changes (0 -> 3)",
      "give this run its own run dir: hydra.run.dir=<another dir> (or drop hydra.run.dir and set name=<new name>)"]),
    ("items file", items_file_changed,
     ["insertion.experiments.texts.file: the items file {items} changed content since the run in {run_dir} started",
      "restore its content to resume that run, or give this run its own run dir: name=<new name>"]),
    ("items file, pretrain-exp-eval", items_file_changed_eval,
     ["insertion.experiments.texts.file: the items file {items} changed content since the run in {run_dir} started",
      "restore its content to evaluate that run", "in a run dir of its own: name=<new name>"]),
    ("plan", plan_changed, ["insertion: ", "plan.npz holds another plan than this config gives, though the config "
                            "and the items are the same", "give this run its own run dir: name=<new name>"]),
    ("dynamic additions", additions_of_another_plan,
     ["dynamic/step4.json: decided on another plan than this config's",
      "give this run its own run dir: name=<new name>"]),
    ("run dir in use", run_dir_in_use, [f"{RUN} is in use by pid {os.getppid()}", "wait for it to end, or give "
                                        "this run its own run dir: name=<new name>"]),
    ("sweep", sweep_first_job, ["sweep/0 holds another run", "training.num_steps changes (0 -> 3)",
                                "give this sweep its own dir: hydra.sweep.dir=<another dir> (or drop hydra.sweep.dir "
                                "and set name=<new name>)", "nothing was launched"]),
]


@pytest.mark.parametrize("trigger, says", [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_every_refusal_names_what_differs_and_the_one_way_out(started, monkeypatch, capsys, trigger, says):
    assert trigger(monkeypatch, started) == 2
    errors = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, errors
    for part in says:
        part = part.format(items=started.items, run_dir=started.run_dir)
        assert part in errors[0], f"{part!r} not in {errors[0]!r}"
    assert "name=<new name>" in errors[0]
