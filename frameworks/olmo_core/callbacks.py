"""OLMo-core ``Trainer`` callbacks of the ``olmo_core`` (and ``olmo2``) framework, and the one function that puts
the plan into an OLMo-core batch.

- :func:`apply_insertions`: check that a rank batch holds the run's rows and write the planned spans with
  :meth:`Plan.apply <pretrain_exp.insertion.plan.Plan.apply>` (used by :class:`Insertions` during training and by
  :meth:`OlmoCoreFramework.peek_rows <pretrain_exp.frameworks.olmo_core.framework.OlmoCoreFramework.peek_rows>` for the
  verifier);
- :class:`Insertions` (``pre_step``): the rank's rows from :func:`~pretrain_exp.data.schedule.rows_for`, checked
  and written; Gaussian-poisoning rows fed through :class:`~pretrain_exp.frameworks.noise_feed.NoiseFeed`;
- :class:`StartAt`, :class:`SaveModelConfig`, :class:`ForwardMetrics`: trainer position, ``config.json`` in every
  checkpoint, training scalars to the run's tracker;
- :class:`SegmentCheckpointer`: OLMo-core's checkpointer, the segment-end save left running in the background;
- :class:`StartupPhases`: the phases of the first fit until its first step (:mod:`pretrain_exp.core.phases`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Dict, Mapping, Optional

import numpy as np
import torch
from olmo_core.train.callbacks import Callback, CheckpointerCallback

from pretrain_exp.core.errors import TrainingError
from pretrain_exp.core.phases import FIRST_STEP, PHASES
from pretrain_exp.data.schedule import rows_for
from pretrain_exp.frameworks.base import LogFn
from pretrain_exp.frameworks.noise_feed import NoiseFeed
from pretrain_exp.frameworks.olmo_core import upstream

log = logging.getLogger(__name__)

#: OLMo-core metric -> the run's metric name
METRICS = {
    "train/CE loss": "train/loss",
    "optim/total grad norm": "train/grad_norm",
    "optim/LR (group 0)": "train/learning_rate",
    "throughput/device/TPS": "train/tokens_per_s",
    "throughput/device/MFU": "train/mfu",
}


def apply_insertions(batch: Dict[str, torch.Tensor], qs: np.ndarray, order, plan, check_tokens: bool = False,
                     where: str = "") -> int:
    """Check that OLMo-core batch ``batch`` holds training-order rows ``qs`` and write the plan's spans into it.

    :param batch: OLMo-core's batch: ``input_ids`` (LongTensor ``(n, L)``, overwritten in place) and ``index``
        (instance ids ``(n,)``, checked when present).
    :param qs: ``int64`` ``(n,)``: the training-order row of each batch row.
    :param order: the run's :class:`~pretrain_exp.data.order.DataOrder`.
    :param plan: the run's :class:`~pretrain_exp.insertion.plan.Plan` or ``None``.
    :param check_tokens: also compare every row's tokens with the files (catches another dtype or other files).
    :param where: context for the error message (``"step 3, rank 1"``).
    :returns: rows written (rows holding planned spans; only those are copied).
    :raises TrainingError: naming the first row whose instance id (or tokens) is not the run's.
    """
    ids = batch["input_ids"]
    index = batch["index"].tolist() if "index" in batch else None
    if ids.shape[0] != len(qs):
        raise TrainingError(f"{where}: OLMo-core's batch has {ids.shape[0]} rows, the schedule {len(qs)}")
    written = 0
    for i, q in enumerate(np.asarray(qs, dtype=np.int64).tolist()):
        instance = order.instance(q)[1]
        if (index is not None and index[i] != instance) or (
                check_tokens and not np.array_equal(ids[i].cpu().numpy(), order.row_tokens(q))):
            raise TrainingError(
                f"{where}: OLMo-core's batch row {i} is not training-order row {q} (instance {instance}, got "
                f"{index[i] if index else '?'}); data.seed / data.paths / sequence length differ from the "
                "checkpoint's data loader")
        first, end = plan.spans_in_row(q) if plan is not None else (0, 0)
        if end > first:
            row = ids[i].cpu().numpy().astype(np.int64)
            plan.apply(q, row)
            ids[i] = torch.from_numpy(row).to(ids.dtype)
            written += 1
    return written


class Insertions(Callback):
    """``pre_step``: the rank batch of global step ``k`` must hold rows ``rows_for(k, r, W, B)``; write the plan
    into it (:func:`apply_insertions`) and start ``noise_feed`` with those rows; ``post_train_batch`` stops it.

    The instance id of every row is checked at every step; the tokens at the first step of each fit (the object
    lives for one fit). With ``rows_log``, ``{"step", "rank", "rows": [q, ...], "sha256": [...]}`` (the tokens each
    row is trained on; ``index``: OLMo-core's instance ids) is appended to that jsonl file at every step.

    :param rows: the run's :class:`~pretrain_exp.data.rows.TrainingRows` (its ``order`` and ``plan``).
    :param dp_rank: this process's DP rank ``r``.
    :param dp_world: DP world size ``W``.
    """

    def __init__(self, rows, dp_rank: int, dp_world: int, rows_log: Optional[Path] = None,
                 noise_feed: Optional[NoiseFeed] = None):
        self.rows, self.dp_rank, self.dp_world = rows, int(dp_rank), int(dp_world)
        self.rows_log, self.noise_feed = rows_log, noise_feed
        self.checked = False

    def pre_step(self, batch: Dict[str, torch.Tensor]) -> None:
        k = self.trainer.global_step
        order = self.rows.order
        qs = rows_for(k, self.dp_rank, self.dp_world, order.global_batch_size)
        apply_insertions(batch, qs, order, self.rows.plan, check_tokens=not self.checked,
                         where=f"step {k}, rank {self.dp_rank}")
        self.checked = True
        if self.rows_log is not None:
            digests = [hashlib.sha256(r.cpu().numpy().astype(np.int64).tobytes()).hexdigest()
                       for r in batch["input_ids"]]
            index = batch["index"].tolist() if "index" in batch else None
            with open(self.rows_log, "a") as f:
                f.write(json.dumps({"step": k, "rank": self.dp_rank, "rows": qs.tolist(), "index": index,
                                    "sha256": digests}) + "\n")
        if self.noise_feed is not None:
            self.noise_feed.start(qs)

    def post_train_batch(self) -> None:
        if self.noise_feed is not None:
            self.noise_feed.stop()


class HeldMetrics:
    """A trainer's ``record_metric`` that holds the metrics other threads record until :meth:`release`.

    OLMo-core records ``checkpoint/save_async_duration_s`` in the asynchronous save's completion callback, on the
    thread that finishes the save, at whatever step each rank is on then (``Trainer.save_checkpoint_async``,
    allenai/OLMo-core PR #665). Its metrics reduction assumes every rank holds the same steps and metric names
    (``olmo_core.train.utils.reduce_metrics``: one ``all_reduce`` of a ``(steps, metrics)`` tensor per reduce type);
    a rank whose save finished a step earlier sends a tensor of another shape, and the ranks' collectives on the
    bookkeeping process group fall out of step until every rank waits forever. Held metrics are recorded by the
    training thread at a step every rank shares (:meth:`SegmentCheckpointer._save_checkpoint`).

    :param trainer: OLMo-core's ``Trainer``; its ``record_metric`` is replaced by this object (call it from the
        thread that runs ``fit``).
    """

    def __init__(self, trainer):
        self.record, self.thread = trainer.record_metric, threading.get_ident()
        self.held: list = []
        self.lock = threading.Lock()
        trainer.record_metric = self

    def __call__(self, *args, **kwargs) -> None:
        if threading.get_ident() == self.thread:
            self.record(*args, **kwargs)
            return
        with self.lock:
            self.held.append((args, kwargs))

    def release(self) -> int:
        """Record the held metrics now, at the trainer's current step; returns how many there were."""
        with self.lock:
            held, self.held = self.held, []
        for args, kwargs in held:
            self.record(*args, **kwargs)
        return len(held)


class SegmentCheckpointer(CheckpointerCallback):
    """OLMo-core's ``CheckpointerCallback`` whose save at the end of a fit (a segment's last step) is not awaited:
    with ``save_async`` OLMo-core stages the state to CPU memory and writes it in the background
    (``Trainer.save_checkpoint_async``; ``.metadata.json`` last), and the fit returns at once. :meth:`wait` (or the
    next save) joins it. Saves within a fit are OLMo-core's own.

    What a save's completion callback records is held (:class:`HeldMetrics`) and recorded at the next save's step."""

    #: seconds to wait for the previous save's completion callback once the save itself is done (it records a
    #: metric and calls ``post_checkpoint_saved``; an error there is logged by ``concurrent.futures``)
    CALLBACK_WAIT_S = 60.0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._held: Optional[HeldMetrics] = None  #: the trainer's ``record_metric`` from its first fit on
        self._callbacks_done = threading.Event()
        self._callbacks_done.set()

    def pre_train(self) -> None:
        if self._held is None:  # a trainer continued in memory keeps its callbacks: once per trainer
            self._held = HeldMetrics(self.trainer)
        super().pre_train()

    def post_train(self) -> None:
        if self.enabled and self.step > upstream.latest_checkpoint_step(self):
            upstream.saved_checkpoints(self).append(upstream.save_checkpoint(self))

    def post_checkpoint_saved(self, path) -> None:
        """Called by the trainer once a save is complete, after it recorded the save's duration (on the thread that
        finished an asynchronous save)."""
        self._callbacks_done.set()

    def _save_checkpoint(self, save_async: Optional[bool] = None, ephemeral: bool = False) -> str:
        """OLMo-core's save, and the metric ``checkpoint/hold_s``: the seconds it held the training loop (the whole
        write when synchronous; waiting for the previous save plus staging to CPU memory when asynchronous).
        Overrides OLMo-core's private save (:data:`~pretrain_exp.frameworks.olmo_core.upstream.MEMBERS` checks its
        name and parameters), which the callback's own interval saves call too. Every rank saves at the same step,
        so the metrics the previous save's completion recorded are recorded here (:class:`HeldMetrics`)."""
        from olmo_core.train.common import ReduceType

        t0 = time.perf_counter()
        upstream.await_last_checkpoint(self)  # raises the previous save's error
        if not self._callbacks_done.wait(self.CALLBACK_WAIT_S):
            log.warning("the previous checkpoint save's completion callback did not finish in %.0f s",
                        self.CALLBACK_WAIT_S)
        self._held.release()
        self._callbacks_done.clear()
        path = upstream.save_checkpoint(super(), save_async=save_async, ephemeral=ephemeral)
        self.trainer.record_metric("checkpoint/hold_s", time.perf_counter() - t0, reduce_type=ReduceType.max)
        return path

    @property
    def latest_path(self) -> Path:
        """The folder of the latest save (started; with an asynchronous save maybe still being written)."""
        return upstream.latest_checkpoint_path(self)

    def wait(self) -> None:
        """Return once the pending save (if any) is complete; re-raises its error."""
        upstream.await_last_checkpoint(self)


class SaveModelConfig(Callback):
    """``post_checkpoint_saved``: put the model's ``config.json`` into every local checkpoint (rank 0 only), so
    each one is self-describing like the published ones."""

    def __init__(self, config_json: Path, is_main: bool):
        self.config_json, self.is_main = Path(config_json), is_main

    def post_checkpoint_saved(self, path) -> None:
        if self.is_main and not str(path).startswith(("s3://", "gs://", "http")):
            tmp = Path(path) / ".config.json.tmp"
            shutil.copyfile(self.config_json, tmp)
            os.replace(tmp, Path(path) / "config.json")


class StartAt(Callback):
    """``post_checkpoint_loaded``: a checkpoint without trainer state (model-only, or converted from OLMo-2)
    leaves the trainer at step 0; put the trainer and its data loader at the run's first step ``step``
    (``tokens_per_step`` = ``B * L``)."""

    def __init__(self, step: int, tokens_per_step: int):
        self.start_step, self.tokens_per_step = int(step), int(tokens_per_step)

    def post_checkpoint_loaded(self, path) -> None:
        trainer = self.trainer
        if trainer.global_step == 0 and self.start_step > 0:
            state = trainer.data_loader.state_dict()
            state.update(batches_processed=self.start_step, tokens_processed=self.start_step * self.tokens_per_step)
            trainer.data_loader.load_state_dict(state)
            trainer.global_step = self.start_step
            trainer.global_train_tokens_seen = self.start_step * self.tokens_per_step


class ForwardMetrics(Callback):
    """Forward every scalar OLMo-core's trainer collects (losses, optimizer, throughput, system metrics) to
    ``log_fn`` at the trainer's global step: the five of :data:`METRICS` under the run's names (``train/loss``,
    ``train/grad_norm``, ``train/learning_rate``, ``train/tokens_per_s``, ``train/mfu``), every other one under its
    OLMo-core name (e.g. ``train/Z loss``, ``throughput/total tokens``)."""

    def __init__(self, log_fn: LogFn, names: Mapping[str, str] = METRICS):
        self.log_fn, self.names = log_fn, dict(names)

    def log_metrics(self, step: int, metrics) -> None:
        out = {}
        for name, value in metrics.items():
            try:
                out[self.names.get(name, name)] = float(value)
            except (TypeError, ValueError):  # a non-scalar entry: not a metric to chart
                continue
        if out:
            self.log_fn(out, step)


class StartupPhases(Callback):
    """The phases of a trainer's first ``fit`` until its first step starts, recorded in
    :data:`~pretrain_exp.core.phases.PHASES`: ``checkpoint load`` (``fit`` start to ``post_checkpoint_loaded``),
    ``engine pre-train`` (to ``pre_train``), ``engine dry run and data order`` (OLMo-core's forward/backward of a mock
    batch and its ``reshuffle``, to ``pre_epoch``), ``first batch`` (to the first ``pre_step``), and the event
    ``first step``. Later fits of the same trainer record nothing."""

    priority = 10_000  # before the other callbacks' pre_step: the step starts when the batch is in hand

    def __init__(self):
        self.t: Optional[float] = None
        self.done = False

    def fit_started(self) -> None:
        """Called by the framework right before ``Trainer.fit``."""
        if not self.done:
            self.t = time.time()

    def _phase(self, name: str) -> None:
        if self.done or self.t is None:
            return
        now = time.time()
        PHASES.add(name, now - self.t, self.t)
        self.t = now

    def post_checkpoint_loaded(self, path) -> None:
        self._phase("checkpoint load")

    def pre_train(self) -> None:
        self._phase("engine pre-train")

    def pre_epoch(self) -> None:
        self._phase("engine dry run and data order")

    def pre_step(self, batch) -> None:
        if self.done or self.t is None:
            return
        self._phase("first batch")
        PHASES.mark(FIRST_STEP, step=int(self.trainer.global_step))
        self.done = True
