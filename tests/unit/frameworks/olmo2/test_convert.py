"""OLMo-2 (old trainer) checkpoints -> OLMo-core: model, AdamW moments, trainer position and data order.

A tiny checkpoint is written in OLMo-2's exact layout (:mod:`tests.unit.frameworks.olmo2.olmo2_checkpoint`). The
expectations come from elsewhere: transformers' ``Olmo2ForCausalLM`` loaded with the fused weights split the way
transformers' ``convert_olmo2_weights_to_hf.py`` splits them (done here, independently of the code under test), a direct
forward of the fused weights written from allenai/OLMo ``olmo/model.py``, torch's AdamW on the HF model, and
OLMo-2's data-order rule (``olmo/data/iterable_dataset.py``).
"""

from __future__ import annotations

import pathlib
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import transformers
import yaml

from pretrain_exp.core.errors import CheckpointError, ConfigError
from pretrain_exp.data.order import DataOrder
from pretrain_exp.data.token_files import TokenFiles, write_token_file
from pretrain_exp.frameworks.olmo2.checkpoint import read_checkpoint, read_train_state
from pretrain_exp.frameworks.olmo2.convert import (
    convert_model_state,
    export_hf,
    load_converted,
    optimizer_state_for,
    training_overrides,
    transformer_config,
)
from pretrain_exp.frameworks.olmo2.data_order import data_order, train_position
from tests.unit.frameworks.olmo2 import olmo2_checkpoint as fx

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ATOL = 2e-5


@pytest.fixture(scope="module")
def token_paths(tmp_path_factory):
    """Two uint16 token files of distinct token patterns."""
    root = tmp_path_factory.mktemp("tokens")
    paths = []
    for f, n in enumerate((1700, 1100)):  # 106 + 68 instances: the checkpoint (row 148) is inside epoch 0
        values = (np.arange(n) * 7 + f * 11) % fx.VOCAB
        paths.append(root / f"part-{f}.npy")
        write_token_file(paths[-1], [values[:-1].tolist()], np.uint16, int(values[-1]))
    return paths


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory, token_paths):
    return fx.write_olmo2_checkpoint(tmp_path_factory.mktemp("olmo2"), token_paths)


@pytest.fixture
def converted(ckpt_dir):
    """Loaded afresh per test: an optimizer updates the loaded moments in place."""
    return load_converted(ckpt_dir)


# --- the independent references ---------------------------------------------------------------------------


def fused_to_hf(sd):
    """OLMo-2 fused state -> HF ``Olmo2ForCausalLM`` state, as transformers' ``convert_olmo2_weights_to_hf.py``."""
    head_dim = fx.D_MODEL // fx.N_HEADS
    dims = [fx.D_MODEL, head_dim * fx.N_KV_HEADS, head_dim * fx.N_KV_HEADS]
    out = {"model.embed_tokens.weight": sd["transformer.wte.weight"],
           "model.norm.weight": sd["transformer.ln_f.weight"], "lm_head.weight": sd["transformer.ff_out.weight"]}
    for i in range(fx.N_LAYERS):
        o, h = f"transformer.blocks.{i}.", f"model.layers.{i}."
        q, k, v = torch.split(sd[o + "att_proj.weight"], dims, dim=0)
        up, gate = torch.chunk(sd[o + "ff_proj.weight"], 2, dim=0)
        out.update({h + "self_attn.q_proj.weight": q, h + "self_attn.k_proj.weight": k,
                    h + "self_attn.v_proj.weight": v, h + "self_attn.o_proj.weight": sd[o + "attn_out.weight"],
                    h + "self_attn.q_norm.weight": sd[o + "q_norm.weight"],
                    h + "self_attn.k_norm.weight": sd[o + "k_norm.weight"],
                    h + "mlp.gate_proj.weight": gate, h + "mlp.up_proj.weight": up,
                    h + "mlp.down_proj.weight": sd[o + "ff_out.weight"],
                    h + "post_attention_layernorm.weight": sd[o + "attn_norm.weight"],
                    h + "post_feedforward_layernorm.weight": sd[o + "ff_norm.weight"]})
    return out


