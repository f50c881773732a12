"""Background (``eval.mode=async``) evals of a run that were started and have not written their results, read
from the markers ``evals/step<N>/.async.json`` the run writes when it starts them (plain data; no training stack).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

from pretrain_exp.core.rundir import RunDir

MARKER = RunDir.ASYNC_MARKER  #: ``evals/step<N>/.async.json``: ``{step, tasks, launcher, pid | job_id, started, ...}``


def pending_evals(run_dir: Path) -> Dict[int, List[str]]:
    """``{step: [task, ...]}`` of the started evals whose ``evals/step<N>/<task>.json`` is missing (empty for a run
    without async evals, or once they are all written)."""
    rd = RunDir(run_dir)
    out = {}
    for step, marker in rd.async_markers():
        try:
            tasks = json.loads(marker.read_text())["tasks"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        missing = rd.missing_evals(step, tasks)
        if missing:
            out[step] = missing
    return out


def describe_pending(run_dir: Path) -> str:
    """``"evals pending: step 4 (memorization, perplexity), step 8 (...)"``, or ``""`` when none are."""
    found = pending_evals(run_dir)
    if not found:
        return ""
    return "evals pending: " + ", ".join(f"step {s} ({', '.join(t)})" for s, t in found.items())
