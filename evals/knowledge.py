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
paraphrase). Per fact and probe kind the probes' values are averaged; groups ``(experiment, dup count, probe
kind)`` average over facts with a 95% percentile-bootstrap CI over facts; the effect of dup count ``d > 0`` is
its mean minus the mean of the experiment's dup-0 control facts, with a bootstrap CI resampling both groups.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from pretrain_exp.core.errors import ConfigError
from pretrain_exp.evals.base import EvalContext, EvalResult, EvalTaskConf
from pretrain_exp.evals.scoring import continuation_scores
from pretrain_exp.evals.stats import bootstrap_ci, bootstrap_diff_ci
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
        one per ``(experiment, dup_count, probe)`` ``{experiment, repeat, dup_count, probe, n_facts, logp_sum,
        logp_mean, greedy_acc, ci_low, ci_high}`` (CI of ``logp_sum``) plus ``logp_mean_ci_low/high``,
        ``greedy_acc_ci_low/high`` and, for
        ``d > 0`` with controls, ``{v}_effect``, ``{v}_effect_ci_low``, ``{v}_effect_ci_high`` for each
        ``v`` in ``logp_sum, logp_mean, greedy_acc``; ``metrics``: ``{exp}/dup{d}/{probe}/{v}`` and
        ``{exp}/dup{d}/{probe}/{v}_effect[_ci_low|_ci_high]``. Bootstraps use ``ctx.bootstrap_samples`` and
        ``ctx.seed``. ``logp_mean`` (nats per target token) is the less noisy comparison when values differ in
        length (years vs names).
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
    per_dup, metrics = summarize(rows, ctx.bootstrap_samples, ctx.seed)
    return EvalResult(metrics=metrics, per_dup=per_dup, rows=rows)


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


def summarize(rows: Sequence[Dict[str, Any]], samples: int,
              seed: int) -> Tuple[List[Dict[str, Any]], Dict[str, float]]:
    """``(per_dup, metrics)`` of per-probe rows (see :func:`knowledge`): probes averaged per fact and kind, then
    facts per ``(experiment, dup_count, probe)`` with bootstrap CIs and effects against the dup-0 facts."""
    per_fact: Dict[Tuple[str, str, int], List[Dict[str, Any]]] = defaultdict(list)
    for r in rows:
        per_fact[(r["experiment"], r["probe"], r["fact"])].append(r)
    groups: Dict[Tuple[str, int, str], Dict[str, List[float]]] = defaultdict(lambda: defaultdict(list))
    repeat = {}
    for (exp, kind, _), rs in per_fact.items():
        g = groups[(exp, rs[0]["dup_count"], kind)]
        repeat[exp] = rs[0]["repeat"]
        g["logp_sum"].append(float(np.mean([r["logp_sum"] for r in rs])))
        g["logp_mean"].append(float(np.mean([r["logp_mean"] for r in rs])))
        g["greedy_acc"].append(float(np.mean([r["greedy_match"] for r in rs])))
    per_dup, metrics = [], {}
    order = {k: i for i, k in enumerate(PROBE_KINDS)}
    for (exp, dup, kind) in sorted(groups, key=lambda g: (g[0], g[1], order[g[2]])):
        g = groups[(exp, dup, kind)]
        logp, low, high = bootstrap_ci(np.array(g["logp_sum"]), samples, seed)
        mean, mean_low, mean_high = bootstrap_ci(np.array(g["logp_mean"]), samples, seed)
        acc, acc_low, acc_high = bootstrap_ci(np.array(g["greedy_acc"]), samples, seed)
        row = {"experiment": exp, "repeat": repeat[exp], "dup_count": dup, "probe": kind,
               "n_facts": len(g["logp_sum"]), "logp_sum": logp, "logp_mean": mean, "greedy_acc": acc,
               "ci_low": low, "ci_high": high, "logp_mean_ci_low": mean_low, "logp_mean_ci_high": mean_high,
               "greedy_acc_ci_low": acc_low, "greedy_acc_ci_high": acc_high}
        key = f"{exp}/dup{dup}/{kind}"
        metrics.update({f"{key}/{v}": row[v] for v in VALUES})
        control = groups.get((exp, 0, kind))
        if dup > 0 and control:
            for v in VALUES:
                effect, e_low, e_high = bootstrap_diff_ci(np.array(g[v]), np.array(control[v]), samples, seed)
                row.update({f"{v}_effect": effect, f"{v}_effect_ci_low": e_low, f"{v}_effect_ci_high": e_high})
                metrics.update({f"{key}/{v}_effect": effect, f"{key}/{v}_effect_ci_low": e_low,
                                f"{key}/{v}_effect_ci_high": e_high})
        per_dup.append(row)
    return per_dup, metrics
