"""The olmo_core framework's scale-out options become OLMo-core's own configs: data parallelism (DDP / FSDP /
HSDP with one shard group per node), activation checkpointing, the attention backend, and the from-scratch
builders. HSDP needs several CUDA devices to run (OLMo-core builds it on a 2-D device mesh); on CPU the config is
what is checked, then built into OLMo-core's ``TransformerTrainModuleConfig``."""

from __future__ import annotations

import pytest
from olmo_core.distributed.parallel import DataParallelType
from olmo_core.nn.attention.backend import AttentionBackendName

from pretrain_exp.core.errors import ConfigError
from pretrain_exp.frameworks.olmo_core.framework import OlmoCoreFramework
from pretrain_exp.frameworks.olmo_core.presets import builder_config
from tests.conftest import make_config


def framework(tmp_path, *overrides) -> OlmoCoreFramework:
    fw = object.__new__(OlmoCoreFramework)  # the options only: no checkpoint is resolved
    fw.cfg = make_config("framework=olmo_core", "training=tiny", *overrides, run_dir=tmp_path)
    return fw


def test_hsdp_shards_within_a_node_and_replicates_across_nodes(tmp_path):
    fw = framework(tmp_path, "training.data_parallel=hsdp", "training.nnodes=2", "training.nproc_per_node=2",
                   "training.micro_batch_size=2")
    dp = fw._dp_config(world=4, cuda=True)
    assert (dp.name, dp.shard_degree, dp.num_replicas) == (DataParallelType.hsdp, 2, 2)
    assert str(dp.param_dtype) == "bfloat16" and str(dp.reduce_dtype) == "float32"
    with pytest.raises(ConfigError, match="training.data_parallel"):
        fw._dp_config(world=3, cuda=True)
    from olmo_core.optim import AdamWConfig
    from olmo_core.train.train_module import TransformerTrainModuleConfig

    TransformerTrainModuleConfig(rank_microbatch_size=256, max_sequence_length=128, optim=AdamWConfig(),
                                 dp_config=dp, ac_config=fw._ac_config(), compile_model=True)


def test_data_parallel_choices(tmp_path):
    fw = framework(tmp_path)
    for choice, cuda, expected in [("auto", True, DataParallelType.fsdp), ("auto", False, DataParallelType.ddp),
                                   ("ddp", True, DataParallelType.ddp), ("fsdp", False, DataParallelType.fsdp)]:
        fw.cfg.training.data_parallel = choice
        assert fw._dp_config(world=2, cuda=cuda).name == expected
        assert fw._dp_config(world=1, cuda=cuda) is None  # no process group: one process trains alone


def test_activation_checkpointing_and_attention_backend(tmp_path, monkeypatch):
    from pretrain_exp.frameworks.olmo_core.presets import tiny_checkpoint
    from tests.conftest import CACHE_DIR

    fw = framework(tmp_path, "training.activation_checkpointing=true", "training.attention=flash")
    assert fw._ac_config().mode == "full"
    fw.cfg.training.activation_checkpointing = False
    assert fw._ac_config() is None
    fw.model_dir = tiny_checkpoint("olmo3_tiny", CACHE_DIR)
    assert fw.model_config(cuda=True).block.sequence_mixer.backend == AttentionBackendName.flash_2
    assert fw.model_config(cuda=False).block.sequence_mixer.backend == AttentionBackendName.torch
    fw.cfg.training.attention = "sdpa"
    assert fw.model_config(cuda=True).block.sequence_mixer.backend == AttentionBackendName.torch


def test_builders_by_name_give_the_olmo_shapes(tmp_path):
    c = builder_config("olmo2_1B_v2", 100_352, init_seed=7)  # the released OLMo-2 1B shape
    assert (c.d_model, c.n_layers, c.init_seed) == (2048, 16, 7)
    assert builder_config("olmo3_7B", 100_352, 0).block.sequence_mixer.sliding_window is not None
    with pytest.raises(ConfigError, match="model.config.*olmo2_1B_v2"):
        builder_config("olmo2_1b", 100_352, 0)


@pytest.mark.slow
def test_random_init_config_rules(tmp_path):
    with pytest.raises(ConfigError, match="model.config"):
        make_config("experiment=scratch_olmo_core", "model.config=null", run_dir=tmp_path)
    with pytest.raises(ConfigError, match="model.checkpoint_step"):
        make_config("experiment=scratch_olmo_core", "model.checkpoint_step=5", run_dir=tmp_path)
    with pytest.raises(ConfigError, match="training.data_parallel"):
        make_config("experiment=scratch_olmo_core", "training.data_parallel=zero3", run_dir=tmp_path)
    with pytest.raises(ConfigError, match="model.asset"):
        make_config("experiment=scratch_hf", "model.asset=tiny_llama", run_dir=tmp_path)
    with pytest.raises(ConfigError, match="model.init"):
        make_config("experiment=scratch_olmo_core", "framework=olmo2", run_dir=tmp_path)
    cfg = make_config("experiment=scratch_olmo_core", "seed=3", run_dir=tmp_path)
    assert (cfg.model.init, cfg.model.config, cfg.model.init_seed, cfg.model.tokenizer) == (
        "random", "olmo2_14M", 3, "dolma2")
