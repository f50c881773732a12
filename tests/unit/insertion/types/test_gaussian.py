"""Gaussian poisoning: seeded noise regenerated from the saved plan, whole-row placement options, the embedding
hook adding exactly the planned noise in a real HF Trainer run, and the eval telling trained from fresh noise."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from scipy import stats as sps

import pretrain_exp.frameworks.hf.framework as hf
import pretrain_exp.frameworks.hf.trainer as hf_trainer
from pretrain_exp.app.experiment import Experiment
from pretrain_exp.core.capabilities import APPLIES_EMBEDDING_NOISE
from pretrain_exp.core.errors import ConfigError
from pretrain_exp.core.stats import permutation_p_value
from pretrain_exp.evals.base import EvalContext
from pretrain_exp.evals.gaussian import GaussianConf, embedding_gradients
from pretrain_exp.evals.gaussian import gaussian as gaussian_eval
from pretrain_exp.evals.gaussian import pattern_scores
from pretrain_exp.insertion.noise import EmbeddingNoise, NoiseSpec, make_noise, noise_seed
from pretrain_exp.insertion.plan import Plan, build_plan
from pretrain_exp.insertion.schema import (
    EosPolicy,
    PlacementConf,
    RangeUnit,
)
from pretrain_exp.insertion.types import load_items
from pretrain_exp.insertion.types.gaussian import GaussianConf as GaussianExperimentConf
from pretrain_exp.insertion.types.tokens import TokensConf
from tests.conftest import make_config, tiny_model

L, B, STEPS, VOCAB = 16, 4, 20, 100
WINDOW = (0, STEPS * B * L)


def gaussian_exp(num_items=4, repetitions=(0, 1, 2, 3), sigma=0.1, **placement) -> GaussianExperimentConf:
    return GaussianExperimentConf(num_items=num_items, repetitions=list(repetitions), sigma=sigma,
                                  placement=PlacementConf(**placement))


def plan_of(exps, seed=0):
    items = {n: load_items(n, e, tokenizer=None, vocab_size=VOCAB, sequence_length=L, seed=seed)
             for n, e in exps.items()}
    return build_plan(items, exps, WINDOW, L, B, seed, VOCAB), items


def test_noise_is_seeded_and_regenerates_from_the_saved_plan(tmp_path):
    plan, items = plan_of({"g": gaussian_exp(num_items=8, sigma=0.05)}, seed=7)
    plan.save(tmp_path / "plan.npz")
    plan.write_manifest(tmp_path / "manifest.jsonl", items)
    loaded = Plan.load(tmp_path / "plan.npz")
    assert loaded.digest() == plan.digest()
    spec, spec2 = NoiseSpec.from_plan(plan), NoiseSpec.from_plan(loaded)
    for a, b in zip((spec.rows, spec.seeds, spec.sigmas), (spec2.rows, spec2.seeds, spec2.sigmas)):
        np.testing.assert_array_equal(a, b)
    # the manifest alone regenerates every row's noise: one line per noised row with its pattern's seed and sigma
    lines = [json.loads(x) for x in (tmp_path / "manifest.jsonl").read_text().splitlines()]
    table = {r["item_id"]: r for r in map(json.loads, (tmp_path / "items.jsonl").read_text().splitlines())}
    assert sorted(r["position"] // L for r in lines) == plan.noise_rows.tolist()
    assert all(r["offset"] == 0 and r["length"] == L and r["sigma"] == 0.05 for r in lines)
    for r in lines:
        assert r["noise_seed"] == noise_seed(7, "g", table[r["item_id"]]["index"]) == table[r["item_id"]]["noise_seed"]
    dup = np.bincount([r["item_id"] for r in lines], minlength=plan.num_items)
    np.testing.assert_array_equal(dup, plan.item_dup_count)
    # deterministic in (seed, experiment, index), distinct otherwise; N(0, sigma^2) per coordinate
    z = make_noise(noise_seed(7, "g", 0), 128, 256, 0.05)
    assert torch.equal(z, make_noise(noise_seed(7, "g", 0), 128, 256, 0.05))
    for other in (noise_seed(7, "g", 1), noise_seed(8, "g", 0), noise_seed(7, "h", 0)):
        assert not torch.allclose(z, make_noise(other, 128, 256, 0.05))
    assert abs(z.mean().item()) < 1e-3 and abs(z.std().item() / 0.05 - 1) < 0.02
    assert make_noise(noise_seed(7, "g", 0), 128, 256, 0.05, torch.bfloat16).dtype == torch.bfloat16


def _steps(rows):
    return rows // B + 1


@pytest.mark.parametrize("placement, check", [
    (dict(steps=[2, 5, 9]), lambda q: set(_steps(q)) <= {2, 5, 9}),
    (dict(every_n_steps=3), lambda q: (_steps(q) % 3 == 0).all()),
    (dict(max_per_batch=1), lambda q: np.bincount(q // B).max() == 1),
    (dict(kind="range", start=0.5, end=0.75), lambda q: ((q >= 40) & (q < 60)).all()),
    (dict(kind="range", start=16 * B * L, end=20 * B * L, unit=RangeUnit.position),
     lambda q: (q >= 64).all()),
])
def test_placement_options_hold_for_noise_rows(placement, check):
    plan, _ = plan_of({"g": gaussian_exp(**placement)})
    q = plan.noise_rows
    assert q.size == 6 and np.unique(q).size == 6 and plan.num_insertions == 0
    assert check(q), q.tolist()
    np.testing.assert_array_equal(np.bincount(plan.noise_item_ids, minlength=4), plan.item_dup_count)


@pytest.mark.parametrize("tokens_name", ["a_tokens", "z_tokens"])  # placed before / after the noise rows
def test_noise_rows_hold_no_other_insertion(tmp_path, tokens_name):
    f = tmp_path / "t.jsonl"
    f.write_text("".join(json.dumps([5, 6, 7, 8, 9]) + "\n" for _ in range(10)))
    tok = TokensConf(file=str(f), eos=EosPolicy.none, repetitions=2)
    plan, _ = plan_of({tokens_name: tok, "g": gaussian_exp(num_items=20, repetitions=[0, 2, 4])})
    assert plan.num_insertions == 20 and plan.noise_rows.size > 0
    assert np.intersect1d(plan.affected_rows(), plan.noise_rows).size == 0
    row = np.zeros(L, np.int64)
    assert all(plan.apply(int(q), row) == 0 for q in plan.noise_rows)  # the tokens of a noise row stay as they are


def test_without_nothing_keeps_the_noise(tmp_path):
    """``without([])`` is the same plan, noise spans included (equal digest)."""
    f = tmp_path / "t.jsonl"
    f.write_text("".join(json.dumps([5, 6, 7, 8, 9]) + "\n" for _ in range(10)))
    plan, _ = plan_of({"t": TokensConf(file=str(f), eos=EosPolicy.none, repetitions=2), "g": gaussian_exp()})
    same = plan.without([])
    assert same.digest() == plan.digest() and same.noise_rows.size == plan.noise_rows.size > 0
    np.testing.assert_array_equal(same.noise_rows, plan.noise_rows)
    np.testing.assert_array_equal(same.item_noise_seed, plan.item_noise_seed)
    assert same.noise_sigma == plan.noise_sigma


def test_withholding_one_experiment_keeps_the_others_noise(tmp_path):
    """The CPDT alone arm: withholding a token experiment keeps every noise row (same rows, seeds and sigmas);
    withholding the gaussian one drops exactly its rows and keeps the other's noise."""
    f = tmp_path / "t.jsonl"
    f.write_text("".join(json.dumps([5, 6, 7, 8, 9]) + "\n" for _ in range(10)))
    exps = {"t": TokensConf(file=str(f), eos=EosPolicy.none, repetitions=2), "g": gaussian_exp(),
            "h": gaussian_exp(num_items=3, repetitions=[1, 2, 0], sigma=0.2)}
    plan, _ = plan_of(exps)
    spec = NoiseSpec.from_plan(plan)
    alone = plan.without(["t"])
    assert alone.num_insertions == 0 and alone.experiments == ["g", "h"]
    a = NoiseSpec.from_plan(alone)
    for x, y in ((a.rows, spec.rows), (a.seeds, spec.seeds), (a.sigmas, spec.sigmas)):
        np.testing.assert_array_equal(x, y)
    only_h = plan.without(["g", "t"])
    mine = plan.experiments.index("h") == plan.item_experiment[plan.noise_item_ids]
    h = NoiseSpec.from_plan(only_h)
    np.testing.assert_array_equal(h.rows, spec.rows[mine])
    np.testing.assert_array_equal(h.seeds, spec.seeds[mine])
    assert only_h.noise_sigma == {"h": 0.2} and set(h.sigmas) == {0.2}
    assert plan.without(["g", "h"]).noise_rows.size == 0 and plan.without(["g", "h"]).num_insertions == 20


