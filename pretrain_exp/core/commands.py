"""Command names: every user command is a console script (pyproject.toml's ``[project.scripts]``) and a ``python -m``
module; usage and error lines name the form the user typed."""

from __future__ import annotations

import sys
from pathlib import Path


def prog(script: str, module: str) -> str:
    """``script`` (e.g. ``pretrain-exp-report``) when this process was started as that console script, else
    ``python -m <module>``."""
    return script if Path(sys.argv[0]).name == script else f"python -m {module}"
