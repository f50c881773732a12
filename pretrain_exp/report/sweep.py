"""The sweep report: one table row per job, experiment and dup count, written as ``report.csv`` / ``report.md``.

:func:`write_report` finds every job dir under a dir, reads each job's ``results.json``, ``config.resolved.yaml``
and ``.hydra/overrides.yaml`` into one DataFrame row per job (:func:`pretrain_exp.report.tables.sweep_frame`,
the table :func:`pretrain_exp.load_sweep` returns), and writes ``report.csv`` / ``report.md`` (one row per job,
experiment and dup count: the group's mean loss with its interval and ``small_n`` flag, and ``effect =
mean_loss(dup 0) - mean_loss(dup)`` with its Welch interval, randomization p and adjusted p from the job's
``insertion_loss`` effects; the failed jobs with the last error line of their logs), ``loss_vs_dup.png`` (one
line per job), the effect, the log-linear dose response and the k-extractable rate pooled over seeds
(:mod:`pretrain_exp.report.pooled`: ``effect_pooled.csv`` / ``effect_vs_dup.png``, ``trend_pooled.csv``,
``exact_match_pooled.csv`` / ``exact_match_vs_dup.png``); with a ``benchmark`` eval also
``benchmark.csv`` / ``benchmark.png`` (acc of the clean and of all contaminated items, weighted by item as the
contamination effect is, the effect with its interval and p, and with ``eval.on_load`` each side's change since
the initial checkpoint: the clean items' change is the spillover) and the per-dup contamination effects in
``report.md``, and for jobs evaluated at several steps the forgetting curves ``forgetting/<job>.png`` (insertion
loss by step). Every figure is also written as PDF. For a CPDT run dir the jobs are its arms, and its interaction
table (:mod:`pretrain_exp.report.cpdt`) is rewritten too.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pandas as pd

from pretrain_exp.core import stats
from pretrain_exp.core.io import write_text
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.report import cpdt
from pretrain_exp.report.failures import collect
from pretrain_exp.report.jobs import Job
from pretrain_exp.report.plots import plot_benchmark, plot_effect_vs_dup, plot_loss_vs_step
from pretrain_exp.report.pooled import (
    EXACT_MATCH_COLUMNS,
    POOLED_COLUMNS,
    TREND_COLUMNS,
    job_losses,
    plot_exact_match,
    plot_pooled,
    pooled_effects,
    pooled_exact_match,
    pooled_trend,
)
from pretrain_exp.report.summary import loss_effects
from pretrain_exp.report.tables import OVERRIDE_PREFIX, load_run, py, sweep_frame
from pretrain_exp.report.text import NA, csv_text, md_cell, method_label, missing

#: the fixed columns of ``report.csv`` (the swept override keys come between ``job`` and ``seed``)
REPORT_COLUMNS = ("seed", "checkpoint_step", "step", "experiment", "dup_count", "n_items", "small_n", "mean_loss",
                  "ci_low", "ci_high", "ci_method", "effect", "effect_ci_low", "effect_ci_high", "effect_ci_method",
                  "p_value", "p_adjusted")

#: override keys shown by a fixed column already (``seed``, ``checkpoint_step``)
_SHOWN_KEYS = ("seed", "model.checkpoint_step")


def swept_keys(jobs: Sequence[Job]) -> List[str]:
    """The override keys that tell the jobs apart: keys whose value differs between jobs (or that a job lacks),
    plus the keys of ``hydra.sweeper.params``; keys with a fixed column (``seed``, ``model.checkpoint_step``)
    are left out. A single job's keys are all its overrides."""
    keys: List[str] = []
    for j in jobs:
        for k in (*j.overrides, *j.sweeper_keys):
            if k not in keys:
                keys.append(k)
    if len(jobs) > 1:
        keys = [k for k in keys if len({j.overrides.get(k) for j in jobs}) > 1
                or any(k in j.sweeper_keys for j in jobs)]
    return [k for k in keys if k not in _SHOWN_KEYS]


def column_name(key: str) -> str:
    """The report column of a swept override key (``override:<key>`` where it would clash with a fixed one)."""
    return f"override:{key}" if key in ("job",) + REPORT_COLUMNS else key


def job_label(job: Job, keys: Sequence[str]) -> str:
    """Legend label of a job: its seed, checkpoint-step and swept overrides (else its name)."""
    parts = [f"{k}={job.overrides[k]}" for k in (*_SHOWN_KEYS, *keys) if k in job.overrides]
    return " ".join(parts) or job.name


