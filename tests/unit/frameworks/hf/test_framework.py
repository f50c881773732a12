"""The hf framework trains exactly the planned rows in order, and resumes bit-identically on CPU."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file
from transformers.trainer_callback import TrainerState

import pretrain_exp.frameworks.hf.trainer as hf_trainer
from pretrain_exp.app.experiment import Experiment, with_retries
from pretrain_exp.core.errors import ConfigError, DataError, TrainingError
from tests.conftest import make_config

TINY = ["experiment=tiny", "wandb=disabled", "eval=[insertion_loss]", "training.num_threads=1",
        "insertion.experiments.fictional_bios.repetitions=[0,1,2,4]"]


class _Recorder:
    """Stands in for ``AutoModelForCausalLM`` in the hf framework's trainer module; records every forward's
    input_ids."""

    def __init__(self):
        self.batches = []
        self.real = transformers.AutoModelForCausalLM

    def from_pretrained(self, *args, **kwargs):
        model = self.real.from_pretrained(*args, **kwargs)
        model.register_forward_pre_hook(lambda mod, a, kw: self.batches.append(kw["input_ids"].clone()),
                                        with_kwargs=True)
        return model


@pytest.mark.parametrize("micro", [1, pytest.param(2, marks=pytest.mark.slow), 4,
                                   pytest.param(8, marks=pytest.mark.slow)])
def test_step_k_trains_rows_k_minus_1_times_b_to_k_times_b(micro, tmp_path, monkeypatch, tiny_model_dir):
    """Whatever the micro-batch size (hence grad accumulation), step k sees rows [(k-1)B, kB) in order."""
    cfg = make_config(*TINY, f"training.micro_batch_size={micro}", "training.num_steps=3",
                      "training.checkpoint_interval=3", run_dir=tmp_path)
    exp = Experiment(cfg)
    rec = _Recorder()
    monkeypatch.setattr(hf_trainer, "AutoModelForCausalLM", rec)
    exp.framework.train(exp.framework.initial_checkpoint(), 3, exp.rows, lambda m, s: None)
    B = cfg.training.global_batch_size
    seen = torch.cat(rec.batches).numpy()
    assert [b.shape[0] for b in rec.batches] == [micro] * (3 * B // micro)
    want = np.stack([exp.rows.row(q) for q in range(3 * B)])
    np.testing.assert_array_equal(seen, want)
    assert exp.plan.num_insertions > 0  # and those rows carry the insertions (TrainingRows applies the plan)
    for k in range(1, 4):
        np.testing.assert_array_equal(seen[(k - 1) * B:k * B], want[(k - 1) * B:k * B])


def _final_weights(run_dir):
    ckpts = sorted((run_dir / "checkpoints").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    return load_file(str(ckpts[-1] / "model.safetensors")), ckpts[-1].name


@pytest.mark.slow
def test_resume_after_a_crash_mid_segment_is_bit_identical(tmp_path, monkeypatch, tiny_model_dir):
    """Kill training inside segment 2 (step 3 of 2->4), re-run the same config in the same run dir, kill that
    re-run while it writes checkpoint-4's ``trainer_state.json``, re-run again: the final weights equal those of an
    uninterrupted run, bit for bit (CPU)."""
    steps = ["training.num_steps=6", "training.checkpoint_interval=2", "training.keep_last_checkpoints=0"]
    Experiment(make_config(*TINY, *steps, run_dir=tmp_path / "a")).run()

    crashed = {"done": False}
    orig = hf_trainer.Segment.on_step_end

    def crash_once(self, args, state, control, **kw):
        if state.global_step == 3 and not crashed["done"]:
            crashed["done"] = True
            raise KeyboardInterrupt("simulated kill")
        return orig(self, args, state, control, **kw)

    monkeypatch.setattr(hf_trainer.Segment, "on_step_end", crash_once)
    with pytest.raises(KeyboardInterrupt):
        Experiment(make_config(*TINY, *steps, run_dir=tmp_path / "b")).run()
    assert sorted(p.name for p in (tmp_path / "b" / "checkpoints").glob("checkpoint-*")) == ["checkpoint-2"]
    monkeypatch.setattr(hf_trainer.Segment, "on_step_end", orig)

    # the re-run is killed while the Trainer writes checkpoint-4's trainer_state.json (after its open(), before
    # its write): that checkpoint is not complete, and the next re-run trains 2->4 again
    save_state = TrainerState.save_to_json

    def cut_state_write(self, json_path):
        if Path(json_path).parent.name == "checkpoint-4":
            Path(json_path).write_text("")
            raise KeyboardInterrupt("simulated kill")
        return save_state(self, json_path)

    monkeypatch.setattr(TrainerState, "save_to_json", cut_state_write)
    with pytest.raises(KeyboardInterrupt):
        Experiment(make_config(*TINY, *steps, run_dir=tmp_path / "b")).run()
    assert (tmp_path / "b" / "checkpoints" / "checkpoint-4" / "trainer_state.json").read_text() == ""
    monkeypatch.setattr(TrainerState, "save_to_json", save_state)
    Experiment(make_config(*TINY, *steps, run_dir=tmp_path / "b")).run()

    wa, na = _final_weights(tmp_path / "a")
    wb, nb = _final_weights(tmp_path / "b")
    assert na == nb == "checkpoint-6"
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    first = load_file(str(tmp_path / "a" / "checkpoints" / "checkpoint-2" / "model.safetensors"))
    assert any(not torch.equal(first[k], wa[k]) for k in wa)  # training did change the weights
    # evals exist for every segment, and the resumed run's results match
    ra = json.loads((tmp_path / "a" / "results.json").read_text())
    rb = json.loads((tmp_path / "b" / "results.json").read_text())
    assert ra["per_dup"] == rb["per_dup"]
    assert sorted(ra["by_step"]) == ["2", "4", "6"]


def test_resumed_segment_reports_only_keys_genuinely_missing(tmp_path, caplog, tiny_model_dir):
    """``tiny_llama`` ties its embeddings (``tie_word_embeddings``), so its checkpoints hold no ``lm_head.weight``:
    resuming from one does not report it as missing, while a key really missing from the checkpoint still is."""
    from safetensors.torch import save_file

    assert transformers.AutoConfig.from_pretrained(tiny_model_dir).tie_word_embeddings
    cfg = make_config(*TINY, "training.num_steps=4", "training.checkpoint_interval=1", run_dir=tmp_path)
    exp = Experiment(cfg)
    fw, rows = exp.framework, exp.rows
    ckpt = fw.train(fw.initial_checkpoint(), 1, rows, lambda m, s: None)
    state = load_file(str(ckpt.path / "model.safetensors"))
    assert "lm_head.weight" not in state  # the premise: save_pretrained leaves the tied weight out
    del state["model.norm.weight"]  # and this checkpoint really lacks a weight
    save_file(state, str(ckpt.path / "model.safetensors"), metadata={"format": "pt"})
    caplog.set_level(logging.DEBUG)
    lib = logging.getLogger("transformers")
    propagate, lib.propagate = lib.propagate, True  # the Trainer's warnings into caplog
    try:
        fw.train(ckpt, 2, rows, lambda m, s: None)
    finally:
        lib.propagate = propagate
    missing = [r.getMessage() for r in caplog.records if "missing keys" in r.getMessage()]
    assert missing and all(m.endswith("loaded: ['model.norm.weight'].") for m in missing), missing
    assert any("tied to the input embeddings" in r.getMessage() and "lm_head.weight" in r.getMessage()
               for r in caplog.records if r.levelno == logging.DEBUG)  # the run's log file keeps it


def test_retries_back_off_exponentially_with_jitter():
    calls, sleeps = [], []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("NCCL timeout")
        return "ok"

    assert with_retries(flaky, 3, 2.0, "segment", sleep=sleeps.append) == "ok"
    assert len(calls) == 3 and len(sleeps) == 2
    assert 1.0 <= sleeps[0] <= 3.0 and 2.0 <= sleeps[1] <= 6.0


@pytest.mark.parametrize("err", [ConfigError("training.x", "bad"), DataError("f.jsonl:3: bad")])
def test_config_and_data_errors_are_not_retried(err):
    calls = []

    def fails():
        calls.append(1)
        raise err

    with pytest.raises(type(err)):
        with_retries(fails, 5, 0.0, "segment", sleep=lambda s: None)
    assert len(calls) == 1


def test_retries_give_up_with_a_training_error():
    def fails():
        raise RuntimeError("out of memory")

    with pytest.raises(TrainingError, match="failed after 3 attempt"):
        with_retries(fails, 2, 0.0, "training steps 0->2", sleep=lambda s: None)
