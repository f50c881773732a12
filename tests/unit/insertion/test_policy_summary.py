"""The summary of a saved closed-loop result reads its policy's columns and words from the policy registry: a newly
registered policy prints its own columns (no branch on a policy's name in the report), and the two built-in ones
print what they printed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

import numpy as np
from rich.console import Console

from pretrain_exp.insertion import dynamic
from pretrain_exp.insertion.policies import POLICIES, get_policy
from pretrain_exp.insertion.policies.base import DynamicConf, Policy
from pretrain_exp.report.summary import print_dynamic_table
from tests.unit.insertion.test_dynamic_arms import _plan, _Task, _texts


@dataclass
class EverySegmentConf(DynamicConf):
    """Options of ``every_segment`` (none of its own)."""

    policy: str = "every_segment"


class EverySegment(Policy):
    """Insert every target item in every segment; its per-item column counts the copies it gave."""

    name = "every_segment"
    schema = EverySegmentConf
    item_columns = ("copies given",)

    def choose(self, targets, step, history, last_copy_step, planned):
        return np.asarray(targets, np.int64)

    def item_report(self, item, history, copy_steps, start):
        return {"copies_given": int(len(copy_steps))}

    @classmethod
    def rule(cls, saved: dict) -> str:
        return "in every segment"

    @classmethod
    def item_cells(cls, row: dict) -> List[str]:
        return [str(row["copies_given"])]


def _saved(policy: str, **options) -> dict:
    """``results.json``'s ``dynamic`` entry of a real closed loop (9 static dup-0 items, 3 controls, decisions at
    steps 0 and 4, evals at 0, 4 and 8) under ``policy``."""
    plan = _plan([0] * 9)
    conf = dynamic.parse_dynamic({"policy": policy, "controls": 3, **options}, {"a": _texts()}, {"loss": _Task()})
    arms = dynamic.assign_arms(plan, conf, seed=0)
    hist = {0: {i: 3.0 + 0.1 * i for i in range(9)}}
    recs = []
    for a, b in ((0, 4), (4, 8)):
        recs.append(dynamic.decide(plan, conf, a, b, hist, 0, arms))
        plan = dynamic.apply_additions(plan, recs[-1])
        hist[b] = {i: 2.0 - 0.1 * b / 4 + 0.01 * i for i in range(9)}
    return dynamic.summary(plan, conf, hist, dynamic.report(plan, conf, hist, recs, arms))


def _printed(saved: dict) -> str:
    console = Console(record=True, width=250)
    print_dynamic_table(saved, console)
    return " ".join(console.export_text().split())  # a title may wrap


def test_a_registered_policy_prints_its_own_columns(monkeypatch):
    monkeypatch.setitem(POLICIES, "every_segment", f"{__name__}:EverySegment")
    saved = _saved("every_segment")
    assert saved["policy"] == "every_segment" and "margin" not in saved and "threshold" not in saved
    text = _printed(saved)
    assert "(every_segment: 1 copy/segment in every segment)" in text
    assert "copies given" in text and "repetitions" not in text and "memorized at step" not in text
    targets = [r for r in saved["items"] if r["arm"] == "target"]
    assert targets and all(r["copies_given"] == 2 for r in targets)  # two decisions, one copy each


def test_the_built_in_policies_print_their_columns_and_caveat():
    memo = _printed(_saved("until_memorized", threshold=1.85))
    assert "until loss < 1.85 nats/token" in memo
    assert all(c in memo for c in ("memorized at step", "confirmed", "dups needed", "fell back"))
    assert "memorized: loss < 1.85 at two consecutive evals" in memo
    assert "'memorized at step' is a first passage" in memo
    spaced = _printed(_saved("spaced_repetition", margin=0.25))
    assert "when loss rose > 0.25 nats/token since the last insertion" in spaced and "repetitions" in spaced
    assert "memorized" not in spaced and "first passage" not in spaced
    assert get_policy("spaced_repetition").arm_columns == () and get_policy("until_memorized").caveat
