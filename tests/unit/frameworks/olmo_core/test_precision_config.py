"""``training.precision`` becomes OLMo-core's train-module settings: bf16 autocast for ``bf16`` and ``fp8``, and for
``fp8`` also OLMo-core's ``Float8Config`` (torchao's tensorwise float8 training; float8 all-gathers where FSDP/HSDP
shard the weights). On CPU the config is what is checked (applying it needs torchao and a float8 GPU:
``tests/gpu/test_gpu_fp8.py``)."""

from __future__ import annotations

import pytest
from olmo_core.config import DType
from olmo_core.float8 import AOFloat8LinearConfig, Float8Config
from olmo_core.train.train_module import TransformerTrainModuleConfig

from pretrain_exp.core.config import Precision
from pretrain_exp.frameworks.olmo_core.framework import OlmoCoreFramework, precision_config
from pretrain_exp.frameworks.olmo_core.presets import tiny_checkpoint
from tests.conftest import CACHE_DIR, make_config


def framework(tmp_path, *overrides) -> OlmoCoreFramework:
    fw = object.__new__(OlmoCoreFramework)  # the options only: no process group, no run
    fw.cfg = make_config("framework=olmo_core", "training=tiny", "framework.lr_schedule=run", *overrides,
                         run_dir=tmp_path)
    fw.model_dir = tiny_checkpoint("olmo3_tiny", CACHE_DIR)
    return fw


def test_fp8_train_module_has_olmo_cores_float8_config_and_bf16_autocast(tmp_path):
    fw = framework(tmp_path, "training.precision=fp8")
    tm = fw.train_module_config(cuda=False, world=1)
    assert isinstance(tm, TransformerTrainModuleConfig)
    assert tm.autocast_precision == DType.bfloat16
    f8 = tm.float8_config
    assert isinstance(f8, Float8Config) and f8.enabled and f8.ao_recipe is None and f8.ao_mx is None
    # one process, no FSDP: power-of-2 tensorwise scales, the weights stay plain parameters
    assert f8.ao == AOFloat8LinearConfig(round_scales_to_power_of_2=True)
    assert not f8.ao.enable_fsdp_float8_all_gather and not f8.ao.emulate

    fw.cfg.training.precision = Precision.bf16
    tm = fw.train_module_config(cuda=False, world=1)
    assert tm.autocast_precision == DType.bfloat16 and tm.float8_config is None
    fw.cfg.training.precision = Precision.fp32
    tm = fw.train_module_config(cuda=False, world=1)
    assert tm.autocast_precision is None and tm.float8_config is None


@pytest.mark.parametrize("overrides,world", [
    (["training.data_parallel=fsdp"], 2),
    (["training.data_parallel=auto"], 2),  # auto: FSDP on GPUs
    (["training.data_parallel=hsdp", "training.nnodes=2", "training.nproc_per_node=2"], 4),
])
def test_sharded_fp8_is_olmo_cores_recommended_config(tmp_path, overrides, world):
    fw = framework(tmp_path, "training.precision=fp8", "training.micro_batch_size=2", *overrides)
    tm = fw.train_module_config(cuda=True, world=world)
    assert tm.dp_config.name in ("fsdp", "hsdp")
    assert tm.autocast_precision == DType.bfloat16
    # OLMo-core's fp8 recipes' setting: float8 all-gathers of the sharded weights, power-of-2 scales
    assert tm.float8_config.enabled and tm.float8_config.ao == AOFloat8LinearConfig.recommended()
    fw.cfg.training.data_parallel = "ddp"  # DDP replicates plain weights: no float8 all-gather
    assert fw.train_module_config(cuda=True, world=world).float8_config.ao == AOFloat8LinearConfig(
        round_scales_to_power_of_2=True)


def test_precision_config_by_precision():
    autocast, f8 = precision_config(Precision.fp8, cuda=True, sharded=True)
    assert autocast == DType.bfloat16 and f8.enabled and f8.ao.enable_fsdp_float8_all_gather
    assert precision_config(Precision.bf16, cuda=False) == (DType.bfloat16, None)
    assert precision_config(Precision.fp32, cuda=True) == (None, None)
    assert precision_config(Precision.auto, cuda=False) == (None, None)  # auto: bf16 only on a bf16 GPU
