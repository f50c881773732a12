"""The evaluator of a run: ``eval.tasks`` on each segment's checkpoint, as ``eval.mode`` says.

One interface, three variants (:func:`make_evaluator`):

- ``inline`` (:class:`Evaluator`): rank 0 evaluates after each segment while the other ranks wait at a barrier;
- ``distributed`` (:class:`DistributedEvaluator`): every rank evaluates its share of the batches of one HF dir
  (:func:`pretrain_exp.evals.shard.sharded`); with one process it is ``inline``;
- ``async`` (:class:`AsyncEvaluator`): rank 0 writes the step's HF dir and starts the evals in a process or SLURM
  job of their own (:mod:`~pretrain_exp.app.async_eval`) while training goes on, logs them as they finish and
  waits for the rest at the end (:meth:`~AsyncEvaluator.post_train`).

Every variant evaluates a checkpoint now with :meth:`Evaluator.evaluate` (the ``evaluate`` command and the
background eval process use it), writes ``evals/step<N>/<task>.json`` and logs each task's metrics to the tracker
at the checkpoint's global step (:func:`log_eval`). As a hook it evaluates the initial checkpoint in
:meth:`~Evaluator.pre_train` (``eval.on_load``, or a run of 0 steps) and every segment's checkpoint in
:meth:`~Evaluator.post_segment`; :attr:`~Evaluator.evaluated` holds what this invocation evaluated.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from pretrain_exp.app import async_eval
from pretrain_exp.app.hf_export import HFExport
from pretrain_exp.app.hooks import RunHook
from pretrain_exp.core.capabilities import SHARDED, has
from pretrain_exp.core.config import EvalConf, EvalMode
from pretrain_exp.core.distributed import barrier, init_process_group, world_size
from pretrain_exp.core.errors import TrainingError
from pretrain_exp.core.io import orphaned_temps, write_json
from pretrain_exp.core.logs import phase_progress
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.evals.base import EvalContext, EvalResult
from pretrain_exp.evals.registry import EVALS, run_eval
from pretrain_exp.evals.shard import sharded
from pretrain_exp.frameworks.base import Checkpoint

log = logging.getLogger(__name__)

#: ``(model, step) -> EvalContext``: what an eval of the checkpoint at global step ``step`` reads besides the model
ContextFn = Callable[[Any, int], EvalContext]


def log_eval(tracker, name: str, metrics: Dict[str, float], step: int) -> None:
    """Log one eval task's metrics to the tracker as ``eval/<task>/<metric>`` at global step ``step``."""
    tracker.log({f"eval/{name}/{k}": v for k, v in metrics.items()}, step)


