"""One console line per logged training step, forwarded metrics untouched, the segment's bar moved."""

from __future__ import annotations

import logging

from pretrain_exp.app.console import StepLines, step_line


def test_step_line_names_what_the_step_logged():
    m = {"train/loss": 10.3512, "train/grad_norm": 0.8069, "train/learning_rate": 4.137e-3,
         "train/tokens_per_s": 1173.4, "train/mfu": 41.26}
    assert step_line(5, 12, m) == "step 5/12: loss 10.35, grad norm 0.807, lr 4.14e-03, 1,173 tokens/s, MFU 41.3%"
    assert step_line(1, 12, {"train/loss": 11.52, "train/grad_norm": float("nan")}) == "step 1/12: loss 11.52"


def test_step_lines_forward_every_call_and_print_one_line_per_trained_step(caplog):
    got, done = [], []
    fn = StepLines(lambda m, s: got.append((s, m)), first_step=4, last_step=12, progress=done.append)
    caplog.set_level(logging.INFO, logger="pretrain_exp.app.console")
    fn({"train/loss": 10.35, "train/learning_rate": 4.137e-3}, 5)
    fn({"train/tokens_per_s": 900.0, "checkpoint/hold_s": 0.05}, 5)  # OLMo-core's second call for a step
    fn({"train/loss": 10.19}, 6)
    assert [s for s, _ in got] == [5, 5, 6] and got[1][1] == {"train/tokens_per_s": 900.0, "checkpoint/hold_s": 0.05}
    assert [r.getMessage() for r in caplog.records] == ["step 5/12: loss 10.35, lr 4.14e-03", "step 6/12: loss 10.19"]
    assert done == [1, 2]
