"""A run's own summary: the ``results.json`` content and the console table at the end of a run.

``results.json`` holds ``per_dup``: one row ``{experiment, dup_count, n_items, mean_loss, ci_low, ci_high}``
per experiment and dup count, from the ``insertion_loss`` eval of the last evaluated step (95% bootstrap CIs
over items), plus the memorization rows, every eval's metrics by step, and the plan's size. With the
natural-duplicate audit (``audit.json``, :mod:`pretrain_exp.insertion.audit`) every per-dup and memorization row
also has ``natural_items`` (items of the group found in the training window: an exact occurrence or an n-gram
hit), ``natural_exact`` (their exact occurrences, summed) and ``effective_dup_mean`` (mean of dup count + natural
exact occurrences), and ``audit`` summarizes the audit (n, cost, the controls found in the window). Its figures are
:func:`pretrain_exp.report.plots.plot_per_dup` and :func:`~pretrain_exp.report.plots.plot_loss_vs_step`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional

from pretrain_exp.core.config import RunConfig


def _task_of_type(cfg: RunConfig, kind: str, records: Dict[str, dict]):
    """The configured task of type ``kind``, else one saved in ``records`` (task -> eval record): a run evaluated
    again with other evals (``pretrain-exp-eval``) keeps its earlier tasks' tables."""
    return next((name for name, t in cfg.eval.tasks.items() if t.type == kind),
                next((name for name, r in records.items() if r.get("type") == kind), None))


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
    per_dup = at_last.get(loss_task, {}).get("per_dup", []) if loss_task else []
    memorization = at_last.get(mem_task, {}).get("per_dup", []) if mem_task else []
    if audit is not None:
        per_dup, memorization = with_natural(per_dup, audit), with_natural(memorization, audit)
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
        "metrics": {task: rec.get("metrics", {}) for task, rec in at_last.items()},
        "by_step": {str(step): {task: rec.get("metrics", {}) for task, rec in tasks.items()}
                    for step, tasks in evaluated_all.items()},
        "steps_evaluated_now": sorted(evaluated_now),
        "wall_s": wall_s,
    }
    if audit is not None:
        out["audit"] = audit_summary(audit)
    return out


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


def print_table(results: dict) -> None:
    """Print the per-dup table (loss with CI, memorization) and the held-out perplexity with rich."""
    from rich.console import Console
    from rich.table import Table

    mem = {(r["experiment"], r["dup_count"]): r for r in results.get("memorization", [])}
    table = Table(title=f"{results['run_name']}: insertion loss at step {results['step']} (95% bootstrap CI)")
    audited = any("natural_items" in r for r in results.get("per_dup", []))
    cols = ("experiment", "dup count", "items", "mean loss", "95% CI", "exact match", "matched tokens")
    for col in cols + (("natural", "eff. dup") if audited else ()):
        table.add_column(col, justify="left" if col == "experiment" else "right")

    def fmt(v, spec=".3f"):
        return "-" if v is None else format(v, spec)

    for r in results.get("per_dup", []):
        m = mem.get((r["experiment"], r["dup_count"]), {})
        cells = [r["experiment"], str(r["dup_count"]), str(r["n_items"]), fmt(r["mean_loss"]),
                 f"[{fmt(r['ci_low'])}, {fmt(r['ci_high'])}]", fmt(m.get("exact_match_rate"), ".2f"),
                 fmt(m.get("mean_matched_length"), ".1f")]
        if audited:
            cells += [f"{r.get('natural_items', 0)}/{r['n_items']}", fmt(r.get("effective_dup_mean"), ".2f")]
        table.add_row(*cells)
    console = Console(width=max(130 if audited else 110, Console().width))
    console.print(table)
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
        if "held_out/perplexity" in metrics:
            console.print(f"held-out perplexity ({task}): {metrics['held_out/perplexity']:.2f} "
                          f"over {int(metrics.get('held_out/tokens', 0))} tokens")
    if results.get("dynamic"):
        print_dynamic_table(results["dynamic"], console)


def print_dynamic_table(dyn: dict, console=None) -> None:
    """Print the closed-loop table of ``results.json``'s ``dynamic`` entry: per target item its static and dynamic
    dup counts, the decision steps that inserted it, its final loss and the policy's columns (``until_memorized``:
    the step it fell below the threshold and the dup count it needed; ``spaced_repetition``: re-insertions)."""
    from rich.console import Console
    from rich.table import Table

    memo = dyn["policy"] == "until_memorized"
    what = (f"until loss < {dyn['threshold']} nats/token" if memo
            else f"when loss rose > {dyn['margin']} nats/token since the last insertion")
    table = Table(title=f"dynamic insertion ({dyn['policy']}: {dyn['copies']} copy/segment {what})")
    cols = ["item", "experiment", "static dups", "dynamic dups", "added at steps", "final loss"]
    cols += ["memorized at step", "dups needed"] if memo else ["repetitions"]
    for col in cols:
        table.add_column(col, justify="left" if col in ("experiment", "added at steps") else "right")
    for r in dyn["items"]:
        cells = [str(r["item_id"]), r["experiment"], str(r["static_dups"]), str(r["dynamic_dups"]),
                 ",".join(map(str, r["added_at"])) or "-",
                 "-" if r["final_loss"] is None else f"{r['final_loss']:.3f}"]
        if memo:
            cells += ["-" if r["memorized_at_step"] is None else str(r["memorized_at_step"]),
                      "not reached" if r["dups_needed"] is None else str(r["dups_needed"])]
        else:
            cells.append(str(r["repetitions"]))
        table.add_row(*cells)
    (console or Console(width=120)).print(table)


def _hub_commit(cfg) -> Optional[str]:
    """The commit sha a Hub ``model.path`` (at ``model.revision``) resolved to, else ``None``."""
    from pretrain_exp.frameworks.hub import is_hub_id, resolved_commit

    path = cfg.model.path
    if not path or Path(str(path)).exists() or not is_hub_id(str(path)):
        return None
    return resolved_commit(str(path), cfg.model.revision)
