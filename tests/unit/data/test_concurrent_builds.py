"""Jobs of one sweep starting together on one cache: 4 processes (multiprocessing spawn) build the same tokenized
corpus, text-item token cache, permutation, model folder (``build_once``), size index and checkpoint download at
once; each build function runs exactly once (the others wait on the file lock and reuse its output) and all 4
get the same bytes. Every build is slowed down, so that without the lock the builds would overlap."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import time
from pathlib import Path

import numpy as np
import pytest

from tests.bad_input import ByteTokenizer
from tests.remote_server import RangeServer

N = 4
BUILDERS = ("tokens", "texts", "permutation", "build_once", "size_index", "download")


def _count(root: Path, what: str, owner, name: str) -> None:
    """Wrap ``owner.name`` so each call appends a line to ``<root>/<what>.builds`` and takes 0.5 s longer."""
    real = getattr(owner, name)

    def counted(*args, **kwargs):
        with open(root / f"{what}.builds", "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(0.5)
        return real(*args, **kwargs)

    setattr(owner, name, counted)


class _Tokenizer(ByteTokenizer):
    """The byte tokenizer with a serialized form, so that the token caches key it (no transformers import: the
    4 processes start in a second)."""

    class backend_tokenizer:
        @staticmethod
        def to_str() -> str:
            return "byte-tokenizer"


def _build(what: str, root: Path, base: str) -> bytes:
    """Build ``what`` in the shared cache ``root/cache``; returns the bytes this process got."""
    cache = root / "cache"
    if what == "tokens":
        from pretrain_exp.data import tokenize

        _count(root, what, tokenize, "_write_files")
        paths = tokenize.tokenize_source(str(root / "corpus.jsonl"), _Tokenizer(), cache / "tokens", cache,
                                         progress=False)
        return b"".join(Path(p).read_bytes() for p in paths)
    if what == "texts":
        from pretrain_exp.insertion.types import load_items, schema, texts

        _count(root, what, texts, "encode_texts")
        tok = _Tokenizer()
        items = load_items("exp", schema("texts")(file=str(root / "items.jsonl")), tokenizer=tok,
                           vocab_size=len(tok), sequence_length=64, seed=0, cache_dir=str(cache))
        return items.tokens.tobytes() + items.offsets.tobytes()
    if what == "permutation":
        from pretrain_exp.data import order

        _count(root, what, order, "build_permutation")
        return np.asarray(order.cached_permutation(cache, 100_000, 7)).tobytes()
    if what == "build_once":
        from pretrain_exp.data.assets import build_once

        def build(tmp: Path) -> dict:
            with open(root / f"{what}.builds", "a") as f:
                f.write(f"{os.getpid()}\n")
            time.sleep(0.5)
            (tmp / "weights.bin").write_bytes(os.urandom(64))  # differs per build: a second build would show
            return {"built_by": os.getpid()}

        return (build_once(cache / "models" / "m", build) / "weights.bin").read_bytes()
    if what == "size_index":
        from pretrain_exp.data import remote

        _count(root, what, remote.RemoteReader, "size")
        sizes = remote.fetch_sizes([f"{base}/ckpt/train.pt", f"{base}/ckpt/config.yaml"], cache, progress=False)
        return json.dumps(sizes, sort_keys=True).encode()
    if what == "download":
        import pretrain_exp.frameworks.download as download

        _count(root, what, download, "download_file")
        ckpt = download.download_checkpoint_files(f"{base}/ckpt", cache / "ckpt", ["config.yaml", "train.pt"])
        return (ckpt / "config.yaml").read_bytes() + (ckpt / "train.pt").read_bytes()
    raise AssertionError(what)


def _worker(root: str, base: str, barrier) -> None:
    os.environ["no_proxy"] = os.environ["NO_PROXY"] = "127.0.0.1,localhost"
    root_path = Path(root)
    for what in BUILDERS:
        barrier.wait(timeout=120)  # all 4 start each build together
        got = _build(what, root_path, base)
        (root_path / f"{what}.{os.getpid()}.sha").write_text(hashlib.sha256(got).hexdigest())


@pytest.mark.slow
def test_four_processes_build_each_shared_cache_entry_once(tmp_path):
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps({"text": f"document {i} " * 20}) + "\n"
                                                   for i in range(50)))
    (tmp_path / "items.jsonl").write_text("".join(json.dumps({"text": f"item number {i}"}) + "\n" for i in range(8)))
    (tmp_path / "srv" / "ckpt").mkdir(parents=True)
    (tmp_path / "srv" / "ckpt" / "config.yaml").write_text("model: {d_model: 8}\n")
    (tmp_path / "srv" / "ckpt" / "train.pt").write_bytes(os.urandom(200_000))
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(N)
    with RangeServer(tmp_path / "srv") as srv:
        procs = [ctx.Process(target=_worker, args=(str(tmp_path), srv.base, barrier))
                 for _ in range(N)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=300)
        assert [p.exitcode for p in procs] == [0] * N
        gets = [path for method, path, _ in srv.requests if method == "GET"]
    for what in BUILDERS:
        builds = (tmp_path / f"{what}.builds").read_text().split()
        assert len(builds) == (2 if what in ("size_index", "download") else 1), (what, builds)  # 2 files, once each
        digests = {(tmp_path / f"{what}.{p.pid}.sha").read_text() for p in procs}
        assert len(digests) == 1, what
    assert sorted(gets) == ["/ckpt/config.yaml", "/ckpt/train.pt"]
