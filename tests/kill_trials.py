"""Kill trials: runs SIGKILLed at random points of every phase, re-run in the same run dir, must end bit-identical
to an uninterrupted run.

One uninterrupted **reference** run of a setup (a tiny preset of one framework, or a 2-rank torchrun run) is
watched while it runs: its log lines (``pretrain_exp.log`` and the process output, torchrun ranks included) and
the files appearing under its run dir mark **events** (plan building, verification, each training segment, each
checkpoint write, each eval, the results), and the intervals between consecutive events are the **phases** of its
timeline (``startup`` is the interval before the first event). Trial ``i`` draws a phase (a seeded permutation
of the phases, so ``N >= len(phases)`` trials hit every phase; by default ``N`` is one per phase, at least 10)
and a uniform fraction ``u`` of its duration; the trial's run is SIGKILLed (the whole process tree: the CLI,
torchrun and its ranks) ``u * duration`` seconds after it reaches that phase's starting event.

Trials share a run dir in **chains**: the trials of a chain are sorted by phase, each run of the chain resumes the
run dir the previous kill left, and after the last kill the run is completed. Every kill gets its own comparison:
right after it, the run dir's durable state (every complete checkpoint's weights, every eval file, ``plan.npz``,
``manifest.jsonl``, ``items.jsonl``, ``results.json``) must be bit-identical to the reference's files of the same
name, since the next run resumes from exactly that state; the completed run must then match the reference's
``results.json`` rows, every eval's ``per_dup`` rows and metrics, the final weights and (OLMo) the rows trained
at every step. A trial counts as bit-identical when its own check and the chain's completion both pass.

Runs start by ``fork`` of this (pre-imported) process by default, which skips the ~5-10 s of imports per run;
``--spawn`` runs ``python -m pretrain_exp`` in a fresh interpreter instead. Command line::

    python -m tests.kill_trials --setup hf olmo_core olmo2 torchrun --trials 10 --seed 0
    KILL_TRIALS=50 python -m pytest tests/integration/test_kill_trials.py -m slow

Sources: the run dir layout of :mod:`pretrain_exp.app.experiment`; checkpoint completeness markers of
:mod:`pretrain_exp.frameworks.hf.framework` (``trainer_state.json``) and
:mod:`pretrain_exp.frameworks.olmo_core.framework` (``.metadata.json``).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
POLL_S = 0.01
MIN_TRIALS = 10  #: trials per setup by default: one per phase, at least this many

#: 2 steps in 2 segments (2 checkpoints, 2 evals), 4 items at dup counts 0/1/2
_COMMON = ["training.num_steps=2", "training.checkpoint_interval=1", "training.num_threads=1",
           "training.keep_last_checkpoints=0", "insertion.experiments.fictional_bios.num_items=4",
           "insertion.experiments.fictional_bios.repetitions=[0,1,2]", "eval=[insertion_loss]", "wandb=disabled",
           "data.held_out_rows=8"]
_OLMO = ["training=tiny", "training.log_rows=true", *_COMMON]


@dataclass(frozen=True)
class Setup:
    """A run to kill: its CLI overrides and how to find its checkpoints."""

    args: Tuple[str, ...]
    ckpt_pattern: str  #: checkpoint dir names under ``checkpoints/`` (one integer group: the step)
    complete_marker: str  #: the file the framework writes last into a checkpoint
    weights_file: Optional[str] = None  #: safetensors file of the weights (HF); ``None``: OLMo-core DCP state


SETUPS: Dict[str, Setup] = {
    "hf": Setup(("experiment=tiny", "training.global_batch_size=4", "training.micro_batch_size=4",
                 "training.sequence_length=64", *_COMMON), r"checkpoint-(\d+)", "trainer_state.json",
                "model.safetensors"),
    "olmo_core": Setup(("framework=olmo_core", "training.global_batch_size=4", "training.micro_batch_size=2", *_OLMO),
                       r"step(\d+)", ".metadata.json"),
    "olmo2": Setup(("framework=olmo2", "training.micro_batch_size=4", *_OLMO), r"step(\d+)", ".metadata.json"),
    "torchrun": Setup(("framework=olmo_core", "training.global_batch_size=4", "training.micro_batch_size=2",
                       "training.nproc_per_node=2", *_OLMO), r"step(\d+)", ".metadata.json"),
}

#: log lines that start a phase: (regex, event label; groups are formatted in)
LOG_EVENTS = [
    (re.compile(r"\]\[pretrain_exp\.insertion\.items\]"), "plan building"),
    (re.compile(r"\] - plan: \d+ items"), "verification"),
    (re.compile(r"\] - verified plan"), "framework setup"),
    (re.compile(r"\] - starting (\d+) ranks"), "torchrun start"),
    (re.compile(r"\] - training steps (\d+) -> (\d+)"), "training {0}->{1}"),
    (re.compile(r"\] - evaluating step (\d+)"), "eval step {0}"),
]


#: phases that a re-run of a completed run dir goes through again (it trains and evaluates nothing)
RECURRING = {"startup", "plan building", "verification", "framework setup", "torchrun start", "results"}


def _fs_label(rel: str) -> Optional[str]:
    """The event label of a file created or modified at ``rel`` (relative to the run dir), if it marks one."""
    parts = rel.split("/")
    if parts[0] == "checkpoints" and len(parts) > 1:  # OLMo-core writes step<N>-tmp/, then renames it
        return f"checkpoint write {parts[1].removesuffix('-tmp')}"
    if rel == "results.json":
        return "results"
    return None


def _scan(run_dir: Path) -> Dict[str, int]:
    """``{relative path: mtime_ns}`` of the files under ``checkpoints/`` and ``results.json``."""
    out = {}
    for sub in ("checkpoints",):
        for dirpath, _, files in os.walk(run_dir / sub):
            for f in files:
                p = os.path.join(dirpath, f)
                try:
                    out[os.path.relpath(p, run_dir)] = os.stat(p).st_mtime_ns
                except FileNotFoundError:
                    pass
    try:
        out["results.json"] = os.stat(run_dir / "results.json").st_mtime_ns
    except FileNotFoundError:
        pass
    return out


class Watch:
    """The events of one run as they happen: new log lines (from the byte offsets at start) and files created or
    modified under the run dir since start. :meth:`poll` returns ``[(seconds since start, label)]`` of the
    labels seen for the first time."""

    def __init__(self, run_dir: Path, out_path: Path, t0: float):
        self.run_dir, self.t0 = run_dir, t0
        self.sources = {run_dir / "pretrain_exp.log": _size(run_dir / "pretrain_exp.log"), out_path: 0}
        self.partial = {p: b"" for p in self.sources}
        self.files = _scan(run_dir)
        self.seen: Dict[str, float] = {}
        self.events: List[Tuple[float, str]] = []

    def _add(self, t: float, label: str, out: list) -> None:
        if label not in self.seen:
            self.seen[label] = t
            self.events.append((t, label))
            out.append((t, label))

    def poll(self) -> List[Tuple[float, str]]:
        t = time.monotonic() - self.t0
        out: List[Tuple[float, str]] = []
        for path, offset in self.sources.items():
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    data = f.read()
            except FileNotFoundError:
                continue
            self.sources[path] = offset + len(data)
            lines = (self.partial[path] + data).split(b"\n")
            self.partial[path] = lines.pop()
            for raw in lines:
                line = raw.decode("utf-8", "replace")
                for rx, label in LOG_EVENTS:
                    m = rx.search(line)
                    if m:
                        self._add(t, label.format(*m.groups()), out)
        now = _scan(self.run_dir)
        for rel, mtime in now.items():
            if self.files.get(rel) != mtime:
                label = _fs_label(rel)
                if label:
                    self._add(t, label, out)
        self.files = now
        return out


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


# --- starting and killing runs ---------------------------------------------------------------------------------


class Run:
    """One ``python -m pretrain_exp`` run in ``run_dir`` (forked from this process, or spawned), its output in
    ``out_path``."""

    def __init__(self, setup: Setup, run_dir: Path, out_path: Path, env: Dict[str, str], spawn: bool):
        argv = [*setup.args, f"hydra.run.dir={run_dir}"]
        self.t0 = time.monotonic()
        self.popen = None
        sys.stdout.flush()
        sys.stderr.flush()
        if spawn:
            with open(out_path, "wb") as out:
                self.popen = subprocess.Popen([sys.executable, "-m", "pretrain_exp", *argv], cwd=ROOT,
                                              env=os.environ | env, stdout=out, stderr=subprocess.STDOUT,
                                              start_new_session=True)
            self.pid = self.popen.pid
        else:
            self.pid = os.fork()
            if self.pid == 0:  # the child: the CLI's entry point, as `python -m pretrain_exp` runs it
                code = 1
                try:
                    os.setsid()
                    fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    os.dup2(fd, 1)
                    os.dup2(fd, 2)
                    os.chdir(ROOT)
                    os.environ.update(env)
                    sys.argv = [str(ROOT / "pretrain_exp" / "__main__.py"), *argv]
                    from pretrain_exp.app.cli import main

                    try:
                        main()
                        code = 0
                    except SystemExit as e:
                        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                except BaseException:  # noqa: BLE001
                    traceback.print_exc()
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(code)
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            if self.popen is not None:
                self.returncode = self.popen.poll()
            else:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def signal_tree(self, sig: int) -> list:
        """Send ``sig`` to the run's whole process tree (torchrun's ranks run in their own sessions); the
        ``psutil.Process`` list it reached."""
        import psutil

        try:
            procs = [psutil.Process(self.pid)]
            procs += procs[0].children(recursive=True)
        except psutil.NoSuchProcess:
            procs = []
        for p in procs:
            try:
                p.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
        return procs

    def kill(self) -> None:
        """SIGKILL the run's whole process tree, then reap it."""
        import psutil

        procs = self.signal_tree(signal.SIGKILL)
        psutil.wait_procs(procs[1:], timeout=30)
        self.wait()

    def wait(self) -> int:
        if self.popen is not None:
            self.returncode = self.popen.wait()
        elif self.returncode is None:
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.returncode