class Evaluator(RunHook):
    """``eval.mode=inline``: the evals of a segment's checkpoint run on rank 0 after the segment.

    :param conf: the run's ``eval`` node (``tasks``, ``on_load``, ``mode``, ...).
    :param rundir: the run dir (``evals/step<N>/<task>.json``).
    :param hf: the run's HF exports (the HF dir an eval reads).
    :param context: builds the :class:`~pretrain_exp.evals.base.EvalContext` of a loaded model and step.
    :param tracker: where the metrics are logged (:class:`~pretrain_exp.app.tracking.Tracker` or ``NullTracker``).
    :param main: whether this process is rank 0 (the only one that writes and logs).
    :param initial: the run's initial checkpoint (evaluated in :meth:`pre_train` if asked).
    :param start_step: ``model.checkpoint_step``; ``end_step``: the run's last global step.
    """

    def __init__(self, conf: EvalConf, rundir: RunDir, hf: HFExport, context: ContextFn, tracker, main: bool = True,
                 initial: Optional[Checkpoint] = None, start_step: int = 0, end_step: int = 0):
        self.conf, self.rundir, self.hf, self.context = conf, rundir, hf, context
        self.tracker, self.main = tracker, main
        self.initial, self.start_step, self.end_step = initial, start_step, end_step
        self.evaluated: Dict[int, Dict[str, dict]] = {}  #: step -> task -> result, evaluated by this invocation

    def distributed(self) -> bool:
        """Whether the evals run on every rank (never for ``inline``)."""
        return False

    # --- the hooks --------------------------------------------------------------------------------------------
    def pre_train(self) -> None:
        """Evaluate the initial checkpoint if ``eval.on_load`` (or the run trains 0 steps)."""
        if self.initial is not None and (self.conf.on_load or self.start_step == self.end_step):
            self.post_segment(self.initial, final=self.start_step == self.end_step)

    def post_segment(self, ckpt: Checkpoint, final: bool) -> None:
        self.evaluated[ckpt.step] = self.evaluate_segment(ckpt, final)

    def evaluate_segment(self, ckpt: Checkpoint, final: bool) -> Dict[str, dict]:
        """Evaluate on rank 0 while the other ranks wait (``distributed``: on every rank); returns rank 0's
        results (``{}`` elsewhere)."""
        out = self.evaluate(ckpt) if self.main or self.distributed() else {}
        barrier()
        return out

    # --- evaluating now ---------------------------------------------------------------------------------------
    def evaluate(self, ckpt: Checkpoint, redo: bool = False) -> Dict[str, dict]:
        """Run every ``eval.tasks`` entry on ``ckpt`` (skipping tasks already saved for its step, unless ``redo``).

        When :meth:`distributed`, every rank calls this: rank 0 decides which tasks are pending and broadcasts
        them, every rank loads the model from one HF dir (:meth:`HFExport.shared`) and runs the evals inside
        :func:`pretrain_exp.evals.shard.sharded`, scoring its share of the batches (an eval registered
        ``sharded=False`` runs on rank 0 alone, after the others); only rank 0 writes and logs.

        :returns: task name -> saved result dict (``metrics``, ``per_dup``, ``rows``); ``{}`` on other ranks.
        """
        from transformers import AutoModelForCausalLM

        distributed = self.distributed()
        tasks = self.conf.tasks
        results, pending = {}, {}
        for name, task in tasks.items() if self.main else ():
            rec = None if redo else self.rundir.read_eval(ckpt.step, name)
            if rec is not None:
                results[name] = rec
            else:
                pending[name] = task
        if distributed:  # rank 0's view of the files decides
            names = [list(pending)]
            torch.distributed.broadcast_object_list(names, src=0)
            pending = {name: tasks[name] for name in names[0]}
            # sharded evals first (stable)
            pending = dict(sorted(pending.items(), key=lambda kv: not has(EVALS[kv[1].type].config, SHARDED)))
        if pending:
            log.info("evaluating step %d: %s%s", ckpt.step, ", ".join(pending),
                     f" (eval.mode=distributed over {world_size()} ranks)" if distributed else "")
            mine = {n: t for n, t in pending.items() if self.main or has(EVALS[t.type].config, SHARDED)}
            with (self.hf.shared(ckpt) if distributed else self.hf.read(ckpt)) as hf_dir:
                model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval() if mine else None
                if mine and torch.cuda.is_available():  # evals score on the rank's GPU (inputs follow the model)
                    model = model.to(torch.device("cuda", torch.cuda.current_device()))
                ctx = self.context(model, ckpt.step)
                bar = phase_progress(f"evaluating step {ckpt.step}", len(mine), enabled=None if self.main else False)
                with bar as progress:
                    for done, (name, task) in enumerate(mine.items(), 1):
                        t0 = time.perf_counter()
                        shard = distributed and has(EVALS[task.type].config, SHARDED)
                        with sharded() if shard else contextlib.nullcontext():
                            res: EvalResult = run_eval(task, ctx)
                        if not self.main:
                            continue
                        rec = {"task": name, "type": task.type, "step": ckpt.step, **asdict(res),
                               "seconds": time.perf_counter() - t0}
                        out = self.rundir.evals(ckpt.step, name)
                        for orphan in orphaned_temps(out):  # an earlier writer of this file killed mid-write
                            orphan.unlink(missing_ok=True)
                        write_json(out, rec)
                        log_eval(self.tracker, name, res.metrics, ckpt.step)
                        results[name] = rec
                        progress(done)
                del model, ctx
        return results if self.main else {}


class DistributedEvaluator(Evaluator):
    """``eval.mode=distributed``: every rank evaluates its share of each eval's batches (:meth:`Evaluator.evaluate`);
    with one process this is :class:`Evaluator` (``inline``)."""

    def distributed(self) -> bool:
        """Whether there is more than one process (the process group is joined here if the engine has not)."""
        return init_process_group()


