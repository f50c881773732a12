"""Read an OLMo-2 (old trainer) unsharded checkpoint ``step<N>-unsharded/`` without the ``ai2-olmo`` package.

Layout, as written by OLMo's ``FullCheckpointer.save_checkpoint`` (allenai/OLMo ``olmo/checkpoint.py``)::

    config.yaml                     TrainConfig dump (``model:``, ``optimizer:``, ``scheduler:``, ``data:``, ...)
    model.pt | model.safetensors    model state: ``transformer.wte.weight``, ``transformer.blocks.{i}.att_proj.weight``,
                                    ... (fused QKV and SwiGLU projections; see
                                    :mod:`pretrain_exp.frameworks.olmo2.convert`)
    optim.pt | optim.safetensors    ``FSDP.optim_state_dict`` of OLMo's AdamW: ``state`` keyed by parameter name,
                                    ``param_groups`` with ``params`` and ``param_names`` (FSDP's
                                    ``_fsdp_wrapped_module.`` prefix in the names); optional
    train.pt                        trainer state (``olmo/train.py`` ``Trainer.trainer_state_dict``): ``global_step``,
                                    ``global_train_examples_seen_this_epoch``, ``global_train_tokens_seen``,
                                    ``epoch``, ``world_size``, checkpoint lists of ``pathlib`` paths, RNG states
                                    (python tuple, numpy ``get_state()`` tuple holding an ``ndarray``, torch tensors)

Memory: ``model.pt``/``optim.pt`` are memory-mapped (``torch.load(weights_only=True, mmap=True)``,
copy-on-write), so a 7B/13B state is paged in as it is used rather than read whole first.

Safety: ``.pt`` files are read with ``torch.load(weights_only=True)``; ``train.pt`` needs ``pathlib`` paths and
numpy arrays, which are allow-listed by :data:`~pretrain_exp.frameworks.base.TRAIN_STATE_SAFE_GLOBALS` (nothing else;
any other type is refused).
OLMo's ``.safetensors`` variant (``olmo/safetensors_util.py``) stores each key as a base64 pickle of
``(key tuple, value_is_pickled)`` and non-tensor values as pickled bytes; those pickles are read opcode by
opcode (``pickletools.genops``), never run, and may hold plain Python values only. torch's own weights-only
unpickler cannot serve here: it rejects the protocol-4 ``FRAME`` opcode these pickles use. Nothing this project
writes (plans, manifests, checkpoints) is pickled.
"""

from __future__ import annotations

import base64
import logging
import pickletools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional

import torch
import yaml

from pretrain_exp.core.errors import CheckpointError
from pretrain_exp.frameworks.base import TRAIN_STATE_SAFE_GLOBALS

log = logging.getLogger(__name__)

FSDP_PREFIX = "_fsdp_wrapped_module."  #: inserted into parameter names by FSDP (removed on reading)


@dataclass
class OLMo2Checkpoint:
    """The raw contents of one ``step<N>-unsharded/`` folder, in OLMo-2's own names.

    Tensors are on the CPU in the dtype they were saved in (float32 for the public checkpoints).
    """

    path: Path  #: the checkpoint folder
    config: Dict[str, Any]  #: ``config.yaml`` as plain dicts/lists (``yaml.safe_load``)
    model_state: Dict[str, torch.Tensor]  #: OLMo-2 parameter name -> tensor (FSDP prefixes removed)
    optim_state: Optional[Dict[str, Any]]  #: ``{"state": {name: {...}}, "param_groups": [...]}``, or None if absent
    train_state: Dict[str, Any]  #: ``train.pt`` (see module docstring)


def strip_fsdp_prefix(name: str) -> str:
    """``name`` without FSDP's ``_fsdp_wrapped_module.`` segments (as OLMo's own loader does)."""
    return name.replace(FSDP_PREFIX, "")


def _first_existing(ckpt_dir: Path, names: tuple) -> Optional[Path]:
    for name in names:
        if (ckpt_dir / name).is_file():
            return ckpt_dir / name
    return None


def _require(ckpt_dir: Path, names: tuple, what: str) -> Path:
    path = _first_existing(ckpt_dir, names)
    if path is None:
        raise CheckpointError(f"{ckpt_dir}: {what} missing (expected {' or '.join(names)})")
    return path


def read_config(ckpt_dir: str | Path) -> Dict[str, Any]:
    """``config.yaml`` of a checkpoint as a dict (``yaml.safe_load``).

    :raises CheckpointError: if the file is missing, is not YAML, or its top level is not a mapping.
    """
    path = _require(Path(ckpt_dir), ("config.yaml",), "config.yaml")
    try:
        cfg = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise CheckpointError(f"{path}{where}: not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{path}: expected a mapping at the top level, got {type(cfg).__name__}")
    return cfg