def _env(work: Path) -> Dict[str, str]:
    from tests.conftest import CACHE_DIR

    return {"PRETRAIN_EXP_RUNS": str(work), "PRETRAIN_EXP_CACHE": str(CACHE_DIR), "WANDB_SILENT": "true",
            "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def run_watched(setup: Setup, run_dir: Path, out_path: Path, env: Dict[str, str], spawn: bool,
                kill_after: Optional[Tuple[str, float]] = None, timeout: float = 900,
                hook: Optional[Tuple[str, Callable[[], None]]] = None) -> Tuple[Optional[float], Watch, int]:
    """Run ``setup`` in ``run_dir`` while watching its events; with ``kill_after=(label, seconds)`` SIGKILL it
    ``seconds`` after the event ``label`` (``"startup"``: the start of the run); with ``hook=(label, fn)`` call
    ``fn()`` once as soon as event ``label`` is seen, with the run's processes stopped (SIGSTOP, then SIGCONT), so
    that the run writes nothing while ``fn`` runs.

    :returns: ``(kill time in seconds since start or None if it ended first, watch, exit status)``.
    """
    run = Run(setup, run_dir, out_path, env, spawn)
    watch = Watch(run_dir, out_path, run.t0)
    deadline = run.t0 + timeout
    while True:
        watch.poll()
        now = time.monotonic() - run.t0
        if hook is not None and hook[0] in watch.seen:
            run.signal_tree(signal.SIGSTOP)
            try:
                hook[1]()
            finally:
                run.signal_tree(signal.SIGCONT)
            hook = None
        if kill_after is not None:
            label, delay = kill_after
            at = (0.0 if label == "startup" else watch.seen.get(label, float("inf"))) + delay
            if now >= at:
                run.kill()
                watch.poll()
                return now, watch, run.returncode
        if run.poll() is not None:
            watch.poll()
            watch.events.append((time.monotonic() - run.t0, "exit"))
            return None, watch, run.returncode
        if time.monotonic() > deadline:
            run.kill()
            raise TimeoutError(f"run in {run_dir} did not end within {timeout} s")
        time.sleep(POLL_S)


