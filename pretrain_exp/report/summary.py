"""A run's own summary: the ``results.json`` content and the console table at the end of a run.

``results.json`` holds, from the evals of the last evaluated step:

- ``per_dup``: one row ``{experiment, dup_count, n_items, mean_loss, ci_low, ci_high, ci_method, small_n}`` per
  experiment and dup count (the ``insertion_loss`` eval: mean over items, t interval; ``small_n`` under
  :data:`~pretrain_exp.core.stats.MIN_ITEMS_PER_GROUP` items) and ``memorization``, its memorization rows;
- ``effects``: every dup-``d``-vs-dup-0 contrast of ``insertion_loss`` and ``memorization`` (Welch or Newcombe
  interval, randomization p, p adjusted within each eval's family) and each experiment's trend test, tagged with
  their eval (``task``, ``eval_type``); ``primary``: the trend rows of ``insertion_loss``, the declared primary
  endpoint of each experiment (the slope over ``log(1 + dup count)``, not adjusted);
- ``did_effects`` when the initial checkpoint was evaluated (``eval.on_load``): the pre/post (difference-in-
  differences) effect of each dup count, :func:`pre_post_effects` over each item's change since that step;
- ``contamination`` for a ``benchmark`` eval: its per-dup accuracies and effects and, with ``eval.on_load``, each
  group's accuracy change since the initial step (the clean items' change is the spillover of insertion onto
  items never inserted) and its pre/post effects (:func:`contamination_summary`);
- ``statistics``: the methods behind every interval and p-value (:func:`statistics_entry`);
- every eval's metrics by step, and the plan's size.

With the natural-duplicate audit (``audit.json``, :mod:`pretrain_exp.insertion.audit`) every per-dup and
memorization row also has ``natural_items`` (items of the group found in the training window: an exact occurrence
or an n-gram hit), ``natural_exact`` (their exact occurrences, summed) and ``effective_dup_mean`` (mean of dup
count + natural exact occurrences), and ``audit`` summarizes the audit (n, cost, the controls found in the window).
Missing values (no interval) are ``null``. Its figures are :func:`pretrain_exp.report.plots.plot_per_dup` and
:func:`~pretrain_exp.report.plots.plot_loss_vs_step`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from pretrain_exp.core import stats
from pretrain_exp.core.config import RunConfig
from pretrain_exp.insertion.policies import get_policy
from pretrain_exp.report.text import (
    NA,
    SMALL_N_MARK,
    fmt_ci,
    fmt_items,
    fmt_p,
    method_label,
    missing,
    no_interval_reasons,
)

#: what the effect of an ``insertion_loss`` row measures (positive: the inserted items' loss fell below the controls')
LOSS_EFFECT = "loss(dup 0) - loss(dup d)"


def _task_of_type(cfg: RunConfig, kind: str, records: Dict[str, dict]):
    """The configured task of type ``kind``, else one saved in ``records`` (task -> eval record): a run evaluated
    again with other evals (``pretrain-exp-eval``) keeps its earlier tasks' tables."""
    return next((name for name, t in cfg.eval.tasks.items() if t.type == kind),
                next((name for name, r in records.items() if r.get("type") == kind), None))


def _tasks_of_type(kind: str, records: Dict[str, dict]) -> List[str]:
    return [name for name, r in records.items() if r.get("type") == kind]


def _flagged(rows: Sequence[dict]) -> List[dict]:
    """Per-dup rows with ``small_n`` set from ``n_items`` where the eval record lacks it (a record written before
    the flag existed)."""
    return [r if "small_n" in r or r.get("n_items") is None
            else dict(r, small_n=bool(r["n_items"] < stats.MIN_ITEMS_PER_GROUP)) for r in rows]


def _eval_effects(task: Optional[str], rec: dict, cfg: RunConfig) -> List[dict]:
    """The effect rows of one eval record, each with ``task`` and ``eval_type``. An ``insertion_loss`` record
    without ``effects`` (written before effects existed) gets them from its per-item rows
    (:func:`pretrain_exp.core.stats.per_dup_effects`, effect = :data:`LOSS_EFFECT`)."""
    if task is None or not rec:
        return []
    rows = rec.get("effects")
    if rows is None and rec.get("type") == "insertion_loss" and rec.get("rows"):
        permutations, adjust = _test_options(cfg)
        rows = loss_effects(rec["rows"], permutations, cfg.seed, adjust, family=task)
    return [dict(r, task=task, eval_type=rec.get("type")) for r in rows or []]


def loss_effects(rows: Sequence[dict], permutations: int = stats.PERMUTATIONS, seed: int = 0,
                 adjust_method: str = "holm", family: str = "insertion_loss") -> List[dict]:
    """The ``insertion_loss`` effect rows of per-item loss rows (``experiment, dup_count, loss``), for a record
    written before evals returned ``effects``: :func:`pretrain_exp.core.stats.per_dup_effects` with effect =
    :data:`LOSS_EFFECT` and ``metric: "loss"``."""
    return [dict(r, metric="loss") for r in stats.per_dup_effects(
        rows, "loss", permutations=permutations, seed=seed, adjust_method=adjust_method, family=family, sign=-1.0)]


def _test_options(cfg: RunConfig):
    return int(cfg.eval.permutations), str(cfg.eval.p_adjust)


