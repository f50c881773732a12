"""Tests of the membership-inference eval (scores, AUC, its interval and test, config) on a tiny real Llama
model."""

from __future__ import annotations

import logging
import zlib

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from pretrain_exp.core.errors import ConfigError
from pretrain_exp.evals.base import EvalContext
from pretrain_exp.evals.mia import MiaConf, item_bytes, membership_scores, roc_auc
from pretrain_exp.evals.registry import EVALS, parse_task_configs, run_eval
from tests.conftest import EOS, make_config, make_plan, random_item, tiny_model


def ctx_for(model, plan, tokenizer=None) -> EvalContext:
    return EvalContext(model=model, tokenizer=tokenizer, plan=plan, held_out=np.empty((0, 8), np.int64), step=0,
                       batch_size=3, seed=1234)


class StubTokenizer:
    """Decodes ids as space-separated words, dropping EOS when asked to skip special tokens."""

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(f"w{i}" for i in ids if not (skip_special_tokens and i == EOS))


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ------------------------------------------------------------ AUC

def pairwise_auc(members, nonmembers) -> float:
    m, o = np.asarray(members)[:, None], np.asarray(nonmembers)[None, :]
    return float(((m > o) + 0.5 * (m == o)).mean())


@pytest.mark.parametrize("seed", range(5))
def test_roc_auc_matches_pairwise_count_with_ties(seed):
    rng = np.random.default_rng(seed)
    m, o = rng.integers(0, 6, size=13).astype(float), rng.integers(0, 6, size=9).astype(float)  # many ties
    assert float(roc_auc(m, o)) == pytest.approx(pairwise_auc(m, o), abs=1e-12)
    assert float(roc_auc(m, o)) == pytest.approx(roc_auc_score([1] * 13 + [0] * 9, np.r_[m, o]), abs=1e-12)
    # batched over a leading axis
    mb, ob = rng.normal(size=(4, 7)).round(1), rng.normal(size=(4, 3)).round(1)
    np.testing.assert_allclose(roc_auc(mb, ob), [pairwise_auc(a, b) for a, b in zip(mb, ob)], atol=1e-12)


def test_roc_auc_extremes():
    assert float(roc_auc([5.0, 6.0, 7.0], [1.0, 2.0])) == 1.0
    assert float(roc_auc([1.0, 2.0], [5.0, 6.0, 7.0])) == 0.0
    assert float(roc_auc(np.full(4, 3.0), np.full(6, 3.0))) == 0.5
    assert float(roc_auc([1.0], [1.0])) == 0.5


# ------------------------------------------------------------ scores

def test_membership_scores_definitions():
    losses = np.array([1.0, 2.0, 3.0, 4.0, 10.0], np.float32)
    text = b"some item text"
    s = membership_scores(losses, text, 40.0)  # k = floor(5 * 0.4) = 2 highest losses: 10 and 4
    assert s["loss"] == pytest.approx(-4.0)
    assert s["zlib"] == pytest.approx(-4.0 / len(zlib.compress(text)))
    assert s["min_k"] == pytest.approx(-7.0)
    assert membership_scores(losses, text, 100.0)["min_k"] == pytest.approx(s["loss"], abs=1e-12)
    assert membership_scores(losses, text, 1.0)["min_k"] == -10.0  # k is at least 1


def test_item_bytes():
    tokens = np.array([0, 5, 300, 0], np.uint16)
    assert item_bytes(tokens, None) == np.array([0, 5, 300, 0], "<i4").tobytes()
    assert len(item_bytes(tokens, None)) == 16
    assert item_bytes(tokens, StubTokenizer()) == b"w5 w300"


# ------------------------------------------------------------ the eval

