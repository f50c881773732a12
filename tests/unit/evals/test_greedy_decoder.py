"""Greedy decoding of the ``memorization`` eval: the static-cache :class:`GreedyDecoder` (the path whose decode step
is captured as a CUDA graph on a GPU, run eagerly here) against transformers' own greedy search and the plain
``DynamicCache`` loop, on a tiny real Llama model, for batches of any shape and batch sizes that do not divide the
item count."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import GenerationConfig

import pretrain_exp.evals.memorization  # noqa: F401  (registration)
from pretrain_exp.evals.base import EvalContext
from pretrain_exp.evals.memorization import (
    MemorizationConf,
    eos_ids,
    extraction_items,
    greedy_continuations,
    memorization,
)
from pretrain_exp.evals.scoring import GreedyDecoder, greedy_decode
from tests.conftest import EOS, VOCAB, make_plan, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def hf_greedy(model, prompts: torch.Tensor, steps: int) -> torch.Tensor:
    """transformers' greedy search (``generate(do_sample=False)``), EOS not stopping it: ``(rows, steps)``."""
    cfg = GenerationConfig(do_sample=False, max_new_tokens=steps, eos_token_id=[], pad_token_id=EOS)
    out = model.generate(prompts, attention_mask=torch.ones_like(prompts), generation_config=cfg)
    return out[:, prompts.shape[1]:].cpu()


def ctx_for(model, plan, batch_size) -> EvalContext:
    return EvalContext(model=model, tokenizer=None, plan=plan, held_out=np.empty((0, 8), np.int64), step=0,
                       batch_size=batch_size, seed=1234)


def test_static_decoder_matches_generate_and_the_plain_loop():
    model = tiny_model(3)
    decoder, plain = GreedyDecoder(model, 12, static=True), GreedyDecoder(model, 12)
    assert decoder.static and not decoder.cuda_graphs and not plain.static  # the CPU default: the plain loop
    gen = torch.Generator().manual_seed(0)
    # shapes repeat (a shape's cache is reset and reused) and change (rows, prompt length)
    shapes = [(4, 5), (4, 5), (3, 5), (4, 6), (1, 1), (4, 5)]
    prompts = [torch.randint(0, VOCAB, s, generator=gen) for s in shapes]
    got = [decoder(p) for p in prompts]
    for p, g in zip(prompts, got):  # earlier results are not overwritten by later batches of their shape
        want = hf_greedy(model, p, 12)
        assert g.dtype == torch.long and g.device.type == "cpu" and g.shape == (p.shape[0], 12)
        assert torch.equal(g, want) and torch.equal(plain(p), want) and torch.equal(greedy_decode(model, p, 12), want)
    assert decoder.graphed_shapes == []
    one = GreedyDecoder(model, 1, static=True)
    assert torch.equal(one(prompts[0]), hf_greedy(model, prompts[0], 1))


def test_decoder_rejects_bad_arguments():
    model = tiny_model(3)
    with pytest.raises(ValueError, match="steps"):
        GreedyDecoder(model, 0)
    with pytest.raises(ValueError, match="cuda_graphs"):
        GreedyDecoder(model, 4, cuda_graphs=True)  # the model is on the CPU
    plan = _plan()
    with pytest.raises(ValueError, match="c = 7"):
        greedy_continuations(ctx_for(model, plan, 2), extraction_items(plan, 3, 7, (EOS,))[0], 7,
                             GreedyDecoder(model, 6))


def _plan():
    """Nine items of three prompt shapes: leading EOS + text (prompt k + 1), text alone (prompt k), too short."""
    gen = np.random.default_rng(7)
    items = []
    for n in range(9):
        text = gen.integers(1, VOCAB, 14 if n != 4 else 6).tolist()
        tokens = [EOS] + text + [EOS] if n % 3 else text
        items.append((tokens, n % 3, 0))
    return make_plan(items)


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("batch_size", [1, 2, 4, 5, 9, 64])
def test_greedy_continuations_any_batch_size(batch_size, static):
    """Batch sizes that do not divide the item count (or exceed it) give every item transformers' greedy tokens, on
    the plain path (the CPU's) and on the static one (CUDA's, here without graphs)."""
    model, plan, k, c = tiny_model(4), _plan(), 3, 7
    ctx = ctx_for(model, plan, batch_size)
    items, skipped = extraction_items(plan, k, c, eos_ids(ctx))
    assert skipped == [4] and len(items) == 8 and {p.size for p, _ in items.values()} == {k, k + 1}
    got = greedy_continuations(ctx, items, c, GreedyDecoder(model, c, static=static))
    assert sorted(got) == sorted(items)
    for i, (prompt, _) in items.items():
        want = hf_greedy(model, torch.from_numpy(prompt)[None], c)[0].numpy()
        assert got[i].dtype == np.int64 and np.array_equal(got[i], want), i


def test_memorization_rows_do_not_depend_on_the_batch_size():
    model, plan = tiny_model(4), _plan()
    conf = MemorizationConf(prefix_length=3, suffix_length=7)
    rows = [memorization(conf, ctx_for(model, plan, b)).rows for b in (1, 3, 8)]
    assert rows[0] == rows[1] == rows[2] and [r["item_id"] for r in rows[0]] == [0, 1, 2, 3, 5, 6, 7, 8]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_decoding_matches_eager_decoding():
    model = tiny_model(3).cuda()
    graphs, eager = GreedyDecoder(model, 10), GreedyDecoder(model, 10, cuda_graphs=False)
    assert graphs.cuda_graphs and graphs.static
    gen = torch.Generator().manual_seed(0)
    for shape in [(5, 4), (5, 4), (2, 4), (5, 5)]:
        p = torch.randint(0, VOCAB, shape, generator=gen)
        want = hf_greedy(model, p.cuda(), 10)
        assert torch.equal(graphs(p), want) and torch.equal(eager(p), want)
    assert sorted(graphs.graphed_shapes) == [(2, 4), (5, 4), (5, 5)]
    model, plan = tiny_model(4).cuda(), _plan()
    items = extraction_items(plan, 3, 7, (EOS,))[0]
    got = greedy_continuations(ctx_for(model, plan, 3), items, 7)
    for i, (prompt, _) in items.items():
        assert np.array_equal(got[i], hf_greedy(model, torch.from_numpy(prompt)[None].cuda(), 7)[0].numpy())
