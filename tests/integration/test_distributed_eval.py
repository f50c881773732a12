"""``eval.mode=distributed`` end to end: a 2-rank HF run (torchrun, gloo) evaluates on both ranks and writes the
evals ``inline`` writes, to the last digit."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from pretrain_exp.app.experiment import Experiment
from pretrain_exp.app.tracking import NullTracker
from tests.conftest import make_config
from tests.integration.test_cli import cli

pytestmark = pytest.mark.slow

#: 2 steps of 4 rows (2 ranks x 2), 6 bios at dup counts 0/1/2, the initial checkpoint evaluated too; lm_eval: 5
#: ARC-Easy docs on lm-eval's data-parallel path
RUN = ["experiment=tiny", "wandb=disabled", "training.num_threads=1", "training.nproc_per_node=2",
       "training.num_steps=2", "training.checkpoint_interval=2", "training.global_batch_size=4",
       "training.micro_batch_size=2", "insertion.experiments.fictional_bios.num_items=6",
       "insertion.experiments.fictional_bios.repetitions=[0,1,2]", "eval.on_load=true",
       "eval=[insertion_loss,memorization,perplexity,mia,lm_eval]", "eval.tasks.lm_eval.tasks=[arc_easy]",
       "eval.tasks.lm_eval.limit=5"]


def evals(run_dir) -> dict:
    """``step<N>/<task>`` -> the saved eval record without its ``seconds``."""
    return {f"{f.parent.name}/{f.stem}": {k: v for k, v in json.loads(f.read_text()).items() if k != "seconds"}
            for f in sorted((run_dir / "evals").glob("step*/*.json"))}


def test_distributed_evals_equal_inline_evals(tmp_path):
    """The 2-rank run evaluates its initial checkpoint (before any engine joined the process group) and its final
    one with ``eval.mode=distributed``; the same run dir then evaluated ``inline`` in this process (one process,
    1 torch thread like each rank: CPU kernels may reduce in a thread-count-dependent order) writes records equal
    in everything but ``seconds``."""
    runs = tmp_path / "runs"
    run_dir = runs / "run"
    out = cli(*RUN, "eval.mode=distributed", f"hydra.run.dir={run_dir}", runs=runs)
    logs = out.stdout + out.stderr
    assert logs.count("(eval.mode=distributed over 2 ranks)") == 2, logs[-3000:]
    distributed = evals(run_dir)
    tasks = ("insertion_loss", "lm_eval", "memorization", "mia", "perplexity")
    assert sorted(distributed) == [f"step{s}/{t}" for s in (0, 2) for t in tasks]
    assert not (run_dir / "hf").exists()  # an HF checkpoint is read in place: no export

    shutil.move(run_dir / "evals", tmp_path / "distributed_evals")
    exp = Experiment(make_config(*RUN, "eval.mode=inline", run_dir=run_dir))
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for ckpt in (exp.framework.initial_checkpoint(), exp.framework.latest_checkpoint()):
            exp.evaluate(ckpt, NullTracker())
    finally:
        torch.set_num_threads(old)
    inline = evals(run_dir)
    assert sorted(inline) == sorted(distributed)
    for key, rec in distributed.items():
        assert rec["metrics"], key
        assert json.dumps(rec) == json.dumps(inline[key]), key  # every float to the last digit
