"""One data-layer entry opens a run's data from a plain spec (no run config): tokenizer, tokens, order, the training
window and the held-out rows, as the pieces it is made of give them one by one."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pretrain_exp.core.config import DataConf
from pretrain_exp.core.errors import ConfigError
from pretrain_exp.data.corpus import CorpusSpec, held_out_collision, open_corpus, open_order
from pretrain_exp.data.order import DataOrder
from pretrain_exp.data.token_files import TokenFiles
from pretrain_exp.data.tokenize import load_tokenizer, tokenize_sources

L, B = 128, 8


def _spec(tmp_path, tiny_model_dir, cache_dir, **kw) -> CorpusSpec:
    docs = tmp_path / "docs"
    docs.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    words = ["river", "lantern", "copper", "morning", "harbour", "quiet", "stone", "garden", "letter"]
    for i in range(3):
        (docs / f"doc{i}.txt").write_text(" ".join(rng.choice(words, size=1500)))
    data = DataConf(name="text", text=str(docs), token_dir=str(tmp_path / "tokens"), seed=3,
                    held_out_rows=kw.pop("held_out_rows", None))
    return CorpusSpec(data, str(tiny_model_dir), str(cache_dir), L, B, **kw)


def test_open_corpus_gives_what_its_pieces_give(tmp_path, tiny_model_dir, cache_dir):
    spec = _spec(tmp_path, tiny_model_dir, cache_dir, start_step=1, num_steps=2)
    corpus = open_corpus(spec, main=False)
    tokenizer = load_tokenizer(str(tiny_model_dir), cache_dir)
    paths = tokenize_sources(spec.data.text, tokenizer, spec.data.token_dir, cache_dir)
    files = TokenFiles(paths, corpus.order.files.dtype, cache_dir=cache_dir)
    order = DataOrder(files, L, B, 3, 1, cache_dir=cache_dir)
    assert corpus.vocab_size == len(tokenizer) and corpus.order.rows_per_epoch == order.rows_per_epoch
    assert all(np.array_equal(corpus.order.row_tokens(q), order.row_tokens(q)) for q in range(order.rows_per_epoch))
    assert corpus.window == (1 * B * L, 3 * B * L) and spec.rows == (B, 2 * B)
    assert corpus.window_fetched and corpus.stream is None  # local files: nothing to fetch
    rows = order.rows_per_epoch
    assert 24 < rows < 24 + 16  # the default 16 held-out rows would be trained: the rows after the window are taken
    assert corpus.held_out_rows == rows - 24 and held_out_collision(corpus.held_out_rows, B, 3 * B, rows, False) is None
    bare = open_order(spec, progress=False)  # a reader of a run's rows: no window, no held-out rows
    assert bare.window == (0, 0) and bare.held_out_rows == 0 and bare.order.rows_per_epoch == rows


def test_a_text_corpus_is_tokenized_into_the_runs_token_file_dtype(tmp_path, tiny_model_dir, cache_dir):
    """``data.dtype`` wider than the tokenizer's own: the corpus is written in it (read in it, the rows are the
    tokenizer's ids, not two ids fused into one), in a cache folder of its own; the default keeps its folder."""
    spec = _spec(tmp_path, tiny_model_dir, cache_dir)  # (writes the documents: their mtime is in the cache key)
    own = open_order(spec, progress=False).order
    wide = open_order(dataclasses.replace(spec, data=dataclasses.replace(spec.data, dtype="uint32")),
                      progress=False).order
    assert own.files.dtype == np.uint16 and wide.files.dtype == np.uint32
    assert own.files.paths[0].parent != wide.files.paths[0].parent
    assert wide.rows_per_epoch == own.rows_per_epoch
    assert all(np.array_equal(wide.row_tokens(q), own.row_tokens(q)) for q in range(own.rows_per_epoch))
    tokenizer = load_tokenizer(str(tiny_model_dir), cache_dir)
    default = tokenize_sources(str(tmp_path / "docs"), tokenizer, tmp_path / "tokens", cache_dir)  # key as before
    assert [p.resolve() for p in default] == [p.resolve() for p in own.files.paths]
    with pytest.raises(ConfigError, match="no token-file dtype") as e:
        open_order(dataclasses.replace(spec, data=dataclasses.replace(spec.data, dtype="float32")), progress=False)
    assert e.value.key == "data.dtype"


def test_held_out_rows_the_run_trains_are_refused_with_the_key(tmp_path, tiny_model_dir, cache_dir):
    spec = _spec(tmp_path, tiny_model_dir, cache_dir, num_steps=3, held_out_rows=16)
    with pytest.raises(ConfigError, match=r"trains rows \[0, 24\)") as e:
        open_corpus(spec, main=False)
    assert e.value.key == "data.held_out_rows"
