"""The CPDT table: each tested experiment's effect together vs alone and their interaction, from a CPDT run's arms.

A CPDT run (:mod:`pretrain_exp.app.cpdt` launches it) holds ``config.resolved.yaml`` and one ordinary run per arm
and seed in ``arms/<arm>-seed<S>/``: ``together`` (all tested experiments) and ``alone-<name>`` per experiment. This
module reads them as plain data (the run's config as YAML, each arm's ``plan.npz`` and last eval), without the
app's config classes.

Effect (each insertion type's ``effect``, :mod:`pretrain_exp.insertion.types`). For experiment ``i`` at dup count
``d > 0`` in one arm: ``Y = sign * (mean_{items at dup d} v - mean_{dup-0 items} v)`` over the per-item value
``v`` of the last evaluated step: insertion loss (``v`` = mean loss in nats/token, ``sign = -1``: the loss gap,
positive when inserted items are predicted better) for ``texts``/``tokens``/``corpus_chunks`` experiments,
benchmark accuracy (``v`` = acc, ``sign = +1``: contaminated minus clean) for ``benchmark`` experiments.

Statistics (:mod:`pretrain_exp.evals.stats`). Per seed, the interaction ``I = Y_together - Y_alone`` equals ``sign *
(mean_d D - mean_0 D)`` for the per-item paired differences ``D(j) = v_together(j) - v_alone(j)`` of the same items; its
95% CI is the stratified percentile bootstrap over items of that contrast (items resampled within their dup
group, each item's two arms together). Pooled over seeds: the mean of the per-seed interactions, its CI from the
mean of the per-seed bootstrap replicates (so it covers the sampling of items, not seed-to-seed variation),
and a two-sided sign-flip permutation test of the per-seed interactions, which does treat the seeds as the
replicates (exact over all ``2**n`` sign vectors; with ``n`` seeds the smallest possible p-value is
``2 / 2**n``). ``Y_together`` and ``Y_alone`` get the same bootstrap CIs.

Outputs in the run dir: ``cpdt.json``, ``cpdt.csv``, ``cpdt.md``, ``plots/cpdt.png``, the same table and figure in
the run's W&B run (:func:`log_cpdt_wandb`); ``python -m pretrain_exp.report <run dir>`` rewrites them from the arms.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Mapping, Tuple

import numpy as np

from pretrain_exp.core.errors import CheckpointError, ConfigError
from pretrain_exp.core.io import write_json, write_text
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.insertion.types import TYPES, get_type
from pretrain_exp.insertion.types.base import EffectSpec
from pretrain_exp.report.plots import save_png
from pretrain_exp.report.tables import load_run
from pretrain_exp.report.text import csv_text, fmt


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


# --- the table ----------------------------------------------------------------------------------------------------
def _ci_row(prefix: str, point: float, reps: np.ndarray) -> dict:
    from pretrain_exp.evals.stats import percentile_interval

    low, high = percentile_interval(reps)
    return {prefix: point, f"{prefix}_ci_low": low, f"{prefix}_ci_high": high}


def compute_table(run_dir: Path) -> dict:
    """The CPDT table of a finished run dir (module docstring), from its ``config.resolved.yaml`` and arms.

    :returns: ``{"run_dir", "experiments", "seeds", "step", "bootstrap_samples", "rows"}``; ``rows``: one per
        experiment, inserted dup count and seed (``seed`` an int) plus the pooled row (``seed: "all"``), with
        ``n_treated, n_control, effect_together(_ci_low/_ci_high), effect_alone(...), interaction(...)`` and,
        pooled only, ``p_value`` (sign-flip test over the seeds) and ``ci_covers_zero``.
    :raises CheckpointError: if an arm is missing or unfinished.
    :raises ConfigError: for a run config that is not a CPDT one, or an experiment without dup-0 controls.
    """
    from pretrain_exp.evals.stats import contrast_replicates, sign_flip_pvalue

    run_dir = Path(run_dir).resolve()
    cfg = load_run_config(run_dir)
    cpdt, base_seed = cfg["cpdt"], cfg.get("seed", 0)
    samples = cfg["eval"]["bootstrap_samples"]
    tasks = cfg["eval"].get("tasks") or {}
    rows, step = [], None
    for k, name in enumerate(cpdt["experiments"]):
        task, spec = effect_task(name, cfg["insertion"]["experiments"][name]["type"], tasks)
        per_dup: Dict[int, List[dict]] = {}
        for seed in cpdt["seeds"]:
            step, tog = arm_values(arm_dir(run_dir, TOGETHER, seed), name, task, spec.value)
            _, alone = arm_values(arm_dir(run_dir, f"alone-{name}", seed), name, task, spec.value)
            common = sorted(set(tog) & set(alone))
            dups = np.array([tog[j][0] for j in common])
            t = np.array([tog[j][1] for j in common])
            a = np.array([alone[j][1] for j in common])
            for d in sorted(set(dups.tolist()) - {0}):
                rng = np.random.Generator(np.random.PCG64([base_seed, seed, k, d]))
                ins, ctl = dups == d, dups == 0
                if not ctl.any():
                    raise ConfigError(f"insertion.experiments.{name}.repetitions", "no dup-0 control items left "
                                      f"to compare dup {d} with (seed {seed})")
                out = {"experiment": name, "dup_count": d, "seed": seed, "n_treated": int(ins.sum()),
                       "n_control": int(ctl.sum()), "unit": spec.unit}
                reps = {}
                for key, v in (("effect_together", t), ("effect_alone", a), ("interaction", t - a)):
                    point, r = contrast_replicates(v[ins], v[ctl], samples, rng)
                    reps[key] = spec.sign * r
                    out |= _ci_row(key, spec.sign * point, reps[key])
                out["_reps"] = reps
                per_dup.setdefault(d, []).append(out)
        for d, seeds in sorted(per_dup.items()):
            pooled = {"experiment": name, "dup_count": d, "seed": "all",
                      "n_treated": seeds[0]["n_treated"], "n_control": seeds[0]["n_control"], "unit": spec.unit}
            for key in ("effect_together", "effect_alone", "interaction"):
                pooled |= _ci_row(key, float(np.mean([s[key] for s in seeds])),
                                  np.mean([s["_reps"][key] for s in seeds], axis=0))
            pooled["p_value"] = sign_flip_pvalue(np.array([s["interaction"] for s in seeds]),
                                                 samples=cpdt.get("permutations", 10000), seed=base_seed)
            lo, hi = pooled["interaction_ci_low"], pooled["interaction_ci_high"]
            pooled["ci_covers_zero"] = bool(lo <= 0 <= hi) if lo == lo else None
            for s in seeds:
                s.pop("_reps")
            rows += seeds + [pooled]
    return {"run_dir": str(run_dir), "experiments": list(cpdt["experiments"]), "seeds": list(cpdt["seeds"]),
            "step": step, "bootstrap_samples": samples, "rows": rows}


#: the columns of ``cpdt.csv`` (and of the W&B table)
COLUMNS = ("experiment", "dup_count", "seed", "n_treated", "n_control", "unit", "effect_together",
           "effect_together_ci_low", "effect_together_ci_high", "effect_alone", "effect_alone_ci_low",
           "effect_alone_ci_high", "interaction", "interaction_ci_low", "interaction_ci_high", "p_value",
           "ci_covers_zero")


def table_markdown(table: dict) -> str:
    """``cpdt.md``: the table with effects and interaction as ``value [low, high]``."""
    out = [f"# CPDT: {Path(table['run_dir']).name}", "",
           f"Effects at step {table['step']} (95% bootstrap CIs over items, {table['bootstrap_samples']} resamples); "
           "interaction = effect together - effect alone, paired by item; p: two-sided sign-flip test of the "
           f"per-seed interactions over seeds {table['seeds']}.", "",
           "| experiment | dup | seed | items (dup/0) | effect together | effect alone | interaction | p "
           "| CI covers 0 |",
           "|---|--:|--:|--:|--:|--:|--:|--:|---|"]
    for r in table["rows"]:
        ci = {k: f"{fmt(r[k])} [{fmt(r[k + '_ci_low'])}, {fmt(r[k + '_ci_high'])}]"
              for k in ("effect_together", "effect_alone", "interaction")}
        out.append(f"| {r['experiment']} | {r['dup_count']} | {r['seed']} | {r['n_treated']}/{r['n_control']} | "
                   f"{ci['effect_together']} | {ci['effect_alone']} | {ci['interaction']} | "
                   f"{fmt(r.get('p_value'))} | {fmt(r.get('ci_covers_zero'))} |")
    return "\n".join(out) + "\n"


def plot_cpdt(table: dict, path: Path) -> None:
    """PNG: left, each experiment's pooled effect together vs alone (95% CI bars) per dup count; right, the
    interaction per seed (dots) and pooled (95% CI bar) against 0. Written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pooled = [r for r in table["rows"] if r["seed"] == "all"]
    labels = [f"{r['experiment']}\ndup {r['dup_count']}" for r in pooled]
    x = np.arange(len(pooled))
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(10, 4.2))
    for off, key, color in ((-0.12, "effect_together", "C0"), (0.12, "effect_alone", "C1")):
        y = np.array([r[key] for r in pooled], dtype=float)
        err = np.array([[r[key] - r[f"{key}_ci_low"], r[f"{key}_ci_high"] - r[key]] for r in pooled], dtype=float).T
        ax0.errorbar(x + off, y, yerr=err if pooled else None, fmt="o", capsize=3, color=color,
                     label=key.replace("effect_", ""))
    ax0.axhline(0, color="gray", lw=0.8)
    ax0.set_ylabel("effect (loss gap in nats/token, or acc)")
    ax0.set_title("effect with the others vs alone (pooled over seeds)", fontsize=9)
    y = np.array([r["interaction"] for r in pooled], dtype=float)
    err = np.array([[r["interaction"] - r["interaction_ci_low"], r["interaction_ci_high"] - r["interaction"]]
                    for r in pooled], dtype=float).T
    ax1.errorbar(x, y, yerr=err if pooled else None, fmt="s", capsize=4, color="C2", label="pooled (95% CI)")
    for i, r in enumerate(pooled):
        per_seed = [s["interaction"] for s in table["rows"]
                    if s["experiment"] == r["experiment"] and s["dup_count"] == r["dup_count"] and s["seed"] != "all"]
        ax1.plot([i + 0.15] * len(per_seed), per_seed, "x", color="gray")
        ax1.annotate(f"p={r['p_value']:.2f}", (i, r["interaction_ci_high"]), textcoords="offset points",
                     xytext=(0, 4), ha="center", fontsize=7)
    ax1.axhline(0, color="gray", lw=0.8)
    ax1.set_title("interaction = together - alone (x: per seed)", fontsize=9)
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
    ``cpdt/<experiment>/dup<d>/<key>`` at the table's step, and, when W&B is on, the table as a ``wandb.Table``
    (``cpdt/table``) and the figure (``plots/cpdt``).

    :param tracker: the run's tracker: ``log(metrics, step)``, ``log_media(items, step)`` and ``wandb_dir``
        (``None`` when W&B is disabled) (:class:`pretrain_exp.app.tracking.Tracker`).
    """
    metrics = {}
    for r in table["rows"]:
        if r["seed"] == "all":
            for key in ("effect_together", "effect_alone", "interaction", "interaction_ci_low",
                        "interaction_ci_high", "p_value"):
                metrics[f"cpdt/{r['experiment']}/dup{r['dup_count']}/{key}"] = r[key]
    tracker.log(metrics, table["step"] or 0)
    if tracker.wandb_dir is not None:
        import wandb

        tracker.log_media({"cpdt/table": wandb.Table(columns=list(COLUMNS), allow_mixed_types=True,
                                                     data=[[r.get(c) for c in COLUMNS] for r in table["rows"]]),
                           "plots/cpdt": wandb.Image(table["paths"]["png"])}, table["step"] or 0)


def print_cpdt(table: dict) -> None:
    """Print the table with rich."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"CPDT at step {table['step']}: effect together vs alone, interaction (95% bootstrap CI), "
                    "sign-flip p over seeds")
    for c in ("experiment", "dup", "seed", "together", "alone", "interaction", "p"):
        t.add_column(c, justify="left" if c == "experiment" else "right", no_wrap=True)
    for r in table["rows"]:
        ci = {k: f"{r[k]:+.4f} [{r[k + '_ci_low']:+.4f}, {r[k + '_ci_high']:+.4f}]"
              for k in ("effect_together", "effect_alone", "interaction")}
        t.add_row(r["experiment"], str(r["dup_count"]), str(r["seed"]), ci["effect_together"], ci["effect_alone"],
                  ci["interaction"], fmt(r.get("p_value")))
    Console(width=max(140, Console().width)).print(t)
