"""Knowledge probes: does the model know the fictional facts of ``type: knowledge`` experiments, by dup count,
by repetition mode (identical sentence vs paraphrases) and by probe kind (memorization vs generalization)?

For every fact of an experiment (rebuilt from the run's insertion config with
:func:`~pretrain_exp.insertion.types.knowledge.knowledge_items` and checked token by token against the plan's items)
and every probe of it (:func:`~pretrain_exp.insertion.types.knowledge.probes`: ``memorization`` = an inserted
sentence cut right before the value, ``generalization`` = a held-out paraphrase or question never inserted),
the target ``" " + value`` is scored after the probe (preceded by the items' leading EOS, if they have one):

- ``logp_sum``: ``ln P(target | probe)``, the summed log-probability of the target tokens (nats), the measure of
  Chang et al. 2024, "How Do Large Language Models Acquire Factual Knowledge During Pretraining?" (NeurIPS;
  arXiv:2406.11813), and ``logp_mean``, its mean per target token;
- ``greedy_acc``: whether greedy decoding from the probe starts with the target (the generation accuracy of
  knowledge extraction in Allen-Zhu & Li 2023, "Physics of Language Models: Part 3.1", arXiv:2309.14316).

Target tokens: ``tokens(probe + " " + value)`` after the tokens of ``probe`` when those are its prefix (always,
for tokenizers that split before a space), else ``tokens(" " + value)``.

A fact's dup count is the sum of its items' dup counts (in ``paraphrase`` mode each of its items is one
paraphrase). Per fact and probe kind the probes' values are averaged, so the fact is the unit of every interval and
test; groups ``(experiment, dup count, probe kind)`` average over facts with a Student t 95% interval (``greedy_acc``:
a Wilson interval where every fact has one probe of the kind, so its value is 0 or 1; else t over the facts'
fractions). The effect of dup count ``d > 0`` is its mean minus the mean of the experiment's dup-0 control facts,
with a Welch interval (Newcombe for a 0/1 ``greedy_acc``) and a randomization p-value; the p-values of every value,
probe kind, dup count and experiment of the eval at a step are adjusted together (Holm by default,
``eval.p_adjust``), except the declared primary endpoint: per experiment, the trend of ``logp_mean`` on
memorization probes over ``log(1 + dup)`` (:mod:`pretrain_exp.evals.effects`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from pretrain_exp.core.errors import ConfigError
from pretrain_exp.core.stats import PERMUTATIONS, interval
from pretrain_exp.evals.base import EvalContext, EvalResult, EvalTaskConf
from pretrain_exp.evals.effects import EffectSpec, family_effects
from pretrain_exp.insertion.types.knowledge import (
    PROBE_KINDS,
    facts_by_item,
    knowledge_items,
    probes,
    repeat_mode,
)

KEY = "eval.tasks.knowledge"
VALUES = ("logp_sum", "logp_mean", "greedy_acc")  #: per-fact values averaged per group


@dataclass
class KnowledgeConf(EvalTaskConf):
    """Schema of a ``knowledge`` eval."""

    type: str = "knowledge"
    experiments: List[str] = field(default_factory=list)  #: experiments to score (empty: every type=knowledge one)

    def check_experiments(self, key: str, experiments: Dict[str, Any]) -> None:
        """Every experiment it scores is a ``type: knowledge`` one of this run (:func:`check_experiments`)."""
        check_experiments(key, self, experiments)


def knowledge(cfg: KnowledgeConf, ctx: EvalContext) -> EvalResult:
    """Knowledge probes of the facts of the run's ``type: knowledge`` experiments (module docstring).

    :returns: ``rows``: one per (fact, probe) ``{experiment, repeat, fact, entity, attribute, value, dup_count,
        item_ids, probe, template, prompt, logp_sum, logp_mean, n_target_tokens, greedy_match}``; ``per_dup``:
        one per ``(experiment, dup_count, probe)`` ``{experiment, repeat, dup_count, probe, n_facts, n_items,
        logp_sum, logp_mean, greedy_acc, ci_low, ci_high, ci_method, small_n}`` (interval of ``logp_sum``;
        ``n_items = n_facts``) plus ``logp_mean_ci_low/high/method``, ``greedy_acc_ci_low/high/method`` and, for
        ``d > 0`` with controls, ``{v}_effect``, ``{v}_effect_ci_low``, ``{v}_effect_ci_high``,
        ``{v}_effect_ci_method``, ``{v}_effect_p_value``, ``{v}_effect_p_adjusted`` for each ``v`` in ``logp_sum,
        logp_mean, greedy_acc``; ``effects``: those effects and the trend rows (module docstring), with ``metric``
        = ``v`` and ``probe``; ``metrics``: ``{exp}/dup{d}/{probe}/{v}`` and
        ``{exp}/dup{d}/{probe}/{v}_effect[_ci_low|_ci_high|_p_value|_p_adjusted]``. Tests use
        ``ctx.permutations``, ``ctx.seed`` and ``ctx.p_adjust``. ``logp_mean`` (nats per target token) is the less
        noisy comparison when values differ in length (years vs names).
    :raises ConfigError: if the run has no such experiment, or the plan's items are not the configured facts.
    """
    if ctx.insertion is None:
        raise ConfigError(KEY, "the knowledge eval needs the run's insertion config (EvalContext.insertion)")
    exps = ctx.insertion.experiments
    names = check_experiments(KEY, cfg, exps)
    for n in names:
        if n not in ctx.plan.experiments:
            raise ConfigError(f"{KEY}.experiments", f"the plan has no experiment {n!r}; experiments: "
                              f"{list(ctx.plan.experiments)}")
    rows = [r for n in names for r in score_experiment(n, exps[n], ctx)]
    per_dup, metrics, effects = summarize(rows, ctx.permutations, ctx.seed, ctx.p_adjust)
    return EvalResult(metrics=metrics, per_dup=per_dup, rows=rows, effects=effects)


def check_experiments(key: str, cfg: KnowledgeConf, experiments: Dict[str, Any]) -> List[str]:
    """The names of the experiments ``cfg`` scores (every ``type: knowledge`` one if ``cfg.experiments`` is
    empty); called when the run's config is validated, so a mistake fails before training.

    :param key: the eval's dotted key (``eval.tasks.<name>``); :param experiments: ``insertion.experiments``.
    :raises ConfigError: if a named experiment is missing or not ``type: knowledge``, or there is none.
    """
    names = list(cfg.experiments) or sorted(n for n, e in experiments.items() if e.type == "knowledge")
    if not names:
        raise ConfigError(key, f"no type=knowledge insertion experiment in this run (experiments: "
                          f"{sorted(experiments)}); add one, e.g. insertion=knowledge")
    for n in names:
        if n not in experiments or experiments[n].type != "knowledge":
            raise ConfigError(f"{key}.experiments", f"{n!r} is not a type=knowledge insertion experiment of this "
                              f"run; experiments: {sorted(experiments)}")
    return names


def _encode(tokenizer: Any, texts: Sequence[str]) -> List[List[int]]:
    return tokenizer(list(texts), add_special_tokens=False)["input_ids"] if texts else []


def score_experiment(name: str, exp: Any, ctx: EvalContext) -> List[Dict[str, Any]]:
    """The per-probe rows of knowledge experiment ``name`` (see :func:`knowledge`).

    :raises ConfigError: if the plan's items of ``name`` are not the items of its config (token or dup-count
        mismatch, e.g. a different tokenizer or seed).
    """
    from pretrain_exp.evals.scoring import continuation_scores  # torch with it: imported here

    plan, tok = ctx.plan, ctx.tokenizer
    facts, items = knowledge_items(name, exp, ctx.insertion.seed)
    ids = np.flatnonzero(plan.item_experiment == plan.experiments.index(name))
    if ids.size != len(items):
        raise ConfigError(f"insertion.experiments.{name}", f"the plan has {ids.size} items of {name!r}, the config "
                          f"gives {len(items)}; evaluate with the run's own config")
    eos = tok.eos_token_id
    lead: List[int] = []
    for k, (i, it, enc) in enumerate(zip(ids, items, _encode(tok, [it.text for it in items]))):
        toks = plan.item_tokens(int(i)).tolist()
        head = [eos] if toks[:1] == [eos] and enc[:1] != [eos] else []
        tail = [eos] if toks[-1:] == [eos] and enc[-1:] != [eos] else []
        if k == 0:
            lead = head
        if toks != head + enc + tail or int(plan.item_dup_count[i]) != it.dup_count:
            raise ConfigError(f"insertion.experiments.{name}", f"plan item {int(i)} is not {it.source} "
                              f"({it.text!r}, dup count {it.dup_count}); evaluate with the run's own config")
    mode = repeat_mode(exp).value
    meta, prompts, values = [], [], []
    for f, members in sorted(facts_by_item(items).items()):
        fact = facts[f]
        dup = sum(items[m].dup_count for m in members)
        for kind, template, prompt in probes(fact, [items[m].template for m in members]):
            meta.append({"experiment": name, "repeat": mode, "fact": f, "entity": fact.entity,
                         "attribute": fact.attribute, "value": fact.value, "dup_count": dup,
                         "item_ids": [int(ids[m]) for m in members], "probe": kind, "template": template,
                         "prompt": prompt})
            prompts.append(prompt)
            values.append(fact.value)
    enc_prompt = _encode(tok, prompts)
    enc_full = _encode(tok, [f"{p} {v}" for p, v in zip(prompts, values)])
    enc_value = _encode(tok, [f" {v}" for v in values])
    contexts, targets = [], []
    for p, full, val in zip(enc_prompt, enc_full, enc_value):
        contexts.append(lead + p)
        targets.append(full[len(p):] if full[:len(p)] == p and len(full) > len(p) else val)
    scores = continuation_scores(ctx.model, contexts, targets, ctx.batch_size)
    return [dict(m, logp_sum=float(lp.sum(dtype=np.float64)), logp_mean=float(lp.mean(dtype=np.float64)),
                 n_target_tokens=int(lp.size), greedy_match=greedy)
            for m, (lp, greedy) in zip(meta, scores)]


def summarize(rows: Sequence[Dict[str, Any]], permutations: int = PERMUTATIONS, seed: int = 0,
              p_adjust: str = "holm") -> Tuple[List[Dict[str, Any]], Dict[str, float], List[Dict[str, Any]]]:
    """``(per_dup, metrics, effects)`` of per-probe rows (see :func:`knowledge`): probes averaged per fact and kind,
    then facts per ``(experiment, dup_count, probe)`` with intervals, and effects against the dup-0 facts.

    :param permutations: random relabellings of a randomization test that is not exact; :param seed: their seed;
    :param p_adjust: the multiplicity adjustment over the eval's tests (``holm``, ``bh``, ``none``).
    """
    per_fact: Dict[Tuple[str, str, int], List[Dict[str, Any]]] = defaultdict(list)
    for r in rows:
        per_fact[(r["experiment"], r["probe"], r["fact"])].append(r)
    facts: List[Dict[str, Any]] = []  # one row per (experiment, probe kind, fact)
    repeat = {}
    for (exp, kind, fact), rs in per_fact.items():
        repeat[exp] = rs[0]["repeat"]
        facts.append({"experiment": exp, "probe": kind, "fact": fact, "dup_count": rs[0]["dup_count"],
                      "n_probes": len(rs), "logp_sum": float(np.mean([r["logp_sum"] for r in rs])),
                      "logp_mean": float(np.mean([r["logp_mean"] for r in rs])),
                      "greedy_acc": float(np.mean([r["greedy_match"] for r in rs]))})
    # greedy_acc is a 0/1 proportion where each fact has one probe of the kind (identical-mode memorization probes)
    binary = {key: all(f["n_probes"] == 1 for f in facts if (f["experiment"], f["probe"]) == key)
              for key in {(f["experiment"], f["probe"]) for f in facts}}
    order = {k: i for i, k in enumerate(PROBE_KINDS)}
    specs = [EffectSpec([f for f in facts if (f["experiment"], f["probe"]) == (exp, kind)], v,
                        proportion=v == "greedy_acc" and binary[(exp, kind)],
                        primary=v == "logp_mean" and kind == "memorization", labels={"probe": kind})
             for exp, kind in sorted(binary, key=lambda k: (k[0], order[k[1]])) for v in VALUES]
    effects = family_effects(specs, _Ctx(permutations, seed, p_adjust), "knowledge")
    by_key = {(e["experiment"], e["dup_count"], e["probe"], e["metric"]): e for e in effects
              if e["contrast"] != "trend"}
    per_dup, metrics = [], {}
    for exp, dup, kind in sorted({(f["experiment"], f["dup_count"], f["probe"]) for f in facts},
                                 key=lambda g: (g[0], g[1], order[g[2]])):
        group = [f for f in facts if (f["experiment"], f["dup_count"], f["probe"]) == (exp, dup, kind)]
        s = {v: interval([f[v] for f in group], v == "greedy_acc" and binary[(exp, kind)]) for v in VALUES}
        row = {"experiment": exp, "repeat": repeat[exp], "dup_count": dup, "probe": kind, "n_facts": len(group),
               "n_items": len(group), "logp_sum": s["logp_sum"]["mean"], "logp_mean": s["logp_mean"]["mean"],
               "greedy_acc": s["greedy_acc"]["mean"], "ci_low": s["logp_sum"]["ci_low"],
               "ci_high": s["logp_sum"]["ci_high"], "ci_method": s["logp_sum"]["ci_method"],
               "small_n": s["logp_sum"]["small_n"]}
        for v in ("logp_mean", "greedy_acc"):
            row.update({f"{v}_ci_low": s[v]["ci_low"], f"{v}_ci_high": s[v]["ci_high"],
                        f"{v}_ci_method": s[v]["ci_method"]})
        key = f"{exp}/dup{dup}/{kind}"
        metrics.update({f"{key}/{v}": row[v] for v in VALUES})
        for v in VALUES:
            e = by_key.get((exp, dup, kind, v))
            if e is None:
                continue
            row.update({f"{v}_effect": e["effect"], f"{v}_effect_ci_low": e["effect_ci_low"],
                        f"{v}_effect_ci_high": e["effect_ci_high"], f"{v}_effect_ci_method": e["effect_ci_method"],
                        f"{v}_effect_p_value": e["p_value"], f"{v}_effect_p_adjusted": e["p_adjusted"]})
            metrics.update({f"{key}/{v}_effect{x}": row[f"{v}_effect{x}"]
                            for x in ("", "_ci_low", "_ci_high", "_p_value", "_p_adjusted")})
        per_dup.append(row)
    return per_dup, metrics, effects


@dataclass
class _Ctx:
    """The test settings :func:`~pretrain_exp.evals.effects.family_effects` reads from an eval context."""

    permutations: int
    seed: int
    p_adjust: str
