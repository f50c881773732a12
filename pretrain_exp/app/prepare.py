"""Everything a run decides before step 1, as plain data: :func:`prepare` ``(cfg) -> RunContext``.

1. the model (asset or dir) and tokenizer, the corpus tokenized if needed, the data order (:func:`run_data`); remote
   token files: the window's rows fetched now (``data.prefetch=window``), or a
   :class:`~pretrain_exp.data.stream.WindowStream` made ready to fetch them beside training (``stream``, the
   default; started by the loop's ``pre_train`` hook, :mod:`~pretrain_exp.app.stream_hook`);
2. the held-out rows (a null ``data.held_out_rows`` resolved into :attr:`RunContext.held_out_rows`, the config left
   as validated; :func:`fit_held_out`, :func:`held_out_collision`);
3. the items, placed in the training window ``[S*B*L, (S+n)*B*L)``: the :class:`~pretrain_exp.insertion.plan.Plan`
   and its owner :class:`~pretrain_exp.app.run_plan.RunPlan` (with the decisions of dynamic insertion saved in the
   run dir); ``plan.npz`` + ``manifest.jsonl`` saved (or the plan already in the run dir checked to be identical);
   the natural-duplicate audit (``insertion.audit``, :mod:`~pretrain_exp.app.audit_hook`: ``strict`` now; ``on``
   made ready to run beside training, started by its ``pre_train`` hook);
4. the plan verified on the batches the framework will train (its ``peek_rows`` for every affected step and DP rank,
   :func:`~pretrain_exp.insertion.verify.verify_batches`; rank 0).

Nothing here starts a process: the torchrun launcher prepares a run only to surface config and data errors before
the ranks start, and a background eval (:mod:`~pretrain_exp.app.eval_worker`) prepares one to read its plan, tokenizer
and held-out rows (:meth:`RunContext.eval_context`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from pathlib import Path
from typing import Any, Optional, Tuple

import numpy as np

from pretrain_exp.app.audit_hook import RunAudit
from pretrain_exp.app.config import ExperimentConfig
from pretrain_exp.app.parent import ParentRun
from pretrain_exp.app.run_plan import PlanHistory, RunPlan
from pretrain_exp.core.config import DEFAULT_HELD_OUT_ROWS
from pretrain_exp.core.distributed import is_main_process, world_size
from pretrain_exp.core.errors import ConfigError
from pretrain_exp.core.phases import PHASES
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.data.hf_dataset import tokenize_dataset
from pretrain_exp.data.order import DataOrder, step_window
from pretrain_exp.data.prefetch import prefetch_rows, prefetch_window, resolve_prefetch
from pretrain_exp.data.rows import TrainingRows
from pretrain_exp.data.stream import WindowStream
from pretrain_exp.data.token_files import TokenFiles, dtype_for_vocab
from pretrain_exp.data.tokenize import load_tokenizer, tokenize_sources
from pretrain_exp.evals.base import EvalContext
from pretrain_exp.frameworks.registry import get_framework_class
from pretrain_exp.insertion.items import LoadContext
from pretrain_exp.insertion.plan import Plan, build_plan
from pretrain_exp.insertion.schema import InsertionConf
from pretrain_exp.insertion.types import load_items, reserved_rows
from pretrain_exp.insertion.verify import rows_to_verify, verify_batches

log = logging.getLogger(__name__)


@dataclasses.dataclass
class RunContext:
    """A prepared run (module docstring): what it decided before step 1.

    :param cfg: the validated config (never rewritten here).
    :param rundir: the run dir; ``main``: whether this process is rank 0 (the only one that writes).
    :param framework: the run's :class:`~pretrain_exp.frameworks.base.Framework`; ``tokenizer``, ``vocab_size``.
    :param order: the data order; ``window``: the training window ``(first, end)`` in global token positions.
    :param window_fetched: whether the window's token files are local, prefetched or streamed.
    :param held_out_rows: the held-out (perplexity) rows, ``data.held_out_rows`` resolved.
    :param plan: the plan's owner; ``rows``: the training rows (they read its current plan).
    :param auditor: the natural-duplicate audit (a hook: ``insertion.audit=on`` starts in ``pre_train``).
    :param stream: ``data.prefetch=stream``: the window stream, not started (:mod:`~pretrain_exp.app.stream_hook`).
    """

    cfg: ExperimentConfig
    rundir: RunDir
    main: bool
    framework: Any
    tokenizer: Any
    vocab_size: int
    order: DataOrder
    window: Tuple[int, int]
    window_fetched: bool
    held_out_rows: int
    plan: RunPlan
    rows: TrainingRows
    auditor: RunAudit
    stream: Optional[WindowStream] = None

    @property
    def L(self) -> int:  # noqa: N802  (the house's name for the sequence length)
        """``training.sequence_length``."""
        return self.cfg.training.sequence_length

    @property
    def B(self) -> int:  # noqa: N802
        """``training.global_batch_size``."""
        return self.cfg.training.global_batch_size

    @property
    def start_step(self) -> int:
        """The global step the run starts from (``model.checkpoint_step``)."""
        return self.cfg.model.checkpoint_step

    @property
    def end_step(self) -> int:
        """The run's last global step."""
        return self.start_step + self.cfg.training.num_steps

    @functools.cached_property
    def held_out(self) -> np.ndarray:
        """The held-out rows' tokens, read once: ``int64`` array of shape ``(held_out_rows, L)``."""
        rows = self.order.held_out_rows(self.held_out_rows)
        return np.stack([self.order.row_tokens(int(q)) for q in rows]) if rows.size else np.empty((0, self.L), np.int64)

    @functools.cached_property
    def parent(self) -> Optional[ParentRun]:
        """The finished run this one continues (``parent=``, :mod:`~pretrain_exp.app.parent`), if any."""
        return ParentRun.open(self.cfg.parent) if self.cfg.parent else None

    @functools.cached_property
    def parent_measured(self) -> Tuple[Optional[Plan], Optional[InsertionConf]]:
        """A continued run's evals: the parent's plan and its experiments beside this run's."""
        if self.parent is None:
            return None, None
        ins = dataclasses.replace(self.cfg.insertion, experiments={**self.parent.experiments(),
                                                                   **self.cfg.insertion.experiments})
        return self.parent.plan(), ins

    def eval_plan(self, step: int) -> Plan:
        """What the evals of checkpoint ``step`` measure: the plan as of ``step`` (:meth:`RunPlan.as_of
        <pretrain_exp.app.run_plan.RunPlan.as_of>`), after a continued run's parent's plan (:meth:`Plan.then
        <pretrain_exp.insertion.plan.Plan.then>`)."""
        plan, (before, _) = self.plan.as_of(step), self.parent_measured
        return plan if before is None else before.then(plan)

    def eval_context(self, model, step: int) -> EvalContext:
        """What an eval of the checkpoint at global step ``step`` reads besides ``model``."""
        e = self.cfg.eval
        return EvalContext(model, self.tokenizer, self.eval_plan(step), self.held_out, step, e.batch_size,
                           self.cfg.seed, self.cfg.cache_dir, row_tokens=self.rows.row,
                           insertion=self.parent_measured[1] or self.cfg.insertion, permutations=e.permutations,
                           p_adjust=e.p_adjust)

    def verify_segment(self, a: int, b: int) -> None:
        """Verify the spans inside steps ``a+1 .. b`` (static and dynamic) on the framework's batches."""
        p, span = self.plan.current, self.L * self.B
        keep = (p.span_positions >= a * span) & (p.span_positions + p.span_lengths <= b * span)
        sub = Plan(p.sequence_length, p.global_batch_size, p.window, p.experiments, p.token_offsets, p.tokens,
                   p.item_experiment, p.item_dup_count, p.span_positions[keep], p.span_item_ids[keep],
                   p.span_dup_index[keep], p.item_noise_seed, p.noise_sigma)
        verify_batches(sub, functools.partial(self.framework.peek_rows, self.rows), self.order.row_tokens,
                       (a * self.B, b * self.B), world_size(), seed=self.cfg.seed + a)