def _loss_effects(job: dict) -> Dict[tuple, dict]:
    """``(experiment, dup count) -> effect row`` of a finished job's ``insertion_loss`` contrasts ``dup d vs 0``
    (effect = loss(dup 0) - loss(dup d)): those of its ``results.json`` (``effects``), else computed from the per-item
    losses of its last step (Welch interval, randomization p, Holm over the experiment's dup counts)."""
    rows = [r for r in job.get("effects") or [] if r.get("eval_type") == "insertion_loss"
            and r.get("dup_count") is not None and str(r.get("contrast", "")).startswith("dup ")]
    if not rows and job.get("path"):
        losses = job_losses(Path(job["path"]))
        if len(losses):
            rows = [r for r in loss_effects(losses.to_dict("records")) if r["contrast"] != "trend"]
    return {(r["experiment"], r["dup_count"]): r for r in rows}


def report_rows(frame: pd.DataFrame, keys: Sequence[str]) -> List[dict]:
    """One row per (job, experiment, dup count) of the finished jobs of a
    :func:`~pretrain_exp.report.tables.sweep_frame` (:data:`REPORT_COLUMNS`)."""
    rows = []
    for j in frame[frame["status"] == "done"].to_dict("records"):
        base = {r["experiment"]: r.get("mean_loss") for r in j["per_dup"] if r.get("dup_count") == 0}
        effects = _loss_effects(j) if any(r.get("dup_count") for r in j["per_dup"]) else {}
        for r in j["per_dup"]:
            dup0, loss = base.get(r["experiment"]), r.get("mean_loss")
            e = effects.get((r["experiment"], r["dup_count"]), {})
            small = r.get("small_n")
            row = {"job": j["job"],
                   **{column_name(k): py(j.get(OVERRIDE_PREFIX + k)) or "" for k in keys},
                   "seed": py(j["seed"]), "checkpoint_step": py(j["checkpoint_step"]), "step": py(j["step"]),
                   "experiment": r["experiment"], "dup_count": r["dup_count"],
                   "n_items": r.get("n_items"), "mean_loss": loss, "ci_low": r.get("ci_low"),
                   "ci_high": r.get("ci_high"), "ci_method": r.get("ci_method"),
                   "small_n": small if small is not None or r.get("n_items") is None
                   else r["n_items"] < stats.MIN_ITEMS_PER_GROUP,
                   "effect": None if dup0 is None or loss is None else dup0 - loss,
                   **{k: e.get(k) for k in ("effect_ci_low", "effect_ci_high", "effect_ci_method", "p_value",
                                            "p_adjusted", "p_adjust_method")}}
            rows.append(row)
    return rows


#: metric columns of a sweep frame: ``<eval>/<experiment>/contamination_effect_acc``, ``<eval>/<exp>/dup<d>/acc``
_BENCH_EFFECT = re.compile(r"^(?P<task>[^/]+)/(?P<exp>.+)/contamination_effect_acc$")
_BENCH_ACC = re.compile(r"^(?P<task>[^/]+)/(?P<exp>.+)/dup(?P<dup>\d+)/acc$")

#: the columns of ``benchmark.csv``
BENCHMARK_COLUMNS = ("job", "seed", "step", "experiment", "n_clean", "n_contaminated", "acc_clean", "acc_contaminated",
                     "effect", "ci_low", "ci_high", "effect_ci_method", "p_value", "baseline_step", "clean_change",
                     "clean_change_ci_low", "clean_change_ci_high", "contaminated_change", "contaminated_change_ci_low",
                     "contaminated_change_ci_high")
#: the columns of the per-dup contamination table of ``report.md``
BENCHMARK_DUP_COLUMNS = ("job", "experiment", "dup_count", "n_items", "small_n", "acc", "ci_low", "ci_high",
                         "ci_method", "effect", "effect_ci_low", "effect_ci_high", "effect_ci_method", "p_value",
                         "p_adjusted", "change", "change_ci_low", "change_ci_high")


