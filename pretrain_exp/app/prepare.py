"""Everything a run decides before step 1, as plain data: :func:`prepare` ``(cfg) -> RunContext``.

1. the model (asset or dir, :func:`open_framework`), then the data in one trip down the data layer
   (:func:`~pretrain_exp.data.corpus.open_corpus` on the plain :func:`corpus_spec`): the tokenizer, the corpus
   tokenized if needed, the data order; remote token files: the window's rows fetched now (``data.prefetch=window``),
   or a :class:`~pretrain_exp.data.stream.WindowStream` made ready to fetch them beside training (``stream``, the
   default; started by the loop's ``pre_train`` hook, :mod:`~pretrain_exp.app.stream_hook`);
2. the held-out rows (a null ``data.held_out_rows`` resolved into :attr:`RunContext.held_out_rows`, the config left
   as validated; :func:`~pretrain_exp.data.corpus.fit_held_out`, :func:`~pretrain_exp.data.corpus.held_out_collision`);
3. the items, placed in the training window ``[S*B*L, (S+n)*B*L)``: the :class:`~pretrain_exp.insertion.plan.Plan`
   and its owner :class:`~pretrain_exp.insertion.run_plan.RunPlan` (with the decisions of dynamic insertion saved in
   the run dir, and its arms drawn); ``plan.npz`` + ``manifest.jsonl`` saved (or the plan already in the run dir
   checked to be identical); the natural-duplicate audit (``insertion.audit``, :mod:`~pretrain_exp.app.audit_hook`:
   ``strict`` now; ``on`` made ready to run beside training, started by its ``pre_train`` hook);
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
from pretrain_exp.app.run_record import RunDirConflict
from pretrain_exp.core.distributed import is_main_process, world_size
from pretrain_exp.core.phases import PHASES
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.data.corpus import Corpus, CorpusSpec, open_corpus, open_order, read_order
from pretrain_exp.data.order import DataOrder
from pretrain_exp.data.prefetch import prefetch_rows
from pretrain_exp.data.rows import TrainingRows
from pretrain_exp.data.stream import WindowStream
from pretrain_exp.evals.base import EvalContext
from pretrain_exp.frameworks.registry import get_framework_class
from pretrain_exp.insertion.items import LoadContext
from pretrain_exp.insertion.plan import Plan, build_plan
from pretrain_exp.insertion.run_plan import PlanConflict, RunPlan
from pretrain_exp.insertion.schema import InsertionConf
from pretrain_exp.insertion.types import load_items, reserved_rows
from pretrain_exp.insertion.verify import verify_batches

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
        <pretrain_exp.insertion.run_plan.RunPlan.as_of>`), after a continued run's parent's plan (:meth:`Plan.then
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

    :raises ConfigError: (``data.held_out_rows``) for held-out rows the run may train, (``insertion.dynamic.controls``)
        for controls the static plan cannot give; a :class:`RunDirConflict` for a run dir whose plan or items differ
        from this config's.
    :raises InsertionError: for a plan that does not fit or does not land (verification), or a control found in the
        window under ``insertion.audit=strict``.
    """
    rundir = RunDir(Path(cfg.run_dir).resolve())
    rundir.path.mkdir(parents=True, exist_ok=True)
    main = is_main_process()  # only rank 0 writes files, logs and evaluates
    framework = open_framework(cfg)
    spec = corpus_spec(cfg, framework)
    data = open_corpus(spec, main)  # tokenizer, tokens, order, window, held-out rows: one trip down
    order, window = data.order, data.window
    plan, auditor = plan_run(cfg, rundir, data, main)
    rows = plan.rows = TrainingRows(order, plan.current, *spec.rows)
    ctx = RunContext(cfg, rundir, main, framework, data.tokenizer, data.vocab_size, order, window,
                     data.window_fetched, data.held_out_rows, plan, rows, auditor, data.stream)
    current = plan.current
    for line in current.describe(window):
        log.info("plan: %s", line)
    if main and cfg.insertion.verify and current.num_insertions:
        span = (rows.first_row, rows.first_row + len(rows))
        with PHASES.phase("verify") as rec:
            # a stream's rows are fetched beside training: those the verifier reads are fetched before it reads them
            fetch = None if data.stream is None else functools.partial(prefetch_rows, order)
            rec["rows"] = verify_batches(current, functools.partial(framework.peek_rows, rows), order.row_tokens,
                                         span, world_size(), seed=cfg.seed, fetch=fetch).rows_checked
    return ctx


