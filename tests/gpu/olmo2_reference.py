"""OLMo-core's own ``Trainer`` on an OLMo-2 checkpoint converted to OLMo-core: the reference of the ``olmo2`` GPU
continuation test (``test_gpu_continuation.py``). Nothing of the project's training code is used: the model comes
from the converted checkpoint's ``config.json`` (OLMo-core's ``TransformerConfig.from_dict``) and its DCP shards
(the trainer's ``load_path``), the data from the OLMo-2 ``config.yaml`` (``data.paths``, ``data.memmap_dtype``,
``model.max_sequence_length``, ``global_train_batch_size``) read into OLMo-core's ``NumpyFSLDataset`` and
``NumpyDataLoader`` with seed ``S - 1`` for OLMo-2 seed ``S`` (allenai/OLMo ``olmo/data/iterable_dataset.py``
shuffles epoch ``e`` from 0 with ``seed + e``; OLMo-core epoch ``e`` from 1 with ``seed + e``), the optimizer from
its ``optimizer`` section (AdamW, no weight decay on the embeddings: ``decay_embeddings: false``).

``python -m tests.gpu.olmo2_reference [--device cuda] [--bf16] <converted dir> <olmo2 dir> <save_folder> <work_dir>
<steps>`` trains ``steps`` steps from the checkpoint's step 0 and appends ``{"step", "index", "loss"}`` per step to
``<save_folder>/upstream_steps.jsonl``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import yaml


def main(converted: Path, olmo2_dir: Path, save_folder: Path, work_dir: Path, steps: int, device: str = "cuda",
         bf16: bool = False) -> None:
    from olmo_core.config import DType
    from olmo_core.data import (
        NumpyDataLoaderConfig,
        NumpyDatasetDType,
        NumpyFSLDatasetConfig,
        TokenizerConfig,
    )
    from olmo_core.nn.attention.backend import AttentionBackendName
    from olmo_core.nn.transformer import TransformerConfig
    from olmo_core.optim import AdamWConfig, ConstantScheduler, OptimGroupOverride
    from olmo_core.train import Duration, LoadStrategy, TrainerConfig, prepare_training_environment
    from olmo_core.train.callbacks import Callback
    from olmo_core.train.train_module import TransformerTrainModuleConfig

    cfg = yaml.safe_load((olmo2_dir / "config.yaml").read_text())
    L, B, seed = cfg["model"]["max_sequence_length"], cfg["global_train_batch_size"], cfg["seed"]
    assert cfg["data"]["seed"] is None and not cfg["optimizer"]["decay_embeddings"]
    model_config = TransformerConfig.from_dict(json.loads((converted / "config.json").read_text())["model"])
    model_config.block.sequence_mixer.backend = AttentionBackendName.torch  # SDPA, the run's training.attention
    opt = cfg["optimizer"]
    prepare_training_environment(backend=None)
    model = model_config.build(init_device="meta")
    train_module = TransformerTrainModuleConfig(
        rank_microbatch_size=B * L, max_sequence_length=L,
        optim=AdamWConfig(lr=opt["learning_rate"], weight_decay=opt["weight_decay"], betas=tuple(opt["betas"]),
                          eps=opt["eps"], group_overrides=[OptimGroupOverride(params=["embeddings.weight"],
                                                                              opts=dict(weight_decay=0.0))]),
        scheduler=ConstantScheduler(), max_grad_norm=cfg["max_grad_norm"],
        autocast_precision=DType.bfloat16 if bf16 else None,
    ).build(model, device=torch.device(device))
    dataset = NumpyFSLDatasetConfig(
        paths=cfg["data"]["paths"], sequence_length=L, dtype=NumpyDatasetDType(cfg["data"]["memmap_dtype"]),
        tokenizer=TokenizerConfig(vocab_size=cfg["model"]["vocab_size"], eos_token_id=cfg["model"]["eos_token_id"],
                                  pad_token_id=cfg["model"]["pad_token_id"]),
        work_dir=str(work_dir)).build()
    loader = NumpyDataLoaderConfig(global_batch_size=B * L, seed=seed - 1, num_workers=0,
                                   work_dir=str(work_dir)).build(dataset)

    class Record(Callback):
        index: dict = {}

        def pre_step(self, batch):
            self.index[self.trainer.global_step] = batch["index"].tolist()

        def log_metrics(self, step, metrics):
            if "train/CE loss" in metrics:
                with open(save_folder / "upstream_steps.jsonl", "a") as f:
                    f.write(json.dumps({"step": step, "index": self.index[step],
                                        "loss": float(metrics["train/CE loss"])}) + "\n")

    trainer = TrainerConfig(save_folder=str(save_folder), load_path=str(converted),
                            load_strategy=LoadStrategy.always, load_trainer_state=False, load_optim_state=True,
                            max_duration=Duration.steps(steps), metrics_collect_interval=1, device=device,
                            callbacks={"record": Record()}).build(train_module, loader)
    trainer.fit()


if __name__ == "__main__":
    args, device = sys.argv[1:], "cpu"
    if args[0] == "--device":
        device, args = args[1], args[2:]
    bf16 = args[0] == "--bf16"
    args = args[bf16:]
    main(Path(args[0]), Path(args[1]), Path(args[2]), Path(args[3]), int(args[4]), device, bf16)