def hf_model(sd):
    """``Olmo2ForCausalLM`` holding the fused weights ``sd``."""
    cfg = transformers.Olmo2Config(vocab_size=fx.EMBEDDING, hidden_size=fx.D_MODEL,
                                   intermediate_size=fx.MLP_HIDDEN // 2, num_hidden_layers=fx.N_LAYERS,
                                   num_attention_heads=fx.N_HEADS, num_key_value_heads=fx.N_KV_HEADS,
                                   max_position_embeddings=fx.SEQ_LEN, rms_norm_eps=1e-6, rope_theta=500000,
                                   tie_word_embeddings=False, attention_bias=False, pad_token_id=fx.PAD,
                                   eos_token_id=fx.EOS, bos_token_id=None)
    model = transformers.Olmo2ForCausalLM(cfg)
    model.load_state_dict(fused_to_hf(sd), strict=True)
    return model


def rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def olmo2_forward(sd, ids):
    """Logits of OLMo-2's ``OLMo.forward`` (``OLMoSequentialBlock``, ``norm_after``, full-width QK-norm, RoPE with
    ``rotate_half``, ``SwiGLU``: ``x, gate = x.chunk(2); silu(gate) * x``) written from ``olmo/model.py``."""
    B, T = ids.shape
    hd = fx.D_MODEL // fx.N_HEADS
    inv_freq = 1.0 / (500000 ** (torch.arange(0, hd, 2, dtype=torch.float) / hd))
    freqs = torch.outer(torch.arange(T, dtype=torch.float), inv_freq)
    pos = torch.cat((freqs, freqs), dim=-1)
    sin, cos = pos.sin(), pos.cos()

    def rope(t):
        t1, t2 = t.chunk(2, dim=-1)
        return t * cos + torch.cat((-t2, t1), dim=-1) * sin

    x = sd["transformer.wte.weight"][ids]
    for i in range(fx.N_LAYERS):
        p = lambda n: sd[f"transformer.blocks.{i}.{n}.weight"]  # noqa: E731
        q, k, v = (x @ p("att_proj").T).split([fx.D_MODEL, fx.N_KV_HEADS * hd, fx.N_KV_HEADS * hd], dim=-1)
        q, k = rms(q, p("q_norm")), rms(k, p("k_norm"))
        q = q.view(B, T, fx.N_HEADS, hd).transpose(1, 2)
        k = k.view(B, T, fx.N_KV_HEADS, hd).transpose(1, 2).repeat_interleave(fx.N_HEADS // fx.N_KV_HEADS, dim=1)
        v = v.view(B, T, fx.N_KV_HEADS, hd).transpose(1, 2).repeat_interleave(fx.N_HEADS // fx.N_KV_HEADS, dim=1)
        att = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True)
        att = att.transpose(1, 2).reshape(B, T, fx.D_MODEL) @ p("attn_out").T
        x = x + rms(att, p("attn_norm"))
        h, gate = (x @ p("ff_proj").T).chunk(2, dim=-1)
        x = x + rms((F.silu(gate) * h) @ p("ff_out").T, p("ff_norm"))
    return rms(x, sd["transformer.ln_f.weight"]) @ sd["transformer.ff_out.weight"].T


def core_model(converted):
    model = converted.model_config.build(init_device="cpu")
    model.load_state_dict(converted.model_state, strict=True)
    return model


def batch(seed=0, n=3):
    return torch.randint(0, fx.VOCAB, (n, fx.SEQ_LEN), generator=torch.Generator().manual_seed(seed))


def lm_loss(logits, ids):
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


# --- model ------------------------------------------------------------------------------------------------


def test_config_matches_olmo_core_olmo2_builders():
    """The peteish 1B/7B/13B ``model:`` sections give exactly OLMo-core's own OLMo-2 configs."""
    from olmo_core.nn.transformer import TransformerConfig

    published = {"n_kv_heads": None, "vocab_size": 100278, "embedding_size": 100352, "max_sequence_length": 4096,
                 "mlp_hidden_size": None}
    base = fx.olmo2_config([])["model"] | published
    for builder, shape in (("olmo2_1B_v2", dict(d_model=2048, n_heads=16, n_layers=16, mlp_ratio=8)),
                           ("olmo2_7B", dict(d_model=4096, n_heads=32, n_layers=32, mlp_hidden_size=22016)),
                           ("olmo2_13B", dict(d_model=5120, n_heads=40, n_layers=40, mlp_hidden_size=27648))):
        ours = transformer_config({"model": base | shape})
        ref = getattr(TransformerConfig, builder)(vocab_size=100352)
        assert ours.as_config_dict() == ref.as_config_dict(), builder
        assert ours.num_params == ref.num_params


def test_logits_and_loss_match_hf_and_olmo2_forward(converted):
    sd = fx.olmo2_model_state()
    ids = batch()
    with torch.no_grad():
        core = core_model(converted).eval()(ids)
        hf = hf_model(sd).eval()(input_ids=ids, labels=ids)
        ref = olmo2_forward(sd, ids)
    assert core.shape == (3, fx.SEQ_LEN, fx.EMBEDDING)
    assert core.std() > 0.2  # far from zero: differences in any weight would show
    torch.testing.assert_close(core, hf.logits, atol=ATOL, rtol=1e-5)
    torch.testing.assert_close(core, ref, atol=ATOL, rtol=1e-5)
    torch.testing.assert_close(lm_loss(core, ids), hf.loss, atol=1e-6, rtol=1e-6)
    # the fused halves are not interchangeable: swapping gate and up changes the logits
    swapped = dict(sd)
    for i in range(fx.N_LAYERS):
        up, gate = sd[f"transformer.blocks.{i}.ff_proj.weight"].chunk(2)
        swapped[f"transformer.blocks.{i}.ff_proj.weight"] = torch.cat([gate, up])
    assert (olmo2_forward(swapped, ids) - ref).abs().max() > 1e-2


# --- optimizer --------------------------------------------------------------------------------------------


def hf_moments(optim_sd):
    """OLMo-2 AdamW state -> per HF parameter name, split like the weights (:func:`fused_to_hf`)."""
    by_key = {k: fused_to_hf({n: st[k] for n, st in optim_sd["state"].items()}) for k in ("exp_avg", "exp_avg_sq")}
    step = next(iter(optim_sd["state"].values()))["step"]
    return {n: {"step": step.clone(), "exp_avg": by_key["exp_avg"][n], "exp_avg_sq": by_key["exp_avg_sq"][n]}
            for n in by_key["exp_avg"]}


def hf_adamw(model, moments=None, lr=fx.LR):
    """torch AdamW over the HF model with OLMo-2's groups (embedding not decayed) and, optionally, moments."""
    named = dict(model.named_parameters())
    no_decay = ["model.embed_tokens.weight"]
    decay = [n for n in named if n not in no_decay]
    opt = torch.optim.AdamW([{"params": [named[n] for n in decay]},
                             {"params": [named[n] for n in no_decay], "weight_decay": 0.0}],
                            lr=lr, betas=fx.BETAS, eps=fx.EPS, weight_decay=fx.WD)
    if moments is not None:
        sd = opt.state_dict()
        sd["state"] = {i: moments[n] for i, n in enumerate(decay + no_decay)}
        opt.load_state_dict(sd)
    return opt


def train_step(model, opt, ids, hf: bool):
    logits = model(input_ids=ids).logits if hf else model(ids)
    lm_loss(logits, ids).backward()
    opt.step()
    opt.zero_grad()


def to_hf_names(model, tensors):
    """OLMo-core-named tensors -> HF names with OLMo-core's own HF mapping."""
    from olmo_core.nn.hf.config import get_hf_config
    from olmo_core.nn.hf.convert import convert_state_to_hf

    return convert_state_to_hf(get_hf_config(model), dict(tensors))


def test_adamw_step_with_converted_moments_matches_hf(converted):
    """One AdamW step on OLMo-core (OLMo-core's ``AdamWConfig`` groups, converted moments and the checkpoint's
    scheduled lr) equals one step on HF (torch AdamW, moments split like the weights): parameters and moments
    agree after the step."""
    ids = batch(seed=1)
    ck_optim = fx.olmo2_optim_state(fx.olmo2_model_state())

    model_c = core_model(converted).train()
    opt_c = converted.optim_config.build(model_c)
    name_of = {id(p): n for n, p in model_c.named_parameters()}  # a positional load needs the same order
    assert [[name_of[id(p)] for p in g["params"]] for g in opt_c.param_groups] == \
        [g["params"] for g in converted.optim_state["param_groups"]]
    opt_c.load_state_dict(converted.optim_state)  # already in this optimizer's layout, with the saved group fields
    assert [(g["lr"], g["weight_decay"]) for g in opt_c.param_groups] == [(fx.LR / 2, 0.0), (fx.LR / 2, fx.WD)]
    train_step(model_c, opt_c, ids, hf=False)

    model_h = hf_model(fx.olmo2_model_state()).train()
    opt_h = hf_adamw(model_h, hf_moments(ck_optim), lr=fx.LR / 2)
    train_step(model_h, opt_h, ids, hf=True)

    after_c = to_hf_names(model_c, model_c.state_dict())
    after_h = model_h.state_dict()
    assert set(after_c) == set(after_h)
    for n in after_h:
        torch.testing.assert_close(after_c[n], after_h[n], atol=ATOL, rtol=1e-5, msg=n)
    for key in ("exp_avg", "exp_avg_sq"):
        mom_c = to_hf_names(model_c, {n: opt_c.state[p][key] for n, p in model_c.named_parameters()})
        named_h = dict(model_h.named_parameters())
        for n, p in named_h.items():
            torch.testing.assert_close(mom_c[n], opt_h.state[p][key], atol=1e-7, rtol=1e-5, msg=f"{n}.{key}")
    assert {float(st["step"]) for st in list(opt_c.state.values()) + list(opt_h.state.values())} == {fx.STEP + 1}

    # the moments matter: the same step from zero moments lands elsewhere
    model_0 = hf_model(fx.olmo2_model_state()).train()
    train_step(model_0, hf_adamw(model_0, lr=fx.LR / 2), ids, hf=True)
    assert max((model_0.state_dict()[n] - after_h[n]).abs().max() for n in after_h) > 1e-4


def test_optimizer_state_for_plain_adamw_over_parameters(converted, ckpt_dir):
    """One group over ``model.parameters()`` in order also loads, each moment landing on its own parameter."""
    model = core_model(converted)
    opt = torch.optim.AdamW(model.parameters(), lr=fx.LR)
    opt.load_state_dict(optimizer_state_for(opt, model, converted.optim_state))
    named = dict(model.named_parameters())
    raw = fx.olmo2_optim_state(fx.olmo2_model_state())["state"]
    up, gate = raw["transformer.blocks.1.ff_proj.weight"]["exp_avg"].chunk(2)
    assert torch.equal(opt.state[named["blocks.1.feed_forward.w1.weight"]]["exp_avg"], gate)
    assert torch.equal(opt.state[named["blocks.1.feed_forward.w3.weight"]]["exp_avg"], up)
    k = raw["transformer.blocks.0.att_proj.weight"]["exp_avg_sq"][fx.D_MODEL:fx.D_MODEL + 32]
    assert torch.equal(opt.state[named["blocks.0.attention.w_k.weight"]]["exp_avg_sq"], k)
    steps = [opt.state[p]["step"] for p in model.parameters()]
    assert len({s.data_ptr() for s in steps}) == len(steps)  # each parameter has its own step counter
    # the name-keyed layout itself is what torch.distributed.checkpoint's set_optimizer_state_dict takes
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    fresh = load_converted(ckpt_dir)
    model2 = core_model(fresh)
    opt2 = fresh.optim_config.build(model2)
    set_optimizer_state_dict(model2, opt2, fresh.optim_state)
    named2 = dict(model2.named_parameters())
    assert torch.equal(opt2.state[named2["blocks.1.feed_forward.w1.weight"]]["exp_avg"], gate)
    assert [g["weight_decay"] for g in opt2.param_groups] == [0.0, fx.WD]  # OLMo-core's groups kept
    with pytest.raises(CheckpointError, match="no converted state"):
        partial = {"state": {k: v for k, v in converted.optim_state["state"].items() if k != "embeddings.weight"}}
        optimizer_state_for(opt, model, partial)


def test_optim_state_groups_keep_olmo2_hyperparameters(converted):
    groups = converted.optim_state["param_groups"]
    assert [g["weight_decay"] for g in groups] == [0.0, fx.WD]  # OLMo-core's group order: overrides first
    assert groups[0]["params"] == ["embeddings.weight"] and "sharded" not in groups[0]
    model = core_model(converted)
    assert groups[1]["params"] == [n for n, _ in model.named_parameters()][1:]
    assert (groups[1]["lr"], groups[1]["initial_lr"]) == (fx.LR * 0.5, fx.LR)  # the scheduled lr at the checkpoint
    assert len(converted.optim_state["state"]) == sum(1 for _ in converted.model_state)
    opt = converted.optim_config
    assert (opt.lr, tuple(opt.betas), opt.eps, opt.weight_decay) == (fx.LR, fx.BETAS, fx.EPS, fx.WD)
    assert [(o.params, o.opts) for o in opt.group_overrides] == [(["embeddings.weight"], {"weight_decay": 0.0})]
    assert training_overrides(converted.config) == {"training.learning_rate": fx.LR, "training.weight_decay": fx.WD,
                                                    "training.adam_beta1": 0.9, "training.adam_beta2": 0.95,
                                                    "training.max_grad_norm": 1.0}


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_converted_state_roundtrips_through_an_olmo_core_checkpoint(converted, tmp_path):
    """Model + optimizer loaded from the conversion save and load as an OLMo-core ``model_and_optim`` checkpoint
    (the format OLMo-core's Trainer resumes from), every parameter, moment and step intact."""
    from olmo_core.distributed.checkpoint import load_model_and_optim_state, save_model_and_optim_state

    model = core_model(converted)
    opt = converted.optim_config.build(model)
    opt.load_state_dict(converted.optim_state)
    save_model_and_optim_state(tmp_path / "model_and_optim", model, opt)
    model2 = converted.model_config.build(init_device="cpu")
    opt2 = converted.optim_config.build(model2)
    load_model_and_optim_state(tmp_path / "model_and_optim", model2, opt2)
    named2 = dict(model2.named_parameters())
    for n, p in model.named_parameters():
        assert torch.equal(p, named2[n]), n
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(opt.state[p][key], opt2.state[named2[n]][key]), f"{n}.{key}"


# --- export -----------------------------------------------------------------------------------------------


def test_export_hf_reproduces_logits(converted, tmp_path):
    model = core_model(converted).eval()
    out = export_hf(model, tmp_path / "hf", converted.config)
    assert not [p for p in tmp_path.iterdir() if p.name != "hf"]  # no temp folder left
    hf = transformers.Olmo2ForCausalLM.from_pretrained(out).eval()
    assert (hf.config.max_position_embeddings, hf.config.eos_token_id) == (fx.SEQ_LEN, fx.EOS)
    ids = batch(seed=2)
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=ids).logits, model(ids), atol=ATOL, rtol=1e-5)
    with pytest.raises(FileExistsError):
        export_hf(model, out, converted.config)