def prepare(cfg: ExperimentConfig) -> RunContext:
    """Prepare the run of ``cfg`` (module docstring) without starting a process or changing ``cfg``.

    :raises ConfigError: (``data.held_out_rows``) for held-out rows the run may train; a
        :class:`RunDirConflict` for a run dir whose plan or items differ from this config's.
    :raises InsertionError: for a plan that does not fit or does not land (verification), or a control found in the
        window under ``insertion.audit=strict``.
    """
    rundir = RunDir(Path(cfg.run_dir).resolve())
    rundir.path.mkdir(parents=True, exist_ok=True)
    main = is_main_process()  # only rank 0 writes files, logs and evaluates
    framework, tokenizer, vocab_size, order = run_data(cfg, progress=main)
    t = cfg.training
    first, count = cfg.model.checkpoint_step * t.global_batch_size, t.num_steps * t.global_batch_size
    window = step_window(cfg.model.checkpoint_step, t.num_steps, t.sequence_length, t.global_batch_size)
    with PHASES.phase("permutation", instances=order.num_instances) as rec:
        rec["cached"] = order.prepare(first, count)
    window_fetched, stream = _fetch_window(cfg, order, main)
    held_out_rows = resolve_held_out(cfg, order, window, main)
    auditor = RunAudit(cfg.insertion, rundir, order, window, held_out_rows, tokenizer.eos_token_id, cfg.cache_dir,
                       window_fetched)
    plan = plan_run(cfg, rundir, order, window, tokenizer, vocab_size, held_out_rows, auditor, main)
    rows = plan.rows = TrainingRows(order, plan.current, first, count)
    ctx = RunContext(cfg, rundir, main, framework, tokenizer, vocab_size, order, window, window_fetched,
                     held_out_rows, plan, rows, auditor, stream)
    current = plan.current
    if main and cfg.insertion.verify and current.num_insertions:
        span = (rows.first_row, rows.first_row + len(rows))
        with PHASES.phase("verify", rows=int(current.affected_rows().size)):
            if stream is not None:  # the rows the verifier reads, fetched before the stream starts
                prefetch_rows(order, rows_to_verify(current, span, seed=cfg.seed))
            verify_batches(current, functools.partial(framework.peek_rows, rows), order.row_tokens, span,
                           world_size(), seed=cfg.seed)
    return ctx