def pre_post_effects(before: Sequence[dict], after: Sequence[dict], value_key: str, sign: float = -1.0,
                     permutations: int = stats.PERMUTATIONS, seed: int = 0,
                     adjust_method: str = "holm", family: Optional[str] = None,
                     baseline_step: Optional[int] = None) -> List[dict]:
    """Pre/post (difference-in-differences) effects of every dup count ``d > 0`` against the dup-0 controls.

    Each item's change ``delta_i = value_i(after) - value_i(before)`` (rows matched on ``item_id``) removes its
    own difficulty, which dominates the spread of the values themselves; the effect is ``sign * (mean delta(dup
    d) - mean delta(dup 0))``, with its Welch t interval and randomization p-value over the changes
    (:func:`pretrain_exp.core.stats.effect`: dup counts are dealt at random, so the test is exact by design), the
    p-values of one call adjusted together (:func:`pretrain_exp.core.stats.adjust_rows`). For a loss use
    ``sign=-1`` (effect = ``mean delta(dup 0) - mean delta(dup d)``: a drop relative to the controls is positive).

    :param before: per-item rows ``{item_id, experiment, dup_count, <value_key>}`` at the baseline step (the
        initial checkpoint); :param after: the same at the evaluated step.
    :returns: ``{experiment, dup_count, contrast, primary (False), metric, baseline_step, mean_change,
        mean_change_control, effect, effect_ci_low, effect_ci_high, effect_ci_method, p_value, p_method,
        n_treated, n_control, p_adjusted, p_adjust_method, family}`` per experiment and ``d > 0`` with controls,
        sorted; ``[]`` if no item is in both.
    """
    groups: Dict[tuple, List[float]] = defaultdict(list)
    for r, b, a in _paired(before, after, value_key):
        groups[(r["experiment"], int(r["dup_count"]))].append(a - b)
    out = []
    for (exp, d), changes in sorted(groups.items()):
        control = groups.get((exp, 0))
        if d == 0 or not control:
            continue
        e = stats.signed(stats.effect(changes, control, proportion=False, permutations=permutations, seed=seed), sign)
        out.append({"experiment": exp, "dup_count": d, "contrast": f"dup {d} vs 0, change since step {baseline_step}",
                    "primary": False, "metric": value_key, "baseline_step": baseline_step,
                    "mean_change": sum(changes) / len(changes),
                    "mean_change_control": sum(control) / len(control), **e})
    return stats.adjust_rows(out, adjust_method, family or f"{value_key} change since step {baseline_step}: "
                             "dup d vs 0")


def _num(v):
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v


def _paired(before: Sequence[dict], after: Sequence[dict], value_key: str):
    """``(row after, value before, value after)`` of every item in both, matched on ``item_id``, whose two values
    are numbers."""
    first = {r["item_id"]: r for r in before if "item_id" in r}
    for r in after:
        b = first.get(r.get("item_id"))
        if b is not None and not missing(_num(r.get(value_key))) and not missing(_num(b.get(value_key))):
            yield r, float(b[value_key]), float(r[value_key])


def change_since(before: Sequence[dict], after: Sequence[dict], value_key: str,
                 baseline_step: Optional[int] = None) -> List[dict]:
    """Each group's change of ``value_key`` since the baseline step, paired by item: per item
    ``value(after) - value(before)``, summarized with a t interval over the group's items
    (:func:`pretrain_exp.core.stats.interval`), per experiment and dup count and, for all inserted items
    together, ``dup_count: "> 0"``. The dup-0 row of a benchmark is the spillover: the change of items never
    inserted (the format and the domain learnt from the inserted ones, or plain drift of the model).

    :returns: ``{experiment, dup_count, group ("clean" | "contaminated"), metric, baseline_step, n_items,
        before, after, change, ci_low, ci_high, ci_method, small_n}`` rows; ``before`` / ``after`` are the group's
        means over the paired items.
    """
    groups: Dict[tuple, List[tuple]] = defaultdict(list)
    for r, *pair in _paired(before, after, value_key):
        groups[(r["experiment"], int(r["dup_count"]))].append(pair)
        if int(r["dup_count"]) > 0:
            groups[(r["experiment"], "> 0")].append(pair)
    out = []
    for (exp, d), pairs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] == "> 0",
                                                                  kv[0][1] if kv[0][1] != "> 0" else 0)):
        iv = stats.interval([a - b for b, a in pairs])
        out.append({"experiment": exp, "dup_count": d, "group": "clean" if d == 0 else "contaminated",
                    "metric": value_key, "baseline_step": baseline_step, "n_items": iv["n_items"],
                    "before": sum(b for b, _ in pairs) / len(pairs), "after": sum(a for _, a in pairs) / len(pairs),
                    "change": iv["mean"], "ci_low": iv["ci_low"], "ci_high": iv["ci_high"],
                    "ci_method": iv["ci_method"], "small_n": iv["small_n"]})
    return out


def contamination_summary(task: str, rec: dict, baseline: Optional[dict], baseline_step: Optional[int],
                          cfg: RunConfig) -> dict:
    """The ``contamination`` entry of one ``benchmark`` eval (module docstring): ``{task, experiment, per_dup,
    effects, pooled_effects, metrics, baseline_step, change_since_baseline, did_effects}``. ``pooled_effects``:
    per metric (``acc``, ``acc_norm``) the effect of every dup > 0 item together against the clean ones (the eval's
    ``dup > 0 vs 0`` row, else :func:`pretrain_exp.core.stats.effect`: Newcombe interval, randomization p), the
    weighting the sweep's bars use; the last three only with a baseline record (the initial checkpoint evaluated,
    ``eval.on_load``), else ``None`` / ``[]``."""
    rows = rec.get("rows") or []
    permutations, adjust = _test_options(cfg)
    out = {"task": task, "experiment": next((r["experiment"] for r in rows), None),
           "per_dup": _flagged(rec.get("per_dup") or []), "effects": _eval_effects(task, rec, cfg),
           "pooled_effects": {}, "metrics": {k: v for k, v in (rec.get("metrics") or {}).items()
                                             if "contamination_effect" in k},
           "baseline_step": None, "change_since_baseline": [], "did_effects": []}
    for metric in ("acc", "acc_norm"):
        given = [e for e in out["effects"] if e.get("contrast") == "dup > 0 vs 0" and e.get("metric") == metric]
        hot = [r[metric] for r in rows if r.get("dup_count", 0) > 0 and not missing(_num(r.get(metric)))]
        clean = [r[metric] for r in rows if r.get("dup_count") == 0 and not missing(_num(r.get(metric)))]
        if given:  # the eval's own, adjusted with its family
            out["pooled_effects"][metric] = given[0]
        elif hot and clean:
            e = stats.effect(hot, clean, proportion=True, permutations=permutations, seed=cfg.seed)
            out["pooled_effects"][metric] = dict(e, contrast="dup > 0 vs 0", metric=metric, p_adjusted=e["p_value"],
                                                 p_adjust_method="none")
    if baseline and baseline.get("rows") and rows:
        out["baseline_step"] = baseline_step
        for metric in ("acc", "acc_norm"):
            if any(metric in r for r in rows):
                out["change_since_baseline"] += change_since(baseline["rows"], rows, metric, baseline_step)
                out["did_effects"] += pre_post_effects(
                    baseline["rows"], rows, metric, sign=1.0, permutations=permutations, seed=cfg.seed,
                    adjust_method=adjust, family=f"{task} {metric} change since step {baseline_step}: dup d vs 0",
                    baseline_step=baseline_step)
    return out


