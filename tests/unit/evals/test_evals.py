"""Tests of the evals (insertion loss, memorization, perplexity, bootstrap) on a tiny real Llama model; the effects,
intervals and tests of every eval are in ``test_effects.py``."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import pretrain_exp.evals.insertion_loss  # noqa: F401  (registration)
import pretrain_exp.evals.memorization  # noqa: F401
import pretrain_exp.evals.perplexity  # noqa: F401
from pretrain_exp.core.errors import ConfigError
from pretrain_exp.core.stats import per_dup_summary
from pretrain_exp.evals.base import EvalContext
from pretrain_exp.evals.registry import EVALS, parse_task_configs, run_eval
from pretrain_exp.evals.scoring import greedy_decode
from tests.conftest import EOS, VOCAB, make_plan, random_item, tiny_model


def ctx_for(model, plan=None, held_out=None, batch_size=3) -> EvalContext:
    return EvalContext(model=model, tokenizer=None, plan=plan,
                       held_out=np.empty((0, 8), np.int64) if held_out is None else held_out, step=0,
                       batch_size=batch_size, seed=1234)


def hand_loss(model, tokens) -> float:
    """Mean next-token loss of one sequence, unbatched and unpadded."""
    ids = torch.as_tensor(np.asarray(tokens, np.int64))[None]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    return float(F.cross_entropy(logits[:-1], ids[0, 1:]))


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ------------------------------------------------------------ registry

def test_all_evals_registered_and_configs_parse():
    cfgs = parse_task_configs({"mem": {"type": "memorization", "prefix_length": 4},
                               "loss": {"type": "insertion_loss"}, "ppl": {"type": "perplexity"}})
    assert {"insertion_loss", "memorization", "perplexity"} <= set(EVALS)
    assert cfgs["mem"].prefix_length == 4 and cfgs["mem"].suffix_length == 32 and cfgs["mem"].suffix == 32
    assert cfgs["mem"].max_new_tokens is None
    # the older name of the suffix length still sets it
    assert parse_task_configs({"mem": {"type": "memorization", "max_new_tokens": 5}})["mem"].suffix == 5
    assert cfgs["ppl"].type == "perplexity"


@pytest.mark.parametrize("field", ["prefix_length", "suffix_length", "max_new_tokens"])
def test_memorization_conf_rejects_non_positive(field):
    with pytest.raises(ConfigError, match=f"eval.tasks.memorization.{field}"):
        EVALS["memorization"].config(**{field: 0}).validate("eval.tasks.memorization")


# ------------------------------------------------------------ stats

def test_per_dup_summary_groups_and_sorts():
    rows = [{"experiment": e, "dup_count": d, "x": x}
            for e, d, x in [("b", 4, 1.0), ("a", 16, 2.0), ("a", 0, 3.0), ("a", 16, 4.0), ("b", 4, 5.0)]]
    out = per_dup_summary(rows, "x")
    assert [(g["experiment"], g["dup_count"], g["n_items"], g["mean"]) for g in out] == [
        ("a", 0, 1, 3.0), ("a", 16, 2, 3.0), ("b", 4, 2, 3.0)]
    # one item: no interval (not a zero-width one), and the row says why
    assert math.isnan(out[0]["ci_low"]) and math.isnan(out[0]["ci_high"]) and out[0]["ci_method"] == "none (n < 2)"
    # two items: the t interval, 3 -+ t_{0.975, 1} * sd / sqrt(2)
    half = 12.706204736174703 * math.sqrt(2.0) / math.sqrt(2)
    assert (out[1]["ci_low"], out[1]["ci_high"]) == pytest.approx((3.0 - half, 3.0 + half))
    assert out[1]["ci_method"] == "t" and all(g["small_n"] for g in out)


# ------------------------------------------------------------ insertion loss

def test_insertion_loss_matches_unbatched_forward_with_padding():
    model = tiny_model(1)
    rng = np.random.default_rng(1)
    # item 0 is short and shares batches with longer items (right padding); item 3 has a 2nd experiment
    items = [(random_item(rng, 3), 0, 0), (random_item(rng, 30), 2, 0), (random_item(rng, 11), 2, 0),
             (random_item(rng, 7), 0, 1), (random_item(rng, 19), 0, 0)]
    plan = make_plan(items, experiments=("a", "b"))
    res = run_eval(EVALS["insertion_loss"].config(), ctx_for(model, plan, batch_size=3))
    assert [r["item_id"] for r in res.rows] == list(range(5))
    for r, (tokens, dup, exp) in zip(res.rows, items):
        assert r["loss"] == pytest.approx(hand_loss(model, tokens), abs=1e-5)
        assert r["n_tokens"] == len(tokens) - 1
        assert (r["experiment"], r["dup_count"]) == (("a", "b")[exp], dup)
    # batch size must not matter
    single = run_eval(EVALS["insertion_loss"].config(), ctx_for(model, plan, batch_size=1))
    np.testing.assert_allclose([r["loss"] for r in single.rows], [r["loss"] for r in res.rows], atol=1e-5)
    a0 = np.mean([res.rows[i]["loss"] for i in (0, 4)])
    a2 = np.mean([res.rows[i]["loss"] for i in (1, 2)])
    assert res.metrics["a/dup0/mean_loss"] == pytest.approx(a0)
    assert res.metrics["a/dup2/mean_loss"] == pytest.approx(a2)
    assert res.metrics["a/loss_gap_max_vs_0"] == pytest.approx(a0 - a2)
    assert "b/loss_gap_max_vs_0" not in res.metrics  # b has controls only
    assert [(g["experiment"], g["dup_count"], g["n_items"]) for g in res.per_dup] == [
        ("a", 0, 2), ("a", 2, 2), ("b", 0, 1)]
    assert set(res.per_dup[0]) == {"experiment", "dup_count", "n_items", "mean_loss", "ci_low", "ci_high",
                                   "ci_method", "small_n"}
    assert [g["ci_method"] for g in res.per_dup] == ["t", "t", "none (n < 2)"]  # b's one control: no interval
    assert math.isnan(res.per_dup[2]["ci_low"]) and all(g["small_n"] for g in res.per_dup)


def test_insertion_loss_separates_trained_items_from_controls(trained):
    model, plan = trained
    res = run_eval(EVALS["insertion_loss"].config(), ctx_for(model, plan))
    dup0, dup4 = res.per_dup
    assert (dup0["dup_count"], dup4["dup_count"]) == (0, 4)
    assert dup4["mean_loss"] < dup0["mean_loss"]
    assert dup4["ci_high"] < dup0["ci_low"]
    assert res.metrics["bios/loss_gap_max_vs_0"] > 1.0


# ------------------------------------------------------------ memorization

def test_memorization_extracts_trained_items_only(trained):
    model, plan = trained
    res = run_eval(EVALS["memorization"].config(prefix_length=4, suffix_length=16), ctx_for(model, plan))
    by_dup = {g["dup_count"]: g for g in res.per_dup}
    assert by_dup[4]["exact_match_rate"] == 1.0 and by_dup[4]["fraction_matched"] == 1.0
    assert by_dup[0]["exact_match_rate"] < 1.0
    assert by_dup[4]["mean_matched_length"] == 16
    assert by_dup[0]["fraction_matched"] < 0.5 and by_dup[0]["mean_matched_length"] < 16
    assert res.metrics["bios/dup4/exact_match_rate"] == 1.0
    assert all(r["suffix_length"] == 16 and r["prefix_length"] == 4 for r in res.rows)
    # the rate's interval is Wilson's: at 4 of 4 it is not [1, 1]
    assert by_dup[4]["ci_method"] == "Wilson" and by_dup[4]["ci_low"] < 1.0 == by_dup[4]["ci_high"]
    # 20 text tokens: k + c = 21 skips every item (counted), the leading and trailing EOS do not count
    res = run_eval(EVALS["memorization"].config(prefix_length=5, suffix_length=16), ctx_for(model, plan))
    assert res.rows == [] and [g["n_skipped_short"] for g in res.per_dup] == [4, 4]
    assert res.metrics == {"bios/dup0/n_skipped_short": 4, "bios/dup4/n_skipped_short": 4}


def naive_greedy(model, prompt, steps):
    """Greedy decoding by re-running the whole sequence each step (no KV cache)."""
    ids = torch.as_tensor(np.asarray(prompt, np.int64))[None]
    with torch.no_grad():
        for _ in range(steps):
            ids = torch.cat([ids, model(input_ids=ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids[0, len(prompt):].tolist()


def test_greedy_decode_matches_uncached_decoding():
    model = tiny_model(2)
    prompts = torch.tensor([[EOS, 5, 9, 77], [EOS, 100, 3, 3]])
    out = greedy_decode(model, prompts, 6)
    assert out.shape == (2, 6) and out.dtype == torch.long
    for p, o in zip(prompts.tolist(), out.tolist()):
        assert o == naive_greedy(model, p, 6)


def test_greedy_decode_uses_the_current_cache_argument(caplog):
    """The KV cache goes back in under the name the model's ``forward`` takes now (transformers 5: ``cache``), so
    decoding raises no deprecation warning (it used to print a ``past_key_values`` FutureWarning at every eval)."""
    import logging
    import warnings

    model = tiny_model(2)
    caplog.set_level(logging.WARNING)
    transformers_logger = logging.getLogger("transformers")
    propagate, transformers_logger.propagate = transformers_logger.propagate, True  # its records into caplog
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            greedy_decode(model, torch.tensor([[EOS, 5, 9, 77]]), 4)
    finally:
        transformers_logger.propagate = propagate
    assert not [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]


def test_memorization_matched_length_and_skipping():
    """k text tokens after the leading EOS prompt the model, the next c text tokens are compared (the trailing EOS
    never), items with fewer than k + c text tokens are skipped and counted."""
    model = tiny_model(2)
    k, c = 3, 5
    prompt = [EOS, 5, 9, 77]  # the leading EOS and k = 3 text tokens
    g = naive_greedy(model, prompt, 8)
    wrong = (g[1] + 1) % VOCAB
    items = [(prompt + g[:5] + [EOS], 3, 0),                  # all 5 reproduced: k-extractable
             (prompt + [g[0], wrong] + g[2:5] + [EOS], 3, 0),  # miss at position 2: leading match 1, fraction 4/5
             (prompt + g[:8] + [EOS], 0, 0),                  # longer: still c = 5 compared
             (prompt + g[:4] + [EOS], 0, 0),                  # 7 text tokens < k + c: skipped
             (prompt[1:] + g[:5], 0, 0)]                      # no EOS at all (eos policy none): prompt 5, 9, 77
    plan = make_plan(items)
    conf = EVALS["memorization"].config
    res = run_eval(conf(prefix_length=k, suffix_length=c), ctx_for(model, plan, 2))
    got = [(r["item_id"], r["exact_match"], r["matched_length"], r["fraction_matched"]) for r in res.rows]
    assert got[:3] == [(0, True, 5, 1.0), (1, False, 1, 0.8), (2, True, 5, 1.0)]
    assert got[3][0] == 4 and all(r["suffix_length"] == c for r in res.rows)
    assert got[3][1:] == tuple((lambda h: (bool(h.all()), int(np.cumprod(h).sum()), float(h.mean())))(
        np.array(naive_greedy(model, [5, 9, 77], c)) == np.array(g[:5])))
    by_dup = {g["dup_count"]: g for g in res.per_dup}
    assert by_dup[3]["n_items"] == 2 and by_dup[3]["exact_match_rate"] == 0.5 and by_dup[3]["n_skipped_short"] == 0
    assert by_dup[3]["mean_matched_length"] == 3.0 and by_dup[3]["fraction_matched"] == pytest.approx(0.9)
    assert by_dup[0]["n_items"] == 2 and by_dup[0]["n_skipped_short"] == 1
    assert res.metrics["bios/dup0/n_skipped_short"] == 1 and res.metrics["bios/dup3/mean_matched_length"] == 3.0
    # the older key sets c the same way
    assert run_eval(conf(prefix_length=k, max_new_tokens=c), ctx_for(model, plan, 2)).rows == res.rows


# ------------------------------------------------------------ perplexity

def test_perplexity_equals_exp_of_hand_loss():
    model = tiny_model(3)
    held_out = np.random.default_rng(3).integers(0, VOCAB, size=(5, 12)).astype(np.int64)
    res = run_eval(EVALS["perplexity"].config(), ctx_for(model, held_out=held_out, batch_size=2))
    loss = np.mean([hand_loss(model, row) for row in held_out])  # equal lengths: mean of means
    assert res.metrics["held_out/loss"] == pytest.approx(loss, abs=1e-5)
    assert res.metrics["held_out/perplexity"] == pytest.approx(math.exp(loss), rel=1e-5)
    assert res.metrics["held_out/bits_per_token"] == pytest.approx(loss / math.log(2), abs=1e-5)
    assert res.metrics["held_out/tokens"] == 5 * 11
    assert math.log(VOCAB) - 0.5 < loss < math.log(VOCAB) + 0.5  # untrained: near uniform


def test_perplexity_of_empty_held_out_is_empty():
    res = run_eval(EVALS["perplexity"].config(), ctx_for(tiny_model(), held_out=np.empty((0, 16), np.int64)))
    assert res.metrics == {} and res.rows == []
