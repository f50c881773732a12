"""Background (``eval.mode=async``) evals of a run that were started and have not written their results, read
from the markers ``evals/step<N>/.async.json`` the run writes when it starts them (plain data; no training stack).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

MARKER = ".async.json"  #: ``evals/step<N>/.async.json``: ``{step, tasks, launcher, pid | job_id, started, ...}``


def pending_evals(run_dir: Path) -> Dict[int, List[str]]:
    """``{step: [task, ...]}`` of the started evals whose ``evals/step<N>/<task>.json`` is missing (empty for a run
    without async evals, or once they are all written)."""
    out = {}
    for marker in sorted(Path(run_dir).glob(f"evals/step*/{MARKER}")):
        try:
            tasks = json.loads(marker.read_text())["tasks"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        missing = [t for t in tasks if not (marker.parent / f"{t}.json").is_file()]
        if missing:
            out[int(marker.parent.name[4:])] = missing
    return dict(sorted(out.items()))


def describe_pending(run_dir: Path) -> str:
    """``"evals pending: step 4 (memorization, perplexity), step 8 (...)"``, or ``""`` when none are."""
    found = pending_evals(run_dir)
    if not found:
        return ""
    return "evals pending: " + ", ".join(f"step {s} ({', '.join(t)})" for s, t in found.items())
