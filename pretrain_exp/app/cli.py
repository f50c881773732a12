"""Command line: ``python -m pretrain_exp [group=option ...] [key=value ...]`` (Hydra).

Examples::

    python -m pretrain_exp                                   # the embedded default (make demo)
    python -m pretrain_exp experiment=tiny                   # seconds-long smoke run
    python -m pretrain_exp insertion=texts insertion.experiments.texts.file=items.jsonl
    python -m pretrain_exp --cfg job                         # print the composed config
    python -m pretrain_exp -m seed=0,1,2                     # a sweep

Errors of the user's making print one line (``error: <dotted key or file:line>: ...``) and exit with status 2,
and a fresh run dir that holds nothing but the failed attempt's Hydra files, resolved config and insertion
plan is removed (in a sweep the job dir is kept and the error logged to its ``pretrain_exp.log`` for
``python -m pretrain_exp.report``). The last line of a successful run is ``run dir: <absolute path>``.
A run dir in use by another process is refused (:mod:`pretrain_exp.core.runlock`), and no credential reaches a log
line or a file of the run dir (:mod:`pretrain_exp.core.secrets`).

The console shows the project's lines (plan, audit, one line per logged training step, evals, the results table,
errors); the engines' detail (OLMo-core's, the HF Trainer's, transformers', lm-eval's records, Python warnings)
goes to the run dir's ``pretrain_exp.log`` (:mod:`pretrain_exp.core.logs`). ``-v`` / ``--verbose`` (the key
``verbose=true``) puts it on the console too; Hydra's ``hydra.verbose=true`` (or ``=[olmo_core]``, logger names)
adds DEBUG records.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from typing import List

import hydra
from omegaconf import DictConfig

from pretrain_exp import conf_dir
from pretrain_exp.app.config import register_configs
from pretrain_exp.app.validate import to_config
from pretrain_exp.core.errors import PretrainExpError
from pretrain_exp.core.io import write_text
from pretrain_exp.core.logs import run_logging
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.core.runlock import RunDirLock
from pretrain_exp.core.secrets import install_log_redaction, redact, redact_obj

log = logging.getLogger("pretrain_exp")
install_log_redaction()  # before Hydra logs the overrides
#: the Hydra config groups (``conf/`` of the checkout, ``pretrain_exp/conf`` of an installed wheel)
CONF_DIR = conf_dir()
register_configs()

#: files Hydra and the entry point write before any training (the Hydra files, the resolved config and the
#: insertion plan with its manifest); a fresh run dir holding only these is discarded on error, so a corrected
#: re-run in the same dir does not meet a stale plan
_SCAFFOLD = RunDir.SCAFFOLD


def save_hydra_files(cfg: DictConfig, run_dir: Path) -> None:
    """Write ``<run_dir>/.hydra/{config,hydra,overrides}.yaml`` as Hydra writes them, with credentials redacted.

    ``conf/config.yaml`` sets ``hydra.output_subdir: null``, so Hydra writes no ``.hydra/`` before the job starts;
    in a run dir that already holds a run this runs once the run dir is locked and the config accepted, so a
    refused re-run (a changed config, a run dir in use) leaves the run's ``.hydra/`` as it was.
    """
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    hc = HydraConfig.get()
    rd = RunDir(run_dir)
    for name, node in (("config", OmegaConf.to_container(cfg, resolve=False)),
                       ("hydra", {"hydra": OmegaConf.to_container(hc, resolve=False)}),
                       ("overrides", list(hc.overrides.task))):
        write_text(rd.hydra_file(name), OmegaConf.to_yaml(OmegaConf.create(redact_obj(node))))


#: whether :func:`main` set ``HYDRA_FULL_ERROR`` for Hydra's composition (a user's own setting is left alone)
_set_full_error = False


def _one_line(e: BaseException) -> str:
    """The error message on one line (a wrapped engine error may span several)."""
    return " | ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__


def verbose_flag_to_key(args: List[str]) -> List[str]:
    """The command line ``args`` with ``-v`` / ``--verbose`` (which Hydra's parser lacks) turned into the override
    ``verbose=true``, placed with the other overrides (argparse takes them only as one run of words)."""
    flags = ("-v", "--verbose")
    if not any(a in flags for a in args):
        return list(args)
    rest = [a for a in args if a not in flags]
    at = next((i for i, a in enumerate(rest) if "=" in a and not a.startswith("-")), len(rest))
    return [*rest[:at], "verbose=true", *rest[at:]]


def main() -> None:
    """The command (module docstring): Hydra's composition errors (a mistyped key, a wrong group option, a wrong
    type) become one ``error:`` line with the closest name and exit status 2
    (:func:`~pretrain_exp.app.hydra_errors.hydra_error_line`), like the project's own errors."""
    from hydra.errors import HydraException

    from pretrain_exp.app.hydra_errors import exit_on_hydra_error

    global _set_full_error
    sys.argv = [sys.argv[0], *verbose_flag_to_key(sys.argv[1:])]
    ours = _set_full_error = "HYDRA_FULL_ERROR" not in os.environ
    if ours:  # Hydra re-raises composition errors instead of printing its own multi-line report and exiting 1
        os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        _main()
    except HydraException as e:
        exit_on_hydra_error(e)
    finally:
        if ours:
            os.environ.pop("HYDRA_FULL_ERROR", None)


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def _main(cfg: DictConfig) -> None:
    """Compose, validate once, launch (a CPDT config: :func:`~pretrain_exp.app.cpdt.run_cpdt`, which launches its
    arms); see the module docstring."""
    from hydra.core.hydra_config import HydraConfig

    if _set_full_error:  # the run's own errors and its child processes: as before
        os.environ.pop("HYDRA_FULL_ERROR", None)
    from hydra.types import RunMode

    run_dir = Path(cfg.run_dir).resolve()
    fresh = not RunDir(run_dir).config.exists()
    sweep = HydraConfig.get().mode == RunMode.MULTIRUN
    verbose = bool(cfg.get("verbose")) or bool(HydraConfig.get().verbose)
    with run_logging(RunDir(run_dir).log_file, verbose=verbose):  # hydra/job_logging: none (conf/config.yaml)
        _run(cfg, run_dir, fresh, sweep)
    print(f"run dir: {run_dir}")


