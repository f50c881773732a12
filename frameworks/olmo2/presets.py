"""Write checkpoints in the exact ``step<N>-unsharded/`` layout of the old OLMo trainer, and the tiny preset
``olmo2_tiny`` built from it once into the asset cache.

Sources: allenai/OLMo ``olmo/model.py`` (parameter names of ``OLMo`` with ``OLMoSequentialBlock``, fused
``att_proj`` = [q; k; v] rows and ``ff_proj`` = [x; gate] rows, ``norm_after``; ``init_fn: normal`` draws
weights from a normal of ``init_std`` truncated at ``init_cutoff_factor`` standard deviations, norm weights are
1), ``olmo/optim.py`` (``get_param_groups``: a decay group and a no-decay group, names sorted, empty groups left
out; AdamW state ``step``/``exp_avg``/``exp_avg_sq``), ``olmo/checkpoint.py`` (``FullCheckpointer``:
``model.pt``, ``optim.pt`` from ``FSDP.optim_state_dict`` keyed by name, with FSDP-prefixed ``param_names``;
``train.pt``; ``config.yaml``), ``olmo/train.py`` (``trainer_state_dict``; ``seed_all(seed)`` seeds python,
numpy and torch) and ``configs/peteish*.yaml`` (the config keys and values: AdamW with betas (0.9, 0.95),
eps 1e-8, weight decay 0.1 on every Linear and norm weight but not the embedding, the dolma2 tokenizer's
EOS 100257 and pad 100277).

``olmo2_tiny`` is OLMo-2 1B/7B/13B's architecture at toy size (multi-head attention, ``mlp_ratio`` 8, RoPE
θ = 500,000, RMSNorm ε = 1e-6, untied embeddings over the dolma2 vocabulary padded to 100,352) as a fresh run's
step-0 checkpoint: OLMo-2 seed 1 (the project's ``data.seed`` 0 with ``first_epoch`` 1), sequence length 128,
global batch size 8, no instance filter; its ``data.paths`` are the dolma2 token files of the Shakespeare corpus in
the cache (tokenized once when the preset is built), so ``data=checkpoint`` trains on them.
"""

from __future__ import annotations

import dataclasses
import pathlib
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np
import torch
import yaml

from pretrain_exp.core.cachedir import CacheDir
from pretrain_exp.core.errors import DataError
from pretrain_exp.data.assets import build_once

FSDP_PREFIX = "_fsdp_wrapped_module."  #: what FSDP inserts into parameter names (the model and each block)


@dataclass(frozen=True)
class CheckpointSpec:
    """What an OLMo-2 ``step<N>-unsharded/`` checkpoint holds, in OLMo-2's ``config.yaml`` terms."""

    d_model: int
    n_heads: int
    n_layers: int
    mlp_hidden: int  #: ``model.mlp_hidden_size``: the fused SwiGLU width (the MLP's hidden size is half of it)
    vocab_size: int  #: the tokenizer's ids
    embedding_size: int  #: rows of the embedding and output matrices (``vocab_size`` padded)
    max_sequence_length: int  #: L, tokens per instance
    global_train_batch_size: int  #: B, instances per optimizer step
    seed: int  #: OLMo-2's ``seed`` (also the data order's, ``data.seed`` being null)
    step: int  #: ``global_step`` of the checkpoint (optimizer steps done)
    eos_token_id: int
    pad_token_id: int
    n_kv_heads: Optional[int] = None  #: None = ``n_heads`` (multi-head attention), as OLMo-2 1B/7B/13B
    learning_rate: float = 4e-4  #: peak ``optimizer.learning_rate``
    betas: Tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    max_grad_norm: float = 1.0
    init_std: float = 0.02
    data_paths: Tuple[str, ...] = ()  #: ``data.paths``, token files in instance-id order
    memmap_dtype: str = "uint32"  #: ``data.memmap_dtype`` (uint32 for the dolma2 vocabulary)
    tokenizer: str = "tokenizers/allenai_dolma2.json"  #: ``tokenizer.identifier``
    instance_filter: Optional[Mapping[str, int]] = field(default=None)  #: ``data.instance_filter`` or None
    world_size: int = 1  #: data-parallel processes of the run
    run_name: str = "olmo2-run"
    save_folder: str = "checkpoints/olmo2-run"

    @property
    def kv_heads(self) -> int:
        """Key/value heads (``n_kv_heads`` or ``n_heads``)."""
        return self.n_kv_heads or self.n_heads