# --- reading ----------------------------------------------------------------------------------------------


def test_read_strips_fsdp_prefixes_and_keeps_tensors(ckpt_dir):
    ck = read_checkpoint(ckpt_dir)
    ref = fx.olmo2_model_state()
    assert ck.model_state.keys() == ref.keys() and all(torch.equal(ck.model_state[k], ref[k]) for k in ref)
    names = [n for g in ck.optim_state["param_groups"] for n in g["param_names"]]
    assert names and not any("_fsdp_wrapped_module" in n for n in names)
    assert set(ck.optim_state["state"]) == set(ref)


@pytest.mark.parametrize("layout", ["safetensors", "int_keys"])
def test_other_layouts_read_the_same(tmp_path, token_paths, ckpt_dir, layout):
    """OLMo's ``.safetensors`` variant and an integer-keyed optimizer state give the same states as ``.pt``."""
    other = fx.write_olmo2_checkpoint(tmp_path, token_paths, safetensors=layout == "safetensors",
                                      int_keys=layout == "int_keys")
    a, b = read_checkpoint(ckpt_dir), read_checkpoint(other)
    assert all(torch.equal(a.model_state[k], b.model_state[k]) for k in a.model_state)
    assert a.optim_state["state"].keys() == b.optim_state["state"].keys()
    for n, st in a.optim_state["state"].items():
        assert all(torch.equal(st[k], b.optim_state["state"][n][k]) for k in st)
    strip = [{k: v for k, v in g.items() if k != "betas"} for g in b.optim_state["param_groups"]]
    assert strip == [{k: v for k, v in g.items() if k != "betas"} for g in a.optim_state["param_groups"]]


