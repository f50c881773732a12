"""Results of a run: ``results.json``, the loss-vs-dup-count plot and the console table.

``results.json`` holds ``per_dup``: one row ``{experiment, dup_count, n_items, mean_loss, ci_low, ci_high}``
per experiment and dup count, from the ``insertion_loss`` eval of the last evaluated step (95% bootstrap CIs
over items), plus the memorization rows, every eval's metrics by step, and the plan's size.

``python -m pretrain_exp.report <run or sweep dir> [--out DIR]`` (:func:`main`) reports a whole sweep: it finds
every job dir under the dir, reads each job's ``results.json``, ``config.resolved.yaml`` and
``.hydra/overrides.yaml``, and writes ``report.csv`` / ``report.md`` (one row per job, experiment and dup count,
with ``effect = mean_loss(dup 0) - mean_loss(dup)``; the failed jobs with the last error line of their logs) and
``effect_vs_dup.png`` (one line per job); with a ``benchmark`` eval also ``benchmark.csv`` / ``benchmark.png``
(acc clean vs contaminated, the contamination effect with its CI), and for jobs evaluated at several steps the
forgetting curves ``forgetting/<job>.png`` (insertion loss by step). For a CPDT run dir
(:mod:`pretrain_exp.app.cpdt`) the jobs are its arms, and its interaction table ``cpdt.json`` / ``cpdt.csv`` /
``cpdt.md`` / ``plots/cpdt.png`` is rewritten too.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from pretrain_exp.core.config import RunConfig
from pretrain_exp.core.errors import PretrainExpError
from pretrain_exp.core.io import atomic_path, write_json, write_text


def _task_of_type(cfg: RunConfig, kind: str):
    return next((name for name, t in cfg.eval.tasks.items() if t.type == kind), None)


def summarize(cfg: RunConfig, plan, evaluated_now: Dict[int, dict], evaluated_all: Dict[int, dict],
              wall_s: float) -> dict:
    """The ``results.json`` content (module docstring).

    :param evaluated_now: step -> task -> eval record, from this invocation (may be partial on resume).
    :param evaluated_all: step -> task -> eval record, everything in the run dir.
    """
    last = max(evaluated_all) if evaluated_all else None
    at_last = evaluated_all.get(last, {})
    loss_task, mem_task = _task_of_type(cfg, "insertion_loss"), _task_of_type(cfg, "memorization")
    window = [int(w) for w in plan.window]
    return {
        "run_name": cfg.run_name,
        "run_dir": str(Path(cfg.run_dir).resolve()),
        "framework": cfg.framework.name,
        "model": {"name": cfg.model.name, "asset": cfg.model.asset, "path": cfg.model.path,
                  "checkpoint_step": cfg.model.checkpoint_step},
        "seed": cfg.seed,
        "step": last,
        "plan": {"num_items": plan.num_items, "num_insertions": plan.num_insertions,
                 "inserted_tokens": int(plan.lengths.sum()), "window": window,
                 "inserted_fraction": float(plan.lengths.sum()) / max(1, window[1] - window[0]),
                 "experiments": plan.experiments},
        "per_dup": at_last.get(loss_task, {}).get("per_dup", []) if loss_task else [],
        "memorization": at_last.get(mem_task, {}).get("per_dup", []) if mem_task else [],
        "metrics": {task: rec.get("metrics", {}) for task, rec in at_last.items()},
        "by_step": {str(step): {task: rec.get("metrics", {}) for task, rec in tasks.items()}
                    for step, tasks in evaluated_all.items()},
        "steps_evaluated_now": sorted(evaluated_now),
        "wall_s": wall_s,
    }


def plot_per_dup(results: dict, path: Path) -> None:
    """PNG of mean insertion loss vs dup count (95% CI bars) at the last evaluated step, one line per
    experiment; written atomically."""
    rows = [dict(r, job=r["experiment"]) for r in results.get("per_dup", [])]
    plot_effect_vs_dup(rows, {}, path, f"{results.get('run_name')} at step {results.get('step')}")


_LOSS_KEY = re.compile(r"^(?P<exp>.+)/dup(?P<dup>\d+)/mean_loss$")


def plot_loss_vs_step(results: dict, path: Path) -> None:
    """PNG of mean insertion loss vs global step, one line per experiment and dup count, from every evaluated
    step (``results["by_step"]``): learning while an item is inserted, forgetting after its last insertion."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: Dict[Tuple[str, int], List[Tuple[int, float]]] = {}
    for step, tasks in results.get("by_step", {}).items():
        for metrics in tasks.values():
            for key, value in metrics.items():
                m = _LOSS_KEY.match(key)
                if m and value is not None:
                    series.setdefault((m["exp"], int(m["dup"])), []).append((int(step), value))
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    multi = len({e for e, _ in series}) > 1
    for (exp, dup), pts in sorted(series.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{exp + ' ' if multi else ''}dup {dup}")
    ax.set_xlabel("global step")
    ax.set_ylabel("mean loss per token (nats)")
    ax.set_title(f"{results.get('run_name')}: insertion loss by step", fontsize=9)
    if series:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    _save_png(fig, path)
    plt.close(fig)


def print_table(results: dict) -> None:
    """Print the per-dup table (loss with CI, memorization) and the held-out perplexity with rich."""
    from rich.console import Console
    from rich.table import Table

    mem = {(r["experiment"], r["dup_count"]): r for r in results.get("memorization", [])}
    table = Table(title=f"{results['run_name']}: insertion loss at step {results['step']} (95% bootstrap CI)")
    for col in ("experiment", "dup count", "items", "mean loss", "95% CI", "exact match", "matched tokens"):
        table.add_column(col, justify="left" if col == "experiment" else "right")

    def fmt(v, spec=".3f"):
        return "-" if v is None else format(v, spec)

    for r in results.get("per_dup", []):
        m = mem.get((r["experiment"], r["dup_count"]), {})
        table.add_row(r["experiment"], str(r["dup_count"]), str(r["n_items"]), fmt(r["mean_loss"]),
                      f"[{fmt(r['ci_low'])}, {fmt(r['ci_high'])}]", fmt(m.get("exact_match_rate"), ".2f"),
                      fmt(m.get("mean_matched_length"), ".1f"))
    console = Console(width=max(110, Console().width))
    console.print(table)
    for task, metrics in results.get("metrics", {}).items():
        if "held_out/perplexity" in metrics:
            console.print(f"held-out perplexity ({task}): {metrics['held_out/perplexity']:.2f} "
                          f"over {int(metrics.get('held_out/tokens', 0))} tokens")


# --- sweep reports: python -m pretrain_exp.report <run or sweep dir> [--out DIR] ---------------------------------

#: the fixed columns of ``report.csv`` (the swept override keys come between ``job`` and ``seed``)
REPORT_COLUMNS = ("seed", "checkpoint_step", "step", "experiment", "dup_count", "n_items", "mean_loss", "ci_low",
                  "ci_high", "effect")
#: override keys shown by a fixed column already (``seed``, ``checkpoint_step``)
_SHOWN_KEYS = ("seed", "model.checkpoint_step")
#: folders of a job dir (or a sweep dir) that never hold a job dir
_NOT_JOBS = {"checkpoints", "evals", "plots", "wandb"}
_SUBMITIT_LOG = re.compile(r"^(?P<job_id>.+)_(?P<rank>\d+)_log\.(?P<kind>out|err)$")
_LOG_LEVEL = re.compile(r"\]\[(ERROR|CRITICAL|WARNING)\] - ")


@dataclass
class Job:
    """One job dir of a sweep (or a single run dir) and what the report knows about it."""

    path: Path
    name: str  #: path relative to the report root (the dir name for a single run)
    overrides: Dict[str, str] = field(default_factory=dict)  #: ``.hydra/overrides.yaml`` as key -> value
    hydra_job: dict = field(default_factory=dict)  #: ``hydra.job`` of ``.hydra/hydra.yaml`` (id, num)
    sweeper_keys: List[str] = field(default_factory=list)  #: keys of ``hydra.sweeper.params``
    config: dict = field(default_factory=dict)  #: ``config.resolved.yaml``
    results: Optional[dict] = None  #: ``results.json``; None if the job has none (failed or running)
    reason: str = ""  #: why there are no results (the last error line found in the job's logs)


def _natural_key(text: str):
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", text)]


def _is_job_dir(path: Path) -> bool:
    return (path / ".hydra").is_dir() or (path / "config.resolved.yaml").is_file()


def _walk(root: Path) -> Tuple[List[Path], List[Path]]:
    """(job dirs, ``.submitit`` dirs) under ``root``; job dirs, hidden dirs and run outputs are not entered."""
    jobs, submitit = [], []
    for dirpath, dirnames, _ in os.walk(root):
        here = Path(dirpath)
        if here != root and _is_job_dir(here):
            jobs.append(here)
            dirnames[:] = []
            continue
        submitit += [here / d for d in dirnames if d == ".submitit"]
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d not in _NOT_JOBS]
    return sorted(jobs, key=lambda p: _natural_key(str(p.relative_to(root)))), sorted(submitit)


