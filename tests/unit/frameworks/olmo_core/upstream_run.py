"""An OLMo-core experiment run exactly as ``olmo_core.script_utils.main`` runs one: the test fixtures of
``test_upstream_checkpoint.py`` (checkpoints and the reference continuation) are written by OLMo-core's own
``ExperimentConfig`` + ``Trainer`` here, never by the project's code.

``python -m tests.unit.frameworks.olmo_core.upstream_run [--device cuda] [--bf16] <save_folder> <work_dir>
<hard_stop> <token file>...`` (under ``torchrun`` for several processes, gloo) trains the tiny OLMo-3-style model of
:func:`experiment_config` until step ``hard_stop``, resuming from the newest checkpoint in ``save_folder``
(OLMo-core's own continuation), and appends ``{"step", "rank", "index": [instance ids], "loss"}`` per step to
``<save_folder>/upstream_steps.jsonl``.
``--device cuda`` trains on the GPU (the model built on the meta device and materialised there, as OLMo-core's
scripts do), ``--bf16`` with OLMo-core's bf16 autocast (``autocast_precision``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

#: the fixture's run: unlike every project default on purpose
L, B, SEED, MAX_TARGET = 32, 8, 34521, 64
PEAK_LR, WARMUP, MAX_STEPS = 4e-3, 2, 20


def experiment_config(save_folder: str, work_dir: str, paths, hard_stop: int, device: str = "cpu",
                      bf16: bool = False):
    """OLMo-core's ``ExperimentConfig`` of the fixture run: the tiny OLMo-3-shaped model (3 sliding-window layers
    with a 16-token window, one full-attention layer), uint32 dolma2 token files, ``L`` = 32 with
    ``max_target_sequence_length`` = 2 ``L`` (fingerprinted; instances shuffled in pairs), 8 instances per step,
    data seed 34521, AdamW with the official OLMo-3 groups (no weight decay on the embeddings), z-loss, clipping,
    cosine with warmup over ``MAX_STEPS``."""
    from olmo_core.config import DType
    from olmo_core.data import NumpyDataLoaderConfig, NumpyDatasetDType, NumpyFSLDatasetConfig, TokenizerConfig
    from olmo_core.nn.attention import SlidingWindowAttentionConfig
    from olmo_core.optim import AdamWConfig, CosWithWarmup, OptimGroupOverride
    from olmo_core.script_utils import ExperimentConfig
    from olmo_core.train import Duration, TrainerConfig
    from olmo_core.train.callbacks import CheckpointerCallback, ConfigSaverCallback
    from olmo_core.train.train_module import TransformerTrainModuleConfig

    from pretrain_exp.frameworks.olmo_core.presets import tiny_model_config

    model = tiny_model_config("olmo3_tiny")
    model.block.sequence_mixer.sliding_window = SlidingWindowAttentionConfig(
        pattern=[16, 16, 16, -1], force_full_attention_on_first_layer=False, force_full_attention_on_last_layer=True)
    return ExperimentConfig(
        model=model,
        dataset=NumpyFSLDatasetConfig(paths=[str(p) for p in paths], sequence_length=L,
                                      max_target_sequence_length=MAX_TARGET, dtype=NumpyDatasetDType.uint32,
                                      tokenizer=TokenizerConfig.dolma2(), work_dir=work_dir),
        data_loader=NumpyDataLoaderConfig(global_batch_size=B * L, seed=SEED, num_workers=0, work_dir=work_dir),
        train_module=TransformerTrainModuleConfig(
            rank_microbatch_size=4 * L, max_sequence_length=L,
            optim=AdamWConfig(lr=PEAK_LR, weight_decay=0.1, betas=(0.9, 0.95), group_overrides=[
                OptimGroupOverride(params=["embeddings.weight"], opts=dict(weight_decay=0.0))]),
            scheduler=CosWithWarmup(warmup=WARMUP), max_grad_norm=1.0, z_loss_multiplier=1e-5,
            autocast_precision=DType.bfloat16 if bf16 else None),
        trainer=TrainerConfig(save_folder=save_folder, max_duration=Duration.steps(MAX_STEPS),
                              hard_stop=Duration.steps(hard_stop), metrics_collect_interval=1, device=device,
                              callbacks={"checkpointer": CheckpointerCallback(save_interval=1, save_async=False,
                                                                              max_checkpoints=None),
                                         "config_saver": ConfigSaverCallback()}),
        init_seed=7,
    )


def main(save_folder: str, work_dir: str, hard_stop: int, paths, device: str = "cpu", bf16: bool = False) -> None:
    """``olmo_core.script_utils.main``'s body for :func:`experiment_config` (plus a recording callback)."""
    from olmo_core.distributed.utils import get_rank
    from olmo_core.train import prepare_training_environment, teardown_training_environment
    from olmo_core.train.callbacks import Callback, ConfigSaverCallback
    from olmo_core.utils import seed_all

    class Record(Callback):
        index: dict = {}

        def pre_step(self, batch):
            self.index[self.trainer.global_step] = batch["index"].tolist()

        def log_metrics(self, step, metrics):
            if "train/CE loss" in metrics:
                with open(Path(save_folder) / "upstream_steps.jsonl", "a") as f:
                    f.write(json.dumps({"step": step, "rank": get_rank(), "index": self.index[step],
                                        "loss": float(metrics["train/CE loss"])}) + "\n")

    torch.set_num_threads(1)
    distributed = torch.distributed.is_torchelastic_launched()
    prepare_training_environment(backend="gloo" if distributed else None)
    config = experiment_config(save_folder, work_dir, paths, hard_stop, device, bf16)
    seed_all(config.init_seed)
    model = config.model.build(init_device="meta")
    train_module = config.train_module.build(model, device=torch.device(device))
    dataset = config.dataset.build()
    data_loader = config.data_loader.build(dataset, dp_process_group=train_module.dp_process_group)
    config.trainer.callbacks["record"] = Record()
    trainer = config.trainer.build(train_module, data_loader)
    for callback in trainer.callbacks.values():
        if isinstance(callback, ConfigSaverCallback):
            callback.config = config.as_config_dict()
            break
    if not trainer.no_checkpoints and not trainer.maybe_load_checkpoint() and config.load_path:
        trainer.load_checkpoint(config.load_path, load_trainer_state=False)
    trainer.fit()
    teardown_training_environment()


if __name__ == "__main__":
    args = sys.argv[1:]
    device = "cpu"
    if args[0] == "--device":
        device, args = args[1], args[2:]
    bf16 = args[0] == "--bf16"
    args = args[bf16:]
    main(args[0], args[1], int(args[2]), args[3:], device, bf16)
