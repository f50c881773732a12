"""Sphinx extension: the module index page, built from the package's files.

A page that holds the line ``<!-- module-index -->`` gets, in its place and at build time (in memory: the source
file is not changed), an ``automodule`` section per module of the package, so a new module appears on the next
build. The config and command reference pages are committed Markdown instead (``docs/reference_pages.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

MODULES_MARKER = "<!-- module-index -->"


def module_names() -> List[str]:
    """Every module of the package under its import name (``frameworks/`` and ``evals/`` as
    ``pretrain_exp.frameworks`` / ``pretrain_exp.evals``), ``__main__`` modules left out."""
    root = Path(__file__).resolve().parents[2]
    names = []
    for folder, prefix in (("pretrain_exp", "pretrain_exp"), ("frameworks", "pretrain_exp.frameworks"),
                           ("evals", "pretrain_exp.evals")):
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            if rel.name == "__main__" or "__pycache__" in rel.parts:
                continue
            names.append(".".join([prefix, *parts]))
    return sorted(set(names))


def module_index() -> str:
    """One section per module, each an ``automodule`` with its members."""
    out = []
    for name in module_names():
        out += [f"## `{name}`", "", "```{eval-rst}", f".. automodule:: {name}", "```", ""]
    return "\n".join(out)


def _source_read(app, docname: str, source: List[str]) -> None:
    if MODULES_MARKER in source[0]:
        source[0] = source[0].replace(MODULES_MARKER, module_index())


def setup(app) -> Dict[str, Any]:
    """Register the ``source-read`` hook."""
    app.connect("source-read", _source_read)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