# --- comparing run dirs ----------------------------------------------------------------------------------------


def _in_fork(fn: Callable[[], object]) -> object:
    """``fn()`` computed in a forked child (torch work stays out of the process that forks the runs); its result
    must be JSON-serializable."""
    r, w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 0
        try:
            payload = json.dumps({"ok": fn()})
        except BaseException:  # noqa: BLE001
            payload, code = json.dumps({"error": traceback.format_exc()}), 1
        with os.fdopen(w, "w") as f:
            f.write(payload)
        os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        data = f.read()
    os.waitpid(pid, 0)
    res = json.loads(data)
    if "error" in res:
        raise RuntimeError(res["error"])
    return res["ok"]


def weight_digests(setup: Setup, ckpt_dir: Path) -> Dict[str, str]:
    """``{parameter name: sha256 of its bytes (dtype and shape included)}`` of a checkpoint's model weights."""
    def digests():
        import numpy as np

        if setup.weights_file:
            from safetensors.numpy import load_file

            state = load_file(str(ckpt_dir / setup.weights_file))
        else:
            import torch

            from pretrain_exp.frameworks.olmo_core.checkpoint import load_model

            torch.set_num_threads(1)
            state = {k: v.detach().numpy() for k, v in load_model(ckpt_dir).state_dict().items()}
        return {k: hashlib.sha256(f"{v.dtype}{v.shape}".encode() + np.ascontiguousarray(v).tobytes()).hexdigest()
                for k, v in state.items()}
    return _in_fork(digests)