def test_hook_api_checks_rows_and_leaves_other_rows_alone():
    spec = NoiseSpec(np.array([3, 10]), np.array([noise_seed(0, "g", 0), noise_seed(0, "g", 1)]), np.array([0.1, 0.2]))
    emb = torch.nn.Embedding(50, 8)
    noise = EmbeddingNoise(spec)
    handle = noise.attach(emb)
    ids = torch.arange(12).view(3, 4)
    clean = emb.weight[ids].detach()
    noise.set_rows(torch.tensor([10, 4, 3]))
    out = emb(ids).detach()
    torch.testing.assert_close(out[0] - clean[0], make_noise(spec.seeds[1], 4, 8, 0.2), rtol=0, atol=1e-6)
    torch.testing.assert_close(out[2] - clean[2], make_noise(spec.seeds[0], 4, 8, 0.1), rtol=0, atol=1e-6)
    assert torch.equal(out[1], clean[1])
    noise.set_rows(None)
    assert torch.equal(emb(ids), emb.weight[ids])
    noise.set_rows(torch.tensor([3, 4]))
    with pytest.raises(RuntimeError, match="set_rows got 2 rows"):
        emb(ids)
    handle.remove()


class _Recorder:
    """Stands in for ``AutoModelForCausalLM`` in the hf framework's trainer module: records
    each forward's clean embedding output (a hook registered before the noise hook) and the first decoder layer's
    input (after it)."""

    def __init__(self):
        self.clean, self.layer_in = [], []
        self.real = transformers.AutoModelForCausalLM

    def from_pretrained(self, *args, **kwargs):
        model = self.real.from_pretrained(*args, **kwargs)
        model.get_input_embeddings().register_forward_hook(lambda m, a, out: self.clean.append(out.detach().clone()))
        model.model.layers[0].register_forward_pre_hook(
            lambda m, a, kw: self.layer_in.append((a[0] if a else kw["hidden_states"]).detach().clone()),
            with_kwargs=True)
        return model