def _fetch_window(cfg: ExperimentConfig, order: DataOrder, main: bool) -> Tuple[bool, Optional[WindowStream]]:
    """``data.prefetch``: fetch the window's remote rows now (``window``), or make the stream that fetches them
    beside training (``stream``, not started). Returns ``(whether the window is local or fetched, the stream)``."""
    t = cfg.training
    first, count = cfg.model.checkpoint_step * t.global_batch_size, t.num_steps * t.global_batch_size
    prefetch = resolve_prefetch(cfg.data.prefetch, order.files)
    fetched = prefetch in ("window", "stream") or not any(order.files.remote)
    if prefetch == "window":  # remote rows of the run, fetched once
        with PHASES.phase("prefetch", mode="window") as rec:
            rec["fetched_bytes"] = prefetch_window(order, first, count, progress=main).fetched_bytes
    elif prefetch == "stream" and t.num_steps:
        return fetched, WindowStream(order, first, count, ahead_steps=cfg.data.prefetch_ahead_steps)
    return fetched, None


def resolve_held_out(cfg: ExperimentConfig, order: DataOrder, window: Tuple[int, int], main: bool = True) -> int:
    """``data.held_out_rows``, a null one resolved (:func:`fit_held_out`, logged when fewer than the default fit);
    held-out rows that the run or the checkpoint may train are refused.

    :raises ConfigError: (``data.held_out_rows``) for a set value, or ``corpus_chunks`` rows, that collide.
    """
    reserved = reserved_rows(cfg.insertion.experiments)
    L = cfg.training.sequence_length
    span = (window[0] // L, window[1] // L, order.rows_per_epoch,
            "data.paths" in cfg.framework.checkpoint_keys() and cfg.model.init != "random")
    n = cfg.data.held_out_rows
    if n is None:
        n = fit_held_out(DEFAULT_HELD_OUT_ROWS, reserved, *span)
        if n < DEFAULT_HELD_OUT_ROWS and main:
            log.warning("data.held_out_rows: %d held-out row(s) at the end of the first epoch (not %d): the run%s "
                        "trains the rows before them%s; set data.held_out_rows to choose", n,
                        DEFAULT_HELD_OUT_ROWS, " and the checkpoint" if span[3] else "",
                        " (no held-out perplexity)" if n == 0 else "")
    why = held_out_collision(n + reserved, *span)
    if why:
        raise ConfigError("data.held_out_rows", f"{why} (perplexity rows and corpus_chunks items); lower "
                          "data.held_out_rows or the corpus_chunks num_items, or train fewer steps")
    return n


def _static_plan(cfg: ExperimentConfig, order: DataOrder, window: Tuple[int, int], tokenizer, vocab_size: int,
                 held_out_rows: int) -> Tuple[Plan, dict]:
    """The items of ``insertion.experiments`` placed in ``window`` (``insertion.withheld`` placed, then left out).
    Returns ``(static plan, experiment -> items)``."""
    L, B = cfg.training.sequence_length, cfg.training.global_batch_size
    ctx = LoadContext(tokenizer, vocab_size, L, cfg.insertion.seed, cfg.cache_dir, order, held_out_rows)
    with PHASES.phase("items", experiments=len(cfg.insertion.experiments)):
        items = {name: load_items(name, exp, ctx) for name, exp in cfg.insertion.experiments.items()}
    with PHASES.phase("plan") as rec:
        plan = build_plan(items, cfg.insertion.experiments, window, L, B, cfg.insertion.seed, vocab_size)
        rec["insertions"] = plan.num_insertions
    if cfg.insertion.withheld:  # placed with the others (same positions), then left out
        plan = plan.without(cfg.insertion.withheld)
        items = {name: s for name, s in items.items() if name not in cfg.insertion.withheld}
    return plan, items


