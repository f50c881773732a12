"""Pretraining from scratch with the ``hf`` framework (``model.init=random``).

``model.config`` names the architecture: an HF ``config.json`` file, a model dir, a model asset (its config only)
or a Hub id. The model is built by ``AutoModelForCausalLM.from_config`` under ``torch.manual_seed(model.init_seed)``,
so its weights are transformers' own ``_init_weights`` of that architecture, and saved with its tokenizer
(``model.tokenizer``, else the one next to the config) as the run's step-0 checkpoint, an HF model dir built once
into ``<cache_dir>/models/scratch-hf-<model_type>-seed<seed>-<digest>/`` (same config, tokenizer and seed: same
weights).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pretrain_exp.core.cachedir import CacheDir
from pretrain_exp.core.config import ModelConf
from pretrain_exp.core.errors import ConfigError


def _config_source(config: str, cache_dir: str | Path) -> str:
    """Where ``AutoConfig.from_pretrained`` reads ``config`` from: a model asset's dir, a local path, or the id."""
    from pretrain_exp.data.assets import ASSETS, TINY_MODELS, hf_model_dir

    if config in TINY_MODELS or config in ASSETS:
        return str(hf_model_dir(config, cache_dir))
    path = Path(config).expanduser()
    if path.exists():
        return str(path)
    if path.is_absolute() or config.startswith((".", "~")) or config.endswith(".json"):
        raise ConfigError("model.config", f"{config}: not found (give an HF config.json, a model dir, a model "
                          "asset or a Hub id)")
    return config


def random_init_model_dir(model: ModelConf, cache_dir: str | Path) -> Path:
    """The HF model dir of ``model.init=random`` (module docstring): ``config.json``, ``model.safetensors`` (fp32)
    and tokenizer files.

    :raises ConfigError: (``model.config``) if the config cannot be read; (``model.tokenizer``) if no tokenizer
        is given or found next to the config, or it has more ids than the config's ``vocab_size``.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from pretrain_exp.core.errors import DataError
    from pretrain_exp.data.assets import build_once
    from pretrain_exp.data.tokenize import load_tokenizer

    source = _config_source(str(model.config), cache_dir)
    try:
        config = AutoConfig.from_pretrained(source)
    except (OSError, ValueError) as e:
        raise ConfigError("model.config", f"{model.config}: not an HF model config "
                          f"({' '.join(str(e).split())[:200]})") from None
    tok_source = model.tokenizer or (source if Path(source).is_dir() else str(Path(source).parent))
    try:
        tok = load_tokenizer(tok_source, cache_dir)
    except DataError as e:
        raise ConfigError("model.tokenizer", f"model.init=random needs a tokenizer: none next to {model.config} "
                          f"({e}); set model.tokenizer=...") from None
    if len(tok) > config.vocab_size:
        raise ConfigError("model.tokenizer", f"{tok_source} has {len(tok)} ids but {model.config} has vocab_size "
                          f"{config.vocab_size}")
    seed = int(model.init_seed)
    digest = hashlib.sha256(json.dumps([config.to_dict(), tok_source, len(tok)], sort_keys=True,
                                       default=str).encode()).hexdigest()

    def build(tmp: Path) -> dict:
        torch.manual_seed(seed)
        net = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        net.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        return {"config": str(model.config), "init_seed": seed, "tokenizer": tok_source}

    name = f"scratch-hf-{config.model_type}-seed{seed}-{digest[:12]}"
    return build_once(CacheDir(cache_dir).model(name), build)
