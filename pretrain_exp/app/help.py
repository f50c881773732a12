"""The app's ``--help`` text: ``conf/hydra/help/pretrain_exp.yaml`` lists the user's config groups through the
``${pretrain_exp_groups:}`` resolver (:func:`app_config_groups`): the groups and their options as Hydra's own help
lists them, without the internal ``schema/*`` groups (the structured-config schemas the options extend) and
Hydra's ``hydra/*``."""

from __future__ import annotations

from typing import List

from omegaconf import OmegaConf

#: config groups that are not the user's (``--help`` leaves them out)
INTERNAL_GROUPS = ("schema", "hydra")


def app_config_groups() -> str:
    """The user's config groups, one line each: ``group: option, option, ...`` (sorted), as Hydra's
    ``$APP_CONFIG_GROUPS`` lists them, without :data:`INTERNAL_GROUPS` and their subgroups. Read from Hydra's
    config loader, so options of ``conf/local/`` or another search path appear too."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.object_type import ObjectType

    # the loader's repository, asked directly: the loader's own get_group_options/list_groups deep-copy the whole
    # repository (every structured-config schema) on each call, ~70 ms each, and the help template is resolved
    # once per composition
    repo = GlobalHydra.instance().config_loader().repository

    def options(group: str, kind) -> List[str]:
        return list(repo.get_group_options(group, results_filter=kind))

    def walk(parent: str) -> List[str]:
        out = []
        for group in options(parent, ObjectType.GROUP):
            name = f"{parent}/{group}" if parent else group
            if name.split("/")[0] in INTERNAL_GROUPS:
                continue
            if options(name, ObjectType.CONFIG):
                out.append(name)
            out += walk(name)
        return out

    return "\n".join(f"{g}: {', '.join(sorted(options(g, ObjectType.CONFIG)))}" for g in sorted(walk("")))


def register_help_resolver() -> None:
    """Register ``${pretrain_exp_groups:}`` (:func:`app_config_groups`); idempotent."""
    if not OmegaConf.has_resolver("pretrain_exp_groups"):
        OmegaConf.register_new_resolver("pretrain_exp_groups", app_config_groups, use_cache=False)