def _pooled_acc(per_dup: Sequence[dict]) -> tuple:
    """``(acc of dup 0, n, acc of every dup > 0 item together, n)`` of a benchmark's per-dup rows (item-weighted)."""
    clean = [r for r in per_dup if r.get("dup_count") == 0 and not missing(r.get("acc"))]
    hot = [r for r in per_dup if (r.get("dup_count") or 0) > 0 and not missing(r.get("acc"))]
    n_hot = sum(r["n_items"] for r in hot)
    return (clean[0]["acc"] if clean else None, clean[0]["n_items"] if clean else None,
            sum(r["acc"] * r["n_items"] for r in hot) / n_hot if n_hot else None, n_hot or None)


def benchmark_rows(frame: pd.DataFrame) -> List[dict]:
    """One row per (job, benchmark experiment) of the jobs of a :func:`~pretrain_exp.report.tables.sweep_frame`
    with a ``benchmark`` eval at their last step (:data:`BENCHMARK_COLUMNS`): acc of the clean (dup 0) items and of
    all contaminated (dup > 0) items together, weighted by item as the contamination effect acc(dup > 0) - acc(dup
    0) is (from the ``contamination`` entry of ``results.json``, :func:`pretrain_exp.report.summary.summarize`:
    Newcombe interval and randomization p), and with a baseline (``eval.on_load``) each side's mean change since
    the initial checkpoint with its t interval (the clean side: spillover). A job whose ``results.json`` has no
    ``contamination`` entry gets the effect of its metrics and the unweighted mean of its contaminated groups."""
    rows = []
    for j in frame[frame["status"] == "done"].to_dict("records"):
        contamination = j.get("contamination") or {}
        for task, c in contamination.items():
            acc_clean, n_clean, acc_hot, n_hot = _pooled_acc(c.get("per_dup") or [])
            e = (c.get("pooled_effects") or {}).get("acc") or {}
            change = {("clean" if r["dup_count"] == 0 else "contaminated"): r
                      for r in c.get("change_since_baseline") or [] if r.get("metric") == "acc"
                      and r["dup_count"] in (0, "> 0")}
            row = {"job": j["job"], "seed": py(j["seed"]), "step": py(j["step"]), "experiment": c.get("experiment"),
                   "n_clean": n_clean, "n_contaminated": n_hot, "acc_clean": acc_clean, "acc_contaminated": acc_hot,
                   "effect": e.get("effect"), "ci_low": e.get("effect_ci_low"), "ci_high": e.get("effect_ci_high"),
                   "effect_ci_method": e.get("effect_ci_method"), "p_value": e.get("p_value"),
                   "baseline_step": c.get("baseline_step")}
            for side, r in change.items():
                row.update({f"{side}_change": r.get("change"), f"{side}_change_ci_low": r.get("ci_low"),
                            f"{side}_change_ci_high": r.get("ci_high")})
            rows.append(row)
        accs: Dict[tuple, Dict[int, float]] = {}
        for key, v in j.items():
            a = _BENCH_ACC.match(key)
            if a and py(v) is not None:
                accs.setdefault((a["task"], a["exp"]), {})[int(a["dup"])] = py(v)
        for key, v in j.items():
            e = _BENCH_EFFECT.match(key)
            if not e or py(v) is None or e["task"] in contamination:  # NaN: a job without this benchmark
                continue
            by_dup = accs.get((e["task"], e["exp"]), {})
            hot = [a for d, a in by_dup.items() if d > 0]
            prefix = f"{e['task']}/{e['exp']}/contamination_effect_acc"
            rows.append({"job": j["job"], "seed": py(j["seed"]), "step": py(j["step"]), "experiment": e["exp"],
                         "acc_clean": by_dup.get(0), "acc_contaminated": sum(hot) / len(hot) if hot else None,
                         "effect": py(v), "ci_low": py(j.get(f"{prefix}_ci_low")),
                         "ci_high": py(j.get(f"{prefix}_ci_high"))})
    return rows


