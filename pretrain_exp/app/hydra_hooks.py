"""The app's hooks into Hydra: the ``--help`` text and the check of a sweep's config before its jobs are launched.

- :func:`app_config_groups`: the ``${pretrain_exp_groups:}`` resolver of ``conf/hydra/help/pretrain_exp.yaml``,
  the user's config groups and their options as Hydra's own help lists them, without the internal ``schema/*``
  groups (the structured-config schemas the options extend) and Hydra's ``hydra/*``.
- :class:`CheckFirstJob`: a Hydra callback (``hydra.callbacks`` in ``conf/config.yaml``) that, in a multirun,
  composes and validates the first job's config with the sweeper's own override expansion before the launcher
  runs or submits anything, so a config that is invalid for every job is refused once (one ``error:`` line, exit
  status 2) instead of once per SLURM array task.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, List

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

log = logging.getLogger("pretrain_exp")

#: config groups that are not the user's (``--help`` leaves them out)
INTERNAL_GROUPS = ("schema", "hydra")


def app_config_groups() -> str:
    """The user's config groups, one line each: ``group: option, option, ...`` (sorted), as Hydra's
    ``$APP_CONFIG_GROUPS`` lists them, without :data:`INTERNAL_GROUPS` and their subgroups. Read from Hydra's
    config loader, so options of ``conf/local/`` or another search path appear too."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.object_type import ObjectType

    loader = GlobalHydra.instance().config_loader()

    def walk(parent: str) -> List[str]:
        out = []
        for group in loader.list_groups(parent):
            name = f"{parent}/{group}" if parent else group
            if name.split("/")[0] in INTERNAL_GROUPS:
                continue
            if loader.get_group_options(name, ObjectType.CONFIG):
                out.append(name)
            out += walk(name)
        return out

    return "\n".join(f"{g}: {', '.join(sorted(loader.get_group_options(g)))}" for g in sorted(walk("")))


def register_help_resolver() -> None:
    """Register ``${pretrain_exp_groups:}`` (:func:`app_config_groups`); idempotent."""
    if not OmegaConf.has_resolver("pretrain_exp_groups"):
        OmegaConf.register_new_resolver("pretrain_exp_groups", app_config_groups, use_cache=False)


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
    """``on_multirun_start``: validate the first job's config (module docstring) before the sweep launches."""

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
