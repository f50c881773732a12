"""Hydra's composition errors as the project's one line (``error: <key>: ...``, exit status 2) with the closest
name: a mistyped key (``training.num_step=5`` -> ``did you mean training.num_steps?``), a wrong group option
(``insertion=text`` -> the options and ``did you mean insertion=texts?``), a value of the wrong type, an override
that does not parse. Hydra itself prints several lines, exits 1, and suggests ``+key=value``, which the project
refuses anyway (:func:`pretrain_exp.app.validate.unknown_keys`)."""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import Iterable, List, Optional


def did_you_mean(word: str, options: Iterable[str], prefix: str = "") -> str:
    """``"; did you mean <prefix><closest>?"`` for the option closest to ``word`` (difflib), or ``""``."""
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f"; did you mean {prefix}{close[0]}?" if close else ""


def group_options(group: str) -> List[str]:
    """The options of config group ``group`` in the package's config dir (``conf/<group>/*.yaml``)."""
    from pretrain_exp import conf_dir

    return sorted(p.stem for p in (Path(conf_dir()) / group).glob("*.yaml"))


def _first_line(text: str) -> str:
    return next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")


def _fields(cause) -> List[str]:
    schema = getattr(cause, "object_type", None)
    if dataclasses.is_dataclass(schema):
        return [f.name for f in dataclasses.fields(schema)]
    node = getattr(cause, "parent_node", None)
    try:
        return [str(k) for k in node.keys()] if node is not None else []
    except Exception:  # noqa: BLE001  (a node without keys: no list)
        return []


def hydra_error_line(e: BaseException) -> Optional[str]:
    """One line (without ``error:``) for a Hydra override/composition error ``e``, or ``None`` for another error.

    Unknown keys name the schema, its fields and the closest one; wrong group options list the group's options and
    the closest one; wrong types and unparsable overrides give the override and Hydra's reason on one line.
    """
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

    if isinstance(e, MissingConfigException) and e.missing_cfg_file and "/" in e.missing_cfg_file:
        group, _, option = e.missing_cfg_file.rpartition("/")
        options = list(e.options or group_options(group))
        return (f"{group}={option}: no option {option!r} in config group {group!r} (options: {', '.join(options)})"
                + did_you_mean(option, options, f"{group}="))
    if isinstance(e, OverrideParseException):
        return f"{e.override}: not a valid override ({_first_line(e.message)}; quote lists: 'key=[a,b]')"
    from pretrain_exp.core.errors import project_error

    ours = project_error(e)  # a resolver's own error (``${parent:...}``: no run dir) while Hydra computes the run dir
    if ours is not None:
        return _first_line(ours)
    if not isinstance(e, ConfigCompositionException):
        return None
    cause = e.__cause__
    while cause is not None and not isinstance(cause, OmegaConfBaseException):
        cause = cause.__cause__
    key = getattr(cause, "full_key", None)
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and key:
        name = key.rpartition(".")[2]
        fields = _fields(cause)
        schema = getattr(cause, "object_type", None)
        owner = schema.__name__ if isinstance(schema, type) else (key.rpartition(".")[0] or "the config")
        parent = key.rpartition(".")[0]
        return (f"{key}: unknown key: {owner} has no field {name!r}"
                + did_you_mean(name, fields, f"{parent}." if parent else "")
                + (f" (fields: {', '.join(fields)})" if fields else ""))
    if cause is not None and key:
        return f"{key}: {_first_line(cause)}"
    return _first_line(e) or type(e).__name__


def exit_on_hydra_error(e: BaseException) -> None:
    """Print a Hydra composition error as one ``error:`` line (credentials redacted) and exit with status 2;
    re-raise ``e`` when it is not one (:func:`hydra_error_line` gives no line)."""
    import sys

    from pretrain_exp.core.secrets import redact

    line = hydra_error_line(e)
    if line is None:
        raise e
    print(f"error: {redact(line)}", file=sys.stderr)
    sys.exit(2)
