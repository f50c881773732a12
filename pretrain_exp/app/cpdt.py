"""Continual pretraining dependence testing (CPDT): does an experiment's effect change when others share the run?

Bordt & Pawelczyk (2025), *Train Once, Answer All: Many Pretraining Experiments for the Cost of One*
(arXiv:2509.23383, Sec. 5 and Appendix F), call experiments ``E_1..E_n`` independent if the outcome ``Y_i^S`` of
experiment ``i`` in a run performing the experiments ``S`` has the same distribution for ``S = {i}`` and for
every ``S = {i} | T`` (Definition 5.1), and test it with short continual-pretraining runs from a checkpoint: one run
per experiment alone and one with all experiments together (the last row of their dependence matrix). This
module runs that test for the ``K = len(cpdt.experiments)`` experiments of one config and reports, for every
experiment ``i`` and inserted dup count ``d``, the interaction ``Y_i^{[K]} - Y_i^{{i}}``.

Arms. For every seed ``S`` of ``cpdt.seeds``, ``K + 1`` ordinary runs (:func:`pretrain_exp.app.launch.launch` on
derived configs, each in ``<run_dir>/arms/<arm>-seed<S>/`` and resumable like any run): ``together`` (all K
experiments) and ``alone-<name>`` for each experiment. All arms of a seed share ``seed``, ``data.seed`` and
``insertion.seed`` (= S), hence the data order, the items and their dup counts, and train the same steps. An
alone arm places all K experiments exactly as the together arm does and then withholds the others
(``insertion.withheld``, :meth:`~pretrain_exp.insertion.plan.Plan.without`), so every copy of the tested
experiment sits at the same global token position in both arms and the arms differ only by the other
experiments' tokens (those positions keep the corpus' own tokens). Experiments of ``insertion.experiments`` not
listed in ``cpdt.experiments`` are inserted in every arm.

Effect (each insertion type's ``effect``, :mod:`pretrain_exp.insertion.types`). For experiment ``i`` at dup count
``d > 0`` in one arm: ``Y = sign * (mean_{items at dup d} v - mean_{dup-0 items} v)`` over the per-item value
``v`` of the last evaluated step: insertion loss (``v`` = mean loss in nats/token, ``sign = -1``: the loss gap, positive
when inserted items are predicted better) for ``texts``/``tokens``/``corpus_chunks`` experiments, benchmark accuracy
(``v`` = acc, ``sign = +1``: contaminated minus clean) for ``benchmark`` experiments.

Statistics (:mod:`evals.stats`). Per seed, the interaction ``I = Y_together - Y_alone`` equals ``sign * (mean_d
D - mean_0 D)`` for the per-item paired differences ``D(j) = v_together(j) - v_alone(j)`` of the same items; its
95% CI is the stratified percentile bootstrap over items of that contrast (items resampled within their dup
group, each item's two arms together). Pooled over seeds: the mean of the per-seed interactions, its CI from the
mean of the per-seed bootstrap replicates (so it covers the sampling of items, not seed-to-seed variation),
and a two-sided sign-flip permutation test of the per-seed interactions, which does treat the seeds as the
replicates (exact over all ``2**n`` sign vectors; with ``n`` seeds the smallest possible p-value is
``2 / 2**n``). ``Y_together`` and ``Y_alone`` get the same bootstrap CIs.

Outputs in the run dir: ``cpdt.json``, ``cpdt.csv``, ``cpdt.md``, ``plots/cpdt.png``, the same table and figure in
the run's W&B run; ``python -m pretrain_exp.report <run dir>`` rewrites them from the arms.
"""

from __future__ import annotations

import copy
import csv
import io
import json
import logging
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from pretrain_exp.app.config import CpdtConf, ExperimentConfig
from pretrain_exp.core.errors import CheckpointError, ConfigError
from pretrain_exp.insertion.types import effect
from pretrain_exp.insertion.types.base import EffectSpec

log = logging.getLogger(__name__)


TOGETHER = "together"