def olmo2_config(spec: CheckpointSpec) -> Dict[str, Any]:
    """The ``config.yaml`` of ``spec`` as OLMo's ``TrainConfig`` dumps it for a peteish-style run (the subset of
    its keys that describe the model, optimizer, scheduler, data and batch)."""
    return {
        "run_name": spec.run_name, "seed": spec.seed, "epoch": None, "dry_run": False,
        "model": {
            "d_model": spec.d_model, "n_heads": spec.n_heads, "n_kv_heads": spec.n_kv_heads, "clip_qkv": None,
            "n_layers": spec.n_layers, "mlp_ratio": 8, "mlp_hidden_size": spec.mlp_hidden,
            "activation_type": "swiglu", "block_type": "sequential", "block_group_size": 1, "alibi": False,
            "alibi_bias_max": 8.0, "rope": True, "rope_full_precision": True, "rope_theta": 500000,
            "flash_attention": False, "attention_dropout": 0.0, "multi_query_attention": None,
            "attention_layer_norm": True, "residual_dropout": 0.0, "embedding_dropout": 0.0,
            "embedding_layer_norm": False, "layer_norm_type": "rms", "layer_norm_with_affine": True,
            "layer_norm_eps": 1e-6, "attention_layer_norm_with_affine": True,
            "max_sequence_length": spec.max_sequence_length, "include_bias": False, "bias_for_layer_norm": False,
            "scale_logits": False, "vocab_size": spec.vocab_size, "embedding_size": spec.embedding_size,
            "weight_tying": False, "eos_token_id": spec.eos_token_id, "pad_token_id": spec.pad_token_id,
            "init_device": "meta", "init_fn": "normal", "init_std": spec.init_std, "init_cutoff_factor": 3.0,
            "precision": "amp_bf16", "scale_emb_init": False, "emb_init_std": None, "norm_after": True,
        },
        "optimizer": {
            "name": "adamw", "learning_rate": spec.learning_rate, "weight_decay": spec.weight_decay,
            "betas": list(spec.betas), "eps": spec.eps, "no_decay_norm_and_bias": None, "selective_updates": False,
            "decay_norm_and_bias": True, "decay_embeddings": False, "metrics_log_interval": 1,
            "record_update_metrics": False,
        },
        "tokenizer": {"identifier": spec.tokenizer, "truncate_direction": "right"},
        "scheduler": {"name": "cosine_with_warmup", "units": "tokens", "t_warmup": 1000, "t_max": 100000,
                      "alpha_f": 0.1, "warmup_min_lr": 0.0},
        "data": {
            "paths": [str(p) for p in spec.data_paths], "datasets": None, "label_mask_paths": None,
            "memmap_dtype": spec.memmap_dtype, "pad_direction": "right", "generate_attention_mask": False,
            "generate_doc_lengths": False, "num_workers": 0, "drop_last": True, "pin_memory": True,
            "prefetch_factor": None, "persistent_workers": True, "timeout": 0, "seed": None,
            "instance_filter": dict(spec.instance_filter) if spec.instance_filter is not None else None,
            "custom_dataset": None,
        },
        "global_train_batch_size": spec.global_train_batch_size,
        "device_train_microbatch_size": spec.global_train_batch_size // spec.world_size,
        "max_duration": "1ep", "max_grad_norm": spec.max_grad_norm, "precision": "amp_bf16",
        "save_folder": spec.save_folder, "sharded_checkpointer": "olmo_core", "restore_dataloader": True,
        "fast_forward_batches": None,
    }


