"""The CPDT table: each tested experiment's effect together vs alone, their interaction, and what the seeds allow
one to conclude about it, from a CPDT run's arms.

A CPDT run (:mod:`pretrain_exp.app.cpdt` launches it) holds ``config.resolved.yaml`` and one ordinary run per arm
and seed in ``arms/<arm>-seed<S>/``: ``together`` (all tested experiments) and ``alone-<name>`` per experiment. This
module reads them as plain data (the run's config as YAML, each arm's ``plan.npz`` and last eval), without the
app's config classes.

Effect (each insertion type's ``effect``, :mod:`pretrain_exp.insertion.types`). For experiment ``i`` at dup count
``d > 0`` in one arm: ``Y = sign * (mean_{items at dup d} v - mean_{dup-0 items} v)`` over the per-item value
``v`` of the last evaluated step: insertion loss (``v`` = mean loss in nats/token, ``sign = -1``: the loss gap,
positive when inserted items are predicted better) for ``texts``/``tokens``/``corpus_chunks`` experiments,
benchmark accuracy (``v`` = acc, ``sign = +1``: contaminated minus clean) for ``benchmark`` experiments.

Statistics (:func:`interaction_rows`, functions of :mod:`pretrain_exp.core.stats`):

- **Per seed**, the interaction ``I_s = Y_together - Y_alone`` equals ``sign * (mean_d D - mean_0 D)`` for the
  per-item paired differences ``D(j) = v_together(j) - v_alone(j)`` of the same items. Its 95% interval is the
  Welch t interval of that difference of means (:func:`~pretrain_exp.core.stats.welch_interval`), and so are the
  intervals of ``Y_together`` and ``Y_alone``. These cover the sampling of items within one seed only.
- **Pooled over the S seeds** (``seed: "all"``), each quantity is the mean of the per-seed values and its interval
  the Student t interval over the per-seed values (``S - 1`` df, :func:`~pretrain_exp.core.stats.seed_interval`):
  the seeds re-draw data order, items and dup assignment, so they are the independent replicates, and the
  spread of ``I_s`` between seeds holds both the item noise and the seed-level perturbation that the other
  experiments cause. With ``S <= 2`` seed variance is not identified and no pooled interval is given.
- **Test of an interaction**: the two-sided sign-flip test of the per-seed interactions
  (:func:`~pretrain_exp.core.stats.sign_flip_pvalue`; exact over ``2**S`` sign vectors, so its smallest
  p-value is ``2 / 2**S``: ``S >= 6`` seeds are needed to reach 0.05), Holm-adjusted (Holm 1979) over the
  experiment x dup count rows of the table (:func:`~pretrain_exp.core.stats.adjust`).
- **Test of no interaction**: an equivalence test (two one-sided t tests over seeds, Schuirmann 1987;
  :func:`~pretrain_exp.core.stats.tost`) of ``|E[I]| < cpdt.margin``, a margin in the effect's unit declared
  before the run; Holm-adjusted over the rows as well. Without a margin (or with ``S <= 2``) no row can be
  concluded to have no interaction.
- **Verdict** per pooled row at ``cpdt.alpha``: ``interaction (p=...)`` when the adjusted sign-flip p is
  ``<= alpha``; ``equivalent within ±margin`` when the adjusted TOST p is ``< alpha``; else ``inconclusive``.
  An interval over seeds that covers 0 is not evidence of independence and gives no verdict.

Outputs in the run dir: ``cpdt.json``, ``cpdt.csv``, ``cpdt.md``, ``plots/cpdt.png``, the same table and figure in
the run's W&B run (:func:`log_cpdt_wandb`); ``python -m pretrain_exp.report <run dir>`` rewrites them from the arms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from pretrain_exp.core.errors import CheckpointError, ConfigError
from pretrain_exp.core.io import write_json, write_text
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.insertion.types import TYPES, get_type
from pretrain_exp.insertion.types.base import EffectSpec
from pretrain_exp.report.plots import save_png
from pretrain_exp.report.tables import load_run
from pretrain_exp.report.text import csv_text

ALPHA = 0.05  #: default ``cpdt.alpha``: level of the sign-flip test, of the equivalence test and of the verdicts
P_ADJUST = "holm"  #: multiplicity adjustment over the experiment x dup count rows of a CPDT table
ITEM_CI_METHOD = "Welch t over items (paired by item)"  #: the interval of a per-seed row


# --- the effect of an experiment ------------------------------------------------------------------------------
def effect_task(name: str, insertion_type: str, tasks: Mapping[str, Mapping[str, Any]]) -> Tuple[str, EffectSpec]:
    """``(eval task name, effect spec)`` measuring experiment ``name``'s effect.

    :param insertion_type: the experiment's insertion type (``"texts"``, ``"benchmark"``, ...).
    :param tasks: ``eval.tasks`` as plain data: task name -> ``{"type": ..., "experiment": ...}`` (``experiment``
        only for experiment-specific evals; a task without it measures every experiment).
    :raises ConfigError: for an unknown type, a type without an effect definition or no eval task measuring it.
    """
    spec = get_type(insertion_type, f"insertion.experiments.{name}.type").effect
    if spec is None:
        defined = sorted(t for t in TYPES if get_type(t).effect is not None)
        raise ConfigError("cpdt.experiments", f"{name!r} is a {insertion_type} experiment; CPDT effects are defined "
                          f"for {defined}")
    for task, tc in tasks.items():
        if tc.get("type") == spec.eval_type and tc.get("experiment", name) == name:
            return task, spec
    raise ConfigError("eval.tasks", f"no {spec.eval_type} eval measures cpdt experiment {name!r}; add "
                      f"eval={spec.eval_type}" + (f" with eval.tasks.<task>.experiment={name}"
                                                  if spec.eval_type == "benchmark" else ""))


# --- the arms of a CPDT run dir ---------------------------------------------------------------------------------
TOGETHER = "together"


def arm_dir(run_dir: Path, arm: str, seed: int) -> Path:
    """``<run_dir>/arms/<arm>-seed<seed>``: the run dir of one arm."""
    return RunDir(run_dir).arm(arm, seed).path


def is_cpdt_run(path: Path) -> bool:
    """Whether ``path`` is a CPDT run dir (``arms/`` next to ``config.resolved.yaml``)."""
    return RunDir(path).is_cpdt()


def load_run_config(run_dir: Path) -> dict:
    """A CPDT run's ``config.resolved.yaml`` as plain data (no validation).

    :raises ConfigError: if the file is unreadable or lacks ``cpdt.experiments``/``cpdt.seeds``, naming the file.
    """
    import yaml

    path = RunDir(run_dir).config
    try:
        cfg = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(str(path), f"unreadable run config ({e})") from None
    cpdt = (cfg or {}).get("cpdt") or {}
    for key in ("experiments", "seeds"):
        if not cpdt.get(key):
            raise ConfigError(f"cpdt.{key}", f"empty or missing in {path}; not a CPDT run dir")
    return cfg


def _last_eval(path: Path, task: str) -> Tuple[int, dict]:
    rd = RunDir(path)
    steps = [s for s, _ in rd.eval_steps() if rd.evals(s, task).is_file()]
    if not steps or not rd.results.is_file():
        raise CheckpointError(f"{path}: arm not finished (no {RunDir.RESULTS} or no {task} eval); re-run the same "
                              "command to resume it")
    return steps[-1], rd.read_eval(steps[-1], task)


def arm_values(path: Path, experiment: str, task: str, value: str) -> Tuple[int, Dict[int, Tuple[int, float]]]:
    """``(step, {index within the experiment: (dup count, value)})`` of one arm's last evaluated step.

    :raises CheckpointError: if the arm has no results or no such eval.
    """
    from pretrain_exp.insertion.plan import Plan

    step, _ = _last_eval(path, task)
    plan = Plan.load(RunDir(path).plan)
    first = int(np.flatnonzero(plan.item_experiment == plan.experiments.index(experiment))[0])
    run = load_run(path)  # the arm's per-item eval rows
    if value not in run.columns:
        return step, {}
    rows = run[(run["eval"] == task) & (run["step"] == step) & (run["experiment"] == experiment)
               & run[value].notna()]
    triples = zip(rows["item_id"], rows["dup_count"], rows[value])
    return step, {int(i) - first: (int(d), float(v)) for i, d, v in triples}


# --- the statistics ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SeedValues:
    """One experiment's per-item values in one seed's two arms, aligned by item (index ``j`` is the same item in
    both arms).

    :param dup_counts: shape ``(n,)``, int: each item's dup count (0: control).
    :param together: shape ``(n,)``, float: the per-item value ``v`` in the together arm (loss in nats/token, acc).
    :param alone: shape ``(n,)``, float: the same items' values in the experiment's alone arm.
    """

    dup_counts: np.ndarray
    together: np.ndarray
    alone: np.ndarray


@dataclass(frozen=True)
class ExperimentValues:
    """One tested experiment of a CPDT table: its effect's ``sign`` (+1 or -1, :class:`EffectSpec`), ``unit``
    and per-seed values ``seeds`` (seed -> :class:`SeedValues`)."""

    sign: int
    unit: str
    seeds: Mapping[int, SeedValues]


def seeds_needed(alpha: float, n_tests: int = 1) -> int:
    """The fewest seeds ``S`` whose exact sign-flip test can reach ``alpha`` after Holm over ``n_tests`` tests:
    the smallest ``S`` with ``n_tests * 2 / 2**S <= alpha`` (:func:`~pretrain_exp.core.stats.min_sign_flip_p`);
    6 for one test at 0.05, 7 for two."""
    return max(1, math.ceil(math.log2(2 * max(1, n_tests) / alpha) - 1e-12))


def seeds_warning(n_seeds: int, alpha: float, n_tests: int = 1) -> Optional[str]:
    """Why ``n_seeds`` seeds cannot show an interaction at ``alpha`` (one sentence), or ``None`` when they can: the
    exact sign-flip test's smallest p-value ``2 / 2**S`` (:func:`~pretrain_exp.core.stats.min_sign_flip_p`),
    times ``n_tests`` after Holm, must be ``<= alpha``. Shown above a CPDT table and logged as a warning when a run
    is set up (:func:`pretrain_exp.app.validate.validate_cpdt`).

    :param n_tests: the experiment x dup count rows tested (Holm multiplies the smallest p by up to this).
    """
    from pretrain_exp.core.stats import min_sign_flip_p

    low = min_sign_flip_p(n_seeds)
    if low > alpha:
        holm = f", with Holm over {n_tests} tests" if n_tests > 1 else ""
        return (f"{n_seeds} seeds: the sign-flip test's smallest p-value is 2/2^{n_seeds} = {low:.3g} > alpha = "
                f"{alpha:g}, so no interaction can be detected; use >= {seeds_needed(alpha, n_tests)} seeds "
                f"(cpdt.seeds{holm})")
    if n_tests * low > alpha:
        return (f"{n_seeds} seeds: after Holm over {n_tests} tests the smallest adjusted p-value is {n_tests} x "
                f"2/2^{n_seeds} = {n_tests * low:.3g} > alpha = {alpha:g}; use >= {seeds_needed(alpha, n_tests)} "
                "seeds (cpdt.seeds)")
    return None


def seed_notes(n_seeds: int, alpha: float, margin: Optional[float], n_tests: int = 1) -> List[str]:
    """What ``n_seeds`` seeds, ``alpha`` and ``margin`` leave a CPDT table unable to conclude, one sentence each
    (empty when it can conclude either way): :func:`seeds_warning`, seed variance not identified (``S <= 2``), no
    equivalence margin. Shown above the table."""
    notes = [w for w in (seeds_warning(n_seeds, alpha, n_tests),) if w]
    if n_seeds <= 2:
        notes.append(f"{n_seeds} seeds: seed variance is not identified, so the pooled rows have no interval and no "
                     "equivalence test; use >= 3 seeds")
    if margin is None:
        notes.append("no equivalence margin declared (cpdt.margin): absence of an interaction cannot be concluded, "
                     "only 'inconclusive'")
    return notes


def _signed(sign: int, est: float, low: float, high: float) -> Tuple[float, float, float]:
    return (sign * est, sign * low, sign * high) if sign > 0 else (sign * est, sign * high, sign * low)


def seed_rows(experiment: str, seed: int, values: SeedValues, sign: int, unit: str) -> List[dict]:
    """The per-seed rows of one experiment: one per inserted dup count ``d``, with ``effect_together``,
    ``effect_alone`` and ``interaction`` (each ``sign * (mean_d - mean_0)``, in ``unit``) and their Welch t
    intervals over items (``ci_method``), ``n_treated``/``n_control`` and ``small_n`` (a group under
    :data:`~pretrain_exp.core.stats.MIN_ITEMS_PER_GROUP` items).

    :raises ConfigError: if ``values`` has no dup-0 control item, naming the experiment's repetitions.
    """
    from pretrain_exp.core.stats import MIN_ITEMS_PER_GROUP, welch_interval

    dups = np.asarray(values.dup_counts).astype(np.int64)
    t = np.asarray(values.together, dtype=np.float64)
    a = np.asarray(values.alone, dtype=np.float64)
    ctl = dups == 0
    rows = []
    for d in sorted(set(dups.tolist()) - {0}):
        if not ctl.any():
            raise ConfigError(f"insertion.experiments.{experiment}.repetitions", "no dup-0 control items left to "
                              f"compare dup {d} with (seed {seed})")
        ins = dups == d
        out = {"experiment": experiment, "dup_count": int(d), "seed": int(seed), "n_treated": int(ins.sum()),
               "n_control": int(ctl.sum()), "unit": unit,
               "small_n": bool(min(ins.sum(), ctl.sum()) < MIN_ITEMS_PER_GROUP)}
        for key, v in (("effect_together", t), ("effect_alone", a), ("interaction", t - a)):
            est, low, high, method = welch_interval(v[ins], v[ctl])
            est, low, high = _signed(sign, est, low, high)
            out |= {key: est, f"{key}_ci_low": low, f"{key}_ci_high": high}
            if key == "interaction":
                out["ci_method"] = ITEM_CI_METHOD if method == "Welch t" else method
        rows.append(out)
    return rows


def pooled_row(per_seed: Sequence[dict], alpha: float = ALPHA, margin: Optional[float] = None,
               permutations: int = 10000, seed: int = 0) -> dict:
    """One experiment x dup count pooled over its seeds (``seed: "all"``) from its per-seed rows
    (:func:`seed_rows`): the means over seeds with t intervals over seeds (``ci_method``; none for ``S <= 2``),
    ``sd_seeds`` (of the interaction), the sign-flip ``p_value`` of the per-seed interactions with ``p_method``
    and ``min_p`` (``2 / 2**S``), the TOST ``tost_p`` against ``margin`` (``None`` without a margin or with
    ``S <= 2``), and the per-seed item counts as ranges ``n_treated_min/_max``, ``n_control_min/_max``.
    ``p_adjusted``, ``tost_p_adjusted`` and ``verdict`` are set by :func:`conclude`.

    :param permutations: random sign vectors when ``S > 16`` (exact enumeration below).
    """
    from pretrain_exp.core.stats import min_sign_flip_p, seed_interval, sign_flip_pvalue, tost

    first = per_seed[0]
    n_t = [r["n_treated"] for r in per_seed]
    n_c = [r["n_control"] for r in per_seed]
    out = {"experiment": first["experiment"], "dup_count": first["dup_count"], "seed": "all",
           "n_seeds": len(per_seed), "n_treated": None, "n_control": None, "n_treated_min": min(n_t),
           "n_treated_max": max(n_t), "n_control_min": min(n_c), "n_control_max": max(n_c), "unit": first["unit"],
           "small_n": any(r["small_n"] for r in per_seed)}
    for key in ("effect_together", "effect_alone", "interaction"):
        s = seed_interval([r[key] for r in per_seed])
        out |= {key: s["effect"], f"{key}_ci_low": s["ci_low"], f"{key}_ci_high": s["ci_high"]}
        if key == "interaction":
            out |= {"ci_method": s["ci_method"], "sd_seeds": s["sd_seeds"]}
    inter = np.array([r["interaction"] for r in per_seed], dtype=np.float64)
    n = inter.size
    out |= {"p_value": sign_flip_pvalue(inter, samples=permutations, seed=seed),
            "p_method": f"sign flip, exact over 2^{n}" if n <= 16 else f"sign flip, {permutations} random signs",
            "min_p": min_sign_flip_p(n) if n <= 16 else 1.0 / (1 + permutations),
            "margin": margin, "tost_p": None}
    if margin is not None and n >= 3:
        out["tost_p"] = tost(inter, margin, alpha)["tost_p"]
    return out


def conclude(pooled: List[dict], alpha: float = ALPHA, margin: Optional[float] = None) -> List[dict]:
    """Holm-adjust the pooled rows' sign-flip and TOST p-values over the rows (``p_adjusted``,
    ``tost_p_adjusted``, ``p_adjust_method``) and give each its ``verdict`` (module docstring); returns
    ``pooled``."""
    from pretrain_exp.core.stats import adjust

    nan = float("nan")
    for r, q in zip(pooled, adjust([r["p_value"] for r in pooled], P_ADJUST)):
        r |= {"p_adjusted": q, "p_adjust_method": P_ADJUST}
    tost_adj = adjust([nan if r["tost_p"] is None else r["tost_p"] for r in pooled], P_ADJUST)
    for r, q in zip(pooled, tost_adj):
        r["tost_p_adjusted"] = q if q == q else None
        equivalent = r["tost_p_adjusted"] is not None and r["tost_p_adjusted"] < alpha
        if r["p_adjusted"] <= alpha:
            r["verdict"] = f"interaction (p={r['p_adjusted']:.3g})" + (
                f", within ±{margin:g}" if equivalent else "")
        elif equivalent:
            r["verdict"] = f"equivalent within ±{margin:g}"
        else:
            r["verdict"] = "inconclusive"
    return pooled


def interaction_rows(experiments: Mapping[str, ExperimentValues], alpha: float = ALPHA,
                     margin: Optional[float] = None, permutations: int = 10000, seed: int = 0) -> List[dict]:
    """The rows of a CPDT table from per-seed per-item values (what :func:`compute_table` reads from a run's arms):
    per experiment and inserted dup count, its per-seed rows (:func:`seed_rows`) followed by the row pooled over
    seeds (:func:`pooled_row`); the pooled rows Holm-adjusted together and given verdicts (:func:`conclude`).

    :param experiments: experiment name -> :class:`ExperimentValues`; seeds in ascending order.
    :param alpha: level of the tests and verdicts (``cpdt.alpha``); :param margin: the equivalence margin
        (``cpdt.margin``, in each experiment's unit), ``None``: no equivalence test.
    :raises ConfigError: for an experiment without dup-0 control items in a seed.
    """
    rows, pooled = [], []
    for name, exp in experiments.items():
        per_dup: Dict[int, List[dict]] = {}
        for s in sorted(exp.seeds):
            for r in seed_rows(name, s, exp.seeds[s], exp.sign, exp.unit):
                per_dup.setdefault(r["dup_count"], []).append(r)
        for d, per_seed in sorted(per_dup.items()):
            pooled.append(pooled_row(per_seed, alpha, margin, permutations, seed))
            rows += per_seed + [pooled[-1]]
    conclude(pooled, alpha, margin)
    return rows


# --- the table ----------------------------------------------------------------------------------------------------
def compute_table(run_dir: Path) -> dict:
    """The CPDT table of a finished run dir (module docstring), from its ``config.resolved.yaml`` and arms.

    :returns: ``{"run_dir", "experiments", "seeds", "step", "alpha", "margin", "p_adjust", "n_tests", "notes",
        "rows"}``; ``rows`` (:func:`interaction_rows`): one per experiment, inserted dup count and seed (``seed``
        an int; Welch intervals over items) plus the pooled row (``seed: "all"``; intervals over seeds, sign-flip
        and TOST p-values, Holm-adjusted, and the ``verdict``); ``notes``: :func:`seed_notes`.
    :raises CheckpointError: if an arm is missing or unfinished.
    :raises ConfigError: for a run config that is not a CPDT one, or an experiment without dup-0 controls.
    """
    run_dir = Path(run_dir).resolve()
    cfg = load_run_config(run_dir)
    cpdt, base_seed = cfg["cpdt"], cfg.get("seed", 0)
    alpha, margin = float(cpdt.get("alpha", ALPHA)), cpdt.get("margin")
    margin = None if margin is None else float(margin)
    tasks = cfg["eval"].get("tasks") or {}
    experiments, step = {}, None
    for name in cpdt["experiments"]:
        task, spec = effect_task(name, cfg["insertion"]["experiments"][name]["type"], tasks)
        seeds = {}
        for seed in cpdt["seeds"]:
            step, tog = arm_values(arm_dir(run_dir, TOGETHER, seed), name, task, spec.value)
            _, alone = arm_values(arm_dir(run_dir, f"alone-{name}", seed), name, task, spec.value)
            common = sorted(set(tog) & set(alone))
            seeds[int(seed)] = SeedValues(np.array([tog[j][0] for j in common], dtype=np.int64),
                                          np.array([tog[j][1] for j in common]),
                                          np.array([alone[j][1] for j in common]))
        experiments[name] = ExperimentValues(spec.sign, spec.unit, seeds)
    rows = interaction_rows(experiments, alpha, margin, cpdt.get("permutations", 10000), base_seed)
    n_tests = sum(r["seed"] == "all" for r in rows)
    return {"run_dir": str(run_dir), "experiments": list(cpdt["experiments"]), "seeds": list(cpdt["seeds"]),
            "step": step, "alpha": alpha, "margin": margin, "p_adjust": P_ADJUST, "n_tests": n_tests,
            "notes": seed_notes(len(cpdt["seeds"]), alpha, margin, n_tests), "rows": rows}


#: the columns of ``cpdt.csv`` (and of the W&B table)
COLUMNS = ("experiment", "dup_count", "seed", "n_seeds", "n_treated", "n_control", "n_treated_min", "n_treated_max",
           "n_control_min", "n_control_max", "small_n", "unit", "effect_together", "effect_together_ci_low",
           "effect_together_ci_high", "effect_alone", "effect_alone_ci_low", "effect_alone_ci_high", "interaction",
           "interaction_ci_low", "interaction_ci_high", "ci_method", "sd_seeds", "p_value", "p_method", "min_p",
           "p_adjusted", "p_adjust_method", "tost_p", "tost_p_adjusted", "margin", "verdict")


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def ci_text(row: dict, key: str) -> str:
    """``value [low, high]`` of ``row[key]`` (signed, 4 decimals), ``value [n/a]`` without an interval."""
    if not _finite(row.get(key)):
        return "n/a"
    lo, hi = row.get(f"{key}_ci_low"), row.get(f"{key}_ci_high")
    ci = f"[{lo:+.4f}, {hi:+.4f}]" if _finite(lo) and _finite(hi) else "[n/a]"
    return f"{row[key]:+.4f} {ci}"


def items_text(row: dict) -> str:
    """Items at the dup count / dup-0 items: ``8/8`` for a seed, the range over seeds (``6-9/7-10``) pooled."""
    if row["seed"] != "all":
        text = f"{row['n_treated']}/{row['n_control']}"
    else:
        def rng(k):
            lo, hi = row[f"{k}_min"], row[f"{k}_max"]
            return str(lo) if lo == hi else f"{lo}-{hi}"
        text = f"{rng('n_treated')}/{rng('n_control')}"
    return text + (" (small)" if row.get("small_n") else "")


def _p(v) -> str:
    return f"{v:.3g}" if _finite(v) else "-"


def table_header(table: dict) -> str:
    """The sentence above the table: what its intervals cover, the tests, the adjustment and the level."""
    seeds = table["seeds"]
    margin = table.get("margin")
    return (f"Effects at step {table['step']} (unit per row). Per-seed rows: 95% Welch t interval over the items "
            f"(the interaction paired by item: each item's two arms). Pooled rows (seed `all`, {len(seeds)} seeds "
            f"{seeds}): the mean over seeds and its 95% t interval over seeds (none with <= 2 seeds); p: two-sided "
            f"exact sign-flip test of the per-seed interactions (smallest possible p = 2/2^{len(seeds)}); TOST p: "
            "equivalence test of |interaction| < "
            + (f"±{margin:g}" if margin is not None else "a margin (none declared: cpdt.margin)")
            + f" over seeds; both p-values Holm-adjusted over the {table.get('n_tests', '?')} experiment x dup count "
            f"tests; verdicts at alpha = {table.get('alpha', ALPHA):g}. Items: dup d / dup 0 per seed, the range over "
            "seeds when pooled.")


def table_markdown(table: dict) -> str:
    """``cpdt.md``: the notes, the header and the table (intervals as ``value [low, high]``, ``n/a`` when none)."""
    out = [f"# CPDT: {Path(table['run_dir']).name}", ""]
    if table.get("notes"):
        out += [f"> **Warning:** {n}  " for n in table["notes"]] + [""]
    out += [table_header(table), "",
            "| experiment | dup | seed | items (dup/0) | unit | effect together | effect alone | interaction "
            "| interval | p (sign flip) | p (Holm) | TOST p (Holm) | verdict |",
            "|---|--:|--:|--:|---|--:|--:|--:|---|--:|--:|--:|---|"]
    for r in table["rows"]:
        pooled = r["seed"] == "all"
        out.append(f"| {r['experiment']} | {r['dup_count']} | {r['seed']} | {items_text(r)} | {r['unit']} | "
                   f"{ci_text(r, 'effect_together')} | {ci_text(r, 'effect_alone')} | {ci_text(r, 'interaction')} | "
                   f"{r['ci_method']} | {_p(r.get('p_value')) if pooled else '-'} | "
                   f"{_p(r.get('p_adjusted')) if pooled else '-'} | {_p(r.get('tost_p_adjusted')) if pooled else '-'}"
                   f" | {r.get('verdict') or '-'} |")
    return "\n".join(out) + "\n"


def _errorbar(ax, x, rows: Sequence[dict], key: str, fmt: str, color: str, label: Optional[str] = None) -> None:
    """Points at ``rows[key]`` with bars from their intervals; a point without an interval is drawn hollow, with no
    bar (never a zero-width one)."""
    y = np.array([r[key] for r in rows], dtype=float)
    lo = np.array([r[f"{key}_ci_low"] for r in rows], dtype=float)
    hi = np.array([r[f"{key}_ci_high"] for r in rows], dtype=float)
    ok = np.isfinite(lo) & np.isfinite(hi)
    x = np.asarray(x, dtype=float)
    if ok.any():
        ax.errorbar(x[ok], y[ok], yerr=np.vstack([y[ok] - lo[ok], hi[ok] - y[ok]]), fmt=fmt, color=color,
                    capsize=3, label=label)
        label = None
    if (~ok).any():
        ax.plot(x[~ok], y[~ok], fmt, color=color, mfc="none", label=None if label is None else f"{label}, no interval")


def plot_cpdt(table: dict, path: Path) -> None:
    """PNG: left, each experiment's effect together vs alone per seed (95% Welch intervals over items) per dup
    count; right, the interaction per seed (items' intervals) and pooled (95% t interval over seeds, no bar where
    seed variance is not identified) against 0 and the ±margin band when one is declared. Written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pooled = [r for r in table["rows"] if r["seed"] == "all"]
    labels = [f"{r['experiment']}\ndup {r['dup_count']}" for r in pooled]
    x = np.arange(len(pooled))
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 4.4))

    def per_seed(r):
        return [s for s in table["rows"]
                if s["experiment"] == r["experiment"] and s["dup_count"] == r["dup_count"] and s["seed"] != "all"]

    for i, r in enumerate(pooled):
        seeds = per_seed(r)
        offs = np.linspace(-0.3, 0.3, 2 * len(seeds)) if seeds else []
        _errorbar(ax0, offs[0::2] + i, seeds, "effect_together", fmt="o", color="C0",
                  label="together (per seed)" if i == 0 else None)
        _errorbar(ax0, offs[1::2] + i, seeds, "effect_alone", fmt="o", color="C1",
                  label="alone (per seed)" if i == 0 else None)
        sx = np.linspace(-0.35, -0.05, len(seeds)) + i
        _errorbar(ax1, sx, seeds, "interaction", fmt="x", color="gray",
                  label="per seed (interval over items)" if i == 0 else None)
    ax0.axhline(0, color="gray", lw=0.8)
    ax0.set_ylabel("effect (loss gap in nats/token, or acc)")
    ax0.set_title("effect with the others vs alone (95% Welch over items)", fontsize=9)
    _errorbar(ax1, x + 0.15, pooled, "interaction", fmt="s", color="C2", label="pooled (95% t over seeds)")
    margin = table.get("margin")
    if margin is not None:
        ax1.axhspan(-margin, margin, color="C2", alpha=0.1, label=f"±margin {margin:g}")
    for i, r in enumerate(pooled):
        top = max(v for v in (r["interaction"], r["interaction_ci_high"]) if _finite(v))
        ax1.annotate(r.get("verdict") or "", (i + 0.15, top), textcoords="offset points", xytext=(0, 5),
                     ha="center", fontsize=7)
    ax1.axhline(0, color="gray", lw=0.8)
    ax1.set_title("interaction = together - alone", fontsize=9)
    for ax in (ax0, ax1):
        ax.set_xticks(x, labels, fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)


