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
from pretrain_exp.report.text import fmt
from pretrain_exp.report.wandb_log import log_report_wandb


def print_report(rep: dict) -> None:
    """Print a report (:func:`~pretrain_exp.report.sweep.write_report`) with rich: the CPDT table of a CPDT run,
    the report's table (compact headers; report.md has the CSV's) and failures, then the paths written."""
    from rich.console import Console
    from rich.table import Table

    if rep.get("cpdt") is not None:
        print_cpdt(rep["cpdt"])

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
            values = [fmt(r.get(column_name(k))) for k in keys]
            if one:
                values = [" ".join(f"{n}={v}" for n, v in zip(names, values) if v not in ("", "-"))]
            table.add_row(str(r["job"]), *values, fmt(r["seed"]), fmt(r["checkpoint_step"]),
                          fmt(r["step"]), r["experiment"], fmt(r["dup_count"]), fmt(r["n_items"]),
                          fmt(r["mean_loss"]), f"[{fmt(r['ci_low'])}, {fmt(r['ci_high'])}]", fmt(r["effect"]))
        console.print(table)
    else:
        console.print(f"{done} job(s) with results, no per-dup rows (no insertion experiment finished)")
    if rep.get("pooled"):
        from pretrain_exp.report.pooled import MIN_ITEMS_FOR_CI

        pooled = Table(title="effect pooled over seeds: loss(dup 0) - loss(dup), nats/token (95% CI: bootstrap over "
                             "seeds, then items within each seed)")
        for c in ("group", "experiment", "dup", "seeds", "items/seed", "effect", "95% CI"):
            pooled.add_column(c, justify="left" if c in ("group", "experiment") else "right", overflow="fold")
        for r in rep["pooled"]:
            pooled.add_row(r["group"] or "-", r["experiment"], fmt(r["dup_count"]), r["seeds"], fmt(r["n_items"]),
                           fmt(r["effect"]), f"[{fmt(r['ci_low'])}, {fmt(r['ci_high'])}]")
        console.print(pooled)
        few = min(r["n_items"] for r in rep["pooled"])
        if few < MIN_ITEMS_FOR_CI:
            console.print(f"warning: {few} item(s) per dup group: CIs are unreliable below {MIN_ITEMS_FOR_CI} items "
                          f"per group (num_items >= {MIN_ITEMS_FOR_CI} x the number of dup counts)")
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
