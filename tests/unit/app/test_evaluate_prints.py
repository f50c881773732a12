"""``pretrain-exp-eval RUN_DIR eval=...`` prints what was asked: one table per requested eval and evaluated step,
each saying whether it was computed now or read from disk; a closed-loop run is re-evaluated like any other; a step
whose checkpoint is gone names the option that would have kept it (issue: re-evaluation printed the run's
insertion-loss table again, refused closed-loop runs, and advised re-running to train more)."""

from __future__ import annotations

import json

import pytest

from pretrain_exp import load_run, load_sweep
from pretrain_exp.app.evaluate import gone_checkpoint_hint, main
from pretrain_exp.app.launch import launch
from pretrain_exp.core.rundir import RunDir
from tests.conftest import make_config

#: a tiny run of two segments (steps 2 and 4); only the last checkpoint is kept (training.keep_last_checkpoints=1)
TINY = ("experiment=tiny", "training.num_steps=4", "training.checkpoint_interval=2", "wandb=disabled",
        "insertion.experiments.fictional_bios.repetitions=[0,1,2,4]")


def _mtimes(run_dir, name):
    return {p: p.stat().st_mtime_ns for p in (run_dir / "evals").rglob(name)}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tiny_model_dir, one_torch_thread):
    """A finished tiny run (default evals: insertion_loss, memorization, perplexity) holding checkpoint 4 only."""
    run_dir = tmp_path_factory.mktemp("evaluate_prints") / "run"
    launch(make_config(*TINY, run_dir=run_dir))
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["checkpoint-4"]
    return run_dir


@pytest.mark.slow
def test_requested_evals_are_printed_and_marked_computed_or_read(tiny_run, capsys):
    capsys.readouterr()
    main([str(tiny_run), "eval=[mia,perplexity]"])
    out = capsys.readouterr().out
    lines = out.splitlines()
    mia = json.loads((tiny_run / "evals" / "step4" / "mia.json").read_text())
    ppl = json.loads((tiny_run / "evals" / "step4" / "perplexity.json").read_text())
    assert "mia at step 4: computed now" in out and "perplexity at step 4: read from disk" in out
    assert "evals/step4/perplexity.json: kept (--redo recomputes)" in out and "saved to evals/step4/mia.json" in out
    assert "insertion loss at step" not in out  # the run's own table is not what was asked
    # MIA: one row per experiment, dup count and score: AUC, its interval (method named) and p
    assert "95% CI (Newcombe score)" in out and "p (exact randomization)" in out and "p (Holm)" in out
    cells = [[c.strip() for c in ln.split("│")[1:-1]] for ln in lines if ln.startswith("│")]
    for r in mia["per_dup"]:
        row = next(c for c in cells if c[:3] == [r["experiment"], str(r["dup_count"]), r["score"]])
        assert row[4:7] == [f"{r['auc']:.3f}", f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}]", f"{r['p_value']:.3f}"]
    assert f"{ppl['metrics']['held_out/perplexity']:.2f}" in out
    assert lines[-1] == f"run dir: {tiny_run.resolve()}"

    # written where load_run / load_sweep read them: MIA's per-item rows, the perplexity of the last step
    rows = load_run(tiny_run)
    assert set(rows.loc[rows["eval"] == "mia", "step"]) == {4}
    assert len(rows[rows["eval"] == "mia"]) == len(mia["rows"]) > 0
    sweep = load_sweep(tiny_run)
    assert sweep["perplexity/held_out/perplexity"].iloc[0] == pytest.approx(ppl["metrics"]["held_out/perplexity"])

    main([str(tiny_run), "eval=[perplexity,memorization,insertion_loss]", "--redo"])
    out = capsys.readouterr().out
    assert "perplexity at step 4: computed now" in out and "read from disk" not in out
    mem = json.loads((tiny_run / "evals" / "step4" / "memorization.json").read_text())["per_dup"]
    assert "95% CI (Wilson)" in out and "fraction matched" in out
    assert all(f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}]" in out for r in mem)  # exact match: Wilson
    loss = json.loads((tiny_run / "evals" / "step4" / "insertion_loss.json").read_text())["per_dup"]
    assert "95% CI (t)" in out and all(f"{r['mean_loss']:.3f}" in out for r in loss)


@pytest.mark.slow
def test_a_step_whose_checkpoint_is_gone_names_the_option_that_keeps_it(tiny_run, capsys):
    capsys.readouterr()
    with pytest.raises(SystemExit) as ei:
        main([str(tiny_run), "--steps", "2"])
    err = capsys.readouterr().err.strip()
    assert ei.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("error: --steps:")
    assert "training.keep_last_checkpoints=0" in err and "step(s) 2 is gone" in err
    assert "training.export_hf=every" in err  # every framework keeps each segment's HF model with it

    with pytest.raises(SystemExit) as ei:
        main([str(tiny_run), "--steps", "3"])
    err = capsys.readouterr().err
    assert ei.value.code == 2 and "step(s) 3 end no segment" in err and "keep_last_checkpoints" not in err


