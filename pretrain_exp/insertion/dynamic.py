"""Closed-loop (dynamic) insertion: after each segment's evals a policy decides what the next segment inserts.

``insertion.dynamic=<policy>`` (or a mapping ``{policy: <name>, <option>: ...}``; presets in
``conf/insertion/dynamic/``) names one of :data:`POLICIES`:

- ``until_memorized``: every segment, insert ``copies`` copies of each target item whose insertion loss is still at or
  above ``threshold`` (nats/token); an item is memorized at the first evaluated step where its loss falls below
  the threshold and is never inserted again. The report gives the dup count each item needed (copies trained up to
  that step).
- ``spaced_repetition``: insert each target item that has no copy in the plan; once a copy trained, re-insert it
  when its loss has risen by more than ``margin`` nats/token above its loss at the first evaluation after its last
  insertion (forgetting-driven repetition; ``margin=0``: any rise).

Targets are the items of ``experiments`` (default: every experiment). A decision at segment boundary ``a`` (the
start step of segment ``(a, b]``) reads the per-item losses of the ``insertion_loss`` eval ``task`` saved at step
``a`` (``evals/step<a>/<task>.json``; with ``eval.on_load`` the first segment is decided too), the plan so far
and the seed: nothing else, so a re-run derives the same additions. The copies are placed uniformly in the rows of
steps ``a+1 .. b`` with :func:`~pretrain_exp.insertion.placement.place_random` against an
:class:`~pretrain_exp.insertion.placement.Occupancy` holding every span already planned (same non-overlap and
row-boundary guarantees as static insertions), and :func:`extend_plan` appends them (dup indices continue each item's
count). Each decision is saved atomically as ``dynamic/step<a>.json`` before the segment trains;
:func:`load_additions` re-applies the saved ones on resume and refuses a file decided on another plan.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

from pretrain_exp.core.capabilities import EMBEDDING_NOISE, has
from pretrain_exp.core.errors import CheckpointError, ConfigError
from pretrain_exp.core.io import write_json
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.insertion.items import experiment_rng
from pretrain_exp.insertion.placement import Occupancy, place_random
from pretrain_exp.insertion.plan import Plan

#: losses of one evaluated step: item id -> insertion loss (nats/token)
Losses = Dict[int, float]


@dataclass
class DynamicConf:
    """Options of ``insertion.dynamic`` (module docstring); ``threshold`` is read by ``until_memorized``,
    ``margin`` by ``spaced_repetition``."""

    policy: str = "until_memorized"
    experiments: List[str] = field(default_factory=list)  #: target experiments (empty: all)
    task: Optional[str] = None  #: the insertion_loss eval task read (default: the first one of eval.tasks)
    copies: int = 1  #: copies of a chosen item per segment
    threshold: float = 1.0  #: until_memorized: loss (nats/token) below which an item counts as memorized
    margin: float = 0.5  #: spaced_repetition: loss rise (nats/token) since the last insertion that re-inserts
    max_per_batch: int = 0  #: at most this many dynamic copies per global batch (0: no limit)
    controls: int = 0  #: the last this many items of each target experiment are never inserted (dup-0 controls)


class Policy(ABC):
    """A decision rule: :meth:`choose` gives the items to insert in the next segment."""

    name = ""

    def __init__(self, conf: DynamicConf):
        self.conf = conf

    @abstractmethod
    def choose(self, targets: np.ndarray, step: int, history: Dict[int, Losses], last_copy_step: np.ndarray,
               planned: np.ndarray) -> np.ndarray:
        """Items (sorted ``int64`` ids) to insert ``conf.copies`` times in the segment starting at ``step``.

        :param targets: ``int64`` item ids the policy may insert.
        :param history: evaluated step (``<= step``) -> item losses; ``history[step]`` exists.
        :param last_copy_step: ``int64 (num_items,)``: global step of each item's latest copy trained by ``step``
            (``-1``: none).
        :param planned: ``bool (num_items,)``: the plan holds a copy of the item (trained by ``step`` or later).
        """

    def item_report(self, item: int, history: Dict[int, Losses], copy_steps: np.ndarray) -> dict:
        """Policy-specific columns of the per-item table (``copy_steps``: the item's copies' steps, sorted)."""
        return {}


class UntilMemorized(Policy):
    """Insert every segment until the loss falls below ``threshold`` (module docstring)."""

    name = "until_memorized"

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

    def item_report(self, item, history, copy_steps):
        at = self.memorized_at(item, history)
        return {"memorized_at_step": at,
                "dups_needed": None if at is None else int(np.sum(copy_steps <= at))}


class SpacedRepetition(Policy):
    """Re-insert when the loss has risen by more than ``margin`` since the last insertion (module docstring)."""

    name = "spaced_repetition"

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

    def item_report(self, item, history, copy_steps):
        return {"repetitions": max(0, int(copy_steps.size) - 1)}


#: policy name -> class
POLICIES: Dict[str, type] = {UntilMemorized.name: UntilMemorized, SpacedRepetition.name: SpacedRepetition}


def parse_dynamic(value: Any, experiments: Dict[str, Any], tasks: Dict[str, Any],
                  key: str = "insertion.dynamic") -> Optional[DynamicConf]:
    """Check ``insertion.dynamic`` (``None``/``""``/``"none"``: off; a policy name; or a mapping with ``policy``)
    and return it as a :class:`DynamicConf` (``task`` set to the first ``insertion_loss`` task when not given),
    or ``None`` when off. A :class:`DynamicConf` is returned as it is (parsed already). The run parses it once,
    in :func:`pretrain_exp.app.validate.derive`, and reads the result from ``insertion.dynamic``.

    :param experiments: the run's insertion experiments (name -> config); ``tasks``: ``eval.tasks``.
    :raises ConfigError: for an unknown policy or option, a bad value, an unknown target experiment, a noise
        experiment as target, or no ``insertion_loss`` eval to read.
    """
    if value is None or value == "" or value == "none":
        return None
    if isinstance(value, DynamicConf):
        return value
    if isinstance(value, str):
        value = {"policy": value}
    if not hasattr(value, "items"):
        raise ConfigError(key, f"a policy name or a mapping with 'policy', got {value!r}")
    value = dict(value.items())
    known = {f for f in DynamicConf.__dataclass_fields__}
    for k in value:
        if k not in known:
            raise ConfigError(f"{key}.{k}", f"unknown option; allowed: {sorted(known)}")
    conf = DynamicConf(**{k: (list(v) if k == "experiments" else v) for k, v in value.items()})
    if conf.policy not in POLICIES:
        raise ConfigError(f"{key}.policy", f"unknown policy {conf.policy!r}; allowed: {sorted(POLICIES)}")
    if isinstance(conf.copies, bool) or not isinstance(conf.copies, int) or conf.copies < 1:
        raise ConfigError(f"{key}.copies", f"must be an integer >= 1, got {conf.copies!r}")
    for name in ("max_per_batch", "controls"):
        v = getattr(conf, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ConfigError(f"{key}.{name}", f"must be an integer >= 0, got {v!r}")
    for name in ("threshold", "margin"):
        v = getattr(conf, name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v < 0:
            raise ConfigError(f"{key}.{name}", f"must be a finite number >= 0 (nats/token), got {v!r}")
    for i, name in enumerate(conf.experiments):
        if name not in experiments:
            raise ConfigError(f"{key}.experiments[{i}]", f"{name!r} is not an insertion experiment; allowed: "
                              f"{sorted(experiments)}")
    for name in conf.experiments or sorted(experiments):
        if has(experiments[name], EMBEDDING_NOISE):
            raise ConfigError(f"{key}.experiments", f"{name!r} inserts noise rows; dynamic insertion places "
                              "token items only (list the token experiments)")
    losses = [n for n, t in tasks.items() if getattr(t, "type", None) == "insertion_loss"]
    if conf.task is None:
        if not losses:
            raise ConfigError(f"{key}.task", "dynamic insertion reads the insertion_loss eval; add it to eval "
                              "(eval=[insertion_loss, ...])")
        conf.task = losses[0]
    elif conf.task not in losses:
        raise ConfigError(f"{key}.task", f"{conf.task!r} is not an insertion_loss eval task; allowed: {losses}")
    return conf


def make_policy(conf: DynamicConf) -> Policy:
    """The policy object of ``conf``."""
    return POLICIES[conf.policy](conf)


def target_items(plan, conf: DynamicConf) -> np.ndarray:
    """``int64`` ids of the items of the target experiments (all token items when none are listed), less each
    experiment's last ``conf.controls`` items."""
    names = conf.experiments or plan.experiments
    out = []
    for n in names:
        if n not in plan.experiments:
            continue
        ids = np.flatnonzero((plan.item_experiment == plan.experiments.index(n)) & (plan.item_noise_seed < 0))
        out.append(ids[:max(0, ids.size - conf.controls)])
    return np.sort(np.concatenate(out)).astype(np.int64) if out else np.empty(0, np.int64)


