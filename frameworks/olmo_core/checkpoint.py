"""OLMo-core checkpoints: the model config they carry, a pickle-free check of their trainer state, HF export.

An OLMo-core checkpoint ``step<N>/`` (what ``olmo_core.train.Trainer`` writes, and what AI2 publishes for
OLMo-3) holds ``.metadata.json``, ``config.json`` (the experiment config; its ``model`` entry is a serialized
``TransformerConfig``), ``train/rank<r>.pt`` (trainer state: step, data-loader position and dataset fingerprint,
RNG states) and ``model_and_optim/`` (torch DCP shards). A checkpoint without trainer state (``config.json`` + DCP
shards directly in the folder, no ``train/``; with optimizer state if ``config.json`` says
``"optimizer_state": true``) is a valid initial checkpoint too: training then starts at ``model.checkpoint_step``
of the data order.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Optional

import torch

from pretrain_exp.core.errors import CheckpointError
from pretrain_exp.core.io import apply_default_modes
from pretrain_exp.frameworks.base import TRAIN_STATE_SAFE_GLOBALS, Checkpoint


def model_config(ckpt_dir: Path, cuda: Optional[bool] = None):
    """The ``olmo_core.nn.transformer.TransformerConfig`` in ``<ckpt_dir>/config.json`` (key ``model``).

    Without CUDA (``cuda=False``: also for a model built on the CPU of a GPU machine, which may lack flash-attn)
    the attention backend is switched to ``torch`` (SDPA with an explicit sliding-window mask), since OLMo-3's
    default ``flash_2`` needs a GPU and the flash-attn package; the weights and the model's function are unchanged.

    :raises CheckpointError: if ``config.json`` is missing or has no ``model`` entry.
    """
    from olmo_core.nn.attention.backend import AttentionBackendName
    from olmo_core.nn.transformer import TransformerConfig

    path = Path(ckpt_dir) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{path}: missing (an OLMo-core checkpoint carries its experiment config there)")
    raw = json.loads(path.read_text())
    if not isinstance(raw, dict) or "model" not in raw:
        raise CheckpointError(f"{path}: no 'model' entry (expected an OLMo-core experiment config)")
    config = TransformerConfig.from_dict(raw["model"])
    cuda = torch.cuda.is_available() if cuda is None else cuda
    if not cuda and config.block.sequence_mixer is not None:
        mixer = config.block.sequence_mixer
        if getattr(mixer, "backend", None) not in (None, AttentionBackendName.torch):
            mixer.backend = AttentionBackendName.torch
        if hasattr(mixer, "use_flash"):
            mixer.use_flash = None
    return config


def check_train_state(ckpt_dir: Path) -> Optional[dict]:
    """Load ``train/rank0.pt`` with ``weights_only=True`` (allow-list
    :data:`~pretrain_exp.frameworks.base.TRAIN_STATE_SAFE_GLOBALS`).

    OLMo-core itself reads trainer state with full unpickling; calling this first refuses a file that holds
    anything but tensors, containers, paths and numpy RNG state before OLMo-core touches it.

    :returns: the trainer state dict, or ``None`` for a model-only checkpoint.
    :raises CheckpointError: if a ``train/rank*.pt`` holds other objects (or cannot be read).
    """
    states = sorted((Path(ckpt_dir) / "train").glob("rank*.pt"))
    first = None
    for path in states:
        try:
            with torch.serialization.safe_globals(TRAIN_STATE_SAFE_GLOBALS):
                state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001  (UnpicklingError, or a truncated file)
            raise CheckpointError(f"{path}: trainer state refused by weights_only loading "
                                  f"({' '.join(str(e).split())[:200]})") from None
        first = state if first is None else first
    return first


def checkpoint_step(ckpt_dir: Path) -> Optional[int]:
    """``global_step`` recorded in a checkpoint's trainer state (``None`` for a model-only checkpoint)."""
    state = check_train_state(ckpt_dir)
    return None if state is None else int(state["global_step"])


