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
