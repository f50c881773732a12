"""The OLMo-core insertion callback, outside a Trainer: a fake trainer at step k, batches built as OLMo-core's
loader builds them (instance ids + tokens of the rank's rows), checked and written at every step; the metrics other
threads record, held until the training thread records them."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from pretrain_exp.core.errors import TrainingError
from pretrain_exp.data.order import DataOrder
from pretrain_exp.data.rows import TrainingRows
from pretrain_exp.data.schedule import rows_for
from pretrain_exp.data.token_files import TokenFiles, write_token_file
from pretrain_exp.frameworks.olmo_core.callbacks import HeldMetrics, Insertions, apply_insertions

L, B = 16, 4


class _Plan:
    """Stands in for :class:`~pretrain_exp.insertion.plan.Plan` through the two methods the callback uses: spans
    (values >= 60000) in rows 1, 5 and 6."""

    SPANS = {1: [(4, 7)], 5: [(15, 16)], 6: [(0, 2), (9, 11)]}

    def spans_in_row(self, q):
        return (0, len(self.SPANS.get(q, [])))

    def apply(self, q, row):
        for a, b in self.SPANS.get(q, []):
            row[a:b] = 60000 + q
        return len(self.SPANS.get(q, []))


@pytest.fixture
def rows(tmp_path):
    """Token files with values < 60000 (40 instances of L tokens) and the stand-in plan."""
    n = 40 * L + 3
    path = tmp_path / "corpus.npy"
    write_token_file(path, [list(range(n - 1))], np.dtype(np.uint32), n - 1)
    order = DataOrder(TokenFiles([path], np.uint32), L, B, seed=3)
    return TrainingRows(order, _Plan(), 0, 8 * B)


def olmo_batch(order, qs) -> dict:
    return {"input_ids": torch.as_tensor(np.stack([order.row_tokens(int(q)) for q in qs])),
            "index": torch.tensor([order.instance(int(q))[1] for q in qs])}


class _Feed:
    def __init__(self):
        self.calls = []

    def start(self, q):
        self.calls.append(("start", np.asarray(q).tolist()))

    def stop(self):
        self.calls.append(("stop",))


@pytest.mark.parametrize("world", [1, 2])
def test_every_step_gets_its_ranks_rows_with_the_plan_applied(rows, tmp_path, world):
    for r in range(world):
        log, feed = tmp_path / f"rank{r}-of-{world}.jsonl", _Feed()
        cb = Insertions(rows, r, world, rows_log=log, noise_feed=feed)
        cb.trainer = SimpleNamespace(global_step=0)
        for k in (1, 2, 3):
            cb.trainer.global_step = k
            qs = rows_for(k, r, world, B)
            batch = olmo_batch(rows.order, qs)
            cb.pre_step(batch)
            cb.post_train_batch()
            np.testing.assert_array_equal(batch["input_ids"].numpy(), np.stack([rows.row(int(q)) for q in qs]))
            assert feed.calls[-2:] == [("start", qs.tolist()), ("stop",)]
        recs = [json.loads(line) for line in log.read_text().splitlines()]
        assert [(x["step"], x["rank"], x["rows"]) for x in recs] == [
            (k, r, rows_for(k, r, world, B).tolist()) for k in (1, 2, 3)]


def test_a_batch_with_other_instances_is_refused_at_any_step(rows):
    cb = Insertions(rows, 0, 1)
    cb.trainer = SimpleNamespace(global_step=1)
    cb.pre_step(olmo_batch(rows.order, rows_for(1, 0, 1, B)))
    cb.trainer.global_step = 3
    wrong = olmo_batch(rows.order, rows_for(4, 0, 1, B))  # another step's rows
    with pytest.raises(TrainingError, match="step 3, rank 0: OLMo-core's batch row 0 is not training-order row 8"):
        cb.pre_step(wrong)


def test_tokens_are_checked_at_the_first_step_of_a_fit(rows):
    cb = Insertions(rows, 0, 1)
    cb.trainer = SimpleNamespace(global_step=2)
    batch = olmo_batch(rows.order, rows_for(2, 0, 1, B))
    batch["input_ids"][1, 3] += 1  # right instance ids, other tokens (another dtype or other files)
    with pytest.raises(TrainingError, match="batch row 1 is not training-order row 5"):
        cb.pre_step(batch)


def test_apply_insertions_copies_only_rows_with_spans(rows):
    qs = rows_for(2, 0, 1, B)
    batch = olmo_batch(rows.order, qs)
    assert apply_insertions(batch, qs, rows.order, rows.plan) == 2  # rows 5 and 6
    assert apply_insertions(olmo_batch(rows.order, rows_for(3, 0, 1, B)), rows_for(3, 0, 1, B), rows.order,
                            rows.plan) == 0


def test_metrics_another_thread_records_wait_for_the_training_thread():
    recorded = []
    trainer = SimpleNamespace(global_step=2)
    trainer.record_metric = lambda name, value, reduce_type=None: recorded.append((trainer.global_step, name, value))
    held = HeldMetrics(trainer)
    assert trainer.record_metric is held
    trainer.record_metric("train/CE loss", 3.0)
    other = threading.Thread(target=trainer.record_metric, args=("checkpoint/save_async_duration_s", 1.5),
                             kwargs={"reduce_type": "max"})
    other.start()
    other.join()
    assert recorded == [(2, "train/CE loss", 3.0)]  # the save finished at step 2 on this rank: held
    trainer.global_step = 4
    assert held.release() == 1 and held.release() == 0
    assert recorded == [(2, "train/CE loss", 3.0), (4, "checkpoint/save_async_duration_s", 1.5)]