def _eval_view(rec: dict) -> dict:
    return {k: v for k, v in rec.items() if k != "seconds"}


def _results_view(rec: dict) -> dict:
    return {k: rec.get(k) for k in ("step", "plan", "per_dup", "memorization", "metrics", "by_step")}


def trained_rows(run_dir: Path) -> Dict[int, Dict[int, str]]:
    """``{step: {q: sha256 of the row's tokens}}`` from ``rows/rank*.jsonl`` (the last record of a step wins)."""
    out: Dict[int, Dict[int, str]] = {}
    for f in sorted((run_dir / "rows").glob("rank*.jsonl")):
        for line in f.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line cut by the kill
                continue
            out.setdefault(rec["step"], {}).update(zip(rec["rows"], rec["sha256"]))
    return out


class Reference:
    """The uninterrupted run's files, and cached weight digests of checkpoints (keyed by the marker's mtime)."""

    def __init__(self, setup: Setup, run_dir: Path):
        self.setup, self.dir = setup, run_dir
        self._digests: Dict[Tuple[str, int], Dict[str, str]] = {}

    def digests(self, ckpt: Path) -> Dict[str, str]:
        key = (str(ckpt), (ckpt / self.setup.complete_marker).stat().st_mtime_ns)
        if key not in self._digests:
            self._digests[key] = weight_digests(self.setup, ckpt)
        return self._digests[key]

    def complete_checkpoints(self, run_dir: Path) -> List[Path]:
        d = run_dir / "checkpoints"
        return sorted(p for p in d.glob("*") if re.fullmatch(self.setup.ckpt_pattern, p.name)
                      and (p / self.setup.complete_marker).is_file()) if d.is_dir() else []

    def state_mismatches(self, run_dir: Path) -> List[str]:
        """What of ``run_dir``'s durable state differs from the reference (empty: bit-identical)."""
        from pretrain_exp.insertion.plan import Plan

        bad = []
        for ckpt in self.complete_checkpoints(run_dir):
            ref = self.dir / "checkpoints" / ckpt.name
            if not (ref / self.setup.complete_marker).is_file():
                bad.append(f"checkpoint {ckpt.name}: the reference has none")
            elif self.digests(ckpt) != self.digests(ref):
                bad.append(f"checkpoint {ckpt.name}: weights differ")
        for f in sorted((run_dir / "evals").glob("step*/*.json")):
            if f.name.startswith("."):  # the temp file of a write the kill cut short: no reader takes it, and
                continue  # the completed re-run must have removed it (final_mismatches lists every eval file)
            ref = self.dir / f.relative_to(run_dir)
            try:
                same = _eval_view(json.loads(f.read_text())) == _eval_view(json.loads(ref.read_text()))
            except (json.JSONDecodeError, FileNotFoundError) as e:
                same = False
                bad.append(f"{f.relative_to(run_dir)}: {e}")
            if not same:
                bad.append(f"{f.relative_to(run_dir)} differs")
        if (run_dir / "plan.npz").is_file():
            try:
                if Plan.load(run_dir / "plan.npz").digest() != Plan.load(self.dir / "plan.npz").digest():
                    bad.append("plan.npz differs")
            except Exception as e:  # noqa: BLE001  (a torn plan file is the failure this looks for)
                bad.append(f"plan.npz unreadable: {e}")
        for name in ("manifest.jsonl", "items.jsonl"):
            if (run_dir / name).is_file() and (run_dir / name).read_bytes() != (self.dir / name).read_bytes():
                bad.append(f"{name} differs")
        if (run_dir / "results.json").is_file():
            try:
                if _results_view(json.loads((run_dir / "results.json").read_text())) != _results_view(
                        json.loads((self.dir / "results.json").read_text())):
                    bad.append("results.json differs")
            except json.JSONDecodeError as e:
                bad.append(f"results.json unreadable: {e}")
        return bad

    def final_mismatches(self, run_dir: Path) -> List[str]:
        """What of a completed run differs from the reference: its state, and that every reference file exists."""
        bad = self.state_mismatches(run_dir)
        for rel in ("results.json", "plan.npz", "manifest.jsonl", "items.jsonl"):
            if not (run_dir / rel).is_file():
                bad.append(f"{rel} missing")
        ref_evals = sorted(str(f.relative_to(self.dir)) for f in (self.dir / "evals").glob("step*/*.json"))
        got_evals = sorted(str(f.relative_to(run_dir)) for f in (run_dir / "evals").glob("step*/*.json"))
        if got_evals != ref_evals:
            bad.append(f"eval files {got_evals} != {ref_evals}")
        ref_ckpts = [p.name for p in self.complete_checkpoints(self.dir)]
        if [p.name for p in self.complete_checkpoints(run_dir)] != ref_ckpts:
            bad.append(f"checkpoints {[p.name for p in self.complete_checkpoints(run_dir)]} != {ref_ckpts}")
        if (self.dir / "rows").is_dir() and trained_rows(run_dir) != trained_rows(self.dir):
            bad.append("rows trained differ")
        return bad


