"""``pretrain-exp-eval RUN_DIR [eval overrides] [--steps 4,8] [--redo]``: (re-)evaluate an existing run's
checkpoints with other or additional evals, without touching its training.

The run's ``config.resolved.yaml`` is the config; the command line may change only ``eval`` (``eval=[benchmark]``,
``'eval=[insertion_loss,mia]'``, ``eval.batch_size=4``, ...) and ``wandb``; the ``eval`` group is composed by
Hydra as for ``pretrain-exp`` (same options, same one-line errors). Every checkpoint the run holds is evaluated
(its checkpoints, kept HF exports ``hf/step<N>/`` and, if the run evaluated it, the initial checkpoint), or those
of ``--steps``; results go to the run's ``evals/step<N>/<task>.json`` (a task already there is kept unless
``--redo``), where ``pretrain_exp.load_run`` reads them, then ``results.json``, its tables and plots are rewritten.
The console gets one table per requested eval and evaluated step
(:func:`~pretrain_exp.report.summary.print_eval_tables`), each saying whether it was computed now or read from disk.
A closed-loop run (``insertion.dynamic``) is re-evaluated like any other: its policy's ``insertion_loss`` task stays
in the validated config as the run had it, and is not evaluated again unless asked for. Evals run in this process
(``eval.mode=inline``). Exit status 2 with one ``error:`` line for bad input (not a run dir, a non-eval override, a
step without a checkpoint: a step whose checkpoint was not kept names the option that keeps it). The engines' detail
goes to the run's ``pretrain_exp.log`` (appended), and with ``-v`` to the console too (:mod:`pretrain_exp.core.logs`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from pretrain_exp.core.errors import ConfigError, PretrainExpError
from pretrain_exp.core.logs import run_logging
from pretrain_exp.core.rundir import RunDir

log = logging.getLogger("pretrain_exp")
#: the keys (and groups) this command may change: the rest is the run's
ALLOWED = ("eval", "wandb")


def eval_config(run_dir: Path, overrides: List[str]):
    """The run's resolved config with its ``eval`` (and ``wandb``) node recomposed from ``overrides``, validated.

    :raises ConfigError: not a run dir, an override outside :data:`ALLOWED`, or an invalid eval config.
    :raises hydra.errors.HydraException: a composition error (mistyped key, wrong option).
    """
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf, open_dict

    from pretrain_exp import conf_dir
    from pretrain_exp.app.config import register_configs
    from pretrain_exp.app.validate import to_config
    from pretrain_exp.core.config import EvalMode

    path = RunDir(run_dir).config
    if not path.is_file():
        raise ConfigError("RUN_DIR", f"{run_dir} is not a run dir (no {RunDir.CONFIG})")
    for o in overrides:
        key = o.lstrip("+~").split("=", 1)[0]
        if key.split(".", 1)[0].split("/", 1)[0] not in ALLOWED:
            raise ConfigError(key, "pretrain-exp-eval changes only eval and wandb settings (eval=[...], "
                              "eval.<key>=..., wandb...); every other setting is the run's own and stays as it was")
    cfg = OmegaConf.load(path)
    old_tasks = OmegaConf.to_container(cfg.eval.tasks, resolve=False) if "eval" in cfg else {}
    if overrides:
        register_configs()
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            composed = compose("config", overrides=[f"run_dir={run_dir}", *overrides])
        with open_dict(cfg):
            for group in ALLOWED:
                if any(o.lstrip("+~").startswith(group) for o in overrides):
                    cfg[group] = OmegaConf.to_container(composed[group], resolve=False)
    loop = loop_task(cfg, old_tasks)
    restored = loop is not None and loop not in cfg.eval.tasks and loop in old_tasks
    with open_dict(cfg):
        cfg.run_dir = str(run_dir)
        if restored:  # the closed loop's own task, as the run had it: its check holds (nothing of it is re-run)
            cfg.eval.tasks[loop] = old_tasks[loop]
    exp = to_config(cfg)
    if restored:
        del exp.eval.tasks[loop]
    exp.eval.mode = EvalMode.inline  # in this process (async/distributed belong to a training job)
    return exp


def loop_task(cfg, tasks: dict) -> Optional[str]:
    """The ``insertion_loss`` task a closed-loop run's policy reads (``insertion.dynamic.task``, else the first
    ``insertion_loss`` task of ``tasks``, the run's ``eval.tasks``), or ``None`` for a run without
    ``insertion.dynamic``. ``cfg``: the run's ``config.resolved.yaml`` (a ``DictConfig``)."""
    from omegaconf import OmegaConf

    dyn = OmegaConf.select(cfg, "insertion.dynamic", default=None)
    if dyn is None or dyn in ("", "none"):
        return None
    task = OmegaConf.select(dyn, "task", default=None) if OmegaConf.is_dict(dyn) else None
    return task or next((n for n, t in tasks.items() if isinstance(t, dict) and t.get("type") == "insertion_loss"),
                        None)


