"""Model-facing helpers shared by the evals: per-token losses of variable-length sequences, greedy decoding,
plan item labels.

Every model forward of the evals runs batch by batch through :func:`pretrain_exp.evals.shard.map_batches`, so under
``eval.mode=distributed`` the ranks score disjoint batches of the very batching one process uses (same
composition and order) and gather the results: the same numbers as ``inline``."""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from pretrain_exp.evals.shard import map_batches

logger = logging.getLogger(__name__)


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


class GreedyDecoder:
    """Greedy (argmax) continuation of equal-length prompts, ``steps`` tokens each, with the model's KV cache;
    one decoder serves any number of batches (``decoder(prompts)``).

    No stopping criteria (EOS does not end decoding), no sampling, ties broken towards the lowest token id, so it is
    deterministic for a given model; the prompt goes through the LM head at its last position only
    (``logits_to_keep=1`` where the model's ``forward`` takes it, as ``generate`` does), and there is no per-step
    host synchronization: the ids come back to the host once per batch.

    Two paths, the same ids (up to floating-point reduction order, which can flip a near-tied argmax in bf16):

    - *static* (the default on a CUDA device for models whose class declares ``_can_compile_fullgraph``,
      transformers' mark of static-cache support): one :class:`transformers.StaticCache` of ``prompt length +
      steps`` positions per ``(rows, prompt length)`` shape, reset and reused by every batch of that shape. The
      prompt is one forward (transformers' causal mask); each decode step feeds the last token alone and
      transformers derives its position and attention mask from the cache's device-side length, as
      ``generate(cache_implementation="static")`` does. On CUDA (``cuda_graphs``) the decode step of each shape is
      captured once as a :class:`torch.cuda.CUDAGraph` after one eager step on a side stream (PyTorch's capture
      recipe) and replayed for every later step and batch of that shape: a launch per token instead of a Python
      forward. A capture that fails (a model whose forward synchronizes with the host) logs a warning and leaves
      that shape eager.
    - *plain* (the default elsewhere: on the CPU the static path is no faster): a ``DynamicCache`` loop with an
      all-ones attention mask.

    :param steps: tokens to generate per prompt (``>= 1``).
    :param static: the static path (None: on a CUDA device, where the model supports it).
    :param cuda_graphs: capture the static decode step (None: on a CUDA device with the static path).
    :raises ValueError: if ``steps < 1``, or ``cuda_graphs`` is asked for off CUDA or without the static path.
    """

    def __init__(self, model: Any, steps: int, static: Optional[bool] = None, cuda_graphs: Optional[bool] = None):
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        self.model, self.steps, self.device = model, steps, model_device(model)
        params = inspect.signature(model.forward).parameters
        self._keep = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        self._cache = "cache" if "cache" in params else "past_key_values"  # transformers 5 renamed it
        on_cuda = self.device.type == "cuda"
        self.static = on_cuda and bool(getattr(model, "_can_compile_fullgraph", False)) if static is None else static
        self.cuda_graphs = (self.static and on_cuda) if cuda_graphs is None else cuda_graphs
        if self.cuda_graphs and not (self.static and on_cuda):
            raise ValueError("cuda_graphs needs the static path and a model on a CUDA device")
        self._shapes: Dict[Tuple[int, int], "_StaticShape"] = {}

    @property
    def graphed_shapes(self) -> List[Tuple[int, int]]:
        """The ``(rows, prompt length)`` shapes whose decode step runs as a captured CUDA graph."""
        return [k for k, s in self._shapes.items() if s.graph is not None]

    @torch.no_grad()
    def __call__(self, prompts: torch.Tensor) -> torch.Tensor:
        """:param prompts: int64 ``(batch, prompt_length)`` token ids, no padding.
        :returns: int64 ``(batch, steps)`` generated token ids, on the CPU."""
        ids = prompts.to(self.device)
        return (self._static if self.static else self._plain)(ids).cpu()

    def _plain(self, ids: torch.Tensor) -> torch.Tensor:
        mask = torch.ones_like(ids)
        out = self.model(input_ids=ids, attention_mask=mask, use_cache=True, **self._keep)
        generated = [out.logits[:, -1].argmax(dim=-1)]
        for _ in range(self.steps - 1):
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
            out = self.model(input_ids=generated[-1][:, None], attention_mask=mask, use_cache=True,
                             **{self._cache: getattr(out, self._cache)})
            generated.append(out.logits[:, -1].argmax(dim=-1))
        return torch.stack(generated, dim=1)

    def _step(self, s: "_StaticShape") -> None:
        """One decode step of shape ``s``: ``s.token`` (the last token) in, its argmax successor written over it."""
        logits = self.model(input_ids=s.token, use_cache=True, **{self._cache: s.cache}).logits
        s.token.copy_(logits[:, -1].argmax(dim=-1, keepdim=True))

    def _static(self, ids: torch.Tensor) -> torch.Tensor:
        from transformers import StaticCache

        rows, length = ids.shape
        s = self._shapes.get((rows, length))
        if s is None:
            s = self._shapes[(rows, length)] = _StaticShape(
                StaticCache(config=self.model.config, max_cache_len=length + self.steps),
                ids.new_zeros((rows, 1)), ids.new_zeros((rows, self.steps)))
        s.cache.reset()  # zeroes the keys, values and the length in place (no-op before the first use)
        out = self.model(input_ids=ids, use_cache=True, **{self._cache: s.cache}, **self._keep)
        s.token.copy_(out.logits[:, -1].argmax(dim=-1, keepdim=True))
        s.out[:, 0] = s.token[:, 0]
        start = 1
        if self.cuda_graphs and not s.tried and self.steps > 1:
            s.tried = True
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):  # the warm-up is decode step 1 itself
                self._step(s)
            torch.cuda.current_stream(self.device).wait_stream(side)
            s.out[:, 1] = s.token[:, 0]
            start = 2
            graph = torch.cuda.CUDAGraph()
            try:
                # thread_local: CUDA calls of other threads (a data loader, say) stay legal during the capture
                with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                    self._step(s)
            except RuntimeError as e:
                logger.warning("greedy decoding: CUDA graph capture failed for shape %s, decoding eagerly: %s",
                               (rows, length), e)
            else:
                s.graph = graph
        for t in range(start, self.steps):
            if s.graph is not None:
                s.graph.replay()
            else:
                self._step(s)
            s.out[:, t] = s.token[:, 0]
        return s.out.clone()  # s.out is the next batch's buffer


@dataclass
class _StaticShape:
    """The decode state of one ``(rows, prompt length)`` shape: its cache, the last token ``(rows, 1)`` and the
    generated ids ``(rows, steps)`` (device tensors at fixed addresses), and its captured decode step."""

    cache: Any
    token: torch.Tensor
    out: torch.Tensor
    graph: Any = None
    tried: bool = False  #: capture attempted


@torch.no_grad()
def greedy_decode(model: Any, prompts: torch.Tensor, steps: int) -> torch.Tensor:
    """Greedy (argmax) continuation of equal-length prompts: one batch through a fresh :class:`GreedyDecoder`
    (its docstring: paths, cache, ties, no stop at EOS).

    :param prompts: int64 ``(batch, prefix_length)`` token ids, no padding.
    :param steps: tokens to generate (``>= 1``).
    :returns: int64 ``(batch, steps)`` generated token ids, on the CPU.
    """
    return GreedyDecoder(model, steps)(prompts)


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
