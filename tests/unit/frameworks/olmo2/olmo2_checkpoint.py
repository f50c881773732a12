"""Build a tiny OLMo-2 ``step<N>-unsharded/`` checkpoint in the exact layout the old OLMo trainer writes.

The layout is written by :mod:`pretrain_exp.frameworks.olmo2.presets`; this module adds what only the tests need: values
far from an initialisation (so every norm and moment matters), the ``.safetensors`` variant, integer-keyed
optimizer state, ``train.pt`` pickled with numpy 1.x names, and config changes.

Sources: allenai/OLMo ``olmo/model.py`` (parameter names of ``OLMo`` with ``OLMoSequentialBlock``, fused
``att_proj`` = [q; k; v] rows and ``ff_proj`` = [x; gate] rows, ``norm_after``), ``olmo/optim.py``
(``get_param_groups``: a decay group and a no-decay group, names sorted; AdamW state ``step``/``exp_avg``/
``exp_avg_sq``), ``olmo/checkpoint.py`` (``FullCheckpointer``: ``model.pt``, ``optim.pt`` from
``FSDP.optim_state_dict`` keyed by name, with FSDP-prefixed ``param_names``; ``train.pt``; ``config.yaml``),
``olmo/train.py`` (``trainer_state_dict``), ``olmo/safetensors_util.py`` (the ``.safetensors`` variant) and
``configs/peteish*.yaml`` (the config keys). Nothing here uses the reader or the converter under test.
"""

from __future__ import annotations

import base64
import pathlib
import pickle
import random
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict

import numpy as np
import torch

from pretrain_exp.frameworks.olmo2 import presets
from pretrain_exp.frameworks.olmo2.presets import CheckpointSpec

D_MODEL, N_HEADS, N_KV_HEADS, N_LAYERS = 64, 4, 2, 2
MLP_HIDDEN = 192  #: OLMo's fused SwiGLU width (the MLP's hidden size is half of it)
VOCAB, EMBEDDING = 300, 384
SEQ_LEN, BATCH = 16, 4  #: model.max_sequence_length, global_train_batch_size
SEED = 6198
STEP = 37
LR, BETAS, EPS, WD = 1e-3, (0.9, 0.95), 1e-8, 0.1
EOS, PAD = 1, 0
SAVE_FOLDER = "/weka/checkpoints/tiny-peteish"

SPEC = CheckpointSpec(
    d_model=D_MODEL, n_heads=N_HEADS, n_kv_heads=N_KV_HEADS, n_layers=N_LAYERS, mlp_hidden=MLP_HIDDEN,
    vocab_size=VOCAB, embedding_size=EMBEDDING, max_sequence_length=SEQ_LEN, global_train_batch_size=BATCH,
    seed=SEED, step=STEP, eos_token_id=EOS, pad_token_id=PAD, learning_rate=LR, betas=BETAS, eps=EPS,
    weight_decay=WD, memmap_dtype="uint16", world_size=2, run_name="tiny-peteish", save_folder=SAVE_FOLDER,
    instance_filter={"repetition_max_period": 13, "repetition_min_period": 1, "repetition_max_count": 32})


def olmo2_config(data_paths) -> Dict[str, Any]:
    """A ``config.yaml`` as OLMo's ``TrainConfig`` dumps it for a peteish-style run (subset of its keys)."""
    return presets.olmo2_config(replace(SPEC, data_paths=tuple(str(p) for p in data_paths)))


def olmo2_model_state(seed: int = 0) -> Dict[str, torch.Tensor]:
    """Random fused weights with OLMo-2's names and shapes (norm weights around 1 so they matter)."""
    g = torch.Generator().manual_seed(seed)
    std = {"wte": 0.5, "att_proj": 0.2, "ff_proj": 0.2}
    sd = {}
    for name, shape in presets.parameter_shapes(SPEC).items():
        if len(shape) == 1:
            sd[name] = 1.0 + 0.2 * torch.randn(shape, generator=g)
        else:
            sd[name] = torch.randn(shape, generator=g) * std.get(name.split(".")[-2], 0.05)
    return sd