# ------------------------------------------------------------------------------------------------ safetensors


_PUSH_ARG = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINBYTES", "BINBYTES", "BINBYTES8",
             "BININT", "BININT1", "BININT2", "LONG1", "LONG4", "INT", "LONG", "BINFLOAT", "FLOAT"}
_PUSH_CONST = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False}
_TUPLE_N = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}


def _plain_unpickle(data: bytes) -> Any:
    """The plain value (str, bytes, int, float, bool, None, tuple, list, dict) of pickle ``data``, read from its
    opcodes (``pickletools.genops``) without running it: a global, or an opcode that builds anything else,
    raises ``ValueError``. Opcodes: ``Lib/pickletools.py``."""
    stack: list = []
    marks: list = []
    memo: Dict[int, Any] = {}

    def since_mark() -> list:
        i = marks.pop()
        items = stack[i:]
        del stack[i:]
        return items

    for op, arg, _ in pickletools.genops(data):
        name = op.name
        if name in ("PROTO", "FRAME"):
            continue
        if name == "STOP":
            return stack.pop()
        if name in _PUSH_ARG:
            stack.append(arg)
        elif name in _PUSH_CONST:
            stack.append(_PUSH_CONST[name])
        elif name == "MARK":
            marks.append(len(stack))
        elif name in ("EMPTY_TUPLE", "EMPTY_LIST", "EMPTY_DICT"):
            stack.append({"EMPTY_TUPLE": (), "EMPTY_LIST": [], "EMPTY_DICT": {}}[name])
        elif name in _TUPLE_N:
            n = _TUPLE_N[name]
            items = tuple(stack[-n:])
            del stack[-n:]
            stack.append(items)
        elif name == "TUPLE":
            stack.append(tuple(since_mark()))
        elif name == "LIST":
            stack.append(since_mark())
        elif name == "DICT":
            items = since_mark()
            stack.append(dict(zip(items[::2], items[1::2])))
        elif name == "APPEND":
            stack[-2].append(stack.pop())
        elif name == "APPENDS":
            items = since_mark()
            stack[-1].extend(items)
        elif name == "SETITEM":
            v, k = stack.pop(), stack.pop()
            stack[-1][k] = v
        elif name == "SETITEMS":
            items = since_mark()
            stack[-1].update(zip(items[::2], items[1::2]))
        elif name == "MEMOIZE":
            memo[len(memo)] = stack[-1]
        elif name in ("BINPUT", "LONG_BINPUT", "PUT"):
            memo[arg] = stack[-1]
        elif name in ("BINGET", "LONG_BINGET", "GET"):
            stack.append(memo[arg])
        elif name in ("GLOBAL", "STACK_GLOBAL"):
            what = arg.replace(" ", ".") if name == "GLOBAL" else f"{stack[-2]}.{stack[-1]}"
            raise ValueError(f"refusing to load {what}: only plain values are allowed")
        else:
            raise ValueError(f"pickle opcode {name} builds more than a plain value")
    raise ValueError("pickle without STOP")


def read_olmo_safetensors(path: str | Path) -> Dict[str, Any]:
    """Read a ``.safetensors`` file written by OLMo's ``state_dict_to_safetensors_file`` into a nested dict.

    Source: allenai/OLMo ``olmo/safetensors_util.py`` (key = urlsafe-base64 pickle of ``(keys, value_is_pickled)``;
    a pickled value is a ``uint8`` tensor of pickle bytes). Pickles are read from their opcodes, never run.

    :raises CheckpointError: if the file cannot be read, a key is not an OLMo key, or a value needs a global.
    """
    from safetensors.torch import load_file

    path = Path(path)
    try:
        flat = load_file(str(path), device="cpu")
    except Exception as e:  # safetensors raises its own error types
        raise CheckpointError(f"{path}: cannot read safetensors file: {e}") from None
    out: Dict[str, Any] = {}
    for raw_key, value in flat.items():
        try:
            keys, value_is_pickled = _plain_unpickle(base64.urlsafe_b64decode(raw_key))
            if value_is_pickled:
                value = _plain_unpickle(value.numpy().tobytes())
        except Exception as e:
            raise CheckpointError(f"{path}: key {raw_key[:40]!r} is not an OLMo safetensors entry: {e}") from None
        target = out
        for k in keys[:-1]:
            target = target.setdefault(k, {})
        target[keys[-1]] = value
    return out


def _load_state(path: Path) -> Dict[str, Any]:
    if path.suffix == ".safetensors":
        return read_olmo_safetensors(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)  # pages read on use
    except Exception as e:  # pickle.UnpicklingError, RuntimeError for a truncated zip, ...
        raise CheckpointError(f"{path}: cannot be loaded with weights_only=True: {str(e).splitlines()[0]}") from None