@dataclass
class Reevaluation:
    """What :func:`reevaluate` did: ``results`` (the new ``results.json`` content), ``records`` (evaluated step ->
    requested task -> its eval record, as saved in ``evals/step<N>/<task>.json``) and ``computed`` (step -> the
    tasks computed by this call; the others were read from disk, kept because ``--redo`` was not given)."""

    results: dict
    records: Dict[int, Dict[str, dict]] = field(default_factory=dict)
    computed: Dict[int, List[str]] = field(default_factory=dict)


def _file_ids(rundir: RunDir, tasks) -> Dict[Tuple[int, str], Tuple[int, int]]:
    """``(step, task) -> (inode, mtime_ns)`` of every saved ``evals/step<N>/<task>.json`` of ``tasks``."""
    out = {}
    for step, _ in rundir.eval_steps():
        for task in tasks:
            f = rundir.evals(step, task)
            if f.is_file():
                st = f.stat()
                out[(step, task)] = (st.st_ino, st.st_mtime_ns)
    return out


def gone_checkpoint_hint(exp, segment_ends: List[int], missing: List[int]) -> str:
    """Why the checkpoints of ``missing`` steps are not there, naming the option that would have kept them:
    ``training.keep_last_checkpoints=0`` (every segment's checkpoint) or ``training.export_hf=every`` (every
    segment's HF model in ``hf/step<N>/``, any framework), ``training.cleanup=none`` where
    ``bulky`` deleted them; a step that ends no segment (``segment_ends``) never had one; the initial step
    (``model.checkpoint_step``) is evaluated only where the run evaluated it (``eval.on_load=true``). ``""`` if none
    is missing."""
    t = exp.training
    start = exp.model.checkpoint_step
    gone = [s for s in missing if s in segment_ends]
    never = [s for s in missing if s not in segment_ends and s != start]
    parts = []
    if start in missing:
        parts.append(f"step {start} is the run's initial model, evaluated here only where the run evaluated it "
                     "(eval.on_load=true)")
    if gone:
        cleanup = getattr(t.cleanup, "value", t.cleanup)
        k = t.keep_last_checkpoints
        why = (f"training.cleanup={cleanup} deleted every checkpoint but the last" if cleanup != "none"
               else f"the run keeps only its last {k} checkpoint(s) (training.keep_last_checkpoints={k})" if k
               else "it was removed from the run dir (training.keep_last_checkpoints=0 keeps them all)")
        keep = ("training.keep_last_checkpoints=0" + (" and training.cleanup=none" if cleanup != "none" else "")
                + " would have kept every segment's checkpoint")
        keep += " (or training.export_hf=every: every segment's HF model in hf/step<N>/)"
        parts.append(f"the checkpoint of step(s) {', '.join(map(str, gone))} is gone: {why}; training with {keep}")
    if never:
        parts.append(f"step(s) {', '.join(map(str, never))} end no segment (checkpoints are saved at steps "
                     f"{', '.join(map(str, segment_ends))}: training.checkpoint_interval={t.checkpoint_interval})")
    return "; ".join(parts)


def _held_steps(ex) -> List[int]:
    """The steps whose checkpoint ``ex`` (an :class:`~pretrain_exp.app.experiment.Experiment`) can evaluate, as
    :meth:`~pretrain_exp.app.experiment.Experiment.evaluate_checkpoints` finds them."""
    held = set(dict(ex.framework.checkpoints()))
    held |= {s for s, _ in ex.rundir.hf_exports(marker="config.json")}
    initial = ex.framework.initial_checkpoint()
    if ex.num_steps == 0 or ex.rundir.eval_dir(initial.step).is_dir():
        held.add(initial.step)
    return sorted(held)


