"""Error hierarchy of pretrain_exp.

Every error a user can cause (bad config, bad data, bad insertion item, failed launch) is a subclass of
:class:`PretrainExpError`. The command-line entry point prints such errors as one line and exits with
status 2; anything else is a bug and keeps its traceback. Training failures (:class:`TrainingError`) are the
only ones the experiment loop retries.
"""

from __future__ import annotations

from typing import Optional


class PretrainExpError(Exception):
    """Base class of all user-facing errors; the message is the whole explanation."""


def project_error(e: Optional[BaseException]) -> Optional[PretrainExpError]:
    """The first :class:`PretrainExpError` in the chain of ``e`` (itself, its ``__cause__`` or ``__context__``, and
    theirs): the project's own error that a library wrapped (a resolver's error inside OmegaConf's), or ``None``."""
    while e is not None and not isinstance(e, PretrainExpError):
        e = e.__cause__ or e.__context__
    return e


class ConfigError(PretrainExpError, ValueError):
    """A configuration value is wrong. The message names the dotted key, the value and the allowed values."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(f"{key}: {message}")


class DataError(PretrainExpError):
    """A data file (corpus, token file, asset, jsonl) is missing, corrupted or malformed.

    The message names the file and, where it applies, the line.
    """


class InsertionError(PretrainExpError):
    """An insertion item or placement cannot be honoured (too long, overlapping, outside the window, ...)."""


class LaunchError(PretrainExpError):
    """A job cannot be launched as configured (allocation too small, unsupported topology, ...)."""


class TrainingError(PretrainExpError):
    """Training failed at run time (the only error class the experiment loop retries)."""


class CheckpointError(PretrainExpError):
    """A checkpoint is missing, incomplete or inconsistent with the run."""


class StorageError(PretrainExpError):
    """A file could not be written because its filesystem is full (``ENOSPC``) or the quota is used up
    (``EDQUOT``). The message names what was being written, where, and how to go on."""


class PushError(PretrainExpError):
    """A push to the Hugging Face Hub was refused or failed (offline, no token, a refused token, a network error).
    The message names what to set or do; it never holds the token."""
