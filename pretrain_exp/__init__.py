"""pretrain_exp: continual-pretraining experiments with controlled data insertion.

Entry point: ``python -m pretrain_exp`` (Hydra; see README.md and docs/). The layers, each importing only those below it
(a test over the source holds it):

- :mod:`pretrain_exp.app` -- the root config and its validation, the experiment loop, launch, worker, CLI.
- :mod:`pretrain_exp.report` -- run summaries, sweep tables, failures, plots, the CPDT table, W&B logging.
- plugins: :mod:`pretrain_exp.insertion.types` (one module per insertion type), :mod:`pretrain_exp.frameworks`,
  :mod:`pretrain_exp.evals`.
- :mod:`pretrain_exp.insertion` -- the engine, blind to item types: items, placement, the
  :class:`~pretrain_exp.insertion.plan.Plan`, the noise feed, the verifier.
- :mod:`pretrain_exp.data` -- registry assets, tokenization into OLMo token files, the data order, the row schedule.
- :mod:`pretrain_exp.core` -- errors, atomic I/O, distributed helpers, name registries, the shared schemas.

``pretrain_exp.load_run(run_dir)`` and ``pretrain_exp.load_sweep(sweep_dir)`` return a run's per-item eval rows and
a sweep's jobs as pandas DataFrames (:mod:`pretrain_exp.report.tables`; imported on first use).

Layout: the checkout keeps ``frameworks/``, ``evals/`` and ``conf/`` at its top; the wheel installs them as
``pretrain_exp/frameworks``, ``pretrain_exp/evals`` and ``pretrain_exp/conf`` (``package-dir`` in pyproject.toml).
Run from a checkout (``python -m pretrain_exp`` in it, ``PYTHONPATH=<checkout>``, an editable install), this module
maps ``pretrain_exp.frameworks`` / ``pretrain_exp.evals`` onto the top-level folders of the same checkout, so the
import names are the installed ones in every mode.
"""

import importlib.abc
import importlib.util
import sys
from pathlib import Path

__version__ = "0.1.0"
__all__ = ["load_run", "load_sweep"]

#: import name -> folder at the top of a checkout (the wheel puts the folder inside this package)
CHECKOUT_PACKAGES = {"pretrain_exp.frameworks": "frameworks", "pretrain_exp.evals": "evals"}


class _CheckoutFinder(importlib.abc.MetaPathFinder):
    """Finds :data:`CHECKOUT_PACKAGES` in the checkout this package was imported from (ahead of any other
    finder, so an editable install of another checkout cannot mix in its copy)."""

    def __init__(self, root: Path):
        self.root = root

    def find_spec(self, fullname, path=None, target=None):
        folder = CHECKOUT_PACKAGES.get(fullname)
        if folder is None:
            return None
        pkg = self.root / folder
        return importlib.util.spec_from_file_location(fullname, pkg / "__init__.py",
                                                      submodule_search_locations=[str(pkg)])


def checkout_root() -> "Path | None":
    """The checkout this package was imported from (its top holds ``frameworks/``, ``evals/``, ``conf/``), or
    None for an installed wheel (those folders are inside the package)."""
    here = Path(__file__).resolve().parent
    if (here / "frameworks").is_dir() or not (here.parent / "frameworks" / "__init__.py").is_file():
        return None
    return here.parent


def conf_dir() -> Path:
    """The Hydra config dir: ``pretrain_exp/conf`` of an installed wheel, or ``conf/`` at the top of a checkout.

    :raises FileNotFoundError: naming the dir when it holds no ``config.yaml`` (an install without its configs).
    """
    root = checkout_root()
    path = (root / "conf") if root is not None else Path(__file__).resolve().parent / "conf"
    if not (path / "config.yaml").is_file():
        raise FileNotFoundError(f"{path / 'config.yaml'}: the package's Hydra configs are missing (reinstall it)")
    return path


def _map_checkout_packages() -> None:
    root = checkout_root()
    if root is not None and not any(isinstance(f, _CheckoutFinder) and f.root == root for f in sys.meta_path):
        sys.meta_path.insert(0, _CheckoutFinder(root))


_map_checkout_packages()


def __getattr__(name: str):
    if name in ("load_run", "load_sweep"):  # lazily: importing the package stays light
        from pretrain_exp.report import tables

        return getattr(tables, name)
    raise AttributeError(f"module 'pretrain_exp' has no attribute {name!r}")
