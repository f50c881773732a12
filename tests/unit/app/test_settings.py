"""Run settings taken from the checkpoint (``${checkpoint:<key>}``, ``data=checkpoint``) and the override log."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import yaml

from pretrain_exp.app.settings import log_overrides
from pretrain_exp.core.errors import ConfigError
from tests.conftest import CACHE_DIR, ROOT, make_config


@pytest.fixture(scope="module")
def olmo2_tiny_source():
    """The tiny OLMo-2 preset's ``config.yaml`` (the checkpoint ``framework=olmo2`` continues by default)."""
    from pretrain_exp.frameworks.olmo2.presets import tiny_checkpoint

    return yaml.safe_load((tiny_checkpoint("olmo2_tiny", CACHE_DIR) / "config.yaml").read_text())


def test_olmo2_run_takes_the_checkpoint_settings(tmp_path, olmo2_tiny_source, caplog):
    with caplog.at_level(logging.WARNING, logger="pretrain_exp.app.settings"):
        cfg = make_config("framework=olmo2", run_dir=tmp_path)
    src = olmo2_tiny_source
    assert cfg.data.name == "checkpoint" and cfg.data.text is None
    assert cfg.data.paths == src["data"]["paths"] and len(cfg.data.paths) >= 1
    assert cfg.data.dtype == src["data"]["memmap_dtype"] == "uint32"
    assert (cfg.training.sequence_length, cfg.training.global_batch_size) == (
        src["model"]["max_sequence_length"], src["global_train_batch_size"])
    assert (cfg.data.seed, cfg.data.first_epoch) == (src["seed"] - 1, 1)  # OLMo-2 seed S = data.seed S-1 here
    assert cfg.model.tokenizer == "dolma2"  # tokenizer.identifier tokenizers/allenai_dolma2.json
    assert not [r for r in caplog.records if "override" in r.getMessage()]


def test_an_override_is_kept_and_named_in_the_log(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="pretrain_exp.app.settings"):
        cfg = make_config("framework=olmo2", "training.global_batch_size=4", "data.held_out_rows=0",
                          run_dir=tmp_path)
    assert cfg.training.global_batch_size == 4
    assert log_overrides(cfg) == {"training.global_batch_size": (4, 8)}
    msgs = [r.getMessage() for r in caplog.records]
    assert "override: training.global_batch_size=4 (the checkpoint records 8)" in msgs


def test_olmo_core_preset_records_its_data(tmp_path):
    cfg = make_config("framework=olmo_core", run_dir=tmp_path)
    assert (cfg.training.sequence_length, cfg.training.global_batch_size) == (128, 8)
    assert (cfg.data.seed, cfg.data.first_epoch, cfg.data.dtype) == (0, 1, "uint32")
    assert cfg.model.tokenizer == "dolma2" and cfg.data.paths


def test_checkpoint_data_without_a_checkpoint_that_records_it(tmp_path):
    with pytest.raises(ConfigError) as ei:
        make_config("data=checkpoint", run_dir=tmp_path)  # framework=hf: an HF dir records no token files
    assert ei.value.key == "data.paths"
    assert "does not record it; set data.paths=..." in str(ei.value)


@pytest.mark.slow
def test_cfg_job_resolve_prints_the_derived_values(tmp_path):
    out = subprocess.run([sys.executable, "-m", "pretrain_exp", "framework=olmo2", f"cache_dir={CACHE_DIR}",
                          "--cfg", "job", "--resolve"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    cfg = yaml.safe_load(out.stdout)
    assert cfg["training"]["sequence_length"] == 128 and cfg["training"]["global_batch_size"] == 8
    assert cfg["data"]["dtype"] == "uint32" and cfg["model"]["tokenizer"] == "dolma2"
    assert "${checkpoint:" not in out.stdout
