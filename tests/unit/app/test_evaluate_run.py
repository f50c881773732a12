"""``pretrain-exp-eval RUN_DIR eval=...``: an existing run's checkpoints evaluated with other evals, its training
untouched (issue: ``training.num_steps=0`` on a trained run dir was refused, the working route undocumented)."""

from __future__ import annotations

import json

import pytest

from pretrain_exp.app.evaluate import main
from pretrain_exp.app.launch import launch
from tests.conftest import make_config


@pytest.mark.slow
def test_a_runs_checkpoints_are_evaluated_with_other_evals(tmp_path, tiny_model_dir, one_torch_thread, capsys):
    run_dir = tmp_path / "run"
    launch(make_config("experiment=tiny", "training.num_steps=4", "training.checkpoint_interval=2",
                       "training.keep_last_checkpoints=0", "eval=[insertion_loss]", "wandb=disabled",
                       "insertion.experiments.fictional_bios.repetitions=[0,1,2,4]", run_dir=run_dir))
    ckpts = {p: p.stat().st_mtime_ns for p in (run_dir / "checkpoints").rglob("*") if p.is_file()}
    before = json.loads((run_dir / "results.json").read_text())
    capsys.readouterr()

    with pytest.raises(SystemExit) as ei:  # training settings are the run's
        main([str(run_dir), "training.num_steps=8"])
    assert ei.value.code == 2 and "training.num_steps" in capsys.readouterr().err

    main([str(run_dir), "eval=[perplexity]"])
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"run dir: {run_dir.resolve()}"
    for step in (2, 4):
        rec = json.loads((run_dir / "evals" / f"step{step}" / "perplexity.json").read_text())
        assert rec["step"] == step and rec["metrics"]["held_out/perplexity"] > 1
        assert (run_dir / "evals" / f"step{step}" / "insertion_loss.json").is_file()
    assert {p: p.stat().st_mtime_ns for p in (run_dir / "checkpoints").rglob("*") if p.is_file()} == ckpts
    res = json.loads((run_dir / "results.json").read_text())
    assert res["per_dup"] == before["per_dup"]  # the run's own tables stay
    assert set(res["by_step"]["2"]) == {"insertion_loss", "perplexity"} and res["steps_evaluated_now"] == [2, 4]

    with pytest.raises(SystemExit) as ei:
        main([str(run_dir), "--steps", "3"])
    err = capsys.readouterr().err
    assert ei.value.code == 2 and "no checkpoint of step(s) [3]" in err and "it holds: 2, 4" in err
