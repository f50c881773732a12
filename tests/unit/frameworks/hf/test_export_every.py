"""``training.export_hf=every`` on ``framework=hf``: each segment's model is kept in ``hf/step<N>/`` (model, config and
tokenizer files, no training state), read by stock ``transformers`` and lm-eval, re-evaluated by
``pretrain-exp-eval --steps`` and released as one revision per kept step; ``final`` (the default) keeps no ``hf/``
dir (the last Trainer checkpoint is the final model)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

import pretrain_exp.frameworks.hf.trainer as hf_trainer
from pretrain_exp.app.evaluate import main as eval_main
from pretrain_exp.app.hf_export import HFExport
from pretrain_exp.app.launch import launch as run
from pretrain_exp.core.config import ExportHF
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.frameworks.base import Checkpoint
from pretrain_exp.report.cli import main as report_main
from pretrain_exp.report.release import TRAINING_STATE, model_dirs, release
from tests.conftest import make_config

#: experiment=tiny: 12 steps of 8 rows x 128 tokens in 3 segments of 4 (tiny Llama, fictional bios at dup 0/1/4/16)
TINY = ["experiment=tiny", "wandb=disabled", "training.num_threads=1", "eval=[insertion_loss,perplexity]"]
STEPS = (4, 8, 12)
TEXTS = ["Ada Lovelace was born in London in 1815 and wrote the first published algorithm.",
         "The quick brown fox jumps over the lazy dog while the cat sleeps on the warm windowsill."]


def test_an_hf_checkpoint_is_kept_as_its_model_files_only_under_every(tmp_path, tiny_model_dir):
    """The kept export of an HF checkpoint: its model, config and tokenizer files hard-linked into ``hf/step<N>/``
    (whole or absent), which outlive the checkpoint; ``final`` and ``none`` write nothing for it."""
    from transformers import AutoModelForCausalLM

    ckpt_dir = tmp_path / "checkpoints" / "checkpoint-2"
    shutil.copytree(tiny_model_dir, ckpt_dir)
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json", "training_args.bin"):
        (ckpt_dir / name).write_bytes(b"training state")
    ckpt = Checkpoint(ckpt_dir, 2)
    rd = RunDir(tmp_path)
    for mode in (ExportHF.final, ExportHF.none):
        HFExport(rd, mode, end_step=2).post_segment(ckpt, final=True)
        assert not rd.hf.exists()
    hf = HFExport(rd, ExportHF.every, end_step=4)
    hf.post_segment(ckpt, final=False)
    kept = rd.hf_export(2)
    assert sorted(p.name for p in kept.iterdir()) == sorted(
        p.name for p in ckpt_dir.iterdir() if not p.name.startswith(TRAINING_STATE))
    assert (kept / "model.safetensors").stat().st_ino == (ckpt_dir / "model.safetensors").stat().st_ino
    assert [p.name for p in rd.hf.iterdir()] == ["step2"]  # no temporary sibling left
    hf.drop(2, is_hf=True)  # a background eval done with it: kept
    shutil.rmtree(ckpt_dir)  # training.keep_last_checkpoints deletes the checkpoint
    assert AutoModelForCausalLM.from_pretrained(str(kept)).config.model_type == "llama"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir):
    """``(every, saved, final)``: the tiny run with ``training.export_hf=every`` (default ``keep_last_checkpoints=1``:
    only ``checkpoint-12`` survives), the weights its Trainer saved at each segment end (global step -> state
    dict, read from ``checkpoint-<k>/`` as it was saved), and a 4-step run with the default ``export_hf=final``."""
    root = tmp_path_factory.mktemp("export_every")
    saved = {}
    original = hf_trainer.Segment.on_save

    def record(self, args, state, control, **kw):
        original(self, args, state, control, **kw)
        ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        saved[self.start_step + state.global_step] = load_file(str(ckpt / "model.safetensors"))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(hf_trainer.Segment, "on_save", record)
        run(make_config(*TINY, "training.export_hf=every", run_dir=root / "every"))
    run(make_config(*TINY, "training.num_steps=4", "training.checkpoint_interval=2",
                    "insertion.experiments.fictional_bios.repetitions=[0,1,4]", run_dir=root / "final"))
    return root / "every", saved, root / "final"


def _logits(model_dir) -> torch.Tensor:
    """The logits ``(2, 16, vocab)`` of :data:`TEXTS`' first 16 tokens under the HF model dir ``model_dir``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    ids = torch.tensor([tok(t).input_ids[:16] for t in TEXTS])
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.slow
def test_every_segments_model_is_kept_and_equals_the_checkpoint_of_its_step(runs):
    from transformers import AutoModelForCausalLM

    every, saved, _ = runs
    assert sorted(saved) == list(STEPS)
    assert sorted(p.name for p in (every / "hf").iterdir()) == ["step12", "step4", "step8"]  # no temporary dir left
    assert sorted(p.name for p in (every / "checkpoints").iterdir()) == ["checkpoint-12"]  # keep_last_checkpoints=1
    for step in STEPS:
        kept = every / "hf" / f"step{step}"
        names = {f.name for f in kept.iterdir()}
        assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
        assert not [n for n in names if n.startswith(TRAINING_STATE)]  # no optimizer / scheduler / trainer state
        got = load_file(str(kept / "model.safetensors"))
        assert got.keys() == saved[step].keys()
        for k in saved[step]:
            torch.testing.assert_close(got[k], saved[step][k], rtol=0, atol=0)
        model = AutoModelForCausalLM.from_pretrained(str(kept), dtype=torch.float32)
        loaded = model.state_dict()
        for k in saved[step]:  # what stock transformers loads is the step's model
            torch.testing.assert_close(loaded[k], saved[step][k].float(), rtol=0, atol=0)
    assert not torch.equal(saved[4]["model.norm.weight"], saved[12]["model.norm.weight"])  # three different models
    logits = {s: _logits(every / "hf" / f"step{s}") for s in (4, 12)}
    assert not torch.allclose(logits[4], logits[12])


