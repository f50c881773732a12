"""OLMo-core's private members, reached in this module only.

The ``olmo_core`` (and ``olmo2``) framework needs a few members OLMo-core does not publish: the data loader's epoch,
global-indices file and per-instance reads (the verifier's :meth:`peek_rows
<pretrain_exp.frameworks.olmo_core.framework.OlmoCoreFramework.peek_rows>` and the shared permutation cache,
:mod:`~pretrain_exp.frameworks.olmo_core.global_indices`), the dataset config's path resolution (a checkpoint's
token files), the process-wide device mesh (reset before each segment's train module) and the checkpointer
callback's bookkeeping (the segment-end save left running,
:class:`~pretrain_exp.frameworks.olmo_core.callbacks.SegmentCheckpointer`). :data:`MEMBERS` lists each one with
its owner, what it must look like and what it is used for; every accessor below checks its member before use and
raises :class:`OlmoCoreChanged` naming the member and the installed OLMo-core version if an upgrade moved or
changed it. :func:`check` / :func:`problems` check them all at
once (the framework does when it is built; ``tests/unit/frameworks/olmo_core/test_upstream.py`` has a test per
member). Tested with ai2-olmo-core :data:`TESTED_WITH` (the version ``pyproject.toml`` pins).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from pretrain_exp.core.errors import PretrainExpError

#: the OLMo-core version these members were read from (``pyproject.toml``'s ``olmo`` extra pins it)
TESTED_WITH = "3.0.0"


class OlmoCoreChanged(PretrainExpError):
    """The installed OLMo-core lacks a private member pretrain_exp reaches, or the member's parameters changed
    (an OLMo-core upgrade). The message names the member, the installed version and the tested one."""


@dataclass(frozen=True)
class Member:
    """One private member of OLMo-core.

    :param owner: ``"module:Class"`` (or ``"module"`` for a module attribute).
    :param kind: ``method`` (with ``params``), ``property``, ``field`` (a dataclass field), ``instance`` (set by
        ``__init__`` of the class or a base class) or ``module`` (a module-level variable).
    :param params: a method's parameter names after ``self`` that the project passes.
    :param used_for: what the project reads it for (in the error message).
    """

    owner: str
    name: str
    kind: str
    used_for: str
    params: Tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """``module.Class.name`` (or ``module.name``)."""
        return f"{self.owner.replace(':', '.')}.{self.name}"


_LOADER = "olmo_core.data.data_loader:NumpyFSLDataLoader"
_CKPT = "olmo_core.train.callbacks:CheckpointerCallback"
_TRAINER = "olmo_core.train.trainer:Trainer"
#: every private OLMo-core member the project reaches, by key
MEMBERS: Dict[str, Member] = {m.name: m for m in (
    Member(_LOADER, "_epoch", "instance", "reading a data loader's order of any epoch (peek_rows, global indices)"),
    Member(_LOADER, "_global_indices", "instance", "peek_rows reading an epoch's order from its file"),
    Member(_LOADER, "_global_indices_file", "property", "the global-indices file linked from the permutation cache"),
    Member(_LOADER, "_build_global_indices", "method", "peek_rows building an epoch's order without the cache"),
    Member(_LOADER, "_get_local_instance_indices", "method", "peek_rows slicing a global batch to a rank",
           ("indices",)),
    Member(_LOADER, "_get_dataset_item", "method", "peek_rows reading one instance as the loader does", ("idx",)),
    Member("olmo_core.data:NumpyFSLDatasetConfig", "_resolve_paths_metadata", "method",
           "a checkpoint's token files (dataset paths, mix, globs, source permutation)", ("allow_mix",)),
    Member("olmo_core.distributed.parallel", "_WORLD_MESH", "module",
           "resetting the process's device mesh before each segment builds its train module"),
    Member(_CKPT, "_latest_checkpoint_path", "field", "waiting for the segment-end checkpoint's config.json"),
    Member(_CKPT, "_latest_checkpoint_step", "field", "saving at the end of a segment only once"),
    Member(_CKPT, "_checkpoints", "field", "keeping OLMo-core's list of saved checkpoints when saving at a fit's end"),
    Member(_CKPT, "_save_checkpoint", "method", "the segment-end save and its hold time",
           ("save_async", "ephemeral")),
    Member(_CKPT, "_await_last_checkpoint", "method", "waiting for the asynchronous segment-end save"),
    Member(_TRAINER, "_dry_run_batch", "method", "not repeating the dry-run batch in a trainer continued in memory"),
)}


def installed_version() -> str:
    """The installed OLMo-core version (``ai2-olmo-core``'s metadata, else ``olmo_core.__version__``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ai2-olmo-core")
    except PackageNotFoundError:
        return str(getattr(importlib.import_module("olmo_core"), "__version__", "unknown"))


def _changed(member: Member, why: str) -> OlmoCoreChanged:
    return OlmoCoreChanged(
        f"OLMo-core {installed_version()}: {member.label} {why}; pretrain_exp reaches this private member for "
        f"{member.used_for} and is tested with ai2-olmo-core {TESTED_WITH} (pip install 'ai2-olmo-core=="
        f"{TESTED_WITH}', or update pretrain_exp/frameworks/olmo_core/upstream.py)")


class _Gone(Exception):
    pass


def _owner(member: Member):
    module, _, cls = member.owner.partition(":")
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise _Gone(f"cannot be imported ({e})") from None
    if not cls:
        return mod
    if not hasattr(mod, cls):
        raise _Gone(f"is gone ({module} has no {cls})")
    return getattr(mod, cls)


def problem_of(member: Member) -> Optional[str]:
    """Why ``member`` does not look as it says (kind, parameters) on the installed OLMo-core, or ``None``."""
    try:
        owner = _owner(member)
    except _Gone as e:
        return str(e)
    if member.kind == "module":
        return None if member.name in vars(owner) else "is gone"
    if member.kind == "field":
        names = {f.name for f in dataclasses.fields(owner)} if dataclasses.is_dataclass(owner) else set()
        return None if member.name in names else "is no longer a field of the dataclass"
    if member.kind == "instance":  # assigned in an __init__ of the class or a base: a name of its code
        inits = [c.__dict__["__init__"] for c in owner.__mro__ if "__init__" in c.__dict__]
        set_by_init = any(member.name in getattr(f, "__code__", None).co_names for f in inits
                          if getattr(f, "__code__", None) is not None)
        return None if set_by_init else "is no longer set by __init__"
    try:
        value = inspect.getattr_static(owner, member.name)
    except AttributeError:
        return "is gone"
    if member.kind == "property":
        return None if isinstance(value, property) else f"is no longer a property ({type(value).__name__})"
    if not callable(getattr(owner, member.name)):
        return "is no longer a method"
    params = inspect.signature(getattr(owner, member.name)).parameters
    missing = [p for p in member.params if p not in params]
    return f"has no parameter(s) {missing} (its signature: {inspect.signature(getattr(owner, member.name))})" \
        if missing else None


def check_member(key: str) -> Member:
    """Check member ``key`` of :data:`MEMBERS` on the installed OLMo-core now; returns it.

    :raises OlmoCoreChanged: naming the member, what changed, the installed and the tested OLMo-core version.
    """
    member = MEMBERS[key]
    why = problem_of(member)
    if why is not None:
        raise _changed(member, why)
    return member


#: :func:`check_member`, once per process for each member (what the accessors below use)
_checked = functools.lru_cache(maxsize=None)(check_member)


def problems() -> List[str]:
    """One message per member of :data:`MEMBERS` the installed OLMo-core lacks or changed (``[]`` if none)."""
    out = []
    for key in MEMBERS:
        try:
            check_member(key)
        except OlmoCoreChanged as e:
            out.append(str(e))
    return out


def check() -> None:
    """Check every member of :data:`MEMBERS` (each once per process).

    :raises OlmoCoreChanged: for the first one that moved or changed.
    """
    for key in MEMBERS:
        _checked(key)


def _get(obj: Any, key: str) -> Any:
    member = _checked(key)
    try:
        return getattr(obj, member.name)
    except AttributeError:
        raise _changed(member, f"is missing on this {type(obj).__name__}") from None


def _set(obj: Any, key: str, value: Any) -> None:
    member = _checked(key)
    if not hasattr(obj, member.name):
        raise _changed(member, f"is missing on this {type(obj).__name__}")
    setattr(obj, member.name, value)


# --- the data loader (``NumpyFSLDataLoader``) -------------------------------------------------------------------
def loader_epoch(loader) -> Optional[int]:
    """The epoch the loader's order is set to (OLMo-core counts from 1; ``None`` before its first reshuffle)."""
    return _get(loader, "_epoch")


def set_loader_epoch(loader, epoch: Optional[int]) -> None:
    """Point the loader's order at ``epoch`` without reshuffling (what ``reshuffle(epoch)`` sets, without its
    barrier and without building the order)."""
    _set(loader, "_epoch", None if epoch is None else int(epoch))


def global_indices_file(loader) -> Path:
    """The loader's global-indices file of its current epoch (``<work dir>/global_indices_...npy``)."""
    return Path(_get(loader, "_global_indices_file"))


def set_global_indices(loader, indices: Optional[np.ndarray]) -> None:
    """Hold ``indices`` (``uint32`` training order of the epoch) in memory, or ``None`` to read the epoch's file."""
    _set(loader, "_global_indices", indices)


def build_global_indices(loader) -> np.ndarray:
    """OLMo-core's own order of the loader's current epoch (``uint32`` instance ids), built in memory."""
    return _get(loader, "_build_global_indices")()


def local_instance_indices(loader, global_batch: np.ndarray) -> np.ndarray:
    """The instance ids of a global batch (``global_batch``: instance ids of its rows) that the loader's DP rank
    trains, in its order, as ``int64``."""
    return np.asarray(_get(loader, "_get_local_instance_indices")(global_batch), dtype=np.int64)


def dataset_item(loader, instance: int) -> Dict[str, Any]:
    """Instance ``instance`` as the loader hands it to its collator (``input_ids``, ``index``, ...)."""
    return _get(loader, "_get_dataset_item")(int(instance))


def wrap_dataset_item(loader, wrap: Callable[[Callable[[Any, int], Any]], Callable[[int], Any]]) -> None:
    """Route this loader object's instance reads (``_get_dataset_item(idx)``, in the training process and in its
    data-loader workers) through ``wrap(unbound original)``: a picklable callable of ``idx``."""
    _get(loader, "_get_dataset_item")  # checked, and present on this loader
    _set(loader, "_get_dataset_item", wrap(getattr(type(loader), "_get_dataset_item")))


# --- the dataset config ------------------------------------------------------------------------------------------
def resolve_paths(config) -> List[str]:
    """The token files of an OLMo-core ``NumpyDatasetConfig`` in OLMo-core's order: ``paths`` (globs expanded with
    ``expand_glob``) or ``mix`` under ``mix_base_dir``, permuted by ``source_permutation_seed``."""
    member = _checked("_resolve_paths_metadata")
    out = getattr(config, member.name)(allow_mix=True)
    if not (isinstance(out, tuple) and len(out) == 3):
        raise _changed(member, f"returns {type(out).__name__}, not (paths, metadata, label mask paths)")
    return [str(p) for p in out[0]]


# --- the device mesh -----------------------------------------------------------------------------------------------
def reset_world_mesh() -> None:
    """Forget the process's device mesh (OLMo-core builds one per process; each segment's train module builds its
    own)."""
    member = _checked("_WORLD_MESH")
    setattr(importlib.import_module(member.owner), member.name, None)


# --- the trainer ----------------------------------------------------------------------------------------------------
def skip_dry_run(trainer) -> None:
    """Make ``trainer.fit()`` skip OLMo-core's dry-run batch (a forward and backward pass over a mock batch before
    step 1, to compile the model and meet an out-of-memory error early; the gradients are zeroed after it): for a
    trainer continued in memory, which ran it in its first fit over the same shapes."""
    _set(trainer, "_dry_run_batch", lambda: None)


# --- the checkpointer callback -------------------------------------------------------------------------------------
def latest_checkpoint_path(checkpointer) -> Path:
    """The folder of the checkpointer's latest save (started, maybe still being written)."""
    return Path(_get(checkpointer, "_latest_checkpoint_path"))


def latest_checkpoint_step(checkpointer) -> int:
    """The step of the checkpointer's latest save (``-1`` before any)."""
    return int(_get(checkpointer, "_latest_checkpoint_step"))


def saved_checkpoints(checkpointer) -> list:
    """The checkpointer's own list of saved checkpoint paths (it trims the oldest past ``max_checkpoints``)."""
    return _get(checkpointer, "_checkpoints")


def save_checkpoint(checkpointer, save_async: Optional[bool] = None, ephemeral: bool = False) -> str:
    """Save now as the checkpointer does at its interval; returns the checkpoint's path. ``checkpointer`` may be a
    ``super()`` proxy (a subclass calling the base save from its own override)."""
    return _get(checkpointer, "_save_checkpoint")(save_async=save_async, ephemeral=ephemeral)


def await_last_checkpoint(checkpointer) -> None:
    """Return once the checkpointer's pending save (if any) is complete; re-raises its error."""
    _get(checkpointer, "_await_last_checkpoint")()
