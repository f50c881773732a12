"""The held-out perplexity rows (the first epoch's last rows) are provably untrained: no run or checkpoint that
trains them is accepted."""

from __future__ import annotations

import numpy as np
import pytest

from pretrain_exp.data.corpus import fit_held_out, held_out_collision


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


@pytest.mark.parametrize("reserved, first_row, end_row, ckpt_order, want", [
    (0, 0, 50, True, 16), (0, 0, 90, True, 10), (4, 0, 90, False, 6), (0, 95, 98, True, 2),
    (0, 150, 160, True, 0), (0, 150, 160, False, 16), (12, 0, 90, False, 0),
])
def test_the_default_takes_the_rows_that_fit(reserved, first_row, end_row, ckpt_order, want):
    n = fit_held_out(16, reserved, first_row, end_row, 100, ckpt_order)
    assert n == want
    assert held_out_collision(n + reserved, first_row, end_row, 100, ckpt_order) is None or n == 0


def test_a_short_first_epoch_gets_fewer_held_out_rows_by_default_and_the_error_for_a_set_value(
        tmp_path, tiny_model_dir, caplog):
    """A small corpus (~36 rows of 128 tokens) and 3 steps of 8 rows: 16 rows at the end of the first epoch
    would be trained; by default the run takes the rows after its window (logged), a value the user sets is
    refused as before."""
    from pretrain_exp.app.experiment import Experiment
    from pretrain_exp.core.errors import ConfigError
    from tests.conftest import make_config

    docs = tmp_path / "docs"
    docs.mkdir()
    rng = np.random.default_rng(0)
    words = ["river", "lantern", "copper", "morning", "harbour", "quiet", "stone", "garden", "letter"]
    for i in range(3):
        (docs / f"doc{i}.txt").write_text(" ".join(rng.choice(words, size=1500)))
    args = ["model=tiny_llama", "training=tiny", "training.num_steps=3", "training.checkpoint_interval=3",
            "data=text", f"data.text={docs}", f"data.token_dir={tmp_path / 'tokens'}", "insertion=none", "eval=[]",
            "wandb=disabled"]
    with caplog.at_level("WARNING"):
        exp = Experiment(make_config(*args, run_dir=tmp_path / "auto"))
    rows = exp.order.rows_per_epoch
    assert 24 < rows < 24 + 16
    assert exp.ctx.held_out_rows == rows - 24 and exp.held_out.shape == (rows - 24, 128)
    assert exp.cfg.data.held_out_rows is None  # resolved in the prepared run, the validated config left as it was
    assert f"data.held_out_rows: {rows - 24} held-out row(s)" in caplog.text
    with pytest.raises(ConfigError, match=r"^data\.held_out_rows: the run trains rows \[0, 24\)"):
        Experiment(make_config(*args, "data.held_out_rows=16", run_dir=tmp_path / "set"))