@pytest.mark.slow
def test_export_hf_final_keeps_no_hf_dir_for_hf_checkpoints(runs):
    """``final`` (the default) for ``hf``: the last Trainer checkpoint is the final model; nothing is copied."""
    _, _, final = runs
    assert not (final / "hf").exists()
    assert sorted(p.name for p in (final / "checkpoints").iterdir()) == ["checkpoint-4"]


@pytest.mark.slow
def test_pretrain_exp_eval_evaluates_a_kept_earlier_step(runs, tmp_path, capsys):
    """``pretrain-exp-eval <run> --steps 4 --redo`` reads ``hf/step4/`` and reproduces the run's own eval of step 4
    (made on the Trainer checkpoint then)."""
    every, _, _ = runs
    run_dir = tmp_path / "run"
    shutil.copytree(every, run_dir)
    before = json.loads((run_dir / "evals" / "step4" / "insertion_loss.json").read_text())
    eval_main([str(run_dir), "--steps", "4", "--redo"])
    capsys.readouterr()
    after = json.loads((run_dir / "evals" / "step4" / "insertion_loss.json").read_text())
    assert after["step"] == 4 and after["seconds"] != before["seconds"]  # evaluated now
    assert after["metrics"] == pytest.approx(before["metrics"], rel=1e-5, abs=1e-6)


@pytest.mark.slow
def test_stock_lm_eval_loads_a_kept_step(runs, tmp_path, capsys):
    """``lm_eval --model hf --model_args pretrained=<run>/hf/step4`` on the run's own items (export-lm-eval)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    every, _, _ = runs
    out = tmp_path / "tasks"
    assert report_main(["export-lm-eval", str(every), str(out), "--prefix", "pe"]) == 0
    capsys.readouterr()
    manager = TaskManager(include_path=str(out), include_defaults=False)
    bpb = {}
    for step in (4, 12):
        res = lm_eval.simple_evaluate(
            model="hf", model_args=f"pretrained={every / 'hf' / f'step{step}'},dtype=float32",
            tasks=["pe_fictional_bios_inserted"], task_manager=manager, bootstrap_iters=0, batch_size=4, device="cpu")
        bpb[step] = res["results"]["pe_fictional_bios_inserted"]["bits_per_byte,none"]
    assert bpb[4] > 0 and bpb[12] > 0 and bpb[4] != bpb[12]  # two different models


@pytest.mark.slow
def test_a_release_has_one_revision_per_kept_step(runs, tmp_path):
    """``pretrain-exp-release``: the kept ``hf/step<N>/`` dirs are the revisions (the earlier Trainer checkpoints
    are gone), each the model of its step."""
    every, _, _ = runs
    config = yaml.safe_load((every / "config.resolved.yaml").read_text())
    dirs = model_dirs(every, config)
    assert sorted(dirs) == list(STEPS)
    assert dirs[4] == every / "hf" / "step4" and dirs[8] == every / "hf" / "step8"
    (rec,) = release(every, tmp_path / "bundle")
    assert sorted(rec["revisions"].values()) == list(STEPS)
    for name, step in rec["revisions"].items():
        released = tmp_path / "bundle" / "revisions" / name / "model.safetensors"
        assert released.read_bytes() == (every / "hf" / f"step{step}" / "model.safetensors").read_bytes()
