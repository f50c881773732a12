"""Tiny OLMo-core models that train on a CPU in seconds (tests, demos), built once into the asset cache.

``olmo3_tiny`` has OLMo-3's shape at toy size: reordered-norm blocks with QK-norm, SwiGLU, RoPE θ = 500,000,
RMSNorm ε = 1e-6, untied embeddings, the dolma2 vocabulary padded to 100,352, and OLMo-3's attention pattern
(three sliding-window layers, then one full-attention layer; ``TransformerConfig.olmo3_*`` in OLMo-core 3.0.0)
with a 64-token window. It is randomly initialised with OLMo-core's own initialisation (seed 0) and saved as a
model-only OLMo-core checkpoint (``config.json`` + torch DCP shards).
"""

from __future__ import annotations

import json
from pathlib import Path

from pretrain_exp.core.cachedir import CacheDir
from pretrain_exp.core.errors import DataError
from pretrain_exp.data.assets import build_once

DOLMA2_PADDED_VOCAB = 100_352  #: dolma2's 100,278 ids padded to a multiple of 128, as OLMo-2/3 models do

#: name -> OLMo-core ``TransformerConfig.llama_like`` arguments (plus the sliding-window pattern)
TINY_PRESETS = {
    "olmo3_tiny": dict(d_model=32, n_layers=4, n_heads=4, window=64),
}


def tiny_model_config(name: str):
    """The ``TransformerConfig`` of tiny preset ``name`` (attention backend ``torch``).

    :raises DataError: for an unknown name.
    """
    from olmo_core.nn.attention import SlidingWindowAttentionConfig
    from olmo_core.nn.attention.backend import AttentionBackendName
    from olmo_core.nn.transformer import TransformerBlockType, TransformerConfig

    if name not in TINY_PRESETS:
        raise DataError(f"model asset {name!r} is not an OLMo-core preset; presets: {sorted(TINY_PRESETS)}")
    spec = dict(TINY_PRESETS[name])
    window = spec.pop("window")
    return TransformerConfig.llama_like(
        vocab_size=DOLMA2_PADDED_VOCAB, qk_norm=True, rope_theta=500_000, layer_norm_eps=1e-6,
        block_name=TransformerBlockType.reordered_norm, hidden_size_multiple_of=32,
        attn_backend=AttentionBackendName.torch,
        sliding_window=SlidingWindowAttentionConfig(pattern=[window, window, window, -1],
                                                    force_full_attention_on_first_layer=False,
                                                    force_full_attention_on_last_layer=True),
        **spec)


#: preset -> (text asset its run trains on, sequence length, global batch size in rows, data-loader seed)
TINY_DATA = {"olmo3_tiny": ("shakespeare", 128, 8, 0)}