# ------------------------------------------------------------------------------------------------ the three files


def read_model_state(ckpt_dir: str | Path) -> Dict[str, torch.Tensor]:
    """Model state of a checkpoint: OLMo-2 parameter name -> tensor (``model.safetensors`` preferred, else
    ``model.pt``), FSDP prefixes removed.

    :raises CheckpointError: if neither file exists or the file cannot be read safely.
    """
    path = _require(Path(ckpt_dir), ("model.safetensors", "model.pt"), "model state")
    state = _load_state(path)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: expected a flat mapping of parameter name -> tensor")
    return {strip_fsdp_prefix(k): v for k, v in state.items()}


def read_optim_state(ckpt_dir: str | Path) -> Optional[Dict[str, Any]]:
    """Optimizer state of a checkpoint keyed by OLMo-2 parameter name, or ``None`` if there is no optim file.

    Returns ``{"state": {name: {"step", "exp_avg", "exp_avg_sq"}}, "param_groups": [{..., "params": [name, ...],
    "param_names": [name, ...]}]}`` with FSDP prefixes removed. Integer-keyed state (a plain
    ``optimizer.state_dict()``) is re-keyed through each group's ``param_names``, as OLMo's
    ``FullCheckpointer._make_optim_state_dict_compatible`` does.

    :raises CheckpointError: if the file cannot be read or has neither layout.
    """
    path = _first_existing(Path(ckpt_dir), ("optim.safetensors", "optim.pt"))
    if path is None:
        return None
    osd = _load_state(path)
    try:
        groups = osd["param_groups"]
        id_to_name: Dict[Any, str] = {}
        for group in groups:
            names = [strip_fsdp_prefix(n) for n in group.get("param_names", group["params"])]
            id_to_name.update(zip(group["params"], names))
            group["param_names"] = names
            group["params"] = names
        state = {}
        for key, value in osd["state"].items():
            name = id_to_name[key] if key in id_to_name else strip_fsdp_prefix(str(key))
            state[name] = value
    except (KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{path}: not an optimizer state dict with 'state' and 'param_groups' ({e!r})") from None
    return {"state": state, "param_groups": groups}


def read_train_state(ckpt_dir: str | Path) -> Dict[str, Any]:
    """``train.pt`` of a checkpoint, loaded with ``weights_only=True`` and
    :data:`~pretrain_exp.frameworks.base.TRAIN_STATE_SAFE_GLOBALS`.

    :raises CheckpointError: if the file is missing, or holds a type outside the allow-list (the message names
        the refused global), or lacks ``global_step``.
    """
    path = _require(Path(ckpt_dir), ("train.pt",), "train.pt")
    try:
        with torch.serialization.safe_globals(TRAIN_STATE_SAFE_GLOBALS):
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        msg = " ".join(str(e).split())
        if "Unsupported global" in msg or "GLOBAL" in msg:
            glob = msg.split("GLOBAL", 1)[-1].split()[0] if "GLOBAL" in msg else "?"
            raise CheckpointError(f"{path}: refusing to unpickle {glob} (weights_only=True; allowed non-tensor "
                                  f"types: pathlib paths, numpy arrays)") from None
        raise CheckpointError(f"{path}: cannot be loaded with weights_only=True: {msg[:200]}") from None
    if not isinstance(state, dict) or "global_step" not in state:
        raise CheckpointError(f"{path}: not an OLMo trainer state (no 'global_step')")
    return state


def read_checkpoint(ckpt_dir: str | Path, *, optimizer: bool = True) -> OLMo2Checkpoint:
    """Read every file of an OLMo-2 ``step<N>-unsharded/`` folder.

    :param ckpt_dir: the local checkpoint folder (e.g. from
        :func:`pretrain_exp.frameworks.download.download_olmo2_checkpoint`).
    :param optimizer: also read ``optim.*`` (a missing optimizer file gives ``optim_state=None`` and a warning).
    :raises CheckpointError: if the folder, ``config.yaml``, the model file or ``train.pt`` is missing or unreadable.
    """
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        raise CheckpointError(f"{ckpt_dir}: OLMo-2 checkpoint folder not found")
    config = read_config(ckpt_dir)
    train_state = read_train_state(ckpt_dir)
    model_state = read_model_state(ckpt_dir)
    optim_state = read_optim_state(ckpt_dir) if optimizer else None
    if optimizer and optim_state is None:
        log.warning("%s: no optim.safetensors or optim.pt; the optimizer starts from zero moments", ckpt_dir)
    return OLMo2Checkpoint(ckpt_dir, config, model_state, optim_state, train_state)