def copy_steps(plan) -> np.ndarray:
    """Global step of every span of ``plan`` (``int64 (num_spans,)``; step ``k`` trains rows ``[(k-1)B, kB)``)."""
    return plan.span_positions // plan.sequence_length // plan.global_batch_size + 1


def decide(plan, conf: DynamicConf, step: int, end_step: int, history: Dict[int, Losses], seed: int) -> dict:
    """The additions for segment ``(step, end_step]``: chosen items and their placed positions.

    :param plan: the plan so far (static plus earlier additions).
    :param history: evaluated step -> item losses, with ``history[step]``.
    :returns: the record saved as ``dynamic/step<step>.json``: ``decided_at``, ``segment``, ``policy``,
        ``plan_digest`` (of ``plan``), ``items`` (chosen ids), ``item_ids``/``positions`` (one per copy, by item),
        ``losses`` (the deciding losses of the targets).
    :raises InsertionError: if the segment's rows cannot hold the copies.
    """
    policy = make_policy(conf)
    targets = target_items(plan, conf)
    steps = copy_steps(plan)
    done = steps <= step
    last = np.full(plan.num_items, -1, np.int64)
    np.maximum.at(last, plan.span_item_ids[done].astype(np.int64), steps[done])
    planned = np.bincount(plan.span_item_ids.astype(np.int64), minlength=plan.num_items) > 0
    chosen = policy.choose(targets, step, history, last, planned)
    ids = np.repeat(chosen, conf.copies)
    L, B = plan.sequence_length, plan.global_batch_size
    lengths = np.diff(plan.token_offsets)[ids].astype(np.int64)
    occ = Occupancy()
    order = np.argsort(plan.span_positions, kind="stable")
    occ.add(plan.span_positions[order], (plan.span_positions + plan.span_lengths)[order])
    rows = (np.array([step * B], np.int64), np.array([end_step * B], np.int64))
    pos = place_random(lengths, rows, L, experiment_rng(seed, f"dynamic/step{step}"), occ,
                       f"insertion.dynamic ({conf.policy}, segment {step}->{end_step})", B, conf.max_per_batch)
    return {"decided_at": int(step), "segment": [int(step), int(end_step)], "policy": conf.policy,
            "plan_digest": plan.digest(), "items": chosen.tolist(), "item_ids": ids.tolist(),
            "positions": pos.tolist(),
            "losses": {str(int(i)): history[step][int(i)] for i in targets if int(i) in history[step]}}