def benchmark_dup_rows(frame: pd.DataFrame) -> List[dict]:
    """One row per (job, benchmark experiment, dup count) (:data:`BENCHMARK_DUP_COLUMNS`): the group's acc with its
    Wilson interval, its ``acc`` effect against the clean items (Newcombe interval, randomization p, adjusted p) and,
    with a baseline, its change since the initial checkpoint; from the ``contamination`` entry of each job's
    ``results.json``."""
    rows = []
    for j in frame[frame["status"] == "done"].to_dict("records"):
        for c in (j.get("contamination") or {}).values():
            effects = {r["dup_count"]: r for r in c.get("effects") or [] if r.get("dup_count") is not None
                       and str(r.get("contrast", "")).startswith("dup ") and r.get("metric", "acc") == "acc"}
            change = {r["dup_count"]: r for r in c.get("change_since_baseline") or [] if r.get("metric") == "acc"}
            for r in c.get("per_dup") or []:
                e, ch = effects.get(r["dup_count"], {}), change.get(r["dup_count"], {})
                rows.append({"job": j["job"], "experiment": r["experiment"], "dup_count": r["dup_count"],
                             "n_items": r.get("n_items"), "small_n": r.get("small_n"), "acc": r.get("acc"),
                             "ci_low": r.get("ci_low"), "ci_high": r.get("ci_high"), "ci_method": r.get("ci_method"),
                             **{k: e.get(k) for k in ("effect", "effect_ci_low", "effect_ci_high",
                                                      "effect_ci_method", "p_value", "p_adjusted")},
                             "change": ch.get("change"), "change_ci_low": ch.get("ci_low"),
                             "change_ci_high": ch.get("ci_high")})
    return rows


def _md_row(r: dict, columns: Sequence[str]) -> str:
    """A markdown table line of ``r``: a missing interval bound reads ``n/a`` (no interval), other missing cells
    ``-``."""
    return "| " + " | ".join(NA if "ci_" in c and missing(r.get(c)) else md_cell(r.get(c)) for c in columns) + " |"


def _md_table(rows: Sequence[dict], columns: Sequence[str], right: Sequence[str] = ()) -> List[str]:
    return (["| " + " | ".join(columns) + " |", "|" + "|".join("--:" if c in right else "---" for c in columns) + "|"]
            + [_md_row(r, columns) for r in rows])


def _methods_note(rows: Sequence[dict], what: str) -> str:
    """One line naming the methods of the rows' intervals and tests and what ``small_n`` means."""
    parts = [f"{what}: {stats.LEVEL:.0%} CI {method_label(r.get('ci_method') for r in rows) or '-'}"]
    if any("effect_ci_method" in r for r in rows):
        parts.append(f"effect CI {method_label(r.get('effect_ci_method') for r in rows) or '-'}")
    if any("p_value" in r for r in rows):
        parts.append("p: randomization test of the dup labels (exact up to "
                     f"{stats.MAX_EXACT:,} relabellings), p_adjusted within each job's experiment")
    parts.append(f"small_n: fewer than {stats.MIN_ITEMS_PER_GROUP} items per group; n/a: no interval (n < 2 or no "
                 "spread)")
    return "; ".join(parts)


def report_markdown(title: str, rows: Sequence[dict], columns: Sequence[str], failed: Sequence[dict],
                    bench: Sequence[dict] = (), bench_dup: Sequence[dict] = ()) -> str:
    """``report.md``: the results table, the benchmark contamination tables (if any) and the failed jobs with
    their reasons."""
    out = [f"# {title}", "", f"{len({r['job'] for r in rows})} job(s) with results, {len(failed)} failed.", ""]
    right = {"seed", "checkpoint_step", "step", "dup_count", "n_items", "mean_loss", "ci_low", "ci_high", "effect",
             "effect_ci_low", "effect_ci_high", "p_value", "p_adjusted"}
    out += _md_table(rows, columns, right)
    if rows:
        out += ["", "effect = mean_loss(dup 0) - mean_loss(dup) in nats/token. " + _methods_note(rows, "mean_loss")]
    if bench:
        out += ["", "## Benchmark contamination", "",
                "acc_contaminated pools every dup > 0 item (the weighting of the effect); *_change: mean change of "
                "each item's acc since the initial checkpoint (eval.on_load; t interval), the clean side's is the "
                "spillover onto items never inserted.", ""]
        out += _md_table(bench, BENCHMARK_COLUMNS, set(BENCHMARK_COLUMNS) - {"job", "experiment", "effect_ci_method"})
    if bench_dup:
        out += ["", "### Per dup count", "", _methods_note(bench_dup, "acc"), ""]
        out += _md_table(bench_dup, BENCHMARK_DUP_COLUMNS,
                         set(BENCHMARK_DUP_COLUMNS) - {"job", "experiment", "ci_method", "effect_ci_method"})
    if failed:
        out += ["", "## Failed", "", "| job | overrides | reason |", "|---|---|---|"]
        out += [f"| {md_cell(f['job'])} | {md_cell(f['overrides'])} | {md_cell(f['reason'])} |" for f in failed]
    return "\n".join(out) + "\n"