@pytest.mark.slow
def test_hf_trainer_adds_exactly_the_planned_noise(tmp_path, monkeypatch, tiny_model_dir):
    """A real Trainer run (2 steps, micro-batches of 4 rows): rows planned for noise get exactly their pattern
    added to the input embeddings; every other row enters the model untouched."""
    cfg = make_config("experiment=tiny", "wandb=disabled", "eval=[gaussian]", "training.num_threads=1",
                      "insertion=gaussian", "insertion.experiments.gaussian.num_items=4",
                      "insertion.experiments.gaussian.repetitions=[0,1,2,3]",
                      "insertion.experiments.gaussian.placement.steps=[1,2]", "training.num_steps=2",
                      "training.checkpoint_interval=2", run_dir=tmp_path)
    exp = Experiment(cfg)
    rec = _Recorder()
    monkeypatch.setattr(hf_trainer, "AutoModelForCausalLM", rec)
    exp.framework.train(exp.framework.initial_checkpoint(), 2, exp.rows, lambda m, s: None)
    plan, L_ = exp.plan, cfg.training.sequence_length
    assert plan.noise_rows.size == 6 and plan.noise_rows.max() < 16
    clean, noised = torch.cat(rec.clean), torch.cat(rec.layer_in)
    assert clean.shape[0] == noised.shape[0] == 16  # rows 0..15 in training order
    seeds = dict(zip(plan.noise_rows.tolist(), plan.item_noise_seed[plan.noise_item_ids].tolist()))
    for q in range(16):
        delta = noised[q] - clean[q]
        if q in seeds:
            want = make_noise(seeds[q], L_, clean.shape[-1], 0.075)
            torch.testing.assert_close(delta, want, rtol=0, atol=1e-6)
        else:
            assert torch.equal(delta, torch.zeros_like(delta)), q


