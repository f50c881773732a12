"""Closed-loop (dynamic) insertion: after each segment's evals a policy decides what the next segment inserts.

``insertion.dynamic=<policy>`` (or a mapping ``{policy: <name>, <option>: ...}``; presets in
``conf/insertion/dynamic/``) names a policy registered in :data:`~pretrain_exp.insertion.policies.POLICIES`, one
module each with its options' schema:

- ``until_memorized`` (:mod:`~pretrain_exp.insertion.policies.until_memorized`): every segment, insert ``copies``
  copies of each target item whose insertion loss is still at or above ``threshold`` (nats/token), until it fell
  below the threshold at an evaluated step; the report confirms the crossing at the next eval.
- ``spaced_repetition`` (:mod:`~pretrain_exp.insertion.policies.spaced_repetition`): insert each target item that
  has no copy in the plan; once a copy trained, re-insert it when its loss has risen by more than ``margin``
  nats/token above its loss at the first evaluation after its last insertion.

Arms (:func:`assign_arms`). The items of ``experiments`` (default: every experiment) are split at random into
*controls* and *targets* before the first decision: each experiment's controls are a seeded uniform sample of its
static dup-0 items (``experiment_rng(insertion.seed, "dynamic/controls/<experiment>")``; ``controls`` of them, by
default half, rounded up) and are never inserted; the policy decides the copies of every other item (a target).
Since the static dup counts are themselves dealt by a seeded permutation, the controls are a uniform random sample
of the experiment's items, and targets vs controls is a randomized two-arm comparison. The dup count of a target
is chosen by the policy from its own losses, so groups of realized dup counts are *not* randomized: the report
(:func:`summary`) compares the arms by intent to treat (every target against every control, whatever copies the
policy gave it; :func:`pretrain_exp.core.stats.effect`) and flags the per-dup groups as outcome-selected.

A decision at segment boundary ``a`` (the start step of segment ``(a, b]``) reads the per-item losses of the
``insertion_loss`` eval ``task`` saved at step ``a`` (``evals/step<a>/<task>.json``; with ``eval.on_load`` the
first segment is decided too), the plan so far and the seed: nothing else, so a re-run derives the same additions.
The copies are placed uniformly in the rows of steps ``a+1 .. b`` with
:func:`~pretrain_exp.insertion.placement.place_random` against an
:class:`~pretrain_exp.insertion.placement.Occupancy` holding every span already planned (same non-overlap and
row-boundary guarantees as static insertions), and :func:`extend_plan` appends them (dup indices continue each item's
count). Each decision is saved atomically as ``dynamic/step<a>.json`` before the segment trains;
:func:`load_additions` re-applies the saved ones on resume and refuses a file decided on another plan.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

from pretrain_exp.core import stats
from pretrain_exp.core.capabilities import EMBEDDING_NOISE, has
from pretrain_exp.core.errors import CheckpointError, ConfigError
from pretrain_exp.core.io import write_json
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.insertion.items import experiment_rng
from pretrain_exp.insertion.placement import Occupancy, place_random
from pretrain_exp.insertion.placements import KINDS, get_kind
from pretrain_exp.insertion.plan import Plan
from pretrain_exp.insertion.policies import POLICIES, get_policy, schema
from pretrain_exp.insertion.policies.base import DynamicConf, Losses, Policy
from pretrain_exp.insertion.schema import parse_repetitions


def parse_dynamic(value: Any, experiments: Dict[str, Any], tasks: Dict[str, Any],
                  key: str = "insertion.dynamic") -> Optional[DynamicConf]:
    """Check ``insertion.dynamic`` (``None``/``""``/``"none"``: off; a policy name; or a mapping with ``policy``)
    and return it as a :class:`DynamicConf` (``task`` set to the first ``insertion_loss`` task when not given),
    or ``None`` when off. A :class:`DynamicConf` is returned as it is (parsed already). The run parses it once,
    in :func:`pretrain_exp.app.validate.derive`, and reads the result from ``insertion.dynamic``.

    :param experiments: the run's insertion experiments (name -> config); ``tasks``: ``eval.tasks``.
    :raises ConfigError: for an unknown policy or option, a bad value, an unknown target experiment, a noise
        experiment as target, no ``insertion_loss`` eval to read, ``controls: 0`` without ``allow_no_controls``,
        or a target experiment whose ``repetitions`` give every item a static copy (no dup-0 item to draw controls
        from; the item counts themselves are checked on the plan, :func:`assign_arms`).
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
    policy = value.get("policy", DynamicConf.policy)
    cls = get_policy(policy, f"{key}.policy").schema
    _check_options(key, policy, cls, value)
    conf = cls(**{k: (list(v) if k == "experiments" else v) for k, v in value.items()})
    if isinstance(conf.copies, bool) or not isinstance(conf.copies, int) or conf.copies < 1:
        raise ConfigError(f"{key}.copies", f"must be an integer >= 1, got {conf.copies!r}")
    for name in ("max_per_batch", "controls"):
        v = getattr(conf, name)
        if name == "controls" and v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ConfigError(f"{key}.{name}", f"must be an integer >= 0, got {v!r}")
    if not isinstance(conf.allow_no_controls, bool):
        raise ConfigError(f"{key}.allow_no_controls", f"must be true or false, got {conf.allow_no_controls!r}")
    if conf.controls == 0 and not conf.allow_no_controls:
        raise ConfigError(f"{key}.controls", "must be >= 1 (or null: half of each target experiment's static dup-0 "
                          "items): without randomized dup-0 controls a closed loop has only dup counts chosen from "
                          f"the items' own losses; set {key}.allow_no_controls=true to run without controls on "
                          "purpose")
    conf.validate(key)
    for i, name in enumerate(conf.experiments):
        if name not in experiments:
            raise ConfigError(f"{key}.experiments[{i}]", f"{name!r} is not an insertion experiment; allowed: "
                              f"{sorted(experiments)}")
    for name in conf.experiments or sorted(experiments):
        if has(experiments[name], EMBEDDING_NOISE):
            raise ConfigError(f"{key}.experiments", f"{name!r} inserts noise rows; dynamic insertion places "
                              "token items only (list the token experiments)")
        wanted = conf.controls != 0 and not (conf.allow_no_controls and conf.controls is None)
        if wanted and not _may_have_dup0(experiments[name]):
            raise ConfigError(f"{key}.controls", f"controls are drawn from an experiment's static dup-0 items, but "
                              f"insertion.experiments.{name}.repetitions ({experiments[name].repetitions}) gives "
                              f"every item of {name!r} a static copy; add 0 to its repetitions (e.g. [0, 1]) or set "
                              f"{key}.allow_no_controls=true (with {key}.controls=null or 0)")
    losses = [n for n, t in tasks.items() if getattr(t, "type", None) == "insertion_loss"]
    if conf.task is None:
        if not losses:
            raise ConfigError(f"{key}.task", "dynamic insertion reads the insertion_loss eval; add it to eval "
                              "(eval=[insertion_loss, ...])")
        conf.task = losses[0]
    elif conf.task not in losses:
        raise ConfigError(f"{key}.task", f"{conf.task!r} is not an insertion_loss eval task; allowed: {losses}")
    return conf


