"""``insertion.dynamic.policy: spaced_repetition``: insert each target item that has no copy in the plan; once a
copy trained, re-insert it when its loss has risen by more than ``margin`` nats/token above its loss at the first
evaluation after its last insertion (forgetting-driven repetition; ``margin=0``: any rise)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np

from pretrain_exp.insertion.policies.base import DynamicConf, Losses, Policy, check_nonnegative


@dataclass
class SpacedRepetitionConf(DynamicConf):
    """Options of ``spaced_repetition``."""

    policy: str = "spaced_repetition"
    margin: float = 0.5  #: loss rise (nats/token) since the last insertion that re-inserts

    def validate(self, key: str) -> None:
        """``margin``: a finite number >= 0 (nats/token).

        :raises ConfigError: naming ``<key>.margin``.
        """
        check_nonnegative(f"{key}.margin", self.margin)


class SpacedRepetition(Policy):
    """Re-insert when the loss has risen by more than ``margin`` since the last insertion (module docstring)."""

    name = "spaced_repetition"
    schema = SpacedRepetitionConf
    item_columns = ("repetitions",)

    @classmethod
    def rule(cls, saved: dict) -> str:
        return f"when loss rose > {saved['margin']} nats/token since the last insertion"

    @classmethod
    def item_cells(cls, row: dict) -> List[str]:
        return [str(row["repetitions"])]

    def reference(self, item: int, history: Dict[int, Losses], since: int) -> Optional[float]:
        """The item's loss at the first evaluated step ``>= since`` (the step of its last copy)."""
        for s in sorted(history):
            if s >= since and item in history[s]:
                return history[s][item]
        return None

    def choose(self, targets, step, history, last_copy_step, planned):
        out = []
        for i in targets:
            i = int(i)
            if i not in history[step]:
                continue
            if not planned[i]:
                out.append(i)
                continue
            if last_copy_step[i] < 0:  # its first copy is planned later: wait until it was trained
                continue
            ref = self.reference(i, history, int(last_copy_step[i]))
            if ref is not None and history[step][i] - ref > self.conf.margin:
                out.append(i)
        return np.asarray(out, np.int64)

    def item_report(self, item, history, copy_steps, start):
        return {"repetitions": max(0, int(copy_steps.size) - 1)}
