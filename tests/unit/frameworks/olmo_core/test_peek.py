"""OlmoCoreFramework.peek_rows: the rows OLMo-core's own dataset and rank slicing hand each DP rank, with the plan
applied by the training callback's function, are the run's rows (TrainingRows) in OLMo's rank layout."""

from __future__ import annotations

import numpy as np
import pytest

from pretrain_exp.data.schedule import rows_for
from tests.conftest import make_config

RUN = ["framework=olmo_core", "training=tiny", "training.num_steps=4", "training.global_batch_size=4",
       "training.micro_batch_size=2", "training.checkpoint_interval=2", "training.num_threads=1",
       "data.held_out_rows=8", "insertion.experiments.fictional_bios.num_items=8",
       "insertion.experiments.fictional_bios.repetitions=[0,1,2,4]", "wandb=disabled", "eval=[]"]


@pytest.mark.parametrize("world", [1, 2])
def test_peek_rows_are_the_runs_rows_in_olmos_rank_layout(tmp_path, world):
    from pretrain_exp.app.experiment import Experiment

    exp = Experiment(make_config(*RUN, run_dir=tmp_path / "run"))  # verify_batches already ran through peek_rows
    fw, rows, B = exp.framework, exp.rows, exp.B
    assert exp.plan.num_insertions > 0
    changed = 0
    for k in range(1, 5):
        for r in range(world):
            q, tokens = fw.peek_rows(rows, k, r, world)
            np.testing.assert_array_equal(q, rows_for(k, r, world, B))
            np.testing.assert_array_equal(tokens, np.stack([rows.row(int(x)) for x in q]))
            changed += sum(not np.array_equal(t, exp.order.row_tokens(int(x))) for x, t in zip(q, tokens))
            only = q[1:2]
            q1, t1 = fw.peek_rows(rows, k, r, world, only=only)
            np.testing.assert_array_equal(q1, only)
            np.testing.assert_array_equal(t1[0], tokens[1])
    assert changed == len(np.unique(exp.plan.affected_rows()))
