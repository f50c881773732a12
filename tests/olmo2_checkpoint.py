"""Build a tiny OLMo-2 ``step<N>-unsharded/`` checkpoint in the exact layout the old OLMo trainer writes.

Sources: allenai/OLMo ``olmo/model.py`` (parameter names of ``OLMo`` with ``OLMoSequentialBlock``, fused
``att_proj`` = [q; k; v] rows and ``ff_proj`` = [x; gate] rows, ``norm_after``), ``olmo/optim.py``
(``get_param_groups``: a decay group and a no-decay group, names sorted; AdamW state ``step``/``exp_avg``/
``exp_avg_sq``), ``olmo/checkpoint.py`` (``FullCheckpointer``: ``model.pt``, ``optim.pt`` from
``FSDP.optim_state_dict`` keyed by name, with FSDP-prefixed ``param_names``; ``train.pt``; ``config.yaml``),
``olmo/train.py`` (``trainer_state_dict``), ``olmo/safetensors_util.py`` (the ``.safetensors`` variant) and
``configs/peteish*.yaml`` (the config keys). Nothing here imports the code under test.
"""

from __future__ import annotations

import base64
import pathlib
import pickle
import random
from pathlib import Path
from typing import Any, Dict

import numpy as np
import torch
import yaml

D_MODEL, N_HEADS, N_KV_HEADS, N_LAYERS = 64, 4, 2, 2
MLP_HIDDEN = 192  #: OLMo's fused SwiGLU width (the MLP's hidden size is half of it)
VOCAB, EMBEDDING = 300, 384
SEQ_LEN, BATCH = 16, 4  #: model.max_sequence_length, global_train_batch_size
SEED = 6198
STEP = 37
LR, BETAS, EPS, WD = 1e-3, (0.9, 0.95), 1e-8, 0.1
EOS, PAD = 1, 0
FSDP = "_fsdp_wrapped_module."


def olmo2_config(data_paths) -> Dict[str, Any]:
    """A ``config.yaml`` as OLMo's ``TrainConfig`` dumps it for a peteish-style run (subset of its keys)."""
    return {
        "run_name": "tiny-peteish", "seed": SEED, "epoch": None, "dry_run": False,
        "model": {
            "d_model": D_MODEL, "n_heads": N_HEADS, "n_kv_heads": N_KV_HEADS, "clip_qkv": None, "n_layers": N_LAYERS,
            "mlp_ratio": 8, "mlp_hidden_size": MLP_HIDDEN, "activation_type": "swiglu", "block_type": "sequential",
            "block_group_size": 1, "alibi": False, "alibi_bias_max": 8.0, "rope": True, "rope_full_precision": True,
            "rope_theta": 500000, "flash_attention": False, "attention_dropout": 0.0, "multi_query_attention": None,
            "attention_layer_norm": True, "residual_dropout": 0.0, "embedding_dropout": 0.0,
            "embedding_layer_norm": False, "layer_norm_type": "rms", "layer_norm_with_affine": True,
            "layer_norm_eps": 1e-6, "attention_layer_norm_with_affine": True, "max_sequence_length": SEQ_LEN,
            "include_bias": False, "bias_for_layer_norm": False, "scale_logits": False, "vocab_size": VOCAB,
            "embedding_size": EMBEDDING, "weight_tying": False, "eos_token_id": EOS, "pad_token_id": PAD,
            "init_device": "meta", "init_fn": "normal", "init_std": 0.02, "init_cutoff_factor": 3.0,
            "precision": "amp_bf16", "scale_emb_init": False, "emb_init_std": None, "norm_after": True,
        },
        "optimizer": {
            "name": "adamw", "learning_rate": LR, "weight_decay": WD, "betas": list(BETAS), "eps": EPS,
            "no_decay_norm_and_bias": None, "selective_updates": False, "decay_norm_and_bias": True,
            "decay_embeddings": False, "metrics_log_interval": 1, "record_update_metrics": False,
        },
        "scheduler": {"name": "cosine_with_warmup", "units": "tokens", "t_warmup": 1000, "t_max": 100000,
                      "alpha_f": 0.1, "warmup_min_lr": 0.0},
        "data": {
            "paths": [str(p) for p in data_paths], "datasets": None, "label_mask_paths": None,
            "memmap_dtype": "uint16", "pad_direction": "right", "generate_attention_mask": False,
            "generate_doc_lengths": False, "num_workers": 0, "drop_last": True, "pin_memory": True,
            "prefetch_factor": None, "persistent_workers": True, "timeout": 0, "seed": None,
            "instance_filter": {"repetition_max_period": 13, "repetition_min_period": 1, "repetition_max_count": 32},
            "custom_dataset": None,
        },
        "global_train_batch_size": BATCH, "device_train_microbatch_size": 2, "max_duration": "1ep",
        "max_grad_norm": 1.0, "precision": "amp_bf16", "save_folder": "/weka/checkpoints/tiny-peteish",
        "sharded_checkpointer": "olmo_core", "restore_dataloader": True, "fast_forward_batches": None,
    }


