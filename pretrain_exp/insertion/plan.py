"""The insertion :class:`Plan`: every insertion of a run as sorted arrays, saved without pickling.

A plan holds the items (CSR token storage, one entry per item including never-inserted controls) and the
insertions (one entry per copy: global token position, item, dup index), sorted by position and
non-overlapping. :meth:`Plan.apply` is the only code that writes inserted tokens into training rows.

Files (written atomically): ``plan.npz`` (``numpy.savez``; load with ``allow_pickle=False``),
``manifest.jsonl`` (one line per insertion: ``position, step, row, offset, length, item_id, experiment,
dup_index, sha256``) and ``items.jsonl`` (one line per item: ``item_id, experiment, index, dup_count, length,
sha256, source`` and ``text`` for text items).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List

import numpy as np

from pretrain_exp.config import InsertionExperimentConf, PlacementKind
from pretrain_exp.data.order import step_row_offset
from pretrain_exp.data.token_files import dtype_for_vocab
from pretrain_exp.errors import CheckpointError, InsertionError
from pretrain_exp.insertion.placement import (Occupancy, expand_copies, explicit_positions, place_explicit,
                                              place_random, row_range)
from pretrain_exp.insertion.sources import ItemSpec, experiment_rng, sha256_tokens


@dataclass
class Plan:
    """All insertions of a run.

    Item arrays have shape ``(num_items,)``, insertion arrays ``(num_insertions,)``.
    """

    sequence_length: int
    global_batch_size: int
    window: tuple  #: ``(start, end)`` global token positions of the training window
    experiments: List[str]  #: experiment names; ``item_experiment`` indexes this list
    token_offsets: np.ndarray  #: int64 ``(num_items + 1,)``: item i's tokens are ``tokens[off[i]:off[i+1]]``
    tokens: np.ndarray  #: uint16/uint32 ``(sum of item lengths,)``
    item_experiment: np.ndarray  #: int32 ``(num_items,)``
    item_dup_count: np.ndarray  #: int32 ``(num_items,)``; 0 = control
    positions: np.ndarray  #: int64 ``(num_insertions,)``, sorted ascending
    item_ids: np.ndarray  #: int32 ``(num_insertions,)``
    dup_index: np.ndarray  #: int32 ``(num_insertions,)``: which copy of its item (0-based)
    ends: np.ndarray = field(init=False)  #: int64, ``positions + lengths`` (derived)

    def __post_init__(self):
        self.lengths = np.diff(self.token_offsets).astype(np.int64)[self.item_ids]  #: int64 per insertion
        self.ends = self.positions + self.lengths

    @property
    def num_items(self) -> int:
        return int(self.item_experiment.size)

    @property
    def num_insertions(self) -> int:
        return int(self.positions.size)

    def item_tokens(self, item: int) -> np.ndarray:
        """Tokens of item ``item`` (a view, shape ``(length,)``)."""
        return self.tokens[self.token_offsets[item]:self.token_offsets[item + 1]]

    def apply(self, q: int, row: np.ndarray) -> int:
        """Overwrite, in place, the planned spans inside training-order row ``q``.

        O(log n + k) for k spans in the row (two ``searchsorted`` on the sorted positions/ends).

        :param row: the row's tokens as read from the data, shape ``(L,)`` (any integer dtype).
        :returns: number of spans (or parts of row-crossing spans) written.
        """
        L = self.sequence_length
        lo = q * L
        i0 = int(np.searchsorted(self.ends, lo, side="right"))
        i1 = int(np.searchsorted(self.positions, lo + L, side="left"))
        for i in range(i0, i1):
            s, e = int(self.positions[i]), int(self.ends[i])
            a, b = max(s, lo), min(e, lo + L)
            off = int(self.token_offsets[self.item_ids[i]])
            row[a - lo:b - lo] = self.tokens[off + a - s:off + b - s]
        return i1 - i0

    def affected_rows(self) -> np.ndarray:
        """Sorted unique training-order rows touched by any insertion (``int64``)."""
        L = self.sequence_length
        first, last = self.positions // L, (self.ends - 1) // L
        extra = [np.arange(a + 1, b + 1) for a, b in zip(first[first != last], last[first != last])]
        return np.unique(np.concatenate([first] + extra)) if self.positions.size else first

    def digest(self) -> str:
        """sha256 over the plan's arrays and layout (equal plans have equal digests)."""
        h = hashlib.sha256(json.dumps([self.sequence_length, self.global_batch_size, list(map(int, self.window)),
                                       self.experiments]).encode())
        for a in (self.token_offsets, self.tokens, self.item_experiment, self.item_dup_count, self.positions,
                  self.item_ids, self.dup_index):
            h.update(np.ascontiguousarray(a).tobytes())
        return h.hexdigest()

    def save(self, path: str | Path) -> None:
        """Write ``plan.npz`` atomically (no pickled objects)."""
        meta = json.dumps({"sequence_length": self.sequence_length, "global_batch_size": self.global_batch_size,
                           "window": [int(w) for w in self.window], "experiments": self.experiments})
        _atomic(Path(path), lambda f: np.savez(
            f, meta=np.array(meta), token_offsets=self.token_offsets, tokens=self.tokens,
            item_experiment=self.item_experiment, item_dup_count=self.item_dup_count, positions=self.positions,
            item_ids=self.item_ids, dup_index=self.dup_index), binary=True)

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        """Read a ``plan.npz`` written by :meth:`save`.

        :raises CheckpointError: if the file is missing or not a plan.
        """
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(str(z["meta"]))
                arrays = {k: z[k] for k in z.files if k != "meta"}
        except (OSError, KeyError, ValueError, zipfile.BadZipFile) as e:
            raise CheckpointError(f"{path}: not a readable plan ({e})") from None
        return cls(meta["sequence_length"], meta["global_batch_size"], tuple(meta["window"]), meta["experiments"],
                   **arrays)

    def write_manifest(self, path: str | Path, items: List[ItemSpec]) -> None:
        """Write ``manifest.jsonl`` (one line per insertion) and, beside it, ``items.jsonl`` (one per item)."""
        path = Path(path)
        L, B = self.sequence_length, self.global_batch_size
        item_sha = [sha256_tokens(self.item_tokens(i)) for i in range(self.num_items)]
        step, row, offset = step_row_offset(self.positions, L, B)

        def manifest(f):
            for k in range(self.num_insertions):
                it = int(self.item_ids[k])
                f.write(json.dumps({
                    "position": int(self.positions[k]), "step": int(step[k]), "row": int(row[k]),
                    "offset": int(offset[k]), "length": int(self.lengths[k]), "item_id": it,
                    "experiment": self.experiments[self.item_experiment[it]], "dup_index": int(self.dup_index[k]),
                    "sha256": item_sha[it]}) + "\n")

        def item_table(f):
            for i, spec in enumerate(items):
                rec = {"item_id": i, "experiment": spec.experiment, "index": spec.index,
                       "dup_count": int(self.item_dup_count[i]), "length": int(self.token_offsets[i + 1]
                                                                             - self.token_offsets[i]),
                       "sha256": item_sha[i], "source": spec.source}
                if spec.text is not None:
                    rec["text"] = spec.text
                f.write(json.dumps(rec) + "\n")

        _atomic(path, manifest)
        _atomic(path.with_name("items.jsonl"), item_table)