def _noise_plan(dups, rows_of, sigma, seq_len, n_rows):
    """A one-experiment gaussian plan over ``n_rows`` rows with the given patterns and rows."""
    n = len(dups)
    noise_rows = np.concatenate([np.asarray(r, np.int64) for r in rows_of])
    items = np.concatenate([np.full(len(r), i, np.int32) for i, r in enumerate(rows_of)])
    order = np.argsort(noise_rows)
    return Plan(seq_len, 8, (0, n_rows * seq_len), ["g"], np.zeros(n + 1, np.int64), np.empty(0, np.uint16),
                np.zeros(n, np.int32), np.asarray(dups, np.int32), span_positions=noise_rows[order] * seq_len,
                span_item_ids=items[order], span_dup_index=np.zeros(noise_rows.size, np.int32),
                item_noise_seed=np.array([noise_seed(0, "g", i) for i in range(n)]), noise_sigma={"g": sigma})


def test_eval_tells_trained_noise_from_fresh_noise(one_torch_thread):
    """A tiny Llama trained 2 epochs on 64 random rows, 4 patterns added 8 times each: their gradient-noise
    scores are far below those of the 6 never-trained patterns (CI below 0, small permutation p); the untrained
    model shows no such difference."""
    rng = np.random.default_rng(0)
    seq_len, n_rows = 32, 64
    data = rng.integers(1, 128, size=(n_rows, seq_len))
    dups = [8, 8, 8, 8, 0, 0, 0, 0, 0, 0]
    perm = rng.permutation(n_rows)
    rows_of = [perm[8 * i:8 * i + 8] if d else [] for i, d in enumerate(dups)]
    plan = _noise_plan(dups, rows_of, 0.075, seq_len, n_rows)
    model = tiny_model()
    untrained = tiny_model()
    noise = EmbeddingNoise(plan)
    handle = noise.attach(model.get_input_embeddings())
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    for _ in range(2):
        for s in range(0, n_rows, 8):
            batch = torch.from_numpy(data[s:s + 8])
            noise.set_rows(torch.arange(s, s + 8))
            loss = model(input_ids=batch, labels=batch).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    handle.remove()
    assert noise.rows_noised == 2 * 32

    def run(m):
        ctx = EvalContext(m.eval(), None, plan, np.empty((0, seq_len), np.int64), 16, 8, 0,
                          row_tokens=lambda q: data[q])
        return gaussian_eval(GaussianConf(max_rows_per_item=4, permutations=500), ctx)

    res = run(model)
    g = next(r for r in res.per_dup if r["dup_count"] == 8)
    assert g["n_items"] == 4 and g["n_rows"] == 16 and g["n_controls"] == 6
    assert g["effect"] < -1.0 and g["effect_ci_high"] < 0 and g["p_value"] < 0.05, g
    assert g["effect_ci_method"] == "Welch t" and g["ci_method"] == "t" and g["small_n"]
    assert g["p_adjusted"] == g["p_value"]  # the only test of the family
    assert res.metrics["g/dup8/effect"] == g["effect"]
    assert [e["effect"] for e in res.effects] == [g["effect"]]
    assert len(res.rows) == 10
    null = next(r for r in run(untrained).per_dup if r["dup_count"] == 8)
    assert null["p_value"] > 0.05 and abs(null["effect"]) < abs(g["effect"]) / 4, null