def plan_run(cfg: ExperimentConfig, rundir: RunDir, order: DataOrder, window: Tuple[int, int], tokenizer,
             vocab_size: int, held_out_rows: int, auditor: RunAudit, main: bool) -> RunPlan:
    """The run's plan (module docstring, step 3): the static plan, the decisions saved in the run dir re-applied,
    audited (rank 0) and saved unless the run dir holds it already with the same counts.

    :raises RunDirConflict: for a run dir whose items or plan differ from this config's.
    """
    static, items = _static_plan(cfg, order, window, tokenizer, vocab_size, held_out_rows)
    path = rundir.plan
    exists = path.is_file()
    saved_plan = Plan.load(path) if exists else None
    if exists:  # a re-run: an input of the plan that changed is named before its saved decisions are re-applied
        check_same_items(saved_plan, static, cfg.insertion.experiments, rundir.path)
    #: the plan after each decision (``insertion.dynamic``): on a re-run the saved decisions, re-applied
    history = PlanHistory.resume(static, rundir, cfg.insertion.dynamic is not None)
    plan = history.current
    saved = saved_plan.digest() if exists else None
    if exists and saved not in history.digests():
        raise RunDirConflict("insertion", f"{path} holds another plan than this config gives, though the "
                             "config and the items are the same (the corpus, the tokenizer or the program's "
                             "placement changed since the run started)", "restore them")
    with PHASES.phase("audit", mode=cfg.insertion.audit.value) as rec:
        audit, fresh = auditor.audit(static, items) if main else (None, False)
        rec["computed"] = fresh
    owner = RunPlan(history, items, rundir, main, audit)
    auditor.on_finish = owner.set_audit  # the audit beside training: items.jsonl gets its counts
    if main and (not exists or fresh or saved != plan.digest()):  # items.jsonl carries the audit's counts
        with PHASES.phase("plan saved"):
            owner.write()
    _log_plan(plan, window)
    return owner


def _log_plan(plan: Plan, window: Tuple[int, int]) -> None:
    """One log line on the plan (and on a plan with nothing to insert, or with noise rows)."""
    size = window[1] - window[0]
    log.info("plan: %d items, %d insertions, %d tokens (%.2f%% of the %d-token window)", plan.num_items,
             plan.num_insertions, int(plan.lengths.sum()), 100 * plan.lengths.sum() / max(1, size), size)
    if plan.num_items and size == 0:
        log.info("plan: nothing inserted (no steps to train): all %d items are dup-0 controls", plan.num_items)
    if plan.noise_rows.size:
        log.info("plan: %d rows with gaussian noise (%s)", plan.noise_rows.size, plan.noise_sigma)


def fit_held_out(default: int, reserved: int, first_row: int, end_row: int, rows_per_epoch: int,
                 checkpoint_trained_order: bool) -> int:
    """The most held-out rows, at most ``default``, that together with ``reserved`` rows before them
    (``corpus_chunks`` items) provably stay untrained (:func:`held_out_collision`); 0 when none do."""
    for n in range(default, 0, -1):
        if held_out_collision(n + reserved, first_row, end_row, rows_per_epoch, checkpoint_trained_order) is None:
            return n
    return 0


def held_out_collision(n: int, first_row: int, end_row: int, rows_per_epoch: int,
                       checkpoint_trained_order: bool) -> Optional[str]:
    """Why the ``n`` held-out rows ``[rows_per_epoch - n, rows_per_epoch)`` (the first epoch's last rows,
    :meth:`DataOrder.held_out_rows <pretrain_exp.data.order.DataOrder.held_out_rows>`) may have been trained, or
    ``None`` when they provably were not. The run trains rows ``[first_row, end_row)``; with
    ``checkpoint_trained_order`` (an OLMo checkpoint whose data order the run continues) the checkpoint trained
    ``[0, first_row)`` too, so every row before ``end_row`` counts (past the first epoch, all of it)."""
    if not n:
        return None
    start = rows_per_epoch - n
    if checkpoint_trained_order and end_row > start:
        return (f"the checkpoint and the run train rows [0, {end_row}) of their data order, which reach the {n} "
                f"held-out rows [{start}, {rows_per_epoch}) of the first epoch")
    if first_row < rows_per_epoch and end_row > start:
        return (f"the run trains rows [{first_row}, {end_row}), which reach the {n} held-out rows "
                f"[{start}, {rows_per_epoch}) of the first epoch")
    return None