def write_cpdt_report(run_dir: Path, out_dir: Path | None = None) -> dict:
    """Compute the table (:func:`compute_table`) and write ``cpdt.json``, ``cpdt.csv``, ``cpdt.md`` and
    ``plots/cpdt.png`` into ``out_dir`` (default the run dir); returns the table with ``paths`` (str) added.

    :raises CheckpointError, ConfigError: as :func:`compute_table`.
    """
    table = compute_table(run_dir)
    out = RunDir(Path(out_dir or run_dir).resolve())
    paths = {**{ext: out.cpdt_table(ext) for ext in ("json", "csv", "md")}, "png": out.plot("cpdt")}
    write_json(paths["json"], table)
    write_text(paths["csv"], csv_text(table["rows"], COLUMNS))
    write_text(paths["md"], table_markdown(table))
    plot_cpdt(table, paths["png"])
    return table | {"paths": {k: str(v) for k, v in paths.items()}}


def log_cpdt_wandb(tracker, table: dict) -> None:
    """Log a written table (:func:`write_cpdt_report`) to a run's tracker: the pooled rows as scalars
    ``cpdt/<experiment>/dup<d>/<key>`` at the table's step (a missing interval or p-value is left out), and, when
    W&B is on, the table as a ``wandb.Table`` (``cpdt/table``) and the figure (``plots/cpdt``).

    :param tracker: the run's tracker: ``log(metrics, step)``, ``log_media(items, step)`` and ``wandb_dir``
        (``None`` when W&B is disabled) (:class:`pretrain_exp.app.tracking.Tracker`).
    """
    metrics = {}
    for r in table["rows"]:
        if r["seed"] == "all":
            for key in ("effect_together", "effect_alone", "interaction", "interaction_ci_low",
                        "interaction_ci_high", "p_value", "p_adjusted", "tost_p_adjusted"):
                metrics[f"cpdt/{r['experiment']}/dup{r['dup_count']}/{key}"] = r.get(key)
    tracker.log(metrics, table["step"] or 0)
    if tracker.wandb_dir is not None:
        import wandb

        tracker.log_media({"cpdt/table": wandb.Table(columns=list(COLUMNS), allow_mixed_types=True,
                                                     data=[[r.get(c) for c in COLUMNS] for r in table["rows"]]),
                           "plots/cpdt": wandb.Image(table["paths"]["png"])}, table["step"] or 0)


