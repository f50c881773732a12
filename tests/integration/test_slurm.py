"""Sweeps on a real SLURM cluster (``../shared/tools/slurm-localhost.sh up``; skipped where no controller answers).

Every test runs the real CLI with ``hydra/launcher=slurm_cpu`` (the ``slurm`` preset without a GPU request) on
partition ``debug``: Hydra's submitit launcher submits one array task per job and waits for all of them.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import CACHE_DIR, CHECKOUT_PYTHONPATH, ROOT


def _controller_answers() -> bool:
    if shutil.which("sinfo") is None:
        return False
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


pytestmark = [
    pytest.mark.slow, pytest.mark.slurm,
    pytest.mark.skipif(not _controller_answers(), reason="no SLURM controller answers `sinfo` "
                       "(start one with ../shared/tools/slurm-localhost.sh up)"),
]

BASE = ["hydra/launcher=slurm_cpu", "hydra.launcher.partition=debug", "experiment=tiny", "wandb=disabled",
        "training.num_threads=1"]
#: a run of one 4-step segment evaluated by insertion_loss alone (tests of the launcher, not of the training)
ONE_SEGMENT = ["training.num_steps=4", "insertion.experiments.fictional_bios.repetitions=[0,1,2,4]",
               "eval=[insertion_loss]"]


def sweep_cmd(sweep_dir: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "pretrain_exp", "-m", *BASE, f"hydra.sweep.dir={sweep_dir}", *overrides]


def env(tmp_path: Path) -> dict:
    return os.environ | {"PRETRAIN_EXP_CACHE": str(CACHE_DIR), "PRETRAIN_EXP_RUNS": str(tmp_path / "runs"),
                         "PYTHONPATH": CHECKOUT_PYTHONPATH, "WANDB_SILENT": "true"}


def run_sweep(tmp_path: Path, sweep_dir: Path, *overrides: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(sweep_cmd(sweep_dir, *overrides), cwd=ROOT, env=env(tmp_path), capture_output=True,
                          text=True, timeout=1200)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def slurm_job_ids(sweep_dir: Path) -> set[str]:
    """SLURM job ids of a sweep (submitit's folders are named ``<job id>[_<array index>]``)."""
    return {p.name.split("_")[0] for p in (sweep_dir / ".submitit").iterdir() if p.name[:1].isdigit()}


def job_dirs(sweep_dir: Path) -> list[Path]:
    return sorted((p for p in sweep_dir.iterdir() if (p / ".hydra").is_dir()), key=lambda p: int(p.name))


def test_2x2_sweep_runs_as_array_tasks_and_the_report_gathers_4_jobs(tmp_path):
    sweep_dir = tmp_path / "sweep"
    # one 4-step segment and the one eval the report reads (per-dup losses): the sweep, not the training, is tested
    run_sweep(tmp_path, sweep_dir, "seed=0,1", "training.learning_rate=0.005,0.01", *ONE_SEGMENT)
    jobs = job_dirs(sweep_dir)
    assert len(jobs) == 4
    for job in jobs:
        assert (job / "config.resolved.yaml").is_file() and (job / "results.json").is_file(), job
        assert json.loads((job / "results.json").read_text())["step"] == 4
    assert len(slurm_job_ids(sweep_dir)) == 1, "all four jobs should be tasks of one SLURM array"
    report = subprocess.run([sys.executable, "-m", "pretrain_exp.report", str(sweep_dir)], cwd=ROOT,
                            env=env(tmp_path), capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr
    with open(sweep_dir / "report.csv") as f:
        rows = list(csv.DictReader(f))
    assert len({r["job"] for r in rows}) == 4
    assert {(r["seed"], r["training.learning_rate"]) for r in rows} == {
        ("0", "0.005"), ("0", "0.01"), ("1", "0.005"), ("1", "0.01")}


def test_nproc_per_node_2_runs_two_ranks_under_torchrun_in_the_job(tmp_path):
    sweep_dir = tmp_path / "sweep"
    run_sweep(tmp_path, sweep_dir, "training.nproc_per_node=2", "hydra.launcher.cpus_per_task=2", "seed=0",
              *ONE_SEGMENT)
    (job,) = job_dirs(sweep_dir)
    ranks = sorted(p.parent.name for p in (job / "torchrun").rglob("stderr.log"))
    assert ranks == ["0", "1"]
    assert json.loads((job / "results.json").read_text())["step"] == 4


def test_an_over_asking_job_fails_fast_with_a_clear_message(tmp_path):
    sweep_dir = tmp_path / "sweep"
    t0 = time.perf_counter()
    proc = run_sweep(tmp_path, sweep_dir, "training.nproc_per_node=4", "training.micro_batch_size=2",
                     "hydra.launcher.cpus_per_task=2", "seed=0",
                     check=False)
    logs = "".join(p.read_text() for p in (sweep_dir / ".submitit").rglob("*_log.err"))
    assert "training.nproc_per_node=4 but this job's allocation has 2 CPUs" in logs
    # the sweep command says it in one line too, with the job's log
    told = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 1 and len(told) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "training.nproc_per_node=4 but this job's allocation has 2 CPUs" in told[0] and "its log: " in told[0]
    assert not list(sweep_dir.rglob("checkpoint-*"))
    assert time.perf_counter() - t0 < 120


def test_a_preempted_job_is_requeued_and_resumes_from_its_checkpoint(tmp_path):
    """USR2 (what SLURM sends before preemption/timeout) mid-training: submitit checkpoints the Hydra job,
    requeues it, and the re-run continues from the job's newest checkpoint instead of starting over."""
    sweep_dir = tmp_path / "sweep"
    overrides = ["seed=0", "training.num_steps=24", "training.checkpoint_interval=4",
                 "insertion.experiments.fictional_bios.repetitions=[0,1,2,4]", "eval=[insertion_loss]"]
    proc = subprocess.Popen(sweep_cmd(sweep_dir, *overrides), cwd=ROOT, env=env(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 600
        while not list(sweep_dir.glob("0/checkpoints/checkpoint-*/trainer_state.json")):  # a complete checkpoint
            assert proc.poll() is None and time.time() < deadline, "job never wrote a checkpoint"
            time.sleep(0.5)
        (job_id,) = slurm_job_ids(sweep_dir)
        subprocess.run(["scancel", "--signal=USR2", "--full", job_id], check=True)
        # SLURM holds a requeued job until its begin time (now + the credential lifetime, 2 min by default): once
        # the requeue has happened, the test makes it eligible at once (where that is refused, it waits the hold out)
        while proc.poll() is None and time.time() < deadline:
            state = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T %r"], capture_output=True,
                                   text=True).stdout.split()
            if state == ["PENDING", "BeginTime"]:
                subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], capture_output=True)
                break
            time.sleep(0.5)
        out, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    job = sweep_dir / "0"
    log = (job / "pretrain_exp.log").read_text()
    assert "resuming from" in log, log[-2000:]
    res = json.loads((job / "results.json").read_text())
    assert res["step"] == 24
    trained_steps = [json.loads(line)["step"] for line in (job / "metrics.jsonl").read_text().splitlines()
                     if "train/loss" in line]
    assert trained_steps.count(1) == 1 and max(trained_steps) == 24  # resumed, not restarted from step 1
    for _ in range(60):  # the accounting record lags the job's end by a few seconds
        sacct = subprocess.run(["sacct", "-n", "-X", "-j", job_id, "-o", "State"], capture_output=True,
                               text=True).stdout
        if "COMPLETED" in sacct:
            break
        time.sleep(1)
    assert "COMPLETED" in sacct


def test_async_evals_run_as_their_own_slurm_jobs(tmp_path):
    """``eval.mode=async`` under the SLURM launcher: each segment's evals are a one-task SLURM job of their own
    (the run's partition and limits), submitted while the run trains on; results.json waits for them."""
    sweep_dir = tmp_path / "sweep"
    # 1 CPU each: on a 2-CPU node the run and its eval job fit side by side (else the eval jobs stay pending and
    # run in the run's allocation: test_a_pending_eval_job_never_holds_the_run)
    run_sweep(tmp_path, sweep_dir, "eval.mode=async", "training.num_steps=8", "hydra.launcher.cpus_per_task=1")
    job = job_dirs(sweep_dir)[0]
    assert json.loads((job / "results.json").read_text())["step"] == 8
    log = (job / "pretrain_exp.log").read_text()
    started = re.findall(r"evaluating step (\d+) in the background \(SLURM job (\d+)\)", log)
    assert [s for s, _ in started] == ["4", "8"], log[-3000:]
    run_ids = slurm_job_ids(sweep_dir)
    for step, job_id in started:
        assert job_id not in run_ids
        for task in ("insertion_loss", "memorization", "perplexity"):
            assert (job / "evals" / f"step{step}" / f"{task}.json").is_file()
        state = subprocess.run(["sacct", "-j", job_id, "-n", "-X", "-o", "State,Partition"], capture_output=True,
                               text=True, timeout=60).stdout.split()
        assert state == ["COMPLETED", "debug"], (state, log[-3000:])


def _node_cpus() -> int:
    out = subprocess.run(["sinfo", "-h", "-o", "%c"], capture_output=True, text=True, timeout=60).stdout.split()
    return max(int(c.rstrip("+")) for c in out)


def test_a_pending_eval_job_never_holds_the_run(tmp_path):
    """The run asks for every CPU of the node, so its eval jobs (the run's own resources) stay pending behind it:
    at the final wait, after ``eval.async_pending_wait_s``, they are cancelled and their evals run in the run's own
    allocation, logged; the run ends with every eval written. The eval jobs carry the job's name, resolved."""
    cpus = _node_cpus()
    sweep_dir = tmp_path / "sweep"
    t0 = time.perf_counter()
    run_sweep(tmp_path, sweep_dir, *ONE_SEGMENT, "eval.mode=async", "eval.async_pending_wait_s=3",
              f"hydra.launcher.cpus_per_task={cpus}", "hydra.launcher.timeout_min=10")
    elapsed = time.perf_counter() - t0
    job = job_dirs(sweep_dir)[0]
    assert json.loads((job / "results.json").read_text())["step"] == 4
    assert (job / "evals" / "step4" / "insertion_loss.json").is_file()
    assert not (job / "evals" / "step4" / ".async.json").exists()  # collected and dropped
    log = (job / "pretrain_exp.log").read_text()
    job_id = re.search(r"evaluating step 4 in the background \(SLURM job (\d+)\)", log).group(1)
    taken = re.search(r"the eval job of step 4 \(SLURM job (\d+)\) had not started after ([\d.]+) s of the final "
                      r"wait .*cancelled; running its evals in this run's allocation", log)
    assert taken and taken.group(1) == job_id and 3 <= float(taken.group(2)) < 30, log[-3000:]
    assert re.search(r"evals of step 4 run in this run's allocation in [\d.]+ s \(exit status 0\)", log)
    for _ in range(60):  # accounting catches up asynchronously
        acct = subprocess.run(["sacct", "-j", job_id, "-n", "-X", "-P", "-o", "State,JobName"], capture_output=True,
                              text=True, timeout=60).stdout.strip().splitlines()
        if acct and acct[0].startswith("CANCELLED"):
            break
        time.sleep(1)
    assert acct and acct[0].startswith("CANCELLED") and acct[0].endswith("|pretrain_exp-eval"), acct
    assert elapsed < 600


#: the one line of a run stopped by a signal (pretrain_exp.app.cli.interrupted_line)
INTERRUPTED = re.compile(r"interrupted \((SIG\w+)\): the newest checkpoint holds step (\d+) \((.+)\); "
                         r"resume with: python -m pretrain_exp (.+)")


def test_a_job_at_its_time_limit_without_requeue_ends_with_one_line_and_resumes(tmp_path):
    """SLURM's time limit where no requeue applies (``max_num_timeout=0``): submitit declines the requeue at its
    early USR2, training goes on until SLURM's SIGTERM at the limit (``--time=1``), and the job ends with the run's
    one line (the newest checkpoint's step, the command that resumes), exit status 143, no process of the run left.
    That command resumes the run from the checkpoint. The run sleeps a minute after each checkpoint
    (:class:`tests.slow_segments.SlowSegments`), so it outlasts the limit however fast the machine trains; the
    resuming command leaves that component out."""
    import psutil

    sweep_dir = tmp_path / "sweep"
    overrides = ["seed=0", "training.num_steps=20", "training.checkpoint_interval=5", "eval=[insertion_loss]",
                 "insertion.experiments.fictional_bios.repetitions=[0,1,2,4]", "hydra.launcher.timeout_min=1",
                 "hydra.launcher.signal_delay_s=5", "hydra.launcher.max_num_timeout=0",
                 "hooks=[tests.slow_segments:SlowSegments]"]
    proc = run_sweep(tmp_path, sweep_dir, *overrides, check=False)
    (job_id,) = slurm_job_ids(sweep_dir)
    job = sweep_dir / "0"
    logs = "".join(p.read_text() for p in sorted((sweep_dir / ".submitit").rglob("*_log.*")))
    assert "Job not requeued because: timed-out too many times" in logs, logs[-3000:]
    err = "".join(p.read_text() for p in (sweep_dir / ".submitit").rglob("*_log.err"))
    said = [line for line in err.splitlines() if line.startswith("interrupted (")]
    assert len(said) == 1, err[-3000:]
    m = INTERRUPTED.fullmatch(said[0])
    assert m and m[1] == "SIGTERM" and Path(m[3]) == job, said
    step = int(m[2])
    done = [int(p.parent.name.split("-")[1]) for p in job.glob("checkpoints/checkpoint-*/trainer_state.json")]
    assert 0 < step == max(done) < 20, (step, done)
    assert "Traceback" not in logs, logs[-3000:]
    assert "task 0: Exited with exit code 143" in err, err[-3000:]  # the job's own status, not SLURM's SIGKILL
    # the sweep command, waiting on the job: one line naming the job and repeating the run's own line, exit status 1
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    told = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(told) == 1 and told[0].startswith(f"error: job {job_id}") and f": {said[0]}; its log: " in told[0], \
        (told, said)
    assert not (job / "results.json").exists()
    for _ in range(60):  # the accounting record lags the job's end by a few seconds
        state = subprocess.run(["sacct", "-n", "-X", "-j", job_id, "-o", "State"], capture_output=True,
                               text=True).stdout.split()
        if state:
            break
        time.sleep(1)
    assert state == ["TIMEOUT"], state
    left = []
    for p in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if p.environ().get("SLURM_JOB_ID") == job_id:
                left.append(p.info["cmdline"])
    assert not left, left  # no process of the job (its ranks, the audit) outlives it

    resume = [a if not a.startswith("hydra.launcher.timeout_min=") else "hydra.launcher.timeout_min=30"
              for a in shlex.split(m[4]) if not a.startswith("hooks=")]
    assert resume[0] == "-m" and f"hydra.sweep.dir={sweep_dir}" in resume, resume
    again = subprocess.run([sys.executable, "-m", "pretrain_exp", *resume], cwd=ROOT, env=env(tmp_path),
                           capture_output=True, text=True, timeout=1200)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming from {job / 'checkpoints' / f'checkpoint-{step}'} (step {step})" in (
        job / "pretrain_exp.log").read_text()
    assert json.loads((job / "results.json").read_text())["step"] == 20
