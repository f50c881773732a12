"""``eval.mode=async`` end to end through the CLI: the evals run in background processes while training goes on,
give the numbers ``inline`` gives, and a kill while they run loses nothing (the re-run starts only the missing
ones)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from pretrain_exp.report.pending import MARKER, describe_pending, pending_evals
from tests.conftest import CACHE_DIR, ROOT
from tests.integration.test_cli import cli

#: two segments of the tiny run, one thread (the eval processes take training.num_threads too)
SHORT = ["experiment=tiny", "training.num_threads=1", "training.num_steps=8", "wandb=disabled"]


def _evals(run_dir: Path) -> dict:
    out = {}
    for f in sorted(run_dir.glob("evals/step*/*.json")):
        rec = json.loads(f.read_text())
        rec.pop("seconds")
        out[f"{f.parent.name}/{f.name}"] = rec
    return out


@pytest.mark.slow
def test_async_evals_match_inline_and_survive_a_kill(tmp_path, tiny_model_dir):
    runs = tmp_path / "runs"
    cli(*SHORT, "hydra.run.dir=" + str(runs / "inline"), runs=runs)
    inline = _evals(runs / "inline")
    assert len(inline) == 6  # steps 4 and 8 x insertion_loss, memorization, perplexity

    # async, killed (the whole process tree: the run and its eval process) right after it started the evals of
    # step 4, before they could write anything
    run_dir = runs / "async"
    env = os.environ | {"PRETRAIN_EXP_RUNS": str(runs), "PRETRAIN_EXP_CACHE": str(CACHE_DIR), "WANDB_SILENT": "true"}
    proc = subprocess.Popen([sys.executable, "-m", "pretrain_exp", *SHORT, "eval.mode=async",
                             f"hydra.run.dir={run_dir}"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    marker = run_dir / "evals" / "step4" / MARKER
    deadline = time.monotonic() + 600
    while not marker.is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    tree = [psutil.Process(proc.pid)]
    tree += tree[0].children(recursive=True)  # the eval process runs in a session of its own
    for p in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGKILL)
    psutil.wait_procs(tree[1:], timeout=30)
    proc.wait()
    assert marker.is_file(), "the run never started the evals of step 4"
    assert pending_evals(run_dir) == {4: ["insertion_loss", "memorization", "perplexity"]}
    assert describe_pending(run_dir) == "evals pending: step 4 (insertion_loss, memorization, perplexity)"
    assert (run_dir / "hf" / "step4" / "model.safetensors").is_file()  # what the re-run evaluates
    report = subprocess.run([sys.executable, "-m", "pretrain_exp.report", str(run_dir), "--out",
                             str(tmp_path / "report")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert report.returncode == 1  # no results.json yet
    assert "evals pending: step 4 (insertion_loss, memorization, perplexity)" in (
        tmp_path / "report" / "report.md").read_text()

    rerun = cli(*SHORT, "eval.mode=async", f"hydra.run.dir={run_dir}", runs=runs)
    log = rerun.stdout + rerun.stderr
    assert "evaluating step 4 in the background" in log and "evaluating step 8 in the background" in log
    assert log.count("in the background (") == 2  # nothing evaluated twice
    assert _evals(run_dir) == inline
    res, ref = (json.loads((d / "results.json").read_text()) for d in (run_dir, runs / "inline"))
    assert res["per_dup"] == ref["per_dup"] and res["by_step"] == ref["by_step"]
    assert pending_evals(run_dir) == {} and not list(run_dir.glob(f"evals/step*/{MARKER}"))
    assert not (run_dir / "hf").exists()  # the linked model dirs went once their evals were written
    assert (run_dir / "evals" / "step8" / "async.log").is_file()

    # killed after its last evals were written but before the run cleaned up: the re-run only tidies up
    (run_dir / "evals" / "step8" / MARKER).write_text(json.dumps({"step": 8, "tasks": ["insertion_loss"]}))
    (run_dir / "hf" / "step8").mkdir(parents=True)
    again = cli(*SHORT, "eval.mode=async", f"hydra.run.dir={run_dir}", runs=runs)
    assert "in the background (" not in again.stdout + again.stderr
    assert not (run_dir / "evals" / "step8" / MARKER).exists() and not (run_dir / "hf").exists()
    assert _evals(run_dir) == inline
