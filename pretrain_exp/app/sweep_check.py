"""A sweep's config checked before its jobs are launched: :class:`CheckFirstJob`, a Hydra callback
(``hydra.callbacks`` in ``conf/config.yaml``) that, in a multirun, composes and validates the first job's config
with the sweeper's own override expansion before the launcher runs or submits anything, so a config that is invalid
for every job is refused once (one ``error:`` line, exit status 2) instead of once per SLURM array task."""

from __future__ import annotations

import logging
import sys
from typing import Any, List

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

log = logging.getLogger("pretrain_exp")


def first_job_overrides(config: DictConfig) -> List[str] | None:
    """The overrides of a multirun's first job, expanded as Hydra's basic sweeper expands them (its
    ``hydra.sweeper.params`` then the command line's overrides), or ``None`` for another sweeper."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    sweeper = config.hydra.sweeper
    if sweeper.get("_target_") != f"{BasicSweeper.__module__}.{BasicSweeper.__name__}":
        return None
    params = BasicSweeper(max_batch_size=None, params=sweeper.get("params"))._parse_config()
    args = params + list(OmegaConf.to_container(config.hydra.overrides.task, resolve=False))
    parsed = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader()).parse_overrides(args)
    batches = BasicSweeper.split_arguments(parsed, max_batch_size=None)
    return list(batches[0][0]) if batches and batches[0] else []


class CheckFirstJob(Callback):
    """``on_multirun_start``: validate the first job's config (module docstring) before the sweep launches;
    ``on_multirun_end``: print the sweep dir and the command of its report."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from pathlib import Path

        sweep = Path(str(config.hydra.sweep.dir)).resolve()
        print(f"sweep dir: {sweep}")
        print(f"report: pretrain-exp-report {sweep}   (or python -m pretrain_exp.report {sweep})")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra.core.global_hydra import GlobalHydra

        from pretrain_exp.app.validate import to_config
        from pretrain_exp.core.errors import PretrainExpError

        overrides = first_job_overrides(config)
        if overrides is None:
            log.info("sweep config check skipped: sweeper %s", config.hydra.sweeper.get("_target_"))
            return
        job = GlobalHydra.instance().config_loader().load_sweep_config(config, overrides)
        with open_dict(job):
            job.run_dir = "<first job of the sweep>"  # not resolved: nothing is written while checking
            del job["hydra"]
        try:
            to_config(job)
        except PretrainExpError as e:
            shown = " ".join(overrides) or "(no overrides)"
            msg = " | ".join(line.strip() for line in str(e).splitlines() if line.strip())
            print(f"error: {msg} (the sweep's first job: {shown}); nothing was launched", file=sys.stderr)
            sys.exit(2)
