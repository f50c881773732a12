"""Bad input through the real command line (a subprocess): exit 2, one ``error: ...`` line, no run dir left."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from tests.bad_input import CACHE, REPO, write_jsonl
from tests.conftest import CHECKOUT_PYTHONPATH


def cli(tmp_path, *overrides, timeout=600):
    """``python -m pretrain_exp ...`` with the runs root ``tmp_path/runs``; returns the CompletedProcess."""
    env = {**os.environ, "PRETRAIN_EXP_RUNS": str(tmp_path / "runs"), "PRETRAIN_EXP_CACHE": str(CACHE),
           "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "PYTHONPATH": CHECKOUT_PYTHONPATH}
    return subprocess.run([sys.executable, "-m", "pretrain_exp", *overrides], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def assert_no_run_dir(tmp_path):
    runs = tmp_path / "runs"
    left = [str(p.relative_to(runs)) for p in runs.rglob("*")] if runs.exists() else []
    assert left == [], f"left behind: {left}"


def assert_user_error(proc, *needles):
    """Exit 2 and exactly one stderr line ``error: ...`` naming every needle."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("error: ")
    for n in needles:
        assert n in lines[0], f"{n!r} not in {lines[0]!r}"


@pytest.mark.slow
def test_cli_hydra_rejects_wrong_type_and_typo(tmp_path):
    proc = cli(tmp_path, "experiment=tiny", "training.num_steps=abc")
    assert_user_error(proc, "training.num_steps", "abc")
    proc = cli(tmp_path, "experiment=tiny", "insertion.experiments.fictional_bios.repetitons=2")
    assert_user_error(proc, "insertion.experiments.fictional_bios.repetitons",
                      "did you mean insertion.experiments.fictional_bios.repetitions?")
    assert_no_run_dir(tmp_path)


@pytest.mark.slow
def test_cli_unknown_framework(tmp_path):
    proc = cli(tmp_path, "experiment=tiny", "framework=foo")
    assert_user_error(proc, "framework=foo", "hf, olmo2, olmo_core")
    proc = cli(tmp_path, "experiment=tiny", "framework.name=foo")
    assert_user_error(proc, "framework.name", "'foo'", "'hf'")
    assert_no_run_dir(tmp_path)


@pytest.mark.slow
def test_cli_missing_required_value(tmp_path):
    proc = cli(tmp_path, "insertion=tokens")
    assert_user_error(proc, "insertion.experiments.tokens.file")
    assert_no_run_dir(tmp_path)


@pytest.mark.slow
def test_cli_missing_checkpoint(tmp_path):
    empty = tmp_path / "empty_model"
    empty.mkdir()
    proc = cli(tmp_path, "experiment=tiny", "model=local", f"model.path={empty}")
    assert_user_error(proc, f"model.path={empty}", "missing checkpoint", "config.json")
    assert_no_run_dir(tmp_path)


@pytest.mark.slow
def test_cli_malformed_items_file(tmp_path, tiny_model_dir):
    """Fails while planning (after the model, tokenizer and corpus are ready): no run dir, so no plan.npz.
    (``tiny_model_dir`` builds the model asset first, so its one-time conversion output is not on this stderr.)"""
    docs = tmp_path / "docs"
    docs.mkdir()
    rng = np.random.default_rng(0)
    words = ["river", "lantern", "copper", "morning", "harbour", "quiet", "stone", "garden", "letter"]
    for i in range(3):
        (docs / f"doc{i}.txt").write_text(" ".join(rng.choice(words, size=1500)))
    items = write_jsonl(tmp_path / "items.jsonl", [{"text": "a fine item"}, '{"text": "broken"'])
    proc = cli(tmp_path, "model=tiny_llama", "training=tiny", "training.num_steps=1", "data=text",
               f"data.text={docs}", "data.held_out_rows=0", "data.token_dir=" + str(tmp_path / "tokens"),
               "insertion=texts", f"insertion.experiments.texts.file={items}", "wandb=disabled")
    assert_user_error(proc, f"{items}:2", "malformed JSON")
    assert_no_run_dir(tmp_path)
    assert not list(tmp_path.rglob("plan.npz"))
    (tok_dir,) = [p for p in (tmp_path / "tokens").iterdir() if not p.name.endswith(".lock")]  # no temp folders
    assert (tok_dir / "tokens.json").is_file() and not tok_dir.name.startswith(".")
