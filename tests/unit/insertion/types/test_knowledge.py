"""Fictional knowledge: the fact generator, identical vs paraphrase items, probes, placement of knowledge items, the
teacher-forced greedy test, and the ``knowledge`` eval on a tiny real run (SmolLM2 tokenizer, Shakespeare corpus)."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from pretrain_exp.core.errors import ConfigError
from pretrain_exp.data.assets import iter_texts
from pretrain_exp.evals.base import EvalContext
from pretrain_exp.evals.knowledge import KnowledgeConf, summarize
from pretrain_exp.evals.registry import run_eval
from pretrain_exp.evals.scoring import continuation_scores, greedy_decode
from pretrain_exp.insertion.plan import build_plan
from pretrain_exp.insertion.schema import InsertionConf, PlacementConf
from pretrain_exp.insertion.types import load_items
from pretrain_exp.insertion.types.knowledge import (
    ATTRIBUTES,
    NUM_HELD_OUT_TEMPLATES,
    NUM_TRAINING_TEMPLATES,
)
from pretrain_exp.insertion.types.knowledge import KnowledgeConf as KnowledgeExperimentConf
from pretrain_exp.insertion.types.knowledge import (
    KnowledgeRepeat,
    generate_facts,
    item_templates,
    knowledge_items,
    probes,
)
from tests.conftest import CACHE_DIR, tiny_model
from tests.integration.test_cli import cli

L, B, STEPS = 128, 8, 12
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def kexp(**kw) -> KnowledgeExperimentConf:
    kw = {"num_items": 16, "repetitions": [0, 1, 4, 16], **kw}
    return KnowledgeExperimentConf(**kw)


def items_of(exp, tokenizer, name="facts", seed=0):
    return load_items(name, exp, tokenizer=tokenizer, vocab_size=len(tokenizer), sequence_length=L, seed=seed)


def plan_of(experiments, tokenizer, steps=STEPS):
    items = {n: items_of(e, tokenizer, n) for n, e in experiments.items()}
    return build_plan(items, experiments, (0, steps * B * L), L, B, 0, len(tokenizer)), items


# ------------------------------------------------------------ generator

@pytest.mark.slow  # reads the 5 MB corpus (a few seconds)
def test_facts_deterministic_distinct_and_fictional():
    facts = generate_facts(200, seed=0, name="facts")
    assert facts == generate_facts(200, seed=0, name="facts")
    assert [f.entity for f in generate_facts(10, seed=0, name="facts")] == [f.entity for f in facts[:10]]
    assert {f.entity for f in generate_facts(50, 1, "facts")}.isdisjoint(f.entity for f in facts[:50])
    assert {f.entity for f in generate_facts(50, 0, "other")}.isdisjoint(f.entity for f in facts[:50])
    assert len({f.entity for f in facts}) == 200
    assert Counter(f.attribute for f in facts) == {a.name: 40 for a in ATTRIBUTES}
    # no entity name and no fictional value (town, company, mentor) occurs in the training corpus
    corpus = "\n".join(text for _, text in iter_texts("shakespeare", CACHE_DIR))
    assert len(corpus) > 1_000_000
    words = set(re.findall(r"[A-Za-z]+", corpus))
    for f in facts:
        assert f.entity not in corpus and f.entity.split()[1] not in words
        if f.attribute in ("birth_town", "mentor"):
            assert f.value not in corpus and f.value.split()[-1] not in words


def test_templates_distinct_and_probes_end_right_before_the_target(tokenizer):
    for a in ATTRIBUTES:
        assert len(a.training) == NUM_TRAINING_TEMPLATES and len(a.held_out) == NUM_HELD_OUT_TEMPLATES
        prompts = [p for p, _ in a.training + a.held_out]
        assert len(set(prompts)) == len(prompts) and all(p.count("{e}") == 1 for p in prompts)
    exp = kexp(repeat=KnowledgeRepeat.paraphrase)
    facts, kitems = knowledge_items("facts", exp, 0)
    items = items_of(exp, tokenizer)
    eos = tokenizer.eos_token_id
    for it, item in zip(kitems, items):
        fact = facts[it.fact]
        assert item.text == it.text == fact.sentence(it.template) and item.source == it.source
        assert item.tokens[0] == eos and item.tokens[-1] == eos  # EOS-wrapped like every text item
        # the memorization probe is a token prefix of the item; the next tokens are the value
        kind, template, prompt = probes(fact, [it.template])[0]
        assert kind == "memorization" and template == it.template and it.text.startswith(prompt + " " + fact.value)
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        full = tokenizer(prompt + " " + fact.value, add_special_tokens=False)["input_ids"]
        assert full[:len(p)] == p and item.tokens[1:1 + len(full)].tolist() == full
        assert tokenizer.decode(full[len(p):]) == " " + fact.value
    # every paraphrase of a fact is a different sentence
    by_fact = {}
    for it in kitems:
        by_fact.setdefault(it.fact, []).append(it.text)
    assert all(len(set(t)) == len(t) for t in by_fact.values())


@pytest.mark.parametrize("d, P, expected", [
    (0, 4, [(0, 0), (1, 0), (2, 0), (3, 0)]), (1, 4, [(0, 1)]), (3, 4, [(0, 1), (1, 1), (2, 1)]),
    (6, 4, [(0, 2), (1, 2), (2, 1), (3, 1)]), (16, 4, [(0, 4), (1, 4), (2, 4), (3, 4)]), (5, 2, [(0, 3), (1, 2)])])
def test_paraphrase_items_cycle_through_templates(d, P, expected):
    assert item_templates(d, KnowledgeRepeat.paraphrase, P) == expected
    assert item_templates(d, KnowledgeRepeat.identical, P) == [(0, d)]


def test_identical_vs_paraphrase_items(tokenizer):
    ident = knowledge_items("facts", kexp(), 0)
    para = knowledge_items("facts", kexp(repeat=KnowledgeRepeat.paraphrase, paraphrases=3), 0)
    assert ident[0] == para[0]  # the same facts and fact dup counts: only the items differ
    fact_dup = {it.fact: it.dup_count for it in ident[1]}
    assert len(ident[1]) == 16 and sorted(Counter(fact_dup.values()).items()) == [(0, 4), (1, 4), (4, 4), (16, 4)]
    para_dup = Counter()
    for it in para[1]:
        para_dup[it.fact] += it.dup_count
        assert it.source == f"knowledge:0:facts:f{it.fact}:t{it.template}" and it.template < 3
    assert para_dup == fact_dup
    assert len(para[1]) == 4 * 3 + 4 * 1 + 4 * 3 + 4 * 3  # controls keep all 3 templates at dup 0
    # each dup count's facts cover the attributes evenly (controls and inserted facts alike)
    for d in (0, 1, 4, 16):
        attrs = Counter(ident[0][f].attribute for f, fd in fact_dup.items() if fd == d)
        assert max(attrs.values()) - min(attrs.values()) <= 1 and len(attrs) == 4


# ------------------------------------------------------------ plan, items.jsonl, placement

def test_generalization_probes_never_inserted(tmp_path, tokenizer):
    exps = {"ident": kexp(), "para": kexp(repeat=KnowledgeRepeat.paraphrase)}
    plan, items = plan_of(exps, tokenizer)
    plan.write_manifest(tmp_path / "manifest.jsonl", items)
    recs = [json.loads(x) for x in (tmp_path / "items.jsonl").read_text().splitlines()]
    manifest = [json.loads(x) for x in (tmp_path / "manifest.jsonl").read_text().splitlines()]
    inserted = {r["item_id"] for r in manifest}
    texts = [r["text"] for r in recs if r["item_id"] in inserted]
    assert {r["dup_count"] > 0 for r in recs if r["item_id"] in inserted} == {True}
    streams = [plan.item_tokens(i).tolist() for i in inserted]
    for name in exps:
        facts, kitems = knowledge_items(name, exps[name], 0)
        for f in facts:
            for kind, _, prompt in probes(f, range(NUM_TRAINING_TEMPLATES)):
                if kind == "generalization":
                    assert not any(prompt in t for t in texts)
                    ids = tokenizer(prompt + " " + f.value, add_special_tokens=False)["input_ids"]
                    assert not any(_contains(s, ids[1:]) for s in streams)
        # items.jsonl names the fact and template of every item
        mine = [r for r in recs if r["experiment"] == name]
        assert [r["source"] for r in mine] == [it.source for it in kitems]
        fact_of = {r["source"]: int(re.search(r":f(\d+):t\d+$", r["source"])[1]) for r in mine}
        assert [fact_of[it.source] for it in kitems] == [it.fact for it in kitems]


def _contains(seq, sub) -> bool:
    return any(seq[i:i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


@pytest.mark.parametrize("placement, allowed", [
    (PlacementConf(steps=[3, 7, 11]), {3, 7, 11}),
    (PlacementConf(every_n_steps=4), {4, 8, 12}),
    (PlacementConf(kind="range", start=0.5, end=1.0), set(range(7, 13))),
])
def test_placement_options_for_knowledge(tokenizer, placement, allowed):
    exp = kexp(num_items=8, repetitions=[0, 6], repeat=KnowledgeRepeat.paraphrase, placement=placement)
    plan, _ = plan_of({"facts": exp}, tokenizer)
    steps = plan.positions // (B * L) + 1
    assert plan.num_insertions == 4 * 6 and set(steps.tolist()) <= allowed


def test_at_most_one_knowledge_item_per_batch(tokenizer):
    exp = kexp(num_items=6, repetitions=[0, 4], repeat=KnowledgeRepeat.paraphrase,
               placement=PlacementConf(max_per_batch=1))
    plan, _ = plan_of({"facts": exp}, tokenizer)
    steps = plan.positions // (B * L) + 1
    assert plan.num_insertions == 12 and sorted(Counter(steps.tolist()).values()) == [1] * 12


# ------------------------------------------------------------ scoring

def test_continuation_scores_match_greedy_decoding_and_log_softmax():
    model = tiny_model(5)
    prompt = [0, 5, 9, 77, 3]
    greedy = greedy_decode(model, torch.tensor([prompt]), 3)[0].tolist()
    other = [(greedy[0] + 1) % 128, greedy[1]]
    contexts, conts = [prompt, prompt, prompt[:2]], [greedy, other, [7]]
    scores = continuation_scores(model, contexts, conts, batch_size=2)
    assert [s[1] for s in scores[:2]] == [True, False]
    for (lp, _), c, k in zip(scores, contexts, conts):
        ids = torch.tensor([c + k])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
        hand = [float(logp[len(c) - 1 + j, k[j]]) for j in range(len(k))]
        np.testing.assert_allclose(lp, hand, atol=1e-5)
    with pytest.raises(ValueError):
        continuation_scores(model, [prompt], [[]], 1)


def test_summary_effects_and_fact_averaging():
    rows = []
    for fact, dup, vals in [(0, 0, [-4.0, -6.0]), (1, 0, [-6.0]), (2, 4, [-1.0, -3.0]), (3, 4, [-2.0])]:
        for v in vals:
            rows.append({"experiment": "k", "repeat": "paraphrase", "fact": fact, "dup_count": dup,
                         "probe": "memorization", "logp_sum": v, "logp_mean": v / 2, "greedy_match": v > -2.5})
    per_dup, metrics, effects = summarize(rows)
    assert [(g["dup_count"], g["n_facts"]) for g in per_dup] == [(0, 2), (4, 2)]
    assert metrics["k/dup0/memorization/logp_sum"] == -5.5  # per fact first: (-5 + -6) / 2
    assert metrics["k/dup4/memorization/logp_sum"] == -2.0
    assert metrics["k/dup4/memorization/logp_sum_effect"] == 3.5
    assert metrics["k/dup4/memorization/greedy_acc"] == 0.75 and metrics["k/dup0/memorization/greedy_acc"] == 0
    assert metrics["k/dup4/memorization/logp_mean_effect"] == 1.75
    assert metrics["k/dup4/memorization/logp_sum_effect_ci_low"] <= 3.5 <= \
        metrics["k/dup4/memorization/logp_sum_effect_ci_high"]
    assert "k/dup0/memorization/logp_sum_effect" not in metrics
    assert per_dup[1]["logp_sum_effect_ci_method"] == "Welch t" and per_dup[0]["small_n"]
    # fact 0 has two memorization probes: greedy_acc is a fraction per fact, so a t interval, not Wilson
    assert per_dup[1]["greedy_acc_ci_method"] == "t"


def test_eval_rejects_a_mismatched_config(tokenizer):
    exps = {"facts": kexp()}
    plan, _ = plan_of(exps, tokenizer)
    model = tiny_model(0)

    def ctx(experiments, seed=0):
        return EvalContext(model=model, tokenizer=tokenizer, plan=plan, held_out=np.empty((0, L), np.int64),
                           step=0, batch_size=4, seed=0,
                           insertion=InsertionConf(seed=seed, experiments=experiments))

    with pytest.raises(ConfigError, match=r"insertion\.experiments\.facts: plan item 0 is not knowledge:1:facts"):
        run_eval(KnowledgeConf(), ctx(exps, seed=1))
    with pytest.raises(ConfigError, match=r"the plan has 16 items of 'facts', the config gives 52"):
        run_eval(KnowledgeConf(), ctx({"facts": kexp(repeat=KnowledgeRepeat.paraphrase)}))
    with pytest.raises(ConfigError, match=r"eval\.tasks\.knowledge\.experiments: 'bios' is not a type=knowledge"):
        run_eval(KnowledgeConf(experiments=["bios"]), ctx(exps))


# ------------------------------------------------------------ a tiny real run

@pytest.mark.slow
def test_knowledge_eval_on_a_tiny_run(tmp_path, tiny_model_dir):
    """The knowledge_demo preset on the tiny model (24 steps, lr 1e-2): facts inserted 16 times get a higher
    P(value | probe) than the dup-0 facts, in both repetition modes; results.json carries the metrics."""
    runs = tmp_path / "runs"
    proc = cli("experiment=knowledge_demo", "model=tiny_llama", "training.learning_rate=1e-2",
               "training.num_threads=1", "training.checkpoint_interval=24", "eval=[knowledge]", "eval.on_load=false",
               "wandb=disabled", runs=runs)
    run_dir = Path(proc.stdout.strip().splitlines()[-1].removeprefix("run dir: "))
    res = json.loads((run_dir / "results.json").read_text())
    m = res["metrics"]["knowledge"]
    rec = json.loads((run_dir / "evals" / "step24" / "knowledge.json").read_text())
    assert {(g["experiment"], g["repeat"]) for g in rec["per_dup"]} == {
        ("facts_identical", "identical"), ("facts_paraphrase", "paraphrase")}
    assert len(rec["per_dup"]) == 2 * 4 * 2  # experiments x dup counts x probe kinds
    for exp in ("facts_identical", "facts_paraphrase"):
        for kind in ("memorization", "generalization"):
            key = f"{exp}/dup16/{kind}"
            assert m[f"{key}/logp_mean_effect_ci_low"] > 0, key
            assert m[f"{key}/logp_sum"] > m[f"{exp}/dup0/{kind}/logp_sum"], key
    probes_per_fact = Counter((r["experiment"], r["fact"], r["probe"]) for r in rec["rows"])
    para16 = {r["fact"] for r in rec["rows"] if r["experiment"] == "facts_paraphrase" and r["dup_count"] == 16}
    assert {probes_per_fact[("facts_paraphrase", f, "memorization")] for f in para16} == {4}
    assert set(probes_per_fact[k] for k in probes_per_fact if k[2] == "generalization") == {2}