def _check_options(key: str, policy: str, cls: type, value: Dict[str, Any]) -> None:
    """Refuse an option that the schema ``cls`` of ``policy`` lacks: another policy's (naming it) or none's.

    :raises ConfigError: naming ``<key>.<option>``.
    """
    own = {f.name for f in dataclasses.fields(cls)}
    for k in value:
        if k in own:
            continue
        for other in sorted(POLICIES):
            if other != policy and k in {f.name for f in dataclasses.fields(schema(other))}:
                raise ConfigError(f"{key}.{k}", f"only for policy={other}, not {policy}")
        raise ConfigError(f"{key}.{k}", f"unknown option; allowed: {sorted(own)}")


def own_options(value: Any) -> Any:
    """A saved ``insertion.dynamic`` mapping without the options its policy does not take: a config saved before
    each policy had its own schema holds every policy's options (``threshold`` and ``margin``); anything else is
    returned as it is."""
    if not isinstance(value, dict) or value.get("policy", DynamicConf.policy) not in POLICIES:
        return value
    own = {f.name for f in dataclasses.fields(schema(value.get("policy", DynamicConf.policy)))}
    others = {f.name for p in POLICIES for f in dataclasses.fields(schema(p))}
    return {k: v for k, v in value.items() if k in own or k not in others}


