"""The held-out perplexity rows (the first epoch's last rows) are provably untrained: no run or checkpoint that
trains them is accepted."""

from __future__ import annotations

import pytest

from pretrain_exp.app.experiment import held_out_collision


@pytest.mark.parametrize("first_row, end_row, ckpt_order, collides", [
    (0, 90, False, False), (0, 90, True, False),          # the run stays before rows [92, 100)
    (80, 93, False, True), (80, 93, True, True),          # the run's window reaches them
    (95, 98, True, True),                                 # the checkpoint itself trained past them
    (150, 160, True, True),                               # a later epoch: the checkpoint trained all of epoch 1
    (150, 160, False, False),                             # an HF model never trained this order: epoch 2 is not it
])
def test_held_out_rows_are_never_trained(first_row, end_row, ckpt_order, collides):
    why = held_out_collision(8, first_row, end_row, 100, ckpt_order)
    assert bool(why) == collides
    if collides:
        assert "[92, 100)" in why
    assert held_out_collision(0, first_row, end_row, 100, ckpt_order) is None
