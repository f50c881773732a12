"""Shared helpers of the bad-input tests: a byte tokenizer, one-line error checks, jsonl writing, item loading.

Every user mistake gives a clear one-line error naming the key / file:line / item, and leaves nothing
half-written; the cases live next to the module they exercise (``tests/unit/<package>/``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pretrain_exp.insertion.types import load_items, schema

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
CACHE = Path(os.environ.get("PRETRAIN_EXP_CACHE") or Path.home() / ".cache" / "pretrain_exp")
L = 16  #: sequence length of the direct planning cases
VOCAB = 300


class ByteTokenizer:
    """A stand-in HF tokenizer: one token per UTF-8 byte (id = byte + 3), EOS 2, vocab 259."""

    eos_token_id = 2

    def __call__(self, texts, add_special_tokens=False, verbose=False):
        return {"input_ids": [[b + 3 for b in t.encode("utf-8")] for t in texts]}

    def __len__(self):
        return 259


TOK = ByteTokenizer()


def one_line(msg: str) -> str:
    assert msg and "\n" not in msg.strip(), f"not one line: {msg!r}"
    return msg


def assert_error(excinfo, *needles: str) -> str:
    """The exception message is one line and contains every needle."""
    msg = one_line(str(excinfo.value))
    for n in needles:
        assert n in msg, f"{n!r} not in {msg!r}"
    return msg


def write_jsonl(path: Path, lines) -> Path:
    """Write raw lines (str) or JSON-encoded objects, one per line."""
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def items_of(path: Path, *, type_="texts", seq_len: int = L, vocab: int = VOCAB, **kw):
    exp = schema(type_)(file=str(path), **kw)
    return load_items("exp", exp, tokenizer=TOK, vocab_size=vocab, sequence_length=seq_len, seed=0)
