"""Continuing a checkpoint written by OLMo-core's own experiment path. The fixture (built once per module) is
written by OLMo-core alone (``upstream_run.py``: its ``ExperimentConfig`` and ``Trainer`` as
``olmo_core.script_utils.main`` runs them, CPU): the tiny OLMo-3-style model, uint32 dolma2 token files, ``L`` = 32
shuffled in pairs (``max_target_sequence_length`` 64), 8 instances per step, data seed 34521, AdamW with no weight
decay on the embeddings, z-loss, cosine with warmup; 3 steps saved as ``run/step3``. The reference is OLMo-core's own
continuation of that run from step 3 (``ref/``: steps 4-6, the instance ids and loss of every step, checkpoints
step4-step6). The project is given only ``model=local model.path=<run>/step3 insertion=none training.num_steps=N``
(plus run-dir/test settings).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from pretrain_exp.core.errors import ConfigError, DataError
from pretrain_exp.data.order import permutation_path
from pretrain_exp.data.token_files import write_token_file
from tests.conftest import CACHE_DIR, CHECKOUT_PYTHONPATH, ROOT, compose, make_config

pytestmark = pytest.mark.slow  # the fixture is two OLMo-core runs (~1 min on 2 cores)

from pretrain_exp.frameworks.olmo_core.checkpoint import check_train_state, load_model  # noqa: E402
from pretrain_exp.frameworks.olmo_core.framework import OlmoCoreFramework, holds_optim_state  # noqa: E402
from pretrain_exp.frameworks.olmo_core.presets import tiny_checkpoint  # noqa: E402

EOS = 100257
MINIMAL = ["framework=olmo_core", "model=local", "insertion=none", "eval=[]", "wandb=disabled",
           "training.log_rows=true", "training.checkpoint_interval=1"]


def upstream(save_folder: Path, work_dir: Path, hard_stop: int, paths, *flags: str) -> None:
    """Run :mod:`upstream_run` (OLMo-core alone) to ``hard_stop``; ``flags``: ``--device cuda``, ``--bf16``."""
    env = os.environ | {"PYTHONPATH": CHECKOUT_PYTHONPATH, "OMP_NUM_THREADS": "2"}
    cmd = [sys.executable, "-m", "tests.unit.frameworks.olmo_core.upstream_run", *flags, str(save_folder),
           str(work_dir), str(hard_stop), *map(str, paths)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def build_fixture(root: Path, last: int = 6, *flags: str) -> dict:
    """OLMo-core's run to step 3 (``run/step3``) and its own continuation of it to step ``last`` (``ref/``), both
    run with ``flags`` (:func:`upstream`): ``{"step3", "ref", "steps": {k: {"index", "loss"}}, "paths"}``."""
    source = json.loads((tiny_checkpoint("olmo3_tiny", CACHE_DIR) / "config.json").read_text())["dataset"]["paths"][0]
    tokens = np.fromfile(source, dtype=np.uint32)[:2400].tolist()  # dolma2 tokens of the Shakespeare corpus
    cuts = np.cumsum([0, 300, 411, 250, 325, 517, 280, 300])
    docs = [tokens[a:b] for a, b in zip(cuts[:-1], cuts[1:])]
    paths = [root / "data" / "part-0.npy", root / "data" / "part-1.npy"]
    write_token_file(paths[0], docs[:4], np.uint32, EOS)  # 1290 tokens: 20 chunks of 64 = 40 instances
    write_token_file(paths[1], docs[4:], np.uint32, EOS)  # 1100 tokens: 17 chunks = 34 instances
    upstream(root / "run", root / "work", 3, paths, *flags)
    shutil.copytree(root / "run", root / "ref", ignore=shutil.ignore_patterns("upstream_steps.jsonl"))
    # OLMo-core's own continuation: resumes from ref/step3
    upstream(root / "ref", root / "work", last, paths, *flags)
    steps = {}
    for line in (root / "ref" / "upstream_steps.jsonl").read_text().splitlines():
        rec = json.loads(line)
        steps.setdefault(rec["step"], {"index": [], "loss": rec["loss"]})["index"] += rec["index"]
    assert sorted(steps) == list(range(4, last + 1))
    return {"step3": root / "run" / "step3", "ref": root / "ref", "steps": steps, "paths": paths}


@pytest.fixture(scope="module")
def fixture(tmp_path_factory) -> dict:
    """``{"step3", "ref", "steps": {k: {"index", "loss"}}}``: OLMo-core's run to step 3 and its own continuation."""
    return build_fixture(tmp_path_factory.mktemp("upstream"))