def _may_have_dup0(exp) -> bool:
    """``False`` when the experiment's config alone shows that every item gets a static copy (``repetitions`` a
    list without 0, or a number >= 1, random or range placement); ``True`` otherwise (or unknown)."""
    placement = getattr(exp, "placement", None)
    reps = getattr(exp, "repetitions", None)
    kind = getattr(placement, "kind", None)
    if reps is None or kind in KINDS and get_kind(kind).from_items:
        return True
    try:
        reps = parse_repetitions("repetitions", reps)
    except ConfigError:
        return True  # the experiment's own validation names it
    return 0 in reps if isinstance(reps, list) else reps < 1


def make_policy(conf: DynamicConf) -> Policy:
    """The policy object of ``conf``."""
    return get_policy(conf.policy)(conf)


@dataclass(frozen=True)
class Arms:
    """The randomized arms of a closed loop (:func:`assign_arms`): ``targets`` (the policy decides their copies)
    and ``controls`` (never inserted; static dup 0), each a sorted ``int64`` array of item ids."""

    targets: np.ndarray
    controls: np.ndarray


def assign_arms(static, conf: DynamicConf, seed: int) -> Arms:
    """Split the items of the target experiments (all token experiments when none are listed) into targets and
    controls. An experiment's controls are a uniform sample without replacement of its token items with no copy in
    ``static`` (static dup 0), drawn with ``experiment_rng(seed, "dynamic/controls/<experiment>")``:
    ``conf.controls`` of them, or ``ceil(n0 / 2)`` of its ``n0`` static dup-0 items when ``None``. The static dup
    counts are dealt by a seeded permutation, so the controls are a uniform random sample of all of the
    experiment's items, and a randomization test of targets vs controls is valid by design (Fisher 1935).

    :param static: the static plan (before any dynamic decision; its dup counts define the pool).
    :param seed: ``insertion.seed``.
    :raises ConfigError: (``insertion.dynamic.controls``) when an experiment has fewer static dup-0 items than
        ``controls``, or none at all and ``allow_no_controls`` is off.
    """
    names = conf.experiments or static.experiments
    targets, controls = [], []
    for n in names:
        if n not in static.experiments:
            continue
        ids = np.flatnonzero((static.item_experiment == static.experiments.index(n)) & (static.item_noise_seed < 0))
        if not ids.size:
            continue
        pool = ids[static.item_dup_count[ids] == 0]
        k = math.ceil(pool.size / 2) if conf.controls is None else conf.controls
        if k > pool.size or (k == 0 and not conf.allow_no_controls):
            raise ConfigError("insertion.dynamic.controls",
                              f"{k} control(s) asked for {n!r}, which has {pool.size} item(s) without a static copy "
                              f"(static dup 0) out of {ids.size}; controls are drawn from those: lower "
                              f"insertion.dynamic.controls, give more items dup 0 (insertion.experiments.{n}."
                              "repetitions), or set insertion.dynamic.allow_no_controls=true to run without controls")
        drawn = experiment_rng(seed, f"dynamic/controls/{n}").choice(pool, size=k, replace=False)
        controls.append(np.sort(drawn).astype(np.int64))
        targets.append(np.setdiff1d(ids, drawn).astype(np.int64))
    cat = (lambda parts: np.sort(np.concatenate(parts)).astype(np.int64) if parts else np.empty(0, np.int64))
    return Arms(cat(targets), cat(controls))


def copy_steps(plan) -> np.ndarray:
    """Global step of every span of ``plan`` (``int64 (num_spans,)``; step ``k`` trains rows ``[(k-1)B, kB)``)."""
    return plan.span_positions // plan.sequence_length // plan.global_batch_size + 1