# --- trials ----------------------------------------------------------------------------------------------------


@dataclass
class Phase:
    name: str  #: the label of the event that starts it ("startup": the run's start)
    start: float  #: seconds since the run's start, in the reference
    duration: float


@dataclass
class Trial:
    index: int
    phase: Phase
    u: float
    chain: int = 0
    killed_at: Optional[float] = None  #: seconds since the run's start
    landed_in: Optional[str] = None  #: the phase the kill landed in, by the killed run's own events
    state_ok: Optional[bool] = None
    completed_ok: Optional[bool] = None
    problems: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.state_ok and self.completed_ok)


def phases_of(events: List[Tuple[float, str]]) -> List[Phase]:
    """The phases of a reference timeline: ``startup`` then one per event (the last ends at ``exit``)."""
    points = [(0.0, "startup")] + [e for e in events if e[1] != "exit"]
    end = next(t for t, label in events if label == "exit")
    ends = [t for t, _ in points[1:]] + [end]
    return [Phase(label, t, max(e - t, 0.0)) for (t, label), e in zip(points, ends)]


def landed_in(events: List[Tuple[float, str]], t: float) -> str:
    """The phase of a run that time ``t`` (seconds since its start) falls in: the last event before it."""
    name = "startup"
    for te, label in events:
        if te <= t:
            name = label
    return name


def plan_trials(phases: List[Phase], n: int, seed: int) -> List[List[Trial]]:
    """``n`` trials over ``phases`` (cycling through a seeded permutation, so every phase gets one once
    ``n >= len(phases)``), grouped into chains of trials sorted by phase (each chain visits a phase once)."""
    rng = random.Random(seed)
    order: List[int] = []
    while len(order) < n:
        perm = list(range(len(phases)))
        rng.shuffle(perm)
        order += perm
    order = order[:n]
    chains: List[List[Trial]] = []
    for c in range(0, n, len(phases)):
        idx = sorted(order[c:c + len(phases)])
        chains.append([Trial(c + i, phases[p], rng.random(), chain=len(chains)) for i, p in enumerate(idx)])
    return chains