def project_cli(*args: str, run_dir: Path) -> None:
    env = os.environ | {"PRETRAIN_EXP_RUNS": str(run_dir.parent), "PRETRAIN_EXP_CACHE": str(CACHE_DIR),
                        "WANDB_SILENT": "true"}
    proc = subprocess.run([sys.executable, "-m", "pretrain_exp", *args, f"hydra.run.dir={run_dir}"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"


def trained(run_dir: Path) -> dict:
    """``{step: OLMo-core instance ids trained (all ranks, in row order q)}`` from ``rows/rank*.jsonl``."""
    out: dict = {}
    for f in sorted((run_dir / "rows").glob("rank*.jsonl")):
        for rec in map(json.loads, f.read_text().splitlines()):
            out.setdefault(rec["step"], {}).update(zip(rec["rows"], rec["index"]))
    return {k: [v[q] for q in sorted(v)] for k, v in out.items()}


def losses(run_dir: Path) -> dict:
    return {m["step"]: m["train/loss"] for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
            if "train/loss" in m}


def max_logit_diff(a: Path, b: Path) -> float:
    ids = torch.tensor([list(range(1000, 1064)), list(range(5000, 5064))])
    with torch.no_grad():
        return float((load_model(a)(ids) - load_model(b)(ids)).abs().max())


def assert_continues_upstream(run_dir: Path, fx: dict, last: int, world: int) -> None:
    """Every step trains OLMo-core's instances (split over ``world`` ranks as OLMo-core splits them), the loss of
    every step is within 5e-4 of OLMo-core's own continuation and the final logits within 1e-4."""
    rows, ls = trained(run_dir), losses(run_dir)
    assert sorted(rows) == list(range(4, last + 1))
    for k in rows:
        want = fx["steps"][k]["index"]  # rows q in order: rank r of W held q = (k-1)B + r + iW
        assert rows[k] == want, f"step {k}: {sum(a == b for a, b in zip(rows[k], want))}/8 rows"
        assert abs(ls[k] - fx["steps"][k]["loss"]) < 5e-4, (k, ls[k], fx["steps"][k]["loss"])
    diff = max_logit_diff(run_dir / "checkpoints" / f"step{last}", fx["ref"] / f"step{last}")
    print(f"steps 4..{last}, {world} process(es): loss diffs "
          f"{[abs(ls[k] - fx['steps'][k]['loss']) for k in rows]}, max |dlogits| {diff:.3g}, rows 8/8 every step")
    assert diff < 1e-4


# --- each of these failed on the previous main ----------------------------------------------------------


def test_settings_come_from_the_checkpoint_without_hand_copied_values(fixture):
    """Failure 1: step, L, B (instances), seed, token files, dtype and tokenizer are the checkpoint's."""
    cfg = make_config(*MINIMAL, f"model.path={fixture['step3']}", "training.num_steps=1", run_dir="/tmp/x")
    assert cfg.model.checkpoint_step == 3
    assert (cfg.training.sequence_length, cfg.training.global_batch_size) == (32, 8)
    assert (cfg.data.seed, cfg.data.first_epoch, cfg.data.dtype) == (34521, 1, "uint32")
    assert cfg.data.max_target_sequence_length == 64
    assert cfg.data.paths == [str(p) for p in fixture["paths"]]
    assert cfg.model.tokenizer == "dolma2"
    assert cfg.framework.lr_schedule == "checkpoint"
    # model=local still serves the hf framework (its checkpoints record nothing: step 0)
    assert compose("model=local", "model.path=/x").model.checkpoint_step == 0


def test_the_dataset_fingerprint_is_the_checkpoints(fixture, tmp_path):
    """Failure 2: dtype, max_target_sequence_length and tokenizer ids (vocab 100278, not the model's padded vocab)
    equal the checkpoint's, so OLMo-core's fingerprint matches without ignore_fingerprint_mismatch."""
    from pretrain_exp.app.experiment import Experiment

    cfg = make_config(*MINIMAL, f"model.path={fixture['step3']}", "training.num_steps=1", run_dir=tmp_path)
    exp = Experiment(cfg)
    fw = OlmoCoreFramework(cfg, fixture["step3"])
    dataset = fw.dataset(exp.order)
    assert dataset.max_target_sequence_length == 64 and dataset.vocab_size == 100278
    assert exp.order.chunk == 2  # OLMo-core shuffles pairs of instances; so does the run's order
    assert dataset.fingerprint == check_train_state(fixture["step3"])["data_loader"]["dataset_fingerprint"]


def test_optimizer_groups_and_lr_schedule_continue_the_checkpoints(fixture, tmp_path):
    """Failure 3: the checkpoint's AdamW with its groups (no weight decay on embeddings), clipping, z-loss, and
    its cosine over the original 20 steps at the absolute step (LR of step k = the original run's)."""
    from olmo_core.optim import AdamWConfig, CosWithWarmup

    cfg = make_config(*MINIMAL, f"model.path={fixture['step3']}", "training.num_steps=1", run_dir=tmp_path)
    fw = OlmoCoreFramework(cfg, fixture["step3"])
    optim = fw.optim_config()
    assert isinstance(optim, AdamWConfig) and (optim.lr, optim.weight_decay) == (4e-3, 0.1)
    assert [(g.params, g.opts) for g in optim.group_overrides] == [(["embeddings.weight"], {"weight_decay": 0.0})]
    assert (fw.max_grad_norm, fw.z_loss_multiplier) == (1.0, 1e-5)
    sched, original = fw.scheduler(), CosWithWarmup(warmup=2)
    for k in (4, 5, 6):
        assert sched.get_lr(4e-3, k, 4) == pytest.approx(original.get_lr(4e-3, k, 20), rel=1e-12)
        assert sched.get_lr(4e-3, k, 4) > 1e-3
    run = OlmoCoreFramework(make_config(*MINIMAL, f"model.path={fixture['step3']}", "training.num_steps=1",
                                        "framework.lr_schedule=run", run_dir=tmp_path), fixture["step3"])
    assert run.optim_config().group_overrides is None and run.max_grad_norm == cfg.training.max_grad_norm


def test_layouts_with_and_without_trainer_or_optimizer_state(fixture, tmp_path):
    """Failure 3 (layouts): model_and_optim/ with optimizer state is detected; a checkpoint without train/ gets
    one error naming model.checkpoint_step and train/rank0.pt, unless the step is given."""
    assert holds_optim_state(fixture["step3"])
    assert not holds_optim_state(tiny_checkpoint("olmo3_tiny", CACHE_DIR))
    bare = tmp_path / "bare"
    shutil.copytree(fixture["step3"], bare, ignore=shutil.ignore_patterns("train"))
    with pytest.raises(ConfigError, match=r"model.checkpoint_step.*train/rank0.pt"):
        make_config(*MINIMAL, f"model.path={bare}", "training.num_steps=1", run_dir=tmp_path)
    assert make_config(*MINIMAL, f"model.path={bare}", "model.checkpoint_step=3", "training.num_steps=1",
                       run_dir=tmp_path).model.checkpoint_step == 3


@pytest.mark.parametrize("named", ["file", "dir"])
def test_a_bare_tokenizer_json_takes_eos_and_pad_from_the_checkpoint(fixture, tmp_path, named):
    """A run whose OLMo-core ``TokenizerConfig`` named a bare ``tokenizer.json`` (no ``tokenizer_config.json`` to
    name EOS and pad), as the file itself or as the dir holding only it: the checkpoint's ``config.json``
    ``dataset.tokenizer`` ids are used and the run trains (it stopped with "has no EOS token"). The checkpoint is
    OLMo-core's; only the identifier string names the file or dir."""
    from pretrain_exp.data.assets import tokenizer_dir
    from pretrain_exp.data.tokenize import load_tokenizer

    bare = tmp_path / "tok" / "tokenizer.json"
    bare.parent.mkdir()
    shutil.copy(tokenizer_dir("dolma2", CACHE_DIR) / "tokenizer.json", bare)
    if named == "dir":
        bare = bare.parent
    with pytest.raises(DataError, match="has no EOS token"):
        load_tokenizer(str(bare), CACHE_DIR)
    ckpt = tmp_path / "ckpt" / "step3"
    shutil.copytree(fixture["step3"], ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    recorded = config["dataset"]["tokenizer"]
    config["dataset"]["tokenizer"]["identifier"] = str(bare)
    (ckpt / "config.json").write_text(json.dumps(config))
    cfg = make_config(*MINIMAL, f"model.path={ckpt}", "training.num_steps=1", run_dir=tmp_path / "x")
    assert cfg.model.tokenizer == str(bare)
    tok = load_tokenizer(OlmoCoreFramework(cfg, ckpt).tokenizer_path, CACHE_DIR)
    assert (tok.eos_token_id, tok.pad_token_id) == (recorded["eos_token_id"], recorded["pad_token_id"]) \
        == (EOS, 100277)
    project_cli(*MINIMAL, f"model.path={ckpt}", "training.num_steps=1", run_dir=tmp_path / "run")
    assert sorted(trained(tmp_path / "run")) == [4]


# --- against OLMo-core's own continuation ---------------------------------------------------------------


def test_the_batch_viewer_shows_the_rows_olmo_core_trained(fixture, tmp_path):
    """``pretrain-exp-inspect <checkpoint> step=K`` (its ``config.json`` only) gives, for steps 4-6, the instances
    OLMo-core's own continuation trained, in its row order, with the tokens of those instances."""
    env = os.environ | {"PRETRAIN_EXP_CACHE": str(CACHE_DIR)}
    cmd = [sys.executable, "-m", "pretrain_exp.inspect", str(fixture["step3"])]
    proc = subprocess.run([*cmd, "step=4"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    print(proc.stdout[:1500], proc.stderr, sep="\n")
    assert proc.stdout.count("--- step 4, row ") == 8
    assert f"8 rows: {8 * 32 * 4:,} bytes of tokens fetched" in proc.stderr
    out = tmp_path / "rows.jsonl"
    proc = subprocess.run([*cmd, "step=4-6", "--out", str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    for k in (4, 5, 6):
        mine = [r for r in rows if r["step"] == k]
        assert [r["instance"] for r in mine] == fixture["steps"][k]["index"]
        for r in mine:
            want = np.fromfile(r["path"], dtype=np.uint32)[r["file_offset"]:r["file_offset"] + 32]
            assert r["token_ids"] == want.tolist()


def test_one_step_continuation_equals_olmo_cores(fixture, tmp_path):
    run = tmp_path / "one"
    project_cli(*MINIMAL, f"model.path={fixture['step3']}", "training.num_steps=1", run_dir=run)
    assert_continues_upstream(run, fixture, last=4, world=1)


def test_three_step_continuation_on_two_processes_equals_olmo_cores(fixture, tmp_path):
    run = tmp_path / "two"
    project_cli(*MINIMAL, f"model.path={fixture['step3']}", "training.num_steps=3", "training.nproc_per_node=2",
                "training.micro_batch_size=4", run_dir=run)
    assert_continues_upstream(run, fixture, last=6, world=2)


def test_an_insertion_plan_lands_on_olmo_cores_rows(fixture, tmp_path, monkeypatch):
    """With a plan, steps 4-6 train OLMo-core's instances with exactly the planned rows' tokens."""
    from pretrain_exp.app.experiment import Experiment
    from pretrain_exp.frameworks.olmo_core import framework as olmo_core_framework

    seen = []

    class Record(olmo_core_framework.Insertions):
        def pre_step(self, batch):
            super().pre_step(batch)
            seen.append((self.trainer.global_step, batch["index"].tolist(), batch["input_ids"].clone()))

    monkeypatch.setattr(olmo_core_framework, "Insertions", Record)
    from olmo_core.data.data_loader import NumpyFSLDataLoader

    shuffles, build = [], NumpyFSLDataLoader._build_global_indices
    monkeypatch.setattr(NumpyFSLDataLoader, "_build_global_indices", lambda self: shuffles.append(self) or build(self))
    items = tmp_path / "items.jsonl"
    items.write_text("\n".join(json.dumps(list(range(200 + 20 * i, 220 + 20 * i))) for i in range(4)) + "\n")
    cfg = make_config(*[o for o in MINIMAL if not o.startswith("insertion")], "insertion=tokens",
                      f"insertion.experiments.tokens.file={items}", "insertion.experiments.tokens.repetitions=2",
                      f"model.path={fixture['step3']}", "training.num_steps=3", "training.checkpoint_interval=3",
                      run_dir=tmp_path / "run")
    exp = Experiment(cfg)
    assert exp.plan.num_insertions == 8
    exp.run()
    assert [k for k, _, _ in seen] == [4, 5, 6]
    changed = 0
    for k, index, ids in seen:
        assert index == fixture["steps"][k]["index"]
        for i in range(8):
            q = (k - 1) * 8 + i
            np.testing.assert_array_equal(ids[i].numpy(), exp.rows.row(q))
            changed += not np.array_equal(exp.rows.row(q), exp.order.row_tokens(q))
    assert changed == len(np.unique(exp.plan.affected_rows())) > 0
    # one order for the verifier and OLMo-core's trainer: the cached (chunk) permutation, expanded into the work dir
    assert shuffles == []
    (work,) = (tmp_path / "run" / "olmo_core_work").glob("global_indices_*")
    o = exp.order
    assert o.chunk == 2 and f"_chunk{o.chunk}_" in work.name
    chunks = np.fromfile(permutation_path(o.cache_dir, o.num_instances // o.chunk, o.seed + o.first_epoch), "<u4")
    expanded = (chunks.astype(np.int64)[:, None] * o.chunk + np.arange(o.chunk)).reshape(-1)
    assert np.array_equal(np.fromfile(work, "<u4"), expanded)
