"""Run dirs keep experiments apart (issue: a second experiment collided with the first one's run dir)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pretrain_exp.app.run_name import run_suffix
from pretrain_exp.app.run_record import (
    RunDirConflict,
    RunRecord,
    check_same_run,
    record_run,
    recorded_form,
    save_resolved_config,
)
from pretrain_exp.core.errors import ConfigError
from tests.conftest import make_config, run_entry_point


def _run_dir_of(monkeypatch, tmp_path, *argv) -> Path:
    """The run dir the entry point picks for ``argv`` (``experiment.run`` replaced: nothing is trained)."""
    seen = []
    run_entry_point(monkeypatch, tmp_path, argv, lambda cfg: seen.append(Path(cfg.run_dir)) or {}, exits=False)
    return seen[0]


def test_another_experiment_gets_its_own_run_dir_and_the_same_command_the_same(monkeypatch, tmp_path):
    tiny = _run_dir_of(monkeypatch, tmp_path, "experiment=tiny", "wandb=disabled")
    assert tiny.name == "tiny-tiny_llama-step0-seed0"  # no training override: the plain name
    texts = ("experiment=tiny", "insertion=texts", "insertion.experiments.texts.file=items.jsonl")
    first = _run_dir_of(monkeypatch, tmp_path, *texts)
    assert first != tiny and first.name.startswith("tiny-tiny_llama-step0-seed0-texts-")
    assert _run_dir_of(monkeypatch, tmp_path, *reversed(texts), "eval=[insertion_loss]") == first  # resumes
    other = _run_dir_of(monkeypatch, tmp_path, "experiment=tiny", "insertion=texts",
                        "insertion.experiments.texts.file=other.jsonl")
    assert other != first
    assert _run_dir_of(monkeypatch, tmp_path, "experiment=tiny", "training.num_steps=3", "name=mine").name == \
        "mine-tiny_llama-step0-seed0"  # a name the user gave is the name


def test_run_suffix_ignores_what_may_change_on_resume():
    assert run_suffix(["seed=1", "eval=[perplexity]", "wandb=disabled", "training.num_threads=1",
                       "hydra/launcher=slurm", "experiment=tiny", "+eval.tasks.x.type=perplexity"]) == ""
    a = run_suffix(["framework=olmo2", "training.num_steps=4"])
    assert a == run_suffix(["training.num_steps=4", "framework=olmo2"]) and a.startswith("-olmo2-")
    assert run_suffix(["training.num_steps=4"]) != run_suffix(["training.num_steps=5"])
    assert run_suffix(["insertion=[fictional_bios,tokens]"]).startswith("-fictional_bios+tokens-")


def test_a_conflicting_run_dir_says_in_plain_words_what_differs(tmp_path):
    save_resolved_config(make_config("experiment=tiny", run_dir=tmp_path), tmp_path)
    texts = make_config("experiment=tiny", "insertion=texts", run_dir=tmp_path)
    with pytest.raises(ConfigError) as ei:
        check_same_run(tmp_path, recorded_form(texts))
    msg = str(ei.value)
    assert "this run adds experiment `texts`" in msg and "drops experiment `fictional_bios`" in msg
    assert "name=" in msg and "\n" not in msg
    steps = make_config("experiment=tiny", "training.num_steps=3", run_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"training.num_steps changes \(12 -> 3\)"):
        check_same_run(tmp_path, recorded_form(steps))


def test_recording_a_run_refuses_another_run_and_writes_nothing(tmp_path):
    """:func:`~pretrain_exp.app.run_record.record_run` checks the run dir before it writes: a refused config leaves
    the dir's ``config.resolved.yaml`` as it was; the same run (a change of a mutable key only) is recorded anew."""
    record = record_run(make_config("experiment=tiny", run_dir=tmp_path / "run"), tmp_path / "run")
    assert record == RunRecord(tmp_path / "run" / "config.resolved.yaml", False)
    before = record.config.read_bytes()
    with pytest.raises(RunDirConflict, match=r"training.num_steps changes \(12 -> 3\)"):
        record_run(make_config("experiment=tiny", "training.num_steps=3", run_dir=tmp_path / "run"), tmp_path / "run")
    assert record.config.read_bytes() == before
    record_run(make_config("experiment=tiny", "training.max_retries=7", run_dir=tmp_path / "run"), tmp_path / "run")
    assert "max_retries: 7" in record.config.read_text()


def test_a_scratch_model_from_a_config_path_names_its_run_dir_by_the_file_not_the_path(monkeypatch, tmp_path):
    """``model=scratch model.config=/abs/path/x.json``: the run dir is one folder under the runs dir, named after
    the file (a ``/`` in the name made nested dirs and a run name with the whole path)."""
    config = tmp_path / "cfgs" / "hf-olmo2_1B_v2-config.json"
    run_dir = _run_dir_of(monkeypatch, tmp_path, "model=scratch", "framework=hf", f"model.config={config}",
                          "wandb=disabled")
    assert run_dir.parent == tmp_path / "runs"
    assert run_dir.name.startswith("default-scratch-hf-olmo2_1B_v2-config-step0-seed0")
    builder = _run_dir_of(monkeypatch, tmp_path, "experiment=scratch_olmo_core", "wandb=disabled")
    assert builder.name == "scratch_olmo_core-scratch-olmo2_14M-step0-seed0"  # a builder name stays as it is
