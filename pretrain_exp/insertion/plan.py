"""The insertion :class:`Plan`: every insertion of a run as sorted arrays, saved without pickling.

A plan holds the items (CSR token storage, one entry per item including never-inserted controls) and the spans
(one entry per copy: global token position, item, dup index), sorted by position and non-overlapping. A span has
one of two kinds, given by its item: a **token span** writes the item's tokens at ``[position, position + length)``;
a **noise span** (an item with a noise seed, ``item_noise_seed >= 0``, and no tokens) covers the whole row
``position // L`` and adds the item's seeded noise to that row's input embeddings
(:mod:`~pretrain_exp.insertion.noise`): each pattern's seed and its experiment's std (``noise_sigma``) regenerate
every noise tensor, so no noise is stored. :meth:`Plan.apply` is the only code that writes inserted tokens into
training rows; it writes token spans only. The token spans are also exposed as ``positions``/``item_ids``/
``dup_index``/``lengths``/``ends`` and the noise spans as ``noise_rows``/``noise_item_ids``/``noise_dup_index``.

Files (written atomically): ``plan.npz`` (``numpy.savez``; load with ``allow_pickle=False``),
``manifest.jsonl`` (one line per span: ``position, step, row, offset, length, item_id, experiment,
dup_index, sha256``) and ``items.jsonl`` (one line per item: ``item_id, experiment, index, dup_count, length,
sha256, source`` and ``text`` for text items). A noise span is a manifest line with ``offset 0``, ``length L``,
``sha256 null`` and the pattern's ``noise_seed`` and ``sigma``; a noise item has them in ``items.jsonl`` too.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from pretrain_exp.core.errors import CheckpointError, InsertionError
from pretrain_exp.core.io import atomic_write
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.core.secrets import redact
from pretrain_exp.data.order import step_row_offset
from pretrain_exp.data.token_files import dtype_for_vocab
from pretrain_exp.insertion.items import ItemSet, experiment_rng, sha256_tokens
from pretrain_exp.insertion.noise import noise_seed
from pretrain_exp.insertion.placement import (
    Occupancy,
    allowed_rows,
    expand_copies,
    explicit_positions,
    place_explicit,
    place_random,
)
from pretrain_exp.insertion.placements import kind_of
from pretrain_exp.insertion.schema import InsertionExperimentConf

#: the arrays of ``plan.npz`` besides ``meta``
ARRAYS = ("token_offsets", "tokens", "item_experiment", "item_dup_count", "span_positions", "span_item_ids",
          "span_dup_index", "item_noise_seed")


@dataclass
class Plan:
    """All insertions of a run.

    Item arrays have shape ``(num_items,)``, span arrays ``(num_spans,)`` (token and noise spans together, sorted
    by position); the token-span views have shape ``(num_insertions,)``, the noise-span views ``(n_noise,)``.
    """

    sequence_length: int
    global_batch_size: int
    window: tuple  #: ``(start, end)`` global token positions of the training window
    experiments: List[str]  #: experiment names; ``item_experiment`` indexes this list
    token_offsets: np.ndarray  #: int64 ``(num_items + 1,)``: item i's tokens are ``tokens[off[i]:off[i+1]]``
    tokens: np.ndarray  #: uint16/uint32 ``(sum of item lengths,)``
    item_experiment: np.ndarray  #: int32 ``(num_items,)``
    item_dup_count: np.ndarray  #: int32 ``(num_items,)``; 0 = control
    span_positions: np.ndarray  #: int64 ``(num_spans,)``, sorted ascending (a noise span: its row start)
    span_item_ids: np.ndarray  #: int32 ``(num_spans,)``
    span_dup_index: np.ndarray  #: int32 ``(num_spans,)``: which copy of its item (0-based)
    #: int64 ``(num_items,)``: the noise seed of a noise item, ``-1`` for a token item (default: all token items)
    item_noise_seed: Optional[np.ndarray] = None
    noise_sigma: Dict[str, float] = field(default_factory=dict)  #: experiment with noise items -> noise std

    def __post_init__(self):
        if self.item_noise_seed is None:
            self.item_noise_seed = np.full(self.item_experiment.size, -1, dtype=np.int64)
        noise_item = self.item_noise_seed >= 0
        #: int64 ``(num_spans,)``: tokens a span covers (a noise span: ``L``, its whole row)
        self.span_lengths = np.where(noise_item, self.sequence_length,
                                     np.diff(self.token_offsets)).astype(np.int64)[self.span_item_ids]
        noise = noise_item[self.span_item_ids]  #: bool per span: the span kind
        tok = ~noise
        self.positions = self.span_positions[tok]  #: int64 ``(num_insertions,)``: token spans, sorted
        self.item_ids = self.span_item_ids[tok]  #: int32 ``(num_insertions,)``
        self.dup_index = self.span_dup_index[tok]  #: int32 ``(num_insertions,)``
        self.lengths = self.span_lengths[tok]  #: int64 ``(num_insertions,)``
        self.ends = self.positions + self.lengths  #: int64 ``(num_insertions,)``
        self.noise_rows = self.span_positions[noise] // self.sequence_length  #: int64 ``(n_noise,)``, sorted
        self.noise_item_ids = self.span_item_ids[noise]  #: int32 ``(n_noise,)``
        self.noise_dup_index = self.span_dup_index[noise]  #: int32 ``(n_noise,)``

    @property
    def num_items(self) -> int:
        return int(self.item_experiment.size)

    @property
    def num_insertions(self) -> int:
        """Token spans (noise spans are counted by ``noise_rows.size``)."""
        return int(self.positions.size)

    def item_tokens(self, item: int) -> np.ndarray:
        """Tokens of item ``item`` (a view, shape ``(length,)``)."""
        return self.tokens[self.token_offsets[item]:self.token_offsets[item + 1]]

    def spans_in_row(self, q: int) -> tuple[int, int]:
        """Token spans ``[i0, i1)`` (indices into ``positions``) that overlap training-order row ``q``.

        One ``searchsorted`` on the positions, then a walk back over the (non-overlapping, hence also sorted)
        ends: O(log n + k) for k spans in the row.
        """
        lo = q * self.sequence_length
        i1 = i0 = int(self.positions.searchsorted(lo + self.sequence_length))
        ends = self.ends
        while i0 > 0 and ends[i0 - 1] > lo:
            i0 -= 1
        return i0, i1

    def apply(self, q: int, row: np.ndarray) -> int:
        """Overwrite, in place, the planned token spans inside training-order row ``q``; O(log n + k).

        :param row: the row's tokens as read from the data, shape ``(L,)`` (any integer dtype).
        :returns: number of spans (or parts of row-crossing spans) written.
        """
        i0, i1 = self.spans_in_row(q)
        lo = q * self.sequence_length
        hi = lo + self.sequence_length
        for i in range(i0, i1):
            s, e = int(self.positions[i]), int(self.ends[i])
            a, b = max(s, lo), min(e, hi)
            off = int(self.token_offsets[self.item_ids[i]])
            row[a - lo:b - lo] = self.tokens[off + a - s:off + b - s]
        return i1 - i0

    def describe(self, window: Tuple[int, int]) -> List[str]:
        """The plan in a few lines for the run's log: items, insertions and their share of the training ``window``
        (global token positions ``[start, end)``); a plan with nothing to insert; the rows with noise."""
        size = window[1] - window[0]
        tokens = int(self.lengths.sum())
        lines = [f"{self.num_items} items, {self.num_insertions} insertions, {tokens} tokens "
                 f"({100 * tokens / max(1, size):.2f}% of the {size}-token window)"]
        if self.num_items and size == 0:
            lines.append(f"nothing inserted (no steps to train): all {self.num_items} items are dup-0 controls")
        if self.noise_rows.size:
            lines.append(f"{self.noise_rows.size} rows with gaussian noise ({self.noise_sigma})")
        return lines

    def affected_rows(self) -> np.ndarray:
        """Sorted unique training-order rows touched by any token span (``int64``)."""
        L = self.sequence_length
        first, last = self.positions // L, (self.ends - 1) // L
        extra = [np.arange(a + 1, b + 1) for a, b in zip(first[first != last], last[first != last])]
        return np.unique(np.concatenate([first] + extra)) if self.positions.size else first

    def _meta(self) -> dict:
        meta = {"sequence_length": self.sequence_length, "global_batch_size": self.global_batch_size,
                "window": [int(w) for w in self.window], "experiments": self.experiments}
        if self.noise_sigma:
            meta["noise_sigma"] = self.noise_sigma
        return meta

    def digest(self) -> str:
        """sha256 over the plan's arrays and layout (equal plans have equal digests)."""
        h = hashlib.sha256(json.dumps(self._meta(), sort_keys=True).encode())
        for k in ARRAYS:
            h.update(np.ascontiguousarray(getattr(self, k)).tobytes())
        return h.hexdigest()

    def select(self, keep) -> "Plan":
        """The plan with only the items and spans (token and noise) of the kept experiments; every kept span keeps
        its position. Item ids are renumbered in the same order.

        :param keep: experiment names, or a bool mask of shape ``(len(experiments),)``.
        :raises InsertionError: for a name that is not an experiment of the plan, or a mask of another length.
        """
        if isinstance(keep, np.ndarray) and keep.dtype == bool:
            if keep.shape != (len(self.experiments),):
                raise InsertionError(f"select: mask of shape {keep.shape} for {len(self.experiments)} experiments")
            mask = keep
        else:
            names = set(keep)
            unknown = sorted(names - set(self.experiments))
            if unknown:
                raise InsertionError(f"cannot select {unknown}: the plan's experiments are {self.experiments}")
            mask = np.array([n in names for n in self.experiments], dtype=bool)
        kept = [n for n, m in zip(self.experiments, mask) if m]
        exp_map = np.full(len(self.experiments), -1, dtype=np.int32)
        exp_map[mask] = np.arange(len(kept), dtype=np.int32)
        keep_item = mask[self.item_experiment] if self.num_items else np.zeros(0, bool)
        new_id = np.cumsum(keep_item, dtype=np.int64) - 1
        lengths = np.diff(self.token_offsets)
        keep_span = keep_item[self.span_item_ids]
        return Plan(self.sequence_length, self.global_batch_size, self.window, kept,
                    token_offsets=np.concatenate([[0], np.cumsum(lengths[keep_item])]).astype(np.int64),
                    tokens=self.tokens[np.repeat(keep_item, lengths)],
                    item_experiment=exp_map[self.item_experiment[keep_item]],
                    item_dup_count=self.item_dup_count[keep_item], span_positions=self.span_positions[keep_span],
                    span_item_ids=new_id[self.span_item_ids[keep_span]].astype(np.int32),
                    span_dup_index=self.span_dup_index[keep_span], item_noise_seed=self.item_noise_seed[keep_item],
                    noise_sigma={n: s for n, s in self.noise_sigma.items() if n in kept})

    def without(self, names) -> "Plan":
        """The plan minus the items and spans of experiments ``names`` (:meth:`select` of the others; CPDT's alone
        arms, :mod:`pretrain_exp.app.cpdt`). ``without([])`` is the same plan (equal digest).

        :raises InsertionError: for a name that is not an experiment of the plan.
        """
        unknown = sorted(set(names) - set(self.experiments))
        if unknown:
            raise InsertionError(f"cannot withhold {unknown}: the plan's experiments are {self.experiments}")
        return self.select([n for n in self.experiments if n not in set(names)])

    def then(self, later: "Plan") -> "Plan":
        """This plan's items and spans, then those of ``later`` (a run continued from this plan's run, whose window
        starts where this one's ends): item ids of ``later`` are shifted by :attr:`num_items`, its experiments
        follow this plan's, the window spans both. What a continued run's evals measure
        (:mod:`pretrain_exp.app.parent`); every span keeps its global token position.

        :raises InsertionError: for another sequence length or global batch size, or an experiment in both.
        """
        if (later.sequence_length, later.global_batch_size) != (self.sequence_length, self.global_batch_size):
            raise InsertionError(f"cannot join plans of L x B {self.sequence_length} x {self.global_batch_size} and "
                                 f"{later.sequence_length} x {later.global_batch_size}")
        both = sorted(set(self.experiments) & set(later.experiments))
        if both:
            raise InsertionError(f"cannot join plans that both hold experiment(s) {both}")
        ids = np.concatenate([self.span_item_ids, later.span_item_ids + self.num_items]).astype(np.int32)
        positions = np.concatenate([self.span_positions, later.span_positions])
        by_pos = np.argsort(positions, kind="stable")
        return Plan(self.sequence_length, self.global_batch_size, (min(self.window[0], later.window[0]),
                    max(self.window[1], later.window[1])), self.experiments + later.experiments,
                    token_offsets=np.concatenate([self.token_offsets, later.token_offsets[1:] + self.tokens.size]),
                    tokens=np.concatenate([self.tokens, later.tokens.astype(self.tokens.dtype)]),
                    item_experiment=np.concatenate([self.item_experiment,
                                                    later.item_experiment + len(self.experiments)]).astype(np.int32),
                    item_dup_count=np.concatenate([self.item_dup_count, later.item_dup_count]).astype(np.int32),
                    span_positions=positions[by_pos], span_item_ids=ids[by_pos],
                    span_dup_index=np.concatenate([self.span_dup_index, later.span_dup_index])[by_pos],
                    item_noise_seed=np.concatenate([self.item_noise_seed, later.item_noise_seed]),
                    noise_sigma={**self.noise_sigma, **later.noise_sigma})

    def save(self, path: str | Path) -> None:
        """Write ``plan.npz`` atomically (no pickled objects)."""
        atomic_write(Path(path), lambda f: np.savez(
            f, meta=np.array(json.dumps(self._meta())), **{k: getattr(self, k) for k in ARRAYS}), binary=True)

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        """Read a ``plan.npz`` written by :meth:`save` (or by the earlier layout with separate ``noise_rows``).

        :raises CheckpointError: if the file is missing or not a plan.
        """
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(str(z["meta"]))
                arrays = {k: z[k] for k in z.files if k != "meta"}
            if "positions" in arrays:  # earlier layout: token spans and noise rows in separate arrays
                arrays = _merge_spans(arrays, int(meta["sequence_length"]))
            return cls(meta["sequence_length"], meta["global_batch_size"], tuple(meta["window"]),
                       meta["experiments"], noise_sigma=meta.get("noise_sigma", {}),
                       **{k: arrays[k] for k in ARRAYS if k in arrays})
        except (OSError, KeyError, ValueError, TypeError, IndexError, zipfile.BadZipFile) as e:
            raise CheckpointError(f"{path}: not a readable plan ({e})") from None

    def write_manifest(self, path: str | Path, items: Dict[str, ItemSet],
                       natural: Optional[List[dict]] = None, span_fields: Optional[Dict[int, dict]] = None,
                       items_path: Optional[str | Path] = None) -> None:
        """Write ``manifest.jsonl`` (one line per span, by position) and ``items.jsonl`` (one per item; at
        ``items_path``, by default beside the manifest: :attr:`RunDir.items <pretrain_exp.core.rundir.RunDir.items>`
        of the manifest's folder).

        :param items: the item sets the plan was built from (for sources and texts).
        :param natural: per item, extra columns of ``items.jsonl`` (the natural-duplicate audit's counts,
            :meth:`AuditResult.item_records <pretrain_exp.insertion.audit.AuditResult.item_records>`).
        :param span_fields: global token position -> extra columns of that span's manifest line (the segment that
            decided a dynamic insertion, :mod:`~pretrain_exp.insertion.dynamic`).
        """
        path = Path(path)
        L, B = self.sequence_length, self.global_batch_size
        noised = self.item_noise_seed >= 0
        item_sha = [None if noised[i] else sha256_tokens(self.item_tokens(i)) for i in range(self.num_items)]
        step, row, offset = step_row_offset(self.span_positions, L, B)

        def manifest(f):
            for k in range(self.span_positions.size):
                it = int(self.span_item_ids[k])
                exp = self.experiments[self.item_experiment[it]]
                rec = {"position": int(self.span_positions[k]), "step": int(step[k]), "row": int(row[k]),
                       "offset": int(offset[k]), "length": int(self.span_lengths[k]), "item_id": it,
                       "experiment": exp, "dup_index": int(self.span_dup_index[k]), "sha256": item_sha[it]}
                if noised[it]:
                    rec["noise_seed"] = int(self.item_noise_seed[it])
                    rec["sigma"] = self.noise_sigma[exp]
                if span_fields:
                    rec.update(span_fields.get(rec["position"], {}))
                f.write(json.dumps(rec) + "\n")

        def item_table(f):
            for i, spec in enumerate(it for name in self.experiments for it in items[name]):
                rec = {"item_id": i, "experiment": spec.experiment, "index": spec.index,
                       "dup_count": int(self.item_dup_count[i]), "length": int(spec.tokens.size),
                       "sha256": item_sha[i], "source": redact(spec.source)}
                if natural is not None:
                    rec.update(natural[i])
                if spec.text is not None:
                    rec["text"] = spec.text
                if noised[i]:
                    rec["noise_seed"] = int(self.item_noise_seed[i])
                    rec["sigma"] = self.noise_sigma[spec.experiment]
                f.write(json.dumps(rec) + "\n")

        atomic_write(path, manifest)
        atomic_write(RunDir(path.parent).items if items_path is None else items_path, item_table)


