"""The ``olmo_core`` framework on the tiny OLMo-3-shaped preset, real dolma2 tokens of the Shakespeare corpus.

OLMo-core's own Trainer trains; these tests check what we add around it: the rows it trains are the run's rows
with the plan applied, its checkpoints resume (after a kill, and as initial checkpoints with trainer state),
two torchrun processes train the rows one process trains, the HF export reproduces the logits, and trainer state is
read without unpickling arbitrary objects.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from pretrain_exp.core.errors import CheckpointError
from pretrain_exp.frameworks.noise_feed import NoiseFeed
from pretrain_exp.frameworks.olmo_core import framework as olmo_core_framework
from pretrain_exp.frameworks.olmo_core.checkpoint import check_train_state, load_model, save_hf
from pretrain_exp.frameworks.olmo_core.presets import tiny_checkpoint
from pretrain_exp.insertion.plan import Plan
from tests.conftest import CACHE_DIR, ROOT, make_config

#: 6 steps of 4 rows x 128 tokens in segments of 2; 8 bios at dup counts 0/1/2/4
RUN = ["framework=olmo_core", "training=tiny", "training.num_steps=6", "training.global_batch_size=4",
       "training.micro_batch_size=2", "training.checkpoint_interval=2", "training.num_threads=1",
       "data.held_out_rows=8", "insertion.experiments.fictional_bios.num_items=8",
       "insertion.experiments.fictional_bios.repetitions=[0,1,2,4]", "wandb=disabled", "training.log_rows=true"]


def cli(*args: str, runs: Path, check: bool = True, wait: bool = True, timeout: float = 900,
        env: dict | None = None):
    env = os.environ | {"PRETRAIN_EXP_RUNS": str(runs), "PRETRAIN_EXP_CACHE": str(CACHE_DIR),
                        "WANDB_SILENT": "true"} | (env or {})
    cmd = [sys.executable, "-m", "pretrain_exp", *args]
    if not wait:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


#: ``sitecustomize`` of a run's processes: torchrun rank 1's asynchronous checkpoint saves report completion
#: ``TEST_RANK1_SAVE_DELAY_S`` seconds after they finish
RANK1_SAVES_LATE = """
import os, threading, time
from concurrent.futures import Future

if os.environ.get("RANK") == "1":
    from olmo_core.train.checkpoint import Checkpointer

    save_async = Checkpointer.save_async

    def late_save_async(self, *args, **kwargs):
        saved, late = save_async(self, *args, **kwargs), Future()

        def finish(fut):
            time.sleep(float(os.environ["TEST_RANK1_SAVE_DELAY_S"]))
            if fut.exception() is not None:
                late.set_exception(fut.exception())
            else:
                late.set_result(fut.result())

        saved.add_done_callback(lambda fut: threading.Thread(target=finish, args=(fut,), daemon=True).start())
        return late

    Checkpointer.save_async = late_save_async
