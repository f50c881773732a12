"""``insertion.dynamic.policy: until_memorized``: every segment, insert ``copies`` copies of each target item whose
insertion loss is still at or above ``threshold`` (nats/token); an item is never inserted again once its loss fell
below the threshold at an evaluated step (``memorized_at_step``, a first passage). The report confirms the crossing
at the next eval (``confirmed``) and gives the dup count a confirmed item needed (copies trained up to the
crossing)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np

from pretrain_exp.insertion.policies.base import DynamicConf, Losses, Policy, check_nonnegative


@dataclass
class UntilMemorizedConf(DynamicConf):
    """Options of ``until_memorized``."""

    policy: str = "until_memorized"
    threshold: float = 1.0  #: loss (nats/token) below which an item counts as memorized

    def validate(self, key: str) -> None:
        """``threshold``: a finite number >= 0 (nats/token).

        :raises ConfigError: naming ``<key>.threshold``.
        """
        check_nonnegative(f"{key}.threshold", self.threshold)


class UntilMemorized(Policy):
    """Insert every segment until the loss falls below ``threshold`` (module docstring)."""

    name = "until_memorized"
    schema = UntilMemorizedConf
    item_columns = ("memorized at step", "confirmed", "dups needed")
    arm_columns = ("memorized", "fell back")
    caveat = ("'memorized at step' is a first passage below a noisy threshold (early, and regresses to the mean): "
              "'dups needed' counts only items still below at the next eval")

    @classmethod
    def rule(cls, saved: dict) -> str:
        return f"until loss < {saved['threshold']} nats/token"

    @classmethod
    def item_cells(cls, row: dict) -> List[str]:
        """The step the item fell below the threshold, whether the next eval confirmed it (``n/a`` in a result saved
        before confirmation was reported) and the dup count a confirmed item needed."""
        at, ok = row["memorized_at_step"], row.get("confirmed")
        return ["-" if at is None else str(at),
                "-" if at is None else "n/a" if "confirmed" not in row
                else {True: "yes", False: "no"}.get(ok, "no next eval"),
                str(row["dups_needed"]) if row["dups_needed"] is not None else "not reached" if at is None
                else "not confirmed" if ok is False else "unconfirmed"]

    @classmethod
    def arm_cells(cls, row: dict) -> List[str]:
        return [f"{row.get('confirmed')}/{row['n_items']}", str(row.get("fell_back"))]

    @classmethod
    def arms_note(cls, saved: dict, arms: List[dict]) -> Optional[str]:
        open_ = sum(r.get("unconfirmed") or 0 for r in arms if r["arm"] in ("targets", "controls"))
        return (f"memorized: loss < {saved['threshold']} at two consecutive evals; fell back: below at one eval, at "
                "or above at the next" + (f"; {open_} item(s) crossed at the last eval, unconfirmed" if open_ else ""))

    def memorized_at(self, item: int, history: Dict[int, Losses], upto: Optional[int] = None) -> Optional[int]:
        """The first evaluated step (``<= upto``) where the item's loss is below the threshold, or ``None``."""
        for s in sorted(history):
            if upto is not None and s > upto:
                break
            if item in history[s] and history[s][item] < self.conf.threshold:
                return s
        return None

    def choose(self, targets, step, history, last_copy_step, planned):
        return np.asarray([i for i in targets if self.memorized_at(int(i), history, step) is None], np.int64)

    def confirmed(self, item: int, history: Dict[int, Losses], at: Optional[int]) -> Optional[bool]:
        """Whether the item's loss is still below the threshold at the evaluated step after ``at`` (its first
        passage, :meth:`memorized_at`): ``True``/``False``, ``None`` when ``at`` is ``None`` or the last evaluated
        step with its loss (no second eval)."""
        if at is None:
            return None
        later = [s for s in sorted(history) if s > at and item in history[s]]
        return None if not later else bool(history[later[0]][item] < self.conf.threshold)

    def item_report(self, item, history, copy_steps, start):
        """``memorized_at_step`` (the first evaluated step below the threshold: the policy's stopping rule),
        ``confirmed`` (:meth:`confirmed`), ``dups_needed`` (copies trained by ``memorized_at_step``, static ones
        included; only for a confirmed item, else ``None``), ``below_threshold_at_start`` (below the threshold at
        ``start``: the policy never inserts it) and ``below_threshold_at_end`` (at the last evaluated step)."""
        at = self.memorized_at(item, history)
        ok = self.confirmed(item, history, at)
        last = max((s for s in history if item in history[s]), default=None)
        return {"memorized_at_step": at, "confirmed": ok,
                "dups_needed": int(np.sum(copy_steps <= at)) if ok else None,
                "below_threshold_at_start": (start is not None and item in history.get(start, {})
                                             and history[start][item] < self.conf.threshold),
                "below_threshold_at_end": None if last is None else bool(history[last][item] < self.conf.threshold)}

    def target_groups(self, targets):
        """``below threshold at start``: targets the policy never inserts (already below at the first decision)."""
        return [("below threshold at start", [r for r in targets if r["below_threshold_at_start"]])]

    def arm_counts(self, rows):
        """The arm's counts of items that ``crossed`` the threshold at some eval, were ``confirmed`` (still below at
        the next eval: memorized), ``fell_back`` (back at or above at the next eval), are ``unconfirmed`` (crossed
        at the last eval) and ``below_at_end``."""
        return _memorization(rows)


def _memorization(group: List[dict]) -> dict:
    """``until_memorized`` counts of an arm's item rows (:meth:`UntilMemorized.item_report`)."""
    return {"crossed": sum(r["memorized_at_step"] is not None for r in group),
            "confirmed": sum(r["confirmed"] is True for r in group),
            "fell_back": sum(r["confirmed"] is False for r in group),
            "unconfirmed": sum(r["memorized_at_step"] is not None and r["confirmed"] is None for r in group),
            "below_at_end": sum(bool(r["below_threshold_at_end"]) for r in group)}