class AsyncEvaluator(Evaluator):
    """``eval.mode=async``: the evals of a segment run in the background on rank 0 (module docstring); evaluating
    now (:meth:`Evaluator.evaluate`) is ``inline``.

    :param worker_config: ``() -> (config file, private)``: the config the eval processes read, ``private`` when
        it is a copy holding credentials, to be removed once they are done (called once, in :meth:`pre_train`).
    :param model_dir: the run's model dir (an HF initial model is read where it is).
    :param launcher: ``eval.async_launcher``.
    """

    def __init__(self, *args, worker_config: Callable[[], Tuple[Path, bool]], model_dir: Path, **kwargs):
        super().__init__(*args, **kwargs)
        self.worker_config, self.model_dir = worker_config, model_dir
        self.jobs: Optional[async_eval.AsyncEvals] = None  #: the background evals (rank 0, from pre_train)

    def pre_train(self) -> None:
        if self.main:
            config, private = self.worker_config()
            launcher = async_eval.resolve_launcher(self.conf.async_launcher, self.rundir.path)
            self.jobs = async_eval.AsyncEvals(self.rundir.path, config, launcher, private_config=private)
        super().pre_train()

    def evaluate_segment(self, ckpt: Checkpoint, final: bool) -> Dict[str, dict]:
        """Start the evals of ``ckpt`` in the background (rank 0); returns ``{}`` (:meth:`post_train` collects)."""
        if self.main:
            self.launch(ckpt)
        return {}

    def resumed_segment(self, step: int, final: bool) -> None:
        """On a re-run: start the evals of an earlier segment's step that are missing (its HF dir is kept until
        they are written).

        :raises TrainingError: if they are missing and the HF dir they read is gone.
        """
        if self.jobs is None or step in self.jobs.jobs or not self.missing(step):
            return
        hf_dir = self.hf.dir(step)
        if not hf_dir.is_dir():
            raise TrainingError(f"the evals of step {step} are missing and its HF model dir {hf_dir} is gone; "
                                "evaluate that checkpoint with a new run (model.path=...) or delete the run dir")
        self.launch(Checkpoint(hf_dir, step))

    def post_train(self) -> None:
        """Wait for the background evals, log them; any that failed is an error naming its step and log.

        :raises TrainingError: if one failed or ended without writing its results.
        """
        if self.jobs is None:
            return
        self.collect(wait=True)
        self.jobs.close()
        failed = self.jobs.failures()
        if failed:
            step, why = next(iter(sorted(failed.items())))
            raise TrainingError(f"the background evals of step {step} failed: {why}; re-run the same command to "
                                "run the missing evals again")
        missing = {s: self.missing(s) for s in self.jobs.jobs if self.missing(s)}
        if missing:
            raise TrainingError(f"background evals ended without writing {missing}; re-run the same command")
        for step, _ in self.rundir.async_markers():  # evals written before a kill
            if not self.missing(step):
                self.drop(step)

    def close(self) -> None:
        """The private config copy is removed once no eval process runs; background evals still running after a
        failed run are left to finish (their evals are kept; the re-run collects them)."""
        if self.jobs is not None:
            self.jobs.close()

    # --- the background jobs ----------------------------------------------------------------------------------
    def missing(self, step: int) -> list:
        """The ``eval.tasks`` not written yet for ``step``."""
        return self.rundir.missing_evals(step, self.conf.tasks)

    def launch(self, ckpt: Checkpoint) -> None:
        """Write the HF dir the evals of ``ckpt`` read (kept until they are written) and start them."""
        self.collect()
        tasks = self.missing(ckpt.step)
        if not tasks:
            return
        if ckpt.path == self.model_dir and ckpt.is_hf:  # the initial model: read where it is
            hf_dir = ckpt.path
        elif ckpt.is_hf:  # an HF checkpoint that keep_last_checkpoints may delete: its model files, linked
            hf_dir = async_eval.link_model_files(ckpt.path, self.hf.dir(ckpt.step))
        else:
            hf_dir = self.hf.export(ckpt)
        self.jobs.launch(ckpt.step, hf_dir, tasks)

    def collect(self, wait: bool = False) -> None:
        """Log the finished background evals to the tracker at their step and drop what they no longer need
        (:meth:`drop`)."""
        for step in (self.jobs.wait(self.conf.async_pending_wait_s) if wait else self.jobs.poll()):
            if step in self.jobs.failures():
                continue
            for name in self.conf.tasks:
                rec = self.rundir.read_eval(step, name)
                if rec is not None:
                    log_eval(self.tracker, name, rec["metrics"], step)
            self.drop(step)

    def drop(self, step: int) -> None:
        """Remove the marker of ``step``'s written background evals and their HF dir, unless
        ``training.export_hf`` keeps it."""
        self.rundir.eval_marker(step).unlink(missing_ok=True)
        self.hf.drop(step, self.initial.is_hf if self.initial is not None else False)


def make_evaluator(conf: EvalConf, *args, worker_config: Optional[Callable[[], Tuple[Path, bool]]] = None,
                   model_dir: Optional[Path] = None, **kwargs) -> Evaluator:
    """The evaluator of ``eval.mode`` (module docstring); the arguments are :class:`Evaluator`'s, plus those of
    :class:`AsyncEvaluator` for ``async``."""
    if conf.mode == EvalMode["async"]:
        return AsyncEvaluator(conf, *args, worker_config=worker_config, model_dir=model_dir, **kwargs)
    if conf.mode == EvalMode.distributed:
        return DistributedEvaluator(conf, *args, **kwargs)
    return Evaluator(conf, *args, **kwargs)
