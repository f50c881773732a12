"""Verbatim memorization: does greedy decoding from an item's prefix reproduce the item's continuation?

Extraction test in the style of Carlini et al. 2023, "Quantifying Memorization Across Neural Language
Models" (ICLR): prompt with the first ``prefix_length`` tokens of an item, greedy-decode, and compare with the
item's true next tokens. Items inserted more often should be reproduced more often than dup-0 controls.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pretrain_exp.core.errors import ConfigError
from pretrain_exp.evals.base import EvalContext, EvalResult, EvalTaskConf
from pretrain_exp.evals.scoring import greedy_decode, plan_item_rows
from pretrain_exp.evals.shard import map_batches
from pretrain_exp.evals.stats import per_dup_summary


@dataclass
class MemorizationConf(EvalTaskConf):
    """Schema of a ``memorization`` eval.

    :raises ConfigError: if ``prefix_length`` or ``max_new_tokens`` is below 1.
    """

    type: str = "memorization"
    prefix_length: int = 16  #: prompt tokens taken from the start of each item (including its leading EOS)
    max_new_tokens: int = 32  #: at most this many continuation tokens are generated and compared

    def validate(self, key: str) -> None:
        for name in ("prefix_length", "max_new_tokens"):
            value = getattr(self, name)
            if value < 1:
                raise ConfigError(f"{key}.{name}", f"must be >= 1, got {value}")


def memorization(cfg: MemorizationConf, ctx: EvalContext) -> EvalResult:
    """Greedy extraction of every item longer than ``prefix_length + 1`` tokens.

    An item of ``n`` tokens is prompted with ``tokens[:P]`` and compared with ``tokens[P:P + c]``,
    ``c = min(max_new_tokens, n - P)``; items with ``n <= P + 1`` are skipped (their continuation would be at
    most the trailing EOS). Items are decoded ``ctx.batch_size`` at a time (equal-length prompts, no padding),
    longest continuation first, each batch for its longest ``c``.

    :returns: ``rows`` ``{item_id, experiment, dup_count, exact_match, matched_length, continuation_length}``
        (``exact_match``: all ``c`` tokens reproduced; ``matched_length``: leading tokens reproduced);
        ``per_dup`` ``{experiment, dup_count, n_items, exact_match_rate, mean_matched_length, ci_low,
        ci_high}`` (CI: percentile bootstrap of the mean matched length, ``ctx.bootstrap_samples``,
        ``ctx.seed``); ``metrics`` ``{experiment}/dup{d}/exact_match_rate`` and
        ``{experiment}/dup{d}/mean_matched_length``.
    """
    plan, P = ctx.plan, cfg.prefix_length
    items = [i for i in range(plan.num_items) if plan.item_tokens(i).size > P + 1]
    cont = {i: min(cfg.max_new_tokens, plan.item_tokens(i).size - P) for i in items}
    items.sort(key=lambda i: -cont[i])
    info = plan_item_rows(plan)
    rows = []

    def decode(batch):
        prompts = torch.from_numpy(np.stack([plan.item_tokens(i)[:P].astype(np.int64) for i in batch]))
        return greedy_decode(ctx.model, prompts, cont[batch[0]]).numpy()

    batches = [items[b:b + ctx.batch_size] for b in range(0, len(items), ctx.batch_size)]
    for batch, generated in zip(batches, map_batches(decode, batches)):  # sharded under eval.mode=distributed
        for r, i in enumerate(batch):
            c = cont[i]
            hits = generated[r, :c] == plan.item_tokens(i)[P:P + c]
            matched = int(np.cumprod(hits).sum())
            rows.append(dict(info[i], exact_match=bool(matched == c), matched_length=matched,
                             continuation_length=c))
    rows.sort(key=lambda r: r["item_id"])
    per_dup = [{"experiment": m["experiment"], "dup_count": m["dup_count"], "n_items": m["n_items"],
                "exact_match_rate": e["mean"], "mean_matched_length": m["mean"], "ci_low": m["ci_low"],
                "ci_high": m["ci_high"]}
               for m, e in zip(per_dup_summary(rows, "matched_length", ctx.bootstrap_samples, ctx.seed),
                               per_dup_summary(rows, "exact_match", 0, ctx.seed))]
    metrics = {}
    for g in per_dup:
        key = f"{g['experiment']}/dup{g['dup_count']}"
        metrics[f"{key}/exact_match_rate"] = g["exact_match_rate"]
        metrics[f"{key}/mean_matched_length"] = g["mean_matched_length"]
    return EvalResult(metrics=metrics, per_dup=per_dup, rows=rows)
