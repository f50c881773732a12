"""Noise spans: seeded Gaussian noise added to the input embeddings of chosen training rows (``type: gaussian``,
:mod:`pretrain_exp.insertion.types.gaussian`, is the insertion type whose items are such noise patterns).

Definition (Bordt & Pawelczyk 2025, "Train Once, Answer All: Many Pretraining Experiments for the Cost of One",
arXiv:2509.23383, the Gaussian-poisoning experiment; its reference code adds, to the input embeddings of a chosen
training sequence, a noise tensor of the sequence's shape ``(L, d_model)`` drawn from ``N(0, sigma^2)`` per
coordinate, ``sigma = 0.075`` by default): an experiment of ``type: gaussian`` has ``num_items`` noise
**patterns** (its items). Pattern ``i`` of experiment ``e`` is

    xi_i = sigma * randn((L, d_model), generator=torch.Generator("cpu").manual_seed(noise_seed(seed, e, i)))

drawn in float32 on the CPU (so it is the same on every machine) and cast to the embeddings' dtype and device.
One independent value per token position and coordinate (not one vector broadcast over the row). Its **dup
count** is how many training rows get that same pattern added; dup-0 patterns are the never-trained controls
("fresh noise" for the eval, :mod:`pretrain_exp.evals.gaussian`). A copy occupies a whole row ``q`` (training-order
index): the row's tokens are not changed, no other insertion shares the row, and ``e_q <- e_q + xi_i`` where ``e_q``
(``(L, d_model)``) is the output of the input-embedding module for that row. Nothing of the noise is stored:
``(seed, experiment, index, sigma)`` in the plan regenerate it (:func:`make_noise`).

Framework API (one :class:`EmbeddingNoise` per training process)::

    noise = EmbeddingNoise(NoiseSpec.from_plan(plan))      # or EmbeddingNoise(plan)
    handle = noise.attach(model.get_input_embeddings())    # a torch forward hook
    for each micro-batch:                                   # before its forward pass
        noise.set_rows(q)                                   # LongTensor (b,): training-order rows of its b rows
        loss = model(input_ids=...)                         # the hook adds the planned noise to those rows
    handle.remove()

Under data parallelism each rank passes the rows of its own micro-batch; the hook needs the embedding output as
a local tensor of shape ``(b, L, d_model)`` (one row per entry of ``q``).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import numpy as np

if TYPE_CHECKING:  # imported where used: a plan is read (the inspector, the report) without torch
    import torch

#: default noise std of the reference implementation (all its models used 0.075)
DEFAULT_SIGMA = 0.075


def noise_seed(seed: int, experiment: str, index: int) -> int:
    """Seed of pattern ``index`` of ``experiment``: the first 8 bytes of ``sha256("<seed>/<experiment>/<index>")``
    as a big-endian integer, masked to 63 bits (a valid ``torch.Generator.manual_seed``). Recorded in the plan
    and manifest."""
    digest = hashlib.sha256(f"{int(seed)}/{experiment}/{int(index)}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & (2 ** 63 - 1)


def make_noise(seed: int, sequence_length: int, d_model: int, sigma: float, dtype: Optional[torch.dtype] = None,
               device=None) -> torch.Tensor:
    """The noise pattern of ``seed``: ``sigma * randn(L, d_model)`` from a CPU ``torch.Generator`` seeded with
    ``seed`` (float32 draws, then cast), shape ``(sequence_length, d_model)``, ``dtype`` (default float32) on
    ``device``.

    :raises ValueError: for ``sigma < 0`` or non-positive sizes.
    """
    import torch

    if not sigma >= 0:
        raise ValueError(f"noise sigma must be >= 0, got {sigma}")
    if sequence_length <= 0 or d_model <= 0:
        raise ValueError(f"noise shape must be positive, got ({sequence_length}, {d_model})")
    g = torch.Generator(device="cpu").manual_seed(int(seed))
    z = torch.randn((sequence_length, d_model), generator=g, dtype=torch.float32) * float(sigma)
    return z.to(dtype=dtype or torch.float32, device=device)


@dataclass
class NoiseSpec:
    """Which training-order rows get which noise: sorted arrays of shape ``(n,)``.

    ``rows`` int64 (sorted, unique), ``seeds`` int64 (the pattern's :func:`noise_seed`), ``sigmas`` float64.
    """

    rows: np.ndarray
    seeds: np.ndarray
    sigmas: np.ndarray

    @classmethod
    def from_plan(cls, plan) -> "NoiseSpec":
        """The noised rows of a :class:`~pretrain_exp.insertion.plan.Plan`."""
        items = plan.noise_item_ids.astype(np.int64)
        sig = np.array([plan.noise_sigma[plan.experiments[int(plan.item_experiment[i])]] for i in items],
                       dtype=np.float64)
        return cls(plan.noise_rows.astype(np.int64), plan.item_noise_seed[items].astype(np.int64), sig)

    def lookup(self, q: np.ndarray) -> np.ndarray:
        """Index into the arrays of each row of ``q`` (int array ``(b,)``), ``-1`` for rows without noise."""
        q = np.asarray(q, dtype=np.int64)
        if self.rows.size == 0:
            return np.full(q.shape, -1, dtype=np.int64)
        j = np.minimum(np.searchsorted(self.rows, q), self.rows.size - 1)
        return np.where(self.rows[j] == q, j, -1)


class EmbeddingNoise:
    """A forward hook on an input-embedding module that adds each row's planned noise (module docstring).

    :param spec: a :class:`NoiseSpec` or a plan (``NoiseSpec.from_plan``).
    :param cache_size: noise patterns kept (per dtype and device) so repeated patterns are drawn once.

    Per micro-batch the framework calls :meth:`set_rows` with the training-order index of each row of the
    micro-batch, in the order the rows are stacked; the next forward passes of the module (including
    recomputations under activation checkpointing) add ``xi`` to output rows ``r`` with a planned row ``q[r]``
    and leave the others untouched. The output must have shape ``(b, L, d_model)``.
    """

    def __init__(self, spec, cache_size: int = 64):
        self.spec = spec if isinstance(spec, NoiseSpec) else NoiseSpec.from_plan(spec)
        self.cache_size = cache_size
        self._cache: OrderedDict = OrderedDict()
        self._rows: Optional[np.ndarray] = None
        self.rows_noised = 0  #: noised rows seen by forward passes so far (a count for logs and tests)

    def attach(self, module: torch.nn.Module) -> torch.utils.hooks.RemovableHandle:
        """Register the hook on ``module`` (e.g. ``model.get_input_embeddings()``); returns its handle."""
        return module.register_forward_hook(self._hook)

    def set_rows(self, q) -> None:
        """Training-order indices of the rows of the next forward pass: LongTensor or int array of shape
        ``(b,)``. ``None`` means rows without noise (e.g. an evaluation forward)."""
        if q is not None and hasattr(q, "cpu"):  # a tensor, maybe on the GPU
            q = q.cpu()
        self._rows = None if q is None else np.asarray(q, dtype=np.int64).reshape(-1)

    def noise(self, j: int, sequence_length: int, d_model: int, dtype: torch.dtype, device) -> torch.Tensor:
        """The pattern of spec entry ``j`` (cached): ``(sequence_length, d_model)``."""
        key = (int(self.spec.seeds[j]), float(self.spec.sigmas[j]), sequence_length, d_model, dtype, str(device))
        z = self._cache.get(key)
        if z is None:
            z = make_noise(key[0], sequence_length, d_model, key[1], dtype, device)
            self._cache[key] = z
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return z

    def _hook(self, module, args, output):
        if self._rows is None or self.spec.rows.size == 0:
            return None
        if output.dim() != 3 or output.shape[0] != self._rows.size:
            raise RuntimeError(f"EmbeddingNoise: set_rows got {self._rows.size} rows but the embedding output has "
                               f"shape {tuple(output.shape)}; call set_rows(q) with the micro-batch's rows before "
                               "each forward pass")
        idx = self.spec.lookup(self._rows)
        hit = np.flatnonzero(idx >= 0)
        if hit.size == 0:
            return None
        import torch

        L, d = int(output.shape[1]), int(output.shape[2])
        delta = torch.stack([self.noise(int(idx[r]), L, d, output.dtype, output.device) for r in hit])
        self.rows_noised += int(hit.size)
        return output.index_add(0, torch.as_tensor(hit, device=output.device), delta)