def olmo2_model_state(seed: int = 0) -> Dict[str, torch.Tensor]:
    """Random fused weights with OLMo-2's names and shapes (norm weights around 1 so they matter)."""
    g = torch.Generator().manual_seed(seed)
    head_dim = D_MODEL // N_HEADS
    kv = N_KV_HEADS * head_dim

    def w(*shape, std=0.05):
        return torch.randn(*shape, generator=g) * std

    def norm(n):
        return 1.0 + 0.2 * torch.randn(n, generator=g)

    sd = {"transformer.wte.weight": w(EMBEDDING, D_MODEL, std=0.5)}
    for i in range(N_LAYERS):
        b = f"transformer.blocks.{i}."
        sd[b + "att_proj.weight"] = w(D_MODEL + 2 * kv, D_MODEL, std=0.2)
        sd[b + "attn_out.weight"] = w(D_MODEL, D_MODEL)
        sd[b + "ff_proj.weight"] = w(MLP_HIDDEN, D_MODEL, std=0.2)
        sd[b + "ff_out.weight"] = w(D_MODEL, MLP_HIDDEN // 2)
        sd[b + "q_norm.weight"] = norm(D_MODEL)
        sd[b + "k_norm.weight"] = norm(kv)
        sd[b + "attn_norm.weight"] = norm(D_MODEL)
        sd[b + "ff_norm.weight"] = norm(D_MODEL)
    sd["transformer.ln_f.weight"] = norm(D_MODEL)
    sd["transformer.ff_out.weight"] = w(EMBEDDING, D_MODEL)
    return sd


def olmo2_optim_state(model_state: Dict[str, torch.Tensor], seed: int = 1, int_keys: bool = False) -> Dict[str, Any]:
    """``FSDP.optim_state_dict`` of OLMo's AdamW after ``STEP`` steps: peteish groups (decay: every Linear and
    norm weight, no decay: ``transformer.wte.weight``), FSDP-prefixed ``param_names``. ``int_keys``: the plain
    ``optimizer.state_dict()`` form (state keyed by position) instead."""
    g = torch.Generator().manual_seed(seed)
    no_decay = ["transformer.wte.weight"]
    decay = sorted(n for n in model_state if n not in no_decay)

    def fsdp(name: str) -> str:  # FSDP wraps the model and each block
        if name.startswith("transformer.blocks."):
            i, rest = name[len("transformer.blocks."):].split(".", 1)
            return f"{FSDP}transformer.blocks.{i}.{FSDP}{rest}"
        return FSDP + name

    state = {n: {"step": torch.tensor(float(STEP)),
                 "exp_avg": torch.randn(p.shape, generator=g) * 1e-2,
                 "exp_avg_sq": torch.rand(p.shape, generator=g) * 1e-4 + 1e-6} for n, p in model_state.items()}
    common = {"lr": LR * 0.5, "initial_lr": LR, "betas": BETAS, "eps": EPS, "amsgrad": False, "foreach": None,
              "maximize": False, "capturable": False, "differentiable": False, "fused": None, "sharded": True,
              "max_grad_norm": 1.0, "max_grad_norm_ratio": None}
    groups = [{**common, "weight_decay": WD, "params": decay, "param_names": [fsdp(n) for n in decay]},
              {**common, "weight_decay": 0.0, "params": no_decay, "param_names": [fsdp(n) for n in no_decay]}]
    if int_keys:
        ids = {n: i for i, n in enumerate(decay + no_decay)}
        state = {ids[n]: s for n, s in state.items()}
        for grp in groups:
            grp["params"] = [ids[n] for n in grp["params"]]
    return {"state": state, "param_groups": groups}


def olmo2_train_state(step: int = STEP, epoch: int = 0) -> Dict[str, Any]:
    """``Trainer.trainer_state_dict()`` with real python/numpy/torch RNG states and ``pathlib`` paths."""
    save = pathlib.Path("/weka/checkpoints/tiny-peteish")
    return {
        "epoch": epoch, "global_step": step, "global_train_examples_seen_this_epoch": step * BATCH,
        "global_train_tokens_seen": step * BATCH * SEQ_LEN, "world_size": 2,
        "checkpoints": [save / f"step{s}" for s in (10, 20, 30)],
        "unsharded_checkpoints": [save / f"step{step}-unsharded"], "ephemeral_checkpoints": [],
        "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.random.get_rng_state(),
                "cuda": None, "mps": None},
    }


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
    """Write ``<root>/step<STEP>-unsharded/`` and return it. ``config_changes``: dotted key -> value;
    ``numpy1_names``: see :func:`write_train_state`."""
    ckpt = Path(root) / f"step{STEP}-unsharded"
    ckpt.mkdir(parents=True)
    cfg = olmo2_config(data_paths)
    for key, value in (config_changes or {}).items():
        *parents, last = key.split(".")
        node = cfg
        for p in parents:
            node = node[p]
        node[last] = value
    (ckpt / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    model = olmo2_model_state()
    optim = olmo2_optim_state(model, int_keys=int_keys)
    if safetensors:
        write_olmo_safetensors(model, ckpt / "model.safetensors")
        write_olmo_safetensors(optim, ckpt / "optim.safetensors")
    else:
        torch.save(model, ckpt / "model.pt")
        torch.save(optim, ckpt / "optim.pt")
    write_train_state(ckpt / "train.pt", olmo2_train_state(), numpy1_names)
    return ckpt