@pytest.mark.parametrize("numpy1_names", [True, False])
def test_train_pt_loads_through_the_allow_list(tmp_path, numpy1_names):
    """``train.pt`` with numpy arrays named as numpy 1.x (the published checkpoints) or numpy 2 wrote them."""
    fx.write_train_state(tmp_path / "train.pt", fx.olmo2_train_state(), numpy1_names)
    ckpt_dir = tmp_path
    unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(ckpt_dir / "train.pt")
    assert ("numpy.core.multiarray._reconstruct" in unsafe) == numpy1_names and "pathlib.PosixPath" in unsafe
    state = read_train_state(ckpt_dir)
    assert isinstance(state["checkpoints"][0], pathlib.PurePath)
    assert state["rng"]["numpy"][0] == "MT19937" and isinstance(state["rng"]["numpy"][1], np.ndarray)
    assert np.array_equal(state["rng"]["numpy"][1], fx.olmo2_train_state()["rng"]["numpy"][1])
    assert torch.equal(state["rng"]["torch"], torch.random.get_rng_state())
    with pytest.raises(Exception):  # the plain weights_only load refuses it: the allow-list is needed
        torch.load(ckpt_dir / "train.pt", weights_only=True)
    pos = train_position(state)
    assert (pos.global_step, pos.epoch, pos.global_train_examples_seen_this_epoch, pos.world_size) == \
        (fx.STEP, 0, fx.STEP * fx.BATCH, 2)
    assert pos.global_train_tokens_seen == fx.STEP * fx.BATCH * fx.SEQ_LEN


