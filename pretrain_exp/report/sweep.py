"""The sweep report: one table row per job, experiment and dup count, written as ``report.csv`` / ``report.md``.

:func:`write_report` finds every job dir under a dir, reads each job's ``results.json``, ``config.resolved.yaml``
and ``.hydra/overrides.yaml`` into one DataFrame row per job (:func:`pretrain_exp.report.tables.sweep_frame`,
the table :func:`pretrain_exp.load_sweep` returns), and writes ``report.csv`` / ``report.md`` (one row per job,
experiment and dup count, with ``effect = mean_loss(dup 0) - mean_loss(dup)``; the failed jobs with the last error
line of their logs) and ``effect_vs_dup.png`` (one line per job); with a ``benchmark`` eval also ``benchmark.csv`` /
``benchmark.png`` (acc clean vs contaminated, the contamination effect with its CI), and for jobs evaluated at
several steps the forgetting curves ``forgetting/<job>.png`` (insertion loss by step). For a CPDT run dir the jobs
are its arms, and its interaction table (:mod:`pretrain_exp.report.cpdt`) is rewritten too.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pandas as pd

from pretrain_exp.core.io import write_text
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.report import cpdt
from pretrain_exp.report.failures import collect
from pretrain_exp.report.jobs import Job
from pretrain_exp.report.plots import plot_benchmark, plot_effect_vs_dup, plot_loss_vs_step
from pretrain_exp.report.pooled import POOLED_COLUMNS, plot_pooled, pooled_effects
from pretrain_exp.report.tables import OVERRIDE_PREFIX, py, sweep_frame
from pretrain_exp.report.text import csv_text, md_cell

#: the fixed columns of ``report.csv`` (the swept override keys come between ``job`` and ``seed``)
REPORT_COLUMNS = ("seed", "checkpoint_step", "step", "experiment", "dup_count", "n_items", "mean_loss", "ci_low",
                  "ci_high", "effect")

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


def report_rows(frame: pd.DataFrame, keys: Sequence[str]) -> List[dict]:
    """One row per (job, experiment, dup count) of the finished jobs of a
    :func:`~pretrain_exp.report.tables.sweep_frame` (:data:`REPORT_COLUMNS`)."""
    rows = []
    for j in frame[frame["status"] == "done"].to_dict("records"):
        base = {r["experiment"]: r.get("mean_loss") for r in j["per_dup"] if r.get("dup_count") == 0}
        for r in j["per_dup"]:
            dup0, loss = base.get(r["experiment"]), r.get("mean_loss")
            row = {"job": j["job"],
                   **{column_name(k): py(j.get(OVERRIDE_PREFIX + k)) or "" for k in keys},
                   "seed": py(j["seed"]), "checkpoint_step": py(j["checkpoint_step"]), "step": py(j["step"]),
                   "experiment": r["experiment"], "dup_count": r["dup_count"],
                   "n_items": r.get("n_items"), "mean_loss": loss, "ci_low": r.get("ci_low"),
                   "ci_high": r.get("ci_high"),
                   "effect": None if dup0 is None or loss is None else dup0 - loss}
            rows.append(row)
    return rows


#: metric columns of a sweep frame: ``<eval>/<experiment>/contamination_effect_acc``, ``<eval>/<exp>/dup<d>/acc``
_BENCH_EFFECT = re.compile(r"^(?P<task>[^/]+)/(?P<exp>.+)/contamination_effect_acc$")
_BENCH_ACC = re.compile(r"^(?P<task>[^/]+)/(?P<exp>.+)/dup(?P<dup>\d+)/acc$")

#: the columns of ``benchmark.csv``
BENCHMARK_COLUMNS = ("job", "seed", "step", "experiment", "acc_clean", "acc_contaminated", "effect", "ci_low",
                     "ci_high")


def benchmark_rows(frame: pd.DataFrame) -> List[dict]:
    """One row per (job, benchmark experiment) of the jobs of a :func:`~pretrain_exp.report.tables.sweep_frame`
    with a ``benchmark`` eval at their last step (:data:`BENCHMARK_COLUMNS`): acc of the clean (dup 0) items, of the
    contaminated ones (dup > 0, the items' mean over the dup groups weighted equally) and the contamination effect
    acc(dup > 0) - acc(dup 0) with its bootstrap 95% CI (from :mod:`pretrain_exp.evals.benchmark`)."""
    rows = []
    for j in frame[frame["status"] == "done"].to_dict("records"):
        accs: Dict[tuple, Dict[int, float]] = {}
        for key, v in j.items():
            a = _BENCH_ACC.match(key)
            if a and py(v) is not None:
                accs.setdefault((a["task"], a["exp"]), {})[int(a["dup"])] = py(v)
        for key, v in j.items():
            e = _BENCH_EFFECT.match(key)
            if not e or py(v) is None:  # NaN: a job without this benchmark
                continue
            by_dup = accs.get((e["task"], e["exp"]), {})
            hot = [a for d, a in by_dup.items() if d > 0]
            prefix = f"{e['task']}/{e['exp']}/contamination_effect_acc"
            rows.append({"job": j["job"], "seed": py(j["seed"]), "step": py(j["step"]), "experiment": e["exp"],
                         "acc_clean": by_dup.get(0), "acc_contaminated": sum(hot) / len(hot) if hot else None,
                         "effect": py(v), "ci_low": py(j.get(f"{prefix}_ci_low")),
                         "ci_high": py(j.get(f"{prefix}_ci_high"))})
    return rows


def report_markdown(title: str, rows: Sequence[dict], columns: Sequence[str], failed: Sequence[dict],
                    bench: Sequence[dict] = ()) -> str:
    """``report.md``: the results table, the benchmark contamination table (if any) and the failed jobs with
    their reasons."""
    out = [f"# {title}", "", f"{len({r['job'] for r in rows})} job(s) with results, {len(failed)} failed.", ""]
    right = {"seed", "checkpoint_step", "step", "dup_count", "n_items", "mean_loss", "ci_low", "ci_high", "effect"}
    out += ["| " + " | ".join(columns) + " |", "|" + "|".join("--:" if c in right else "---" for c in columns) + "|"]
    out += ["| " + " | ".join(md_cell(r.get(c)) for c in columns) + " |" for r in rows]
    if bench:
        out += ["", "## Benchmark contamination", "", "| " + " | ".join(BENCHMARK_COLUMNS) + " |",
                "|---|--:|--:|---|" + "--:|" * (len(BENCHMARK_COLUMNS) - 4)]
        out += ["| " + " | ".join(md_cell(r.get(c)) for c in BENCHMARK_COLUMNS) + " |" for r in bench]
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
    title = f"{root.name}: mean insertion loss by dup count (95% CI)"
    bench = benchmark_rows(frame)
    write_text(paths["md"], report_markdown(title, rows, columns, failed, bench))
    labels = {j.name: job_label(j, keys) for j in done}
    plot_effect_vs_dup(rows, labels, paths["png"], title)
    steps = {(j.config.get("model") or {}).get("checkpoint_step") for j in done}

    def group(j):  # jobs that differ only by seed are pooled
        step = (j.config.get("model") or {}).get("checkpoint_step")
        return " ".join([f"{k}={j.overrides.get(k, '')}" for k in keys]
                        + ([f"model.checkpoint_step={step}"] if len(steps) > 1 else []))

    pooled = pooled_effects([{"group": group(j), "seed": int(j.config.get("seed", 0)), "path": j.path}
                             for j in done])
    if pooled:
        paths |= {"pooled_csv": out_dir / "effect_pooled.csv", "pooled_png": out_dir / "effect_vs_dup.png"}
        write_text(paths["pooled_csv"], csv_text(pooled, POOLED_COLUMNS))
        plot_pooled(pooled, paths["pooled_png"], f"{root.name}: insertion effect pooled over seeds (95% CI: "
                    "bootstrap over seeds and items)")
        write_text(paths["md"], report_markdown(title, rows, columns, failed, bench) + pooled_markdown(pooled))
    if bench:
        paths |= {"benchmark_csv": out_dir / "benchmark.csv", "benchmark_png": out_dir / "benchmark.png"}
        write_text(paths["benchmark_csv"], csv_text(bench, BENCHMARK_COLUMNS))
        plot_benchmark(bench, labels, paths["benchmark_png"], f"{root.name}: benchmark acc, clean vs contaminated "
                       "(contamination effect, 95% CI)")
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
            "paths": paths, "cpdt": table, "pooled": pooled}


def pooled_markdown(rows: Sequence[dict]) -> str:
    """The ``## Effect pooled over seeds`` section of ``report.md``."""
    out = ["", "## Effect pooled over seeds", "",
           "effect = loss(dup 0) - loss(dup) in nats/token, mean over seeds; 95% CI: two-stage bootstrap (seeds, "
           "then items within each seed)", "", "| " + " | ".join(POOLED_COLUMNS) + " |",
           "|---|---|" + "--:|" * (len(POOLED_COLUMNS) - 2)]
    out += ["| " + " | ".join(md_cell(r.get(c)) for c in POOLED_COLUMNS) + " |" for r in rows]
    return "\n".join(out) + "\n"