def parameter_shapes(spec: CheckpointSpec) -> Dict[str, Tuple[int, ...]]:
    """OLMo-2 parameter name -> shape (rows, columns; norms are 1-D), embedding first, then each block, then the
    final norm and output matrix. ``att_proj`` has ``d_model + 2 * kv`` rows (kv = ``n_kv_heads * head_dim``),
    ``ff_proj`` ``mlp_hidden`` rows, ``ff_out`` ``mlp_hidden // 2`` columns."""
    d = spec.d_model
    kv = spec.kv_heads * (d // spec.n_heads)
    shapes: Dict[str, Tuple[int, ...]] = {"transformer.wte.weight": (spec.embedding_size, d)}
    for i in range(spec.n_layers):
        b = f"transformer.blocks.{i}."
        shapes.update({
            b + "att_proj.weight": (d + 2 * kv, d), b + "attn_out.weight": (d, d),
            b + "ff_proj.weight": (spec.mlp_hidden, d), b + "ff_out.weight": (d, spec.mlp_hidden // 2),
            b + "q_norm.weight": (d,), b + "k_norm.weight": (kv,), b + "attn_norm.weight": (d,),
            b + "ff_norm.weight": (d,),
        })
    shapes["transformer.ln_f.weight"] = (d,)
    shapes["transformer.ff_out.weight"] = (spec.embedding_size, d)
    return shapes


def init_model_state(spec: CheckpointSpec, seed: Optional[int] = None) -> Dict[str, torch.Tensor]:
    """OLMo's ``init_fn: normal`` initialisation of ``spec``'s model: float32 matrices from a normal of
    ``init_std`` truncated at ±3 std, norm weights 1.

    :param seed: torch generator seed; ``None`` = ``spec.seed``.
    """
    g = torch.Generator().manual_seed(spec.seed if seed is None else seed)
    state = {}
    for name, shape in parameter_shapes(spec).items():
        if len(shape) == 1:
            state[name] = torch.ones(shape)
        else:
            state[name] = torch.nn.init.trunc_normal_(torch.empty(shape), std=spec.init_std, a=-3 * spec.init_std,
                                                      b=3 * spec.init_std, generator=g)
    return state


def fsdp_name(name: str) -> str:
    """``name`` as FSDP reports it when OLMo wraps the model and each block (``_fsdp_wrapped_module.`` before the
    model's and the block's own names)."""
    if name.startswith("transformer.blocks."):
        i, rest = name[len("transformer.blocks."):].split(".", 1)
        return f"{FSDP_PREFIX}transformer.blocks.{i}.{FSDP_PREFIX}{rest}"
    return FSDP_PREFIX + name


def adamw_state(spec: CheckpointSpec, model_state: Mapping[str, torch.Tensor], *,
                moments: Optional[Mapping[str, Tuple[torch.Tensor, torch.Tensor]]] = None,
                lr: Optional[float] = None) -> Dict[str, Any]:
    """``FSDP.optim_state_dict`` of OLMo's AdamW at ``spec.step``, keyed by name: ``{"state": {name: {"step":
    float32 scalar tensor, "exp_avg": T, "exp_avg_sq": T}}, "param_groups": [decay group, no-decay group]}``
    (peteish groups: every Linear and norm weight decays, ``transformer.wte.weight`` does not; each group lists
    its names sorted in ``params`` and FSDP-prefixed in ``param_names``).

    :param moments: name -> ``(exp_avg, exp_avg_sq)``; ``None`` = zeros, the state torch's AdamW creates on its
        first step (so continuing from it equals a fresh optimizer; a step-0 AdamW has no per-parameter state,
        which the converter does not accept).
    :param lr: the learning rate the scheduler had set at ``spec.step``; ``None`` = ``spec.learning_rate``.
    """
    no_decay = ["transformer.wte.weight"]
    decay = sorted(n for n in model_state if n not in no_decay)
    state = {}
    for n, p in model_state.items():
        avg, avg_sq = moments[n] if moments is not None else (torch.zeros_like(p), torch.zeros_like(p))
        state[n] = {"step": torch.tensor(float(spec.step)), "exp_avg": avg, "exp_avg_sq": avg_sq}
    common = {"lr": spec.learning_rate if lr is None else lr, "initial_lr": spec.learning_rate,
              "betas": tuple(spec.betas), "eps": spec.eps, "amsgrad": False, "foreach": None, "maximize": False,
              "capturable": False, "differentiable": False, "fused": None, "sharded": True,
              "max_grad_norm": spec.max_grad_norm, "max_grad_norm_ratio": None}
    groups = [{**common, "weight_decay": wd, "params": names, "param_names": [fsdp_name(n) for n in names]}
              for wd, names in ((spec.weight_decay, decay), (0.0, no_decay)) if names]
    return {"state": state, "param_groups": groups}


def train_state(spec: CheckpointSpec, *, epoch: int = 0,
                rng: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """``Trainer.trainer_state_dict()`` at ``spec.step`` in epoch ``epoch`` (from 0): ``step * B`` instances seen
    this epoch, ``step * B * L`` tokens seen, this checkpoint in ``unsharded_checkpoints`` as a ``pathlib`` path.

    :param rng: ``{"python", "numpy", "torch", "cuda", "mps"}`` states; ``None`` = the states right after OLMo's
        ``seed_all(spec.seed)`` (python tuple, numpy ``("MT19937", uint32 array, ...)``, torch uint8 tensor).
    """
    if rng is None:
        rng = {"python": random.Random(spec.seed).getstate(),
               "numpy": np.random.RandomState(spec.seed).get_state(),
               "torch": torch.Generator().manual_seed(spec.seed).get_state(), "cuda": None, "mps": None}
    B, L = spec.global_train_batch_size, spec.max_sequence_length
    return {
        "epoch": epoch, "global_step": spec.step, "global_train_examples_seen_this_epoch": spec.step * B,
        "global_train_tokens_seen": spec.step * B * L, "world_size": spec.world_size, "checkpoints": [],
        "unsharded_checkpoints": [pathlib.Path(spec.save_folder) / f"step{spec.step}-unsharded"],
        "ephemeral_checkpoints": [], "rng": rng,
    }


def write_checkpoint(root: str | Path, spec: CheckpointSpec, *, config: Optional[Dict[str, Any]] = None,
                     model_state: Optional[Dict[str, torch.Tensor]] = None,
                     optim_state: Optional[Dict[str, Any]] = None,
                     train: Optional[Dict[str, Any]] = None) -> Path:
    """Write ``<root>/step<spec.step>-unsharded/`` (``config.yaml``, ``model.pt``, ``optim.pt``, ``train.pt``, as
    OLMo's ``FullCheckpointer`` does) and return it. Each part left ``None`` comes from :func:`olmo2_config`,
    :func:`init_model_state`, :func:`adamw_state` (zero moments) and :func:`train_state`.

    :raises FileExistsError: if the checkpoint folder exists.
    """
    ckpt = Path(root) / f"step{spec.step}-unsharded"
    ckpt.mkdir(parents=True)
    model_state = init_model_state(spec) if model_state is None else model_state
    (ckpt / "config.yaml").write_text(yaml.safe_dump(olmo2_config(spec) if config is None else config,
                                                     sort_keys=False))
    torch.save(model_state, ckpt / "model.pt")
    torch.save(adamw_state(spec, model_state) if optim_state is None else optim_state, ckpt / "optim.pt")
    torch.save(train_state(spec) if train is None else train, ckpt / "train.pt")
    return ckpt


# ------------------------------------------------------------------------------------------------ presets

#: name -> the spec of a tiny OLMo-2 checkpoint that trains on a CPU
TINY_CHECKPOINTS = {
    "olmo2_tiny": CheckpointSpec(
        d_model=32, n_heads=4, n_layers=2, mlp_hidden=8 * 32, vocab_size=100_278, embedding_size=100_352,
        max_sequence_length=128, global_train_batch_size=8, seed=1, step=0, eos_token_id=100_257,
        pad_token_id=100_277, memmap_dtype="uint32", run_name="olmo2_tiny", save_folder="checkpoints/olmo2_tiny"),
}
#: preset -> the text asset its run trains on: ``data.paths`` are its dolma2 token files in the cache
TINY_CORPUS = {"olmo2_tiny": "shakespeare"}


def tiny_checkpoint(name: str, cache_dir: str | Path) -> Path:
    """The ``step<N>-unsharded/`` folder of tiny preset ``name`` in ``<cache_dir>/models/<name>/`` (built once
    into a temporary folder, then renamed; a ``.complete.json`` marker says it is whole).

    :raises DataError: for an unknown name.
    """
    if name not in TINY_CHECKPOINTS:
        raise DataError(f"model asset {name!r} is not an OLMo-2 preset; presets: {sorted(TINY_CHECKPOINTS)}")
    from pretrain_exp.data.tokenize import load_tokenizer, tokenize_source

    spec = TINY_CHECKPOINTS[name]

    def build(tmp: Path) -> dict:
        paths = tokenize_source(TINY_CORPUS[name], load_tokenizer("dolma2", cache_dir), CacheDir(cache_dir).tokens,
                                cache_dir, progress=False)
        # the token files' real paths: the cache may reach its token files through a link that does not last
        write_checkpoint(tmp, dataclasses.replace(spec, data_paths=tuple(str(p.resolve()) for p in paths)))
        return {"preset": name, "corpus": TINY_CORPUS[name]}

    return build_once(CacheDir(cache_dir).model(f"{name}-v3"), build) / f"step{spec.step}-unsharded"