def _static_plan(cfg: ExperimentConfig, data: Corpus) -> Tuple[Plan, dict]:
    """The items of ``insertion.experiments`` placed in the training window of ``data`` (``insertion.withheld``
    placed, then left out). Returns ``(static plan, experiment -> items)``."""
    L, B, vocab_size = cfg.training.sequence_length, cfg.training.global_batch_size, data.vocab_size
    ctx = LoadContext(data.tokenizer, vocab_size, L, cfg.insertion.seed, cfg.cache_dir, data.order, data.held_out_rows)
    with PHASES.phase("items"):
        items = {name: load_items(name, exp, ctx) for name, exp in cfg.insertion.experiments.items()}
    with PHASES.phase("plan") as rec:
        plan = build_plan(items, cfg.insertion.experiments, data.window, L, B, cfg.insertion.seed, vocab_size)
        rec["insertions"] = plan.num_insertions
    if cfg.insertion.withheld:  # placed with the others (same positions), then left out
        plan = plan.without(cfg.insertion.withheld)
        items = {name: s for name, s in items.items() if name not in cfg.insertion.withheld}
    return plan, items


def plan_run(cfg: ExperimentConfig, rundir: RunDir, data: Corpus, main: bool) -> Tuple[RunPlan, RunAudit]:
    """The run's plan (module docstring, step 3): the static plan, the decisions saved in the run dir re-applied
    and the closed loop's arms drawn (:meth:`RunPlan.resume <pretrain_exp.insertion.run_plan.RunPlan.resume>`),
    audited (rank 0; the audit beside training made ready) and saved unless the run dir holds it already with the
    same counts. Returns ``(the plan's owner, the audit)``.

    :raises RunDirConflict: for a run dir whose items or plan differ from this config's (the insertion layer's
        :class:`~pretrain_exp.insertion.run_plan.PlanConflict` with the way out of the command line).
    """
    static, items = _static_plan(cfg, data)
    ins = cfg.insertion
    try:
        owner = RunPlan.resume(static, items, rundir, ins.experiments, ins.dynamic, ins.seed, main)
    except PlanConflict as e:
        raise RunDirConflict(e.key, e.what, e.restore) from None
    held_rows = data.order.held_out_rows(data.held_out_rows)  # audited as the window is: a control there is a leak
    auditor = RunAudit(ins, rundir, data.order, data.window, held_rows, data.tokenizer.eos_token_id, cfg.cache_dir,
                       data.window_fetched)
    with PHASES.phase("audit") as rec:
        owner.audit, fresh = auditor.audit(static, items) if main else (None, False)
        rec["computed"] = fresh
    auditor.on_finish = owner.set_audit  # the audit beside training: items.jsonl gets its counts
    if main and (fresh or owner.saved_digest != owner.current.digest()):  # items.jsonl carries the audit's counts
        with PHASES.phase("plan saved"):
            owner.write()
    return owner, auditor


def corpus_spec(cfg: ExperimentConfig, framework) -> CorpusSpec:
    """What the data layer opens for the run of ``cfg`` whose model ``framework`` resolved (its tokenizer and
    vocabulary), as plain values (:class:`~pretrain_exp.data.corpus.CorpusSpec`)."""
    t = cfg.training
    return CorpusSpec(cfg.data, framework.tokenizer_path, cfg.cache_dir, t.sequence_length, t.global_batch_size,
                      cfg.model.checkpoint_step, t.num_steps, framework.vocab_size,
                      reserved_rows(cfg.insertion.experiments),
                      "data.paths" in cfg.framework.checkpoint_keys() and cfg.model.init != "random")


def open_framework(cfg: ExperimentConfig):
    """The run's :class:`~pretrain_exp.frameworks.base.Framework`, its model resolved (an asset, a dir, a
    checkpoint)."""
    framework_class = get_framework_class(cfg.framework.name)
    with PHASES.phase("model resolved"):
        return framework_class(cfg, framework_class.resolve_model(cfg))


def run_data(cfg: ExperimentConfig, progress: bool = True, reader: bool = False):
    """The framework, tokenizer, vocabulary size and data order of a run (what :mod:`~pretrain_exp.app.inspect`
    reads a run dir's rows with; the corpus is tokenized once into the cache), nothing of its window.

    :param reader: for a reader of rows tokenized before (:func:`~pretrain_exp.data.corpus.read_order`: the
        tokenizer read without ``transformers`` where the corpus is in the cache).
    :returns: ``(framework, tokenizer, vocab_size, DataOrder)``.
    """
    framework = open_framework(cfg)
    data = (read_order if reader else open_order)(corpus_spec(cfg, framework), progress=progress)
    return framework, data.tokenizer, data.vocab_size, data.order