@dataclass
class Report:
    setup: str
    trials: List[Trial]
    reference_phases: List[Phase]
    seconds: float

    @property
    def ok(self) -> int:
        return sum(t.ok for t in self.trials)

    def summary(self) -> str:
        lines = [f"{self.setup}: {self.ok}/{len(self.trials)} killed runs re-ran to bit-identical results "
                 f"({self.seconds:.0f} s)"]
        for t in self.trials:
            lines.append(f"  trial {t.index:3d} chain {t.chain}: target {t.phase.name!r} +{t.u:.2f} of "
                         f"{t.phase.duration:.2f} s, killed at {t.killed_at and round(t.killed_at, 2)} s in "
                         f"{t.landed_in!r}: {'ok' if t.ok else '; '.join(t.problems) or 'FAILED'}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"setup": self.setup, "ok": self.ok, "n": len(self.trials), "seconds": self.seconds,
                "phases": [p.__dict__ for p in self.reference_phases],
                "trials": [{"index": t.index, "chain": t.chain, "target": t.phase.name, "u": t.u,
                            "killed_at": t.killed_at, "landed_in": t.landed_in, "ok": t.ok,
                            "problems": t.problems} for t in self.trials]}


def run_trials(name: str, n: int, work: Path, seed: int = 0, spawn: bool = False,
               log: Callable[[str], None] = functools.partial(print, flush=True)) -> Report:
    """The reference run and ``n`` kill trials of setup ``name`` under ``work`` (module docstring); ``n = 0``:
    one per phase of the reference timeline, at least :data:`MIN_TRIALS`."""
    setup = SETUPS[name]
    t_start = time.monotonic()
    work.mkdir(parents=True, exist_ok=True)
    env = _env(work)
    ref_dir = work / f"{name}-reference"
    shutil.rmtree(ref_dir, ignore_errors=True)
    _, watch, rc = run_watched(setup, ref_dir, work / f"{name}-reference.out", env, spawn)
    if rc != 0:
        raise RuntimeError(f"the reference run failed (exit {rc}):\n"
                           f"{(work / f'{name}-reference.out').read_text()[-3000:]}")
    ref = Reference(setup, ref_dir)
    phases = phases_of(watch.events)
    n = n or max(MIN_TRIALS, len(phases))
    log(f"{name}: reference run {watch.events[-1][0]:.1f} s; phases: " + ", ".join(
        f"{p.name} {p.duration:.2f}s" for p in phases))
    trials: List[Trial] = []
    for chain in plan_trials(phases, n, seed):
        run_dir = work / f"{name}-chain{chain[0].chain}"
        shutil.rmtree(run_dir, ignore_errors=True)
        pending = list(chain)
        attempt = 0
        while pending:
            t = pending.pop(0)
            attempt += 1
            out = run_dir.parent / f"{run_dir.name}-{attempt}.out"
            killed_at, w, rc = run_watched(setup, run_dir, out, env, spawn,
                                           kill_after=(t.phase.name, t.u * t.phase.duration))
            if killed_at is None:  # the run ended before reaching the kill point
                t.problems.append(f"the run ended (exit {rc}) before the kill point"
                                  + ("" if rc == 0 else f": {out.read_text()[-2000:]}"))
                t.state_ok = False
                if rc == 0:  # completed before the kill: check it, then try the trial again, half as far in
                    t.problems, t.state_ok = [], None
                    t.u /= 2
                    pending.insert(0, t)
                    for done in trials:
                        if done.chain == t.chain and done.completed_ok is None:
                            done.completed_ok = not (bad := ref.final_mismatches(run_dir))
                            done.problems += [f"after completion: {b}" for b in bad]
                    if t.phase.name not in RECURRING:  # a completed run dir never reaches this phase again
                        run_dir = work / f"{name}-chain{t.chain}-{attempt}"
                        shutil.rmtree(run_dir, ignore_errors=True)
                    if attempt > 3 * len(chain):
                        raise RuntimeError(f"{name}: trials keep missing their kill point")
                    continue
                trials.append(t)
                continue
            t.killed_at, t.landed_in = killed_at, landed_in(w.events, killed_at)
            bad = ref.state_mismatches(run_dir)
            t.state_ok = not bad
            t.problems += [f"after the kill: {b}" for b in bad]
            trials.append(t)
            log(f"  trial {t.index}: target {t.phase.name} +{t.u:.2f}, killed at {killed_at:.2f} s in "
                f"{t.landed_in!r}; state {'identical' if not bad else bad}")
        out = run_dir.parent / f"{run_dir.name}-final.out"
        _, _, rc = run_watched(setup, run_dir, out, env, spawn)
        bad = ([f"the re-run failed (exit {rc}): {out.read_text()[-2000:]}"] if rc != 0
               else ref.final_mismatches(run_dir))
        for t in trials:
            if t.chain == chain[0].chain and t.completed_ok is None:
                t.completed_ok = not bad
                t.problems += [f"after completion: {b}" for b in bad]
    return Report(name, sorted(trials, key=lambda t: t.index), phases, time.monotonic() - t_start)