def print_cpdt(table: dict) -> None:
    """Print the notes, the header sentence and the table with rich."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(width=max(200, Console().width))
    for n in table.get("notes", []):
        console.print(f"[yellow]warning:[/yellow] {escape(n)}", highlight=False)
    t = Table(title=f"CPDT at step {table['step']}: effect together vs alone and their interaction",
              caption=escape(table_header(table)))
    for c in ("experiment", "dup", "seed", "items", "together", "alone", "interaction", "interval", "p", "p Holm",
              "TOST p Holm", "verdict"):
        t.add_column(c, justify="left" if c in ("experiment", "interval", "verdict") else "right",
                     no_wrap=c not in ("interval", "verdict"), max_width=24 if c in ("interval", "verdict") else None)
    for r in table["rows"]:
        pooled = r["seed"] == "all"
        cells = [r["experiment"], str(r["dup_count"]), str(r["seed"]), items_text(r), ci_text(r, "effect_together"),
                 ci_text(r, "effect_alone"), ci_text(r, "interaction"), r["ci_method"],
                 *((_p(r.get("p_value")), _p(r.get("p_adjusted")), _p(r.get("tost_p_adjusted")))
                   if pooled else ("-", "-", "-")), r.get("verdict") or "-"]
        t.add_row(*map(escape, cells))
    console.print(t)