def statistics_entry(cfg: RunConfig) -> dict:
    """The ``statistics`` entry of ``results.json``: the level, interval methods, test, adjustment and minimum
    group size behind every number of the run's tables (:mod:`pretrain_exp.core.stats`)."""
    permutations, adjust = _test_options(cfg)
    return {"ci_level": stats.LEVEL,
            "intervals": {"mean": "t", "difference of means": "Welch t", "proportion": "Wilson",
                          "difference of proportions": "Newcombe", "auc": "Hanley-McNeil (logit)",
                          "trend": "OLS t", "over seeds (sweep reports)": "t over seeds, S >= 3"},
            "no_interval": "n < 2 or all values equal (null; printed n/a)",
            "p_method": f"randomization test of the dup labels: exact when there are at most {stats.MAX_EXACT:,} "
                        f"relabellings, else {permutations:,} random ones",
            "permutations": permutations, "p_adjust": adjust,
            "p_adjust_family": "each eval's dup d vs 0 contrasts at a step",
            "primary_endpoint": "insertion_loss at the last step: slope over log(1 + dup count) per experiment, "
                                "randomization p, not adjusted",
            "min_items_per_group": stats.MIN_ITEMS_PER_GROUP}


def _clean(obj):
    """``obj`` with every non-finite float as ``None`` (what ``results.json`` holds, so the returned summary equals
    the file read back)."""
    if isinstance(obj, float):
        return None if not math.isfinite(obj) else obj
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def summarize(cfg: RunConfig, plan, evaluated_now: Dict[int, dict], evaluated_all: Dict[int, dict],
              wall_s: float, audit: Optional[dict] = None) -> dict:
    """The ``results.json`` content (module docstring).

    :param evaluated_now: step -> task -> eval record, from this invocation (may be partial on resume).
    :param evaluated_all: step -> task -> eval record, everything in the run dir.
    :param audit: the ``audit.json`` content, if the run was audited.
    """
    last = max(evaluated_all) if evaluated_all else None
    at_last = evaluated_all.get(last, {})
    loss_task, mem_task = _task_of_type(cfg, "insertion_loss", at_last), _task_of_type(cfg, "memorization", at_last)
    window = [int(w) for w in plan.window]
    per_dup = _flagged(at_last.get(loss_task, {}).get("per_dup", []) if loss_task else [])
    memorization = _flagged(at_last.get(mem_task, {}).get("per_dup", []) if mem_task else [])
    if audit is not None:
        per_dup, memorization = with_natural(per_dup, audit), with_natural(memorization, audit)
    effects = (_eval_effects(loss_task, at_last.get(loss_task, {}), cfg)
               + _eval_effects(mem_task, at_last.get(mem_task, {}), cfg))
    base_step = int(cfg.model.checkpoint_step or 0)  # the initial checkpoint: evaluated with eval.on_load
    at_base = evaluated_all.get(base_step, {}) if last is not None and base_step < last else {}
    did: List[dict] = []
    before, after = at_base.get(loss_task, {}).get("rows"), at_last.get(loss_task, {}).get("rows")
    if loss_task and before and after:
        permutations, adjust = _test_options(cfg)
        did = pre_post_effects(before, after, "loss", sign=-1.0, permutations=permutations, seed=cfg.seed,
                               adjust_method=adjust, baseline_step=base_step,
                               family=f"{loss_task} change since step {base_step}: dup d vs 0")
        for r in did:
            r.update(task=loss_task, eval_type="insertion_loss")
    out = {
        "run_name": cfg.run_name,
        "run_dir": str(Path(cfg.run_dir).resolve()),
        "framework": cfg.framework.name,
        "model": {"name": cfg.model.name, "asset": cfg.model.asset, "path": cfg.model.path,
                  "revision": cfg.model.revision, "commit": _hub_commit(cfg),
                  "checkpoint_step": cfg.model.checkpoint_step},
        "seed": cfg.seed,
        "step": last,
        "plan": {"num_items": plan.num_items, "num_insertions": plan.num_insertions,
                 "inserted_tokens": int(plan.lengths.sum()), "window": window,
                 "inserted_fraction": float(plan.lengths.sum()) / max(1, window[1] - window[0]),
                 "experiments": plan.experiments},
        "per_dup": per_dup,
        "memorization": memorization,
        "effects": effects,
        "primary": [r for r in effects if r.get("primary") and r["task"] == loss_task],
        "did_effects": did,
        "statistics": statistics_entry(cfg),
        "metrics": {task: rec.get("metrics", {}) for task, rec in at_last.items()},
        "by_step": {str(step): {task: rec.get("metrics", {}) for task, rec in tasks.items()}
                    for step, tasks in evaluated_all.items()},
        "steps_evaluated_now": sorted(evaluated_now),
        "wall_s": wall_s,
    }
    bench = _tasks_of_type("benchmark", at_last)
    if bench:
        out["contamination"] = {t: contamination_summary(t, at_last[t], at_base.get(t), base_step, cfg)
                                for t in bench}
    if audit is not None:
        out["audit"] = audit_summary(audit)
    return _clean(out)


def with_natural(rows: List[dict], audit: dict) -> List[dict]:
    """Per-dup rows (``experiment``, ``dup_count``) with the audit's ``natural_items``, ``natural_exact`` and
    ``effective_dup_mean`` of their group's items (module docstring); rows of a group the audit lacks: unchanged."""
    groups: Dict[tuple, List[dict]] = {}
    for it in audit.get("items", []):
        groups.setdefault((it["experiment"], it["dup_count"]), []).append(it)
    out = []
    for r in rows:
        its = groups.get((r["experiment"], r["dup_count"]))
        if its:
            r = dict(r, natural_items=sum(1 for it in its if it["natural_exact"] or it["natural_ngram_hits"]),
                     natural_exact=sum(it["natural_exact"] for it in its),
                     effective_dup_mean=sum(it["effective_dup_count"] for it in its) / len(its))
        out.append(r)
    return out


