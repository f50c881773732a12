"""End to end through the real CLI (``python -m pretrain_exp``) on real data: outputs, resume, eval-only, Hydra."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import CACHE_DIR, ROOT

TINY = ["experiment=tiny", "training.num_threads=1"]


def cli(*args: str, runs: Path, check: bool = True) -> subprocess.CompletedProcess:
    env = os.environ | {"PRETRAIN_EXP_RUNS": str(runs), "PRETRAIN_EXP_CACHE": str(CACHE_DIR), "WANDB_SILENT": "true"}
    proc = subprocess.run([sys.executable, "-m", "pretrain_exp", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


@pytest.mark.slow
def test_hydra_help_cfg_and_defaults_tree(tmp_path):
    out = cli("--help", runs=tmp_path).stdout
    groups = dict(line.strip().split(": ", 1) for line in out.splitlines() if line.startswith(
        ("insertion: ", "eval: ", "framework: ", "training: ")))
    assert set(groups["insertion"].split(", ")) == {p.stem for p in (ROOT / "conf" / "insertion").glob("*.yaml")}
    assert "insertion_loss" in groups["eval"] and groups["framework"] == "hf, olmo2, olmo_core"
    job = cli("--cfg", "job", runs=tmp_path).stdout
    assert "fictional_bios:" in job and "repetitions:" in job
    tree = cli("--info", "defaults-tree", runs=tmp_path).stdout
    assert "insertion: fictional_bios" in tree and "training: demo" in tree and "eval/memorization" in tree
    hydra_cfg = cli("--cfg", "hydra", runs=tmp_path).stdout
    assert "name: pretrain_exp" in hydra_cfg


@pytest.mark.slow
def test_tiny_run_writes_everything_and_resumes(tmp_path, tiny_model_dir):
    runs = tmp_path / "runs"
    proc = cli(*TINY, runs=runs)
    run_dir = runs / "tiny-tiny_llama-step0-seed0"
    assert proc.stdout.strip().splitlines()[-1] == f"run dir: {run_dir.resolve()}"
    for name in ("config.resolved.yaml", "plan.npz", "manifest.jsonl", "items.jsonl", "metrics.jsonl",
                 "results.json", "plots/loss_vs_dup.png", "plots/loss_vs_step.png", "pretrain_exp.log"):
        assert (run_dir / name).is_file(), name
    assert list((run_dir / "wandb").glob("offline-run-*")), "W&B offline run missing"
    assert sorted(p.name for p in (run_dir / "evals").iterdir()) == ["step12", "step4", "step8"]

    res = json.loads((run_dir / "results.json").read_text())
    assert res["step"] == 12
    rows = res["per_dup"]
    assert [r["dup_count"] for r in rows] == [0, 1, 4, 16]
    for r in rows:
        assert set(r) == {"experiment", "dup_count", "n_items", "mean_loss", "ci_low", "ci_high", "ci_method",
                          "small_n", "natural_items", "natural_exact", "effective_dup_mean"}
        assert r["ci_low"] <= r["mean_loss"] <= r["ci_high"] and r["n_items"] == 4
        assert r["ci_method"] == "t" and r["small_n"]  # 4 items per group: flagged
        assert r["natural_items"] == r["natural_exact"] == 0 and r["effective_dup_mean"] == r["dup_count"]
    assert res["audit"]["ngram"] == 13 and res["audit"]["window_tokens"] == 12 * 8 * 128
    assert res["audit"]["contaminated_controls"] == [] and "natural-duplicate audit (13-grams" in proc.stdout
    phases = json.loads((run_dir / "phases.json").read_text())  # where the time before the first step went
    names = [p["name"] for p in phases["phases"]]
    assert {"startup", "settings", "size index", "permutation", "items", "plan", "audit", "tracker"} <= set(names)
    assert phases["events"]["first step"]["step"] == 1
    assert phases["events"]["first step"]["at_s"] >= max(p["start_s"] + p["seconds"] for p in phases["phases"]
                                                         if p["name"] == "tracker")
    assert res["timing"]["phases"]["events"]["first step"]["step"] == 1

    # inspect: an item's placements and its loss at every evaluated step, from the run's eval outputs
    view = subprocess.run([sys.executable, "-m", "pretrain_exp.inspect", str(run_dir), "item=fictional_bios:0"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=os.environ | {"PRETRAIN_EXP_CACHE": str(CACHE_DIR)})
    assert view.returncode == 0, view.stderr
    for step in (4, 8, 12):
        rec = json.loads((run_dir / "evals" / f"step{step}" / "insertion_loss.json").read_text())
        loss = next(r["loss"] for r in rec["rows"] if r["item_id"] == 0)
        assert any(line.split("│")[1:3] == [f" {step:>4} ", f" {loss:>17.3f} "] for line in view.stdout.splitlines()
                   if line.count("│") >= 4), view.stdout

    manifest = [json.loads(line) for line in (run_dir / "manifest.jsonl").read_text().splitlines()]
    assert len(manifest) == res["plan"]["num_insertions"] == 4 * (1 + 4 + 16)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sorted({m["step"] for m in metrics if "train/loss" in m}) == list(range(1, 13))
    assert any("eval/insertion_loss/fictional_bios/dup16/mean_loss" in m for m in metrics)

    # the same command again: nothing left to train, same results
    weights = (run_dir / "checkpoints" / "checkpoint-12" / "model.safetensors").stat().st_mtime_ns
    again = cli(*TINY, runs=runs)
    assert "training steps" not in again.stderr + again.stdout
    assert (run_dir / "checkpoints" / "checkpoint-12" / "model.safetensors").stat().st_mtime_ns == weights
    assert json.loads((run_dir / "results.json").read_text())["per_dup"] == rows

    # a changed training config gets its own run dir by name; forced into the same run dir it is refused
    # (nothing trained on a mismatched plan)
    bad = cli(*TINY, "insertion.experiments.fictional_bios.num_items=4", f"hydra.run.dir={run_dir}", runs=runs,
              check=False)
    assert bad.returncode == 2 and "started with different settings" in bad.stderr, bad.stderr[-2000:]


@pytest.mark.slow
def test_eval_only_and_eval_on_load(tmp_path, tiny_model_dir):
    runs = tmp_path / "runs"
    cli(*TINY, "training.num_steps=0", "name=evalonly", runs=runs)
    run_dir = runs / "evalonly-tiny_llama-step0-seed0"
    res = json.loads((run_dir / "results.json").read_text())
    assert res["step"] == 0 and not (run_dir / "checkpoints").exists()
    assert res["plan"]["num_insertions"] == 0  # an empty window holds no insertions
    assert [(r["dup_count"], r["n_items"]) for r in res["per_dup"]] == [(0, 16)]  # so every item is a control
    cli(*TINY, "eval.on_load=true", "training.num_steps=4", "name=onload", "wandb.add_step_to_name=true",
        "insertion.experiments.fictional_bios.repetitions=[0,1,2,4]", runs=runs)
    res = json.loads((runs / "onload-tiny_llama-step0-seed0" / "results.json").read_text())
    assert sorted(res["by_step"]) == ["0", "4"]


@pytest.mark.slow
def test_demo_shows_memorization_by_dup_count(tmp_path):
    """The acceptance criterion of the default experiment: mean loss falls as the dup count rises, and the
    dup-16 CI lies below the dup-0 CI (SmolLM2-135M on Shakespeare, CPU). The default training with only the eval
    these figures come from (memorization, perplexity and W&B offline runs are tested on the tiny model), on one
    torch thread: ``make test`` runs two workers on a 2-core box, and two threads each made this test 3x slower."""
    runs = tmp_path / "runs"
    cli("eval=[insertion_loss]", "wandb=disabled", "training.num_threads=1", runs=runs)
    res = json.loads((runs / "default-smollm2_135m-step0-seed0" / "results.json").read_text())
    rows = {r["dup_count"]: r for r in res["per_dup"]}
    assert sorted(rows) == [0, 1, 4, 16]
    means = [rows[d]["mean_loss"] for d in (0, 1, 4, 16)]
    assert np.all(np.diff(means) < 0), means
    assert rows[16]["ci_high"] < rows[0]["ci_low"]


@pytest.mark.slow
def test_cleanup_of_bulky_files_and_of_the_whole_run_dir(tmp_path, tiny_model_dir):
    runs = tmp_path / "runs"
    short = ["training.num_steps=4", "training.keep_last_checkpoints=0", "eval=[insertion_loss]",
             "insertion.experiments.fictional_bios.repetitions=[0,1,2,4]", "wandb=disabled"]
    cli(*TINY, *short, "name=bulky", "training.cleanup=bulky", runs=runs)
    ckpts = runs / "bulky-tiny_llama-step0-seed0" / "checkpoints"
    assert [p.name for p in ckpts.iterdir()] == ["checkpoint-4"]
    kept = {p.name for p in (ckpts / "checkpoint-4").iterdir()}
    assert "model.safetensors" in kept and not any(n.startswith(("optimizer", "rng_state", "scheduler")) for n in kept)
    assert (runs / "bulky-tiny_llama-step0-seed0" / "results.json").is_file()
    proc = cli(*TINY, *short, "name=gone", "training.cleanup=all", runs=runs)
    assert "fictional_bios" in proc.stdout  # the table was printed before the run dir went away
    assert not (runs / "gone-tiny_llama-step0-seed0").exists()


@pytest.mark.slow
def test_a_sweep_of_three_seeds_audits_once(tmp_path, tiny_model_dir):
    """``-m seed=0,1,2`` over the same rows (a fixed data order) and the same items (the sample texts): the first
    job audits beside training and puts the audit into the cache, the other two read it; all three record the same
    counts."""
    cache = tmp_path / "cache"  # the assets of the test cache, and an audit cache of this test's own
    cache.mkdir()
    for entry in CACHE_DIR.iterdir():
        if entry.name != "audits":
            (cache / entry.name).symlink_to(entry)
    env = os.environ | {"PRETRAIN_EXP_RUNS": str(tmp_path / "runs"), "PRETRAIN_EXP_CACHE": str(cache),
                        "WANDB_SILENT": "true"}
    proc = subprocess.run([sys.executable, "-m", "pretrain_exp", "-m", "seed=0,1,2", *TINY, "insertion=texts",
                           "data.seed=0", "training.checkpoint_interval=12", "wandb=disabled", "eval=[insertion_loss]"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logs = sorted((tmp_path / "runs" / "sweeps").glob("*/*/pretrain_exp.log"))
    assert len(logs) == 3
    started = [log.read_text().count("beside training (process") for log in logs]
    reused = [log.read_text().count("audit: reused") for log in logs]
    assert started == [1, 0, 0] and reused == [0, 1, 1], (started, reused)
    assert len(list((cache / "audits").glob("*.json"))) == 1

    def counts(audit):  # what the audit found per item (the dup counts are each seed's own)
        return [{k: v for k, v in it.items() if "dup_count" not in k} for it in audit["items"]]

    audits = [json.loads(p.read_text()) for p in sorted((tmp_path / "runs" / "sweeps").glob("*/*/audit.json"))]
    assert len(audits) == 3 and counts(audits[0]) == counts(audits[1]) == counts(audits[2])
    results = [json.loads(p.read_text()) for p in sorted((tmp_path / "runs" / "sweeps").glob("*/*/results.json"))]
    assert len(results) == 3 and all(r["audit"]["window_tokens"] == audits[0]["window_tokens"] and
                                     r["audit"]["contaminated_controls"] == [] for r in results)
    assert all(all("natural_exact" in row for row in r["per_dup"]) for r in results)
