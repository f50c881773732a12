"""The ``olmo2`` framework takes every run setting from the checkpoint: step, L, B, seed, epoch count, token files
and their dtype (``data.memmap_dtype: uint32`` for a 300-token vocabulary), tokenizer (a bare ``tokenizer.json``
whose EOS/pad come from ``model.eos_token_id``/``pad_token_id``), optimizer and param groups (allenai/OLMo
``olmo/optim.py`` ``get_param_groups``), gradient clipping and the instance filter (OLMo-core's
``InstanceFilterConfig``, the reference for OLMo's ``find_periodic_sequences`` mask)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml

from pretrain_exp.core.errors import ConfigError
from pretrain_exp.data.token_files import write_token_file
from pretrain_exp.frameworks.olmo2.convert import adamw_config, parameter_map
from pretrain_exp.frameworks.olmo2.framework import Olmo2Framework, check_continuation, masked_rows
from tests.conftest import CACHE_DIR, ROOT, make_config
from tests.unit.frameworks.olmo2 import olmo2_checkpoint as fx

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FILTER = {"repetition_max_period": 13, "repetition_min_period": 1, "repetition_max_count": 4}
REPEAT_EVERY = 3  #: instances 0, 3, 6, ... of each file are one token repeated L times (masked by FILTER)


def instance_tokens(f: int, n_instances: int) -> np.ndarray:
    """File ``f``'s tokens: ``n_instances`` rows of L, aperiodic except every ``REPEAT_EVERY``-th one."""
    values = (np.arange(n_instances * fx.SEQ_LEN) * 7 + f * 11) % fx.VOCAB
    for i in range(0, n_instances, REPEAT_EVERY):
        values[i * fx.SEQ_LEN:(i + 1) * fx.SEQ_LEN] = 5 + f
    return values


