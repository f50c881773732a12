"""Interrupting a run, through the real CLI on a pseudo-terminal (:mod:`tests.terminal`): Ctrl-C or ``SIGTERM``
during training stops the run and every process it started, prints one line (the step of the newest checkpoint and
the command that resumes), exits with 130 / 143, and the same command resumes from that checkpoint; in this process
(``framework=hf``) and under torchrun (``framework=olmo_core``, 2 ranks). The runs are the kill trials' setups
(:data:`tests.kill_trials.SETUPS`) with more steps."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import CACHE_DIR, CHECKOUT_PYTHONPATH
from tests.integration.test_cli import cli
from tests.kill_trials import SETUPS
from tests.terminal import in_terminal

ROOT = Path(__file__).resolve().parents[2]
LINE = re.compile(r"^interrupted \((SIGINT|SIGTERM)\): the newest checkpoint holds step (\d+) \((.+)\); resume with: "
                  r"python -m pretrain_exp (.+)$")


def _args(setup: str, steps: int) -> list:
    """The kill trials' setup ``setup`` with ``steps`` steps (a checkpoint after each) and no run dir of its own."""
    return [a for a in SETUPS[setup].args if not a.startswith("training.num_steps=")] + [f"training.num_steps={steps}"]


def _leftovers(runs: Path) -> list:
    """The processes (pid, command) still running with ``runs`` as their runs dir (the run's children inherit
    its environment)."""
    import psutil

    left = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if p.pid != os.getpid() and p.environ().get("PRETRAIN_EXP_RUNS") == str(runs):
                left.append((p.pid, " ".join(p.info["cmdline"] or [])))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return left


def _interrupt_and_resume(tmp_path: Path, setup: str, sig: str, status: int, name: str, steps: int) -> None:
    runs = tmp_path / "runs"
    args = _args(setup, steps)
    env = {"PRETRAIN_EXP_RUNS": str(runs), "PRETRAIN_EXP_CACHE": str(CACHE_DIR), "WANDB_SILENT": "true"}
    con = in_terminal(args, env, signal_when=rf"step 2/{steps}: loss", sig=sig)
    assert con.rc == status, con.raw[-3000:]
    assert con.signalled_at is not None and con.ended_at - con.signalled_at < 60, con.raw[-3000:]
    assert len(con.after) == 1, "\n".join(con.after)  # one line, no traceback, no child's output
    assert "Traceback" not in con.raw and "KeyboardInterrupt" not in con.raw, con.raw[-3000:]
    m = LINE.match(con.after[0])
    assert m, con.after[0]
    assert m.group(1) == name and m.group(4) == shlex.join(args)
    run_dir = Path(m.group(3))
    step = int(m.group(2))
    assert step >= 1  # step 1's checkpoint was written before the console showed step 2 (under torchrun, the
    # console follows the ranks' log files: they may have written the last one since)
    deadline = time.monotonic() + 10  # what the run started is gone (reaped by their own parents at most now)
    while _leftovers(runs) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _leftovers(runs) == []
    assert "interrupted (" in (run_dir / "pretrain_exp.log").read_text()  # the log file says so too
    assert not (run_dir / "results.json").exists()

    # nothing half-written is taken: the same command resumes from that checkpoint and finishes
    again = cli(*args, runs=runs)
    log = (run_dir / "pretrain_exp.log").read_text()
    assert re.search(rf"resuming from \S+ \(step {step}\)", log), log[-3000:]
    done = [int(s) for s in re.findall(rf"step (\d+)/{steps}: loss", again.stdout)]
    assert done == list(range(step + 1, steps + 1)), again.stdout
    assert (run_dir / "results.json").is_file()


@pytest.mark.slow
def test_ctrl_c_during_training_in_process_is_one_line_and_the_run_resumes(tmp_path):
    """``framework=hf``, trained in the CLI's process: Ctrl-C once the console shows step 2: exit status 130."""
    _interrupt_and_resume(tmp_path, "hf", "ctrl-c", 130, "SIGINT", steps=3)


@pytest.mark.slow
def test_sigterm_during_torchrun_training_stops_the_ranks_and_the_run_resumes(tmp_path):
    """``framework=olmo_core`` with 2 torchrun ranks: ``SIGTERM`` to the CLI's process alone (as ``kill`` sends it)
    once rank 0 has logged step 2 of 8 (the console follows the ranks' output with a lag: the run is still
    training): torchrun and both ranks stop, exit status 143."""
    _interrupt_and_resume(tmp_path, "torchrun", "term", 143, "SIGTERM", steps=8)


def test_a_second_signal_stops_at_once(tmp_path):
    """While the first ``SIGINT`` is being handled (here: a clean-up that would take a minute), a second one ends
    the process at once with status 130, after ``on_second``; the child process the block started is gone."""
    script = tmp_path / "slow_cleanup.py"
    script.write_text(textwrap.dedent("""
        import subprocess, sys, time
        from pretrain_exp.core.interrupt import OWN_GROUP, Interrupted, interruptible, track

        child = track(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], **OWN_GROUP))
        print(child.pid, flush=True)
        with interruptible(on_second=lambda e: print("second", e.name, flush=True)):
            try:
                print("ready", flush=True)
                time.sleep(60)
            except Interrupted as e:
                print("first", e.name, flush=True)
                time.sleep(60)  # a slow clean-up
        print("not reached", flush=True)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env=os.environ | {"PYTHONPATH": CHECKOUT_PYTHONPATH})
    child = int(proc.stdout.readline())
    assert proc.stdout.readline().strip() == "ready"
    t0 = time.monotonic()
    proc.send_signal(2)
    assert proc.stdout.readline().strip() == "first SIGINT"
    proc.send_signal(2)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130 and out.strip() == "second SIGINT"
    assert time.monotonic() - t0 < 20
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)
