"""A cache of the token ids of text item files, so that a second build of the same file skips the tokenizer.

Key: sha256 of the file's bytes, a fingerprint of the tokenizer (sha256 of its serialized fast-tokenizer JSON, class
and EOS id), the EOS policy and ``num_items``. Entry: ``<cache_dir>/item_tokens/<key>.npz`` with ``ids`` (the
smallest unsigned dtype holding them), ``lengths`` (int64) and ``meta`` (a JSON string), written atomically and
read with ``allow_pickle=False``. Tokenizers without a serialized form (no ``backend_tokenizer``) are not cached.
"""

from __future__ import annotations

import hashlib
import json
import logging
import zipfile
from pathlib import Path
from typing import Optional

import numpy as np

from pretrain_exp.core.cachedir import CacheDir
from pretrain_exp.core.io import atomic_write, sha256_file

log = logging.getLogger(__name__)

VERSION = 1  #: bump when the entry layout changes


def tokenizer_fingerprint(tokenizer) -> Optional[str]:
    """Hex sha256 of a fast tokenizer's serialized JSON, class and EOS id; None if it has no serialized form."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "to_str"):
        return None
    h = hashlib.sha256(backend.to_str().encode())
    h.update(f"{type(tokenizer).__name__}:{getattr(tokenizer, 'eos_token_id', None)}".encode())
    return h.hexdigest()


def cache_path(cache_dir: str | Path, file: str | Path, tokenizer, eos_policy: str,
               num_items: Optional[int]) -> Optional[Path]:
    """The entry of ``file`` tokenized by ``tokenizer``; None if the tokenizer cannot be fingerprinted."""
    fp = tokenizer_fingerprint(tokenizer)
    if fp is None:
        return None
    key = json.dumps({"v": VERSION, "file": sha256_file(file), "tokenizer": fp, "eos": eos_policy,
                      "num_items": num_items}, sort_keys=True)
    return CacheDir(cache_dir).item_tokens / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.npz"


def load(path: Path, num_items: int) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """``(ids int64, lengths int64)`` of an entry holding ``num_items`` items; None if absent or unreadable."""
    try:
        with np.load(path, allow_pickle=False) as z:
            ids, lengths = z["ids"].astype(np.int64), z["lengths"].astype(np.int64)
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None
    if lengths.size != num_items or int(lengths.sum()) != ids.size:
        return None
    return ids, lengths


def save(path: Path, ids: np.ndarray, lengths: np.ndarray, meta: dict) -> None:
    """Write an entry atomically (``ids`` stored as uint16/uint32 when they fit)."""
    top = int(ids.max()) if ids.size else 0
    dtype = np.uint16 if top < 2**16 else np.uint32 if top < 2**32 else np.int64
    atomic_write(path, lambda f: np.savez(f, ids=ids.astype(dtype), lengths=lengths.astype(np.int64),
                                          meta=np.array(json.dumps(meta))), binary=True)
    log.info(f"cached the token ids of {meta.get('file')} in {path}")