def effect_task(cfg: ExperimentConfig, name: str) -> Tuple[str, EffectSpec]:
    """``(eval task name, effect spec)`` measuring experiment ``name``'s effect.

    :raises ConfigError: if no configured eval task measures it.
    """
    exp = cfg.insertion.experiments[name]
    spec = effect(exp)  # each insertion type defines its effect (pretrain_exp.insertion.types)
    if spec is None:
        from pretrain_exp.insertion.types import TYPES, get_type

        defined = sorted(t for t in TYPES if get_type(t).effect is not None)
        raise ConfigError("cpdt.experiments", f"{name!r} is a {exp.type} experiment; CPDT effects are defined for "
                          f"{defined}")
    for task, tc in cfg.eval.tasks.items():
        if tc.type == spec.eval_type and getattr(tc, "experiment", name) == name:
            return task, spec
    raise ConfigError("eval.tasks", f"no {spec.eval_type} eval measures cpdt experiment {name!r}; add "
                      f"eval={spec.eval_type}" + (f" with eval.tasks.<task>.experiment={name}"
                                                  if spec.eval_type == "benchmark" else ""))


def validate_cpdt(cfg: ExperimentConfig) -> None:
    """Check ``cpdt.*`` against the rest of the config (called by :meth:`ExperimentConfig.validate`).

    :raises ConfigError: for an experiment that is not an insertion experiment, fewer than 2 experiments or
        seeds, repeated names or seeds, an experiment without dup-0 controls and inserted items, no eval of its
        effect, ``insertion.withheld`` set by hand, or ``training.cleanup=all``.
    """
    c = cfg.cpdt
    for i, name in enumerate(c.experiments):
        if name not in cfg.insertion.experiments:
            raise ConfigError(f"cpdt.experiments[{i}]", f"{name!r} is not an insertion experiment; allowed: "
                              f"{sorted(cfg.insertion.experiments)}")
    if len(set(c.experiments)) != len(c.experiments):
        raise ConfigError("cpdt.experiments", f"names repeat: {list(c.experiments)}")
    if len(c.experiments) < 2:
        raise ConfigError("cpdt.experiments", f"dependence testing needs >= 2 experiments, got {list(c.experiments)}")
    if len(c.seeds) < 2:
        raise ConfigError("cpdt.seeds", f"the permutation test across seeds needs >= 2 seeds, got {list(c.seeds)}")
    if len(set(c.seeds)) != len(c.seeds):
        raise ConfigError("cpdt.seeds", f"seeds repeat: {list(c.seeds)}")
    if c.permutations < 1:
        raise ConfigError("cpdt.permutations", f"must be >= 1, got {c.permutations}")
    if cfg.insertion.withheld:
        raise ConfigError("insertion.withheld", "set by the CPDT arms themselves; leave it empty with cpdt.*")
    if cfg.training.cleanup.value == "all":
        raise ConfigError("training.cleanup", "'all' deletes the arms' run dirs, which the CPDT table is read from; "
                          "use none or bulky")
    for name in c.experiments:
        reps = cfg.insertion.experiments[name].repetitions
        reps = list(reps) if not isinstance(reps, (int, float)) else [reps]
        if not (0 in reps and any(r > 0 for r in reps)) and not any(0 < r < 1 for r in reps):
            raise ConfigError(f"insertion.experiments.{name}.repetitions", f"a cpdt experiment needs dup-0 "
                              f"controls and inserted items (e.g. [0, 4]), got {reps}")
        effect_task(cfg, name)


def arm_names(cfg: ExperimentConfig) -> List[str]:
    """``together`` and ``alone-<experiment>`` per tested experiment, in that order."""
    return [TOGETHER] + [f"alone-{n}" for n in cfg.cpdt.experiments]


def arm_dir(run_dir: Path, arm: str, seed: int) -> Path:
    return Path(run_dir) / "arms" / f"{arm}-seed{seed}"


def arm_config(cfg: ExperimentConfig, arm: str, seed: int) -> ExperimentConfig:
    """The ordinary run of one arm (module docstring): seeds set to ``seed``, the other tested experiments
    withheld for an alone arm (and their experiment-specific eval tasks dropped), its own run dir and name."""
    a = copy.deepcopy(cfg)
    a.cpdt = CpdtConf()
    a.seed = a.data.seed = a.insertion.seed = seed
    for task in a.eval.tasks.values():
        if hasattr(task, "seed"):
            task.seed = seed
    if arm != TOGETHER:
        kept = arm[len("alone-"):]
        a.insertion.withheld = [n for n in cfg.cpdt.experiments if n != kept]
        a.eval.tasks = {k: t for k, t in a.eval.tasks.items()
                        if getattr(t, "experiment", None) not in a.insertion.withheld}
    a.run_name = a.wandb.name = f"{cfg.name}-{cfg.model.name}-step{cfg.model.checkpoint_step}-{arm}-seed{seed}"
    a.run_dir = str(arm_dir(Path(cfg.run_dir).resolve(), arm, seed))
    return a


