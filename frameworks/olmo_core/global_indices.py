"""OLMo-core's global-indices file from the project's permutation cache: one shuffle per (N, seed, epoch).

OLMo-core's ``NumpyFSLDataLoader`` keeps epoch ``e``'s order as a raw ``uint32`` file
``<work dir>/global_indices_dataset_size<N>_epoch<e>_seed<s>[_chunk<c>]_v1.npy``: ``arange(N)`` shuffled by
``PCG64(s + e)`` (with ``chunk`` c > 1: the chunk ids ``arange(N // c)`` shuffled, each expanded to its c
instances). With chunk 1 that is byte for byte the project's cached permutation
(:func:`~pretrain_exp.data.order.cached_permutation`, ``<cache>/permutations/<N>-<s + e>.npy``), so the run's work
dir gets a hard link to it (a verified copy where the filesystem has no links) instead of OLMo-core shuffling
again; with chunk c > 1 the file is expanded from the cached chunk permutation. The verifier's loader
(:meth:`OlmoCoreFramework.peek_rows <pretrain_exp.frameworks.olmo_core.framework.OlmoCoreFramework.peek_rows>`)
then memory-maps that file too. The loader's private members (its epoch and global-indices file) are reached
through :mod:`~pretrain_exp.frameworks.olmo_core.upstream`; tests/unit/frameworks/olmo_core/test_global_indices.py
compares the file with OLMo-core's own ``_build_global_indices``.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path
from typing import Optional

import numpy as np

from pretrain_exp.core.errors import DataError
from pretrain_exp.core.io import atomic_path
from pretrain_exp.data.order import cached_permutation, permutation_path
from pretrain_exp.frameworks.olmo_core import upstream

log = logging.getLogger(__name__)


def global_indices_file(loader, epoch: int) -> Path:
    """OLMo-core's global-indices file of ``loader`` for ``epoch`` (1-based, OLMo-core's count)."""
    saved = upstream.loader_epoch(loader)
    upstream.set_loader_epoch(loader, epoch)
    try:
        return upstream.global_indices_file(loader)
    finally:
        upstream.set_loader_epoch(loader, saved)


def share_global_indices(loader, cache_dir: Optional[str | Path], epoch: int) -> Optional[Path]:
    """Give ``loader`` (an OLMo-core ``NumpyFSLDataLoader``) its global-indices file of ``epoch`` from the
    permutation cache in ``cache_dir`` (module docstring), unless it is there already; safe when several ranks
    call it at once (the file appears whole, by rename).

    :returns: the file's path, or ``None`` when there is no cache (``cache_dir`` None) or the loader does not
        shuffle (OLMo-core then builds its own order).
    :raises DataError: naming the file when it cannot be written or its size is not ``4 x`` its entries.
    """
    if cache_dir is None or not getattr(loader, "shuffle", True):
        return None
    target = global_indices_file(loader, epoch)
    n, chunk = len(loader.dataset), int(getattr(loader, "chunk_size", 1) or 1)
    nbytes = 4 * (n // chunk) * chunk
    if target.is_file() and target.stat().st_size == nbytes:
        return target
    t0 = time.monotonic()
    pcg_seed = int(loader.seed) + int(epoch)
    perm = cached_permutation(cache_dir, n // chunk, pcg_seed)  # built once per cluster (file lock)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_path(target) as tmp:
            if chunk == 1:
                src = permutation_path(cache_dir, n, pcg_seed)
                try:
                    os.unlink(tmp)  # the placeholder atomic_path made: the link takes its name
                    os.link(src, tmp)
                    how = "hard link"
                except OSError:
                    shutil.copyfile(src, tmp)
                    how = "copy"
            else:
                expanded = (np.repeat(np.asarray(perm, dtype=np.int64) * chunk, chunk).reshape(-1, chunk)
                            + np.arange(chunk, dtype=np.int64)).reshape(-1)
                expanded.astype("<u4").tofile(tmp)
                how = f"expanded from chunk permutation (chunk {chunk})"
            if Path(tmp).stat().st_size != nbytes:
                raise DataError(f"{target}: {Path(tmp).stat().st_size} B written, expected {nbytes} B")
    except OSError as e:
        raise DataError(f"{target}: cannot write OLMo-core's global indices ({e})") from None
    log.info("OLMo-core global indices of epoch %d (N=%d, seed %d): %s of the cached permutation in %.2f s -> %s",
             epoch, n, int(loader.seed), how, time.monotonic() - t0, target)
    return target
