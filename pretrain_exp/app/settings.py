"""Run settings taken from the checkpoint: the ``${checkpoint:<key>}`` resolver and the override log.

An OLMo checkpoint records how its run was trained: sequence length, global batch size, data-order seed and
epoch count, token files and their dtype, tokenizer (and, read by the framework itself, optimizer and LR
schedule). ``conf/framework/olmo2.yaml`` and ``olmo_core.yaml`` set those keys to ``${checkpoint:<key>}``, so a
run takes them from the checkpoint unless the command line (or an ``experiment=`` preset) sets them: such a value
is an override, named in the log by :func:`log_overrides` and checked against the checkpoint by the framework
(a continuation that would not be the original run's is an error naming the value to set).
``python -m pretrain_exp ... --cfg job --resolve`` prints the derived values.

The resolver reads only the checkpoint's config and trainer state (a URL checkpoint fetches just those files),
once per process and checkpoint.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Tuple

from omegaconf import OmegaConf

from pretrain_exp.core.config import ModelConf
from pretrain_exp.core.errors import ConfigError

log = logging.getLogger(__name__)

RESOLVER = "checkpoint"  #: ``${checkpoint:<dotted key>}``
_CACHE: Dict[Tuple, Dict[str, Any]] = {}


def _model(root) -> Tuple[ModelConf, str]:
    m = root.model
    # checkpoint_step selects the checkpoint only under model.url; elsewhere it may itself be ${checkpoint:...}
    step = m.checkpoint_step if m.get("url") is not None else 0
    model = ModelConf(name=m.name, asset=m.get("asset"), path=m.get("path"), url=m.get("url"),
                      checkpoint_step=int(step), init=str(m.get("init", "checkpoint")), config=m.get("config"),
                      init_seed=0)
    return model, str(root.cache_dir)


def settings_of(framework: str, model: ModelConf, cache_dir: str) -> Dict[str, Any]:
    """What the framework's checkpoint records (:meth:`Framework.checkpoint_settings
    <pretrain_exp.frameworks.base.Framework.checkpoint_settings>`), read once per process and checkpoint."""
    from pretrain_exp.frameworks.registry import get_framework_class

    key = (framework, model.asset, model.path, model.url, model.checkpoint_step if model.url else None, cache_dir,
           model.init, model.config)
    if key not in _CACHE:
        _CACHE[key] = dict(get_framework_class(framework).checkpoint_settings(model, cache_dir))
    return _CACHE[key]


_NO_DEFAULT = object()


def resolve(key: str, default: Any = _NO_DEFAULT, *, _root_) -> Any:
    """The value of ``${checkpoint:<key>}`` (or ``${checkpoint:<key>,<default>}``): the run's checkpoint's setting
    ``key``. ``default`` is used only under a framework whose checkpoints record no run settings at all (``hf``:
    ``model=local`` serves every framework); a checkpoint that records settings but not ``key`` is an error.

    :raises ConfigError: (naming ``key``, and what the checkpoint lacks where the framework says) if the
        checkpoint does not record it.
    """
    from pretrain_exp.core.capabilities import SUPPORTS_RANDOM_INIT, has
    from pretrain_exp.frameworks.registry import get_framework_class

    model, cache_dir = _model(_root_)
    framework = str(_root_.framework.name)
    if model.init == "random" and not has(get_framework_class(framework), SUPPORTS_RANDOM_INIT):
        raise ConfigError("model.init", f"framework {framework!r} continues checkpoints only; pretrain from "
                          "scratch with framework=olmo_core or framework=hf")
    found = settings_of(framework, model, cache_dir)
    if key not in found:
        if default is not _NO_DEFAULT and not found:
            return default
        where = model.path or model.url or model.asset
        why = get_framework_class(framework).missing_setting_hint(key)
        raise ConfigError(key, f"the checkpoint ({where}) does not record it{'; ' + why if why else ''}; "
                          f"set {key}=...")
    return found[key]


def register_resolver() -> None:
    """Register ``${checkpoint:...}`` with OmegaConf (idempotent)."""
    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, resolve)


def log_overrides(cfg) -> Dict[str, Tuple[Any, Any]]:
    """Log every setting the run gives differently from its checkpoint (``key: ours vs checkpoint's``).

    :param cfg: the converted run config (:class:`~pretrain_exp.app.config.ExperimentConfig`).
    :returns: ``{key: (run value, checkpoint value)}`` of the overrides.
    """
    keys = cfg.framework.checkpoint_keys()
    if not keys:
        return {}
    found = settings_of(cfg.framework.name, cfg.model, cfg.cache_dir)
    out = {}
    for key in keys:
        if key not in found:
            continue
        node = cfg
        for part in key.split("."):
            node = getattr(node, part)
        ours = list(node) if isinstance(node, (list, tuple)) else node
        if ours != found[key]:
            out[key] = (ours, found[key])
            shown = found[key] if not isinstance(found[key], list) else f"{len(found[key])} files"
            log.warning("override: %s=%s (the checkpoint records %s)", key,
                        ours if not isinstance(ours, list) else f"{len(ours)} files", shown)
    return out
