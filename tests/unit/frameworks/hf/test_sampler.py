"""What HF Trainer + accelerate + our sampler give each rank: OLMo's rank layout (``rows_for``), no torchrun needed.

``Trainer.get_train_dataloader`` wraps ``DataLoader(dataset, batch_size=micro, sampler=<ours>)`` with
``accelerator.prepare``, i.e. accelerate's ``prepare_data_loader`` (``split_batches=False``, ``even_batches=True``,
the Trainer's defaults); here it is called with an explicit ``num_processes`` / ``process_index`` for each rank.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from accelerate.data_loader import prepare_data_loader

from pretrain_exp.core.errors import ConfigError
from pretrain_exp.data.schedule import rows_for
from pretrain_exp.frameworks.hf.sampler import RankLayoutSampler


class _Q(torch.utils.data.Dataset):
    """Item ``i`` is training-order row ``first_row + i`` (as in TrainingRows)."""

    def __init__(self, first_row: int, n: int):
        self.first_row, self.n = first_row, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor(self.first_row + i)


def rank_batches(sampler: RankLayoutSampler, dataset, micro: int, world: int, rank: int) -> list:
    dl = torch.utils.data.DataLoader(dataset, batch_size=micro, sampler=sampler)
    sharded = prepare_data_loader(dl, num_processes=world, process_index=rank, split_batches=False,
                                  even_batches=True, put_on_device=False)
    return [b.numpy() for b in sharded]


@pytest.mark.parametrize("world, micro, B, start", [(1, 2, 8, 0), (2, 1, 8, 0), (2, 2, 8, 3), (4, 1, 8, 1),
                                                    (2, 4, 8, 0), (2, 3, 12, 2)])
def test_rank_r_trains_rows_for_k_r_w_b_at_every_step(world, micro, B, start):
    steps = 4
    sampler = RankLayoutSampler(start, steps, B, micro, world)
    dataset = _Q(start * B, steps * B)
    G = B // (micro * world)  # micro-batches per rank and optimizer step (gradient accumulation)
    for r in range(world):
        batches = rank_batches(sampler, dataset, micro, world, r)
        assert len(batches) == steps * G and all(b.shape == (micro,) for b in batches)
        for j in range(steps):
            k = start + 1 + j
            got = np.concatenate(batches[j * G:(j + 1) * G])
            np.testing.assert_array_equal(got, rows_for(k, r, world, B))
            np.testing.assert_array_equal(sampler.rank_indices(k, r) + start * B, got)


def test_one_process_is_the_sequential_order():
    sampler = RankLayoutSampler(2, 3, 8, 2, 1)
    assert list(sampler) == list(range(24)) and len(sampler) == 24


def test_batch_not_a_multiple_of_micro_times_world_is_a_config_error():
    with pytest.raises(ConfigError, match="training.global_batch_size"):
        RankLayoutSampler(0, 1, 8, 3, 1)