def run_cpdt(cfg: ExperimentConfig) -> dict:
    """Run every arm (skipping nothing: a finished arm resumes in seconds), then write and log the table.

    :returns: the ``cpdt.json`` content.
    """
    from pretrain_exp.app.experiment import check_same_run, save_resolved_config
    from pretrain_exp.app.launch import launch

    run_dir = Path(cfg.run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    check_same_run(cfg, run_dir)
    save_resolved_config(cfg, run_dir)
    arms = [(seed, arm) for seed in cfg.cpdt.seeds for arm in arm_names(cfg)]
    for k, (seed, arm) in enumerate(arms, 1):
        log.info("cpdt arm %d/%d: %s seed %d", k, len(arms), arm, seed)
        launch(arm_config(cfg, arm, seed))
    table = write_cpdt_report(run_dir, cfg)
    _log_wandb(cfg, table, run_dir)
    print_cpdt(table)
    return table


# --- the table ------------------------------------------------------------------------------------------------
def _last_eval(path: Path, task: str) -> Tuple[int, dict]:
    steps = sorted((int(d.name[4:]), d) for d in (path / "evals").glob("step*") if (d / f"{task}.json").is_file())
    if not steps or not (path / "results.json").is_file():
        raise CheckpointError(f"{path}: arm not finished (no results.json or no {task} eval); re-run the same "
                              "command to resume it")
    step, d = steps[-1]
    return step, json.loads((d / f"{task}.json").read_text())


def arm_values(path: Path, experiment: str, task: str, value: str) -> Tuple[int, Dict[int, Tuple[int, float]]]:
    """``(step, {index within the experiment: (dup count, value)})`` of one arm's last evaluated step.

    :raises CheckpointError: if the arm has no results or no such eval.
    """
    from pretrain_exp.insertion.plan import Plan

    step, rec = _last_eval(path, task)
    plan = Plan.load(path / "plan.npz")
    first = int(np.flatnonzero(plan.item_experiment == plan.experiments.index(experiment))[0])
    return step, {int(r["item_id"]) - first: (int(r["dup_count"]), float(r[value]))
                  for r in rec.get("rows", []) if r["experiment"] == experiment and r.get(value) is not None}


def _ci_row(prefix: str, point: float, reps: np.ndarray) -> dict:
    from evals.stats import percentile_interval

    low, high = percentile_interval(reps)
    return {prefix: point, f"{prefix}_ci_low": low, f"{prefix}_ci_high": high}


def compute_table(run_dir: Path, cfg: Optional[ExperimentConfig] = None) -> dict:
    """The CPDT table of a finished run dir (module docstring).

    :returns: ``{"run_dir", "experiments", "seeds", "step", "bootstrap_samples", "rows"}``; ``rows``: one per
        experiment, inserted dup count and seed (``seed`` an int) plus the pooled row (``seed: "all"``), with
        ``n_treated, n_control, effect_together(_ci_low/_ci_high), effect_alone(...), interaction(...)`` and,
        pooled only, ``p_value`` (sign-flip test over the seeds) and ``ci_covers_zero``.
    :raises CheckpointError: if an arm is missing or unfinished.
    """
    from evals.stats import contrast_replicates, sign_flip_pvalue
    from pretrain_exp.app.validate import load_resolved

    run_dir = Path(run_dir).resolve()
    cfg = cfg or load_resolved(str(run_dir / "config.resolved.yaml"))
    samples = cfg.eval.bootstrap_samples
    rows, step = [], None
    for k, name in enumerate(cfg.cpdt.experiments):
        task, spec = effect_task(cfg, name)
        per_dup: Dict[int, List[dict]] = {}
        for seed in cfg.cpdt.seeds:
            step, tog = arm_values(arm_dir(run_dir, TOGETHER, seed), name, task, spec.value)
            _, alone = arm_values(arm_dir(run_dir, f"alone-{name}", seed), name, task, spec.value)
            common = sorted(set(tog) & set(alone))
            dups = np.array([tog[j][0] for j in common])
            t = np.array([tog[j][1] for j in common])
            a = np.array([alone[j][1] for j in common])
            for d in sorted(set(dups.tolist()) - {0}):
                rng = np.random.Generator(np.random.PCG64([cfg.seed, seed, k, d]))
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
                                                 samples=cfg.cpdt.permutations, seed=cfg.seed)
            lo, hi = pooled["interaction_ci_low"], pooled["interaction_ci_high"]
            pooled["ci_covers_zero"] = bool(lo <= 0 <= hi) if lo == lo else None
            for s in seeds:
                s.pop("_reps")
            rows += seeds + [pooled]
    return {"run_dir": str(run_dir), "experiments": list(cfg.cpdt.experiments), "seeds": list(cfg.cpdt.seeds),
            "step": step, "bootstrap_samples": samples, "rows": rows}


