"""Membership inference: can a per-item score tell inserted items (members) from never-inserted controls?

Three reference-free scores per plan item, all oriented so that higher = "more likely a member", computed from
the per-token losses ``l_t = -ln p(x[t+1] | x[:t+1])`` (nats) over the item's ``n`` predicted tokens (positions
``1..len-1``, as in the insertion-loss eval):

* ``loss`` = ``-mean(l)``: the loss attack (Yeom et al. 2018, "Privacy Risk in Machine Learning"; the
  perplexity metric of Carlini et al. 2021).
* ``zlib`` = ``-mean(l) / zlib_bytes``: Carlini et al. 2021, "Extracting Training Data from Large Language
  Models" (USENIX Security), ratio of the log-perplexity ``ln(ppl) = mean(l)`` to the zlib entropy
  ``zlib_bytes = len(zlib.compress(text))`` (bytes, default level). Their reference code ranks by
  ``zlib_bytes / ln(ppl)`` (descending); ``-ln(ppl) / zlib_bytes = -1 / that`` ranks identically whenever
  ``ln(ppl) > 0`` and stays finite as ``ln(ppl) -> 0``. ``text`` is the item decoded with
  ``ctx.tokenizer.decode(tokens, skip_special_tokens=True)`` (UTF-8), or without a tokenizer the
  little-endian int32 bytes of the tokens.
* ``min_k`` = mean of ``-l_t`` over the ``k = max(1, floor(n * min_k_percent / 100))`` tokens with the
  largest ``l_t`` (lowest probability): Min-K% Prob, Shi et al. 2024, "Detecting Pretraining Data from Large
  Language Models" (ICLR). ``min_k_percent = 100`` gives the ``loss`` score.

Per experiment, each dup count ``d > 0`` (members) is compared with the experiment's dup-0 controls
(non-members) by the ROC AUC of each score, with Newcombe's score interval built on the Hanley-McNeil variance
(:func:`~pretrain_exp.core.stats.auc_interval`; it stays inside ``[0, 1]`` and does not collapse to ``[1, 1]``
under perfect separation) and a randomization p-value of ``AUC = 0.5`` (the Mann-Whitney test, exact where the
relabellings can be enumerated; :func:`~pretrain_exp.evals.effects.auc_randomization_test`). Every dup count and
every score of an experiment is compared with the *same* controls, so its AUCs are correlated; their p-values are
adjusted together, over experiments x dup counts x scores (Holm by default, ``eval.p_adjust``; valid under any
dependence).
"""

from __future__ import annotations

import logging
import zlib
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Dict, Optional

import numpy as np

from pretrain_exp.core.errors import ConfigError
from pretrain_exp.core.stats import MIN_ITEMS_PER_GROUP
from pretrain_exp.evals.base import EvalContext, EvalResult, EvalTaskConf
from pretrain_exp.evals.effects import adjust_family, auc_effect

log = logging.getLogger(__name__)

SCORES = ("loss", "zlib", "min_k")


@dataclass
class MiaConf(EvalTaskConf):
    """Schema of a ``mia`` eval.

    :raises ConfigError: if ``min_k_percent`` is not in ``(0, 100]``.
    """

    type: str = "mia"
    min_k_percent: float = 20.0  #: Min-K% Prob: share of lowest-probability tokens averaged (Shi et al.: 20)

    def validate(self, key: str) -> None:
        if not 0.0 < self.min_k_percent <= 100.0:
            raise ConfigError(f"{key}.min_k_percent", f"must be in (0, 100], got {self.min_k_percent}")


def item_bytes(tokens: np.ndarray, tokenizer: Optional[Any]) -> bytes:
    """The bytes whose zlib-compressed length is an item's zlib entropy.

    :param tokens: token ids, shape ``(length,)``.
    :returns: ``tokenizer.decode(tokens, skip_special_tokens=True)`` as UTF-8, or with ``tokenizer=None`` the
        tokens as little-endian int32 (4 bytes per token).
    """
    if tokenizer is not None:
        return tokenizer.decode(np.asarray(tokens).tolist(), skip_special_tokens=True).encode("utf-8")
    return np.asarray(tokens).astype("<i4").tobytes()


def membership_scores(losses: np.ndarray, text: bytes, min_k_percent: float) -> Dict[str, float]:
    """The ``loss``, ``zlib`` and ``min_k`` scores of one item (definitions in the module docstring).

    :param losses: per-token losses in nats, shape ``(n,)``, ``n >= 1`` (from :func:`token_losses`).
    :param text: the item's bytes for the zlib entropy (see :func:`item_bytes`).
    :param min_k_percent: Min-K% share, in ``(0, 100]``.
    :returns: ``{"loss": nats/token, "zlib": nats/token per compressed byte, "min_k": nats/token}``, each
        higher for items the model finds more likely (members).
    """
    lo = np.asarray(losses, dtype=np.float64)
    mean = float(lo.mean())
    k = max(1, int(lo.size * min_k_percent / 100.0))
    return {"loss": -mean, "zlib": -mean / len(zlib.compress(text)),
            "min_k": -float(np.sort(lo)[lo.size - k:].mean())}