def decide(plan, conf: DynamicConf, step: int, end_step: int, history: Dict[int, Losses], seed: int,
           arms: Arms) -> dict:
    """The additions for segment ``(step, end_step]``: chosen items (among ``arms.targets``) and their placed
    positions.

    :param plan: the plan so far (static plus earlier additions).
    :param history: evaluated step -> item losses, with ``history[step]``.
    :param arms: the run's arms (:func:`assign_arms` on the static plan).
    :returns: the record saved as ``dynamic/step<step>.json``: ``decided_at``, ``segment``, ``policy``,
        ``plan_digest`` (of ``plan``), ``items`` (chosen ids), ``item_ids``/``positions`` (one per copy, by item),
        ``losses`` (the deciding losses of the targets), ``controls`` (the control ids, never inserted).
    :raises InsertionError: if the segment's rows cannot hold the copies.
    """
    policy = make_policy(conf)
    targets = arms.targets
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
            "losses": {str(int(i)): history[step][int(i)] for i in targets if int(i) in history[step]},
            "controls": arms.controls.tolist()}


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
        raise CheckpointError(f"{path}: decided on another plan than this config's; restore the original config "
                              "and inputs to resume that run, or give this run its own run dir: name=<new name>")
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


def report(plan, conf: DynamicConf, history: Dict[int, Losses], records: List[dict], arms: Arms) -> List[dict]:
    """One row per target item, then one per control: ``item_id``, ``arm`` (``target`` | ``control``),
    ``experiment``, ``static_dups``, ``dynamic_dups``, ``added_at`` (decision steps that inserted it),
    ``initial_loss`` (at the first evaluated step), ``final_loss`` (at the last) and the policy's columns
    (:meth:`Policy.item_report <pretrain_exp.insertion.policies.base.Policy.item_report>`, computed for controls
    too; ``until_memorized``: ``memorized_at_step``, ``confirmed``, ``dups_needed``, ``below_threshold_at_start``,
    ``below_threshold_at_end``; ``spaced_repetition``: ``repetitions``). Losses in nats/token, ``None`` where the
    item was not evaluated."""
    policy = make_policy(conf)
    steps = copy_steps(plan)
    added: Dict[int, List[int]] = {}
    for r in records:
        for i in r["items"]:
            added.setdefault(int(i), []).append(int(r["decided_at"]))
    first, last = (min(history), max(history)) if history else (None, None)
    start = min((int(r["decided_at"]) for r in records), default=first)
    out = []
    for arm, ids in (("target", arms.targets), ("control", arms.controls)):
        for i in ids:
            i = int(i)
            n_dyn = len(added.get(i, [])) * conf.copies
            row = {"item_id": i, "arm": arm, "experiment": plan.experiments[plan.item_experiment[i]],
                   "static_dups": int(plan.item_dup_count[i]) - n_dyn, "dynamic_dups": n_dyn,
                   "added_at": added.get(i, []),
                   "initial_loss": history[first].get(i) if first is not None else None,
                   "final_loss": history[last].get(i) if last is not None else None}
            row.update(policy.item_report(i, history, np.sort(steps[plan.span_item_ids == i]), start))
            out.append(row)
    return out


