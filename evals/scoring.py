"""Model-facing helpers shared by the evals: per-token losses of variable-length sequences, greedy decoding,
plan item labels.

Every model forward of the evals runs batch by batch through :func:`pretrain_exp.evals.shard.map_batches`, so under
``eval.mode=distributed`` the ranks score disjoint batches of the very batching one process uses (same
composition and order) and gather the results: the same numbers as ``inline``."""

from __future__ import annotations

import inspect
from typing import Any, List, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from pretrain_exp.evals.shard import map_batches


def model_device(model: Any) -> torch.device:
    """The device of the model's (first) parameters; inputs are moved there."""
    return next(model.parameters()).device


def plan_item_rows(plan: Any) -> List[dict]:
    """The identifying columns of every plan item: ``{item_id, experiment, dup_count}`` (dup 0 = control)."""
    return [{"item_id": i, "experiment": plan.experiments[int(plan.item_experiment[i])],
             "dup_count": int(plan.item_dup_count[i])} for i in range(plan.num_items)]


def _length_batches(seqs: List[np.ndarray], batch_size: int, min_length: int) -> List[List[int]]:
    """Indices into ``seqs`` per batch of ``batch_size``, longest first; sequences shorter than ``min_length`` are
    skipped (the batches :func:`_forward` scores, identical in one process and under
    :func:`~pretrain_exp.evals.shard.sharded`)."""
    order = [i for i in sorted(range(len(seqs)), key=lambda i: -seqs[i].size) if seqs[i].size >= min_length]
    return [order[b:b + batch_size] for b in range(0, len(order), batch_size)]


def _forward(model: Any, seqs: List[np.ndarray], idx: List[int]):
    """Forward the sequences ``idx`` (int64 arrays, longest first) right-padded as one batch. Returns ``(ids
    (b, width) on the model's device, logits (b, width, vocab))``; only the logits of real (unpadded) positions are
    meaningful.

    No ``attention_mask``: under causal attention a real token never sees the padding to its right, and the
    positions of real tokens are ``0..n-1`` either way, so their logits are those of the unpadded sequence (and
    the model takes its plain causal path, as lm-eval's ``HFLM`` scores)."""
    width = seqs[idx[0]].size
    ids = torch.zeros((len(idx), width), dtype=torch.long)
    for r, i in enumerate(idx):
        ids[r, :seqs[i].size] = torch.from_numpy(seqs[i])
    ids = ids.to(model_device(model))
    return ids, model(input_ids=ids).logits