def test_eval_intervals_and_holm_over_dup_counts(one_torch_thread):
    """Two dup counts (3 patterns at dup 2, one at dup 3) against 4 controls on an untrained model: every row names
    its interval, the one-pattern group has none, the effect's Welch interval is that of the patterns' own scores
    against the controls' scores on the same rows, and the two p-values are Holm-adjusted together."""
    rng = np.random.default_rng(1)
    seq_len, n_rows = 16, 12
    data = rng.integers(1, 128, size=(n_rows, seq_len))
    dups = [2, 2, 2, 3, 0, 0, 0, 0]
    rows_of = [[0, 1], [2, 3], [4, 5], [6, 7, 8], [], [], [], []]
    plan = _noise_plan(dups, rows_of, 0.1, seq_len, n_rows)
    ctx = EvalContext(tiny_model(3), None, plan, np.empty((0, seq_len), np.int64), 0, 4, 0,
                      row_tokens=lambda q: data[q], p_adjust="holm")
    res = gaussian_eval(GaussianConf(max_rows_per_item=4, permutations=199), ctx)
    by = {g["dup_count"]: g for g in res.per_dup}
    assert [by[d]["ci_method"] for d in (0, 2, 3)] == ["t", "t", "none (n < 2)"]
    assert all(g["small_n"] for g in res.per_dup) and np.isnan(by[3]["ci_low"])
    assert by[3]["effect_ci_method"] == "none (n < 2)" and by[2]["effect_ci_method"] == "Welch t"
    assert by[2]["effect_ci_low"] < by[2]["effect"] < by[2]["effect_ci_high"]
    own = [r["score"] for r in res.rows if r["dup_count"] == 2]
    assert by[2]["effect"] == pytest.approx(np.mean([r["paired_diff"] for r in res.rows if r["dup_count"] == 2]))
    assert by[2]["mean_score"] == pytest.approx(np.mean(own))
    grads = embedding_gradients(ctx.model, [data[q] for q in range(6)], 4)  # the dup-2 patterns' rows 0..5
    S = pattern_scores(grads, plan.item_noise_seed[4:], 0.1)  # (6 rows, 4 controls)
    ctrl = S.reshape(3, 2, 4).mean(axis=1).mean(axis=0)  # each control over the rows of each pattern, then patterns
    ci = sps.ttest_ind(own, ctrl, equal_var=False).confidence_interval(0.95)
    assert (by[2]["effect_ci_low"], by[2]["effect_ci_high"]) == pytest.approx((ci.low, ci.high), rel=1e-5)
    p = [by[2]["p_value"], by[3]["p_value"]]
    lo, hi = sorted(range(2), key=lambda i: p[i])
    want = [0.0, 0.0]
    want[lo] = min(1.0, 2 * p[lo])
    want[hi] = max(want[lo], p[hi])
    assert [by[2]["p_adjusted"], by[3]["p_adjusted"]] == pytest.approx(want)
    assert [e["p_adjusted"] for e in res.effects] == pytest.approx(want)
    assert res.metrics["g/dup2/p_adjusted"] == by[2]["p_adjusted"]


def test_permutation_p_value():
    a, b = np.array([5.0, 6.0, 7.0, 8.0]), np.array([0.0, 1.0, 0.5, 1.5, -0.5, 0.2])
    x = np.concatenate([a, b])

    def diff(perm):
        y = x[perm]
        return y[:4].mean() - y[4:].mean()

    obs, p = permutation_p_value(diff, x.size, 999, 0)
    assert obs == pytest.approx(a.mean() - b.mean())
    assert p < 0.02  # 1 split of 210 is as extreme (two-sided: 2 of 210)
    assert permutation_p_value(lambda perm: 1.0, 5, 99, 0)[1] == 1.0  # a statistic blind to labels: p = 1
    with pytest.raises(ValueError):
        permutation_p_value(diff, x.size, 0, 0)


def test_a_framework_without_the_hook_refuses_gaussian_rows(tmp_path, monkeypatch, tiny_model_dir):
    """A framework that does not apply the noise is refused when the config is validated, instead of silently
    training without it."""
    monkeypatch.setattr(hf.HFFramework, "capabilities", hf.HFFramework.capabilities.without(APPLIES_EMBEDDING_NOISE))
    with pytest.raises(ConfigError, match=r"framework.name: 'hf' does not apply the gaussian noise of \['gaussian'\]"):
        make_config("experiment=tiny", "wandb=disabled", "eval=[gaussian]", "insertion=gaussian", run_dir=tmp_path)