def audit_summary(audit: dict) -> dict:
    """The ``audit`` entry of ``results.json``: n, cost, and the controls found in the window with where."""
    items = {it["item_id"]: it for it in audit.get("items", [])}
    controls = []
    for i in audit.get("contaminated_controls", []):
        it = items[i]
        at = (it["exact_at"] or it["ngram_at"] or [None])[0]
        controls.append({"item_id": i, "experiment": it["experiment"], "natural_exact": it["natural_exact"],
                         "natural_ngram_overlap": it["natural_ngram_overlap"], "first": at})
    return {"mode": audit.get("mode"), "ngram": audit.get("ngram"), "source": audit.get("source"),
            "window_tokens": audit.get("window_tokens"), "held_out_tokens": audit.get("held_out_tokens"),
            "seconds": audit.get("seconds"), "tokens_per_s": audit.get("tokens_per_s"),
            "items_in_window": sum(1 for it in items.values() if it["natural_exact"] or it["natural_ngram_hits"]),
            "items_in_held_out": sum(1 for it in items.values() if it["held_out_exact"]),
            "contaminated_controls": controls}


def exact_match_interval(m: dict):
    """``(low, high, method)`` of a memorization row's exact-match rate: the eval's own interval where the row has
    one (``ci_low``, ``ci_high``, ``ci_method``), else (a row written before intervals named their method, whose
    ``ci_*`` were those of the matched length) the Wilson interval of ``rate * n_items`` successes of
    ``n_items``."""
    if "exact_match_rate_ci_method" in m:
        return m.get("exact_match_rate_ci_low"), m.get("exact_match_rate_ci_high"), m["exact_match_rate_ci_method"]
    if "ci_method" in m:  # the row's own interval is the exact-match rate's
        return m.get("ci_low"), m.get("ci_high"), m["ci_method"]
    rate, n = m.get("exact_match_rate"), m.get("n_items")
    if missing(rate) or not n:
        return None, None, None
    _, low, high, method = stats.wilson_interval(int(round(rate * n)), int(n))
    return low, high, method


def print_table(results: dict) -> None:
    """Print the run's tables with rich: per experiment and dup count the items (``*``: fewer than
    ``MIN_ITEMS_PER_GROUP``), mean loss with its interval (``n/a``: none), exact match with its interval and the
    matched tokens (memorization); then the effects against the dup-0 controls (interval, randomization p, adjusted
    p), the primary endpoint and, with ``eval.on_load``, the pre/post effects; the audit, the held-out perplexity
    and the closed-loop table."""
    from rich.console import Console
    from rich.table import Table

    per_dup = results.get("per_dup", [])
    mem = {(r["experiment"], r["dup_count"]): r for r in results.get("memorization", [])}
    em_ci = {k: exact_match_interval(m) for k, m in mem.items()}
    audited = any("natural_items" in r for r in per_dup)
    loss_method = method_label(r.get("ci_method") for r in per_dup) or "t"
    em_method = method_label(c[2] for c in em_ci.values()) or "Wilson"
    level = f"{(results.get('statistics') or {}).get('ci_level', stats.LEVEL):.0%}"
    table = Table(title=f"{results['run_name']}: insertion loss at step {results['step']}")
    cols = ("experiment", "dup count", "items", "mean loss", f"{level} CI ({loss_method})", "exact match",
            f"{level} CI ({em_method})", "matched tokens")
    for col in cols + (("natural", "eff. dup") if audited else ()):
        table.add_column(col, justify="left" if col == "experiment" else "right")

    def fmt(v, spec=".3f"):
        return "-" if v is None else NA if missing(v) else format(v, spec)

    for r in per_dup:
        m = mem.get((r["experiment"], r["dup_count"]), {})
        low, high, _ = em_ci.get((r["experiment"], r["dup_count"]), (None, None, None))
        cells = [r["experiment"], str(r["dup_count"]), fmt_items(r["n_items"], r.get("small_n")),
                 fmt(r["mean_loss"]), fmt_ci(r.get("ci_low"), r.get("ci_high")),
                 fmt(m.get("exact_match_rate"), ".2f"), fmt_ci(low, high, ".2f") if m else "-",
                 fmt(m.get("mean_matched_length"), ".1f")]
        if audited:
            cells += [f"{r.get('natural_items', 0)}/{r['n_items']}", fmt(r.get("effective_dup_mean"), ".2f")]
        table.add_row(*cells)
    console = Console(width=max(140 if audited else 120, Console().width))
    console.print(table)
    for line in _table_notes(per_dup, list(em_ci.values())):
        console.print(line)
    _print_effects(results, console, level)
    for entry in (results.get("contamination") or {}).values():
        _print_contamination(entry, console, level)
    audit = results.get("audit")
    if audit:
        rate = audit.get("tokens_per_s")
        console.print(f"natural-duplicate audit ({audit['ngram']}-grams, {audit['window_tokens']:,} window + "
                      f"{audit['held_out_tokens']:,} held-out tokens" + (f", {rate:,.0f} tokens/s" if rate else "")
                      + f"): {audit['items_in_window']} item(s) occur in the window, "
                      f"{len(audit['contaminated_controls'])} of them controls")
        for c in audit["contaminated_controls"][:10]:
            at = c["first"] or {}
            console.print(f"  control item {c['item_id']} ({c['experiment']}): {c['natural_exact']} exact, "
                          f"{c['natural_ngram_overlap']:.0%} of its n-grams; first at step {at.get('step')}, "
                          f"row {at.get('row')}, offset {at.get('offset')}")
    for task, metrics in results.get("metrics", {}).items():
        if not missing(metrics.get("held_out/perplexity")):
            console.print(f"held-out perplexity ({task}): {metrics['held_out/perplexity']:.2f} "
                          f"over {int(metrics.get('held_out/tokens', 0))} tokens")
    if results.get("dynamic"):
        print_dynamic_table(results["dynamic"], console)


def _table_notes(per_dup: Sequence[dict], em_ci: Sequence[tuple]) -> List[str]:
    """The footnotes of the per-dup table: what ``*`` and ``n/a`` mean, where they occur."""
    notes = []
    small = [r["n_items"] for r in per_dup if r.get("small_n")]
    if small:
        n = min(small)
        notes.append(f"{SMALL_N_MARK} fewer than {stats.MIN_ITEMS_PER_GROUP} items per group: wide intervals, and an "
                     f"exact test of {n} vs {n} items cannot give p below {2 / math.comb(2 * n, n):.2g}")
    why = no_interval_reasons([r.get("ci_method") for r in per_dup if missing(r.get("ci_low"))]
                              + [c[2] for c in em_ci if c[2] and missing(c[0])])
    if why:
        notes.append(f"{NA}: no interval ({why})")
    return notes


