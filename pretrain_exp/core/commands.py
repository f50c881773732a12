"""Command names: every user command is a console script (pyproject.toml's ``[project.scripts]``) and a ``python -m``
module; usage and error lines name the form the user typed. And stopping a child process of a run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def prog(script: str, module: str) -> str:
    """``script`` (e.g. ``pretrain-exp-report``) when this process was started as that console script, else
    ``python -m <module>``."""
    return script if Path(sys.argv[0]).name == script else f"python -m {module}"


def stop_process(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """Stop ``proc`` if it still runs: ``SIGTERM``, then ``SIGKILL`` after ``grace_s`` seconds; reaps it."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
