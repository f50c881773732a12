"""Gaussian poisoning: does the model remember the noise patterns it was trained with, versus fresh ones?

Score (the Gaussian-poisoning test of Bordt & Pawelczyk 2025, "Train Once, Answer All", arXiv:2509.23383, as in
their reference evaluation ``gaussian_privacy_score``): for a training row ``x_q`` (its tokens as trained, no
noise) let ``g_q = d Lbar(x_q) / d e`` be the gradient of the row's mean next-token loss (nats, positions
``1..L-1``) with respect to its input embeddings ``e`` (``(L, d_model)``, float32, model in eval mode). The
score of noise pattern ``xi`` on that row is

    s(q, xi) = <g_q, xi> / (sigma * ||g_q||)

Training on ``x_q + xi`` lowers ``Lbar(x_q + xi) ~ Lbar(x_q) + <g_q, xi>``, so a remembered pattern has a
negative score; a pattern the model never saw is independent of ``g_q`` and, being ``N(0, sigma^2 I)``, has
``s ~ N(0, 1)`` exactly. The reference code compares each trained pattern with freshly drawn noise; here the
fresh patterns are the experiment's dup-0 items (reproducible from the plan, never trained).

Per experiment and dup count ``d > 0``, every trained pattern ``i`` is scored on its first
``max_rows_per_item`` training rows ``R_i`` (training order) together with every control ``c`` on the same rows:

    D_i = mean_{q in R_i} [ s(q, xi_i) - mean_c s(q, xi_c) ]

``effect = mean_i D_i`` (negative = remembered) and a two-sided permutation p-value: under the null (the model is
independent of every pattern) the patterns of the group and the controls are exchangeable, so the statistic is
recomputed with the pattern labels of the pool (group + controls) permuted
(:func:`~pretrain_exp.core.stats.permutation_p_value`, ``permutations`` random relabellings). The effect equals
``mean_i own_i - mean_c ctrl_c``, where ``own_i`` is pattern ``i``'s mean score on its rows and ``ctrl_c`` control
``c``'s mean score over the same rows (weighted as the ``D_i`` weight them), so its interval is the Welch t interval
of those two groups of patterns (both the trained patterns' and the controls' variation count). The p-values of an
experiment's dup counts, over all experiments, are adjusted together (Holm by default, ``eval.p_adjust``). Per dup
count the mean score carries a Student t interval over patterns.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, List

import numpy as np

from pretrain_exp.core.errors import ConfigError
from pretrain_exp.core.stats import interval, permutation_p_value, welch_interval
from pretrain_exp.evals.base import EvalContext, EvalResult, EvalTaskConf
from pretrain_exp.evals.effects import adjust_family
from pretrain_exp.evals.shard import map_batches
from pretrain_exp.insertion.noise import make_noise

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


@dataclass
class GaussianConf(EvalTaskConf):
    """Schema of a ``gaussian`` eval.

    :raises ConfigError: for ``max_rows_per_item < 1`` or ``permutations < 1``.
    """

    type: str = "gaussian"
    max_rows_per_item: int = 4  #: training rows scored per trained pattern (its first copies in training order)
    permutations: int = 1000  #: random relabellings for the permutation p-value

    def validate(self, key: str) -> None:
        for name in ("max_rows_per_item", "permutations"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{key}.{name}", f"must be >= 1, got {getattr(self, name)}")


def embedding_gradients(model, rows: List[np.ndarray], batch_size: int) -> torch.Tensor:
    """Unit-norm gradients of each row's mean next-token loss w.r.t. its input embeddings (gradients on).

    :param rows: token ids, each an integer array of shape ``(L,)`` (equal lengths).
    :returns: float32 ``(n, L, d_model)`` on the CPU: ``g_q / ||g_q||`` (Frobenius norm over the row).
    """
    import torch  # here, not at the top: composing a config imports every eval's module for its schema
    import torch.nn.functional as F

    from pretrain_exp.evals.scoring import model_device

    emb = model.get_input_embeddings()
    device = model_device(model)

    def grads(batch: List[np.ndarray]) -> torch.Tensor:
        ids = torch.from_numpy(np.stack(batch).astype(np.int64)).to(device)
        e = emb(ids).detach().float().requires_grad_(True)
        logits = model(inputs_embeds=e.to(emb.weight.dtype), attention_mask=torch.ones_like(ids)).logits
        n, L = ids.shape
        loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                               reduction="none").view(n, L - 1).mean(dim=1)
        g = torch.autograd.grad(loss.sum(), e)[0].float()  # rows are independent: row r's grad is d loss_r / d e_r
        return (g / g.flatten(1).norm(dim=1).clamp_min(1e-30)[:, None, None]).cpu()

    # batch by batch, sharded over the ranks under eval.mode=distributed (pretrain_exp.evals.shard)
    with torch.enable_grad():
        return torch.cat(map_batches(grads, [rows[b:b + batch_size] for b in range(0, len(rows), batch_size)]))


def pattern_scores(grads: torch.Tensor, seeds: np.ndarray, sigma: float) -> np.ndarray:
    """``s(q, xi_p)`` for unit gradients ``grads`` (``(n, L, d)``) and the patterns of ``seeds`` (``(P,)``,
    :func:`~pretrain_exp.insertion.noise.make_noise`): float64 ``(n, P)``, generating one pattern at a time."""
    n, L, d = grads.shape
    flat = grads.reshape(n, -1)
    return np.stack([(flat @ make_noise(int(s), L, d, sigma).reshape(-1)).double().numpy() / sigma
                     for s in seeds], axis=1) if len(seeds) else np.empty((n, 0))


def gaussian(cfg: GaussianConf, ctx: EvalContext) -> EvalResult:
    """Trained vs fresh (dup-0) noise patterns of every ``type=gaussian`` experiment (module docstring).

    :returns: ``rows``: one per pattern, ``{item_id, experiment, dup_count, score, n_rows}`` (``score``: mean
        ``s`` over the rows it was scored on: its own training rows for a trained pattern, all scored rows of
        the experiment for a control) plus ``paired_diff`` (``D_i``) for trained patterns; ``per_dup``:
        ``{experiment, dup_count, n_items, mean_score, ci_low, ci_high, ci_method, small_n}`` for every dup count
        (Student t over patterns) and, for ``d > 0``, ``effect, effect_ci_low, effect_ci_high, effect_ci_method,
        p_value, p_method, p_adjusted, n_rows, n_controls``; ``effects``: the same effects as effect rows
        (``metric: "score"``), adjusted together with ``ctx.p_adjust``; ``metrics``: ``{experiment}/dup{d}/score``
        and, for ``d > 0``, ``{experiment}/dup{d}/effect`` (+ ``_ci_low``, ``_ci_high``), ``.../p_value`` and
        ``.../p_adjusted``.
        Experiments without controls or without trained rows (an evaluate-only run) yield nothing (logged).
    :raises ValueError: if ``ctx.row_tokens`` is missing (the training rows are needed).
    """
    plan = ctx.plan
    if not getattr(plan, "noise_sigma", None):
        return EvalResult()
    if ctx.row_tokens is None:
        raise ValueError("the gaussian eval needs the training rows (EvalContext.row_tokens)")
    metrics, per_dup, rows_out, effects = {}, [], [], []
    for exp, sigma in sorted(plan.noise_sigma.items()):
        e = plan.experiments.index(exp)
        items = np.flatnonzero(plan.item_experiment == e)
        dups = plan.item_dup_count[items]
        controls, trained = items[dups == 0], items[dups > 0]
        owner, qs = [], []
        for i in trained:
            for q in plan.noise_rows[plan.noise_item_ids == i][:cfg.max_rows_per_item]:
                owner.append(int(i)), qs.append(int(q))
        if controls.size == 0 or not qs:
            log.warning("gaussian: experiment %r has %d controls and %d trained rows; nothing to compare", exp,
                        controls.size, len(qs))
            continue
        pool = np.concatenate([trained, controls])
        col = {int(i): k for k, i in enumerate(pool)}
        grads = embedding_gradients(ctx.model, [np.asarray(ctx.row_tokens(q)) for q in qs], ctx.batch_size)
        S = pattern_scores(grads, plan.item_noise_seed[pool], sigma)  # (n_rows, n_patterns)
        ctrl_cols = np.arange(trained.size, pool.size)
        for c in controls:
            rows_out.append({"item_id": int(c), "experiment": exp, "dup_count": 0,
                             "score": float(S[:, col[int(c)]].mean()), "n_rows": len(qs)})
        ctrl = interval([r["score"] for r in rows_out[-controls.size:]])
        per_dup.append({"experiment": exp, "dup_count": 0, "n_items": int(controls.size), "mean_score": ctrl["mean"],
                        "ci_low": ctrl["ci_low"], "ci_high": ctrl["ci_high"], "ci_method": ctrl["ci_method"],
                        "small_n": ctrl["small_n"]})
        metrics[f"{exp}/dup0/score"] = ctrl["mean"]
        for d in sorted(set(plan.item_dup_count[trained].tolist())):
            group = trained[plan.item_dup_count[trained] == d]
            sel = np.flatnonzero(np.isin(np.array(owner), group))
            k_of_row = np.searchsorted(group, np.array(owner)[sel])  # group is sorted (item ids ascending)
            sub = np.concatenate([[col[int(i)] for i in group], ctrl_cols]).astype(np.int64)  # group, controls
            Ssel, counts = S[sel], np.bincount(k_of_row, minlength=group.size)

            def paired(perm, Ssel=Ssel, sub=sub, k_of_row=k_of_row, counts=counts, n=group.size):
                cols = sub[perm]
                diff = Ssel[np.arange(k_of_row.size), cols[k_of_row]] - Ssel[:, cols[n:]].mean(axis=1)
                return np.bincount(k_of_row, diff, minlength=n) / counts

            diffs = paired(np.arange(sub.size))
            effect, p = permutation_p_value(lambda perm: paired(perm).mean(), sub.size, cfg.permutations, ctx.seed)
            own = np.bincount(k_of_row, Ssel[np.arange(k_of_row.size), sub[k_of_row]], minlength=group.size) / counts
            # each control's score over the group's rows, weighted as D_i weights them: effect = mean(own) - mean(this)
            ctrl_on_rows = np.stack([np.bincount(k_of_row, Ssel[:, c], minlength=group.size) / counts
                                     for c in ctrl_cols], axis=1).mean(axis=0)
            _, elow, ehigh, emethod = welch_interval(own, ctrl_on_rows)
            for k, i in enumerate(group):
                rows_out.append({"item_id": int(i), "experiment": exp, "dup_count": int(d), "score": float(own[k]),
                                 "paired_diff": float(diffs[k]), "n_rows": int(counts[k])})
            g = interval(own)
            per_dup.append({"experiment": exp, "dup_count": int(d), "n_items": int(group.size),
                            "mean_score": g["mean"], "ci_low": g["ci_low"], "ci_high": g["ci_high"],
                            "ci_method": g["ci_method"], "small_n": g["small_n"], "effect": effect,
                            "effect_ci_low": elow, "effect_ci_high": ehigh, "effect_ci_method": emethod,
                            "p_value": p, "p_method": f"randomization ({cfg.permutations:,})",
                            "n_rows": int(sel.size), "n_controls": int(controls.size)})
            effects.append({"experiment": exp, "dup_count": int(d), "contrast": f"dup {d} vs 0", "primary": False,
                            "metric": "score", "effect": effect, "effect_ci_low": elow, "effect_ci_high": ehigh,
                            "effect_ci_method": emethod, "p_value": p, "p_method": per_dup[-1]["p_method"],
                            "n_treated": int(group.size), "n_control": int(controls.size)})
            metrics |= {f"{exp}/dup{d}/score": g["mean"], f"{exp}/dup{d}/effect": effect,
                        f"{exp}/dup{d}/effect_ci_low": elow, f"{exp}/dup{d}/effect_ci_high": ehigh,
                        f"{exp}/dup{d}/p_value": p}
    adjust_family(effects, ctx, "gaussian")
    for e in effects:
        row = next(r for r in per_dup if (r["experiment"], r["dup_count"]) == (e["experiment"], e["dup_count"]))
        row["p_adjusted"] = e["p_adjusted"]
        metrics[f"{e['experiment']}/dup{e['dup_count']}/p_adjusted"] = e["p_adjusted"]
    return EvalResult(metrics=metrics, per_dup=per_dup, rows=rows_out, effects=effects)
