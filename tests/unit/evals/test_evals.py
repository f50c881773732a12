"""Tests of the evals (insertion loss, memorization, perplexity, bootstrap) on a tiny real Llama model."""

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
from pretrain_exp.evals.base import EvalContext
from pretrain_exp.evals.registry import EVALS, parse_task_configs, run_eval
from pretrain_exp.evals.scoring import greedy_decode
from pretrain_exp.evals.stats import bootstrap_ci, per_dup_summary
from tests.conftest import EOS, TEXT_LEN, VOCAB, make_plan, random_item, tiny_model


def ctx_for(model, plan=None, held_out=None, batch_size=3, samples=500) -> EvalContext:
    return EvalContext(model=model, tokenizer=None, plan=plan,
                       held_out=np.empty((0, 8), np.int64) if held_out is None else held_out, step=0,
                       batch_size=batch_size, bootstrap_samples=samples, seed=1234)


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
    assert cfgs["mem"].prefix_length == 4 and cfgs["mem"].max_new_tokens == 32
    assert cfgs["ppl"].type == "perplexity"


@pytest.mark.parametrize("field", ["prefix_length", "max_new_tokens"])
def test_memorization_conf_rejects_non_positive(field):
    with pytest.raises(ConfigError, match=f"eval.tasks.memorization.{field}"):
        EVALS["memorization"].config(**{field: 0}).validate("eval.tasks.memorization")


# ------------------------------------------------------------ stats

def test_bootstrap_ci_contains_mean_and_is_deterministic():
    v = np.random.default_rng(3).normal(5.0, 2.0, size=200)
    mean, low, high = bootstrap_ci(v, 2000, seed=7)
    assert mean == pytest.approx(v.mean())
    assert low < mean < high
    # the 95% CI of a mean is about +-1.96 standard errors wide
    se = v.std(ddof=1) / math.sqrt(v.size)
    assert high - low == pytest.approx(2 * 1.96 * se, rel=0.15)
    assert bootstrap_ci(v, 2000, seed=7) == (mean, low, high)
    assert bootstrap_ci(v, 2000, seed=8) != (mean, low, high)
    narrow = bootstrap_ci(v, 2000, seed=7, level=0.5)
    assert low < narrow[1] < narrow[2] < high


def test_bootstrap_ci_degenerate_cases():
    assert bootstrap_ci(np.array([2.5]), 100, seed=0) == (2.5, 2.5, 2.5)
    mean, low, high = bootstrap_ci(np.array([1.0, 3.0]), 0, seed=0)
    assert mean == 2.0 and math.isnan(low) and math.isnan(high)
    assert all(math.isnan(x) for x in bootstrap_ci(np.array([]), 100, seed=0))
    assert bootstrap_ci(np.full(10, 4.0), 100, seed=0) == (4.0, 4.0, 4.0)
    with pytest.raises(ValueError):
        bootstrap_ci(np.ones(3), -1, seed=0)


def test_per_dup_summary_groups_and_sorts():
    rows = [{"experiment": e, "dup_count": d, "x": x}
            for e, d, x in [("b", 4, 1.0), ("a", 16, 2.0), ("a", 0, 3.0), ("a", 16, 4.0), ("b", 4, 5.0)]]
    out = per_dup_summary(rows, "x", 100, seed=0)
    assert [(g["experiment"], g["dup_count"], g["n_items"], g["mean"]) for g in out] == [
        ("a", 0, 1, 3.0), ("a", 16, 2, 3.0), ("b", 4, 2, 3.0)]
    assert out[0]["ci_low"] == out[0]["ci_high"] == 3.0
    assert 2.0 <= out[1]["ci_low"] <= out[1]["ci_high"] <= 4.0


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
    assert set(res.per_dup[0]) == {"experiment", "dup_count", "n_items", "mean_loss", "ci_low", "ci_high"}


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
    res = run_eval(EVALS["memorization"].config(prefix_length=4, max_new_tokens=32), ctx_for(model, plan))
    by_dup = {g["dup_count"]: g for g in res.per_dup}
    assert by_dup[4]["exact_match_rate"] == 1.0
    assert by_dup[0]["exact_match_rate"] < 1.0
    assert by_dup[4]["mean_matched_length"] == TEXT_LEN + 2 - 4
    assert by_dup[0]["mean_matched_length"] < by_dup[4]["mean_matched_length"]
    assert res.metrics["bios/dup4/exact_match_rate"] == 1.0
    assert all(r["continuation_length"] == TEXT_LEN + 2 - 4 for r in res.rows)


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
    model = tiny_model(2)
    P = 4
    prefix = [EOS, 5, 9, 77]
    g = naive_greedy(model, prefix, 8)
    wrong = (g[3] + 1) % VOCAB
    items = [(prefix + g[:8], 3, 0),                     # model reproduces all 8 -> exact
             (prefix + g[:3] + [wrong] + g[4:8], 3, 0),  # first 3 match
             (prefix + g[:6], 0, 0),                     # capped at max_new_tokens=5 -> exact
             (prefix + g[:1], 0, 0),                     # P + 1 tokens: skipped
             (prefix[:3], 0, 0)]                         # shorter than the prefix: skipped
    plan = make_plan(items)
    conf = EVALS["memorization"].config
    res = run_eval(conf(prefix_length=P, max_new_tokens=5), ctx_for(model, plan, 2))
    got = [(r["item_id"], r["exact_match"], r["matched_length"], r["continuation_length"]) for r in res.rows]
    assert got == [(0, True, 5, 5), (1, False, 3, 5), (2, True, 5, 5)]
    by_dup = {g["dup_count"]: g for g in res.per_dup}
    assert by_dup[3]["n_items"] == 2 and by_dup[3]["exact_match_rate"] == 0.5
    assert by_dup[3]["mean_matched_length"] == 4.0 and by_dup[0]["n_items"] == 1
    assert res.metrics["bios/dup3/mean_matched_length"] == 4.0
    # continuation shorter than max_new_tokens is compared on its own length
    res = run_eval(conf(prefix_length=P, max_new_tokens=32), ctx_for(model, plan, 2))
    assert [(r["item_id"], r["continuation_length"], r["exact_match"]) for r in res.rows] == [
        (0, 8, True), (1, 8, False), (2, 6, True)]


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
