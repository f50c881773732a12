"""The vectorized item paths give exactly the items (and plans) of the per-item path: ``tokens`` files read block by
block into CSR arrays, ``texts`` tokenized in batches with a cache of token ids."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

import pretrain_exp.insertion.types.texts as texts_type
import pretrain_exp.insertion.types.tokens as tokens_type
from pretrain_exp.insertion.items import apply_eos, assign_dup_counts, experiment_rng
from pretrain_exp.insertion.plan import build_plan
from pretrain_exp.insertion.schema import EosPolicy
from pretrain_exp.insertion.token_jsonl import read_token_items
from pretrain_exp.insertion.types import load_items, schema
from tests.bad_input import TOK, ByteTokenizer

L, VOCAB, EOS = 16, 300, TOK.eos_token_id

LINES = ["[5,6,7]", "", "[ 8 , 9 ]\r", "[2,10,2]", "[2,11]", "[12,2]", "  ", "[" + ",".join(["13"] * (L - 1)) + "]",
         "[" + ",".join(["14"] * L) + "]", "[0]", "[299,1,20]", "\t[1,\t2,3]  "]


def write(path, lines, newline_at_end=True):
    path.write_bytes(("\n".join(lines) + ("\n" if newline_at_end else "")).encode())
    return path


def reference(path, eos: EosPolicy, num_items=None, repetitions=1, seed=0):
    """The items as a plain ``json.loads`` reading builds them: ``(tokens per item, dup counts, sources)``."""
    rows = [(i, json.loads(line)) for i, line in enumerate(path.read_text().split("\n"), 1) if line.strip()]
    rows = rows[:num_items] if num_items is not None else rows
    toks = [apply_eos(r, EOS, eos, L) for _, r in rows]
    dups = assign_dup_counts(len(rows), repetitions, experiment_rng(seed, "exp"), "k")
    return toks, dups.tolist(), [f"{path}:{i}" for i, _ in rows]


def tokens_items(path, monkeypatch=None, slow=False, **kw):
    if slow:
        monkeypatch.setattr(tokens_type, "read_token_items", lambda *a, **k: None)
    return load_items("exp", schema("tokens")(file=str(path), **kw), tokenizer=TOK, vocab_size=VOCAB,
                      sequence_length=L, seed=0)


@pytest.mark.parametrize("eos", list(EosPolicy))
@pytest.mark.parametrize("num_items, repetitions", [(None, 1), (4, [0, 1, 3]), (None, 0.5)])
def test_tokens_fast_path_matches_reference_and_exact_path(tmp_path, monkeypatch, eos, num_items, repetitions):
    f = write(tmp_path / "items.jsonl", LINES, newline_at_end=num_items is None)
    fast = tokens_items(f, eos=eos, num_items=num_items, repetitions=repetitions)
    assert fast.tokens.dtype == np.uint16  # the vectorized reader ran (the exact path stores int64)
    toks, dups, sources = reference(f, eos, num_items, repetitions)
    assert [it.tokens.tolist() for it in fast] == toks
    assert fast.dup_counts.tolist() == dups and fast.sources == sources and list(fast.sources) == sources
    exact = tokens_items(f, monkeypatch, slow=True, eos=eos, num_items=num_items, repetitions=repetitions)
    assert exact.tokens.dtype == np.int64
    assert np.array_equal(fast.offsets, exact.offsets) and np.array_equal(fast.tokens, exact.tokens)
    assert np.array_equal(fast.dup_counts, exact.dup_counts) and fast.sources == exact.sources
    plans = [build_plan({"exp": s}, {"exp": schema("tokens")(file=str(f), eos=eos)}, (0, 64 * L), L, 4, 0, VOCAB)
             for s in (fast, exact)]
    assert plans[0].digest() == plans[1].digest()


def test_tokens_blocks_and_long_lines(tmp_path):
    """Tiny blocks: lines split across block ends and lines longer than a block give the same items."""
    rng = np.random.default_rng(0)
    rows = [rng.integers(0, 10**int(rng.integers(1, 9)), size=int(rng.integers(1, 40))).tolist() for _ in range(300)]
    f = write(tmp_path / "items.jsonl", [json.dumps(r) for r in rows])
    got = read_token_items(f, vocab_size=10**8, sequence_length=64, eos=None, policy=EosPolicy.none,
                           dtype=np.uint32, block_bytes=64)
    assert got.offsets.tolist() == np.concatenate([[0], np.cumsum([len(r) for r in rows])]).tolist()
    assert got.tokens.tolist() == [t for r in rows for t in r] and got.lines.tolist() == list(range(1, 301))


@pytest.mark.parametrize("line", ["[01]", "[1,,2]", "[1 2]", "[1,]", "[]", "[[1]]", "[-1]", "[1.0]", '["1"]',
                                  "[1]]", "[1][2]", "[123456789]", "{\"tokens\": [1]}", "[1]x"])
def test_tokens_irregular_lines_leave_the_fast_path(tmp_path, line):
    f = write(tmp_path / "items.jsonl", ["[1,2]", line])
    assert read_token_items(f, vocab_size=10**9, sequence_length=L, eos=EOS, policy=EosPolicy.wrap,
                            dtype=np.uint32) is None


@pytest.mark.parametrize("vocab, seq_len, num_items, eos",
                         [(7, L, None, EOS), (VOCAB, 2, None, EOS), (VOCAB, L, 5, EOS), (VOCAB, L, None, VOCAB)])
def test_tokens_failed_checks_leave_the_fast_path(tmp_path, vocab, seq_len, num_items, eos):
    f = write(tmp_path / "items.jsonl", ["[1,2,3]", "[4,5,6,7]"])
    assert read_token_items(f, vocab_size=vocab, sequence_length=seq_len, eos=eos, policy=EosPolicy.wrap,
                            dtype=np.uint32, num_items=num_items) is None


class CountingTokenizer(ByteTokenizer):
    """The byte tokenizer with a serialized form (so it can be cached), counting its calls."""

    backend_tokenizer = SimpleNamespace(to_str=lambda: "bytes+3")

    def __init__(self):
        self.calls = 0

    def __call__(self, texts, **kw):
        self.calls += 1
        return super().__call__(texts, **kw)


def test_texts_cache_hit_and_invalidation(tmp_path, monkeypatch):
    f = tmp_path / "texts.jsonl"
    f.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["alpha", "beta gamma", "\u00e9t\u00e9", "d"]))
    tok = CountingTokenizer()
    monkeypatch.setattr("pretrain_exp.insertion.items.ENCODE_BATCH", 3)  # two batches

    def items(cache_dir):
        return load_items("exp", schema("texts")(file=str(f), repetitions=[0, 2]), tokenizer=tok, vocab_size=VOCAB,
                          sequence_length=L, seed=0, cache_dir=cache_dir)

    plain = items(None)
    assert tok.calls == 2
    first = items(str(tmp_path / "cache"))
    assert tok.calls == 4 and len(list((tmp_path / "cache" / "item_tokens").glob("*.npz"))) == 1
    second = items(str(tmp_path / "cache"))
    assert tok.calls == 4  # the cache was hit
    for s in (first, second):
        assert np.array_equal(s.tokens, plain.tokens) and np.array_equal(s.offsets, plain.offsets)
        assert s.dup_counts.tolist() == plain.dup_counts.tolist() and s.texts == plain.texts
        assert s.sources == plain.sources
    f.write_text(f.read_text() + json.dumps({"text": "new"}) + "\n")  # another file: tokenized again
    third = items(str(tmp_path / "cache"))
    assert tok.calls == 6 and len(third) == 5
    assert [it.tokens.tolist() for it in third] == [apply_eos([b + 3 for b in t.encode()], EOS, EosPolicy.wrap, L)
                                                    for t in ["alpha", "beta gamma", "\u00e9t\u00e9", "d", "new"]]
    assert texts_type.text_cache.tokenizer_fingerprint(TOK) is None  # no serialized form: never cached