def test_forbidden_type_in_train_pt_is_refused(tmp_path):
    torch.save({"global_step": 1, "checkpoints": [Path("/a")], "args": Namespace(lr=1.0)}, tmp_path / "train.pt")
    with pytest.raises(CheckpointError) as ei:
        read_train_state(tmp_path)
    one_line(ei, str(tmp_path / "train.pt"), "refusing to unpickle argparse.Namespace")


def test_safetensors_with_a_global_is_refused(tmp_path, token_paths):
    import base64
    import pickle

    import safetensors.torch

    ckpt = fx.write_olmo2_checkpoint(tmp_path, token_paths)
    (ckpt / "model.pt").unlink()
    key = base64.urlsafe_b64encode(pickle.dumps(((pathlib.Path("x"),), False))).decode()
    safetensors.torch.save_file({key: torch.zeros(1)}, str(ckpt / "model.safetensors"))
    with pytest.raises(CheckpointError, match="model.safetensors.*refusing to load pathlib"):
        read_checkpoint(ckpt)


# --- data order -------------------------------------------------------------------------------------------


def test_data_order_continues_olmo2_order(converted, token_paths):
    d = converted.data
    assert d.overrides() == {"data.paths": [str(p) for p in token_paths], "data.seed": fx.SEED - 1,
                             "data.first_epoch": 1, "training.sequence_length": fx.SEQ_LEN,
                             "training.global_batch_size": fx.BATCH, "model.checkpoint_step": fx.STEP}
    assert d.olmo2_seed == fx.SEED and d.memmap_dtype == "uint16"
    assert d.instance_filter == {"repetition_max_period": 13, "repetition_min_period": 1, "repetition_max_count": 32}
    from olmo_core.data import InstanceFilterConfig

    assert InstanceFilterConfig(**d.instance_filter).repetition_max_count == 32  # OLMo-core's own field names
    # OLMo-2's IterableDataset: PCG64(seed + epoch 0) shuffles arange(N); instances are L-token chunks per file
    files = TokenFiles(token_paths, np.uint16)
    n = int(sum(files.num_tokens // fx.SEQ_LEN))
    olmo2_perm = np.arange(n, dtype=np.uint32)
    np.random.Generator(np.random.PCG64(fx.SEED + 0)).shuffle(olmo2_perm)
    ours = DataOrder(files, d.sequence_length, d.global_batch_size, d.seed, d.first_epoch)
    first_row = d.checkpoint_step * d.global_batch_size
    assert first_row + 2 * fx.BATCH <= ours.rows_per_epoch
    assert [ours.instance(q)[1] for q in range(ours.rows_per_epoch)] == olmo2_perm[:ours.rows_per_epoch].tolist()
    starts = np.concatenate([[0], np.cumsum(files.num_tokens // fx.SEQ_LEN)])
    for q in range(first_row, first_row + 2 * fx.BATCH):  # the next two steps after the checkpoint
        inst = int(olmo2_perm[q])
        f = int(np.searchsorted(starts, inst, side="right") - 1)
        expect = np.fromfile(token_paths[f], dtype=np.uint16)[(inst - starts[f]) * fx.SEQ_LEN:][:fx.SEQ_LEN]
        assert ours.row_tokens(q).tolist() == expect.tolist()


def test_data_seed_datasets_and_prefixes():
    pos = train_position(fx.olmo2_train_state())
    cfg = fx.olmo2_config([])
    cfg["data"] |= {"paths": None, "seed": 41, "datasets": {"wiki": ["s3://ai2-llm/w0.npy"],
                                                            "code": ["s3://ai2-llm/c0.npy", "s3://ai2-llm/c1.npy"]}}
    d = data_order(cfg, pos, path_prefixes={"s3://ai2-llm/": "/data/"})
    assert d.paths == ["/data/c0.npy", "/data/c1.npy", "/data/w0.npy"]  # labels sorted, as OLMo concatenates
    assert (d.seed, d.olmo2_seed) == (40, 41)
    with pytest.raises(ConfigError, match=r"^data\.paths: .*s3://ai2-llm/w0\.npy"):
        cfg["data"]["datasets"] = {"wiki": ["s3://ai2-llm/w0.npy"]}
        data_order(cfg, pos)


# --- bad input --------------------------------------------------------------------------------------------


def one_line(excinfo, *needles):
    msg = str(excinfo.value)
    assert msg and "\n" not in msg.strip(), msg
    for n in needles:
        assert n in msg, f"{n!r} not in {msg!r}"


@pytest.mark.parametrize("missing,needle", [("config.yaml", "config.yaml missing"),
                                            ("model.pt", "model state missing"),
                                            ("train.pt", "train.pt missing")])
def test_missing_file(tmp_path, token_paths, missing, needle):
    ckpt = fx.write_olmo2_checkpoint(tmp_path, token_paths)
    (ckpt / missing).unlink()
    with pytest.raises(CheckpointError) as ei:
        load_converted(ckpt)
    one_line(ei, str(ckpt), needle)


BAD_CONFIGS = {
    "llama block": ({"model.block_type": "llama"}, ConfigError, ["model.block_type", "'llama'", "config.yaml"]),
    "dropout": ({"model.residual_dropout": 0.1}, ConfigError, ["model.residual_dropout", "0.1"]),
    "norm before": ({"model.norm_after": False}, ConfigError, ["model.norm_after"]),
    "tied embeddings": ({"model.weight_tying": True}, ConfigError, ["model.weight_tying"]),
    "lion": ({"optimizer.name": "lionw"}, ConfigError, ["optimizer.name", "'lionw'"]),
    "custom dataset": ({"data.custom_dataset": {"name": "x"}}, ConfigError, ["data.custom_dataset"]),
    "label masks": ({"data.label_mask_paths": ["m.npy"]}, ConfigError, ["data.label_mask_paths"]),
    "memmap dtype": ({"data.memmap_dtype": "uint8"}, ConfigError, ["data.memmap_dtype", "uint8", "vocabulary"]),
    "odd mlp": ({"model.mlp_hidden_size": 191}, ConfigError, ["model.mlp_hidden_size", "191"]),
    "batch size change": ({"global_train_batch_size": 8}, CheckpointError, ["train.pt", "148", "296"]),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_unsupported_config(tmp_path, token_paths, case):
    changes, error, needles = BAD_CONFIGS[case]
    ckpt = fx.write_olmo2_checkpoint(tmp_path, token_paths, config_changes=changes)
    with pytest.raises(error) as ei:
        load_converted(ckpt)
    one_line(ei, *needles)
    if error is ConfigError:
        assert str(ei.value).startswith(f"{ei.value.key}: {ckpt / 'config.yaml'}: ")


def test_state_not_matching_config(tmp_path, token_paths):
    ckpt = fx.write_olmo2_checkpoint(tmp_path, token_paths, config_changes={"model.n_layers": 3})
    with pytest.raises(CheckpointError) as ei:
        load_converted(ckpt)
    one_line(ei, str(ckpt), "model state", "transformer.blocks.2.")
    cfg = yaml.safe_load((ckpt / "config.yaml").read_text())
    cfg["model"]["n_layers"] = 2
    cfg["model"]["n_kv_heads"] = 4
    with pytest.raises(CheckpointError) as ei:
        convert_model_state(fx.olmo2_model_state(), cfg)
    one_line(ei, "att_proj.weight", "(128, 64)", "192 rows")


def test_later_epoch_is_refused(ckpt_dir):
    pos = train_position(fx.olmo2_train_state(epoch=1))
    with pytest.raises(CheckpointError) as ei:
        data_order(yaml.safe_load((ckpt_dir / "config.yaml").read_text()), pos)
    one_line(ei, "epoch 1")