def extend_plan(plan, item_ids: np.ndarray, positions: np.ndarray):
    """``plan`` plus token spans of existing items at ``positions`` (already placed without overlap); each copy's
    dup index continues its item's count (in the given order) and ``item_dup_count`` grows by the copies.

    :param item_ids: ``int64 (n,)`` item ids; ``positions``: ``int64 (n,)`` global token positions.
    :returns: a new :class:`~pretrain_exp.insertion.plan.Plan` (spans sorted by position).
    """
    item_ids = np.asarray(item_ids, np.int64)
    positions = np.asarray(positions, np.int64)
    counts = plan.item_dup_count.astype(np.int64).copy()
    dix = np.empty(item_ids.size, np.int64)
    for k, i in enumerate(item_ids):
        dix[k] = counts[i]
        counts[i] += 1
    pos = np.concatenate([plan.span_positions, positions])
    ids = np.concatenate([plan.span_item_ids.astype(np.int64), item_ids])
    dups = np.concatenate([plan.span_dup_index.astype(np.int64), dix])
    order = np.argsort(pos, kind="stable")
    return Plan(plan.sequence_length, plan.global_batch_size, plan.window, plan.experiments,
                token_offsets=plan.token_offsets, tokens=plan.tokens, item_experiment=plan.item_experiment,
                item_dup_count=counts.astype(np.int32), span_positions=pos[order],
                span_item_ids=ids[order].astype(np.int32), span_dup_index=dups[order].astype(np.int32),
                item_noise_seed=plan.item_noise_seed, noise_sigma=plan.noise_sigma)


