"""Convert an OLMo-2 (old trainer) checkpoint to OLMo-core: model config, model state and AdamW state.

Name map (OLMo-2 ``OLMoSequentialBlock`` with ``norm_after=True`` -> OLMo-core ``ReorderedNormTransformerBlock``;
sources: allenai/OLMo ``olmo/model.py``, OLMo-core ``olmo_core/nn/transformer/block.py`` and
``olmo_core/nn/hf/convert.py``, transformers ``models/olmo2/convert_olmo2_weights_to_hf.py``)::

    transformer.wte.weight                 -> embeddings.weight
    transformer.blocks.{i}.att_proj.weight -> blocks.{i}.attention.w_q | w_k | w_v .weight
                                              (rows [0, d) | [d, d+kv) | [d+kv, d+2kv), kv = n_kv_heads * head_dim)
    transformer.blocks.{i}.attn_out.weight -> blocks.{i}.attention.w_out.weight
    transformer.blocks.{i}.q_norm.weight   -> blocks.{i}.attention.q_norm.weight
    transformer.blocks.{i}.k_norm.weight   -> blocks.{i}.attention.k_norm.weight
    transformer.blocks.{i}.attn_norm.weight-> blocks.{i}.attention_norm.weight       (applied after attention)
    transformer.blocks.{i}.ff_proj.weight  -> blocks.{i}.feed_forward.w3 | w1 .weight
                                              (first half = "x" = up, second half = "gate": OLMo's
                                              ``SwiGLU.forward`` is ``x, gate = x.chunk(2, -1); silu(gate) * x``,
                                              OLMo-core's ``FeedForward`` is ``w2(silu(w1(x)) * w3(x))``)
    transformer.blocks.{i}.ff_out.weight   -> blocks.{i}.feed_forward.w2.weight
    transformer.blocks.{i}.ff_norm.weight  -> blocks.{i}.feed_forward_norm.weight    (applied after the MLP)
    transformer.ln_f.weight                -> lm_head.norm.weight
    transformer.ff_out.weight              -> lm_head.w_out.weight

AdamW moments (``exp_avg``, ``exp_avg_sq``) are element-wise, so they are split exactly like their parameters;
``step`` is copied to every part. The result is a torch optimizer state dict keyed by OLMo-core parameter names;
:func:`optimizer_state_for` lays it out for ``load_state_dict`` of any optimizer built over the converted model.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch

from pretrain_exp.core.errors import CheckpointError, ConfigError
from pretrain_exp.core.io import apply_default_modes, default_mode
from pretrain_exp.frameworks.olmo2.checkpoint import read_checkpoint
from pretrain_exp.frameworks.olmo2.data_order import DataOrderParams, TrainPosition, data_order, train_position

#: OLMo ``ModelConfig`` defaults (allenai/OLMo ``olmo/config.py``) for the keys read here, used when a
#: ``config.yaml`` leaves one out (checkpoints normally carry the full dump).
MODEL_DEFAULTS: Dict[str, Any] = {
    "n_kv_heads": None, "clip_qkv": None, "mlp_ratio": 4, "mlp_hidden_size": None, "activation_type": "swiglu",
    "block_type": "sequential", "block_group_size": 1, "alibi": False, "rope": False, "rope_full_precision": True,
    "rope_theta": 10_000, "multi_query_attention": None, "attention_layer_norm": False,
    "embedding_layer_norm": False, "layer_norm_type": "default", "layer_norm_with_affine": True,
    "layer_norm_eps": 1e-5, "attention_layer_norm_with_affine": True, "include_bias": True,
    "bias_for_layer_norm": None, "scale_logits": False, "embedding_size": 50304, "weight_tying": True,
    "norm_after": False, "max_sequence_length": 1024, "attention_dropout": 0.1, "residual_dropout": 0.1,
    "embedding_dropout": 0.1,
}

#: settings an OLMo-2 checkpoint must have for this conversion (key -> required value); all published
#: OLMo-2 1B/7B/13B (``peteish*``) configs have them
REQUIRED_MODEL_SETTINGS: Dict[str, Any] = {
    "block_type": "sequential", "block_group_size": 1, "activation_type": "swiglu", "norm_after": True,
    "attention_layer_norm": True, "attention_layer_norm_with_affine": True, "layer_norm_type": "rms",
    "layer_norm_with_affine": True, "rope": True, "alibi": False, "include_bias": False, "weight_tying": False,
    "embedding_layer_norm": False, "scale_logits": False, "clip_qkv": None,
}


def model_settings(config: Dict[str, Any]) -> Dict[str, Any]:
    """The ``model:`` section of an OLMo-2 ``config.yaml`` with OLMo's defaults filled in, checked.

    :param config: the whole ``config.yaml`` dict.
    :raises ConfigError: naming the ``model.<key>`` that is missing or has a setting this conversion does not
        reproduce (see :data:`REQUIRED_MODEL_SETTINGS`).
    """
    model = config.get("model")
    if not isinstance(model, dict):
        raise ConfigError("model", "config.yaml has no 'model:' mapping")
    m = {**MODEL_DEFAULTS, **model}
    for key in ("d_model", "n_heads", "n_layers", "vocab_size"):
        if not isinstance(m.get(key), int) or m[key] <= 0:
            raise ConfigError(f"model.{key}", f"config.yaml: must be a positive integer, got {m.get(key)!r}")
    for key, want in REQUIRED_MODEL_SETTINGS.items():
        got = m[key]
        if got != want and not (isinstance(want, bool) and got is None and want is False):
            raise ConfigError(f"model.{key}", f"config.yaml: {got!r} is not supported (the OLMo-2 architecture "
                                              f"converted here has {key}={want!r})")
    for key in ("attention_dropout", "residual_dropout", "embedding_dropout"):
        if m[key]:
            raise ConfigError(f"model.{key}", f"config.yaml: {m[key]!r} is not supported (OLMo-core's OLMo-2 "
                                              f"blocks have no dropout; OLMo-2 trained with 0.0)")
    if m["bias_for_layer_norm"]:
        raise ConfigError("model.bias_for_layer_norm", "config.yaml: layer-norm biases are not supported")
    if m["d_model"] % m["n_heads"]:
        raise ConfigError("model.n_heads", f"config.yaml: d_model {m['d_model']} is not a multiple of {m['n_heads']}")
    m["n_kv_heads"] = m["n_kv_heads"] or (1 if m["multi_query_attention"] else m["n_heads"])
    if m["n_heads"] % m["n_kv_heads"]:
        raise ConfigError("model.n_kv_heads", f"config.yaml: {m['n_kv_heads']} does not divide n_heads {m['n_heads']}")
    hidden = m["mlp_hidden_size"] or m["mlp_ratio"] * m["d_model"]
    if hidden % 2:
        raise ConfigError("model.mlp_hidden_size", f"config.yaml: SwiGLU needs an even hidden size, got {hidden}")
    m["mlp_hidden_size"] = hidden
    m["embedding_size"] = m["embedding_size"] or m["vocab_size"]
    if m["embedding_size"] < m["vocab_size"]:
        raise ConfigError("model.embedding_size", f"config.yaml: {m['embedding_size']} < vocab_size {m['vocab_size']}")
    return m


def transformer_config(config: Dict[str, Any], *, dtype: str = "float32", attn_backend: Optional[str] = None):
    """The OLMo-core ``TransformerConfig`` of an OLMo-2 checkpoint's ``config.yaml``.

    Built with OLMo-core's ``TransformerConfig.llama_like`` and the OLMo-2 block type (``reordered_norm``: norms
    after attention and MLP, QK-norm over the full q/k width), exactly as OLMo-core's ``olmo2_*`` builders do;
    for the ``peteish1/7/13`` configs it equals ``olmo2_1B_v2`` / ``olmo2_7B`` / ``olmo2_13B``. The MLP hidden
    size is OLMo-2's ``mlp_hidden_size // 2`` (the fused SwiGLU projection is twice as wide); the vocabulary
    size is the padded ``embedding_size``.

    :param config: the whole ``config.yaml`` dict.
    :param dtype: parameter dtype name (``float32``, ``bfloat16``).
    :param attn_backend: OLMo-core attention backend name (``torch``, ``flash_2``, ...); ``None`` = OLMo-core's
        default.
    :raises ConfigError: see :func:`model_settings`.
    """
    from olmo_core.config import DType
    from olmo_core.nn.attention import AttentionBackendName
    from olmo_core.nn.feed_forward import FeedForwardConfig
    from olmo_core.nn.transformer import TransformerBlockType, TransformerConfig

    m = model_settings(config)
    return TransformerConfig.llama_like(
        d_model=m["d_model"],
        vocab_size=m["embedding_size"],
        n_layers=m["n_layers"],
        n_heads=m["n_heads"],
        n_kv_heads=m["n_kv_heads"] if m["n_kv_heads"] != m["n_heads"] else None,
        qk_norm=True,
        layer_norm_eps=float(m["layer_norm_eps"]),
        rope_theta=int(m["rope_theta"]),
        rope_full_precision=bool(m["rope_full_precision"]),
        block_name=TransformerBlockType.reordered_norm,
        feed_forward=FeedForwardConfig(hidden_size=m["mlp_hidden_size"] // 2, bias=False, dtype=DType(dtype)),
        attn_backend=AttentionBackendName(attn_backend) if attn_backend else None,
        dtype=DType(dtype),
    )


# ------------------------------------------------------------------------------------------------ names


def parameter_map(config: Dict[str, Any]) -> Dict[str, List[Tuple[str, int, int]]]:
    """OLMo-2 parameter name -> ``[(OLMo-core name, first row, end row), ...]`` (rows of dim 0, end exclusive).

    Un-fused parameters map to one entry covering all rows (``end = -1`` meaning "to the end").

    :raises ConfigError: see :func:`model_settings`.
    """
    m = model_settings(config)
    d, head_dim = m["d_model"], m["d_model"] // m["n_heads"]
    kv = m["n_kv_heads"] * head_dim
    ff = m["mlp_hidden_size"] // 2
    out: Dict[str, List[Tuple[str, int, int]]] = {
        "transformer.wte.weight": [("embeddings.weight", 0, -1)],
        "transformer.ln_f.weight": [("lm_head.norm.weight", 0, -1)],
        "transformer.ff_out.weight": [("lm_head.w_out.weight", 0, -1)],
    }
    for i in range(m["n_layers"]):
        o, n = f"transformer.blocks.{i}.", f"blocks.{i}."
        out[o + "att_proj.weight"] = [(n + "attention.w_q.weight", 0, d), (n + "attention.w_k.weight", d, d + kv),
                                      (n + "attention.w_v.weight", d + kv, d + 2 * kv)]
        out[o + "attn_out.weight"] = [(n + "attention.w_out.weight", 0, -1)]
        out[o + "q_norm.weight"] = [(n + "attention.q_norm.weight", 0, -1)]
        out[o + "k_norm.weight"] = [(n + "attention.k_norm.weight", 0, -1)]
        out[o + "attn_norm.weight"] = [(n + "attention_norm.weight", 0, -1)]
        out[o + "ff_proj.weight"] = [(n + "feed_forward.w3.weight", 0, ff), (n + "feed_forward.w1.weight", ff, 2 * ff)]
        out[o + "ff_out.weight"] = [(n + "feed_forward.w2.weight", 0, -1)]
        out[o + "ff_norm.weight"] = [(n + "feed_forward_norm.weight", 0, -1)]
    return out


def core_parameter_names(config: Dict[str, Any]) -> List[str]:
    """OLMo-core parameter names of the converted model in ``model.named_parameters()`` order.

    :raises ConfigError: see :func:`model_settings`.
    """
    m = model_settings(config)
    names = ["embeddings.weight"]
    for i in range(m["n_layers"]):
        names += [f"blocks.{i}.{n}.weight" for n in (
            "attention.w_q", "attention.w_k", "attention.w_v", "attention.w_out", "attention.q_norm",
            "attention.k_norm", "attention_norm", "feed_forward.w1", "feed_forward.w2", "feed_forward.w3",
            "feed_forward_norm")]
    return names + ["lm_head.norm.weight", "lm_head.w_out.weight"]


def _split(name: str, tensor: torch.Tensor, parts: List[Tuple[str, int, int]], what: str):
    rows = max(end for _, _, end in parts)
    if rows != -1 and (tensor.dim() == 0 or tensor.shape[0] != rows):
        raise CheckpointError(f"{what} {name}: shape {tuple(tensor.shape)}, expected {rows} rows along dim 0")
    for new, start, end in parts:
        yield new, tensor if end == -1 else tensor[start:end]  # row slices of a contiguous tensor stay contiguous


def _check_names(names, pmap, what: str) -> None:
    missing = sorted(set(pmap) - set(names))
    unknown = sorted(set(names) - set(pmap))
    if missing or unknown:
        raise CheckpointError(f"{what}: names do not match the OLMo-2 layout of config.yaml: missing "
                              f"{missing[:4]}{' ...' if len(missing) > 4 else ''}, unexpected "
                              f"{unknown[:4]}{' ...' if len(unknown) > 4 else ''}")


def convert_model_state(model_state: Dict[str, torch.Tensor], config: Dict[str, Any]) -> Dict[str, torch.Tensor]:
    """OLMo-2 model state -> OLMo-core model state (names and splits in the module docstring).

    Split tensors are row slices (views) of the input tensors; dtypes are kept.

    :raises CheckpointError: if a name is missing or unexpected, or a fused tensor has the wrong number of rows.
    :raises ConfigError: see :func:`model_settings`.
    """
    pmap = parameter_map(config)
    _check_names(model_state, pmap, "model state")
    out: Dict[str, torch.Tensor] = {}
    for name, tensor in model_state.items():
        out.update(_split(name, tensor, pmap[name], "model state"))
    return out


#: torch AdamW param-group fields carried over (OLMo's own fields ``sharded``, ``max_grad_norm``,
#: ``max_grad_norm_ratio`` are dropped; ``params``/``param_names`` are rewritten)
ADAMW_GROUP_FIELDS = ("lr", "initial_lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "foreach",
                      "capturable", "differentiable", "fused", "decoupled_weight_decay")


def convert_optim_state(optim_state: Dict[str, Any], config: Dict[str, Any]) -> Dict[str, Any]:
    """OLMo-2 AdamW state (from :func:`~pretrain_exp.frameworks.olmo2.checkpoint.read_optim_state`) -> the same state in
    OLMo-core parameter names.

    Returns ``{"state": {core_name: {"step": float32 scalar tensor, "exp_avg": T, "exp_avg_sq": T}},
    "param_groups": [{"params": [core_name, ...], "param_names": [...], "lr", "betas", "eps", "weight_decay",
    ...}]}``. ``exp_avg``/``exp_avg_sq`` are split row-wise like their parameter; every part gets its own copy of
    ``step`` (torch's AdamW increments it in place). Groups carry OLMo-2's membership and hyperparameters, laid
    out as OLMo-core's ``AdamWConfig.build(model)`` lays out :func:`adamw_config`'s groups: OLMo-2 writes
    [decay, no-decay], OLMo-core builds [override = no-decay, rest], so the group order is reversed, and each
    group lists its parameters in ``model.named_parameters()`` order (:func:`core_parameter_names`). So
    ``adamw_config(config).build(model).load_state_dict(result)`` is correct as is;
    ``torch.distributed.checkpoint.state_dict.set_optimizer_state_dict(model, optim, result)`` matches by name
    for any optimizer; for any other optimizer layout use :func:`optimizer_state_for` (a plain
    ``load_state_dict`` matches parameters by position only).

    :raises CheckpointError: if the state's names do not match the model layout, a parameter has no
        ``exp_avg``/``exp_avg_sq``, or a moment has the wrong shape.
    """
    pmap = parameter_map(config)
    _check_names(optim_state["state"], pmap, "optimizer state")
    grouped = [n for g in optim_state["param_groups"] for n in g["params"]]
    _check_names(grouped, pmap, "optimizer param_groups")
    state: Dict[str, Dict[str, Any]] = {}
    for name, st in optim_state["state"].items():
        if "exp_avg" not in st or "exp_avg_sq" not in st:
            raise CheckpointError(f"optimizer state {name}: no exp_avg/exp_avg_sq (keys {sorted(st)}); not AdamW")
        avg = dict(_split(name, st["exp_avg"], pmap[name], "optimizer state exp_avg"))
        avg_sq = dict(_split(name, st["exp_avg_sq"], pmap[name], "optimizer state exp_avg_sq"))
        step = st.get("step", torch.tensor(0.0))
        for new, _, _ in pmap[name]:
            state[new] = {"step": torch.as_tensor(step, dtype=torch.float32).clone(), "exp_avg": avg[new],
                          "exp_avg_sq": avg_sq[new]}
    order = core_parameter_names(config)
    groups = []
    for g in reversed(optim_state["param_groups"]):
        members = {new for old in g["params"] for new, _, _ in pmap[old]}
        names = [n for n in order if n in members]
        groups.append({**{k: g[k] for k in ADAMW_GROUP_FIELDS if k in g}, "params": names,
                       "param_names": list(names)})
    return {"state": state, "param_groups": groups}


def adamw_config(config: Dict[str, Any]):
    """OLMo-core ``AdamWConfig`` reproducing an OLMo-2 ``optimizer:`` section, with its param groups.

    OLMo-2 (allenai/OLMo ``olmo/optim.py`` ``get_param_groups``) decays every ``nn.Linear`` weight, decays norm
    weights only if ``optimizer.decay_norm_and_bias`` and the embedding only if ``optimizer.decay_embeddings``
    (the legacy ``optimizer.no_decay_norm_and_bias``, when set, decides both, as OLMo's ``scripts/train.py``
    does); the non-decayed parameters become one ``group_overrides`` entry with ``weight_decay=0.0`` (OLMo-core
    puts it first, the decayed group second). The converted models have no biases (``include_bias: false``).

    :raises ConfigError: for an optimizer other than AdamW (``optimizer.name``).
    """
    from olmo_core.optim import AdamWConfig, OptimGroupOverride

    opt = config.get("optimizer") or {}
    if opt.get("name", "lionw") != "adamw":  # OLMo's OptimizerConfig default is lionw
        raise ConfigError("optimizer.name", f"config.yaml: {opt.get('name', 'lionw')!r} is not supported; only adamw")
    if opt.get("selective_updates", False):
        raise ConfigError("optimizer.selective_updates", "config.yaml: OLMo's selective AdamW updates are not "
                                                         "reproduced by torch's AdamW")
    decay_norms, decay_embeddings = opt.get("decay_norm_and_bias", False), opt.get("decay_embeddings", False)
    if opt.get("no_decay_norm_and_bias") is not None:  # legacy key; OLMo's scripts/train.py lets it set both
        decay_norms = decay_embeddings = not opt["no_decay_norm_and_bias"]
    no_decay = []
    if not decay_embeddings:
        no_decay.append("embeddings.weight")
    if not decay_norms:
        no_decay += ["blocks.*.attention.q_norm.weight", "blocks.*.attention.k_norm.weight",
                     "blocks.*.attention_norm.weight", "blocks.*.feed_forward_norm.weight", "lm_head.norm.weight"]
    betas = opt.get("betas", (0.9, 0.95))
    return AdamWConfig(
        lr=float(opt.get("learning_rate", 1e-4)),
        betas=(float(betas[0]), float(betas[1])),
        eps=float(opt.get("eps", 1e-5)),
        weight_decay=float(opt.get("weight_decay", 0.01)),
        group_overrides=[OptimGroupOverride(params=no_decay, opts={"weight_decay": 0.0})] if no_decay else None,
    )


def max_grad_norm(config: Dict[str, Any], step: int = 0) -> Optional[float]:
    """The gradient-norm clipping threshold of an OLMo-2 run continued after step ``step`` (``config.yaml``
    ``max_grad_norm``; ``None`` = no clipping). OLMo (allenai/OLMo ``olmo/optim.py``
    ``Optimizer.clip_grads_and_collect_metrics``) clips the global norm over all parameters, as OLMo-core's
    ``max_grad_norm`` does.

    :raises ConfigError: for ``max_grad_norm_ratio`` (adaptive clipping), or a grad-clip warmup
        (``scheduler.grad_clip_warmup_steps``) not over by ``step``: OLMo-core does not reproduce them.
    """
    if config.get("max_grad_norm_ratio") is not None:
        raise ConfigError("max_grad_norm_ratio", "config.yaml: adaptive gradient clipping is not reproduced")
    warmup = (config.get("scheduler") or {}).get("grad_clip_warmup_steps")
    if warmup is not None and step < int(float(warmup)):
        raise ConfigError("scheduler.grad_clip_warmup_steps", f"config.yaml: {warmup}; the grad-clip warmup is not "
                          f"reproduced (the run continues at step {step})")
    value = config.get("max_grad_norm")
    return None if value is None else float(value)


def training_overrides(config: Dict[str, Any]) -> Dict[str, Any]:
    """Project config values that continue with OLMo-2's optimizer settings: dotted key -> value
    (``training.learning_rate`` = OLMo-2's peak ``optimizer.learning_rate``, ``training.weight_decay``,
    ``training.adam_beta1``/``adam_beta2``, ``training.max_grad_norm``). The learning rate OLMo-2's scheduler had
    reached at the checkpoint is the ``lr`` of the optimizer state's param groups.

    :raises ConfigError: as :func:`adamw_config`.
    """
    opt = adamw_config(config)
    out = {"training.learning_rate": opt.lr, "training.weight_decay": opt.weight_decay,
           "training.adam_beta1": opt.betas[0], "training.adam_beta2": opt.betas[1]}
    if max_grad_norm(config) is not None:
        out["training.max_grad_norm"] = max_grad_norm(config)
    return out


def optimizer_state_for(optimizer: torch.optim.Optimizer, model: torch.nn.Module,
                        converted: Dict[str, Any]) -> Dict[str, Any]:
    """A state dict for ``optimizer.load_state_dict``: ``converted`` (from :func:`convert_optim_state`) laid out
    in ``optimizer``'s own param groups (any grouping, e.g. one group over ``model.parameters()`` or
    OLMo-core's ``AdamWConfig.build(model)``), parameters matched by name through ``model.named_parameters()``.

    Group hyperparameters (lr, betas, eps, weight decay, ...) are the optimizer's own, as the new run configures
    them (OLMo's trainer, too, keeps its configured group fields on restore); only per-parameter state is taken
    from the checkpoint. The moment tensors are handed over, not copied (no second copy of a 7B/13B state):
    after ``load_state_dict`` the optimizer updates them in place, so ``converted`` must not be reused.

    :raises CheckpointError: if an optimizer parameter is not in ``model``, has no converted state, or a
        moment's shape differs from the parameter's; or if converted state is left unused.
    """
    names = {id(p): n for n, p in model.named_parameters()}
    state: Dict[int, Dict[str, Any]] = {}
    groups = []
    used = set()
    for g in optimizer.param_groups:
        ids = []
        for p in g["params"]:
            name = names.get(id(p))
            if name is None:
                raise CheckpointError("optimizer holds a parameter that is not in the model")
            st = converted["state"].get(name)
            if st is None:
                raise CheckpointError(f"optimizer state: no converted state for parameter {name}")
            for k in ("exp_avg", "exp_avg_sq"):
                if tuple(st[k].shape) != tuple(p.shape):
                    raise CheckpointError(f"optimizer state {name}.{k}: shape {tuple(st[k].shape)}, "
                                          f"parameter {tuple(p.shape)}")
            state[len(state)] = {k: (v.clone() if k == "step" else v) for k, v in st.items()}
            ids.append(len(state) - 1)
            used.add(name)
        groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": ids})
    unused = sorted(set(converted["state"]) - used)
    if unused:
        raise CheckpointError(f"optimizer state: {len(unused)} converted parameters are not in the optimizer, "
                              f"e.g. {unused[0]}")
    return {"state": state, "param_groups": groups}


def export_hf(model, out_dir: str | Path, config: Dict[str, Any]) -> Path:
    """Write the OLMo-core model as an HF ``Olmo2ForCausalLM`` folder with OLMo-core's own exporter.

    Uses ``olmo_core.nn.hf.save_hf_model`` (OLMo-core state -> HF names, ``Olmo2Config`` from the model), then
    sets ``max_position_embeddings`` and the EOS/pad ids from OLMo-2's ``model:`` section (the exporter leaves
    them unset without a tokenizer). Written to a temporary sibling folder, then renamed.

    :returns: ``out_dir``.
    :raises FileExistsError: if ``out_dir`` exists.
    """
    from olmo_core.nn.hf.checkpoint import save_hf_model
    from transformers import AutoConfig

    m = model_settings(config)
    out_dir = Path(out_dir)
    if out_dir.exists():
        raise FileExistsError(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.")) / "hf"
    save_hf_model(tmp, model.state_dict(), model, vocab_size=m["embedding_size"])
    hf_config = AutoConfig.from_pretrained(tmp)
    hf_config.max_position_embeddings = m["max_sequence_length"]
    hf_config.eos_token_id = config["model"].get("eos_token_id")
    hf_config.pad_token_id = config["model"].get("pad_token_id")
    hf_config.save_pretrained(tmp)
    apply_default_modes(tmp)  # safetensors writes 0600 files
    os.chmod(tmp, default_mode(directory=True))
    os.replace(tmp, out_dir)
    tmp.parent.rmdir()
    return out_dir


# ------------------------------------------------------------------------------------------------ all at once


@dataclass
class ConvertedCheckpoint:
    """An OLMo-2 checkpoint in OLMo-core terms (see :func:`load_converted`)."""

    model_config: Any  #: ``olmo_core.nn.transformer.TransformerConfig``
    model_state: Dict[str, torch.Tensor]  #: OLMo-core parameter name -> tensor
    optim_state: Optional[Dict[str, Any]]  #: :func:`convert_optim_state` output, or None without an optim file
    optim_config: Any  #: ``olmo_core.optim.AdamWConfig`` with OLMo-2's lr/betas/eps/weight decay and groups
    position: TrainPosition
    data: DataOrderParams
    config: Dict[str, Any]  #: the OLMo-2 ``config.yaml``


def load_converted(ckpt_dir: str | Path, *, optimizer: bool = True, dtype: str = "float32",
                   attn_backend: Optional[str] = None,
                   path_prefixes: Optional[Dict[str, str]] = None, remote_ok: bool = False) -> ConvertedCheckpoint:
    """Read a local OLMo-2 ``step<N>-unsharded/`` folder and convert everything to OLMo-core.

    Typical use::

        ck = load_converted(path)
        model = ck.model_config.build(init_device="cpu")
        model.load_state_dict(ck.model_state)
        optim = ck.optim_config.build(model)            # or torch.optim.AdamW(model.parameters(), ...)
        optim.load_state_dict(optimizer_state_for(optim, model, ck.optim_state))
        # ck.position.global_step, ck.data.overrides() -> project config

    :param ckpt_dir: the checkpoint folder.
    :param optimizer: read and convert ``optim.*`` too.
    :param dtype: OLMo-core parameter dtype of :attr:`ConvertedCheckpoint.model_config` (the state keeps the
        saved dtype; ``load_state_dict`` casts).
    :param attn_backend: see :func:`transformer_config`.
    :param path_prefixes: see :func:`~pretrain_exp.frameworks.olmo2.data_order.data_order`.
    :param remote_ok: see :func:`~pretrain_exp.frameworks.olmo2.data_order.data_order`.
    :raises CheckpointError: for a missing/unreadable file or a state that does not match ``config.yaml``.
    :raises ConfigError: for a ``config.yaml`` setting that is not reproduced (naming its key).
    """
    ck = read_checkpoint(ckpt_dir, optimizer=optimizer)
    position = train_position(ck.train_state)
    try:
        return ConvertedCheckpoint(
            model_config=transformer_config(ck.config, dtype=dtype, attn_backend=attn_backend),
            model_state=convert_model_state(ck.model_state, ck.config),
            optim_state=convert_optim_state(ck.optim_state, ck.config) if ck.optim_state is not None else None,
            optim_config=adamw_config(ck.config),
            position=position,
            data=data_order(ck.config, position, path_prefixes=path_prefixes, remote_ok=remote_ok),
            config=ck.config,
        )
    except ConfigError as e:  # name the file, not just "config.yaml"
        message = str(e)[len(e.key) + 2:]
        if message.startswith("config.yaml"):
            message = str(ck.path / "config.yaml") + message[len("config.yaml"):]
        raise ConfigError(e.key, message) from None
    except CheckpointError as e:  # name the checkpoint folder
        raise CheckpointError(f"{ck.path}: {e}") from None
