"""Item files at the edges: every exception while reading, tokenizing or checking an item is one error naming
``file:line`` and the item; a UTF-8 byte-order mark and ``\\r\\n`` line ends are accepted by every reader."""

from __future__ import annotations

import numpy as np
import pytest

import pretrain_exp.insertion.types.tokens as tokens_type
from pretrain_exp.core.errors import DataError, InsertionError
from pretrain_exp.core.io import read_jsonl
from pretrain_exp.insertion.items import encode_texts
from pretrain_exp.insertion.schema import EosPolicy
from pretrain_exp.insertion.token_jsonl import read_token_items
from pretrain_exp.insertion.types import load_items, schema
from tests.bad_input import TOK, VOCAB, L, assert_error, items_of

BOM = b"\xef\xbb\xbf"


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_model_dir):
    """The real (SmolLM2) fast tokenizer of the tiny model asset."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def real_items(path, tok, type_="texts", **kw):
    return load_items("exp", schema(type_)(file=str(path), **kw), tokenizer=tok, vocab_size=len(tok),
                      sequence_length=64, seed=0)


def test_lone_surrogate_in_a_text_names_file_line_and_character(tmp_path, hf_tokenizer):
    """JSON's ``\\ud800`` escape gave the tokenizer's raw ``TypeError: TextEncodeInput must be Union[...]``."""
    f = tmp_path / "items.jsonl"
    f.write_bytes(b'{"text": "fine"}\n{"text": "ab\\ud800 cd"}\n')
    with pytest.raises(DataError) as ei:
        real_items(f, hf_tokenizer)
    assert_error(ei, f"{f}:2", "'text'", "lone surrogate '\\ud800' at character 2", "not valid Unicode")


def test_a_tokenizer_failure_names_the_item(hf_tokenizer):
    """Any exception of the tokenizer on one text (here the real tokenizer's TypeError on a surrogate) names that
    text's source, its index and a prefix of it."""
    texts = ["fine", "also fine", "bad \ud800 text"]
    with pytest.raises(DataError) as ei:
        encode_texts(texts, hf_tokenizer, "items.jsonl", batch=2, sources=["f:1", "f:2", "f:5"])
    assert_error(ei, "f:5", "item 2", "'bad \\ud800 text'", "TypeError")
    with pytest.raises(DataError) as ei:
        encode_texts(texts, hf_tokenizer, "items.jsonl")
    assert_error(ei, "items.jsonl text 2", "TypeError")


@pytest.mark.parametrize("line, needle", [
    (b'{"text": "a", "n": ' + b"9" * 5000 + b"}", "integer string conversion"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
])
def test_json_the_parser_raises_other_than_decode_errors_on(tmp_path, line, needle):
    """A 5000-digit integer (ValueError) and deep nesting (RecursionError) were raw tracebacks."""
    f = tmp_path / "items.jsonl"
    f.write_bytes(b'{"text": "fine"}\n' + line + b"\n")
    with pytest.raises(DataError) as ei:
        items_of(f)
    assert_error(ei, f"{f}:2", "malformed JSON", needle)
    g = tmp_path / "tokens.jsonl"
    g.write_bytes(b"[5]\n" + line.replace(b'{"text": "a", "n": ', b"[").replace(b"}", b"]") + b"\n")
    with pytest.raises(DataError) as ei:
        items_of(g, type_="tokens")
    assert_error(ei, f"{g}:2", "malformed JSON", needle)


def test_an_unforeseen_loader_failure_names_the_experiment_and_file(tmp_path, hf_tokenizer):
    """A raw ``tokenizers.Tokenizer`` (no ``eos_token_id``) instead of an HF tokenizer: an AttributeError deep in
    the loader becomes one error naming the experiment and its file."""
    f = tmp_path / "items.jsonl"
    f.write_text('{"text": "fine"}\n')
    with pytest.raises(InsertionError) as ei:
        load_items("exp", schema("texts")(file=str(f)), tokenizer=hf_tokenizer.backend_tokenizer,
                   vocab_size=len(hf_tokenizer), sequence_length=64, seed=0)
    assert_error(ei, "insertion.experiments.exp", str(f), "AttributeError")


def _variants(tmp_path, name, lines):
    """The same lines written plain, with a BOM, with CRLF line ends and with both."""
    body = "\n".join(lines) + "\n"
    out = {}
    for tag, data in (("plain", body.encode()), ("bom", BOM + body.encode()),
                      ("crlf", body.replace("\n", "\r\n").encode()),
                      ("bom_crlf", BOM + body.replace("\n", "\r\n").encode())):
        out[tag] = tmp_path / f"{tag}-{name}"
        out[tag].write_bytes(data)
    return out


def _same_items(a, b):
    assert len(a) == len(b)
    assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.offsets, b.offsets)
    assert [s.split(":")[-1] for s in a.sources] == [s.split(":")[-1] for s in b.sources]  # same line numbers


def test_bom_and_crlf_texts_read_as_plain(tmp_path, hf_tokenizer):
    files = _variants(tmp_path, "items.jsonl", ['{"text": "The first item."}', "", '{"text": "Second, caf\u00e9."}'])
    ref = real_items(files["plain"], hf_tokenizer)
    assert ref.texts == ["The first item.", "Second, caf\u00e9."]
    for tag in ("bom", "crlf", "bom_crlf"):
        got = real_items(files[tag], hf_tokenizer)
        _same_items(got, ref)
        assert got.texts == ref.texts
    assert [n for n, _ in read_jsonl(files["bom_crlf"])] == [1, 3]


def test_bom_and_crlf_token_files_on_fast_and_exact_paths(tmp_path, monkeypatch):
    files = _variants(tmp_path, "tokens.jsonl", ["[5,6,7]", "[8,9]", "", "[10]"])
    ref = items_of(files["plain"], type_="tokens")
    for tag in ("bom", "crlf", "bom_crlf"):
        fast = read_token_items(files[tag], vocab_size=VOCAB, sequence_length=L, eos=TOK.eos_token_id,
                                policy=EosPolicy.wrap, dtype=np.uint16)
        assert fast is not None, f"{tag}: the fast path refused the file"
        assert fast.lines.tolist() == [1, 2, 4]
        _same_items(items_of(files[tag], type_="tokens"), ref)
    monkeypatch.setattr(tokens_type, "read_token_items", lambda *a, **k: None)  # the exact per-item path
    for tag in ("bom", "crlf", "bom_crlf"):
        _same_items(items_of(files[tag], type_="tokens"), ref)


def test_bom_file_errors_keep_their_line_numbers(tmp_path):
    f = tmp_path / "items.jsonl"
    f.write_bytes(BOM + b'{"text": "a"}\r\n{"txt": "b"}\r\n')
    with pytest.raises(DataError) as ei:
        items_of(f)
    assert_error(ei, f"{f}:2", "missing key 'text'")