def _print_effects(results: dict, console, level: str) -> None:
    """The effects table under the per-dup table: each dup-``d``-vs-0 contrast of ``insertion_loss`` (and its
    pre/post version with ``eval.on_load``), then each experiment's primary endpoint."""
    from rich.table import Table

    pairs = [r for r in results.get("effects") or [] if r.get("eval_type") == "insertion_loss"
             and r.get("contrast") != "trend" and not r.get("primary")]
    randomized = (results.get("dynamic") or {}).get("realized_dup_groups_randomized", True)
    did = results.get("did_effects") or []
    if pairs or did:
        rows = pairs + did
        ci = method_label(r.get("effect_ci_method") for r in rows) or "Welch t"
        p = method_label(r.get("p_method") for r in rows) or "randomization"
        adjust = method_label(r.get("p_adjust_method") for r in rows) or "none"
        name = _ADJUST_NAMES.get(adjust, adjust)
        t = Table(title=f"effects vs dup-0 controls at step {results.get('step')}"
                  + ("" if randomized else " (NOT randomized: dup counts chosen by the closed loop)"))
        for col in ("experiment", "contrast", "items", "effect", f"{level} CI ({ci})", "p", f"p ({name})"):
            t.add_column(col, justify="left" if col in ("experiment", "contrast") else "right")
        sizes = {(r["experiment"], r["dup_count"]): r.get("n_items") for r in results.get("per_dup") or []}
        for r in rows:
            # items of dup d vs dup 0 (the group sizes, whichever way round the effect subtracts them)
            n_d, n_0 = (r.get("n_treated"), r.get("n_control")) if r in did else (
                sizes.get((r["experiment"], r["dup_count"]), r.get("n_treated")),
                sizes.get((r["experiment"], 0), r.get("n_control")))
            t.add_row(r["experiment"], r["contrast"], f"{n_d} vs {n_0}",
                      NA if missing(r.get("effect")) else f"{r['effect']:.3f}",
                      fmt_ci(r.get("effect_ci_low"), r.get("effect_ci_high")), fmt_p(r.get("p_value")),
                      fmt_p(r.get("p_adjusted")))
        console.print(t)
        console.print(f"effect = {LOSS_EFFECT} (nats/token); p: {p} test, "
                      + ("not adjusted" if adjust == "none" else f"{name}-adjusted per family"))
        if did:
            console.print(f"change since step {did[0].get('baseline_step')}: each item's loss change from the "
                          "initial checkpoint (difference in differences: removes item difficulty)")
        if not randomized:
            console.print("the closed loop chose these dup counts from the items' losses: the groups differ before "
                          "training and these p-values do not test an insertion effect; read targets vs controls "
                          "(intent to treat) below")
    for r in results.get("primary") or [] if randomized else ():
        slope = NA if missing(r.get("effect")) else f"{r['effect']:.3f}"
        console.print(f"primary endpoint ({r['experiment']}, {r.get('n_treated')} items): slope of {LOSS_EFFECT} "
                      "over log(1 + dup count)")
        console.print(f"  {slope} nats/token per unit {fmt_ci(r.get('effect_ci_low'), r.get('effect_ci_high'))} "
                      f"({level} CI, {r.get('effect_ci_method')}), p = {fmt_p(r.get('p_value'))} "
                      f"({r.get('p_method')}), not adjusted")


def _print_contamination(entry: dict, console, level: str) -> None:
    """The ``contamination`` entry of one ``benchmark`` eval (:func:`contamination_summary`): per dup count the
    items, ``acc`` and ``acc_norm`` with their intervals and, with a baseline, the change of ``acc`` since it (the
    clean items' change is the spillover); then the pooled and per-dup effects with interval, p and adjusted p."""
    from rich.table import Table

    base = entry.get("baseline_step")
    change = {r["dup_count"]: r for r in entry.get("change_since_baseline") or [] if r.get("metric") == "acc"}
    per_dup = entry.get("per_dup") or []
    t = Table(title=f"benchmark contamination ({entry.get('task')}, experiment {entry.get('experiment')})")
    acc_method = method_label(r.get("ci_method") for r in per_dup) or "Wilson"
    cols = ["dup count", "items", "acc", f"{level} CI ({acc_method})", "acc_norm", f"{level} CI"]
    if base is not None:
        cols += [f"acc change since step {base}", f"{level} CI (t)"]
    for col in cols:
        t.add_column(col, justify="right")
    for r in per_dup:
        cells = [str(r["dup_count"]), fmt_items(r["n_items"], r.get("small_n")), f"{r['acc']:.3f}",
                 fmt_ci(r.get("ci_low"), r.get("ci_high")), f"{r['acc_norm']:.3f}",
                 fmt_ci(r.get("acc_norm_ci_low"), r.get("acc_norm_ci_high"))]
        if base is not None:
            c = change.get(r["dup_count"], {})
            cells += [NA if missing(c.get("change")) else f"{c['change']:+.3f}",
                      fmt_ci(c.get("ci_low"), c.get("ci_high"))]
        t.add_row(*cells)
    console.print(t)
    pooled = len({r["dup_count"] for r in per_dup if r["dup_count"] != 0}) > 1  # else it repeats that dup count
    rows = [e for e in entry.get("effects") or [] if e.get("contrast") not in ("trend", "dup > 0 vs 0")]
    if pooled:
        rows += [e for m, e in sorted((entry.get("pooled_effects") or {}).items())]
    rows += entry.get("did_effects") or []
    for e in rows:
        console.print(f"  {e.get('metric', 'acc')} {e['contrast']}: {e['effect']:+.3f} "
                      f"{fmt_ci(e.get('effect_ci_low'), e.get('effect_ci_high'))} ({level} CI, "
                      f"{e.get('effect_ci_method')}), p = {fmt_p(e.get('p_value'))} ({e.get('p_method')}), "
                      f"{_ADJUST_NAMES.get(e.get('p_adjust_method'), e.get('p_adjust_method'))} "
                      f"{fmt_p(e.get('p_adjusted'))}")
    if base is not None and 0 in change:
        console.print(f"  spillover: the clean items' acc changed by {change[0]['change']:+.3f} "
                      f"{fmt_ci(change[0].get('ci_low'), change[0].get('ci_high'))} since step {base}; the base "
                      "model's own pretraining contamination is not audited (the effect is on top of it)")