def test_the_hint_names_export_hf_and_cleanup(tmp_path):
    cfg = make_config("framework=olmo_core", "training.checkpoint_interval=2", run_dir=tmp_path)
    hint = gone_checkpoint_hint(cfg, [2, 4], [2])
    assert "training.keep_last_checkpoints=0" in hint and "training.export_hf=every" in hint
    cfg = make_config("experiment=tiny", "training.cleanup=bulky", run_dir=tmp_path)
    hint = gone_checkpoint_hint(cfg, [4, 8, 12], [4])
    assert "training.cleanup=bulky deleted" in hint and "training.cleanup=none" in hint
    hint = gone_checkpoint_hint(cfg, [4, 8, 12], [0])
    assert "initial model" in hint and "eval.on_load=true" in hint and "segment" not in hint


@pytest.mark.slow
def test_only_eval_settings_change_and_the_error_says_so_plainly(tiny_run, capsys):
    capsys.readouterr()
    with pytest.raises(SystemExit) as ei:
        main([str(tiny_run), "training.num_steps=8"])
    err = capsys.readouterr().err
    assert ei.value.code == 2 and "training.num_steps" in err
    assert "changes only eval and wandb settings" in err and "train more" not in err and "re-run" not in err


@pytest.mark.slow
def test_a_closed_loop_run_is_reevaluated_with_other_evals(tmp_path, tiny_model_dir, one_torch_thread, capsys):
    run_dir = tmp_path / "loop"
    launch(make_config(*TINY, "eval.on_load=true", "+insertion/dynamic=until_memorized",
                       "insertion.dynamic.threshold=10.3",
                       "insertion.experiments.fictional_bios.repetitions=[0,1]", run_dir=run_dir))
    config = RunDir(run_dir).config.read_text()
    losses = _mtimes(run_dir, "insertion_loss.json")
    capsys.readouterr()

    main([str(run_dir), "eval=[mia]"])
    out = capsys.readouterr().out
    assert "mia at step 0: computed now" in out and "mia at step 4: computed now" in out
    assert "outcome-selected" in out  # the closed loop's dup counts are the policy's
    assert {p.parent.name for p in (run_dir / "evals").rglob("mia.json")} == {"step0", "step4"}
    res = json.loads((run_dir / "results.json").read_text())
    assert res["dynamic"]["policy"] == "until_memorized" and res["dynamic"]["items"]
    assert "mia" in res["by_step"]["4"] and "insertion_loss" in res["by_step"]["4"]

    main([str(run_dir), "eval=[mia]", "--redo"])  # the loop's own task is not evaluated again
    assert "mia at step 4: computed now" in capsys.readouterr().out
    assert _mtimes(run_dir, "insertion_loss.json") == losses
    assert RunDir(run_dir).config.read_text() == config


@pytest.mark.slow
def test_knowledge_and_lm_eval_tables(tmp_path, tiny_model_dir, one_torch_thread, capsys):
    from lm_eval.api.metrics import mean_stderr, pooled_sample_stderr

    run_dir = tmp_path / "facts"
    launch(make_config("experiment=tiny", "insertion=none", "+insertion@insertion.experiments.facts=knowledge",
                       "insertion.experiments.facts.num_items=16",
                       "insertion.experiments.facts.repetitions=[0,1]", "training.num_steps=2",
                       "training.checkpoint_interval=2", "eval=[knowledge]", "wandb=disabled",
                       run_dir=run_dir))
    capsys.readouterr()
    main([str(run_dir), "eval=[knowledge,lm_eval]", "eval.tasks.lm_eval.tasks=[arc_easy,mmlu]",
          "eval.tasks.lm_eval.limit=2"])
    out = capsys.readouterr().out
    cells = [[c.strip() for c in ln.split("│")[1:-1]] for ln in out.splitlines() if ln.startswith("│")]
    assert "knowledge at step 2: read from disk" in out and "lm_eval at step 2: computed now" in out
    know = json.loads((run_dir / "evals" / "step2" / "knowledge.json").read_text())["per_dup"]
    for r in know:  # per dup count and probe kind: mean over facts with its interval
        row = next(c for c in cells if c[:3] == ["facts", str(r["dup_count"]), r["probe"]])
        assert row[3:6] == [str(r["n_facts"]), f"{r['logp_sum']:.3f}", f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}]"]
        assert row[6:8] == [f"{r['logp_mean']:.3f}",
                            f"[{r['logp_mean_ci_low']:.3f}, {r['logp_mean_ci_high']:.3f}]"]
    lm = json.loads((run_dir / "evals" / "step2" / "lm_eval.json").read_text())
    arc = next(r for r in lm["rows"] if r["task"] == "arc_easy")
    k = round(arc["acc"] * arc["n_docs"])  # lm-eval's own stderr of the task's 0/1 scores
    se = mean_stderr([1.0] * k + [0.0] * (arc["n_docs"] - k))
    assert ["arc_easy", "validation", "2", "acc", f"{arc['acc']:.4f}", f"{se:.4f}"] in cells
    subjects = [r for r in lm["rows"] if r["task"].startswith("mmlu_")]
    ses = [mean_stderr([1.0] * round(r["acc"] * r["n_docs"]) + [0.0] * (r["n_docs"] - round(r["acc"] * r["n_docs"])))
           for r in subjects]
    pooled = pooled_sample_stderr(ses, [r["n_docs"] for r in subjects])
    docs = sum(r["n_docs"] for r in subjects)
    assert ["mmlu", "test", str(docs), "acc", f"{lm['metrics']['mmlu/acc']:.4f}", f"{pooled:.4f}"] in cells
    assert not any(c[0].startswith("mmlu_") for c in cells)  # the group's row stands for its tasks
