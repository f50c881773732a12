"""The pieces of ``eval.mode=async`` (:mod:`pretrain_exp.app.async_eval`): the linked model dir, where the eval
processes run, what the report calls pending, and the config rules."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from pretrain_exp.app.async_eval import link_model_files, resolve_launcher, run_launcher, slurm_parameters
from pretrain_exp.core.config import EvalMode
from pretrain_exp.core.errors import ConfigError
from pretrain_exp.report.pending import MARKER, describe_pending, pending_evals
from tests.conftest import make_config


def test_linked_model_dir_holds_the_model_not_the_optimizer(tmp_path):
    ckpt = tmp_path / "checkpoints" / "checkpoint-4"
    ckpt.mkdir(parents=True)
    for name in ("model.safetensors", "config.json", "tokenizer.json", "optimizer.pt", "scheduler.pt",
                 "rng_state.pth", "trainer_state.json", "training_args.bin"):
        (ckpt / name).write_text(name)
    out = link_model_files(ckpt, tmp_path / "hf" / "step4")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert os.path.samefile(out / "model.safetensors", ckpt / "model.safetensors")  # a link, not a copy
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temp dir left
    (ckpt / "model.safetensors").unlink()  # the checkpoint may go (keep_last_checkpoints); the eval's copy stays
    assert (out / "model.safetensors").read_text() == "model.safetensors"
    (ckpt / "config.json").write_text("changed")
    assert link_model_files(ckpt, out) == out  # an existing dir is kept as it is


def _hydra_yaml(run_dir, launcher):
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"launcher": launcher}}))


SLURM = {"_target_": "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher",
         "submitit_folder": "x", "timeout_min": 60, "cpus_per_task": 8, "gpus_per_node": 8, "tasks_per_node": 1,
         "mem_gb": 200, "nodes": 2, "name": "pretrain_exp", "partition": "gpu", "account": "lab", "qos": None,
         "max_num_timeout": 3, "additional_parameters": {"mail-type": "END"}}


def test_the_launcher_follows_the_run_and_asks_one_task(tmp_path):
    assert resolve_launcher("auto", tmp_path) == "local"  # no .hydra/ (a worker-started run)
    _hydra_yaml(tmp_path, SLURM)
    assert resolve_launcher("auto", tmp_path) == "slurm" and resolve_launcher("local", tmp_path) == "local"
    assert slurm_parameters(SLURM) == {
        "nodes": 1, "tasks_per_node": 1, "timeout_min": 60, "cpus_per_task": 8, "gpus_per_node": 1, "mem_gb": 200,
        "name": "pretrain_exp-eval", "slurm_partition": "gpu", "slurm_account": "lab",
        "slurm_additional_parameters": {"mail-type": "END"}}
    local = tmp_path / "local"
    _hydra_yaml(local, {"_target_": "hydra._internal.core_plugins.basic_launcher.BasicLauncher"})
    assert resolve_launcher("auto", local) == "local"


def test_pending_evals_are_the_started_ones_without_results(tmp_path):
    assert pending_evals(tmp_path) == {} and describe_pending(tmp_path) == ""
    for step, done in ((4, ["insertion_loss", "perplexity"]), (8, ["insertion_loss"]), (12, [])):
        d = tmp_path / "evals" / f"step{step}"
        d.mkdir(parents=True)
        (d / MARKER).write_text(json.dumps({"step": step, "tasks": ["insertion_loss", "perplexity"], "pid": 1}))
        for task in done:
            (d / f"{task}.json").write_text("{}")
    (tmp_path / "evals" / "step16").mkdir()
    (tmp_path / "evals" / "step16" / MARKER).write_text("{not json")  # a torn marker is not a pending eval
    assert pending_evals(tmp_path) == {8: ["perplexity"], 12: ["insertion_loss", "perplexity"]}
    assert describe_pending(tmp_path) == ("evals pending: step 8 (perplexity), step 12 (insertion_loss, "
                                          "perplexity)")


def test_async_config_rules(tmp_path):
    cfg = make_config("experiment=tiny", "eval.mode=async", "eval.async_launcher=slurm", run_dir=tmp_path)
    assert cfg.eval.mode == EvalMode["async"] and cfg.eval.async_launcher == "slurm"
    with pytest.raises(ConfigError, match=r"eval.async_launcher: must be one of auto, local, slurm; got 'sbatch'"):
        make_config("experiment=tiny", "eval.async_launcher=sbatch", run_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"eval.mode: async evals finish after the next segment"):
        make_config("experiment=dynamic_demo", "eval.mode=async", "wandb=disabled", run_dir=tmp_path)


def test_the_eval_job_name_is_the_runs_job_name_resolved(tmp_path):
    """``.hydra/hydra.yaml`` keeps the launcher's ``name: ${hydra.job.name}`` unresolved: the eval job's name is the
    resolved one; a value this file cannot resolve (Hydra's runtime) is left out rather than passed on unresolved."""
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {
        "job": {"name": "pretrain_exp"}, "sweep": {"dir": "/runs/s"},
        "launcher": {**SLURM, "name": "${hydra.job.name}", "submitit_folder": "${hydra.sweep.dir}/.submitit/%j",
                     "comment": "${hydra.runtime.output_dir}"}}}))
    launcher = run_launcher(tmp_path)
    assert launcher["name"] == "pretrain_exp" and launcher["submitit_folder"] == "/runs/s/.submitit/%j"
    assert "comment" not in launcher
    assert slurm_parameters(launcher)["name"] == "pretrain_exp-eval"


def test_the_pending_wait_must_be_a_duration(tmp_path):
    with pytest.raises(ConfigError, match=r"eval.async_pending_wait_s: must be >= 0 seconds, got -1"):
        make_config("experiment=tiny", "eval.mode=async", "eval.async_pending_wait_s=-1", run_dir=tmp_path)
