"""Segment-end checkpoints written in the background (``training.checkpoint_async``, OLMo-core's asynchronous save)
and segments that continue the last segment's trainer in memory: the same checkpoints, evals and HF export as
synchronous saves with a reload per segment, and a save cut short is redone by the re-run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from olmo_core.train import Trainer
from safetensors.torch import load_file

from tests.conftest import make_config
from tests.unit.frameworks.olmo_core.test_framework import RUN, weights


def evals(run_dir: Path) -> dict:
    """``{step<N>: the insertion-loss eval record without its seconds}``."""
    return {f.parent.name: {k: v for k, v in json.loads(f.read_text()).items() if k != "seconds"}
            for f in sorted(run_dir.glob("evals/step*/insertion_loss.json"))}


@pytest.mark.slow
def test_async_checkpoints_equal_sync_ones_segments_continue_in_memory_and_a_cut_save_is_redone(tmp_path, monkeypatch):
    from pretrain_exp.app.experiment import Experiment

    loads = []
    load_checkpoint = Trainer.load_checkpoint

    def counted(self, dir, *args, **kwargs):
        loads.append(Path(dir).name)
        return load_checkpoint(self, dir, *args, **kwargs)

    monkeypatch.setattr(Trainer, "load_checkpoint", counted)
    runs, results = {}, {}
    for mode in ("false", "true"):
        runs[mode] = tmp_path / f"async_{mode}"
        cfg = make_config(*RUN, "eval=[insertion_loss]", "training.keep_last_checkpoints=0",
                          f"training.checkpoint_async={mode}", run_dir=runs[mode])
        results[mode] = Experiment(cfg).run()
    # each run loads its initial checkpoint once; segments 2 and 3 continue the trainer in memory
    assert len(loads) == 2 and "checkpoints" not in loads, loads
    sync, asyn = runs["false"], runs["true"]
    for step in (2, 4, 6):
        a, b = weights(sync / "checkpoints" / f"step{step}"), weights(asyn / "checkpoints" / f"step{step}")
        for k in a:
            torch.testing.assert_close(b[k], a[k], rtol=0, atol=0, msg=f"step {step}: {k}")
        assert (asyn / "checkpoints" / f"step{step}" / "config.json").is_file()
    assert results["true"]["per_dup"] == results["false"]["per_dup"]
    assert evals(asyn) == evals(sync) and len(evals(sync)) == 3
    # the async run exported step 6 from the trainer's weights, the sync run from the checkpoint on disk
    ta, tb = load_file(sync / "hf" / "step6" / "model.safetensors"), load_file(asyn / "hf" / "step6" /
                                                                               "model.safetensors")
    assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)
    assert results["true"]["timing"]["final_checkpoint_wait_s"] >= 0
    for run_dir in (sync, asyn):  # the seconds each save held training, forwarded with OLMo-core's metrics
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert len([m["checkpoint/hold_s"] for m in metrics if "checkpoint/hold_s" in m]) >= 2

    # a kill during the background write of step 6 leaves step6/ without .metadata.json: the re-run removes it,
    # resumes from step 4 and writes the same step 6
    (asyn / "checkpoints" / "step6" / ".metadata.json").unlink()
    for shard in (asyn / "checkpoints" / "step6" / "model_and_optim").glob("*.distcp"):
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    loads.clear()
    cfg = make_config(*RUN, "eval=[insertion_loss]", "training.keep_last_checkpoints=0",
                      "training.checkpoint_async=true", run_dir=asyn)
    again = Experiment(cfg).run()
    assert len(loads) == 1 and [s["step"] for s in again["timing"]["segments"]] == [4, 6]  # step 4 read back
    a, b = weights(sync / "checkpoints" / "step6"), weights(asyn / "checkpoints" / "step6")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert again["per_dup"] == results["false"]["per_dup"]