def write_report(root: Path, out_dir: Optional[Path] = None) -> dict:
    """Collect every job under ``root`` and write ``report.csv``, ``report.md`` and ``effect_vs_dup.png`` into
    ``out_dir`` (default ``root``).

    :returns: ``{"jobs", "keys" (swept override keys), "rows", "columns", "failed", "paths", "cpdt"}``; ``cpdt``
        is the CPDT table (:func:`pretrain_exp.report.cpdt.write_cpdt_report`) of a CPDT run dir, else ``None``.
    :raises FileNotFoundError: if ``root`` is not a directory.
    :raises LookupError: if it holds no job dir and no submitit log of one.
    :raises PretrainExpError: for a CPDT run dir with an unfinished arm or an unreadable config.
    """
    root = Path(root).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such directory")
    jobs, orphans = collect(root)
    if not jobs and not orphans:
        raise LookupError(f"{root}: no job dirs (dirs with {RunDir.HYDRA}/ or {RunDir.CONFIG}) under it")
    done = [j for j in jobs if j.results is not None]
    keys = swept_keys(done or jobs)
    columns = ["job", *(column_name(k) for k in keys), *REPORT_COLUMNS]
    frame = sweep_frame(jobs)
    rows = report_rows(frame, keys)
    failed = [{"job": j.name, "overrides": " ".join(f"{k}={v}" for k, v in j.overrides.items()),
               "reason": j.reason} for j in jobs if j.results is None] + orphans
    out_dir = Path(out_dir).resolve() if out_dir is not None else root
    paths = {"csv": out_dir / "report.csv", "md": out_dir / "report.md", "png": out_dir / "loss_vs_dup.png"}
    write_text(paths["csv"], csv_text(rows, columns))
    what = (f"mean insertion loss by dup count ({stats.LEVEL:.0%} CI"
            + (f", {m}" if (m := method_label(r.get("ci_method") for r in rows)) else "") + ")")
    title = f"{root.name}: {what}"
    bench, bench_dup = benchmark_rows(frame), benchmark_dup_rows(frame)
    write_text(paths["md"], report_markdown(title, rows, columns, failed, bench, bench_dup))
    labels = {j.name: job_label(j, keys) for j in done}
    plot_effect_vs_dup(rows, labels, paths["png"], what, subtitle=root.name)
    steps = {(j.config.get("model") or {}).get("checkpoint_step") for j in done}

    def group(j):  # jobs that differ only by seed are pooled
        step = (j.config.get("model") or {}).get("checkpoint_step")
        return " ".join([f"{k}={j.overrides.get(k, '')}" for k in keys]
                        + ([f"model.checkpoint_step={step}"] if len(steps) > 1 else []))

    members = [{"group": group(j), "seed": int(j.config.get("seed", 0)), "path": j.path, "frame": load_run(j.path)}
               for j in done]  # each job's per-item rows read once for the three pooled tables
    pooled = pooled_effects(members)
    trend = pooled_trend(members) if pooled else []
    exact = pooled_exact_match(members)
    if pooled:
        paths |= {"pooled_csv": out_dir / "effect_pooled.csv", "pooled_png": out_dir / "effect_vs_dup.png",
                  "trend_csv": out_dir / "trend_pooled.csv"}
        write_text(paths["pooled_csv"], csv_text(pooled, POOLED_COLUMNS))
        write_text(paths["trend_csv"], csv_text(trend, TREND_COLUMNS))
        plot_pooled(pooled, paths["pooled_png"], "insertion effect pooled over seeds", subtitle=root.name,
                    trend=[t for t in trend if len({r["group"] for r in pooled}) == 1
                           and len({r["experiment"] for r in pooled}) == 1])
    if exact:
        paths |= {"exact_match_csv": out_dir / "exact_match_pooled.csv",
                  "exact_match_png": out_dir / "exact_match_vs_dup.png"}
        write_text(paths["exact_match_csv"], csv_text(exact, EXACT_MATCH_COLUMNS))
        plot_exact_match(exact, paths["exact_match_png"], "memorization (k-extractable) pooled over seeds",
                         subtitle=root.name)
    if pooled or exact:
        write_text(paths["md"], report_markdown(title, rows, columns, failed, bench, bench_dup)
                   + (pooled_markdown(pooled) + trend_markdown(trend) if pooled else "")
                   + exact_match_markdown(exact))
    if bench:
        paths |= {"benchmark_csv": out_dir / "benchmark.csv", "benchmark_png": out_dir / "benchmark.png"}
        write_text(paths["benchmark_csv"], csv_text(bench, BENCHMARK_COLUMNS))
        plot_benchmark(bench, labels, paths["benchmark_png"], "benchmark acc, clean vs contaminated (contamination "
                       f"effect, {stats.LEVEL:.0%} CI)", subtitle=root.name)
    for j in frame[frame["status"] == "done"].to_dict("records"):  # forgetting curves: insertion loss by step
        if len(j["by_step"]) > 1:
            name = re.sub(r"[^\w.-]+", "_", j["job"])
            paths[f"forgetting_{name}"] = out_dir / "forgetting" / f"{name}.png"
            plot_loss_vs_step({"run_name": py(j["run_name"]) or j["job"], "by_step": j["by_step"]},
                              paths[f"forgetting_{name}"])
    table = None
    if cpdt.is_cpdt_run(root):  # a CPDT run: its interactions
        table = cpdt.write_cpdt_report(root, out_dir=out_dir)
        paths |= {f"cpdt_{k}": Path(v) for k, v in table["paths"].items()}
    return {"jobs": jobs, "frame": frame, "keys": keys, "rows": rows, "columns": columns, "failed": failed,
            "paths": paths, "cpdt": table, "pooled": pooled, "trend": trend, "exact_match": exact}