COLUMNS = ("experiment", "dup_count", "seed", "n_treated", "n_control", "unit", "effect_together",
           "effect_together_ci_low", "effect_together_ci_high", "effect_alone", "effect_alone_ci_low",
           "effect_alone_ci_high", "interaction", "interaction_ci_low", "interaction_ci_high", "p_value",
           "ci_covers_zero")


def _fmt(v) -> str:
    if v is None:
        return "-"
    return f"{v:.4f}" if isinstance(v, float) else str(v)


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
        ci = {k: f"{_fmt(r[k])} [{_fmt(r[k + '_ci_low'])}, {_fmt(r[k + '_ci_high'])}]"
              for k in ("effect_together", "effect_alone", "interaction")}
        out.append(f"| {r['experiment']} | {r['dup_count']} | {r['seed']} | {r['n_treated']}/{r['n_control']} | "
                   f"{ci['effect_together']} | {ci['effect_alone']} | {ci['interaction']} | "
                   f"{_fmt(r.get('p_value'))} | {_fmt(r.get('ci_covers_zero'))} |")
    return "\n".join(out) + "\n"


def plot_cpdt(table: dict, path: Path) -> None:
    """PNG: left, each experiment's pooled effect together vs alone (95% CI bars) per dup count; right, the
    interaction per seed (dots) and pooled (95% CI bar) against 0. Written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pretrain_exp.report import _save_png

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
    _save_png(fig, path)
    plt.close(fig)


def write_cpdt_report(run_dir: Path, cfg: Optional[ExperimentConfig] = None,
                      out_dir: Optional[Path] = None) -> dict:
    """Compute the table (:func:`compute_table`) and write ``cpdt.json``, ``cpdt.csv``, ``cpdt.md`` and
    ``plots/cpdt.png`` into ``out_dir`` (default the run dir); returns the table with ``paths`` added."""
    from pretrain_exp.core.io import write_json, write_text

    table = compute_table(run_dir, cfg)
    out = Path(out_dir or run_dir).resolve()
    paths = {"json": out / "cpdt.json", "csv": out / "cpdt.csv", "md": out / "cpdt.md",
             "png": out / "plots" / "cpdt.png"}
    write_json(paths["json"], table)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows({c: ("" if r.get(c) is None else r.get(c)) for c in COLUMNS} for r in table["rows"])
    write_text(paths["csv"], buf.getvalue())
    write_text(paths["md"], table_markdown(table))
    plot_cpdt(table, paths["png"])
    return table | {"paths": {k: str(v) for k, v in paths.items()}}


def _log_wandb(cfg: ExperimentConfig, table: dict, run_dir: Path) -> None:
    """Log the pooled rows as scalars, the table as a ``wandb.Table`` and the figure, in the CPDT run's own W&B
    run (the arms have theirs)."""
    from pretrain_exp.app.tracking import Tracker

    with Tracker(cfg) as tracker:
        metrics = {}
        for r in table["rows"]:
            if r["seed"] == "all":
                for key in ("effect_together", "effect_alone", "interaction", "interaction_ci_low",
                            "interaction_ci_high", "p_value"):
                    metrics[f"cpdt/{r['experiment']}/dup{r['dup_count']}/{key}"] = r[key]
        tracker.log(metrics, table["step"] or 0)
        if tracker.wandb_dir is not None:
            import wandb

            tracker.run.log({"cpdt/table": wandb.Table(columns=list(COLUMNS), allow_mixed_types=True,
                                                       data=[[r.get(c) for c in COLUMNS] for r in table["rows"]]),
                             "plots/cpdt": wandb.Image(str(run_dir / "plots" / "cpdt.png"))})


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
                  ci["interaction"], _fmt(r.get("p_value")))
    Console(width=max(140, Console().width)).print(t)
