"""The row schedule is OLMo's rank layout: rank r of W trains rows r, r+W, ... of each global batch."""

from __future__ import annotations

import numpy as np
import pytest

from pretrain_exp.core.errors import ConfigError
from pretrain_exp.data.schedule import rows_for, step_and_rank


def test_rank_r_of_w_gets_every_wth_row_of_the_global_batch():
    np.testing.assert_array_equal(rows_for(1, 0, 1, 4), [0, 1, 2, 3])
    np.testing.assert_array_equal(rows_for(3, 0, 2, 8), [16, 18, 20, 22])
    np.testing.assert_array_equal(rows_for(3, 1, 2, 8), [17, 19, 21, 23])
    assert rows_for(2, 1, 4, 8).dtype == np.int64


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_the_ranks_of_a_step_cover_its_global_batch_once(world):
    B = 8
    for k in range(1, 5):
        rows = np.concatenate([rows_for(k, r, world, B) for r in range(world)])
        np.testing.assert_array_equal(np.sort(rows), np.arange((k - 1) * B, k * B))
        for r in range(world):
            q = rows_for(k, r, world, B)
            step, rank, i = step_and_rank(q, world, B)
            assert (step == k).all() and (rank == r).all()
            np.testing.assert_array_equal(i, np.arange(B // world))


@pytest.mark.parametrize("args", [(0, 0, 1, 4), (1, 2, 2, 4), (1, 0, 3, 4), (1, -1, 2, 4), (1, 0, 0, 4)])
def test_bad_step_rank_or_world_is_one_config_error(args):
    with pytest.raises(ConfigError, match="training.global_batch_size"):
        rows_for(*args)