def _atomic(path: Path, write, binary: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb" if binary else "w") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def build_plan(items: Dict[str, List[ItemSpec]], experiments: Dict[str, InsertionExperimentConf],
               window: tuple[int, int], sequence_length: int, global_batch_size: int, seed: int,
               vocab_size: int) -> tuple[Plan, List[ItemSpec]]:
    """Place every copy of every item and assemble the :class:`Plan`.

    :param items: experiment name -> its items (from :func:`~pretrain_exp.insertion.sources.load_items`).
    :param window: ``(start, end)`` global token positions trained by the run; both multiples of ``L``.
    :returns: the plan and the flat item list (global item id = list index: experiments by sorted name).
    :raises InsertionError: for explicit-placement violations or a window too full for the random copies.
    :raises ConfigError: for a bad range placement.
    """
    L = sequence_length
    if window[0] % L or window[1] % L:
        raise InsertionError(f"training window [{window[0]}, {window[1]}) is not aligned to the sequence length {L}")
    names = sorted(items)
    flat: List[ItemSpec] = [it for n in names for it in items[n]]
    lengths = np.asarray([it.tokens.size for it in flat], dtype=np.int64)
    dups = np.asarray([it.dup_count for it in flat], dtype=np.int64)
    first_item = np.cumsum([0] + [len(items[n]) for n in names])
    occ = Occupancy()
    copy_item, copy_dup, copy_pos = [], [], []

    # explicit experiments first (all together, so overlaps between them name both items)
    exp_names = [n for n in names if experiments[n].placement.kind == PlacementKind.explicit]
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
            cross.append(np.full(loc_item.size, experiments[n].placement.allow_row_crossing))
            labels += [f"insertion.experiments.{n} item {flat[i].index} ({flat[i].source})" for i in ids[-1]]
        ids, dix, pos = np.concatenate(ids), np.concatenate(dix), np.concatenate(pos)
        place_explicit(pos, lengths[ids], labels, window, L, np.concatenate(cross), occ)
        copy_item.append(ids), copy_dup.append(dix), copy_pos.append(pos)

    for k, n in enumerate(names):
        exp = experiments[n]
        if exp.placement.kind == PlacementKind.explicit:
            continue
        loc_item, loc_dup = expand_copies(dups[first_item[k]:first_item[k + 1]])
        ids = loc_item + first_item[k]
        rows = row_range(f"insertion.experiments.{n}", exp, window, L)
        pos = place_random(lengths[ids], rows, L, experiment_rng(seed, n + "/placement"), occ,
                           f"insertion.experiments.{n}")
        copy_item.append(ids), copy_dup.append(loc_dup), copy_pos.append(pos)

    pos = np.concatenate(copy_pos) if copy_pos else np.empty(0, np.int64)
    order = np.argsort(pos, kind="stable")
    cat = (lambda parts: np.concatenate(parts)[order] if parts else np.empty(0, np.int64))
    tok_dtype = dtype_for_vocab(vocab_size)
    plan = Plan(
        sequence_length=L, global_batch_size=global_batch_size, window=tuple(int(w) for w in window),
        experiments=names,
        token_offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        tokens=(np.concatenate([it.tokens for it in flat]) if flat else np.empty(0)).astype(tok_dtype),
        item_experiment=np.repeat(np.arange(len(names), dtype=np.int32), np.diff(first_item)),
        item_dup_count=dups.astype(np.int32),
        positions=pos[order].astype(np.int64),
        item_ids=cat(copy_item).astype(np.int32),
        dup_index=cat(copy_dup).astype(np.int32),
    )
    return plan, flat