def find_job_dirs(root: Path) -> List[Path]:
    """Every job dir under ``root`` (a dir with ``.hydra/`` or ``config.resolved.yaml``; ``root`` itself if it is
    one), in natural order (``2`` before ``10``). Hidden folders (``.submitit``) and run outputs are skipped."""
    root = Path(root)
    return [root] if _is_job_dir(root) and not (root / "arms").is_dir() else _walk(root)[0]


def _read_yaml(path: Path):
    import yaml

    try:
        return yaml.safe_load(path.read_text()) if path.is_file() else None
    except (OSError, yaml.YAMLError):
        return None


def _override_key(override: str) -> Tuple[str, str]:
    key, _, value = override.partition("=")
    return key.lstrip("+~"), value


def load_job(path: Path, root: Path) -> Job:
    """Read one job dir: overrides, Hydra job id/num, resolved config and ``results.json`` (if any)."""
    path = Path(path)
    name = path.name if path == Path(root) else str(path.relative_to(root))
    job = Job(path=path, name=name)
    job.overrides = dict(_override_key(str(o)) for o in _read_yaml(path / ".hydra" / "overrides.yaml") or [])
    hydra_cfg = (_read_yaml(path / ".hydra" / "hydra.yaml") or {}).get("hydra", {}) or {}
    job.hydra_job = hydra_cfg.get("job", {}) or {}
    params = (hydra_cfg.get("sweeper", {}) or {}).get("params") or {}
    job.sweeper_keys = [_override_key(str(k))[0] for k in params]
    job.config = _read_yaml(path / "config.resolved.yaml") or {}
    res = path / "results.json"
    if res.is_file():
        try:
            job.results = json.loads(res.read_text())
        except (OSError, ValueError) as e:
            job.reason = f"unreadable results.json ({e})"
    return job


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


