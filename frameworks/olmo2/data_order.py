"""Where an OLMo-2 checkpoint stands in its data (``train.pt``) and how to continue its data order (``config.yaml``).

OLMo-2's order (allenai/OLMo ``olmo/data/iterable_dataset.py`` ``IterableDataset._build_global_indices``, built by
``olmo/data/__init__.py`` ``build_train_dataloader``): the token files ``data.paths`` (or ``data.datasets``, its
labels sorted, paths concatenated) are cut into instances of ``model.max_sequence_length`` tokens
(``MemMapDataset``), epoch ``e`` (counted from 0) shuffles ``arange(N, uint32)`` with
``numpy.random.Generator(PCG64(seed + e))`` where ``seed = data.seed`` if set else ``seed``, and each optimizer
step takes the next ``global_train_batch_size`` instances. That is this project's
:class:`~pretrain_exp.data.order.DataOrder` with ``first_epoch=0``; equivalently ``first_epoch=1`` (OLMo-core's
count, used here) with seed ``S - 1`` for OLMo-2 seed ``S``.

Limits:

- only checkpoints inside their first epoch (``epoch == 0``) whose data position is exactly ``global_step``
  global batches (no ``fast_forward_batches``, no batch-size change mid-run) are continued;
- the epoch's last global batch may differ: OLMo-2 trims an epoch to a multiple of its world size
  (``drop_last``), the project to a multiple of the global batch size; every earlier row is identical;
- ``data.instance_filter`` does not change the order; it masks the loss of repetitive instances. It is returned
  as :attr:`DataOrderParams.instance_filter` for a framework that applies it (OLMo-core's
  ``NumpyDatasetConfig.instance_filter_config`` computes the same mask); a framework that does not apply it
  trains on those instances;
- token files must be local paths (or ``http(s)`` URLs for a reader that fetches them); object-store paths
  (``s3://``, ``gs://``, ``weka://``, ...) must be mapped to a local mirror with ``path_prefixes``;
- token files are read as ``data.memmap_dtype`` (authoritative: OLMo writes ``uint32`` files even for a small
  vocabulary); without it, as the vocabulary's dtype (:func:`~pretrain_exp.data.token_files.dtype_for_vocab`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

import numpy as np

from pretrain_exp.core.errors import CheckpointError, ConfigError
from pretrain_exp.data.token_files import dtype_for_vocab

log = logging.getLogger(__name__)

LOCAL_OR_HTTP = ("http://", "https://", "file://")


@dataclass(frozen=True)
class TrainPosition:
    """The trainer position saved in ``train.pt`` (names as OLMo's ``Trainer.trainer_state_dict``)."""

    global_step: int  #: optimizer steps done; the next step is ``global_step + 1``
    global_train_tokens_seen: int  #: tokens trained on so far
    epoch: int  #: OLMo-2's epoch count (from 0)
    global_train_examples_seen_this_epoch: int  #: instances (rows) consumed in ``epoch``
    world_size: Optional[int]  #: data-parallel processes of the run that wrote it


def train_position(train_state: Dict[str, Any]) -> TrainPosition:
    """The :class:`TrainPosition` of a loaded ``train.pt`` (OLMo's ``load_trainer_state_dict`` fallbacks are not
    applied: OLMo-2 checkpoints carry every field).

    :raises CheckpointError: if a field is missing or not an integer.
    """
    try:
        return TrainPosition(
            global_step=int(train_state["global_step"]),
            global_train_tokens_seen=int(train_state["global_train_tokens_seen"]),
            epoch=int(train_state.get("epoch") or 0),
            global_train_examples_seen_this_epoch=int(train_state["global_train_examples_seen_this_epoch"]),
            world_size=int(train_state["world_size"]) if train_state.get("world_size") is not None else None,
        )
    except KeyError as e:
        raise CheckpointError(f"train.pt: no {e.args[0]!r} (not an OLMo-2 trainer state)") from None
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"train.pt: a position field is not an integer ({e})") from None


@dataclass(frozen=True)
class DataOrderParams:
    """The data order of an OLMo-2 run, in this project's terms (see the module docstring)."""

    paths: List[str]  #: token files in instance-id order
    seed: int  #: data-order seed for ``first_epoch`` (OLMo-2 seed - 1)
    first_epoch: int  #: 1 (OLMo-core's count)
    sequence_length: int  #: L = ``model.max_sequence_length``
    global_batch_size: int  #: B = ``global_train_batch_size``, in instances
    checkpoint_step: int  #: S = ``train.pt`` ``global_step``; training continues at position S*B*L
    memmap_dtype: str  #: ``data.memmap_dtype``
    olmo2_seed: int  #: the seed as OLMo-2 uses it (``data.seed`` or ``seed``)
    instance_filter: Optional[Dict[str, int]] = field(default=None)  #: ``data.instance_filter`` or None

    def overrides(self) -> Dict[str, Any]:
        """The project config values that reproduce this order: dotted key -> value (``data.paths``,
        ``data.seed``, ``data.first_epoch``, ``training.sequence_length``, ``training.global_batch_size``,
        ``model.checkpoint_step``)."""
        return {
            "data.paths": list(self.paths),
            "data.seed": self.seed,
            "data.first_epoch": self.first_epoch,
            "training.sequence_length": self.sequence_length,
            "training.global_batch_size": self.global_batch_size,
            "model.checkpoint_step": self.checkpoint_step,
        }


