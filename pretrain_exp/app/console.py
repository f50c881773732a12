"""What a training segment prints: one line per logged step, and the segment's progress bar.

Every framework hands its training scalars to the run's log function (``log_fn(metrics, step)``, metric names as in
``metrics.jsonl``: ``train/loss``, ``train/grad_norm``, ``train/learning_rate``, ``train/tokens_per_s``, ...).
:class:`StepLines` wraps that function for a segment: it forwards every call, and for each call that carries the
training loss logs one line (:func:`step_line`, logger ``pretrain_exp.app.console``)::

    step 5/12: loss 10.35, grad norm 0.807, lr 4.14e-03, 1,173 tokens/s

and moves the segment's progress bar (:func:`~pretrain_exp.core.logs.phase_progress`). The engines' own console
output (the HF Trainer's progress bar and loss dicts, OLMo-core's multi-line metric blocks) is off or goes to the run
dir's log file (:mod:`pretrain_exp.core.logs`).
"""

from __future__ import annotations

import contextlib
import logging
import math
from typing import Callable, Dict, Iterator

from pretrain_exp.core.logs import phase_progress

log = logging.getLogger(__name__)

LogFn = Callable[[Dict[str, float], int], None]


def step_line(step: int, last_step: int, metrics: Dict[str, float]) -> str:
    """The console line of global step ``step`` of a run ending at ``last_step``: the loss, and the grad norm,
    learning rate, tokens/s (per device) and MFU (%) where ``metrics`` holds them."""
    parts = [f"step {step}/{last_step}: loss {metrics['train/loss']:.4g}"]
    for key, fmt in (("train/grad_norm", "grad norm {:.3g}"), ("train/learning_rate", "lr {:.2e}"),
                     ("train/tokens_per_s", "{:,.0f} tokens/s"), ("train/mfu", "MFU {:.1f}%")):
        value = metrics.get(key)
        if value is not None and math.isfinite(value):
            parts.append(fmt.format(value))
    return ", ".join(parts)


class StepLines:
    """A segment's log function (module docstring): forwards ``(metrics, step)`` to ``log_fn``; a call carrying
    ``train/loss`` also logs :func:`step_line` and calls ``progress(step - first_step)``.

    :param first_step: the segment's start (global step of its checkpoint).
    :param last_step: the run's last global step (the ``N`` of ``step k/N``).
    """

    def __init__(self, log_fn: LogFn, first_step: int, last_step: int,
                 progress: Callable[[int], None] = lambda done: None):
        self.log_fn, self.first_step, self.last_step, self.progress = log_fn, int(first_step), int(last_step), progress

    def __call__(self, metrics: Dict[str, float], step: int) -> None:
        self.log_fn(metrics, step)
        if "train/loss" in metrics:
            log.info(step_line(step, self.last_step, metrics))
            self.progress(step - self.first_step)


@contextlib.contextmanager
def segment_lines(log_fn: LogFn, first_step: int, until_step: int, last_step: int) -> Iterator[StepLines]:
    """:class:`StepLines` for training global steps ``first_step+1 .. until_step`` of a run ending at
    ``last_step``, with one progress bar (``training steps a -> b``) while the block runs."""
    with phase_progress(f"training steps {first_step} -> {until_step}", until_step - first_step) as progress:
        yield StepLines(log_fn, first_step, last_step, progress)
