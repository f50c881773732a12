"""Verbatim memorization: does greedy decoding from an item's prefix reproduce the item's next ``c`` tokens?

The extraction test of Carlini et al. 2023, "Quantifying Memorization Across Neural Language Models" (ICLR), with
the per-token score of Biderman et al. 2023, "Emergent and Predictable Memorization in Large Language Models"
(NeurIPS). An item's *text tokens* are its tokens without the leading and the trailing EOS that the EOS policy may
have added (``insertion.experiments.<name>.eos``). With ``k = prefix_length`` and ``c = suffix_length``:

* prompt: the item's leading EOS, if it has one (the document boundary the item followed in training; context
  only, not counted in ``k``), then its first ``k`` text tokens;
* suffix: the next ``c`` text tokens (the trailing EOS is never part of it);
* greedy decoding (argmax, no sampling, no stop at EOS; :class:`~pretrain_exp.evals.scoring.GreedyDecoder`)
  generates ``c`` tokens, compared position by position with the suffix.

Per item: ``exact_match`` (all ``c`` tokens reproduced: the suffix is *k-extractable*, Carlini et al.),
``fraction_matched`` (the share of the ``c`` positions reproduced, Biderman et al.'s memorization score) and
``matched_length`` (the leading-match length: tokens reproduced before the first miss, ``0..c``). Items with fewer
than ``k + c`` text tokens are skipped and counted (``n_skipped_short``), so every score compares the same ``k`` and
``c`` across items, dup counts and runs. Per dup count: the exact-match rate (the fraction of items whose suffix is
k-extractable) with a Wilson interval, the mean fraction matched and mean leading-match length with Student t
intervals; each dup count ``d > 0`` against the controls (Newcombe / Welch intervals, randomization p-values,
adjusted over the eval's tests at the step), and the trend of ``fraction_matched`` over ``log(1 + dup)`` is the
primary endpoint (:mod:`pretrain_exp.evals.effects`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import numpy as np

from pretrain_exp.core.errors import ConfigError
from pretrain_exp.core.stats import interval
from pretrain_exp.evals.base import EvalContext, EvalResult, EvalTaskConf
from pretrain_exp.evals.effects import EffectSpec, family_effects
from pretrain_exp.evals.shard import map_batches

if TYPE_CHECKING:  # torch comes with it: imported where used, as composing a config imports every eval module
    from pretrain_exp.evals.scoring import GreedyDecoder

#: per-item values summarized per dup count: ``(row key, per_dup / metric name, 0/1 proportion)``
VALUES = (("exact_match", "exact_match_rate", True), ("fraction_matched", "fraction_matched", False),
          ("matched_length", "mean_matched_length", False))


@dataclass
class MemorizationConf(EvalTaskConf):
    """Schema of a ``memorization`` eval.

    :raises ConfigError: if ``prefix_length``, ``suffix_length`` or a set ``max_new_tokens`` is below 1.
    """

    type: str = "memorization"
    prefix_length: int = 8  #: ``k``: text tokens of the prompt (a leading EOS is prompted as well, not counted)
    suffix_length: int = 32  #: ``c``: text tokens compared after the prefix; shorter items are skipped (counted)
    #: the older name of ``suffix_length``: when set, it is the suffix length
    max_new_tokens: Optional[int] = None

    def validate(self, key: str) -> None:
        for name in ("prefix_length", "suffix_length", "max_new_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{key}.{name}", f"must be >= 1, got {value}")

    @property
    def suffix(self) -> int:
        """``c``: ``max_new_tokens`` where set, else ``suffix_length``."""
        return self.suffix_length if self.max_new_tokens is None else self.max_new_tokens


def eos_ids(ctx: EvalContext) -> Tuple[int, ...]:
    """The EOS token id(s): the tokenizer's ``eos_token_id``, else the model config's (an int or a list);
    ``()`` if neither names one."""
    eos = getattr(ctx.tokenizer, "eos_token_id", None) if ctx.tokenizer is not None else None
    if eos is None:
        eos = getattr(getattr(ctx.model, "config", None), "eos_token_id", None)
    if eos is None:
        return ()
    return tuple(int(e) for e in eos) if isinstance(eos, (list, tuple)) else (int(eos),)


def text_span(tokens: np.ndarray, eos: Tuple[int, ...]) -> Tuple[int, int]:
    """``(start, end)`` of an item's text tokens in ``tokens`` (shape ``(n,)``): one leading and one trailing EOS
    excluded where present."""
    start = 1 if tokens.size and int(tokens[0]) in eos else 0
    end = tokens.size - 1 if tokens.size > start and int(tokens[-1]) in eos else tokens.size
    return start, end


Extraction = Dict[int, Tuple[np.ndarray, np.ndarray]]  #: item id -> (prompt, suffix) token ids


def extraction_items(plan: Any, k: int, c: int, eos: Tuple[int, ...]) -> Tuple[Extraction, List[int]]:
    """The prompt and suffix of every plan item with at least ``k + c`` text tokens (module docstring).

    :returns: ``(items, skipped)``: item id -> ``(prompt, suffix)`` (int64 arrays of shapes ``(k,)`` or
        ``(k + 1,)`` with a leading EOS, and ``(c,)``), and the ids of the items too short.
    """
    items, skipped = {}, []
    for i in range(plan.num_items):
        t = np.asarray(plan.item_tokens(i)).astype(np.int64)
        start, end = text_span(t, eos)
        if end - start < k + c:
            skipped.append(i)
        else:
            items[i] = (t[:start + k], t[start + k:start + k + c])
    return items, skipped


def greedy_continuations(ctx: EvalContext, items: Extraction, c: int,
                         decoder: Optional[GreedyDecoder] = None) -> Dict[int, np.ndarray]:
    """The ``c`` greedy tokens after each item's prompt (:class:`~pretrain_exp.evals.scoring.GreedyDecoder`, one
    decoder for all batches: on a GPU each batch shape's decode step is captured once as a CUDA graph). Items are
    sorted by ``(prompt length, id)`` and decoded ``ctx.batch_size`` at a time among items of equal prompt length (no
    padding), batch by batch through :func:`~pretrain_exp.evals.shard.map_batches` (sharded under
    ``eval.mode=distributed``). Not in larger batches on a GPU, though a decode step costs about the same for more
    rows: a bf16 model's matrix products round differently for another number of rows, which flips near-tied
    argmaxes (a random 1B-shaped bf16 model on an H100: 22 of 32 items' ids differ between 8 and 64 rows), so the
    ids are those of the same ``eval.batch_size`` on every path.

    :param items: item id -> ``(prompt, suffix)`` (:func:`extraction_items`).
    :param decoder: the decoder to use (default: a new ``GreedyDecoder(ctx.model, c)``); its ``steps`` must be ``c``.
    :returns: item id -> int64 array of shape ``(c,)``.
    :raises ValueError: if ``decoder.steps != c``.
    """
    import torch

    from pretrain_exp.evals.scoring import GreedyDecoder

    rows = ctx.batch_size
    batches: List[List[int]] = []
    for i in sorted(items, key=lambda i: (items[i][0].size, i)):  # equal prompt lengths per batch
        if batches and len(batches[-1]) < rows and items[batches[-1][0]][0].size == items[i][0].size:
            batches[-1].append(i)
        else:
            batches.append([i])
    decoder = GreedyDecoder(ctx.model, c) if decoder is None else decoder
    if decoder.steps != c:
        raise ValueError(f"the decoder generates {decoder.steps} tokens, not c = {c}")

    def decode(batch):
        return decoder(torch.from_numpy(np.stack([items[i][0] for i in batch]))).numpy()

    return {i: generated[r] for batch, generated in zip(batches, map_batches(decode, batches))
            for r, i in enumerate(batch)}


def memorization(cfg: MemorizationConf, ctx: EvalContext) -> EvalResult:
    """Greedy extraction of every item with at least ``prefix_length + suffix_length`` text tokens (module
    docstring), decoded by :func:`greedy_continuations`.

    :returns: ``rows`` ``{item_id, experiment, dup_count, exact_match, fraction_matched, matched_length,
        prefix_length, suffix_length}`` per evaluated item; ``per_dup`` per ``(experiment, dup_count)``:
        ``{experiment, dup_count, n_items, n_skipped_short, exact_match_rate, ci_low, ci_high, ci_method, small_n,
        fraction_matched, fraction_matched_ci_low/_ci_high/_ci_method, mean_matched_length,
        mean_matched_length_ci_low/_ci_high/_ci_method, prefix_length, suffix_length}`` (``ci_*``: the Wilson
        interval of the exact-match rate); ``effects``: dup ``d`` vs dup 0 of ``exact_match`` (Newcombe) and
        ``fraction_matched`` (Welch), randomization p-values adjusted together, and the trend rows (primary:
        ``fraction_matched``); ``metrics`` ``{experiment}/dup{d}/exact_match_rate`` (+ ``_ci_low``, ``_ci_high``),
        ``.../fraction_matched``, ``.../mean_matched_length`` and ``.../n_skipped_short``.
    """
    from pretrain_exp.evals.scoring import plan_item_rows

    plan, k, c = ctx.plan, cfg.prefix_length, cfg.suffix
    items, skipped = extraction_items(plan, k, c, eos_ids(ctx))
    info = plan_item_rows(plan)
    rows = []
    for i, generated in greedy_continuations(ctx, items, c).items():
        hits = generated == items[i][1]
        rows.append(dict(info[i], exact_match=bool(hits.all()), fraction_matched=float(hits.mean()),
                         matched_length=int(np.cumprod(hits).sum()), prefix_length=k, suffix_length=c))
    rows.sort(key=lambda r: r["item_id"])
    n_skipped = Counter((info[i]["experiment"], info[i]["dup_count"]) for i in skipped)
    per_dup, metrics = [], {}
    for exp, dup in sorted({(r["experiment"], r["dup_count"]) for r in info}):
        group = [r for r in rows if (r["experiment"], r["dup_count"]) == (exp, dup)]
        g: Dict[str, Any] = {"experiment": exp, "dup_count": dup, "n_items": len(group),
                             "n_skipped_short": n_skipped[(exp, dup)]}
        for key, name, proportion in VALUES:
            s = interval([float(r[key]) for r in group], proportion)
            if name == "exact_match_rate":
                g.update({name: s["mean"], "ci_low": s["ci_low"], "ci_high": s["ci_high"],
                          "ci_method": s["ci_method"], "small_n": s["small_n"]})
            else:
                g.update({name: s["mean"], f"{name}_ci_low": s["ci_low"], f"{name}_ci_high": s["ci_high"],
                          f"{name}_ci_method": s["ci_method"]})
        g.update(prefix_length=k, suffix_length=c)
        per_dup.append(g)
        key = f"{exp}/dup{dup}"
        metrics[f"{key}/n_skipped_short"] = g["n_skipped_short"]
        if group:
            metrics.update({f"{key}/exact_match_rate": g["exact_match_rate"],
                            f"{key}/exact_match_rate_ci_low": g["ci_low"],
                            f"{key}/exact_match_rate_ci_high": g["ci_high"],
                            f"{key}/fraction_matched": g["fraction_matched"],
                            f"{key}/mean_matched_length": g["mean_matched_length"]})
    effects = family_effects([EffectSpec(rows, "exact_match", proportion=True),
                              EffectSpec(rows, "fraction_matched", primary=True)], ctx, "memorization")
    return EvalResult(metrics=metrics, per_dup=per_dup, rows=rows, effects=effects)
