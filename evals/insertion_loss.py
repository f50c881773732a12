"""Insertion loss: how well the model predicts each inserted item, against never-inserted (dup-0) controls.

For every plan item the item's tokens are scored as one sequence (the item alone, no surrounding training
context) and the per-token cross-entropy is averaged over positions ``1..n-1``; the first token (the leading
EOS of an EOS-wrapped item) is context only, so the loss covers the text and the trailing EOS. Memorization
shows as a lower loss for items inserted more often than for the controls.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pretrain_exp.evals.base import EvalContext, EvalResult, EvalTaskConf
from pretrain_exp.evals.scoring import plan_item_rows, token_losses
from pretrain_exp.evals.stats import per_dup_summary


@dataclass
class InsertionLossConf(EvalTaskConf):
    """Schema of an ``insertion_loss`` eval (no options)."""

    type: str = "insertion_loss"


def insertion_loss(cfg: InsertionLossConf, ctx: EvalContext) -> EvalResult:
    """Mean per-token loss (nats) of every plan item, summarized per ``(experiment, dup_count)``.

    :returns: ``rows``: one per item with at least 2 tokens, ``{item_id, experiment, dup_count, loss,
        n_tokens}`` (``loss`` in nats/token over ``n_tokens = length - 1`` predicted tokens); ``per_dup``:
        ``{experiment, dup_count, n_items, mean_loss, ci_low, ci_high}`` (mean over items,
        percentile-bootstrap CI with ``ctx.bootstrap_samples`` resamples and ``ctx.seed``); ``metrics``:
        ``{experiment}/dup{d}/mean_loss`` per group and ``{experiment}/loss_gap_max_vs_0`` (dup-0 mean loss
        minus the mean loss of the highest dup count) where an experiment has both.
    """
    plan = ctx.plan
    losses = token_losses(ctx.model, [plan.item_tokens(i) for i in range(plan.num_items)], ctx.batch_size)
    rows = [dict(r, loss=float(np.mean(lo, dtype=np.float64)), n_tokens=int(lo.size))
            for r, lo in zip(plan_item_rows(plan), losses) if lo.size]
    per_dup = [{"mean_loss" if k == "mean" else k: v for k, v in g.items()}
               for g in per_dup_summary(rows, "loss", ctx.bootstrap_samples, ctx.seed)]
    metrics = {f"{g['experiment']}/dup{g['dup_count']}/mean_loss": g["mean_loss"] for g in per_dup}
    for exp in sorted({g["experiment"] for g in per_dup}):
        groups = [g for g in per_dup if g["experiment"] == exp]  # sorted by dup count
        if groups[0]["dup_count"] == 0 and groups[-1]["dup_count"] > 0:
            metrics[f"{exp}/loss_gap_max_vs_0"] = groups[0]["mean_loss"] - groups[-1]["mean_loss"]
    return EvalResult(metrics=metrics, per_dup=per_dup, rows=rows)