@torch.no_grad()
def token_losses(model: Any, sequences: Sequence[np.ndarray], batch_size: int) -> List[np.ndarray]:
    """Per-token cross-entropy of each sequence under a causal LM (teacher forcing).

    Sequences are sorted by length, batched ``batch_size`` at a time with right padding (causal attention means
    real tokens never see the padding, so no ``attention_mask``), and scored with ``model(input_ids=...).logits``.
    The loss is taken one row at a time on float32 logits, so no full-vocabulary log-softmax of the whole batch is
    materialized beyond the model's logits.

    :param sequences: token ids, each an integer array of shape ``(n_i,)``.
    :returns: for each sequence (input order) a float32 array of shape ``(max(n_i - 1, 0),)``: entry ``t`` is
        ``-ln p(x[t + 1] | x[:t + 1])`` in nats (the first token is context only).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    seqs = [np.asarray(s, dtype=np.int64) for s in sequences]
    out: List[np.ndarray] = [np.empty(0, np.float32) for _ in seqs]

    def score(idx: List[int]) -> List[np.ndarray]:
        ids, logits = _forward(model, seqs, idx)
        return [F.cross_entropy(logits[r, :seqs[i].size - 1].float(), ids[r, 1:seqs[i].size], reduction="none")
                .cpu().numpy().astype(np.float32) for r, i in enumerate(idx)]

    batches = _length_batches(seqs, batch_size, min_length=2)
    for idx, losses in zip(batches, map_batches(score, batches)):
        for i, loss in zip(idx, losses):
            out[i] = loss
    return out


@torch.no_grad()
def greedy_decode(model: Any, prompts: torch.Tensor, steps: int) -> torch.Tensor:
    """Greedy (argmax) continuation of equal-length prompts, with the model's KV cache.

    The prompt goes through the LM head at its last position only (``logits_to_keep=1`` where the model's
    ``forward`` takes it, as ``generate`` does). A plain loop rather than ``model.generate``: no stopping
    criteria (EOS does not end decoding), no sampling, ties broken towards the lowest token id, so it is
    deterministic for a given model.

    :param prompts: int64 ``(batch, prefix_length)`` token ids, no padding.
    :param steps: tokens to generate (``>= 1``).
    :returns: int64 ``(batch, steps)`` generated token ids, on the CPU.
    """
    device = model_device(model)
    ids = prompts.to(device)
    mask = torch.ones_like(ids)
    # the prompt's last position only through the LM head, as ``generate`` does (``logits_to_keep``, where the
    # model takes it): the other prompt positions' logits are never read
    params = inspect.signature(model.forward).parameters
    keep = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
    cache = "cache" if "cache" in params else "past_key_values"  # transformers 5 renamed it (the old name warns)
    out = model(input_ids=ids, attention_mask=mask, use_cache=True, **keep)
    generated = [out.logits[:, -1].argmax(dim=-1)]
    for _ in range(steps - 1):
        mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
        out = model(input_ids=generated[-1][:, None], attention_mask=mask, use_cache=True,
                    **{cache: getattr(out, cache)})
        generated.append(out.logits[:, -1].argmax(dim=-1))
    return torch.stack(generated, dim=1).cpu()


@torch.no_grad()
def continuation_scores(model: Any, contexts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]],
                        batch_size: int) -> List[tuple]:
    """Log-probabilities of each continuation after its context, and whether greedy decoding from the context
    would produce it (teacher forcing, one forward pass per batch).

    ``context + continuation`` is scored like :func:`token_losses` (length-sorted batches, right padding,
    float32 log-softmax one row at a time). Greedy decoding from the context starts with the
    continuation exactly when, at every continuation position, the argmax of the logits given the context and
    the continuation so far is the next continuation token; so ``greedy`` is that argmax test, with ties
    broken towards the lowest token id as in :func:`greedy_decode`.

    :param contexts: token ids per pair, each non-empty; :param continuations: token ids per pair, non-empty.
    :returns: per pair (input order) ``(logprobs, greedy)``: float32 ``(len(continuation),)`` of
        ``ln p(c_k | context, c_<k)`` in nats, and a bool.
    :raises ValueError: for an empty context or continuation, or ``batch_size < 1``.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if any(len(c) == 0 for c in contexts) or any(len(c) == 0 for c in continuations):
        raise ValueError("contexts and continuations must be non-empty")
    seqs = [np.concatenate([np.asarray(a, np.int64), np.asarray(b, np.int64)]) for a, b in zip(contexts, continuations)]
    out: List[tuple] = [None] * len(seqs)  # type: ignore[list-item]

    def score(idx: List[int]) -> List[tuple]:
        ids, logits = _forward(model, seqs, idx)
        res = []
        for r, i in enumerate(idx):
            n, k = seqs[i].size, len(continuations[i])
            pred = logits[r, n - k - 1:n - 1].float()  # the logits that predict the continuation tokens
            target = ids[r, n - k:n]
            logp = torch.log_softmax(pred, dim=-1).gather(1, target[:, None])[:, 0]
            res.append((logp.cpu().numpy().astype(np.float32), bool((pred.argmax(dim=-1) == target).all())))
        return res

    batches = _length_batches(seqs, batch_size, min_length=1)
    for idx, scores in zip(batches, map_batches(score, batches)):
        for i, sc in zip(idx, scores):
            out[i] = sc
    return out