#: how a ``p_adjust_method`` reads in a table title
_ADJUST_NAMES = {"holm": "Holm", "bh": "BH", "none": "not adjusted"}


def print_dynamic_table(dyn: dict, console=None) -> None:
    """Print the closed-loop tables of ``results.json``'s ``dynamic`` entry
    (:func:`pretrain_exp.insertion.dynamic.summary`): per item its arm (target or control), static and dynamic dup
    counts, the decision steps that inserted it, its first and final loss and the policy's columns (the registered
    policy's :attr:`~pretrain_exp.insertion.policies.base.Policy.item_columns`, e.g. ``until_memorized``: the step it
    fell below the threshold, whether the next eval confirmed it, the dup count a confirmed item needed); then each
    arm's mean final loss (t interval) and the policy's counts (its ``arm_columns``), the intent-to-treat effect of
    targets vs controls (Welch interval, randomization p), and the caveat that groups by realized dup count are
    outcome-selected (``realized_dup_groups_randomized``; the policy's own ``caveat`` added)."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=120)
    level = f"{stats.LEVEL:.0%}"
    policy = get_policy(dyn["policy"], "dynamic.policy")  # its columns and words (a registered plugin)
    what = policy.rule(dyn)
    first, last = dyn.get("initial_step"), dyn.get("final_step")
    names = list(dict.fromkeys(r["experiment"] for r in dyn["items"]))
    one = len(names) == 1  # one target experiment: named in the titles instead of a column
    of = f" of {names[0]}" if one else ""
    table = Table(title=f"dynamic insertion{of} ({dyn['policy']}: {dyn['copies']} copy/segment {what})")
    cols = ["item", "arm"] + ([] if one else ["experiment"]) + [
        "static dups", "dynamic dups", "added at steps", "first loss" if first is None else f"loss at step {first}",
        "final loss" if last is None else f"loss at step {last}"]
    cols += policy.item_columns
    for col in cols:
        table.add_column(col, justify="left" if col in ("arm", "experiment", "added at steps") else "right")
    loss = (lambda v: "-" if missing(v) else f"{v:.3f}")
    for r in dyn["items"]:
        cells = [str(r["item_id"]), r.get("arm", "target")] + ([] if one else [r["experiment"]]) + [
            str(r["static_dups"]), str(r["dynamic_dups"]), ",".join(map(str, r["added_at"])) or "-",
            loss(r.get("initial_loss")), loss(r["final_loss"])]
        table.add_row(*cells, *policy.item_cells(r))
    console.print(table)
    arms = dyn.get("arms") or []
    if arms:
        ci = method_label(r.get("ci_method") for r in arms) or "t"
        t = Table(title=f"arms{of} at step {last}: insertion loss (nats/token)")
        cols = ([] if one else ["experiment"]) + ["arm", "randomized", "items", f"loss at step {first}",
                                                  "mean loss", f"{level} CI ({ci})"]
        cols += policy.arm_columns
        for col in cols:
            t.add_column(col, justify="left" if col in ("experiment", "arm", "randomized") else "right")
        for r in arms:
            cells = ([] if one else [r["experiment"]]) + [
                r["arm"], "yes" if r["randomized"] else "no (policy)", fmt_items(r["n_items"], r.get("small_n")),
                loss(r.get("initial_mean")), loss(r.get("mean")), fmt_ci(r.get("ci_low"), r.get("ci_high"))]
            t.add_row(*cells, *policy.arm_cells(r))
        console.print(t)
        note = policy.arms_note(dyn, arms)
        if note:
            console.print(note)
        if any(r.get("small_n") for r in arms):
            console.print(f"{SMALL_N_MARK} fewer than {stats.MIN_ITEMS_PER_GROUP} items: wide intervals")
    itt = dyn.get("itt") or []
    if itt:
        ci = method_label(r.get("effect_ci_method") for r in itt) or "Welch t"
        p = method_label(r.get("p_method") for r in itt) or "randomization"
        t = Table(title=f"intent to treat{of} at step {last}: every target vs every control")
        cols = ([] if one else ["experiment"]) + ["measure", "items", "effect", f"{level} CI ({ci})", "p", "p (Holm)"]
        for col in cols:
            t.add_column(col, justify="left" if col in ("experiment", "measure") else "right")
        for r in itt:
            t.add_row(*([] if one else [r["experiment"]]), r["measure"] + (" (primary)" if r.get("primary") else ""),
                      f"{r.get('n_treated')} vs {r.get('n_control')}",
                      NA if missing(r.get("effect")) else f"{r['effect']:+.3f}",
                      fmt_ci(r.get("effect_ci_low"), r.get("effect_ci_high")), fmt_p(r.get("p_value")),
                      fmt_p(r.get("p_adjusted")) if "p_adjusted" in r else "-")
        console.print(t)
        console.print(f"effect = mean(control loss) - mean(target loss), nats/token (positive: targets' loss lower); "
                      f"p: {p} test over the random draw of the controls; the primary row is not adjusted")
    if not dyn.get("realized_dup_groups_randomized", False):
        console.print("caveat: each target's dup count was chosen by the policy from its own losses, so tables by dup "
                      "count compare outcome-selected groups (not randomized: harder items get more copies); "
                      + ("the randomized comparison is targets vs controls (intent to treat)" if itt
                         else "this run has no randomized controls to compare the targets with")
                      + (f"; {policy.caveat}" if policy.caveat else ""))


def _hub_commit(cfg) -> Optional[str]:
    """The commit sha a Hub ``model.path`` (at ``model.revision``) resolved to, else ``None``."""
    from pretrain_exp.frameworks.hub import is_hub_id, resolved_commit

    path = cfg.model.path
    if not path or Path(str(path)).exists() or not is_hub_id(str(path)):
        return None
    return resolved_commit(str(path), cfg.model.revision)


# --- the tables of one eval record (pretrain-exp-eval) ----------------------------------------------------------

#: per eval type, the values of its ``per_dup`` rows printed by :func:`print_eval_tables`: ``(label, value key,
#: prefix of the value's own ``<prefix>ci_low`` / ``ci_high`` / ``ci_method`` keys)``; prefix ``""``: the row's
#: ``ci_*`` (its first value's interval); the exact-match rate reads its interval with :func:`exact_match_interval`
_PER_DUP_VALUES = {
    "insertion_loss": [("mean loss", "mean_loss", "")],
    "memorization": [("exact match", "exact_match_rate", "exact_match_rate_"),
                     ("fraction matched", "fraction_matched", "fraction_matched_")],
    "knowledge": [("ln P sum", "logp_sum", ""), ("ln P mean", "logp_mean", "logp_mean_"),
                  ("greedy acc", "greedy_acc", "greedy_acc_")],
    "benchmark": [("acc", "acc", ""), ("acc_norm", "acc_norm", "acc_norm_")],
    "gaussian": [("mean score", "mean_score", "")],
}
#: the interval method of a value whose rows have none to name (every row ``none (...)``): the eval's own
_DEFAULT_METHOD = {"exact_match_rate": "Wilson", "acc": "Wilson", "acc_norm": "Wilson", "greedy_acc": "Wilson / t"}
#: per eval type, the columns that tell its ``per_dup`` rows of one dup count apart (besides experiment, dup count)
_PER_DUP_KEYS = {"knowledge": [("probe", "probe")], "mia": [("score", "score")]}


def _interval_of(row: dict, key: str, prefix: str) -> tuple:
    """``(low, high, method)`` of value ``key`` of a per-dup row (:data:`_PER_DUP_VALUES`)."""
    if key == "exact_match_rate":
        return exact_match_interval(row)
    return row.get(f"{prefix}ci_low"), row.get(f"{prefix}ci_high"), row.get(f"{prefix}ci_method")


def _fmt_value(v, spec: str = ".3f") -> str:
    return "-" if v is None else NA if missing(v) else format(v, spec) if isinstance(v, float) else str(v)


def eval_tables(rec: dict, computed_now: bool, path: Optional[str] = None,
                level: str = f"{stats.LEVEL:.0%}") -> list:
    """The rich renderables (tables, then footnote lines) of one eval record ``evals/step<N>/<task>.json``
    (``{task, type, step, metrics, per_dup, rows, effects}``, saved at ``path``), titled ``<task> (<type>) at step
    <N>: computed now`` or ``...: read from disk`` (``computed_now``: whether this invocation computed it, else it
    was saved earlier and kept), its caption naming the file:

    - ``mia``: per experiment, dup count and score the members vs non-members, the ROC AUC with its interval
      (``ci_method``, Newcombe score), the randomization p of AUC = 0.5 and its adjusted p (methods from the
      record's ``effects``);
    - ``perplexity``: the held-out tokens, loss (nats/token), perplexity and bits per token (no interval);
    - ``lm_eval``: per task (and group) and metric the value and its standard error: the record's own
      ``<task>/<metric>_stderr`` where it has one, else lm-eval's ``mean_stderr`` of a 0/1 metric,
      ``sqrt(p (1 - p) / (n - 1))`` over the task's ``n`` docs (``lm_eval.api.metrics``; a group's pooled with
      lm-eval's ``pooled_sample_stderr`` over its tasks);
    - ``insertion_loss``, ``memorization``, ``knowledge``, ``benchmark``, ``gaussian``: per experiment and dup count
      the items and each value of :data:`_PER_DUP_VALUES` with its interval, the column naming the method;
    - any other type: its metrics.

    Intervals print ``n/a`` where a row has none; ``*`` marks groups of fewer than ``MIN_ITEMS_PER_GROUP`` items.
    """
    from rich.table import Table

    task, kind, step = rec.get("task"), rec.get("type"), rec.get("step")
    title = (f"{task}" + ("" if task == kind else f" ({kind})") + f" at step {step}: "
             + ("computed now" if computed_now else "read from disk"))
    caption = (f"saved to {path}" if computed_now else f"{path or 'saved earlier'}: kept (--redo recomputes)")
    metrics, per_dup = rec.get("metrics") or {}, rec.get("per_dup") or []
    out: list = []
    if kind == "mia" and per_dup:
        eff = {(e.get("experiment"), e.get("dup_count"), e.get("score")): e for e in rec.get("effects") or []}
        ci = method_label(r.get("ci_method") for r in per_dup) or "Newcombe score"
        p = method_label(e.get("p_method") for e in eff.values()) or "randomization"
        adjust = method_label(e.get("p_adjust_method") for e in eff.values()) or "holm"
        t = Table(title=title, caption=caption)
        for col in ("experiment", "dup count", "score", "members vs non-members", "AUC", f"{level} CI ({ci})",
                    f"p ({p})", f"p ({_ADJUST_NAMES.get(adjust, adjust)})"):
            t.add_column(col, justify="left" if col in ("experiment", "score") else "right")
        for r in per_dup:
            t.add_row(r["experiment"], str(r["dup_count"]), str(r.get("score")),
                      f"{r.get('n_members', r.get('n_items'))} vs "
                      f"{fmt_items(r.get('n_nonmembers'), r.get('small_n'))}", _fmt_value(r.get("auc")),
                      fmt_ci(r.get("ci_low"), r.get("ci_high")), fmt_p(r.get("p_value")), fmt_p(r.get("p_adjusted")))
        out += [t, "AUC of dup-d items (members) vs the experiment's dup-0 controls (non-members); 0.5: chance"]
        if any(r.get("small_n") for r in per_dup):
            out.append(f"{SMALL_N_MARK} fewer than {stats.MIN_ITEMS_PER_GROUP} items per group: wide intervals")
    elif kind == "perplexity":
        t = Table(title=title, caption=caption)
        for col in ("held-out tokens", "loss (nats/token)", "perplexity", "bits/token"):
            t.add_column(col, justify="right")
        if metrics:
            t.add_row(f"{int(metrics.get('held_out/tokens', 0)):,}", _fmt_value(metrics.get("held_out/loss"), ".4f"),
                      _fmt_value(metrics.get("held_out/perplexity"), ".2f"),
                      _fmt_value(metrics.get("held_out/bits_per_token"), ".4f"))
        out.append(t)
        if not metrics:
            out.append("no held-out rows to score (data.held_out_rows)")
    elif kind == "lm_eval":
        out += _lm_eval_table(rec, title, caption)
    elif kind in _PER_DUP_VALUES and per_dup:
        values, keys = _PER_DUP_VALUES[kind], _PER_DUP_KEYS.get(kind, [])
        t = Table(title=title, caption=caption)
        cols = ["experiment", "dup count"] + [label for label, _ in keys]
        cols.append("facts" if kind == "knowledge" else "items")
        for label, key, prefix in values:
            method = method_label(_interval_of(r, key, prefix)[2] for r in per_dup) or _DEFAULT_METHOD.get(key, "t")
            cols += [label, f"{level} CI ({method})"]
        for col in cols:
            t.add_column(col, justify="left" if col in ("experiment", "probe") else "right",
                         no_wrap=col.startswith(level))
        spec = ".2f" if kind == "benchmark" else ".3f"
        for r in per_dup:
            cells = [r["experiment"], str(r["dup_count"])] + [str(r.get(k)) for _, k in keys]
            cells.append(fmt_items(r.get("n_items"), r.get("small_n")))
            for _, key, prefix in values:
                low, high, _ = _interval_of(r, key, prefix)
                cells += [_fmt_value(r.get(key), spec), fmt_ci(low, high, spec)]
            t.add_row(*cells)
        out.append(t)
        small = [r["n_items"] for r in per_dup if r.get("small_n")]
        if small:
            out.append(f"{SMALL_N_MARK} fewer than {stats.MIN_ITEMS_PER_GROUP} items per group: wide intervals")
        why = no_interval_reasons(_interval_of(r, key, prefix)[2] for r in per_dup for _, key, prefix in values
                                  if missing(_interval_of(r, key, prefix)[0]))
        if why:
            out.append(f"{NA}: no interval ({why})")
    else:
        t = Table(title=title, caption=caption)
        t.add_column("metric")
        t.add_column("value", justify="right")
        for k, v in metrics.items():
            t.add_row(k, _fmt_value(v, ".4g"))
        out.append(t)
    return out


def _lm_eval_table(rec: dict, title: str, caption: str) -> list:
    """:func:`eval_tables` of an ``lm_eval`` record: one row per task (its ``rows``) and metric, a group (``mmlu``:
    its ``metrics`` without a row) in one row in place of its tasks'."""
    from rich.table import Table

    from pretrain_exp.evals.lm_eval import GROUPS

    metrics = rec.get("metrics") or {}
    rows = rec.get("rows") or []
    tasks = {r["task"] for r in rows}
    groups = {k.rpartition("/")[0] for k in metrics if "/" in k} - tasks
    grouped = {m: g for g in groups for m in GROUPS.get(g, ())}
    t = Table(title=title, caption=caption)
    for col in ("task", "split", "docs", "metric", "value", "stderr"):
        t.add_column(col, justify="left" if col in ("task", "split", "metric") else "right")
    stderr: Dict[tuple, Optional[float]] = {}
    computed = False
    for r in rows:
        for m in ("acc", "acc_norm"):
            if m not in r:
                continue
            own = metrics.get(f"{r['task']}/{m}_stderr")
            stderr[(r["task"], m)] = own if own is not None else lm_eval_stderr(r[m], r.get("n_docs"))
            computed = computed or own is None
            if r["task"] not in grouped:
                t.add_row(r["task"], str(r.get("split", "-")), str(r.get("n_docs", "-")), m,
                          _fmt_value(r[m], ".4f"), _fmt_value(stderr[(r["task"], m)], ".4f"))
    notes = []
    for group in sorted(groups):
        members = [r for r in rows if grouped.get(r["task"]) == group]
        for m in ("acc", "acc_norm"):
            if f"{group}/{m}" not in metrics:
                continue
            own = metrics.get(f"{group}/{m}_stderr")
            se = own if own is not None else pooled_stderr([stderr.get((r["task"], m)) for r in members],
                                                           [r.get("n_docs") for r in members])
            t.add_row(group, ", ".join(sorted({str(r.get("split")) for r in members})) or "-",
                      str(sum(r.get("n_docs") or 0 for r in members)), m, _fmt_value(metrics[f"{group}/{m}"], ".4f"),
                      _fmt_value(se, ".4f"))
        notes.append(f"{group}: the doc-weighted mean over its {len(members)} tasks (each in the eval's file)")
    out = [t] + notes
    if computed:
        out.append("stderr: lm-eval's mean_stderr of the task's 0/1 scores, sqrt(p (1 - p) / (n - 1)) over its n docs "
                   "(a group's: lm-eval's pooled_sample_stderr over its tasks)")
    return out


def lm_eval_stderr(p, n) -> Optional[float]:
    """lm-eval's standard error of a mean of ``n`` 0/1 scores with mean ``p`` (``lm_eval.api.metrics.mean_stderr``:
    sample standard deviation over ``sqrt(n)``, i.e. ``sqrt(p (1 - p) / (n - 1))``); ``None`` for ``n < 2`` or
    a missing ``p``."""
    if missing(p) or not n or n < 2:
        return None
    return math.sqrt(max(0.0, p * (1.0 - p)) / (n - 1))


def pooled_stderr(stderrs: Sequence[Optional[float]], sizes: Sequence[Optional[int]]) -> Optional[float]:
    """The standard error of a group's doc-weighted mean from its tasks' (``lm_eval.api.metrics.
    pooled_sample_stderr``); ``None`` without tasks, with a missing one, or with no more docs than tasks."""
    if not stderrs or any(s is None for s in stderrs) or any(not n for n in sizes) or sum(sizes) <= len(sizes):
        return None
    from lm_eval.api.metrics import pooled_sample_stderr

    return float(pooled_sample_stderr(list(stderrs), list(sizes)))


def print_eval_tables(records: Dict[int, Dict[str, dict]], computed: Dict[int, Sequence[str]],
                      paths: Optional[Dict[int, Dict[str, str]]] = None, console=None) -> None:
    """Print the tables of each eval record (:func:`eval_tables`) by step, then task: ``records`` step -> task ->
    record, ``computed`` step -> the tasks computed now (the others were read from disk), ``paths`` step -> task ->
    the file it is saved in."""
    from rich.console import Console

    console = console or Console(width=max(160, Console().width))
    for step in sorted(records):
        for task, rec in records[step].items():
            path = (paths or {}).get(step, {}).get(task)
            for part in eval_tables(rec, task in computed.get(step, ()), path):
                console.print(part)