def olmo2_optim_state(model_state: Dict[str, torch.Tensor], seed: int = 1, int_keys: bool = False) -> Dict[str, Any]:
    """``FSDP.optim_state_dict`` of OLMo's AdamW after ``STEP`` steps: peteish groups (decay: every Linear and
    norm weight, no decay: ``transformer.wte.weight``), FSDP-prefixed ``param_names``. ``int_keys``: the plain
    ``optimizer.state_dict()`` form (state keyed by position) instead."""
    g = torch.Generator().manual_seed(seed)
    moments = {n: (torch.randn(p.shape, generator=g) * 1e-2, torch.rand(p.shape, generator=g) * 1e-4 + 1e-6)
               for n, p in model_state.items()}
    osd = presets.adamw_state(SPEC, model_state, moments=moments, lr=LR * 0.5)
    if int_keys:
        ids = {n: i for i, n in enumerate(n for grp in osd["param_groups"] for n in grp["params"])}
        osd["state"] = {ids[n]: s for n, s in osd["state"].items()}
        for grp in osd["param_groups"]:
            grp["params"] = [ids[n] for n in grp["params"]]
    return osd


def olmo2_train_state(step: int = STEP, epoch: int = 0) -> Dict[str, Any]:
    """``Trainer.trainer_state_dict()`` with the live python/numpy/torch RNG states and ``pathlib`` paths."""
    state = presets.train_state(replace(SPEC, step=step), epoch=epoch, rng={
        "python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.random.get_rng_state(),
        "cuda": None, "mps": None})
    state["checkpoints"] = [pathlib.Path(SAVE_FOLDER) / f"step{s}" for s in (10, 20, 30)]
    return state


def _numpy_reconstruct():
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy 1.x
        from numpy.core.multiarray import _reconstruct
    return _reconstruct


class Numpy1Pickler(pickle._Pickler):
    """A pickler that names numpy's array constructor ``numpy.core.multiarray._reconstruct``, as numpy 1.x
    (which wrote the published OLMo-2 checkpoints) does; numpy 2 writes ``numpy._core.multiarray``."""

    dispatch = dict(pickle._Pickler.dispatch)

    def save_global(self, obj, name=None):
        if obj is _numpy_reconstruct():
            self.write(pickle.GLOBAL + b"numpy.core.multiarray\n_reconstruct\n")
            self.memoize(obj)
            return
        super().save_global(obj, name)


class _Numpy1PickleModule:
    Pickler = Numpy1Pickler


def write_train_state(path: Path, state: Dict[str, Any], numpy1_names: bool = True) -> None:
    """``torch.save`` of a trainer state; ``numpy1_names``: numpy arrays named as numpy 1.x names them."""
    if numpy1_names:
        torch.save(state, path, pickle_module=_Numpy1PickleModule)
    else:
        torch.save(state, path)


def write_olmo_safetensors(state: Dict[str, Any], path: Path) -> None:
    """OLMo's ``state_dict_to_safetensors_file``: nested keys flattened, each key a base64 pickle of
    ``(keys, value_is_pickled)``, non-tensor values pickled into ``uint8`` tensors."""
    import safetensors.torch

    flat: Dict[str, torch.Tensor] = {}

    def walk(d, prefix):
        for k, v in d.items():
            if isinstance(v, torch.Tensor):
                flat[base64.urlsafe_b64encode(pickle.dumps((prefix + (k,), False))).decode("ascii")] = v
            elif isinstance(v, dict):
                walk(v, prefix + (k,))
            else:
                data = torch.frombuffer(bytearray(pickle.dumps(v)), dtype=torch.uint8)
                flat[base64.urlsafe_b64encode(pickle.dumps((prefix + (k,), True))).decode("ascii")] = data

    walk(state, ())
    safetensors.torch.save_file(flat, str(path))


def write_olmo2_checkpoint(root: Path, data_paths, *, safetensors: bool = False, int_keys: bool = False,
                           numpy1_names: bool = True, config_changes: Dict[str, Any] | None = None) -> Path:
    """Write ``<root>/step<STEP>-unsharded/`` with :func:`pretrain_exp.frameworks.olmo2.presets.write_checkpoint` and
    return it.
    ``safetensors``: ``model.safetensors``/``optim.safetensors`` instead of ``.pt``; ``config_changes``: dotted
    key -> value; ``numpy1_names``: see :func:`write_train_state`."""
    cfg = olmo2_config(data_paths)
    for key, value in (config_changes or {}).items():
        *parents, last = key.split(".")
        node = cfg
        for p in parents:
            node = node[p]
        node[last] = value
    model = olmo2_model_state()
    optim = olmo2_optim_state(model, int_keys=int_keys)
    train = olmo2_train_state()
    ckpt = presets.write_checkpoint(root, SPEC, config=cfg, model_state=model, optim_state=optim, train=train)
    if safetensors:
        write_olmo_safetensors(model, ckpt / "model.safetensors")
        write_olmo_safetensors(optim, ckpt / "optim.safetensors")
        (ckpt / "model.pt").unlink()
        (ckpt / "optim.pt").unlink()
    if numpy1_names:
        write_train_state(ckpt / "train.pt", train, numpy1_names)
    return ckpt
