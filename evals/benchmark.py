"""Benchmark contamination: multiple-choice accuracy on benchmark items inserted into training (dup > 0) vs the
never-inserted (dup-0) items of the same benchmark sample.

The items of a ``type: benchmark`` insertion experiment are benchmark questions rendered with their gold answer
(:mod:`pretrain_exp.insertion.types.benchmark`). This eval rebuilds the questions of the experiment's items from the
same ``(benchmark, num_items, seed)`` sample (item ``i`` of the experiment is doc ``i``; every item's tokens are
checked against its rebuilt text, so a config that does not match the run's items fails instead of scoring the wrong
docs) and scores them 0-shot with lm-eval (``lm_eval.simple_evaluate``, ``multiple_choice``: the choice with the
highest summed log-likelihood of ``" " + choice`` after the context is the prediction; ``acc_norm`` divides each
log-likelihood by the choice's length in characters). Per dup count, ``acc`` and ``acc_norm`` carry Wilson intervals
(defined at 0 and at every item correct); each dup count ``d > 0`` is compared with the clean (dup-0) items, and the
contamination effect pools every inserted item: ``acc(dup > 0) - acc(dup 0)`` (with one inserted dup count, that dup
count's effect), each with a Newcombe interval and a randomization p-value (the inserted items are a seeded random
draw of the sample, so the test is valid by design). The p-values of ``acc`` and ``acc_norm`` at every dup count and
pooled are adjusted together (Holm by default, ``eval.p_adjust``); the trend of ``acc`` over ``log(1 + dup)`` is the
primary endpoint (:mod:`pretrain_exp.evals.effects`). The per-item rows keep ``item_id``, ``dup_count``, ``acc`` and
``acc_norm``, so a report can also compare each item with its own score before training (the step-0 eval of
``eval.on_load``). Under ``eval.mode=distributed`` the ranks share the docs on lm-eval's data-parallel path
(:func:`pretrain_exp.evals.shard.simple_evaluate`).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from pretrain_exp.core.errors import ConfigError
from pretrain_exp.core.stats import effect, interval
from pretrain_exp.evals.base import EvalContext, EvalResult, EvalTaskConf
from pretrain_exp.evals.effects import EffectSpec, adjust_family, family_effects
from pretrain_exp.evals.shard import simple_evaluate
from pretrain_exp.insertion.types.benchmark import (
    BenchmarkDoc,
    check_benchmark,
    check_format,
    item_text,
    prompt,
    sample_docs,
)

KEY = "eval.tasks.benchmark"
#: lm-eval and datasets never reach a hub for a local jsonl task
OFFLINE_ENV = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


@dataclass
class BenchmarkConf(EvalTaskConf):
    """Schema of a ``benchmark`` eval. ``conf/eval/benchmark.yaml`` takes ``benchmark``, ``format``,
    ``num_items`` and ``seed`` from the insertion experiment named by ``experiment`` (they must
    equal the experiment's values; the eval checks every item against them).

    :raises ConfigError: for an unknown benchmark or format, or ``num_items`` below 1.
    """

    type: str = "benchmark"
    experiment: str = "benchmark"  #: the ``type: benchmark`` insertion experiment whose items are scored
    benchmark: Optional[str] = None  #: its ``benchmark`` (None: the experiment is missing or not a benchmark)
    format: str = "cloze"  #: its ``format``: the prompt format the questions are scored in
    num_items: Optional[int] = None  #: its ``num_items``
    seed: int = 0  #: the insertion seed (``insertion.seed``)

    def validate(self, key: str) -> None:
        if self.benchmark is not None:
            check_benchmark(f"{key}.benchmark", self.benchmark)
        check_format(f"{key}.format", self.format)
        if self.num_items is not None and self.num_items < 1:
            raise ConfigError(f"{key}.num_items", f"must be >= 1, got {self.num_items}")


def benchmark(cfg: BenchmarkConf, ctx: EvalContext) -> EvalResult:
    """0-shot multiple-choice accuracy of the items of insertion experiment ``cfg.experiment``, per dup count.

    :returns: ``rows``: one per item ``{item_id, experiment, dup_count, source, gold, acc, acc_norm,
        loglikelihoods}`` (``acc``/``acc_norm`` 0 or 1 as lm-eval scored the doc; ``loglikelihoods`` in nats per
        choice); ``per_dup``: ``{experiment, dup_count, n_items, acc, acc_norm, ci_low, ci_high, ci_method, small_n,
        acc_norm_ci_low, acc_norm_ci_high, acc_norm_ci_method}`` (``ci_*``: the Wilson 95% interval of ``acc``);
        ``effects``: per dup count ``d > 0`` (``contrast: "dup d vs 0"``) and, with two or more inserted dup counts,
        pooled (``contrast: "dup > 0 vs 0"``) the effects on ``acc`` and ``acc_norm`` with Newcombe intervals and
        randomization p-values
        (``ctx.permutations``, ``ctx.seed``) adjusted together (``ctx.p_adjust``), and the trend rows (primary:
        ``acc``); ``metrics``: ``{exp}/dup{d}/acc``, ``{exp}/dup{d}/acc_norm``, for ``d > 0`` with controls
        ``{exp}/dup{d}/{m}_effect`` (+ ``_ci_low``, ``_ci_high``, ``_p_value``, ``_p_adjusted``) and, with both
        controls and inserted items, ``{exp}/contamination_effect_acc`` = acc(dup > 0) - acc(dup 0) with
        ``_ci_low``, ``_ci_high``, ``_p_value``, ``_p_adjusted`` (the same for ``acc_norm``; with one inserted dup
        count, that dup count's effect).
    :raises ConfigError: if the plan has no such experiment or its items are not the configured sample.
    """
    plan, exp = ctx.plan, cfg.experiment
    if exp not in plan.experiments:
        raise ConfigError(f"{KEY}.experiment", f"no insertion experiment {exp!r} in this run; experiments: "
                          f"{list(plan.experiments)}")
    if cfg.benchmark is None:
        raise ConfigError(f"{KEY}.benchmark", f"not set: insertion experiment {exp!r} must have type=benchmark "
                          f"(or set {KEY}.benchmark to its benchmark)")
    items = np.flatnonzero(plan.item_experiment == plan.experiments.index(exp))  # item order of the experiment
    docs = sample_docs(cfg.benchmark, num_items=cfg.num_items, seed=cfg.seed, cache_dir=ctx.cache_dir, key=KEY)
    if len(docs) != items.size:
        raise ConfigError(KEY, f"{cfg.benchmark} with num_items={cfg.num_items} gives {len(docs)} questions but "
                          f"insertion experiment {exp!r} has {items.size} items; use the experiment's "
                          "benchmark, num_items and insertion.seed")
    check_items(plan, items, docs, cfg.format, ctx.tokenizer, exp)
    scores = score_multiple_choice(ctx.model, ctx.tokenizer, [prompt(d, cfg.format) + (d.gold,) for d in docs],
                                   ctx.batch_size, task_name=f"pretrain_exp_{exp}")
    rows = [{"item_id": int(i), "experiment": exp, "dup_count": int(plan.item_dup_count[i]), "source": d.source,
             "gold": d.gold, **s} for i, d, s in zip(items, docs, scores)]
    per_dup, metrics, effects = summarize(rows, exp, ctx)
    return EvalResult(metrics=metrics, per_dup=per_dup, rows=rows, effects=effects)


def check_items(plan: Any, items: np.ndarray, docs: Sequence[BenchmarkDoc], fmt: str, tokenizer: Any,
                exp: str) -> None:
    """Check that plan item ``items[i]`` is ``docs[i]`` rendered in ``fmt`` (tokens compared after dropping
    one leading and one trailing EOS, which the EOS policy may have added).

    :raises ConfigError: naming the first mismatching item.
    """
    eos = tokenizer.eos_token_id
    encoded = tokenizer([item_text(d, fmt) for d in docs], add_special_tokens=False)["input_ids"]
    for k, (i, ids) in enumerate(zip(items, encoded)):
        toks = plan.item_tokens(int(i)).tolist()
        if toks and toks[0] == eos and (not ids or ids[0] != eos):
            toks = toks[1:]
        if toks and toks[-1] == eos and (not ids or ids[-1] != eos):
            toks = toks[:-1]
        if toks != list(ids):
            raise ConfigError(KEY, f"item {k} of insertion experiment {exp!r} is not {docs[k].source} in format "
                              f"{fmt!r}; {KEY}.benchmark/format/num_items/seed must equal the experiment's")


@contextlib.contextmanager
def _env(values: Dict[str, str]):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def score_multiple_choice(model: Any, tokenizer: Any, questions: Sequence[Tuple[str, List[str], int]],
                          batch_size: int, task_name: str = "pretrain_exp_mc") -> List[Dict[str, Any]]:
    """Score multiple-choice questions 0-shot with lm-eval.

    The questions go to a jsonl file in a temp dir, read by an inline lm-eval task (``dataset_path: json`` with
    an absolute ``data_files`` path, ``output_type: multiple_choice``, metrics ``acc`` and ``acc_norm``); the
    already loaded model is wrapped in ``HFLM`` (no reload) with a copy of the tokenizer (lm-eval may set its
    pad token). Global RNGs are left alone and no hub is contacted.

    :param questions: ``(context, choices, gold)`` per question; choice ``k`` is scored as the continuation
        ``" " + choices[k]`` of ``context``.
    :returns: per question (input order) ``{acc, acc_norm, loglikelihoods}``: lm-eval's per-doc correctness
        (0.0 or 1.0) and the summed log-likelihood (nats) of each choice.
    """
    with _env(OFFLINE_ENV), tempfile.TemporaryDirectory(prefix="pe-bench-") as tmp:
        from lm_eval.tasks import TaskManager

        data = Path(tmp) / "docs.jsonl"
        with open(data, "w") as f:
            for k, (context, choices, gold) in enumerate(questions):
                f.write(json.dumps({"doc_index": k, "query": context, "choices": list(choices), "gold": gold}) + "\n")
        task = {
            "task": task_name, "dataset_path": "json", "test_split": "test", "output_type": "multiple_choice",
            "dataset_kwargs": {"data_files": {"test": str(data)}, "cache_dir": str(Path(tmp) / "hf_datasets")},
            "doc_to_text": "query", "doc_to_choice": "choices", "doc_to_target": "gold", "num_fewshot": 0,
            "metric_list": [{"metric": m, "aggregation": "mean", "higher_is_better": True}
                            for m in ("acc", "acc_norm")],
            "metadata": {"version": 1.0},
        }
        out = simple_evaluate(model, copy.deepcopy(tokenizer), batch_size, tasks=[task],
                              task_manager=TaskManager(include_defaults=False), log_samples=True, bootstrap_iters=0,
                              random_seed=None, numpy_random_seed=None, torch_random_seed=None)
    samples = sorted(out["samples"][task_name], key=lambda s: s["doc"]["doc_index"])
    if [s["doc"]["doc_index"] for s in samples] != list(range(len(questions))):
        raise RuntimeError(f"lm-eval returned {len(samples)} samples for {len(questions)} questions")
    return [{"acc": float(s["acc"]), "acc_norm": float(s["acc_norm"]),
             "loglikelihoods": [float(r[0]) for r in s["filtered_resps"]]} for s in samples]


def summarize(rows: Sequence[Dict[str, Any]], exp: str,
              ctx: Any) -> Tuple[List[Dict[str, Any]], Dict[str, float], List[Dict[str, Any]]]:
    """``(per_dup, metrics, effects)`` of one experiment's per-item rows (see :func:`benchmark`).

    :param ctx: the eval context (``permutations``, ``seed``, ``p_adjust``).
    """
    per_dup, metrics = [], {}
    for d in sorted({r["dup_count"] for r in rows}):
        group = [r for r in rows if r["dup_count"] == d]
        acc, norm = interval([r["acc"] for r in group], True), interval([r["acc_norm"] for r in group], True)
        per_dup.append({"experiment": exp, "dup_count": d, "n_items": acc["n_items"], "acc": acc["mean"],
                        "acc_norm": norm["mean"], "ci_low": acc["ci_low"], "ci_high": acc["ci_high"],
                        "ci_method": acc["ci_method"], "small_n": acc["small_n"], "acc_norm_ci_low": norm["ci_low"],
                        "acc_norm_ci_high": norm["ci_high"], "acc_norm_ci_method": norm["ci_method"]})
        metrics[f"{exp}/dup{d}/acc"] = acc["mean"]
        metrics[f"{exp}/dup{d}/acc_norm"] = norm["mean"]
    effects = family_effects([EffectSpec(rows, "acc", proportion=True, primary=True),
                              EffectSpec(rows, "acc_norm", proportion=True)], ctx, "benchmark")
    clean = [r for r in rows if r["dup_count"] == 0]
    inserted = [r for r in rows if r["dup_count"] > 0]
    pooled = {}  # metric -> the row of the pooled contamination effect
    if clean and len({r["dup_count"] for r in inserted}) >= 2:
        for metric in ("acc", "acc_norm"):
            pooled[metric] = {"experiment": exp, "dup_count": None, "contrast": "dup > 0 vs 0", "primary": False,
                              **effect([r[metric] for r in inserted], [r[metric] for r in clean], True,
                                       ctx.permutations, ctx.seed), "metric": metric}
        effects += list(pooled.values())
        adjust_family(effects, ctx, "benchmark")
    elif clean and inserted:  # one inserted dup count: the pooled effect is that dup count's
        pooled = {e["metric"]: e for e in effects if e["contrast"] != "trend"}

    def record(key: str, e: Dict[str, Any]) -> None:
        metrics.update({key: e["effect"], f"{key}_ci_low": e["effect_ci_low"], f"{key}_ci_high": e["effect_ci_high"],
                        f"{key}_p_value": e["p_value"], f"{key}_p_adjusted": e["p_adjusted"]})

    for e in effects:
        if e["contrast"].startswith("dup ") and e["dup_count"] is not None:
            record(f"{exp}/dup{e['dup_count']}/{e['metric']}_effect", e)
    for metric, e in pooled.items():
        record(f"{exp}/contamination_effect_{metric}", e)
    return per_dup, metrics, effects