def run_data(cfg: ExperimentConfig, progress: bool = True):
    """The framework, tokenizer, vocabulary size and data order of a run (what :class:`Experiment` and
    :mod:`~pretrain_exp.app.inspect` build from a config; the corpus is tokenized once into the cache).

    :returns: ``(framework, tokenizer, vocab_size, DataOrder)``.
    """
    framework_class = get_framework_class(cfg.framework.name)
    with PHASES.phase("model resolved", framework=cfg.framework.name):
        framework = framework_class(cfg, framework_class.resolve_model(cfg))
    with PHASES.phase("tokenizer"):
        tokenizer = load_tokenizer(framework.tokenizer_path, cfg.cache_dir)
        vocab_size = framework.vocab_size or len(tokenizer)
    d = cfg.data
    with PHASES.phase("corpus", tokenized=not d.paths):
        paths = d.paths or (tokenize_dataset(d.dataset, tokenizer, d.token_dir, d.split, d.subset, d.text_key,
                                             d.num_proc, progress=progress) if d.dataset else
                            tokenize_sources(d.text, tokenizer, d.token_dir, cfg.cache_dir, d.text_key))
    # one token-file dtype for the order, the plan and the framework's reader: the data config's (an OLMo
    # checkpoint's data.memmap_dtype / dataset.dtype), else the vocabulary's
    with PHASES.phase("size index", files=len(paths)) as rec:
        files = TokenFiles(paths, cfg.data.dtype or dtype_for_vocab(max(vocab_size, len(tokenizer))),
                           cache_dir=cfg.cache_dir, prefixes=cfg.data.path_prefixes, progress=progress)
        rec["remote"] = int(sum(files.remote))
    L = cfg.training.sequence_length
    order = DataOrder(files, L, cfg.training.global_batch_size, cfg.data.seed, cfg.data.first_epoch,
                      cache_dir=cfg.cache_dir, chunk=(cfg.data.max_target_sequence_length or L) // L)
    return framework, tokenizer, vocab_size, order


class RunDirConflict(ConfigError):
    """A refusal to reuse a run dir: ``what`` differs from the run it holds (a config key old -> new, an input file
    whose content changed), ``restore`` what brings that run back (``"restore its content"``); the message ends with
    the one way out, a run dir of its own (:func:`~pretrain_exp.app.run_name.own_run_dir`, ``name=<new name>``)."""

    def __init__(self, key: str, what: str, restore: str, way_out: Optional[str] = None):
        from pretrain_exp.app.run_name import own_run_dir

        self.what, self.restore = what, restore
        super().__init__(key, f"{what}; {restore} to resume that run, or {way_out or own_run_dir()}")


def _experiment_items(plan: Plan, name: str) -> Tuple[np.ndarray, np.ndarray]:
    """The items of experiment ``name`` in ``plan``: their lengths ``int64 (n,)`` and tokens ``int64 (sum,)``."""
    sel = plan.item_experiment == plan.experiments.index(name)
    lengths = np.diff(plan.token_offsets)
    return lengths[sel], plan.tokens[np.repeat(sel, lengths)].astype(np.int64)


def check_same_items(saved: Plan, plan: Plan, experiments: dict, run_dir: Path) -> None:
    """Refuse a re-run whose items differ from those of the plan its run dir holds (``saved``) for an experiment
    of both, though the config is the same: an input changed since the run started.

    :param experiments: ``insertion.experiments`` (name -> its config; ``file``: the items file).
    :raises RunDirConflict: naming the experiment's items file and that its content changed (or, without a file,
        that the items it reads or generates changed).
    """
    changed = [e for e in plan.experiments if e in saved.experiments
               and any(not np.array_equal(a, b) for a, b in zip(_experiment_items(saved, e),
                                                                _experiment_items(plan, e)))]
    if not changed:
        return
    name, more = changed[0], (f" (and the items of {', '.join(changed[1:])})" if changed[1:] else "")
    file = getattr(experiments.get(name), "file", None)
    if file:
        raise RunDirConflict(f"insertion.experiments.{name}.file",
                             f"the items file {Path(file).resolve()} changed content since the run in {run_dir} "
                             f"started{more}", "restore its content")
    raise RunDirConflict(f"insertion.experiments.{name}",
                         f"its items differ from those the run in {run_dir} started with, though the config is the "
                         f"same (what they are read or generated from changed){more}", "restore it")
