"""The tiny OLMo-2 preset ``olmo2_tiny``: built once into the cache in OLMo-2's checkpoint layout, read back by the
converter as a fresh step-0 run whose data order is the project's default, and run on real dolma2 token ids.

Expectations come from elsewhere: the dolma2 tokenizer's own EOS/pad ids and vocabulary size, OLMo's
initialisation (normal of std 0.02 truncated at 3 std, norm weights 1: the loss of such a model is about
ln(vocabulary)), and torch's AdamW (an optimizer restored from zero moments at step 0 steps like a fresh one).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml

from pretrain_exp.core.errors import DataError
from pretrain_exp.frameworks.olmo2.convert import load_converted
from pretrain_exp.frameworks.olmo2.presets import TINY_CHECKPOINTS, tiny_checkpoint
from tests.conftest import CACHE_DIR

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TEXT = "From fairest creatures we desire increase, that thereby beauty's rose might never die."


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A fresh model cache sharing the session cache's assets, tokenizers and token files (the preset's corpus
    is tokenized once per machine, not per test)."""
    cache = tmp_path_factory.mktemp("cache")
    for sub in ("assets", "tokenizers", "tokens"):
        (CACHE_DIR / sub).mkdir(parents=True, exist_ok=True)
        (cache / sub).symlink_to(CACHE_DIR / sub)
    return cache


@pytest.fixture(scope="module")
def tiny(cache):
    return tiny_checkpoint("olmo2_tiny", cache)


@pytest.fixture(scope="module")
def dolma2():
    from pretrain_exp.data.tokenize import load_tokenizer

    return load_tokenizer("dolma2", CACHE_DIR)


def test_built_once_into_the_cache(cache, tiny):
    """Built once; the token files it records are their real paths, not the cache's link to them (the linked
    cache of a test process is removed at its exit, the model stays in the shared cache)."""
    models = cache / "models"
    assert tiny == models / "olmo2_tiny-v3" / "step0-unsharded"
    assert sorted(p.name for p in tiny.iterdir()) == ["config.yaml", "model.pt", "optim.pt", "train.pt"]
    assert json.loads((models / "olmo2_tiny-v3" / ".complete.json").read_text()) == {"preset": "olmo2_tiny",
                                                                                     "corpus": "shakespeare"}
    paths = [Path(p) for p in yaml.safe_load((tiny / "config.yaml").read_text())["data"]["paths"]]
    assert paths and all(p.is_file() and p == p.resolve() for p in paths)
    before = {p.name: p.stat().st_mtime_ns for p in tiny.iterdir()}
    assert tiny_checkpoint("olmo2_tiny", cache) == tiny
    assert {p.name: p.stat().st_mtime_ns for p in tiny.iterdir()} == before
    assert [p.name for p in models.iterdir() if p.name.startswith(".olmo2_tiny-v3-")] == []  # no temp dir left


def test_unknown_preset_names_the_presets(tmp_path):
    with pytest.raises(DataError, match=r"'olmo2_huge'.*presets: \['olmo2_tiny'\]"):
        tiny_checkpoint("olmo2_huge", tmp_path)
    assert not (tmp_path / "models" / "olmo2_huge").exists()


def test_config_uses_the_dolma2_tokenizer(tiny, dolma2):
    model = yaml.safe_load((tiny / "config.yaml").read_text())["model"]
    assert (model["eos_token_id"], model["pad_token_id"]) == (dolma2.eos_token_id, dolma2.pad_token_id)
    assert model["vocab_size"] == len(dolma2) and model["embedding_size"] == 100_352
    assert model["embedding_size"] % 128 == 0 and model["embedding_size"] - 128 < len(dolma2)


def test_loads_as_a_fresh_run_in_the_default_data_order(tiny):
    ck = load_converted(tiny)
    pos = ck.position
    assert (pos.global_step, pos.epoch, pos.global_train_examples_seen_this_epoch, pos.global_train_tokens_seen) == \
        (0, 0, 0, 0)
    d = ck.data
    assert (d.olmo2_seed, d.seed, d.first_epoch) == (1, 0, 1)  # the project's data.seed=0, first_epoch=1
    assert (d.sequence_length, d.global_batch_size, d.checkpoint_step) == (128, 8, 0)
    assert d.memmap_dtype == "uint32" and d.instance_filter is None and len(d.paths) == 1
    assert ck.model_config.vocab_size == 100_352 and ck.model_config.d_model == TINY_CHECKPOINTS["olmo2_tiny"].d_model
    for name, w in ck.model_state.items():
        if w.dim() == 1:
            assert torch.equal(w, torch.ones_like(w)), name
        else:
            assert w.abs().max() <= 0.06 and abs(w.std().item() - 0.02) < 0.003, name  # std 0.02, cut at 3 std
    assert {st["step"].item() for st in ck.optim_state["state"].values()} == {0.0}
    assert all(not st["exp_avg"].any() and not st["exp_avg_sq"].any() for st in ck.optim_state["state"].values())


def test_forward_on_dolma2_tokens_and_optimizer_restores_like_a_fresh_one(tiny, dolma2):
    ck = load_converted(tiny, attn_backend="torch")
    ids = torch.tensor([dolma2(TEXT)["input_ids"] + [dolma2.eos_token_id]])
    assert ids.max() < 100_278 and ids.shape[1] > 10

    def build():
        torch.manual_seed(0)
        model = ck.model_config.build(init_device="cpu")
        model.load_state_dict(ck.model_state)
        return model

    restored, fresh = build(), build()
    logits = restored(ids[:, :-1])
    assert logits.shape == (1, ids.shape[1] - 1, 100_352) and torch.isfinite(logits).all()
    loss = torch.nn.functional.cross_entropy(logits[0], ids[0, 1:])
    assert abs(loss.item() - math.log(100_352)) < 0.1  # near-uniform predictions of a std-0.02 init

    opt_restored, opt_fresh = ck.optim_config.build(restored), ck.optim_config.build(fresh)
    opt_restored.load_state_dict(ck.optim_state)
    for model, opt in ((restored, opt_restored), (fresh, opt_fresh)):
        torch.nn.functional.cross_entropy(model(ids[:, :-1])[0], ids[0, 1:]).backward()
        opt.step()
    changed = False
    for (name, a), (_, b) in zip(restored.named_parameters(), fresh.named_parameters()):
        assert torch.equal(a, b), name
        changed |= not torch.equal(a, ck.model_state[name])
    assert changed