def _none_for_nan(obj):
    """``obj`` with every non-finite float as ``None`` (as ``results.json`` holds it)."""
    if isinstance(obj, dict):
        return {k: _none_for_nan(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_none_for_nan(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def summary(plan, conf: DynamicConf, history: Dict[int, Losses], rows: List[dict], seed: int = 0,
            permutations: int = stats.PERMUTATIONS) -> dict:
    """``results.json``'s ``dynamic`` entry: the options, the per-item ``items`` (:func:`report`) and the analysis
    by arm at the last evaluated step (``final_step``):

    - ``arms``: per experiment, ``targets`` and ``controls`` (randomized), then the targets split by what the policy
      did (``inserted by the policy``; ``below threshold at start`` for ``until_memorized``, ``never inserted by
      the policy`` otherwise; ``randomized: false``; listed when neither empty nor all targets):
      ``{experiment, arm, randomized, n_items, mean, ci_low, ci_high, ci_method, small_n, initial_mean}`` of the
      final insertion loss (t interval, :func:`~pretrain_exp.core.stats.interval`; ``initial_mean`` at
      ``initial_step``); for ``until_memorized`` also the arm's counts of items that ``crossed`` the threshold at
      some eval, were ``confirmed`` (still below at the next eval: memorized), ``fell_back`` (back at or above at
      the next eval), are ``unconfirmed`` (crossed at the last eval) and ``below_at_end``.
    - ``itt``: per experiment, the intent-to-treat effect of being a target: every target against every control,
      whatever copies the policy gave it (:func:`~pretrain_exp.core.stats.effect`: Welch t interval, randomization
      p, exact up to :data:`~pretrain_exp.core.stats.MAX_EXACT` relabellings), signed so that a positive effect
      means a lower loss for the targets (``mean(control loss) - mean(target loss)``, nats/token). The final-loss row
      (``primary: true``) is the run's primary endpoint; when ``initial_step`` precedes every copy of these items
      (``eval.on_load``), a second row compares each item's change since then (a difference in differences, which
      removes item difficulty), Holm-adjusted over the experiments.
    - ``realized_dup_groups_randomized: false``: per-dup tables of this run group items by a dup count that the
      policy chose from their losses; :func:`~pretrain_exp.report.summary.print_dynamic_table` prints the caveat.

    :param plan: the final plan; ``history``: evaluated step -> item losses; ``seed``: of the Monte-Carlo
        randomization tests (larger than ``MAX_EXACT`` relabellings).
    """
    policy = make_policy(conf)
    steps = sorted(history)
    first, last = (steps[0], steps[-1]) if steps else (None, None)
    ids = np.asarray([r["item_id"] for r in rows], np.int64)
    spans = np.isin(plan.span_item_ids, ids)
    baseline = first is not None and first < last and bool(np.all(copy_steps(plan)[spans] > first))
    arms_out, itt = [], []
    for exp in dict.fromkeys(r["experiment"] for r in rows):
        mine = [r for r in rows if r["experiment"] == exp and r["final_loss"] is not None]
        groups = [("targets", True, [r for r in mine if r["arm"] == "target"]),
                  ("controls", True, [r for r in mine if r["arm"] == "control"]),
                  ("inserted by the policy", False, [r for r in mine if r["arm"] == "target" and r["dynamic_dups"]])]
        groups += [(name, False, group)
                   for name, group in policy.target_groups([r for r in mine if r["arm"] == "target"])]
        t, c = groups[0][2], groups[1][2]
        for name, randomized, group in groups:
            if randomized or 0 < len(group) < len(t):  # a policy-defined group that is all targets says nothing
                init = [r["initial_loss"] for r in group if r["initial_loss"] is not None]
                arms_out.append({"experiment": exp, "arm": name, "randomized": randomized,
                                 **stats.interval([r["final_loss"] for r in group]),
                                 "initial_mean": float(np.mean(init)) if init else None,
                                 **policy.arm_counts(group)})
        tl = np.asarray([r["final_loss"] for r in t], float)
        cl = np.asarray([r["final_loss"] for r in c], float)
        itt.append({"experiment": exp, "contrast": "targets vs controls (ITT)", "measure": "final loss",
                    "step": last, "primary": True, "sign": "mean(control) - mean(target)",
                    **stats.effect(-tl, -cl, permutations=permutations, seed=seed)})
        if baseline:
            d = (lambda g: np.asarray([r["final_loss"] - r["initial_loss"] for r in g
                                       if r["initial_loss"] is not None], float))
            itt.append({"experiment": exp, "contrast": "targets vs controls (ITT)",
                        "measure": f"loss change since step {first}", "step": last, "primary": False,
                        "sign": "mean(control) - mean(target)",
                        **stats.effect(-d(t), -d(c), permutations=permutations, seed=seed)})
    secondary = [r for r in itt if not r["primary"]]
    if secondary:
        stats.adjust_rows(secondary, "holm", "insertion.dynamic: ITT on the loss change")
    return _none_for_nan({**asdict(conf), "items": rows, "initial_step": first, "final_step": last,
                          "arms": arms_out, "itt": itt, "realized_dup_groups_randomized": False})
