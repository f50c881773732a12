"""``python -m pretrain_exp.report <run or sweep dir> [--out DIR] [--wandb MODE]``: the report command line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional, Sequence

from pretrain_exp.core.commands import prog
from pretrain_exp.core.errors import PretrainExpError
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.report.cpdt import print_cpdt
from pretrain_exp.report.sweep import column_name, write_report
from pretrain_exp.report.text import SMALL_N_MARK, fmt, fmt_ci, fmt_items, fmt_p, method_label
from pretrain_exp.report.wandb_log import log_report_wandb


def print_report(rep: dict) -> None:
    """Print a report (:func:`~pretrain_exp.report.sweep.write_report`) with rich: the CPDT table of a CPDT run,
    the report's table (compact headers; report.md has the CSV's) with each effect's interval and p, the effect
    pooled over seeds, and failures, then the paths written. Items marked ``*``: fewer than
    ``MIN_ITEMS_PER_GROUP`` per group; ``n/a``: no interval."""
    from rich.console import Console
    from rich.table import Table

    from pretrain_exp.core import stats

    if rep.get("cpdt") is not None:
        print_cpdt(rep["cpdt"])

    console = Console(width=max(180, Console().width))
    keys = rep["keys"]
    short = [k.rsplit(".", 1)[-1] for k in keys]  # a dotted override key by its last part where that is unique
    done = sum(1 for j in rep["jobs"] if j.results is not None)
    level = f"{stats.LEVEL:.0%}"
    if rep["rows"]:
        rows = rep["rows"]
        ci = method_label(r.get("ci_method") for r in rows) or "t"
        eci = method_label(r.get("effect_ci_method") for r in rows) or "Welch t"
        table = Table(title=f"{done} job(s): mean insertion loss by dup count; effect = loss(dup 0) - loss(dup)")
        table.add_column("job", overflow="fold", min_width=8)
        names = [name if short.count(name) == 1 else k for k, name in zip(keys, short)]
        one = len(keys) > 2  # many swept keys: one "overrides" column of name=value pairs
        for name in ["overrides"] if one else names:
            table.add_column(name, overflow="fold", min_width=8)
        for c in ("seed", "ckpt step", "step", "experiment", "dup", "items", "mean loss", f"{level} CI ({ci})",
                  "effect", f"{level} CI ({eci})", "p", "p adj."):
            table.add_column(c, no_wrap=c != "experiment", overflow="fold",
                             justify="left" if c == "experiment" else "right")
        for r in rows:
            values = [fmt(r.get(column_name(k))) for k in keys]
            if one:
                values = [" ".join(f"{n}={v}" for n, v in zip(names, values) if v not in ("", "-"))]
            first = r["dup_count"] == 0
            table.add_row(str(r["job"]), *values, fmt(r["seed"]), fmt(r["checkpoint_step"]),
                          fmt(r["step"]), r["experiment"], fmt(r["dup_count"]), fmt_items(r["n_items"], r["small_n"]),
                          fmt(r["mean_loss"]), fmt_ci(r["ci_low"], r["ci_high"], ".4f"), fmt(r["effect"]),
                          "-" if first else fmt_ci(r.get("effect_ci_low"), r.get("effect_ci_high"), ".4f"),
                          "-" if first else fmt_p(r.get("p_value")), "-" if first else fmt_p(r.get("p_adjusted")))
        console.print(table)
        adjust = sorted({r.get("p_adjust_method") for r in rows} - {None})
        console.print(f"p: randomization test of the dup labels (exact up to {stats.MAX_EXACT:,} relabellings); "
                      f"p adj.: {'/'.join(adjust) or '-'} over each job's dup counts of an experiment")
        if any(r["small_n"] for r in rows):
            console.print(f"{SMALL_N_MARK} fewer than {stats.MIN_ITEMS_PER_GROUP} items per dup group: wide "
                          "intervals, coarse exact p-values")
    else:
        console.print(f"{done} job(s) with results, no per-dup rows (no insertion experiment finished)")
    if rep.get("pooled"):
        from pretrain_exp.report.sweep import pooled_note

        pooled = Table(title="effect pooled over seeds: loss(dup 0) - loss(dup), nats/token")
        for c in ("group", "experiment", "dup", "seeds", "items/seed", "effect", f"{level} CI (t over seeds)",
                  "p (sign-flip)", "min p"):
            pooled.add_column(c, justify="left" if c in ("group", "experiment") else "right", overflow="fold")
        for r in rep["pooled"]:
            pooled.add_row(r["group"], r["experiment"], fmt(r["dup_count"]), r["seeds"],
                           fmt_items(r["n_items"], r.get("small_n")), fmt(r["effect"]),
                           fmt_ci(r["ci_low"], r["ci_high"], ".4f"), fmt_p(r.get("p_value")), fmt_p(r.get("min_p")))
        console.print(pooled)
        console.print(pooled_note(rep["pooled"]))
    if rep["failed"]:
        failed = Table(title="failed")
        for c in ("job", "overrides", "reason"):
            failed.add_column(c, overflow="fold")
        for f in rep["failed"]:
            failed.add_row(f["job"], f["overrides"], f["reason"])
        console.print(failed)
    for p in rep["paths"].values():
        print(f"wrote {p}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m pretrain_exp.report <run or sweep dir> [--out DIR]`` (or ``export-lm-eval ...``,
    :func:`pretrain_exp.report.lm_eval_export.main`); returns the exit status: 0 if at least
    one job has results, 1 if none has (the report of the failures is still written), 2 if the dir holds no
    jobs (one ``error: ...`` line)."""
    import argparse

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["export-lm-eval"]:
        from pretrain_exp.report.lm_eval_export import main as export_main

        return export_main(argv[1:])
    parser = argparse.ArgumentParser(
        prog=prog("pretrain-exp-report", "pretrain_exp.report"),
        epilog="export-lm-eval <run dir> <out dir> (or pretrain-exp-export-lm-eval): the run's inserted items as an "
               "lm-eval task directory (see --help there).",
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
    print_report(rep)
    if args.wandb != "disabled":
        # the group of a sweep's jobs is its dir name (the CLI's default wandb.group)
        log_report_wandb(rep, args.out or args.dir, args.wandb, args.wandb_project, group=args.dir.resolve().name)
    if not rep["rows"] and all(j.results is None for j in rep["jobs"]):
        print(f"error: {Path(args.dir).resolve()}: no job has {RunDir.RESULTS} ({len(rep['failed'])} failed)",
              file=sys.stderr)
        return 1
    return 0
