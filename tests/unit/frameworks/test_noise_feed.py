"""The one noise feed: rows given to start() are handed to EmbeddingNoise micro-batch by micro-batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pretrain_exp.frameworks.noise_feed import NoiseFeed
from pretrain_exp.insertion.noise import NoiseSpec, make_noise

L, D = 5, 3


def feed_for(rows) -> NoiseFeed:
    spec = NoiseSpec(np.asarray(rows, np.int64), np.arange(len(rows), dtype=np.int64) + 11,
                     np.full(len(rows), 0.5))
    return NoiseFeed(spec)


def test_micro_batches_take_consecutive_rows_and_only_planned_rows_change():
    emb = torch.nn.Embedding(10, D)
    feed = feed_for([3, 6])
    feed.attach(emb)
    ids = torch.zeros((2, L), dtype=torch.long)
    clean = emb(ids).detach()
    feed.start(np.array([2, 3, 6, 7]))  # a rank batch of 4 rows, micro-batches of 2
    first, second = emb(ids).detach(), emb(ids).detach()
    assert torch.equal(first[0], clean[0]) and torch.equal(second[1], clean[1])
    torch.testing.assert_close(first[1] - clean[1], make_noise(11, L, D, 0.5), rtol=0, atol=1e-6)
    torch.testing.assert_close(second[0] - clean[0], make_noise(12, L, D, 0.5), rtol=0, atol=1e-6)
    with pytest.raises(RuntimeError, match="only 0 of the 4 rows"):
        emb(ids)
    feed.stop()
    assert torch.equal(emb(ids), clean)  # outside start/stop: no noise
    feed.detach()
    feed.start([3, 6])
    assert torch.equal(emb(ids), clean)  # hooks removed


def test_no_feed_without_noised_rows():
    assert NoiseFeed.for_plan(None) is None
