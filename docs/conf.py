"""Sphinx configuration of the pretrain_exp docs (``make docs``: MyST Markdown, furo, warnings as errors)."""

from __future__ import annotations

import logging
import posixpath
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
# the checkout first: `import pretrain_exp` maps pretrain_exp.frameworks / pretrain_exp.evals onto the checkout's
# frameworks/ and evals/, so autodoc documents them under their installed names
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS / "_ext"))

import pretrain_exp  # noqa: E402

# OLMo-core logs at import that transformer_engine is absent (autodoc imports its modules): not a docs warning
logging.getLogger("olmo_core").setLevel(logging.ERROR)

project = "pretrain_exp"
author = "the pretrain_exp authors"
copyright = "the pretrain_exp authors, Apache-2.0"
release = version = pretrain_exp.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "module_index",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "README.md"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

html_theme = "furo"
html_title = "pretrain_exp"
html_static_path = ["_static"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_mock_imports: list[str] = []
napoleon_google_docstring = False
napoleon_numpy_docstring = False

# Nitpicky: every cross-reference to the project must resolve. There is no network when the docs are built (no
# intersphinx), so references into other libraries and the standard library are let through by module prefix.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(numpy|np|pandas|pd|torch|transformers|omegaconf|hydra|olmo_core|datasets|pyarrow|wandb|rich|"
               r"matplotlib|submitit|lm_eval|huggingface_hub|requests|urllib3)(\..*)?"),
    (r"py:.*", r"(pathlib|typing|collections|dataclasses|enum|abc|concurrent|threading|logging|os|io|json|"
               r"contextlib|argparse|subprocess|types|importlib|datetime|tempfile)(\..*)?"),
    (r"py:.*", r"(Path|PathLike|Any|Optional|Union|Callable|Iterable|Iterator|Sequence|Mapping|MutableMapping|"
               r"Dict|List|Tuple|Set|FrozenSet|Type|Protocol|Generator|Literal|NamedTuple|TypeVar|ClassVar|"
               r"DictConfig|ListConfig|DataFrame|ndarray|Tensor|Enum|IntEnum|Counter|"
               r"int|float|str|bool|bytes|dict|list|tuple|set|object|type|None|callable|optional|"
               r"Exception|ValueError|RuntimeError|OSError|KeyError|FileNotFoundError|LookupError|TypeError)"),
    (r"py:.*", r"(np\.)?(u?int\d+|float\d+|bool_|integer|floating|dtype|random\.Generator|memmap)"),
    # the docstrings' short references (``:class:`DataError```, ``:data:`TYPES```) resolve where the name is the
    # current module's or class's; a short name imported from elsewhere stays plain text
    (r"py:.*", r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?"),
    # type variables, private members and string annotations in signatures
    (r"py:.*", r"pretrain_exp\..*\.(T|R|_[A-Za-z0-9_]+)"),
    (r"py:.*", r"'.*'"),
]
suppress_warnings: list[str] = []


# The theme builds the whole navigation tree for every page it writes (furo calls ``toctree()`` in its
# ``html-page-context`` handler). A highlighted-source page (``_modules/...``, sphinx.ext.viewcode) is in no toctree,
# so every such page of one folder gets the same tree (its links are relative to the folder): it is built once per
# folder here, before the theme's handler (priority 400 < 500) asks for it (85 -> 51 CPU s for the whole build).
_SOURCE_PAGE_TREES: dict = {}


def _one_tree_per_source_folder(app, pagename, templatename, context, doctree):
    toctree = context.get("toctree")
    if toctree is None or not pagename.startswith("_modules/"):
        return
    folder = posixpath.dirname(pagename)

    def shared(**kwargs):
        key = (folder, tuple(sorted(kwargs.items())))
        if key not in _SOURCE_PAGE_TREES:
            _SOURCE_PAGE_TREES[key] = toctree(**kwargs)
        return _SOURCE_PAGE_TREES[key]

    context["toctree"] = shared


def setup(app):
    app.connect("builder-inited", lambda app: _SOURCE_PAGE_TREES.clear())
    app.connect("html-page-context", _one_tree_per_source_folder, priority=400)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