def _data_paths(data: Dict[str, Any], prefixes: Mapping[str, str], remote_ok: bool = False) -> List[str]:
    if data.get("custom_dataset"):
        raise ConfigError("data.custom_dataset", "config.yaml: custom datasets are not reproduced; only token files")
    paths, datasets = data.get("paths"), data.get("datasets")
    if paths and datasets:
        raise ConfigError("data.paths", "config.yaml: data.paths and data.datasets are mutually exclusive")
    if paths:
        out = [str(p) for p in paths]
    elif datasets:  # OLMo's build_memmap_dataset: labels sorted, their paths concatenated
        out = [str(p) for label in sorted(datasets) for p in datasets[label]]
    else:
        raise ConfigError("data.paths", "config.yaml: no token files (set data.paths or data.datasets)")
    mapped = []
    for p in out:
        for old, new in prefixes.items():
            if p.startswith(old):
                p = new + p[len(old):]
                break
        if "://" in p and not p.startswith(LOCAL_OR_HTTP) and not remote_ok:
            raise ConfigError("data.paths", f"config.yaml: {p} is not a local path or http(s) URL; map its prefix "
                                            f"to a local mirror (path_prefixes={{'{p.split('://')[0]}://...': "
                                            f"'/local/dir/'}})")
        mapped.append(p)
    return mapped


def data_order(config: Dict[str, Any], position: TrainPosition, *,
               path_prefixes: Optional[Mapping[str, str]] = None, remote_ok: bool = False) -> DataOrderParams:
    """The data order that continues an OLMo-2 run from ``position``.

    :param config: the whole ``config.yaml`` dict.
    :param position: from :func:`train_position`.
    :param path_prefixes: ``{old prefix: new prefix}`` applied to each token-file path (first match wins),
        e.g. ``{"s3://ai2-llm/": "/data/ai2-llm/"}``.
    :param remote_ok: keep ``s3://``-style paths as they are (for a caller that reads its token files from
        elsewhere and only compares names).
    :raises ConfigError: naming the ``config.yaml`` key for settings that change the data or its loss mask in a
        way not reproduced (``data.custom_dataset``, ``data.label_mask_paths``, ``data.generate_doc_lengths``),
        missing or remote token files, or a ``data.memmap_dtype`` that is not the vocabulary's dtype.
    :raises CheckpointError: if the checkpoint is past its first epoch or its data position is not
        ``global_step`` global batches.
    """
    data = config.get("data") or {}
    model = config.get("model") or {}
    for key in ("label_mask_paths", "generate_doc_lengths"):
        if data.get(key):
            raise ConfigError(f"data.{key}", f"config.yaml: {data[key]!r} is not reproduced (it changes the loss "
                                             f"mask or attention of the training rows)")
    paths = _data_paths(data, path_prefixes or {}, remote_ok)
    L = model.get("max_sequence_length", 1024)
    B = config.get("global_train_batch_size", 512)
    for key, value in (("model.max_sequence_length", L), ("global_train_batch_size", B)):
        if not isinstance(value, int) or value <= 0:
            raise ConfigError(key, f"config.yaml: must be a positive integer, got {value!r}")
    vocab = model.get("embedding_size") or model.get("vocab_size", 50257)
    memmap_dtype = str(data.get("memmap_dtype") or dtype_for_vocab(vocab).name)
    if np.dtype(memmap_dtype) not in (np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.uint32),
                                      np.dtype(np.uint64)) or np.iinfo(memmap_dtype).max < vocab - 1:
        raise ConfigError("data.memmap_dtype", f"config.yaml: {memmap_dtype} cannot hold the ids of a {vocab}-token "
                                               "vocabulary")
    seed = data.get("seed")
    seed = config.get("seed", 6198) if seed is None else seed
    if position.epoch != 0:
        raise CheckpointError(f"train.pt: epoch {position.epoch}; only checkpoints in their first epoch (0) are "
                              f"continued in OLMo-2's order")
    if position.global_train_examples_seen_this_epoch != position.global_step * B:
        raise CheckpointError(
            f"train.pt: {position.global_train_examples_seen_this_epoch} instances seen at step {position.global_step}"
            f", not step x global_train_batch_size = {position.global_step * B}; the order cannot be continued")
    if position.global_train_tokens_seen != position.global_step * B * L:
        log.warning("train.pt: %d tokens seen, not step x B x L = %d", position.global_train_tokens_seen,
                    position.global_step * B * L)
    filt = data.get("instance_filter")
    if filt is not None:
        filt = {k: int(filt[k]) for k in ("repetition_max_period", "repetition_min_period", "repetition_max_count")
                if k in filt}
        log.info("config.yaml: data.instance_filter %s masks the loss of repetitive instances (the order is "
                 "unchanged)", filt)
    return DataOrderParams(paths=paths, seed=int(seed) - 1, first_epoch=1, sequence_length=L, global_batch_size=B,
                           checkpoint_step=position.global_step, memmap_dtype=memmap_dtype, olmo2_seed=int(seed),
                           instance_filter=filt)