def _column_name(key: str) -> str:
    return f"override:{key}" if key in ("job",) + REPORT_COLUMNS else key


def job_label(job: Job, keys: Sequence[str]) -> str:
    """Legend label of a job: its seed, checkpoint-step and swept overrides (else its name)."""
    parts = [f"{k}={job.overrides[k]}" for k in (*_SHOWN_KEYS, *keys) if k in job.overrides]
    return " ".join(parts) or job.name


def report_rows(jobs: Sequence[Job], keys: Sequence[str]) -> List[dict]:
    """One row per (job, experiment, dup count) of the jobs with results (:data:`REPORT_COLUMNS`)."""
    rows = []
    for j in jobs:
        res = j.results
        if res is None:
            continue
        step0 = (res.get("model") or {}).get("checkpoint_step", (j.config.get("model") or {}).get("checkpoint_step"))
        base = {r["experiment"]: r.get("mean_loss") for r in res.get("per_dup", []) if r.get("dup_count") == 0}
        for r in res.get("per_dup", []):
            dup0, loss = base.get(r["experiment"]), r.get("mean_loss")
            row = {"job": j.name, **{_column_name(k): j.overrides.get(k, "") for k in keys},
                   "seed": res.get("seed", j.config.get("seed")),
                   "checkpoint_step": step0,
                   "step": res.get("step"), "experiment": r["experiment"], "dup_count": r["dup_count"],
                   "n_items": r.get("n_items"), "mean_loss": loss, "ci_low": r.get("ci_low"),
                   "ci_high": r.get("ci_high"),
                   "effect": None if dup0 is None or loss is None else dup0 - loss}
            rows.append(row)
    return rows


