"""Crash consistency end to end: runs SIGKILLed at seeded random points of every phase and re-run in the same run
dir end bit-identical to an uninterrupted run (hf, olmo_core, olmo2 and a 2-rank torchrun run), and a full disk
while an eval or a checkpoint is written gives one clear error, keeps the previous checkpoint and a re-run after
freeing space finishes with the same results. The harness is :mod:`tests.kill_trials`; ``KILL_TRIALS=N`` sets the
trials per setup (default: one per phase of the run's timeline, at least 10)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pretrain_exp.core.errors import StorageError
from pretrain_exp.core.io import is_disk_full, write_text
from tests.conftest import CHECKOUT_PYTHONPATH
from tests.kill_trials import SETUPS, Phase, Reference, landed_in, phases_of, plan_trials

ROOT = Path(__file__).resolve().parents[2]
TRIALS = int(os.environ.get("KILL_TRIALS", "0"))  #: 0: the tier's default below
#: trials per setup when KILL_TRIALS is unset (0: one per phase of the timeline, at least 10); the 2-rank torchrun
#: setup runs a short chain in the test tier (each of its runs starts two ranks), and olmo2 (olmo_core's trainer and
#: checkpoints behind its own config) half a chain; KILL_TRIALS=N runs N of every setup
TIER_TRIALS = {"torchrun": 3, "olmo2": 5}


def harness(*args: str, out: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "tests.kill_trials", *args, "--json", str(out)], cwd=ROOT,
                          env=os.environ | {"PYTHONPATH": CHECKOUT_PYTHONPATH}, capture_output=True, text=True,
                          timeout=3000)
    assert out.is_file(), f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("setup", list(SETUPS))
def test_killed_runs_rerun_to_bit_identical_results(setup, tmp_path):
    trials = TRIALS or TIER_TRIALS.get(setup, 0)
    [rep] = harness("--setup", setup, "--trials", str(trials), "--work", str(tmp_path), out=tmp_path / "r.json")
    print(f"{setup}: {rep['ok']}/{rep['n']} bit-identical in {rep['seconds']:.0f} s")  # shown with -s / -rA
    assert rep["n"] == (trials or max(10, len(rep["phases"])))
    assert all(t["killed_at"] is not None for t in rep["trials"])
    if rep["n"] >= len(rep["phases"]):  # every phase of the reference timeline was a target
        assert {t["target"] for t in rep["trials"]} == {p["name"] for p in rep["phases"]}
    bad = [t for t in rep["trials"] if not t["ok"]]
    assert not bad, json.dumps(bad, indent=1)


@pytest.mark.slow
def test_a_full_disk_gives_one_clear_error_and_the_rerun_resumes(tmp_path):
    """A disk full while an eval is written (to the last byte: the run's log cannot grow either) and while a
    checkpoint is written: one ``error:`` line naming the file, exit status 2, no traceback (the log file's
    failure is at most one ``warning:`` line), the durable state intact; the re-run after freeing space ends
    identical to an uninterrupted run."""
    res = harness("--disk-full", "--work", str(tmp_path), out=tmp_path / "r.json")
    if "skipped" in res:
        pytest.skip(res["skipped"])
    for case, names in (("eval", "evals/step1/insertion_loss.json"), ("checkpoint", "checkpoints/checkpoint-2")):
        r = res[case]
        assert not r["late"], (case, r)  # the disk was full before the file was written
        assert r["rc"] == 2 and r["tracebacks"] == 0, (case, r)
        [line] = r["errors"]
        assert "no space left on device" in line and names in line and "re-run the same command" in line, line
        assert r["step1_intact"] and r["state"] == [], (case, r)
    # the log's last page is filled too, but a write the full disk cut short may free pages again (its temp file
    # removed) before the run logs its error: then the log takes the records and there is no warning
    for warning in res["eval"]["warnings"]:
        assert "pretrain_exp.log cannot be written" in warning and "No space left on device" in warning, warning
    assert len(res["eval"]["warnings"]) <= 1, res["eval"]
    assert res["checkpoint"]["warnings"] == [], res["checkpoint"]
    assert res["final"] == {"rc": 0, "mismatches": []}


# --- fast: the harness's timeline arithmetic and the disk-full classification --------------------------------


def test_phases_cover_the_timeline_and_trials_visit_every_phase():
    events = [(1.0, "plan building"), (1.5, "verification"), (3.0, "training 0->2"), (6.0, "exit")]
    phases = phases_of(events)
    assert [(p.name, p.start, p.duration) for p in phases] == [
        ("startup", 0.0, 1.0), ("plan building", 1.0, 0.5), ("verification", 1.5, 1.5),
        ("training 0->2", 3.0, 3.0)]
    assert landed_in(events, 0.5) == "startup" and landed_in(events, 2.0) == "verification"
    chains = plan_trials(phases, 10, seed=3)
    trials = [t for c in chains for t in c]
    assert len(trials) == 10 and sorted(t.index for t in trials) == list(range(10))
    assert len(chains) == 3 and {t.phase.name for t in chains[0]} == {p.name for p in phases}
    for c in chains:  # a chain visits each phase at most once, in timeline order
        starts = [t.phase.start for t in c]
        assert starts == sorted(starts) and len(set(starts)) == len(starts)
    assert all(0 <= t.u < 1 for t in trials)
    again = [t for c in plan_trials(phases, 10, seed=3) for t in c]
    assert [(t.phase, t.u) for t in again] == [(t.phase, t.u) for t in trials]
    assert isinstance(trials[0].phase, Phase)


def test_a_full_device_is_a_storage_error_naming_the_file(tmp_path):
    """``/dev/full`` answers every write with a real ``ENOSPC``: the atomic write names its target, leaves it as it
    was and leaves no temp file."""
    target = tmp_path / "evals" / "step2" / "x.json"
    write_text(target, "old")

    def write(f):
        with open("/dev/full", "wb") as full:
            full.write(b"x")
            full.flush()

    from pretrain_exp.core.io import atomic_write

    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full")
    with pytest.raises(StorageError, match=rf"no space left on device while writing {target} .*re-run") as e:
        atomic_write(target, write)
    assert isinstance(e.value.__cause__, OSError) and e.value.__cause__.errno == errno.ENOSPC
    assert target.read_text() == "old" and sorted(p.name for p in target.parent.iterdir()) == ["x.json"]
    # engines that wrap the OS error in their own exception type still count as a full disk
    assert is_disk_full(RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)"))
    assert not is_disk_full(RuntimeError("shape mismatch"))


def test_a_cut_eval_write_is_not_state_after_the_kill_but_fails_a_completed_rerun(tmp_path):
    """The temp file of an eval write that the kill cut short (``evals/step1/.insertion_loss.<8 chars>.json``, here
    empty) is no part of the run's state after the kill (no reader takes it); a completed re-run that left it fails."""
    ref_dir, run_dir = tmp_path / "reference", tmp_path / "run"
    for d, seconds in ((ref_dir, 1.0), (run_dir, 2.0)):  # the same eval, timed differently
        write_text(d / "evals" / "step1" / "insertion_loss.json", json.dumps({"metrics": {"loss": 1.5},
                                                                             "seconds": seconds}))
    (run_dir / "evals" / "step1" / ".insertion_loss.ab12cd34.json").write_bytes(b"")
    ref = Reference(SETUPS["hf"], ref_dir)
    assert ref.state_mismatches(run_dir) == []
    [bad] = [b for b in ref.final_mismatches(run_dir) if b.startswith("eval files")]
    assert ".insertion_loss.ab12cd34.json" in bad
    (run_dir / "evals" / "step1" / "insertion_loss.json").write_text(json.dumps({"metrics": {"loss": 2.5}}))
    assert ref.state_mismatches(run_dir) == ["evals/step1/insertion_loss.json differs"]