def _run(cfg: DictConfig, run_dir: Path, fresh: bool, sweep: bool) -> None:
    """The job of :func:`_main` in the run dir ``run_dir`` (``fresh``: it held no run; ``sweep``: a job of a
    multirun); an error of the user's making exits with status 2."""
    from hydra.core.hydra_config import HydraConfig

    from pretrain_exp.app.cpdt import run_cpdt
    from pretrain_exp.app.experiment import check_same_run
    from pretrain_exp.app.launch import job_nodes, launch
    from pretrain_exp.core.phases import PHASES

    PHASES.add("startup", time.time() - PHASES.process_start, PHASES.process_start,
               what="interpreter, imports, Hydra's composition")
    if fresh:  # a new run dir has nothing to protect; its .hydra/ lets the sweep report list a job that fails
        save_hydra_files(cfg, run_dir)
    try:
        with PHASES.phase("settings", what="config resolved (checkpoint settings) and validated"):
            exp = to_config(cfg)
        if sweep and exp.wandb.group is None:  # the jobs of a sweep side by side in W&B
            exp.wandb.group = Path(HydraConfig.get().sweep.dir).name
        overrides = HydraConfig.get().job.override_dirname
        if sweep and overrides and exp.wandb.name == exp.run_name:  # each job by its overrides, not the shared name
            exp.wandb.name = f"{exp.run_name}-{overrides}"
        # one process per run dir (core.runlock); torchrun ranks run under this one, and in a multi-node job the
        # other nodes' tasks under node 0's
        with RunDirLock(run_dir) if job_nodes().rank == 0 else contextlib.nullcontext():
            check_same_run(exp, run_dir)  # a refused config changes nothing in the run dir
            if not fresh:
                save_hydra_files(cfg, run_dir)
            if exp.cpdt.experiments:  # dependence testing: one ordinary launch per arm, then the interaction table
                run_cpdt(exp)
            else:
                launch(exp)
    except PretrainExpError as e:
        log.debug("failed", exc_info=True)
        if sweep:  # keep the job dir and its log, so the sweep report can say why this job failed
            log.error("error: %s", _one_line(e))
        elif fresh and run_dir.is_dir() and {p.name for p in run_dir.iterdir()} <= _SCAFFOLD:
            shutil.rmtree(run_dir, ignore_errors=True)
        print(f"error: {redact(_one_line(e))}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