_BENCH_EFFECT = re.compile(r"^(?P<exp>.+)/contamination_effect_acc$")
_BENCH_ACC = re.compile(r"^(?P<exp>.+)/dup(?P<dup>\d+)/acc$")
#: the columns of ``benchmark.csv``
BENCHMARK_COLUMNS = ("job", "seed", "step", "experiment", "acc_clean", "acc_contaminated", "effect", "ci_low",
                     "ci_high")


def benchmark_rows(jobs: Sequence[Job]) -> List[dict]:
    """One row per (job, benchmark experiment) of the jobs with a ``benchmark`` eval at their last step
    (:data:`BENCHMARK_COLUMNS`): acc of the clean (dup 0) items, of the contaminated ones (dup > 0, the items'
    mean over the dup groups weighted equally) and the contamination effect acc(dup > 0) - acc(dup 0) with its
    bootstrap 95% CI (from :mod:`evals.benchmark`)."""
    rows = []
    for j in jobs:
        for task, m in ((j.results or {}).get("metrics") or {}).items():
            accs: Dict[str, Dict[int, float]] = {}
            for key, v in m.items():
                a = _BENCH_ACC.match(key)
                if a and v is not None:
                    accs.setdefault(a["exp"], {})[int(a["dup"])] = v
            for key, v in m.items():
                e = _BENCH_EFFECT.match(key)
                if not e:
                    continue
                by_dup = accs.get(e["exp"], {})
                hot = [a for d, a in by_dup.items() if d > 0]
                rows.append({"job": j.name, "seed": j.results.get("seed"), "step": j.results.get("step"),
                             "experiment": e["exp"], "acc_clean": by_dup.get(0),
                             "acc_contaminated": sum(hot) / len(hot) if hot else None, "effect": v,
                             "ci_low": m.get(f"{e['exp']}/contamination_effect_acc_ci_low"),
                             "ci_high": m.get(f"{e['exp']}/contamination_effect_acc_ci_high")})
    return rows