def roc_auc(members: np.ndarray, nonmembers: np.ndarray) -> np.ndarray:
    """ROC AUC of scores where higher = member, as the Mann-Whitney U statistic over ``n1 * n0``.

    ``AUC = P(member score > non-member score) + P(tie) / 2`` over all member/non-member pairs: ``U`` is the
    members' rank sum (average ranks, so a tie counts 1/2) minus ``n1 (n1 + 1) / 2`` (Mann & Whitney 1947;
    Hanley & McNeil 1982, "The meaning and use of the area under a ROC curve").

    :param members: scores, shape ``(..., n1)``; :param nonmembers: shape ``(..., n0)``, same leading shape,
        ``n1, n0 >= 1``.
    :returns: AUC in ``[0, 1]``, shape ``(...)`` (a 0-d array for 1-d inputs); 0.5 = chance.
    """
    from scipy.stats import rankdata  # here, not at import: the CLI imports this module to register its schema

    m, o = np.asarray(members, dtype=np.float64), np.asarray(nonmembers, dtype=np.float64)
    n1, n0 = m.shape[-1], o.shape[-1]
    ranks = rankdata(np.concatenate([m, o], axis=-1), axis=-1)
    return (ranks[..., :n1].sum(axis=-1) - n1 * (n1 + 1) / 2.0) / (n1 * n0)


def mia(cfg: MiaConf, ctx: EvalContext) -> EvalResult:
    """Membership scores of every plan item and their AUCs, members (dup ``d > 0``) vs dup-0 controls.

    :returns: ``rows``: one per item with at least 2 tokens, ``{item_id, experiment, dup_count, loss, zlib,
        min_k}``; ``per_dup``: per experiment with controls, dup count ``d > 0`` and score, ``{experiment,
        dup_count, score, n_items, n_members, n_nonmembers, auc, ci_low, ci_high, ci_method, small_n, p_value,
        p_adjusted}`` (``n_items = n_members``; ``small_n`` when either group has fewer than
        :data:`~pretrain_exp.core.stats.MIN_ITEMS_PER_GROUP` items; the interval and test as in the module
        docstring); ``effects``: the same comparisons as effect rows (``effect`` = the AUC, ``null`` = 0.5,
        ``metric`` = ``"{score}_auc"``, ``score``), p-values adjusted over all of them with ``ctx.p_adjust``
        (``ctx.permutations`` relabellings where the test is not exact, ``ctx.seed``); ``metrics``:
        ``{experiment}/dup{d}/{score}_auc`` with ``_ci_low`` and ``_ci_high``. An experiment without dup-0 items
        yields no AUCs (logged).
    """
    from pretrain_exp.evals.scoring import plan_item_rows, token_losses  # torch with it: imported here

    plan = ctx.plan
    tokens = [plan.item_tokens(i) for i in range(plan.num_items)]
    losses = token_losses(ctx.model, tokens, ctx.batch_size)
    rows = [dict(r, **membership_scores(lo, item_bytes(t, ctx.tokenizer), cfg.min_k_percent))
            for r, t, lo in zip(plan_item_rows(plan), tokens, losses) if lo.size]
    groups = defaultdict(list)
    for r in rows:
        groups[(r["experiment"], r["dup_count"])].append(r)
    effects = []
    for exp in sorted({e for e, _ in groups}):
        dups = sorted(d for e, d in groups if e == exp and d > 0)
        controls = groups.get((exp, 0))
        if not controls:
            log.warning("mia: experiment %r has no dup-0 controls; no AUC for its dup counts %s", exp, dups)
            continue
        for d in dups:
            members = groups[(exp, d)]
            for score in SCORES:
                effects.append({"experiment": exp, "dup_count": d, "contrast": f"dup {d} vs 0", "primary": False,
                                "metric": f"{score}_auc", "score": score,
                                **auc_effect([r[score] for r in members], [r[score] for r in controls],
                                             ctx.permutations, ctx.seed)})
    adjust_family(effects, ctx, "mia")
    per_dup, metrics = [], {}
    for e in effects:
        n1, n0 = e["n_treated"], e["n_control"]
        per_dup.append({"experiment": e["experiment"], "dup_count": e["dup_count"], "score": e["score"],
                        "n_items": n1, "n_members": n1, "n_nonmembers": n0, "auc": e["effect"],
                        "ci_low": e["effect_ci_low"], "ci_high": e["effect_ci_high"],
                        "ci_method": e["effect_ci_method"], "small_n": bool(min(n1, n0) < MIN_ITEMS_PER_GROUP),
                        "p_value": e["p_value"], "p_adjusted": e["p_adjusted"]})
        key = f"{e['experiment']}/dup{e['dup_count']}/{e['score']}_auc"
        metrics.update({key: e["effect"], f"{key}_ci_low": e["effect_ci_low"], f"{key}_ci_high": e["effect_ci_high"]})
    return EvalResult(metrics=metrics, per_dup=per_dup, rows=rows, effects=effects)