def _merge_spans(arrays: Dict[str, np.ndarray], L: int) -> Dict[str, np.ndarray]:
    """The span arrays of an earlier-layout ``plan.npz`` (``positions``/``item_ids``/``dup_index`` plus optional
    ``noise_rows``/``noise_item_ids``/``noise_dup_index``), merged and sorted by position."""
    empty = np.empty(0, np.int64)
    pos = np.concatenate([arrays.pop("positions"), arrays.pop("noise_rows", empty) * L]).astype(np.int64)
    ids = np.concatenate([arrays.pop("item_ids"), arrays.pop("noise_item_ids", empty)]).astype(np.int32)
    dix = np.concatenate([arrays.pop("dup_index"), arrays.pop("noise_dup_index", empty)]).astype(np.int32)
    order = np.argsort(pos, kind="stable")
    return {**arrays, "span_positions": pos[order], "span_item_ids": ids[order], "span_dup_index": dix[order]}


def build_plan(items: Dict[str, ItemSet], experiments: Dict[str, InsertionExperimentConf],
               window: tuple[int, int], sequence_length: int, global_batch_size: int, seed: int,
               vocab_size: int) -> Plan:
    """Place every copy of every item and assemble the :class:`Plan`.

    :param items: experiment name -> its items (from :func:`~pretrain_exp.insertion.types.load_items`).
    :param window: ``(start, end)`` global token positions trained by the run; both multiples of ``L``.
    :returns: the plan; global item ids number the items of the experiments in sorted name order.
    :raises InsertionError: for explicit-placement violations or a window too full for the random copies.
    :raises ConfigError: for a bad range placement.

    An empty window (an evaluate-only run) places nothing: every item is a control (dup count 0), so the evals
    and their tables show what was inserted, which is nothing.
    A copy of a noise item (an item set with ``noise_sigma``) is placed like a span of ``L`` tokens, so it takes a
    whole row (explicit positions must be row starts) that no other insertion shares: a noise span.
    """
    L = sequence_length
    if window[0] % L or window[1] % L:
        raise InsertionError(f"training window [{window[0]}, {window[1]}) is not aligned to the sequence "
                             f"length {L}")
    names = sorted(items)
    keys = {n: f"insertion.experiments.{n}" for n in names}
    kinds = {n: kind_of(experiments[n], keys[n]) for n in names}  # each placement kind, resolved once
    placing = window[1] > window[0]
    drawn = [n for n in names if placing and not kinds[n].from_items]
    # the rows each experiment with drawn positions may use, checked before anything is placed
    row_ranges = {n: kinds[n].row_range(keys[n], experiments[n].placement, window, L) for n in drawn}
    sets = [items[n] for n in names]
    lengths = np.concatenate([s.lengths for s in sets]) if sets else np.empty(0, np.int64)
    dups = np.concatenate([s.dup_counts for s in sets]) if sets else np.empty(0, np.int64)
    first_item = np.cumsum([0] + [len(s) for s in sets])
    noisy = [n for n in names if items[n].noise_sigma is not None]
    is_noise = np.zeros(lengths.size, dtype=bool)
    for n in noisy:
        k = names.index(n)
        is_noise[first_item[k]:first_item[k + 1]] = True
    lengths = np.where(is_noise, L, lengths)  # placement length: a pattern takes its whole row
    occ = Occupancy()
    copy_item, copy_dup, copy_pos = [], [], []

    # explicit experiments first (all together, so overlaps between them name both items)
    if not placing:
        dups = np.zeros_like(dups)
    exp_names = [n for n in names if placing and kinds[n].from_items]
    if exp_names:
        ids, dix, pos, cross, labels = [], [], [], [], []
        for n in exp_names:
            k = names.index(n)
            for it in items[n]:
                if len(it.positions or ()) != it.dup_count:
                    raise InsertionError(f"insertion.experiments.{n} item {it.index} ({it.source}): dup "
                                         f"count {it.dup_count} but {len(it.positions or ())} explicit "
                                         "positions")
            loc_item, loc_dup = expand_copies(dups[first_item[k]:first_item[k + 1]])
            ids.append(loc_item + first_item[k])
            dix.append(loc_dup)
            pos.append(explicit_positions([it.positions for it in items[n]]))
            if n in noisy:
                for j in np.flatnonzero(pos[-1] % L)[:1]:
                    raise InsertionError(f"insertion.experiments.{n} item {loc_item[j]} "
                                         f"({items[n].source(int(loc_item[j]))}): position {pos[-1][j]} is not a "
                                         f"row start; noise covers whole rows: give row q as q * {L}")
            cross.append(np.full(loc_item.size, experiments[n].placement.allow_row_crossing))
            labels += [f"insertion.experiments.{n} item {j} ({items[n].source(int(j))})" for j in loc_item]
        ids, dix, pos = np.concatenate(ids), np.concatenate(dix), np.concatenate(pos)
        place_explicit(pos, lengths[ids], labels, window, L, np.concatenate(cross), occ)
        copy_item.append(ids), copy_dup.append(dix), copy_pos.append(pos)

    for n in drawn:
        k, pl = names.index(n), experiments[n].placement
        loc_item, loc_dup = expand_copies(dups[first_item[k]:first_item[k + 1]])
        ids = loc_item + first_item[k]
        rows = allowed_rows(keys[n], pl, row_ranges[n], window, L, global_batch_size)
        pos = place_random(lengths[ids], rows, L, experiment_rng(seed, n + "/placement"), occ, keys[n],
                           global_batch_size, pl.max_per_batch)
        copy_item.append(ids), copy_dup.append(loc_dup), copy_pos.append(pos)

    pos = np.concatenate(copy_pos) if copy_pos else np.empty(0, np.int64)
    all_item = np.concatenate(copy_item) if copy_item else np.empty(0, np.int64)
    all_dup = np.concatenate(copy_dup) if copy_dup else np.empty(0, np.int64)
    order = np.argsort(pos, kind="stable")
    seeds = np.full(lengths.size, -1, dtype=np.int64)
    for n in noisy:
        k = names.index(n)
        seeds[first_item[k]:first_item[k + 1]] = [noise_seed(seed, n, j) for j in range(len(items[n]))]
    lengths = np.where(is_noise, 0, lengths)  # a pattern has no tokens
    tok_dtype = dtype_for_vocab(vocab_size)
    return Plan(
        sequence_length=L, global_batch_size=global_batch_size, window=tuple(int(w) for w in window),
        experiments=names,
        token_offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        tokens=(np.concatenate([s.tokens.astype(tok_dtype, copy=False) for s in sets]) if len(sets) > 1
                else sets[0].tokens.astype(tok_dtype, copy=False) if sets else np.empty(0, tok_dtype)),
        item_experiment=np.repeat(np.arange(len(names), dtype=np.int32), np.diff(first_item)),
        item_dup_count=dups.astype(np.int32),
        span_positions=pos[order].astype(np.int64),
        span_item_ids=all_item[order].astype(np.int32),
        span_dup_index=all_dup[order].astype(np.int32),
        item_noise_seed=seeds,
        noise_sigma={n: float(items[n].noise_sigma) for n in noisy},
    )
