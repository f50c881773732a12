"""``type: corpus_chunks``: the i.i.d. control insertion experiment.

Each item is the first ``chunk_tokens`` tokens of one row of the run's own data order that no run of this config
trains: the ``num_items`` rows just before the ``data.held_out_rows`` perplexity rows at the end of the first
epoch, i.e. training-order rows ``[R - h - n, R - h)`` for ``R`` rows per epoch, ``h`` held-out rows and ``n``
items. The items are therefore identically distributed with the training data (same corpus, same row
boundaries) and seen nowhere else in training (the experiment loop refuses a window that reaches them).

This follows the "IID Replacements" experiment of Bordt & Pawelczyk (2025), *Train Once, Answer All: Many
Pretraining Experiments for the Cost of One* (arXiv:2509.23383, Appendix B.2 and E.10), which inserts tokens
drawn from the not-trained remainder of the shuffled pretraining data. Inserting such text is ordinary training
on more of the same distribution, so it should not change the outcome of any other experiment: in a CPDT run
(:mod:`pretrain_exp.app.cpdt`) its interactions must be indistinguishable from 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterator, Optional, Tuple

import numpy as np

from pretrain_exp.core.errors import ConfigError
from pretrain_exp.insertion.items import ItemSet, LoadContext, tokenized_items
from pretrain_exp.insertion.placements import kind_of
from pretrain_exp.insertion.schema import InsertionExperimentConf
from pretrain_exp.insertion.types.base import LOSS_GAP, TypeSpec


@dataclass
class CorpusChunksConf(InsertionExperimentConf):
    """A ``type: corpus_chunks`` experiment: ``num_items`` chunks of ``chunk_tokens`` tokens of never-trained
    rows."""

    type: str = "corpus_chunks"
    chunk_tokens: int = 64  #: tokens per item (the start of one never-trained row)

    def validate(self, key: str) -> None:
        """Static checks of a ``corpus_chunks`` experiment.

        :raises ConfigError: for a file, a missing ``num_items``, ``chunk_tokens < 1`` or explicit placement,
            naming the key.
        """
        if self.file is not None:
            raise ConfigError(key, "corpus_chunks items come from the run's corpus; set neither file nor generator")
        if self.num_items is None:
            raise ConfigError(f"{key}.num_items", "required with type=corpus_chunks (one never-trained row per item)")
        if self.chunk_tokens < 1:
            raise ConfigError(f"{key}.chunk_tokens", f"must be >= 1, got {self.chunk_tokens}")
        if kind_of(self, key).from_items:
            raise ConfigError(f"{key}.placement", "explicit placement reads positions from a file; corpus_chunks "
                              "items use random or range placement")
        super().validate(key)


def control_rows(rows_per_epoch: int, num_items: int, held_out_rows: int) -> np.ndarray:
    """Training-order rows the items are cut from (module docstring): ``int64``, shape ``(num_items,)``."""
    end = rows_per_epoch - held_out_rows
    return np.arange(end - num_items, end, dtype=np.int64)


def iter_items(name: str, exp: CorpusChunksConf, order, held_out_rows: int
               ) -> Iterator[Tuple[str, list, Optional[list]]]:
    """``(source, token ids, None)`` per item; the source is ``corpus:row<q>`` (``q`` a training-order row).

    :param order: the run's :class:`~pretrain_exp.data.order.DataOrder`.
    :raises ConfigError: without a data order, or if the first epoch has too few rows.
    """
    key = f"insertion.experiments.{name}"
    if order is None:
        raise ConfigError(f"{key}.type", "corpus_chunks items are cut from the run's data order; none was given")
    rows = control_rows(order.rows_per_epoch, exp.num_items, held_out_rows)
    if rows.size and rows[0] < 0:
        raise ConfigError(f"{key}.num_items", f"{exp.num_items} rows plus data.held_out_rows={held_out_rows} "
                          f"exceed the {order.rows_per_epoch} rows of the corpus' first epoch")
    for q in rows:
        yield f"corpus:row{int(q)}", order.row_tokens(int(q))[:exp.chunk_tokens].tolist(), None


def reserved_rows(experiments: Dict[str, CorpusChunksConf]) -> int:
    """Rows that the ``corpus_chunks`` experiments (name -> config, all of this type) take before the held-out
    rows (``num_items`` of the one such experiment, 0 if none).

    :raises ConfigError: for more than one ``corpus_chunks`` experiment (they would share rows).
    """
    names = list(experiments)
    if len(names) > 1:
        raise ConfigError(f"insertion.experiments.{names[1]}.type", f"only one corpus_chunks experiment per run "
                          f"(they would cut the same rows); found {names}")
    return int(experiments[names[0]].num_items) if names else 0


def load_items(name: str, exp: CorpusChunksConf, ctx: LoadContext) -> ItemSet:
    """The chunks (:func:`iter_items` with ``ctx.order`` and ``ctx.held_out_rows``), EOS policy applied, dup counts
    assigned.

    :raises ConfigError: without a data order, or if the first epoch has too few rows.
    """
    raw = list(iter_items(name, exp, ctx.order, ctx.held_out_rows))
    return tokenized_items(name, exp, raw, ctx, text=False, what="the corpus")


TYPE = TypeSpec(CorpusChunksConf, load_items, effect=LOSS_GAP, reserved_rows=reserved_rows)