def _section(title: str, note: str, rows: Sequence[dict], columns: Sequence[str], text: set) -> str:
    """A ``## title`` section of ``report.md``: ``note``, then the table of ``rows`` (``text`` columns left-aligned);
    ``""`` for no rows."""
    if not rows:
        return ""
    out = ["", f"## {title}", "", note, ""] + _md_table(rows, columns, set(columns) - text)
    return "\n".join(out) + "\n"


def pooled_markdown(rows: Sequence[dict]) -> str:
    """The ``## Effect pooled over seeds`` section of ``report.md``."""
    return _section("Effect pooled over seeds", pooled_note(rows), rows, POOLED_COLUMNS,
                    {"group", "experiment", "seeds", "ci_method", "p_method"})


def trend_markdown(rows: Sequence[dict]) -> str:
    """The ``## Dose response pooled over seeds`` section of ``report.md``
    (:func:`~pretrain_exp.report.pooled.pooled_trend`)."""
    note = ("slope = OLS slope of the per-item insertion loss on log(1 + dup count), all items of an experiment "
            "(controls included), per seed; mean over seeds in nats/token per unit of log(1 + dup); "
            f"{stats.LEVEL:.0%} CI: t over the per-seed slopes (S >= 3); p: exact sign-flip test over seeds")
    return _section("Dose response pooled over seeds", note, rows, TREND_COLUMNS,
                    {"group", "experiment", "seeds", "ci_method", "p_method", "seed_slopes"})


def exact_match_markdown(rows: Sequence[dict]) -> str:
    """The ``## Memorization pooled over seeds`` section of ``report.md``
    (:func:`~pretrain_exp.report.pooled.pooled_exact_match`)."""
    note = ("rate = k-extractable items (greedy continuation of the item's first k text tokens reproduces its next c "
            f"tokens exactly) over the items of all seeds; {stats.LEVEL:.0%} CI: Wilson over those items, treated as "
            "independent; seed_rates: each seed's rate")
    return _section("Memorization pooled over seeds", note, rows, EXACT_MATCH_COLUMNS,
                    {"group", "experiment", "seeds", "ci_method", "seed_rates"})


def pooled_note(rows: Sequence[dict]) -> str:
    """What the pooled table's numbers are: effect, interval (t over seeds, or not identified), sign-flip p and its
    floor, and the small-group flag."""
    note = (f"effect = loss(dup 0) - loss(dup) in nats/token, mean over seeds; {stats.LEVEL:.0%} CI: t over the "
            "per-seed effects (S >= 3); p: exact sign-flip test over seeds (min_p: the smallest p it can give)")
    few = sorted({r["n_seeds"] for r in rows if r["n_seeds"] <= 2})
    if few:
        note += (f"; seed variance not identified with {' or '.join(map(str, few))} seed(s): no interval (n/a), "
                 "run 3 or more seeds")
    if any(r.get("small_n") for r in rows):
        note += f"; small_n: fewer than {stats.MIN_ITEMS_PER_GROUP} items per dup group in a seed"
    return note
