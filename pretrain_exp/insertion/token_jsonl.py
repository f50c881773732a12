"""Vectorized reading of token-id item files: one bare JSON list of token ids per line (``[5,17,3]``), parsed block
by block with array operations straight into CSR arrays, EOS policy applied and checked as arrays.

The fast path accepts exactly the lines ``[d(,d)*]`` (digits, commas, brackets, optional spaces, tabs and ``\\r``
around them; blank lines and a leading UTF-8 byte-order mark skipped) whose ids have at most 8 digits and no leading
zero. Any other line (a dict, a float, a string, a negative id, malformed JSON, an empty list) and any failed check
(an id outside the vocabulary, an item longer than the sequence length, too few items) makes
:func:`read_token_items` return None, and the caller runs the exact per-item path, which raises the usual error
naming ``file:line`` and the item. Peak memory is the CSR arrays plus one block (:data:`BLOCK_BYTES`) of work
arrays.
"""

from __future__ import annotations

import os
import sys
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator, NamedTuple, Optional

import numpy as np

from pretrain_exp.insertion.items import apply_eos_csr
from pretrain_exp.insertion.schema import EosPolicy

BLOCK_BYTES = 1 << 18  #: bytes of the file decoded per block (whole lines; longer lines grow the block)
MAX_DIGITS = 8  #: ids with more digits leave the fast path (decoded as one little-endian uint64 word)
_PAD = 8  #: newline bytes in front of every block (a number's 8-byte window never starts before the buffer)

# byte classes: '[' 0, ',' 1, ']' 2, '\n' 3, blank 4, anything else 5 (digits are found separately)
_CLASS = np.full(256, 5, dtype=np.uint8)
for _ch, _cl in ((b"[", 0), (b",", 1), (b"]", 2), (b"\n", 3), (b" ", 4), (b"\t", 4), (b"\r", 4)):
    _CLASS[_ch[0]] = _cl
# allowed (class, next class, numbers between them) of consecutive non-blank punctuation
_ALLOWED = np.zeros(64, dtype=bool)
for _a, _b, _k in ((3, 0, 0), (3, 3, 0), (0, 1, 1), (0, 2, 1), (1, 1, 1), (1, 2, 1), (2, 3, 0)):
    _ALLOWED[_a * 16 + _b * 4 + _k] = True
_ALL = 0xFFFFFFFFFFFFFFFF
#: keep the top ``n`` bytes of a little-endian word (the digits of an ``n``-digit number ending the word)
_HI = np.array([(_ALL << (8 * (8 - n))) & _ALL for n in range(9)], dtype=np.uint64)


#: (mask or None, multiplier, shift) of the steps combining neighbouring digit groups of a little-endian word:
#: bytes -> 2-digit groups (``d0 * 10 + d1``), -> 4-digit, -> 8-digit (the value)
_SWAR = ((None, np.uint64(10 * 2**8 + 1), np.uint64(8)),
         (np.uint64(0x00FF00FF00FF00FF), np.uint64(100 * 2**16 + 1), np.uint64(16)),
         (np.uint64(0x0000FFFF0000FFFF), np.uint64(10000 * 2**32 + 1), np.uint64(32)))


class _Irregular(Exception):
    """A block holds a line outside the fast path's grammar."""


class TokenItems(NamedTuple):
    """Token items in CSR form: item ``i`` is ``tokens[offsets[i]:offsets[i + 1]]``, read from line
    ``lines[i]`` (1-based) of its file."""

    tokens: np.ndarray  #: ``dtype`` given to :func:`read_token_items`, shape ``(total tokens,)``
    offsets: np.ndarray  #: int64, shape ``(n + 1,)``
    lines: np.ndarray  #: int64, shape ``(n,)``


class LineSources(Sequence):
    """``file:line`` of each item, formatted on access (no per-item string objects at scale); equal to the list
    of those strings."""

    def __init__(self, file: str, lines: np.ndarray):
        self.file, self.lines = str(file), lines

    def __len__(self) -> int:
        return int(self.lines.size)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [f"{self.file}:{n}" for n in self.lines[i].tolist()]
        return f"{self.file}:{int(self.lines[i])}"

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and len(other) == len(self) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]


