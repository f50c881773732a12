"""OLMo-core's global-indices file comes from the project's permutation cache (one shuffle per (N, seed, epoch)):
the file :func:`share_global_indices` puts into a work dir equals OLMo-core's own ``_build_global_indices`` array,
byte for byte, OLMo-core's loader then uses it without shuffling again, and the rows it hands out are the ones it
builds on its own. If OLMo-core renames its private members (``_epoch``, ``_global_indices_file``,
``_build_global_indices``) or its file name, these tests fail first."""

from __future__ import annotations

import os

import numpy as np
import olmo_core.data as olmo_data
import pytest

from pretrain_exp.data.order import permutation_path
from pretrain_exp.frameworks.olmo_core.global_indices import global_indices_file, share_global_indices
from tests.unit.frameworks.olmo_core.test_order import corpus  # noqa: F401  (the fixture)
from tests.unit.frameworks.olmo_core.test_order import SEED, B, L, olmo_dataset, olmo_loader_single


def _batches(loader, epoch):
    loader.reshuffle(epoch=epoch)
    out = [b["input_ids"].numpy().copy() for b in loader]
    loader.reset()
    return out


@pytest.mark.parametrize("epoch", [1, 2])
def test_the_linked_cache_is_olmo_cores_order_and_is_not_rebuilt(corpus, tmp_path, monkeypatch, epoch):  # noqa: F811
    paths, _, _, vocab = corpus
    own = olmo_loader_single(paths, vocab, tmp_path / "own")
    own._epoch = epoch
    expected = own._build_global_indices()
    assert expected.dtype == np.uint32 and expected.size == 210

    loader = olmo_loader_single(paths, vocab, tmp_path / "work")
    cache = tmp_path / "cache"
    path = share_global_indices(loader, cache, epoch)
    assert path == global_indices_file(loader, epoch) and loader._epoch is None  # the loader's epoch untouched
    assert path.name == f"global_indices_dataset_size210_epoch{epoch}_seed{SEED}_v1.npy"
    cached = permutation_path(cache, 210, SEED + epoch)
    assert os.path.samefile(path, cached)  # a hard link to the cluster's one copy
    assert np.array_equal(np.fromfile(path, dtype="<u4"), expected)
    assert share_global_indices(loader, cache, epoch) == path  # idempotent

    def no_shuffle(self):
        raise AssertionError("OLMo-core shuffled again")

    monkeypatch.setattr(type(loader), "_build_global_indices", no_shuffle)
    got = _batches(loader, epoch)
    monkeypatch.undo()
    want = _batches(olmo_loader_single(paths, vocab, tmp_path / "own2"), epoch)
    assert len(got) == 210 // B and all(np.array_equal(a, b) for a, b in zip(got, want))


def test_a_copy_where_links_fail_and_chunked_orders(corpus, tmp_path, monkeypatch):  # noqa: F811
    paths, _, _, vocab = corpus
    loader = olmo_loader_single(paths, vocab, tmp_path / "work")
    monkeypatch.setattr(os, "link", lambda *a: (_ for _ in ()).throw(OSError("cross-device link")))
    path = share_global_indices(loader, tmp_path / "cache", 1)
    assert not os.path.samefile(path, permutation_path(tmp_path / "cache", 210, SEED + 1))
    loader._epoch = 1
    assert np.array_equal(np.fromfile(path, dtype="<u4"), loader._build_global_indices())
    assert share_global_indices(loader, None, 1) is None  # no cache: OLMo-core builds its own

    chunked = olmo_data.NumpyDataLoaderConfig(global_batch_size=B * L, seed=SEED, work_dir=str(tmp_path / "c")).build(
        olmo_dataset(paths, vocab, tmp_path / "c"))
    chunked.chunk_size = 4  # as max_target_sequence_length = 4 L makes it
    path = share_global_indices(chunked, tmp_path / "cache", 1)
    assert "_chunk4_" in path.name
    chunked._epoch = 1
    assert np.array_equal(np.fromfile(path, dtype="<u4"), chunked._build_global_indices().astype(np.uint32))
