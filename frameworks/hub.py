"""HF Hub model ids (``model.path=<org>/<name>``, optionally ``model.revision=<branch | tag | commit>``) resolved
to a local snapshot dir through ``huggingface_hub.snapshot_download``.

The Hub library does the work and honours its own environment: ``HF_HOME`` / ``HF_HUB_CACHE`` (where snapshots
live), ``HF_ENDPOINT`` (a mirror), ``HF_TOKEN`` (gated or private repos; never logged here) and
``HF_HUB_OFFLINE=1`` (no request; the snapshot must already be in the cache). Online, the revision is resolved to
its commit on the Hub and only the files a causal LM needs are fetched (configs, tokenizer files and
``*.safetensors``, else ``*.bin`` weights); a cached revision is not downloaded again.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import List, Optional

from pretrain_exp.core.errors import CheckpointError, ConfigError

log = logging.getLogger(__name__)

#: the files of a model snapshot a run reads (weights are added below: safetensors, else PyTorch ``.bin``)
MODEL_FILES = ["*.json", "*.model", "*.txt", "*.tiktoken", "*.jinja"]


def is_hub_id(path: str) -> bool:
    """Whether ``path`` is a syntactically valid Hub repo id (``name`` or ``org/name``) rather than a file path."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not path or path.startswith((".", "~", "/")):
        return False
    try:
        validate_repo_id(path)
    except HFValidationError:
        return False
    return True


def cached_revisions(repo_id: str) -> List[str]:
    """The refs (branch or tag names) and commits of ``repo_id`` in the local HF cache, sorted; ``[]`` if none."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        info = scan_cache_dir()
    except CacheNotFound:
        return []
    out = set()
    for repo in info.repos:
        if repo.repo_id == repo_id and repo.repo_type == "model":
            for rev in repo.revisions:
                out.add(rev.commit_hash)
                out.update(rev.refs)
    return sorted(out)


def resolved_commit(repo_id: str, revision: Optional[str] = None) -> Optional[str]:
    """The commit sha (40 hex digits) that ``revision`` (default ``main``) of Hub model ``repo_id`` resolves to in
    the local HF cache: the name of its snapshot folder (``models--<org>--<name>/snapshots/<sha>/``, the Hub
    library's cache layout), so a moving branch or tag stays reproducible. ``None`` if that revision is not
    cached. Nothing is downloaded."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        path = Path(snapshot_download(repo_id, revision=revision or "main", local_files_only=True,
                                      allow_patterns=["config.json"]))
    except (LocalEntryNotFoundError, OSError, ValueError):
        return None
    return path.name if re.fullmatch(r"[0-9a-f]{40}", path.name) else None


def hub_snapshot(repo_id: str, revision: Optional[str] = None) -> Path:
    """The local snapshot dir of Hub model ``repo_id`` at ``revision`` (default ``main``), downloaded if needed.

    :raises ConfigError: (``model.revision``) if the revision does not exist on the Hub, or (offline) is not in
        the cache while other revisions of the repo are.
    :raises CheckpointError: (``model.path``) if the repo cannot be found, or is not cached while offline, or the
        snapshot holds no ``config.json``.
    """
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    rev = revision or "main"
    offline = constants.HF_HUB_OFFLINE
    try:
        path = Path(snapshot_download(repo_id, revision=rev, allow_patterns=MODEL_FILES + ["*.safetensors"]))
        if not offline and not any(path.glob("*.safetensors")):  # a repo with PyTorch weights only
            path = Path(snapshot_download(repo_id, revision=rev, allow_patterns=MODEL_FILES + ["*.bin"]))
    except RevisionNotFoundError:
        raise ConfigError("model.revision", f"{rev!r} is not a branch, tag or commit of Hub model {repo_id!r}") \
            from None
    except GatedRepoError:
        raise CheckpointError(f"model.path={repo_id}: gated Hub model; accept its terms on the Hub and set HF_TOKEN "
                              "(or run `hf auth login`)") from None
    except RepositoryNotFoundError:
        raise CheckpointError(f"model.path={repo_id}: no such local dir, and no such Hub model (or it is private: "
                              "set HF_TOKEN)") from None
    except LocalEntryNotFoundError:
        known = cached_revisions(repo_id)
        where = f"the HF cache ({constants.HF_HUB_CACHE})"
        if known:
            raise ConfigError("model.revision", f"{rev!r} of Hub model {repo_id!r} is not in {where}; cached: "
                              f"{known}" + (" (HF_HUB_OFFLINE=1: nothing is downloaded)" if offline else "")) from None
        raise CheckpointError(f"model.path={repo_id}: no such local dir, and Hub model {repo_id!r} is not in {where}"
                              + (" (HF_HUB_OFFLINE=1: nothing is downloaded)" if offline else
                                 " and the Hub cannot be reached")) from None
    if not (path / "config.json").is_file():
        raise CheckpointError(f"model.path={repo_id}: the Hub snapshot {path} holds no config.json (not a "
                              "transformers model)")
    log.info("model %s@%s: %s", repo_id, rev, path)
    return path
