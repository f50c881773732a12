"""From-scratch checkpoints of OLMo-core builders on a GPU machine without flash-attn (the device's setting,
simulated here by reporting CUDA as available): OLMo-3's builders default to the ``flash_2`` attention backend,
which OLMo-core refuses to build without the flash-attn package; the CPU builds must use SDPA. The tiny preset
records its token files by their real paths."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch

from pretrain_exp.core.config import ModelConf
from pretrain_exp.data.assets import tokenizer_dir
from pretrain_exp.frameworks.olmo_core.checkpoint import load_model, model_config
from pretrain_exp.frameworks.olmo_core.presets import random_init_checkpoint, tiny_checkpoint
from tests.conftest import CACHE_DIR


def test_the_tiny_preset_records_the_real_paths_of_its_token_files(tmp_path):
    """A cache that reaches its token files through links (as a test process's cache does; it is removed at the
    process's exit while the model stays): the preset's ``config.json`` names the files themselves."""
    cache = tmp_path / "cache"
    cache.mkdir()
    for sub in ("assets", "tokenizers", "tokens"):
        (CACHE_DIR / sub).mkdir(parents=True, exist_ok=True)
        (cache / sub).symlink_to(CACHE_DIR / sub)
    ckpt = tiny_checkpoint("olmo3_tiny", cache)
    paths = [Path(p) for p in json.loads((ckpt / "config.json").read_text())["dataset"]["paths"]]
    assert paths and all(p.is_file() and p == p.resolve() for p in paths)


@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is not None, reason="flash-attn is installed here")
def test_olmo3_scratch_checkpoint_builds_and_loads_without_flash_attn_on_a_cuda_machine(
        cache_dir, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    shutil.copytree(tokenizer_dir("dolma2", cache_dir), cache / "tokenizers" / "dolma2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    ckpt = random_init_checkpoint(ModelConf(name="t", init="random", config="olmo3_14M", init_seed=0), cache)
    saved = json.loads((ckpt / "config.json").read_text())["model"]["block"]["sequence_mixer"]
    assert saved["backend"] == "flash_2"  # the builder's own config is what the checkpoint records
    assert model_config(ckpt).block.sequence_mixer.backend == "flash_2"  # a GPU run picks its own backend
    model = load_model(ckpt)  # a CPU build: SDPA
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3, 4]]))
    assert logits.shape == (1, 4, 100_352) and torch.isfinite(logits).all()