def load_model(ckpt_dir: Path):
    """The checkpoint's model (``olmo_core`` ``Transformer``, fp32, CPU, eval mode) with its weights loaded.

    The ``model.*`` entries of the DCP shards (what OLMo-core's ``save_model_and_optim_state`` writes) are read by
    this process alone (``torch.distributed.checkpoint.load(no_dist=True)`` with OLMo-core's
    ``RemoteFileSystemReader``), so rank 0 of a torchrun job can
    export a checkpoint while the other ranks wait (OLMo-core's ``load_model_and_optim_state`` would run
    collectives over every rank).

    :raises CheckpointError: if the folder holds no DCP model state.
    """
    import torch.distributed.checkpoint as dcp
    from olmo_core.distributed.checkpoint.filesystem import RemoteFileSystemReader

    ckpt_dir = Path(ckpt_dir)
    state_dir = ckpt_dir / "model_and_optim" if (ckpt_dir / "model_and_optim").is_dir() else ckpt_dir
    if not (state_dir / ".metadata").is_file():
        raise CheckpointError(f"{ckpt_dir}: no model state (neither model_and_optim/.metadata nor .metadata)")
    model = model_config(ckpt_dir, cuda=False).build(init_device="cpu")  # a CPU build: no flash-attn needed
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=str(state_dir), storage_reader=RemoteFileSystemReader(str(state_dir)), no_dist=True)
    model.load_state_dict(state["model"])
    return model.eval()


def save_hf(model, tokenizer, out_dir: Path) -> Path:
    """Write ``model`` (an OLMo-core ``Transformer``) as an HF model dir with OLMo-core's own converter
    (``olmo_core.nn.hf.checkpoint.save_hf_model``: ``Olmo2ForCausalLM`` / ``Olmo3ForCausalLM`` and friends),
    plus the tokenizer; EOS/pad ids come from the tokenizer."""
    from olmo_core.nn.hf.checkpoint import save_hf_model

    out_dir = Path(out_dir)
    state = {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
    save_hf_model(str(out_dir), state, model, save_overwrite=True)
    config_path = out_dir / "config.json"
    config = json.loads(config_path.read_text())
    config.update(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                  bos_token_id=tokenizer.bos_token_id)
    if config.get("max_position_embeddings", -1) <= 0:  # OLMo-core has no such limit; RoPE extrapolates
        config["max_position_embeddings"] = 65536
    config_path.write_text(json.dumps(config, indent=2))
    tokenizer.save_pretrained(str(out_dir))
    apply_default_modes(out_dir)  # safetensors writes 0600 files
    return out_dir


class OlmoCoreCheckpoint(Checkpoint):
    """An OLMo-core checkpoint folder at a global step; :meth:`to_hf` converts it for the evals.

    A checkpoint whose asynchronous save is still running carries ``wait`` (returns once ``.metadata.json`` is
    written) and, where the trainer's model is whole in this process and still at this step, ``live_model``:
    :meth:`to_hf` then exports those weights (equal to the saved ones) without waiting for the save or reading it.
    """

    is_hf = False

    def __init__(self, path: Path, step: int, tokenizer, live_model=None, wait: Optional[Callable[[], None]] = None):
        super().__init__(Path(path), int(step))
        self.tokenizer = tokenizer
        self.live_model, self._wait = live_model, wait

    def wait(self) -> None:
        """Return once the checkpoint is complete on disk (at once for a checkpoint saved synchronously)."""
        if self._wait is not None:
            self._wait()

    def to_hf(self, out_dir: Path) -> Path:
        """Write the HF export of this checkpoint to ``out_dir`` (see :func:`save_hf`); returns ``out_dir``."""
        if self.live_model is not None:
            return save_hf(self.live_model, self.tokenizer, out_dir)
        self.wait()
        return save_hf(load_model(self.path), self.tokenizer, out_dir)
