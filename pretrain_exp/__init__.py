"""pretrain_exp: continual-pretraining experiments with controlled data insertion.

Entry point: ``python -m pretrain_exp`` (Hydra; see README.md). The layers, each importing only those below it
(a test over the source holds it):

- :mod:`pretrain_exp.app` -- the root config and its validation, the experiment loop, launch, worker, CLI.
- :mod:`pretrain_exp.report` -- run summaries, sweep tables, failures, plots, the CPDT table, W&B logging.
- plugins: :mod:`pretrain_exp.insertion.types` (one module per insertion type), :mod:`frameworks`, :mod:`evals`.
- :mod:`pretrain_exp.insertion` -- the engine, blind to item types: items, placement, the
  :class:`~pretrain_exp.insertion.plan.Plan`, the noise feed, the verifier.
- :mod:`pretrain_exp.data` -- registry assets, tokenization into OLMo token files, the data order, the row schedule.
- :mod:`pretrain_exp.core` -- errors, atomic I/O, distributed helpers, name registries, the shared schemas.

``pretrain_exp.load_run(run_dir)`` and ``pretrain_exp.load_sweep(sweep_dir)`` return a run's per-item eval rows and
a sweep's jobs as pandas DataFrames (:mod:`pretrain_exp.report.tables`; imported on first use).
"""

__version__ = "0.1.0"
__all__ = ["load_run", "load_sweep"]


def __getattr__(name: str):
    if name in ("load_run", "load_sweep"):  # lazily: importing the package stays light
        from pretrain_exp.report import tables

        return getattr(tables, name)
    raise AttributeError(f"module 'pretrain_exp' has no attribute {name!r}")