def reevaluate(run_dir: Path, overrides: List[str], steps: Optional[List[int]] = None,
               redo: bool = False) -> Reevaluation:
    """Evaluate ``run_dir``'s checkpoints (module docstring); returns the new ``results.json`` content, the
    requested tasks' records at each evaluated step and which of them were computed now.

    :raises PretrainExpError: bad input (one line; a step whose checkpoint is gone names the option that would
        have kept it), a run dir in use by another process.
    """
    from pretrain_exp.app.experiment import Experiment
    from pretrain_exp.app.run_record import RunDirConflict, check_same_run, recorded_form
    from pretrain_exp.core.runlock import RunDirLock

    run_dir = Path(run_dir).resolve()
    exp = eval_config(run_dir, overrides)
    rundir = RunDir(run_dir)
    tasks = list(exp.eval.tasks)
    with RunDirLock(run_dir):
        try:
            check_same_run(run_dir, recorded_form(exp))
            ex = Experiment(exp)
        except RunDirConflict as e:  # evaluated as trained: what changed is restored, or is another run
            raise ConfigError(e.key, f"{e.what}; {e.restore} to evaluate that run (pretrain-exp-eval evaluates a run "
                              "with the inputs it was trained on), or train the new one in a run dir of its own: "
                              "name=<new name>") from None
        before = _file_ids(rundir, tasks)
        try:
            results = ex.evaluate_checkpoints(steps, redo)
        except ConfigError as e:
            if e.key != "--steps" or not steps:
                raise
            held = _held_steps(ex)
            ends = [b for _, b in ex.segments()]
            hint = gone_checkpoint_hint(exp, ends, [s for s in sorted(set(steps)) if s not in held])
            raise ConfigError("--steps", str(e).split(": ", 1)[1] + (f"; {hint}" if hint else "")) from None
    after = _file_ids(rundir, tasks)
    out = Reevaluation(results)
    for step in results.get("steps_evaluated_now") or []:
        out.records[step] = {t: rec for t in tasks if (rec := rundir.read_eval(step, t)) is not None}
        out.computed[step] = [t for t in out.records[step] if before.get((step, t)) != after.get((step, t))]
    return out


def evaluate_run(run_dir: Path, overrides: List[str], steps: Optional[List[int]] = None, redo: bool = False) -> dict:
    """Evaluate ``run_dir``'s checkpoints (module docstring); returns the new ``results.json`` content
    (:func:`reevaluate`).

    :raises PretrainExpError: bad input (one line), a run dir in use by another process.
    """
    return reevaluate(run_dir, overrides, steps, redo).results


def main(argv: Optional[List[str]] = None) -> None:
    """The command line (module docstring)."""
    from pretrain_exp.report.summary import print_eval_tables

    ap = argparse.ArgumentParser(prog="pretrain-exp-eval", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="example: pretrain-exp-eval runs/<run> 'eval=[insertion_loss,mia]'")
    ap.add_argument("run_dir", type=Path, help=f"the run dir (holds {RunDir.CONFIG})")
    ap.add_argument("overrides", nargs="*", help="eval (and wandb) overrides, as for pretrain-exp")
    ap.add_argument("--steps", help="comma-separated global steps to evaluate (default: every checkpoint held)")
    ap.add_argument("--redo", action="store_true", help="re-run tasks already saved for a step")
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="the engines' logs and warnings on the console too (always in the run dir's log file)")
    args = ap.parse_args(argv)
    run_dir = Path(args.run_dir).resolve()
    rundir = RunDir(run_dir)
    log_file = rundir.log_file if rundir.config.is_file() else None  # appended to
    with run_logging(log_file, verbose=args.verbose):
        done = _evaluate(args)
    paths = {step: {t: str(rundir.evals(step, t).relative_to(run_dir)) for t in recs}
             for step, recs in done.records.items()}
    print_eval_tables(done.records, done.computed, paths)
    dyn = done.results.get("dynamic")
    if dyn and not dyn.get("realized_dup_groups_randomized", False):
        print("closed loop: each target's dup count was chosen by the policy from its own losses, so the groups by "
              "dup count above are outcome-selected (not randomized); see the run's targets-vs-controls table")
    print(f"rewritten: {RunDir.RESULTS}, the run's tables and plots (every eval of the run)")
    print(f"run dir: {run_dir}")


def _evaluate(args: argparse.Namespace) -> Reevaluation:
    """:func:`reevaluate` for the parsed command line; an error exits (one line, status 2)."""
    from hydra.errors import HydraException

    from pretrain_exp.app.hydra_errors import exit_on_hydra_error
    from pretrain_exp.core.secrets import redact

    try:
        try:
            steps = [int(s) for s in args.steps.split(",")] if args.steps else None
        except ValueError:
            raise ConfigError("--steps", f"must be comma-separated integers, got {args.steps!r}") from None
        return reevaluate(args.run_dir, args.overrides, steps, args.redo)
    except HydraException as e:
        exit_on_hydra_error(e)
    except PretrainExpError as e:
        msg = " | ".join(ln.strip() for ln in str(e).splitlines() if ln.strip())
        print(f"error: {redact(msg)}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
