"""Reports of runs and sweeps, read from what the runs wrote (no training stack needed).

- :mod:`~pretrain_exp.report.summary`: a run's ``results.json`` content and console table;
- :mod:`~pretrain_exp.report.tables`: ``load_run`` / ``load_sweep`` (pandas DataFrames) and a run's Parquet tables;
- :mod:`~pretrain_exp.report.plots`: the figures (loss vs dup count, loss vs step, sweep effect, benchmark);
- :mod:`~pretrain_exp.report.jobs`: the job dirs of a sweep and what each holds;
- :mod:`~pretrain_exp.report.failures`: why a job has no results (its submitit logs and own log);
- :mod:`~pretrain_exp.report.sweep`: the sweep table (``report.csv``, ``report.md``, ``benchmark.csv``, figures);
- :mod:`~pretrain_exp.report.cpdt`: the CPDT interaction table of a dependence-testing run;
- :mod:`~pretrain_exp.report.wandb_log`: W&B logging of a report;
- :mod:`~pretrain_exp.report.cli`: ``python -m pretrain_exp.report <run or sweep dir> [--out DIR] [--wandb MODE]``.
"""

from pretrain_exp.report.cli import main, print_report
from pretrain_exp.report.plots import plot_benchmark, plot_effect_vs_dup, plot_loss_vs_step, plot_per_dup
from pretrain_exp.report.summary import print_table, summarize
from pretrain_exp.report.sweep import write_report
from pretrain_exp.report.tables import load_run, load_sweep, write_run_tables
from pretrain_exp.report.wandb_log import log_report_wandb

__all__ = ["load_run", "load_sweep", "log_report_wandb", "main", "plot_benchmark", "plot_effect_vs_dup",
           "plot_loss_vs_step", "plot_per_dup", "print_report", "print_table", "summarize", "write_report",
           "write_run_tables"]