def tiny_checkpoint(name: str, cache_dir: str | Path) -> Path:
    """The model-only OLMo-core checkpoint dir of tiny preset ``name`` (built once, cached). Its ``config.json``
    records, as an OLMo-core experiment config does, the run's dataset (the dolma2 token files of
    :data:`TINY_DATA`'s corpus in the cache, tokenized once, ``uint32``; sequence length; tokenizer) and data
    loader (global batch size in tokens, seed), so ``data=checkpoint`` trains on them.

    :raises DataError: for an unknown name.
    """
    import torch
    from olmo_core.distributed.checkpoint import save_model_and_optim_state

    from pretrain_exp.data.tokenize import load_tokenizer, tokenize_source

    config = tiny_model_config(name)
    corpus, L, B, seed = TINY_DATA[name]

    def build(tmp: Path) -> dict:
        tok = load_tokenizer("dolma2", cache_dir)
        paths = tokenize_source(corpus, tok, CacheDir(cache_dir).tokens, cache_dir, progress=False)
        torch.manual_seed(0)
        model = config.build(init_device="cpu")
        model.init_weights(device=torch.device("cpu"))
        save_model_and_optim_state(str(tmp), model)
        (tmp / "config.json").write_text(json.dumps({
            "model": config.as_config_dict(),
            # the token files' real paths: the cache may reach its token files through a link that does not last
            "dataset": {"paths": [str(p.resolve()) for p in paths], "sequence_length": L, "dtype": "uint32",
                        "tokenizer": {"identifier": "allenai/dolma2-tokenizer", "vocab_size": DOLMA2_PADDED_VOCAB,
                                      "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}},
            "data_loader": {"global_batch_size": B * L, "seed": seed},
        }, indent=2))
        return {"preset": name, "corpus": corpus}

    return build_once(CacheDir(cache_dir).model(f"{name}-v3"), build)


#: ``model.config`` prefixes that name OLMo-core ``TransformerConfig`` builders (``olmo2_1B_v2``, ``olmo3_7B``, ...)
BUILDER_PREFIXES = ("olmo2_", "olmo3_")


def builder_config(name: str, vocab_size: int, init_seed: int):
    """``TransformerConfig.<name>(vocab_size)`` of OLMo-core (e.g. ``olmo2_1B_v2``: the released OLMo-2 1B shape;
    ``olmo3_14M``: a toy OLMo-3 shape) with ``init_seed`` as its initialisation seed.

    :raises ConfigError: (``model.config``) for a name that is not such a builder, listing them.
    """
    from olmo_core.nn.transformer import TransformerConfig

    from pretrain_exp.core.errors import ConfigError

    names = sorted(n for n in dir(TransformerConfig) if n.startswith(BUILDER_PREFIXES))
    if name not in names:
        raise ConfigError("model.config", f"{name!r} is not an OLMo-core TransformerConfig builder; allowed: "
                          f"{names}")
    config = getattr(TransformerConfig, name)(vocab_size=vocab_size)
    config.init_seed = int(init_seed)
    return config


def cpu_attention(config):
    """A copy of OLMo-core ``TransformerConfig`` ``config`` whose attention uses the ``torch`` backend (SDPA), for
    a build on the CPU: OLMo-3's builders default to ``flash_2``, which OLMo-core refuses to build without the
    flash-attn package (also on a GPU machine). The parameters are the same for every backend."""
    import copy

    from olmo_core.nn.attention.backend import AttentionBackendName

    out = copy.deepcopy(config)
    mixer = out.block.sequence_mixer
    if mixer is not None and getattr(mixer, "backend", None) not in (None, AttentionBackendName.torch):
        mixer.backend = AttentionBackendName.torch
    if mixer is not None and hasattr(mixer, "use_flash"):
        mixer.use_flash = None
    return out


def random_init_checkpoint(model, cache_dir: str | Path) -> Path:
    """The step-0 checkpoint of a from-scratch run (``model.init=random``): OLMo-core builder ``model.config``
    (:func:`builder_config`) for the vocabulary of ``model.tokenizer`` (default dolma2) padded to a multiple of
    128, initialised by OLMo-core's own ``init_weights`` with seed ``model.init_seed`` and saved as a model-only
    OLMo-core checkpoint (``config.json`` + torch DCP shards), built once into
    ``<cache_dir>/models/scratch-<config>-seed<seed>-<digest>/`` (same config and seed, same weights).

    :raises ConfigError: for an unknown builder name.
    """
    import hashlib

    import torch
    from olmo_core.distributed.checkpoint import save_model_and_optim_state

    from pretrain_exp.data.tokenize import load_tokenizer

    tok_name = model.tokenizer or "dolma2"
    tok = load_tokenizer(tok_name, cache_dir)
    vocab = -(-len(tok) // 128) * 128
    config = builder_config(str(model.config), vocab, model.init_seed)
    digest = hashlib.sha256(json.dumps(config.as_config_dict(), sort_keys=True, default=str).encode()).hexdigest()

    def build(tmp: Path) -> dict:
        torch.manual_seed(int(model.init_seed))
        net = cpu_attention(config).build(init_device="cpu")
        net.init_weights(device=torch.device("cpu"))
        save_model_and_optim_state(str(tmp), net)
        (tmp / "config.json").write_text(json.dumps({"model": config.as_config_dict()}, indent=2))
        return {"config": str(model.config), "init_seed": int(model.init_seed), "tokenizer": tok_name}

    name = f"scratch-{model.config}-seed{model.init_seed}-{digest[:12]}"
    return build_once(CacheDir(cache_dir).model(name), build)