@pytest.fixture(scope="module")
def u32(tmp_path_factory):
    """The test checkpoint with ``memmap_dtype: uint32`` (uint16 would be inferred from its vocabulary), its two
    uint32 token files, a bare ``tokenizer.json`` as ``tokenizer.identifier`` and ``FILTER``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    root = tmp_path_factory.mktemp("olmo2u32")
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(fx.VOCAB)}, unk_token="t2"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(root / "tokenizer.json"))
    paths = []
    for f, n in enumerate((110, 70)):
        values = instance_tokens(f, n)
        paths.append(root / f"part-{f}.npy")
        write_token_file(paths[-1], [values[:-1].tolist()], np.uint32, int(values[-1]))
    ckpt = fx.write_olmo2_checkpoint(root / "ckpt", paths, config_changes={
        "data.memmap_dtype": "uint32", "data.instance_filter": dict(FILTER),
        "tokenizer.identifier": str(root / "tokenizer.json")})
    return ckpt, paths, root / "tokenizer.json"


def derived_run(ckpt, run_dir, *extra):
    return make_config("framework=olmo2", "model=local", f"model.path={ckpt}", *extra, run_dir=run_dir)


def test_every_setting_comes_from_the_checkpoint(u32, tmp_path):
    ckpt, paths, tok = u32
    cfg = derived_run(ckpt, tmp_path)
    assert cfg.model.checkpoint_step == fx.STEP
    assert (cfg.training.sequence_length, cfg.training.global_batch_size) == (fx.SEQ_LEN, fx.BATCH)
    assert (cfg.data.paths, cfg.data.dtype) == ([str(p) for p in paths], "uint32")
    assert (cfg.data.seed, cfg.data.first_epoch, cfg.model.tokenizer) == (fx.SEED - 1, 1, str(tok))
    check_continuation(cfg, ckpt)
    # an explicit equal value is accepted; a wrong one is today's one-line error naming the value to set
    check_continuation(derived_run(ckpt, tmp_path, f"training.global_batch_size={fx.BATCH}", "data.seed=6198",
                                   "data.first_epoch=0"), ckpt)
    with pytest.raises(ConfigError) as e:
        check_continuation(derived_run(ckpt, tmp_path, "training.global_batch_size=8"), ckpt)
    assert e.value.key == "training.global_batch_size" and f"training.global_batch_size={fx.BATCH}" in str(e.value)


@pytest.mark.slow  # ~15 s: a fresh interpreter imports Hydra, torch and the frameworks
def test_cfg_job_resolve_shows_the_derived_values(u32):
    ckpt, paths, _ = u32
    out = subprocess.run([sys.executable, "-m", "pretrain_exp", "framework=olmo2", "model=local",
                          f"model.path={ckpt}", "--cfg", "job", "--resolve"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PRETRAIN_EXP_CACHE": str(CACHE_DIR)})
    assert out.returncode == 0, out.stderr[-2000:]
    job = yaml.safe_load(out.stdout)
    assert job["model"]["checkpoint_step"] == fx.STEP and job["data"]["dtype"] == "uint32"
    assert (job["training"]["sequence_length"], job["training"]["global_batch_size"]) == (fx.SEQ_LEN, fx.BATCH)
    assert (job["data"]["seed"], job["data"]["paths"]) == (fx.SEED - 1, [str(p) for p in paths])


@pytest.mark.slow  # imports the hf framework
def test_model_local_keeps_step_0_for_hf(tiny_model_dir, tmp_path):
    cfg = make_config("model=local", f"model.path={tiny_model_dir}", run_dir=tmp_path)
    assert cfg.model.checkpoint_step == 0


def olmo2_groups(ckpt) -> dict:
    """The checkpoint's own optimizer groups (``optim.pt``, as OLMo's ``get_param_groups`` formed them) in
    OLMo-core names: weight decay -> sorted names."""
    from pretrain_exp.frameworks.olmo2.checkpoint import read_checkpoint

    raw = read_checkpoint(ckpt)
    pmap = parameter_map(raw.config)
    return {g["weight_decay"]: sorted(new for old in g["params"] for new, _, _ in pmap[old])
            for g in raw.optim_state["param_groups"]}


def test_optimizer_groups_are_olmo2s(u32):
    ckpt, _, _ = u32
    from pretrain_exp.frameworks.olmo2.checkpoint import read_config
    from pretrain_exp.frameworks.olmo2.convert import load_converted

    config = read_config(ckpt)
    model = load_converted(ckpt).model_config.build(init_device="meta")
    opt = adamw_config(config).build(model, strict=True)
    names = {id(p): n for n, p in model.named_parameters()}
    ours = {g["weight_decay"]: sorted(names[id(p)] for p in g["params"]) for g in opt.param_groups}
    assert ours == olmo2_groups(ckpt)
    assert ours[0.0] == ["embeddings.weight"] and "lm_head.norm.weight" in ours[fx.WD]
    assert {(g["lr"], tuple(g["betas"]), g["eps"]) for g in opt.param_groups} == {(fx.LR, fx.BETAS, fx.EPS)}
    # decay_norm_and_bias: false -> norms join the embedding; the legacy no_decay_norm_and_bias decides both
    for changes, no_decay in (({"decay_norm_and_bias": False}, 1 + 4 * fx.N_LAYERS + 1),
                              ({"no_decay_norm_and_bias": True, "decay_embeddings": True}, 1 + 4 * fx.N_LAYERS + 1),
                              ({"no_decay_norm_and_bias": False}, 0)):
        cfg = dict(config, optimizer={**config["optimizer"], **changes})
        groups = adamw_config(cfg).build(model, strict=True).param_groups
        assert sum(len(g["params"]) for g in groups if g["weight_decay"] == 0.0) == no_decay, changes


def test_lr_schedule_run_uses_training_settings(u32, tmp_path):
    from pretrain_exp.frameworks.olmo2.checkpoint import read_config
    from pretrain_exp.frameworks.olmo2.framework import run_max_grad_norm, run_optim_config

    ckpt, _, _ = u32
    config = read_config(ckpt)
    cfg = derived_run(ckpt, tmp_path)
    assert run_max_grad_norm(cfg, config) == 1.0 and run_optim_config(cfg, config).group_overrides
    cfg = derived_run(ckpt, tmp_path, "framework.lr_schedule=run", "training.weight_decay=0.05",
                      "training.max_grad_norm=2.0")
    opt = run_optim_config(cfg, config)
    assert (opt.weight_decay, opt.group_overrides, run_max_grad_norm(cfg, config)) == (0.05, None, 2.0)
    with pytest.raises(ConfigError, match="max_grad_norm_ratio"):
        run_max_grad_norm(derived_run(ckpt, tmp_path), dict(config, max_grad_norm_ratio=1.0))


def test_bare_tokenizer_json_gets_eos_and_pad_from_the_checkpoint(u32, tmp_path):
    from pretrain_exp.core.errors import DataError
    from pretrain_exp.data.tokenize import load_tokenizer

    _, _, tok = u32
    with pytest.raises(DataError, match="no EOS"):
        load_tokenizer(str(tok), CACHE_DIR)
    loaded = load_tokenizer(str(tok), CACHE_DIR, eos_token_id=fx.EOS, pad_token_id=fx.PAD)
    assert (loaded.eos_token_id, loaded.pad_token_id, len(loaded)) == (fx.EOS, fx.PAD, fx.VOCAB)


def test_instance_filter_masks_what_olmo_core_masks(u32, tmp_path):
    """Rows whose instance repeats one token L times are masked (OLMo-core's ``_validate_instance``), the others
    not, and OLMo-core's labels of a masked row are all ignored."""
    from olmo_core.data import DataCollator, InstanceFilterConfig
    from olmo_core.data.utils import get_labels

    from pretrain_exp.data.order import DataOrder
    from pretrain_exp.data.token_files import TokenFiles
    from pretrain_exp.data.tokenize import load_tokenizer

    ckpt, paths, tok = u32
    cfg = derived_run(ckpt, tmp_path)
    order = DataOrder(TokenFiles([str(p) for p in paths], np.uint32), fx.SEQ_LEN, fx.BATCH, cfg.data.seed,
                      first_epoch=1)
    qs = np.arange(fx.STEP * fx.BATCH, (fx.STEP + 2) * fx.BATCH)
    want = [q for q in qs if len(set(order.row_tokens(int(q)).tolist())) == 1]
    assert 0 < len(want) < len(qs)
    assert masked_rows(order, qs, InstanceFilterConfig(**FILTER)).tolist() == want

    class DatasetOnly(Olmo2Framework):  # no converted checkpoint needed
        vocab_size = fx.EMBEDDING
        source_config = yaml.safe_load((ckpt / "config.yaml").read_text())
        experiment_config: dict = {}  # a converted checkpoint records no OLMo-core dataset

    fw = DatasetOnly.__new__(DatasetOnly)
    fw.cfg, fw.run_dir = cfg, tmp_path
    fw.__dict__["_tokenizer"] = load_tokenizer(str(tok), CACHE_DIR, eos_token_id=fx.EOS, pad_token_id=fx.PAD)
    ds = fw.dataset(order)
    items = [ds[int(order.instance(int(q))[1])] for q in qs]
    assert [q for q, it in zip(qs, items) if not it["instance_mask"]] == want
    batch = DataCollator(pad_token_id=fx.PAD)(items)
    labels = get_labels(batch, label_ignore_index=-100)
    assert [q for q, row in zip(qs, labels) if (row == -100).all()] == want
    # an insertion in a masked instance would not be trained: refused before the trainer is built
    plan = SimpleNamespace(num_insertions=1, affected_rows=lambda: np.asarray([qs[0], want[0]]))
    with pytest.raises(ConfigError, match=f"training row {want[0]} ") as e:
        fw._build_trainer(None, fx.STEP + 1, SimpleNamespace(order=order, plan=plan), None)
    assert e.value.key == "data.instance_filter"


@pytest.mark.slow
def test_continued_end_to_end_with_nothing_hand_set(u32, tmp_path):
    """uint32 token files, the bare tokenizer.json, OLMo-2's optimizer groups and the instance filter, through
    ``Experiment``: the rows trained are OLMo-2's next rows, and the logged share of masked instances per step is
    the share of repetitive instances in the batch."""
    from pretrain_exp.app.experiment import Experiment
    from tests.unit.frameworks.olmo_core.test_framework import trained_rows

    ckpt, _, _ = u32
    run = tmp_path / "run"
    cfg = derived_run(ckpt, run, "insertion=none", "eval=[]", "training=tiny", "training.micro_batch_size=2",
                      "training.num_steps=2", "training.checkpoint_interval=2", "training.num_threads=1",
                      "training.log_rows=true", "data.held_out_rows=0", "wandb=disabled")
    exp = Experiment(cfg)
    assert exp.order.files.dtype == np.uint32 and exp.tokenizer.eos_token_id == fx.EOS
    assert exp.framework.dataset(exp.order).dtype == np.uint32  # OLMo-core's loader reads what the plan read
    opt = exp.framework.optim_config()
    assert opt.weight_decay == fx.WD and opt.group_overrides[0].params == ["embeddings.weight"]
    exp.run()
    rows = trained_rows(run)
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    masked = {m["step"]: m["train/masked_instances"] for m in metrics if "train/masked_instances" in m}
    for k in (fx.STEP + 1, fx.STEP + 2):
        qs = list(range((k - 1) * fx.BATCH, k * fx.BATCH))
        assert sorted(rows[k]) == qs
        repetitive = sum(len(set(exp.order.row_tokens(q).tolist())) == 1 for q in qs)
        assert masked[k] == pytest.approx(repetitive / fx.BATCH), (k, masked)
    assert any(masked.values())


@pytest.mark.slow
def test_one_trainer_step_is_olmo2s_adamw_step(u32, tmp_path):
    """The train module the run builds (optimizer, groups, clipping), loaded from the converted checkpoint, takes
    the step OLMo-2's trainer takes: torch AdamW over the fused OLMo-2 parameters in ``optim.pt``'s groups with
    its moments, after OLMo's global-norm clipping (allenai/OLMo ``olmo/optim.py``
    ``Optimizer._do_global_fixed_clipping``: ``g *= min(1, max_grad_norm / (norm + 1e-6))``)."""
    from olmo_core.distributed.checkpoint import load_model_and_optim_state

    from pretrain_exp.app.experiment import Experiment
    from pretrain_exp.frameworks.olmo2.checkpoint import read_checkpoint

    ckpt, _, _ = u32
    exp = Experiment(derived_run(ckpt, tmp_path / "run", "insertion=none", "eval=[]", "training=tiny",
                                 "training.micro_batch_size=2", "training.num_steps=1", "training.num_threads=1",
                                 "data.held_out_rows=0", "wandb=disabled"))
    module = exp.framework._build_trainer(exp.framework.initial_checkpoint(), fx.STEP + 1, exp.rows,
                                          lambda *a: None).train_module
    load_model_and_optim_state(str(exp.model_dir), module.model, module.optim)
    lr = 3e-3
    for g in module.optim.param_groups:
        g["lr"] = lr  # the schedule's value at the step (tested on its own); the same on both sides
    # OLMo-2: fused parameters, optim.pt groups and moments, global-norm clipping, torch AdamW
    raw = read_checkpoint(ckpt)
    fused = {n: torch.nn.Parameter(t.clone().float()) for n, t in raw.model_state.items()}
    ref = torch.optim.AdamW([{"params": [fused[n] for n in g["params"]], "weight_decay": g["weight_decay"],
                              "betas": tuple(g["betas"]), "eps": g["eps"], "lr": lr}
                             for g in raw.optim_state["param_groups"]])
    for n, st in raw.optim_state["state"].items():
        ref.state[fused[n]] = {k: torch.as_tensor(v, dtype=torch.float32).clone() for k, v in st.items()}
    gen = torch.Generator().manual_seed(0)
    grads = {n: torch.randn(p.shape, generator=gen) for n, p in fused.items()}
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()]))
    assert norm > raw.config["max_grad_norm"]  # clipping engages
    for n, p in fused.items():
        p.grad = grads[n] * torch.clamp(raw.config["max_grad_norm"] / (norm + 1e-6), max=1.0)
    ref.step()
    # the run's train module: the same gradients, split like the parameters
    pmap = parameter_map(raw.config)
    params = dict(module.model.named_parameters())
    for old, parts in pmap.items():
        for new, a, b in parts:
            params[new].grad = grads[old][a:None if b == -1 else b].clone()
    assert module.max_grad_norm == raw.config["max_grad_norm"]
    module._clip_grad_norm(module.max_grad_norm)
    module.optim.step()
    for old, parts in pmap.items():
        for new, a, b in parts:
            want = fused[old].detach()[a:None if b == -1 else b]
            torch.testing.assert_close(params[new].detach(), want, rtol=1e-6, atol=1e-7, msg=new)