"""


def rank1_saves_late(tmp_path: Path, seconds: float) -> dict:
    """The environment of a run whose torchrun rank 1 learns ``seconds`` late that each asynchronous save is done."""
    site = tmp_path / "rank1_saves_late"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(RANK1_SAVES_LATE)
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
            "TEST_RANK1_SAVE_DELAY_S": str(seconds)}


def weights(ckpt_dir: Path) -> dict:
    return {k: v.clone() for k, v in load_model(ckpt_dir).state_dict().items()}


def trained_rows(run_dir: Path) -> dict:
    """``{step: {q: sha256 of the tokens row q was trained on}}`` from every rank's ``rows/rank<r>.jsonl``
    (the last record of a step wins: a resumed segment re-logs the steps it re-trains)."""
    out: dict = {}
    for f in sorted((run_dir / "rows").glob("rank*.jsonl")):
        per_rank = {}
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            per_rank[rec["step"]] = dict(zip(rec["rows"], rec["sha256"]))
        for step, rows in per_rank.items():
            out.setdefault(step, {}).update(rows)
    return out


def last_logged_step(run_dir: Path) -> int:
    """The latest step whose rows a rank logged (``rows/rank<r>.jsonl``, written as the step's batch is taken);
    0 before any (a line the run is still writing is not counted)."""
    steps = [0]
    for f in (run_dir / "rows").glob("rank*.jsonl"):
        for line in f.read_text().splitlines():
            try:
                steps.append(json.loads(line)["step"])
            except (ValueError, KeyError):
                pass
    return max(steps)


def kill_after_first_checkpoint_and_rerun(args, run_dir: Path, runs: Path, last_step: int) -> None:
    """Start ``python -m pretrain_exp *args`` in ``run_dir``, SIGKILL it as soon as it takes the batch of the step
    after its first checkpoint (mid-segment: an event of the run, not a time after the checkpoint), check it had
    not finished, and run the same command again to the end."""
    p = cli(*args, f"hydra.run.dir={run_dir}", runs=runs, wait=False)
    deadline = time.monotonic() + 600
    done = []
    while not done:
        done = [int(d.name[4:]) for d in (run_dir / "checkpoints").glob("step*") if (d / ".metadata.json").is_file()]
        assert p.poll() is None and time.monotonic() < deadline, "run ended before its first checkpoint"
        time.sleep(0.05)
    while last_logged_step(run_dir) <= min(done):  # into the next segment
        assert p.poll() is None and time.monotonic() < deadline, "run ended before the step after its checkpoint"
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert not (run_dir / "checkpoints" / f"step{last_step}").exists()
    cli(*args, f"hydra.run.dir={run_dir}", runs=runs)


def losses(run_dir: Path) -> dict:
    return {m["step"]: m["train/loss"] for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
            if "train/loss" in m}


def assert_two_ranks_train_what_one_trains(one: Path, two: Path, steps: int, B: int) -> None:
    """Same plan, the same rows with the same tokens at every step (split over the ranks), and the same loss at
    step 1 (same weights); later losses agree to 1% (AdamW's first updates are ~lr * sign(g), so float-level
    gradient differences of the DDP reduction move near-zero-gradient weights)."""
    assert Plan.load(two / "plan.npz").digest() == Plan.load(one / "plan.npz").digest()
    rows_one, rows_two = trained_rows(one), trained_rows(two)
    assert sorted(rows_one) == sorted(rows_two) == list(range(1, steps + 1))
    for k in rows_one:
        assert sorted(rows_one[k]) == list(range((k - 1) * B, k * B))
        assert rows_two[k] == rows_one[k], f"step {k}"
    l1, l2 = losses(one), losses(two)
    assert l2[1] == pytest.approx(l1[1], rel=1e-5)
    assert all(l2[k] == pytest.approx(l1[k], rel=1e-2) for k in l1), (l1, l2)


@pytest.fixture(scope="module")
def tiny_ckpt() -> Path:
    return tiny_checkpoint("olmo3_tiny", CACHE_DIR)


def test_hf_export_reproduces_the_olmo_core_logits(tiny_ckpt, tmp_path):
    from transformers import AutoModelForCausalLM

    from pretrain_exp.data.tokenize import load_tokenizer

    tok = load_tokenizer("dolma2", CACHE_DIR)
    model = load_model(tiny_ckpt)
    out = save_hf(model, tok, tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "olmo3" and config["eos_token_id"] == 100257 and config["vocab_size"] == 100352
    assert config["layer_types"] == ["sliding_attention"] * 3 + ["full_attention"]
    hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    text = ("To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the slings and "
            "arrows of outrageous fortune")
    ids = torch.tensor([tok(text).input_ids * 3])  # longer than the 64-token sliding window
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids), rtol=1e-5, atol=1e-5)


class _Evil:
    pass


def test_trainer_state_is_read_without_unpickling_and_its_step_checked(tiny_ckpt, tmp_path):
    ckpt = tmp_path / "step3"
    (ckpt / "train").mkdir(parents=True)
    torch.save({"global_step": 3, "rng": {"numpy": np.random.get_state()}, "callbacks": {"t": np.float64(1.5)}},
               ckpt / "train" / "rank0.pt")
    assert check_train_state(ckpt)["global_step"] == 3
    (ckpt / "config.json").write_text((tiny_ckpt / "config.json").read_text())
    fw = olmo_core_framework.OlmoCoreFramework(make_config("framework=olmo_core", run_dir=tmp_path / "run"), ckpt)
    with pytest.raises(CheckpointError, match="checkpoint_step=0.*at step 3"):
        fw.initial_checkpoint()
    torch.save({"global_step": 3, "payload": _Evil()}, ckpt / "train" / "rank0.pt")
    with pytest.raises(CheckpointError, match="refused by weights_only loading"):
        check_train_state(ckpt)


@pytest.mark.slow
def test_olmo_core_trains_exactly_the_runs_rows_with_the_plan_applied(tmp_path, monkeypatch):
    """Every row OLMo-core's data loader hands the train module, after our pre_step callback, is
    ``TrainingRows.row(q)``: the training-order row with the planned spans written. Of the two segments, only the
    first runs OLMo-core's dry-run batch: the second continues its trainer in memory."""
    from olmo_core.train.trainer import Trainer

    from pretrain_exp.app.experiment import Experiment

    seen, dry_runs = [], []
    dry_run = Trainer._dry_run_batch
    monkeypatch.setattr(Trainer, "_dry_run_batch", lambda self: (dry_runs.append(self.global_step), dry_run(self)))

    class Record(olmo_core_framework.Insertions):
        def pre_step(self, batch):
            super().pre_step(batch)
            seen.append((self.trainer.global_step, batch["input_ids"].clone()))

    monkeypatch.setattr(olmo_core_framework, "Insertions", Record)
    cfg = make_config(*RUN, "training.num_steps=4", "eval=[]", run_dir=tmp_path / "run")
    exp = Experiment(cfg)
    assert exp.plan.num_insertions == 2 * (1 + 2 + 4)
    exp.run()
    B = cfg.training.global_batch_size
    assert [k for k, _ in seen] == [1, 2, 3, 4]
    assert dry_runs == [0]
    inserted = 0
    for k, ids in seen:
        for i in range(B):
            q = (k - 1) * B + i
            np.testing.assert_array_equal(ids[i].numpy(), exp.rows.row(q))
            inserted += not np.array_equal(exp.rows.row(q), exp.order.row_tokens(q))
    assert inserted == len(np.unique(exp.plan.affected_rows()))
    assert (tmp_path / "run" / "checkpoints" / "step4" / "config.json").is_file()


@pytest.mark.slow
def test_cli_run_kill_resume_torchrun_and_continuing_a_checkpoint_with_trainer_state(tmp_path):
    """One uninterrupted CLI run (with evals) is the reference for: a run killed mid-segment and re-run (equal
    final weights), a 2-process torchrun (gloo) run (the same rows with the same insertions, step by step), and a
    new run whose initial checkpoint is the reference's step-2 checkpoint with its trainer state
    (OLMo-core restores data position and fingerprint; our callback checks every row it trains).

    In the torchrun run, rank 1 learns 3 s late that each asynchronous save is done. OLMo-core records a save's
    duration when it learns that, at the step each rank is on then: left so, the ranks hold different metrics at a
    step, reduce them with collectives of different shapes and wait on each other forever. Each save's duration
    must be recorded by both ranks at the next save's step."""
    runs = tmp_path / "runs"
    ref = runs / "ref"
    proc = cli(*RUN, "eval=[insertion_loss]", "training.keep_last_checkpoints=0", f"hydra.run.dir={ref}", runs=runs)
    res = json.loads((ref / "results.json").read_text())
    assert res["step"] == 6 and [r["dup_count"] for r in res["per_dup"]] == [0, 1, 2, 4]
    metrics = [json.loads(line) for line in (ref / "metrics.jsonl").read_text().splitlines()]
    assert sorted({m["step"] for m in metrics if "train/loss" in m}) == [1, 2, 3, 4, 5, 6]
    assert any("train/tokens_per_s" in m for m in metrics)
    final = weights(ref / "checkpoints" / "step6")
    assert "run dir:" in proc.stdout

    killed = runs / "killed"
    kill_after_first_checkpoint_and_rerun([*RUN, "eval=[]"], killed, runs, last_step=6)
    for k, v in weights(killed / "checkpoints" / "step6").items():
        torch.testing.assert_close(v, final[k], rtol=0, atol=0, msg=k)

    assert trained_rows(killed) == trained_rows(ref)

    two = runs / "two"
    proc = cli(*RUN, "eval=[insertion_loss]", "eval.mode=distributed", "training.nproc_per_node=2",
               f"hydra.run.dir={two}", runs=runs, timeout=600, env=rank1_saves_late(tmp_path, 3))
    assert_two_ranks_train_what_one_trains(ref, two, steps=6, B=4)
    metrics = [json.loads(line) for line in (two / "metrics.jsonl").read_text().splitlines()]
    saves = {m["step"]: m["checkpoint/save_async_duration_s"] for m in metrics
             if "checkpoint/save_async_duration_s" in m}
    # the saves of steps 2 and 4, with rank 1's delay (the max over ranks); step 6's ends the run unrecorded
    assert sorted(saves) == [4, 6] and min(saves.values()) >= 3.0, saves
    # eval.mode=distributed: both ranks read one HF export per step; those export_hf=final does not keep are gone
    assert (proc.stdout + proc.stderr).count("(eval.mode=distributed over 2 ranks)") == 3
    assert sorted(p.parent.name for p in (two / "evals").glob("step*/insertion_loss.json")) == ["step2", "step4",
                                                                                                "step6"]
    assert sorted(p.name for p in (two / "hf").iterdir()) == ["step6"]

    cont = runs / "cont"
    no_insertions = [o for o in RUN if not o.startswith("insertion.")] + ["insertion=none"]
    cli(*no_insertions, "eval=[]", "training.num_steps=2", f"model.path={ref / 'checkpoints' / 'step2'}",
        "model.asset=null", "model.checkpoint_step=2", f"hydra.run.dir={cont}", runs=runs)
    assert check_train_state(cont / "checkpoints" / "step4")["global_step"] == 4
    # the data loader resumed at batch 2 of the same order: steps 3 and 4 train the reference's rows
    assert {k: sorted(v) for k, v in trained_rows(cont).items()} == {
        k: sorted(v) for k, v in trained_rows(ref).items() if k in (3, 4)}


@pytest.mark.slow
def test_olmo_core_adds_exactly_the_planned_gaussian_noise(tmp_path, monkeypatch):
    """Gaussian poisoning through OLMo-core's micro-batches (2 rows each): every planned row gets exactly its
    pattern added to its input embeddings, every other row enters the model untouched, and the trainer's
    dry-run batch gets no noise."""
    import torch.nn.functional as F

    from pretrain_exp.app.experiment import Experiment
    from pretrain_exp.insertion.noise import make_noise

    seen = []
    attach = NoiseFeed.attach

    def recording_attach(self, embeddings):
        attach(self, embeddings)

        def record(module, args, output):
            rows = None if self.rows is None else self.noise._rows.copy()
            seen.append((rows, (output - F.embedding(args[0], module.weight)).detach().clone()))

        embeddings.register_forward_hook(record)

    monkeypatch.setattr(NoiseFeed, "attach", recording_attach)
    cfg = make_config("framework=olmo_core", "training=tiny", "training.num_steps=2", "training.global_batch_size=4",
                      "training.micro_batch_size=2", "training.checkpoint_interval=2", "training.num_threads=1",
                      "data.held_out_rows=8", "insertion=gaussian", "insertion.experiments.gaussian.num_items=4",
                      "insertion.experiments.gaussian.repetitions=[0,1,2,3]",
                      "insertion.experiments.gaussian.placement.steps=[1,2]", "eval=[]", "wandb=disabled",
                      run_dir=tmp_path / "run")
    exp = Experiment(cfg)
    exp.run()
    plan, L = exp.plan, cfg.training.sequence_length
    seeds = dict(zip(plan.noise_rows.tolist(), plan.item_noise_seed[plan.noise_item_ids].tolist()))
    assert len(seeds) == 6
    steps = [(rows, delta) for rows, delta in seen if rows is not None]
    assert all(torch.equal(d, torch.zeros_like(d)) for rows, d in seen if rows is None)  # the dry-run batch
    assert sorted(q for rows, _ in steps for q in rows.tolist()) == list(range(8))
    for rows, delta in steps:
        for r, q in enumerate(rows.tolist()):
            if q in seeds:
                torch.testing.assert_close(delta[r], make_noise(seeds[q], L, delta.shape[-1], 0.075),
                                           rtol=0, atol=1e-6)
            else:
                assert torch.equal(delta[r], torch.zeros_like(delta[r])), q


@pytest.mark.slow
def test_dynamic_additions_reach_the_next_segments_batches(tmp_path, monkeypatch):
    """insertion.dynamic on OLMo-core: the copies decided after a segment's evals are in the rows its data loader
    hands the train module in the next segment (the trainer reads the rows' plan anew per segment)."""
    from pretrain_exp.app.experiment import Experiment
    from pretrain_exp.insertion.dynamic import load_additions

    seen = {}

    class Record(olmo_core_framework.Insertions):
        def pre_step(self, batch):
            super().pre_step(batch)
            seen[self.trainer.global_step] = batch["input_ids"].clone()

    monkeypatch.setattr(olmo_core_framework, "Insertions", Record)
    cfg = make_config(*RUN, "training.num_steps=4", "eval=[insertion_loss]", "eval.on_load=true",
                      "insertion.experiments.fictional_bios.repetitions=0",
                      "insertion.dynamic={policy:until_memorized,threshold:0.0,controls:0,allow_no_controls:true}",
                      run_dir=tmp_path / "run")
    exp = Experiment(cfg)
    exp.run()
    recs = load_additions(tmp_path / "run")
    assert [r["decided_at"] for r in recs] == [0, 2] and all(len(r["items"]) == 8 for r in recs)
    B, L = cfg.training.global_batch_size, cfg.training.sequence_length
    assert sorted(seen) == [1, 2, 3, 4]
    for r in recs:
        for p, i in zip(r["positions"], r["item_ids"]):
            q = p // L
            row = seen[q // B + 1][q % B].numpy()
            want = exp.plan.item_tokens(i)
            np.testing.assert_array_equal(row[p % L:p % L + want.size], want)
