"""Shared fixtures: the conf dir, a Hydra ``compose`` helper, the asset cache, the tiny model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hydra import compose as hydra_compose
from hydra import initialize_config_dir

from pretrain_exp.config import ExperimentConfig, register_configs, to_config

ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = ROOT / "conf"
CACHE_DIR = Path(os.environ.get("PRETRAIN_EXP_CACHE", Path.home() / ".cache" / "pretrain_exp"))

register_configs()


def compose(*overrides: str, run_dir: str | Path = "/nonexistent-run-dir"):
    """The composed ``DictConfig`` for ``overrides`` (``run_dir`` replaces Hydra's runtime output dir)."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose("config", overrides=[f"run_dir={run_dir}", f"cache_dir={CACHE_DIR}", *overrides])


def make_config(*overrides: str, run_dir: str | Path) -> ExperimentConfig:
    """A validated :class:`ExperimentConfig` for ``overrides``."""
    return to_config(compose(*overrides, run_dir=run_dir))


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    return CACHE_DIR


@pytest.fixture(scope="session")
def tiny_model_dir(cache_dir) -> Path:
    """HF dir of the ``tiny_llama`` asset (built once from the SmolLM2 asset's tokenizer)."""
    from pretrain_exp.data.assets import hf_model_dir

    return hf_model_dir("tiny_llama", cache_dir)
