"""Insertion loss: how well the model predicts each inserted item, against never-inserted (dup-0) controls.

For every plan item the item's tokens are scored as one sequence (the item alone, no surrounding training
context) and the per-token cross-entropy is averaged over positions ``1..n-1``; the first token (the leading
EOS of an EOS-wrapped item) is context only, so the loss covers the text and the trailing EOS. Memorization
shows as a lower loss for items inserted more often than for the controls.

Per dup count the mean loss over items carries a Student t interval; each dup count ``d > 0`` is compared with the
experiment's controls (``loss(dup 0) - loss(dup d)``, Welch interval, exact randomization p-value, Holm-adjusted
over the eval's contrasts at the step), and the slope of the loss drop over ``log(1 + dup)`` is the primary
endpoint (:mod:`pretrain_exp.evals.effects`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pretrain_exp.core.stats import per_dup_summary
from pretrain_exp.evals.base import EvalContext, EvalResult, EvalTaskConf
from pretrain_exp.evals.effects import EffectSpec, family_effects


@dataclass
class InsertionLossConf(EvalTaskConf):
    """Schema of an ``insertion_loss`` eval (no options)."""

    type: str = "insertion_loss"


def insertion_loss(cfg: InsertionLossConf, ctx: EvalContext) -> EvalResult:
    """Mean per-token loss (nats) of every plan item, summarized per ``(experiment, dup_count)``.

    :returns: ``rows``: one per item with at least 2 tokens, ``{item_id, experiment, dup_count, loss,
        n_tokens}`` (``loss`` in nats/token over ``n_tokens = length - 1`` predicted tokens); ``per_dup``:
        ``{experiment, dup_count, n_items, mean_loss, ci_low, ci_high, ci_method, small_n}`` (mean over items,
        Student t 95% interval; none, ``nan``, for fewer than 2 items; ``small_n`` below
        :data:`~pretrain_exp.core.stats.MIN_ITEMS_PER_GROUP` items); ``effects``: per experiment and ``d > 0``
        the effect ``loss(dup 0) - loss(dup d)`` (nats; positive = the inserted items are predicted better) with
        its Welch interval and randomization p-value (``ctx.permutations``, ``ctx.seed``), adjusted over the
        eval's contrasts with ``ctx.p_adjust``, and the primary trend row (the drop in loss per unit of
        ``log(1 + dup)``); ``metrics``: ``{experiment}/dup{d}/mean_loss`` per group, ``{experiment}/loss_gap_max_vs_0``
        (dup-0 mean loss minus the mean loss of the highest dup count) with ``_ci_low``, ``_ci_high``,
        ``_p_value`` and ``_p_adjusted`` where an experiment has both, and ``{experiment}/trend_slope`` with
        ``_ci_low``, ``_ci_high``, ``_p_value`` where it has two or more dup counts.
    """
    from pretrain_exp.evals.scoring import plan_item_rows, token_losses  # torch with it: imported here

    plan = ctx.plan
    losses = token_losses(ctx.model, [plan.item_tokens(i) for i in range(plan.num_items)], ctx.batch_size)
    rows = [dict(r, loss=float(np.mean(lo, dtype=np.float64)), n_tokens=int(lo.size))
            for r, lo in zip(plan_item_rows(plan), losses) if lo.size]
    per_dup = [{"mean_loss" if k == "mean" else k: v for k, v in g.items()} for g in per_dup_summary(rows, "loss")]
    effects = family_effects([EffectSpec(rows, "loss", sign=-1.0, primary=True)], ctx, "insertion_loss")
    metrics = {f"{g['experiment']}/dup{g['dup_count']}/mean_loss": g["mean_loss"] for g in per_dup}
    for exp in sorted({g["experiment"] for g in per_dup}):
        groups = [g for g in per_dup if g["experiment"] == exp]  # sorted by dup count
        if groups[0]["dup_count"] == 0 and groups[-1]["dup_count"] > 0:
            key = f"{exp}/loss_gap_max_vs_0"
            metrics[key] = groups[0]["mean_loss"] - groups[-1]["mean_loss"]
            e = next(r for r in effects if r["experiment"] == exp and r["dup_count"] == groups[-1]["dup_count"])
            metrics.update({f"{key}_ci_low": e["effect_ci_low"], f"{key}_ci_high": e["effect_ci_high"],
                            f"{key}_p_value": e["p_value"], f"{key}_p_adjusted": e["p_adjusted"]})
        trend = next((r for r in effects if r["experiment"] == exp and r["contrast"] == "trend"), None)
        if trend is not None:
            metrics.update({f"{exp}/trend_slope": trend["effect"], f"{exp}/trend_slope_ci_low": trend["effect_ci_low"],
                            f"{exp}/trend_slope_ci_high": trend["effect_ci_high"],
                            f"{exp}/trend_slope_p_value": trend["p_value"]})
    return EvalResult(metrics=metrics, per_dup=per_dup, rows=rows, effects=effects)