# --- disk full --------------------------------------------------------------------------------------------------


def fill(mount: Path, leave: int = 0, grow: Optional[Path] = None) -> Path:
    """Fill the filesystem at ``mount`` with a file of zeros until about ``leave`` bytes are free; returns it. With
    ``leave=0`` and ``grow``, append newlines to the existing file ``grow`` until it cannot grow either (the free
    bytes of its last page), so that not even that file takes another write."""
    filler = mount / "filler"
    block = b"\0" * (1 << 20)
    with open(filler, "ab", buffering=0) as f:  # unbuffered: nothing is left to flush (and fail) at close
        try:
            while (free := shutil.disk_usage(mount).free) > leave:
                f.write(block[:max(1, min(len(block), free - leave))])
        except OSError:  # full (the run writing beside the filler can take the last bytes first)
            pass
    if grow is not None and leave == 0:
        with open(grow, "ab", buffering=0) as f:
            try:
                for _ in range(1 << 16):
                    f.write(b"\n")
            except OSError:
                pass
    return filler


def mount_tmpfs(path: Path, size_mb: int) -> Optional[str]:
    """Mount a ``size_mb`` MiB tmpfs at ``path``; ``None``, or why it cannot be done here."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "mounting a size-limited tmpfs needs root"
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)],
                          capture_output=True, text=True)
    return None if proc.returncode == 0 else f"mount -t tmpfs failed: {proc.stderr.strip()}"


def _error_lines(out: Path) -> List[str]:
    return [line for line in out.read_text(errors="replace").splitlines() if line.startswith("error:")]


def disk_full_trials(work: Path, spawn: bool = False, size_mb: int = 64, tries: int = 3,
                     log: Callable[[str], None] = functools.partial(print, flush=True)) -> dict:
    """The hf setup on a ``size_mb`` MiB tmpfs, the disk filled (1) while the step-1 eval is written (to the last
    byte: not even the run's log can grow) and (2) while the step-2 checkpoint is written, each run checked (exit
    status, its ``error:`` and ``warning:`` lines, the run dir's durable state against an uninterrupted reference
    run: the step-2 checkpoint intact), then (3) the filler removed and the same command re-run to the end,
    compared with the reference.

    The disk is filled while the run is stopped, as soon as the case's event is seen (``eval step 1``, ``training
    1->2``); a case whose file was already written by then (a loaded machine saw the event late) is ``late`` and,
    for the eval case, run again from an empty run dir, up to ``tries`` times.

    :returns: ``{"skipped": why}`` where no tmpfs can be mounted, else per case ``rc``, ``errors`` and
        ``warnings`` (those lines), ``tracebacks``, ``state`` (mismatches with the reference), ``step1_intact``,
        ``late`` and ``tries``, and ``final`` (mismatches of the completed re-run).
    """
    setup = SETUPS["hf"]
    work.mkdir(parents=True, exist_ok=True)
    mount = work / "mnt"
    why = mount_tmpfs(mount, size_mb)
    if why:
        return {"skipped": why}
    try:
        env = _env(work)
        ref_dir = work / "reference"
        _, _, rc = run_watched(setup, ref_dir, work / "reference.out", env, spawn)
        if rc != 0:
            raise RuntimeError(f"the reference run failed: {(work / 'reference.out').read_text()[-3000:]}")
        ref = Reference(setup, ref_dir)
        run_dir = mount / "run"
        res: dict = {}
        for case, label, leave, written in (("eval", "eval step 1", 0, "evals/step1/insertion_loss.json"),
                                            ("checkpoint", "training 1->2", 1 << 20, "checkpoints/checkpoint-2")):
            attempts = tries if case == "eval" else 1  # the checkpoint case resumes what the eval case left
            for attempt in range(1, attempts + 1):
                late: list = []  # whether the case's file existed when the disk was filled

                def full(written=written, leave=leave, late=late) -> None:
                    late.append((run_dir / written).exists())
                    fill(mount, leave, grow=run_dir / "pretrain_exp.log")

                out = work / f"{case}.out"
                _, _, rc = run_watched(setup, run_dir, out, env, spawn, hook=(label, full))
                (mount / "filler").unlink(missing_ok=True)
                if late != [True] or attempt == attempts:
                    break
                log(f"disk full while writing the {case}: {written} was written before the disk was full "
                    f"(try {attempt}); again from an empty run dir")
                shutil.rmtree(run_dir)
            step1, ref1 = (d / "checkpoints" / "checkpoint-1" for d in (run_dir, ref_dir))
            text = out.read_text(errors="replace")
            res[case] = {"rc": rc, "errors": _error_lines(out), "tracebacks": text.count("Traceback"),
                         "warnings": [line for line in text.splitlines() if line.startswith("warning:")],
                         "state": ref.state_mismatches(run_dir), "late": late == [True], "tries": attempt,
                         "step1_intact": (step1 / setup.complete_marker).is_file()
                         and ref.digests(step1) == ref.digests(ref1)}
            log(f"disk full while writing the {case}: exit {rc}, {res[case]['errors']}")
        out = work / "final.out"
        _, _, rc = run_watched(setup, run_dir, out, env, spawn)
        res["final"] = {"rc": rc, "mismatches": ref.final_mismatches(run_dir) if rc == 0 else _error_lines(out)}
        log(f"re-run after freeing space: exit {rc}, {res['final']['mismatches'] or 'identical to the reference'}")
        return res
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _preimport() -> None:
    """Import what every run imports, once, before forking runs (the run's own process then starts warm)."""
    import importlib

    import datasets  # noqa: F401
    import matplotlib.pyplot  # noqa: F401
    import transformers
    import wandb  # noqa: F401

    import pretrain_exp.app.cli  # noqa: F401
    import pretrain_exp.app.experiment  # noqa: F401
    import pretrain_exp.frameworks.hf.framework  # noqa: F401

    transformers.Trainer, transformers.AutoModelForCausalLM  # resolve the lazy modules (and peft) now
    for f in sorted((ROOT / "evals").glob("*.py")):
        importlib.import_module("pretrain_exp.evals" if f.stem == "__init__" else f"pretrain_exp.evals.{f.stem}")
    try:
        import pretrain_exp.frameworks.olmo_core.framework  # noqa: F401
    except ImportError:
        pass


def main(argv: Optional[List[str]] = None) -> int:
    """Command line (module docstring); exit status 0 when every trial is bit-identical."""
    p = argparse.ArgumentParser(prog="python -m tests.kill_trials", description=__doc__.split("\n\n")[0])
    p.add_argument("--setup", nargs="+", default=list(SETUPS), choices=list(SETUPS))
    p.add_argument("--trials", type=int, default=int(os.environ.get("KILL_TRIALS", "0")),
                   help="trials per setup (default $KILL_TRIALS, else one per phase and at least 10)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", type=Path, default=None, help="working dir (default: a temp dir, removed)")
    p.add_argument("--json", type=Path, default=None, help="write the reports here")
    p.add_argument("--spawn", action="store_true", help="a fresh interpreter per run instead of fork")
    p.add_argument("--disk-full", action="store_true", help="run the disk-full trials instead (root: tmpfs)")
    args = p.parse_args(argv)
    if not args.spawn:
        _preimport()
    work = args.work or Path(tempfile.mkdtemp(prefix="kill_trials."))
    if args.disk_full:
        try:
            res = disk_full_trials(work / "disk_full", args.spawn)
        finally:
            if args.work is None:
                shutil.rmtree(work, ignore_errors=True)
        if args.json:
            args.json.write_text(json.dumps(res, indent=1))
        print(json.dumps(res, indent=1))
        return 0
    reports = []
    try:
        for name in args.setup:
            rep = run_trials(name, args.trials, work / name, args.seed, args.spawn)
            print(rep.summary(), flush=True)
            reports.append(rep)
    finally:
        if args.json:
            args.json.write_text(json.dumps([r.to_json() for r in reports], indent=1))
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    for r in reports:
        print(f"{r.setup}: {r.ok}/{len(r.trials)} bit-identical")
    return 0 if all(r.ok == len(r.trials) for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