def _structure_with_blanks(t: np.ndarray, has_num: np.ndarray):
    """Check the punctuation classes ``t`` (uint8, :data:`_CLASS`) of a block with blanks; ``has_num[j]``: a
    number between punctuation ``j`` and ``j + 1``.

    :returns: ``(opens, closes, newlines, tokens per item)``: int64 indices into the non-blank punctuation.
    :raises _Irregular: for a byte outside the grammar's alphabet or a line outside the grammar.
    """
    if int(t.max()) == 5:
        raise _Irregular
    before = np.concatenate([[0], np.cumsum(has_num)])
    keep = np.flatnonzero(t != 4)
    t, between = t[keep], np.diff(before[keep])
    if (between > 1).any():  # two numbers separated by blanks only
        raise _Irregular
    where = before[keep]
    if not _ALLOWED[(t[:-1] << 4) | (t[1:] << 2) | between.astype(np.uint8)].all():
        raise _Irregular
    opens, closes = np.flatnonzero(t == 0), np.flatnonzero(t == 2)
    return opens, closes, np.flatnonzero(t == 3), where[closes] - where[opens]


def _decode(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Decode one block: ``b`` is uint8, ``_PAD`` newlines then whole lines ending with ``\\n``, backed by an
    8-byte aligned buffer.

    :returns: ``(ids uint32 (k,), tokens per item int64 (m,), newlines before each item int64 (m,), newlines in
        the block, bytes of the block)``.
    :raises _Irregular: for any line outside the grammar (module docstring).
    """
    p = np.flatnonzero((b - np.uint8(48)) >= np.uint8(10))  # the non-digits
    c = b[p]
    gap = np.diff(p)
    has_num = gap > 1
    ends = p[1:][has_num]
    ndig = gap[has_num] - 1
    if ndig.size and int(ndig.max()) > MAX_DIGITS:
        raise _Irregular
    if ((b[ends - ndig] == 48) & (ndig > 1)).any():  # a leading zero ("01" is not JSON)
        raise _Irregular
    is_open, is_close, is_nl = c == 91, c == 93, c == 10
    is_comma = c == 44
    if (is_open | is_close | is_nl | is_comma).all():  # no blanks: check the transitions with byte compares
        prev_oc = is_open[:-1] | is_comma[:-1]
        after_close = np.where(is_close[:-1], is_nl[1:], is_open[1:] | is_nl[1:])  # or after a newline
        nxt = np.where(prev_oc, is_comma[1:] | is_close[1:], after_close)
        if not (nxt.all() and np.array_equal(has_num, prev_oc)):
            raise _Irregular
        opens, closes, newlines = np.flatnonzero(is_open), np.flatnonzero(is_close), np.flatnonzero(is_nl)
        lengths = closes - opens
    else:
        opens, closes, newlines, lengths = _structure_with_blanks(_CLASS[c], has_num)
    nl_before = np.searchsorted(newlines, opens) - _PAD
    # ids: the 8 bytes ending at each number as one little-endian word, XOR '0' (bytewise digit values), the
    # bytes before the number masked off, then the digits combined pairwise (SWAR)
    words = np.ndarray((b.size - 7,), dtype=np.uint64, buffer=b, strides=(1,))
    x = words.take(np.subtract(ends, 8, out=ends))
    x ^= np.uint64(0x3030303030303030)
    x &= _HI[ndig]
    for mask, mul, shift in _SWAR:
        if mask is not None:
            x &= mask
        x *= mul
        x >>= shift
    return (x.astype(np.uint32), lengths.astype(np.int64), nl_before.astype(np.int64), int(newlines.size) - _PAD,
            b.size - _PAD)


def _last_newline(seg: np.ndarray) -> int:
    """Index of the last ``\\n`` in ``seg`` (uint8), -1 if none; scans back 64 KiB at a time."""
    hi = seg.size
    while hi > 0:
        lo = max(hi - (1 << 16), 0)
        nl = np.flatnonzero(seg[lo:hi] == 10)
        if nl.size:
            return lo + int(nl[-1])
        hi = lo
    return -1


def _new_buffer(cap: int) -> np.ndarray:
    """An 8-byte aligned uint8 buffer for ``_PAD`` + ``cap`` bytes + a spare newline, the pad filled."""
    buf = np.empty((_PAD + cap + 16) // 8 + 1, dtype=np.uint64).view(np.uint8)
    buf[:_PAD] = 10
    return buf


def _raw_blocks(path: Path, block_bytes: int) -> Iterator[np.ndarray]:
    """Blocks of whole lines of ``path`` as :func:`_decode` takes them (each in its own buffer; a missing final
    newline added; a line longer than the block grows it; a leading UTF-8 byte-order mark skipped)."""
    cap, carry = block_bytes, b""
    with open(path, "rb", buffering=0) as f:
        if f.read(3) != b"\xef\xbb\xbf":  # a UTF-8 byte-order mark is skipped, as in read_jsonl
            f.seek(0)
        while True:
            buf = _new_buffer(cap)
            buf[_PAD:_PAD + len(carry)] = np.frombuffer(carry, np.uint8)
            got = f.readinto(memoryview(buf)[_PAD + len(carry):_PAD + cap])
            total = len(carry) + got
            if got == 0:
                if total == 0:
                    return
                if buf[_PAD + total - 1] != 10:
                    buf[_PAD + total] = 10
                    total += 1
                yield buf[:_PAD + total]
                return
            cut = _last_newline(buf[_PAD:_PAD + total]) + 1
            if cut == 0:  # a line longer than the block: read on into a larger one
                cap *= 2
                carry = buf[_PAD:_PAD + total].tobytes()
                continue
            carry = buf[_PAD + cut:_PAD + total].tobytes()
            yield buf[:_PAD + cut]


def _decoded_blocks(path: Path, block_bytes: int, workers: int):
    """:func:`_decode` of each block of ``path``, in file order, ``workers`` blocks decoded at a time (numpy
    releases the GIL in its loops)."""
    if workers <= 1:
        yield from map(_decode, _raw_blocks(path, block_bytes))
        return
    with ThreadPoolExecutor(workers) as pool:
        pending: deque = deque()
        try:
            for raw in _raw_blocks(path, block_bytes):
                pending.append(pool.submit(_decode, raw))
                if len(pending) > 2 * workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for fut in pending:
                fut.cancel()


def _grow(a: np.ndarray, need: int, estimate: int) -> np.ndarray:
    """``a`` resized in place (realloc; the new part is zero-filled, so touched) to at least ``need`` elements:
    ``estimate`` (pages never written stay out of the resident set), or 25% more when that is too small."""
    if need > a.size:
        a.resize(max(need, estimate if estimate > need else a.size + a.size // 4), refcheck=False)
    return a


def read_token_items(path: str | Path, *, vocab_size: int, sequence_length: int, eos: Optional[int],
                     policy: EosPolicy, dtype, num_items: Optional[int] = None,
                     block_bytes: int = BLOCK_BYTES, workers: Optional[int] = None) -> Optional[TokenItems]:
    """The first ``num_items`` (all if None) token lists of a jsonl file of bare lists, EOS ``policy`` applied
    (:func:`~pretrain_exp.insertion.items.apply_eos_csr`), ids checked against ``vocab_size`` and lengths
    against ``sequence_length``.

    :param eos: the EOS id (None: no tokenizer; only ``policy=none`` passes; an id outside the vocabulary
        neither).
    :param dtype: token dtype of the result (holding ``vocab_size`` ids).
    :param workers: threads decoding blocks (default: the usable cores, at most 4).
    :returns: the items, or None where the exact path must decide (module docstring): an irregular line anywhere
        in the file, a failed check, no items or fewer than ``num_items``.
    """
    path = Path(path)
    if (not path.is_file() or sys.byteorder != "little" or
            policy != EosPolicy.none and (eos is None or not 0 <= eos < vocab_size)):
        return None
    size = path.stat().st_size
    tokens, offsets, lines = np.empty(0, dtype=dtype), np.zeros(1, dtype=np.int64), np.empty(0, dtype=np.int64)
    n = ntok = done = 0
    limit = num_items if num_items is not None else np.inf
    L = sequence_length
    workers = workers or min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
    try:
        line0, blocks = 1, _decoded_blocks(path, block_bytes, workers)
        for ids, lengths, nl_before, newlines, nbytes in blocks:
            first_line, line0, done = line0, line0 + newlines, done + nbytes
            if n >= limit:
                continue  # later lines are still checked (the exact path reads the whole file)
            if n + lengths.size > limit:
                m = int(limit - n)
                ids, lengths, nl_before = ids[:int(lengths[:m].sum())], lengths[:m], nl_before[:m]
            if lengths.size == 0:
                continue
            if int(ids.max()) >= vocab_size or int(lengths.max()) > L:
                return None
            out, new_len = apply_eos_csr(ids, lengths, eos, policy, L)
            k = lengths.size
            scale = 1.05 * size / done + 0.01  # the rest of the file as dense as the part read so far
            tokens = _grow(tokens, ntok + out.size, int((ntok + out.size) * scale) + 4096)
            tokens[ntok:ntok + out.size] = out
            offsets = _grow(offsets, n + k + 1, int((n + k) * scale) + 1024)
            offsets[n + 1:n + k + 1] = ntok + np.cumsum(new_len)
            lines = _grow(lines, n + k, offsets.size)
            lines[n:n + k] = first_line + nl_before
            n, ntok = n + k, ntok + out.size
    except _Irregular:
        return None
    if n == 0 or (num_items is not None and n < num_items):
        return None
    tokens.resize(ntok, refcheck=False)
    offsets.resize(n + 1, refcheck=False)
    lines.resize(n, refcheck=False)
    return TokenItems(tokens, offsets, lines)