def additions_path(run_dir: Path, step: int) -> Path:
    """``<run dir>/dynamic/step<step>.json``: the additions decided at ``step``
    (:meth:`RunDir.additions <pretrain_exp.core.rundir.RunDir.additions>`)."""
    return RunDir(run_dir).additions(step)


def save_additions(run_dir: Path, record: dict) -> Path:
    """Write a :func:`decide` record atomically (temp file + rename)."""
    return write_json(additions_path(run_dir, record["decided_at"]), record)


def apply_additions(plan, record: dict, path: Path | str = "dynamic record"):
    """:func:`extend_plan` with a saved record, after checking it was decided on ``plan``.

    :raises CheckpointError: if the record's ``plan_digest`` is not ``plan``'s (the run dir holds the additions of
        another config or plan), naming the file.
    """
    if record["plan_digest"] != plan.digest():
        raise CheckpointError(f"{path}: decided on another plan than this config's; use a new run dir "
                              "(hydra.run.dir=...) or restore the original config")
    return extend_plan(plan, np.asarray(record["item_ids"], np.int64), np.asarray(record["positions"], np.int64))


def load_additions(run_dir: Path) -> List[dict]:
    """The saved records of ``run_dir/dynamic``, by decision step.

    :raises CheckpointError: for an unreadable file.
    """
    out = []
    for _, p in RunDir(run_dir).additions_files():
        try:
            out.append(json.loads(p.read_text()))
        except (ValueError, OSError) as e:
            raise CheckpointError(f"{p}: not a readable dynamic-insertion record ({e})") from None
    return out


def read_losses(path: Path) -> Losses:
    """Item losses of a saved ``insertion_loss`` eval result (``evals/step<N>/<task>.json``)."""
    rec = json.loads(Path(path).read_text())
    return {int(r["item_id"]): float(r["loss"]) for r in rec["rows"]}


def report(plan, conf: DynamicConf, history: Dict[int, Losses], records: List[dict]) -> List[dict]:
    """One row per target item: ``item_id``, ``experiment``, ``static_dups``, ``dynamic_dups``,
    ``added_at`` (decision steps that inserted it), ``final_loss`` (at the last evaluated step) and the policy's
    columns (``until_memorized``: ``memorized_at_step``, ``dups_needed``; ``spaced_repetition``: ``repetitions``)."""
    policy = make_policy(conf)
    steps = copy_steps(plan)
    added: Dict[int, List[int]] = {}
    for r in records:
        for i in r["items"]:
            added.setdefault(int(i), []).append(int(r["decided_at"]))
    last = max(history) if history else None
    out = []
    for i in target_items(plan, conf):
        i = int(i)
        n_dyn = len(added.get(i, [])) * conf.copies
        row = {"item_id": i, "experiment": plan.experiments[plan.item_experiment[i]],
               "static_dups": int(plan.item_dup_count[i]) - n_dyn, "dynamic_dups": n_dyn,
               "added_at": added.get(i, []), "final_loss": history.get(last, {}).get(i) if last is not None else None}
        row.update(policy.item_report(i, history, np.sort(steps[plan.span_item_ids == i])))
        out.append(row)
    return out


def summary(conf: DynamicConf, rows: List[dict]) -> dict:
    """``results.json``'s ``dynamic`` entry: the options and the per-item rows."""
    return {**asdict(conf), "items": rows}
