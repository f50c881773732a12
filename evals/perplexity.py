"""Held-out perplexity: the model's loss on corpus rows it was never trained on (general ability check)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pretrain_exp.evals.base import EvalContext, EvalResult, EvalTaskConf


@dataclass
class PerplexityConf(EvalTaskConf):
    """Schema of a ``perplexity`` eval (no options)."""

    type: str = "perplexity"


def perplexity(cfg: PerplexityConf, ctx: EvalContext) -> EvalResult:
    """Token-level cross-entropy on ``ctx.held_out`` (int64 ``(n_rows, L)``), predicting positions ``1..L-1``.

    :returns: ``metrics`` ``held_out/loss`` (mean nats per predicted token, pooled over all rows),
        ``held_out/perplexity`` (``exp(loss)``), ``held_out/bits_per_token`` (``loss / ln 2``) and
        ``held_out/tokens`` (predicted tokens, ``n_rows * (L - 1)``); empty metrics when nothing is predicted.
    """
    from pretrain_exp.evals.scoring import token_losses  # torch with it: imported here

    held_out = np.asarray(ctx.held_out)
    losses = token_losses(ctx.model, list(held_out), ctx.batch_size) if held_out.size else []
    count = sum(lo.size for lo in losses)
    if count == 0:
        return EvalResult()
    loss = float(sum(lo.sum(dtype=np.float64) for lo in losses) / count)
    return EvalResult(metrics={"held_out/loss": loss, "held_out/perplexity": math.exp(loss),
                               "held_out/bits_per_token": loss / math.log(2),
                               "held_out/tokens": float(count)})