def plot_benchmark(rows: Sequence[dict], labels: Dict[str, str], path: Path, title: str) -> None:
    """PNG of benchmark acc, clean (dup 0) vs contaminated (dup > 0), one pair of bars per job and experiment,
    with the contamination effect and its 95% CI written above; written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(4.5, 1.2 * len(rows) + 2), 3.8))
    x = list(range(len(rows)))
    ax.bar([i - 0.2 for i in x], [r["acc_clean"] or 0 for r in rows], width=0.4, label="clean (dup 0)")
    ax.bar([i + 0.2 for i in x], [r["acc_contaminated"] or 0 for r in rows], width=0.4, label="contaminated")
    for i, r in enumerate(rows):
        top = max(r["acc_clean"] or 0, r["acc_contaminated"] or 0)
        ax.annotate(f"{_fmt(r['effect'], '+.3f')} [{_fmt(r['ci_low'], '+.3f')}, {_fmt(r['ci_high'], '+.3f')}]",
                    (i, top), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=7)
    ax.set_xticks(x, [f"{labels.get(r['job'], r['job'])}\n{r['experiment']}" for r in rows], fontsize=7)
    ax.set_ylabel("acc")
    ax.set_ylim(0, 1.1)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    _save_png(fig, path)
    plt.close(fig)


def last_error_line(text: str) -> Tuple[int, str]:
    """The most telling failure line of a log: ``(priority, line)``, higher is better, ``(0, "")`` if none.

    Priority 4: the last ``error: ...`` line or log record (what the entry point prints, and logs in a sweep, for
    an error of the user's making; SLURM's ``slurmstepd: error: ...``); 3: the exception line closing the last
    Python traceback; 2: the last ERROR/CRITICAL log record; 1: the last WARNING log record (e.g. a failed
    training attempt before a retry).
    """
    best: Dict[int, str] = {}
    in_tb = False
    for line in text.splitlines():
        s = line.strip()
        if not s:
            continue
        if s.startswith("Traceback (most recent call last)"):
            in_tb = True
            continue
        if in_tb and not line[:1].isspace():
            best[3] = s
            in_tb = False
        m = _LOG_LEVEL.search(s)
        msg = s[m.end():] if m else s  # a log record: its message
        if msg.startswith("error: ") or " error: " in msg:
            best[4] = msg
        elif m:
            best[1 if m[1] == "WARNING" else 2] = msg
    if not best:
        return 0, ""
    top = max(best)
    return top, best[top]


def _read_log(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def submitit_logs(root: Path) -> List[Path]:
    """Hydra submitit launcher logs of the sweep(s) under ``root`` (of the sweep holding ``root`` if it is a job
    dir): ``<sweep>/.submitit/<slurm job id>/<id>_<task>_log.{err,out}``."""
    root = Path(root)
    dirs = [root.parent / ".submitit"] if _is_job_dir(root) else _walk(root)[1]
    return sorted(p for d in dirs if d.is_dir() for p in d.glob("*/*_log.*") if _SUBMITIT_LOG.match(p.name))


def _log_job_id(path: Path) -> Tuple[str, str]:
    """(submitit job id, array task index or "") of a submitit log file name ``<jobid>_<rank>_log.<kind>``."""
    job_id = _SUBMITIT_LOG.match(path.name)["job_id"]
    task = job_id.rsplit("_", 1)[1] if re.fullmatch(r"\d+_\d+", job_id) else ""
    return job_id, task


def match_logs(job: Job, logs: Sequence[Path], texts: Dict[Path, str]) -> List[Path]:
    """The submitit logs of ``job``: by the Hydra job id the launcher recorded in ``.hydra/hydra.yaml`` (the
    submitit job id), else by the job dir's path printed in the log, else by the Hydra job number (= array task
    index for a sweep submitted as one array)."""
    job_id = str(job.hydra_job.get("id", ""))
    by_id = [p for p in logs if _log_job_id(p)[0] == job_id]
    if by_id:
        return by_id
    path = str(job.path.resolve())
    by_path = [p for p in logs if re.search(re.escape(path) + r"(?![\w/.-])", texts[p])]
    if by_path:
        return by_path
    num = job.hydra_job.get("num")
    return [p for p in logs if num is not None and _log_job_id(p)[1] == str(num)]


def failure_reason(job: Job, logs: Sequence[Path]) -> str:
    """Why ``job`` has no results: the best error line (:func:`last_error_line`) of its submitit ``.err``/
    ``.out`` logs and its own log file, naming the file it came from."""
    candidates = sorted(logs, key=lambda p: (not p.name.endswith(".err"), str(p)))
    candidates += sorted(job.path.glob("*.log"))
    best, where = (0, ""), None
    for p in candidates:
        found = last_error_line(_read_log(p))
        if found[0] > best[0]:
            best, where = found, p
    if where is None:
        return "no results.json and no error in its logs (still running, or killed?)"
    return f"{best[1]} ({where.name})"


def collect(root: Path) -> Tuple[List[Job], List[dict]]:
    """Jobs under ``root`` (with the failure reason of those without results) and the failures known only from
    submitit logs (a job whose dir was removed after an error of the user's making): ``[{job, reason}]``."""
    root = Path(root)
    jobs = [load_job(p, root) for p in find_job_dirs(root)]
    logs = submitit_logs(root)
    texts = {p: _read_log(p) for p in logs}
    used = set()
    for j in jobs:
        mine = match_logs(j, logs, texts)
        used.update(mine)
        if j.results is None:
            j.reason = j.reason or failure_reason(j, mine)
    orphans: List[dict] = []
    if _is_job_dir(root):  # the other logs of the sweep belong to its other jobs
        return jobs, orphans
    by_id: Dict[str, List[Path]] = {}
    for p in logs:
        if p not in used:
            by_id.setdefault(_log_job_id(p)[0], []).append(p)
    for job_id, paths in sorted(by_id.items(), key=lambda kv: _natural_key(kv[0])):
        found = max((last_error_line(texts[p]) + (p,) for p in paths), key=lambda t: (t[0], t[2].name.endswith(".err")))
        if found[0] >= 3:
            orphans.append({"job": f"submitit job {job_id} (no job dir)", "overrides": "",
                            "reason": f"{found[1]} ({found[2].relative_to(root)})"})
    return jobs, orphans


def _fmt(v, spec: str = ".4f") -> str:
    if v is None:
        return "-"
    return format(v, spec) if isinstance(v, float) else str(v)


def _md_cell(v) -> str:
    return _fmt(v).replace("|", "\\|")


def report_markdown(title: str, rows: Sequence[dict], columns: Sequence[str], failed: Sequence[dict],
                    bench: Sequence[dict] = ()) -> str:
    """``report.md``: the results table, the benchmark contamination table (if any) and the failed jobs with
    their reasons."""
    out = [f"# {title}", "", f"{len({r['job'] for r in rows})} job(s) with results, {len(failed)} failed.", ""]
    right = {"seed", "checkpoint_step", "step", "dup_count", "n_items", "mean_loss", "ci_low", "ci_high", "effect"}
    out += ["| " + " | ".join(columns) + " |", "|" + "|".join("--:" if c in right else "---" for c in columns) + "|"]
    out += ["| " + " | ".join(_md_cell(r.get(c)) for c in columns) + " |" for r in rows]
    if bench:
        out += ["", "## Benchmark contamination", "", "| " + " | ".join(BENCHMARK_COLUMNS) + " |",
                "|---|--:|--:|---|" + "--:|" * (len(BENCHMARK_COLUMNS) - 4)]
        out += ["| " + " | ".join(_md_cell(r.get(c)) for c in BENCHMARK_COLUMNS) + " |" for r in bench]
    if failed:
        out += ["", "## Failed", "", "| job | overrides | reason |", "|---|---|---|"]
        out += [f"| {_md_cell(f['job'])} | {_md_cell(f['overrides'])} | {_md_cell(f['reason'])} |" for f in failed]
    return "\n".join(out) + "\n"


def plot_effect_vs_dup(rows: Sequence[dict], labels: Dict[str, str], path: Path, title: str) -> None:
    """PNG of mean loss vs dup count (95% CI bars), one line per job (and experiment); written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    series: Dict[Tuple[str, str], List[dict]] = {}
    for r in rows:
        series.setdefault((r["job"], r["experiment"]), []).append(r)
    experiments = {e for _, e in series}
    for (job, exp), rs in series.items():
        rs = sorted((r for r in rs if r["mean_loss"] is not None), key=lambda r: r["dup_count"])
        y = [r["mean_loss"] for r in rs]
        lo = [r["mean_loss"] - (r["ci_low"] if r["ci_low"] is not None else r["mean_loss"]) for r in rs]
        hi = [(r["ci_high"] if r["ci_high"] is not None else r["mean_loss"]) - r["mean_loss"] for r in rs]
        label = labels.get(job, job)
        if len(experiments) > 1 and exp != label:
            label += f" / {exp}"
        ax.errorbar([r["dup_count"] for r in rs], y, yerr=[lo, hi], marker="o", capsize=3, label=label, alpha=0.85)
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlabel("dup count (0 = never-inserted control)")
    ax.set_ylabel("mean loss per token (nats)")
    ax.set_title(title, fontsize=9)
    if series:
        ax.legend(fontsize=7, ncol=1 if len(series) <= 8 else 2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    _save_png(fig, path)
    plt.close(fig)


def _save_png(fig, path: Path) -> None:
    """Save a matplotlib figure as PNG atomically."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120)


def write_report(root: Path, out_dir: Optional[Path] = None) -> dict:
    """Collect every job under ``root`` and write ``report.csv``, ``report.md`` and ``effect_vs_dup.png`` into
    ``out_dir`` (default ``root``).

    :returns: ``{"jobs", "keys" (swept override keys), "rows", "columns", "failed", "paths"}``.
    :raises FileNotFoundError: if ``root`` is not a directory.
    :raises LookupError: if it holds no job dir and no submitit log of one.
    """
    root = Path(root).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such directory")
    jobs, orphans = collect(root)
    if not jobs and not orphans:
        raise LookupError(f"{root}: no job dirs (dirs with .hydra/ or config.resolved.yaml) under it")
    done = [j for j in jobs if j.results is not None]
    keys = swept_keys(done or jobs)
    columns = ["job", *(_column_name(k) for k in keys), *REPORT_COLUMNS]
    rows = report_rows(done, keys)
    failed = [{"job": j.name, "overrides": " ".join(f"{k}={v}" for k, v in j.overrides.items()),
               "reason": j.reason} for j in jobs if j.results is None] + orphans
    out_dir = Path(out_dir).resolve() if out_dir is not None else root
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows({c: ("" if r.get(c) is None else r.get(c)) for c in columns} for r in rows)
    paths = {"csv": out_dir / "report.csv", "md": out_dir / "report.md", "png": out_dir / "effect_vs_dup.png"}
    write_text(paths["csv"], buf.getvalue())
    title = f"{root.name}: mean insertion loss by dup count (95% CI)"
    write_text(paths["md"], report_markdown(title, rows, columns, failed, benchmark_rows(done)))
    labels = {j.name: job_label(j, keys) for j in done}
    plot_effect_vs_dup(rows, labels, paths["png"], title)
    bench = benchmark_rows(done)
    if bench:
        paths |= {"benchmark_csv": out_dir / "benchmark.csv", "benchmark_png": out_dir / "benchmark.png"}
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=BENCHMARK_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows({c: ("" if r.get(c) is None else r.get(c)) for c in BENCHMARK_COLUMNS} for r in bench)
        write_text(paths["benchmark_csv"], buf.getvalue())
        plot_benchmark(bench, labels, paths["benchmark_png"], f"{root.name}: benchmark acc, clean vs contaminated "
                       "(contamination effect, 95% CI)")
    for j in done:  # forgetting curves: insertion loss by step, one figure per job
        if len(j.results.get("by_step", {})) > 1:
            name = re.sub(r"[^\w.-]+", "_", j.name)
            paths[f"forgetting_{name}"] = out_dir / "forgetting" / f"{name}.png"
            plot_loss_vs_step(j.results, paths[f"forgetting_{name}"])
    if (root / "arms").is_dir() and (root / "config.resolved.yaml").is_file():  # a CPDT run: its interactions
        from pretrain_exp.app.cpdt import print_cpdt, write_cpdt_report

        table = write_cpdt_report(root, out_dir=out_dir)
        print_cpdt(table)
        paths |= {f"cpdt_{k}": Path(v) for k, v in table["paths"].items()}
    return {"jobs": jobs, "keys": keys, "rows": rows, "columns": columns, "failed": failed, "paths": paths}


def _print_report(rep: dict) -> None:
    """Print the report's table (compact headers; report.md has the CSV's) and failures with rich, then the paths."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(140, Console().width))
    keys = rep["keys"]
    short = [k.rsplit(".", 1)[-1] for k in keys]  # a dotted override key by its last part where that is unique
    done = sum(1 for j in rep["jobs"] if j.results is not None)
    if rep["rows"]:
        table = Table(title=f"{done} job(s): mean insertion loss by dup count (95% bootstrap CI); "
                            "effect = loss(dup 0) - loss(dup)")
        table.add_column("job", no_wrap=True)
        names = [name if short.count(name) == 1 else k for k, name in zip(keys, short)]
        one = len(keys) > 2  # many swept keys: one "overrides" column of name=value pairs
        for name in ["overrides"] if one else names:
            table.add_column(name, overflow="fold")
        for c in ("seed", "ckpt step", "step", "experiment", "dup", "items", "mean loss", "95% CI", "effect"):
            table.add_column(c, no_wrap=True, justify="left" if c == "experiment" else "right")
        for r in rep["rows"]:
            values = [_fmt(r.get(_column_name(k))) for k in keys]
            if one:
                values = [" ".join(f"{n}={v}" for n, v in zip(names, values) if v not in ("", "-"))]
            table.add_row(str(r["job"]), *values, _fmt(r["seed"]), _fmt(r["checkpoint_step"]),
                          _fmt(r["step"]), r["experiment"], _fmt(r["dup_count"]), _fmt(r["n_items"]),
                          _fmt(r["mean_loss"]), f"[{_fmt(r['ci_low'])}, {_fmt(r['ci_high'])}]", _fmt(r["effect"]))
        console.print(table)
    else:
        console.print(f"{done} job(s) with results, no per-dup rows (no insertion experiment finished)")
    if rep["failed"]:
        failed = Table(title="failed")
        for c in ("job", "overrides", "reason"):
            failed.add_column(c, overflow="fold")
        for f in rep["failed"]:
            failed.add_row(f["job"], f["overrides"], f["reason"])
        console.print(failed)
    for p in rep["paths"].values():
        print(f"wrote {p}")


def log_report_wandb(rep: dict, out_dir: Path, mode: str, project: str) -> Optional[Path]:
    """Log a report to its own W&B run ``report-<dir name>``: every CSV written as a ``wandb.Table`` (key
    ``report/<name>``) and every PNG as a ``wandb.Image`` (key ``plots/<name>``).

    :param mode: ``offline`` (written under ``<out_dir>/wandb``) or ``online`` (offline without an API key).
    :returns: the W&B run dir, or ``None`` if nothing was logged.
    """
    import wandb

    from pretrain_exp.app.tracking import _has_wandb_key

    if mode == "online" and not _has_wandb_key():
        mode = "offline"
    out_dir = Path(out_dir)
    os.environ.setdefault("WANDB_SILENT", "true")
    run = wandb.init(project=project, name=f"report-{out_dir.resolve().name}", dir=str(out_dir), mode=mode)
    logged = {}
    for name, path in rep["paths"].items():
        path = Path(path)
        if path.suffix == ".png" and path.is_file():
            logged[f"plots/{name}"] = wandb.Image(str(path))
        elif path.suffix == ".csv" and path.is_file():
            with open(path, newline="") as f:
                rows = list(csv.reader(f))
            if rows:
                logged[f"report/{name}"] = wandb.Table(columns=rows[0], data=rows[1:], allow_mixed_types=True)
    if logged:
        run.log(logged)
    run_dir = Path(run.dir).parent
    run.finish()
    return run_dir if logged else None


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m pretrain_exp.report <run or sweep dir> [--out DIR]``; returns the exit status: 0 if at least
    one job has results, 1 if none has (the report of the failures is still written), 2 if the dir holds no
    jobs (one ``error: ...`` line)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m pretrain_exp.report",
        description="Tables and plots of every job of a sweep (or of one run): report.csv, report.md and "
                    "effect_vs_dup.png, plus the failed jobs with the last error line of their logs.")
    parser.add_argument("dir", type=Path, help="a sweep dir (hydra.sweep.dir) or a run dir")
    parser.add_argument("--out", type=Path, default=None, help="where to write the report (default: DIR)")
    parser.add_argument("--wandb", choices=("disabled", "offline", "online"), default="disabled",
                        help="also log the report's tables and figures to a W&B run 'report-<dir name>' "
                             "(offline: under <out>/wandb, `wandb sync` uploads it)")
    parser.add_argument("--wandb-project", default="pretrain_exp", help="W&B project of that run")
    args = parser.parse_args(argv)
    try:
        rep = write_report(args.dir, args.out)
    except (FileNotFoundError, LookupError, PretrainExpError) as e:  # e.g. an unfinished CPDT arm
        print(f"error: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2
    _print_report(rep)
    if args.wandb != "disabled":
        log_report_wandb(rep, args.out or args.dir, args.wandb, args.wandb_project)
    if not rep["rows"] and all(j.results is None for j in rep["jobs"]):
        print(f"error: {Path(args.dir).resolve()}: no job has results.json ({len(rep['failed'])} failed)",
              file=sys.stderr)
        return 1
    return 0