def test_mia_separates_trained_items_from_controls(trained):
    model, plan = trained
    res = run_eval(MiaConf(), ctx_for(model, plan))
    assert [r["item_id"] for r in res.rows] == list(range(8))
    assert set(res.rows[0]) == {"item_id", "experiment", "dup_count", "loss", "zlib", "min_k"}
    assert [(g["experiment"], g["dup_count"], g["score"]) for g in res.per_dup] == [
        ("bios", 4, "loss"), ("bios", 4, "zlib"), ("bios", 4, "min_k")]
    by_score = {g["score"]: g for g in res.per_dup}
    for g in res.per_dup:
        assert (g["n_members"], g["n_nonmembers"]) == (4, 4)
        assert 0.0 <= g["ci_low"] <= g["auc"] <= g["ci_high"] <= 1.0
        assert res.metrics[f"bios/dup4/{g['score']}_auc"] == g["auc"]
    assert by_score["loss"]["auc"] == 1.0
    assert by_score["min_k"]["auc"] >= 0.9
    assert set(res.metrics) == {f"bios/dup4/{s}_auc{x}" for s in ("loss", "zlib", "min_k")
                                for x in ("", "_ci_low", "_ci_high")}
    # the loss score is minus the insertion-loss eval's mean loss
    ins = run_eval(EVALS["insertion_loss"].config(), ctx_for(model, plan))
    np.testing.assert_allclose([r["loss"] for r in res.rows], [-r["loss"] for r in ins.rows], atol=1e-6)
    # Min-100% Prob is the mean log-probability, i.e. the loss score
    full = run_eval(MiaConf(min_k_percent=100.0), ctx_for(model, plan))
    np.testing.assert_allclose([r["min_k"] for r in full.rows], [r["loss"] for r in res.rows], atol=1e-9)


def test_mia_zlib_uses_decoded_text_and_skips_experiments_without_controls(caplog):
    rng = np.random.default_rng(1)
    items = [(random_item(rng, 9), 0, 0), (random_item(rng, 14), 2, 0), (random_item(rng, 5), 2, 0),
             (random_item(rng, 7), 4, 1), (random_item(rng, 11), 16, 1), ([EOS], 0, 0)]  # last: no loss
    plan = make_plan(items, experiments=("a", "b"))
    with caplog.at_level(logging.WARNING, logger="pretrain_exp.evals.mia"):
        res = run_eval(MiaConf(), ctx_for(tiny_model(1), plan, tokenizer=StubTokenizer()))
    assert [r["item_id"] for r in res.rows] == [0, 1, 2, 3, 4]
    for r, (tokens, _, _) in zip(res.rows, items):
        text = StubTokenizer().decode(tokens, skip_special_tokens=True).encode()
        assert r["zlib"] == pytest.approx(r["loss"] / len(zlib.compress(text)), rel=1e-12)
    assert {(g["experiment"], g["dup_count"]) for g in res.per_dup} == {("a", 2)}
    assert all(g["n_members"] == 2 and g["n_nonmembers"] == 1 for g in res.per_dup)
    # one control: no interval (never a zero-width one), the exact test over the 3 ways to pick the control
    assert all(np.isnan(g["ci_low"]) and g["ci_method"] == "none (n < 2)" and g["small_n"] for g in res.per_dup)
    assert all(e["p_method"] == "exact randomization" and e["p_value"] in (pytest.approx(2 / 3), 1.0)
               for e in res.effects)
    assert not any(k.startswith("b/") for k in res.metrics)
    assert any("'b'" in rec.getMessage() and "no dup-0 controls" in rec.getMessage() for rec in caplog.records)


# ------------------------------------------------------------ config

@pytest.mark.parametrize("value", [0.0, -5.0, 100.5])
def test_mia_conf_rejects_out_of_range(value):
    with pytest.raises(ConfigError, match=r"eval\.tasks\.mia\.min_k_percent"):
        MiaConf(min_k_percent=value).validate("eval.tasks.mia")
    with pytest.raises(ConfigError, match=r"eval\.tasks\.mia\.min_k_percent"):
        parse_task_configs({"mia": {"type": "mia", "min_k_percent": value}})["mia"].validate("eval.tasks.mia")


def test_mia_config_composes(tmp_path):
    cfg = make_config("eval=mia", run_dir=tmp_path)
    assert cfg.eval.tasks == {"mia": MiaConf(min_k_percent=20.0)}
    cfg = make_config("eval=mia", "eval.tasks.mia.min_k_percent=5", run_dir=tmp_path)
    assert cfg.eval.tasks["mia"].min_k_percent == 5.0
    with pytest.raises(ConfigError, match=r"eval\.tasks\.mia\.min_k_percent"):
        make_config("eval=mia", "eval.tasks.mia.min_k_percent=0", run_dir=tmp_path)
