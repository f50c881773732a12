"""Why a job has no results: the most telling error line of its submitit logs and its own log.

Also the failures known only from submitit logs (a job whose dir was removed after an error of the user's making).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from pretrain_exp.core.rundir import RunDir
from pretrain_exp.report.jobs import Job, find_job_dirs, is_job_dir, load_job, natural_key, walk
from pretrain_exp.report.pending import describe_pending

_SUBMITIT_LOG = re.compile(r"^(?P<job_id>.+)_(?P<rank>\d+)_log\.(?P<kind>out|err)$")

_LOG_LEVEL = re.compile(r"\]\[(ERROR|CRITICAL|WARNING)\] - ")


def last_error_line(text: str) -> Tuple[int, str]:
    """The most telling failure line of a log: ``(priority, line)``, higher is better, ``(0, "")`` if none.

    Priority 5: the run's own last words, its last ``interrupted (...)`` line (a stopped run: the step kept and the
    command that resumes) or ``error: ...`` line or log record (what the entry point prints, and logs in a sweep, for
    an error of the user's making); 4: another program's ``...: error: ...`` line (SLURM's ``slurmstepd: error:``,
    ``srun: error:``, often printed after the run's line); 3: the exception line closing the last Python traceback;
    2: the last ERROR/CRITICAL log record; 1: the last WARNING log record (e.g. a failed training attempt before a
    retry).
    """
    best: Dict[int, str] = {}
    in_tb = False
    for line in text.splitlines():
        s = line.strip()
        if not s:
            continue
        if s.startswith("Traceback (most recent call last)"):
            in_tb = True
            continue
        if in_tb and not line[:1].isspace():
            best[3] = s
            in_tb = False
        m = _LOG_LEVEL.search(s)
        msg = s[m.end():] if m else s  # a log record: its message
        if msg.startswith(("error: ", "interrupted (")):
            best[5] = msg
        elif " error: " in msg:
            best[4] = msg
        elif m:
            best[1 if m[1] == "WARNING" else 2] = msg
    if not best:
        return 0, ""
    top = max(best)
    return top, best[top]


def _read_log(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def submitit_logs(root: Path) -> List[Path]:
    """Hydra submitit launcher logs of the sweep(s) under ``root`` (of the sweep holding ``root`` if it is a job
    dir): ``<sweep>/.submitit/<slurm job id>/<id>_<task>_log.{err,out}``."""
    root = Path(root)
    dirs = [root.parent / ".submitit"] if is_job_dir(root) else walk(root)[1]
    return sorted(p for d in dirs if d.is_dir() for p in d.glob("*/*_log.*") if _SUBMITIT_LOG.match(p.name))


def _log_job_id(path: Path) -> Tuple[str, str]:
    """(submitit job id, array task index or "") of a submitit log file name ``<jobid>_<rank>_log.<kind>``."""
    job_id = _SUBMITIT_LOG.match(path.name)["job_id"]
    task = job_id.rsplit("_", 1)[1] if re.fullmatch(r"\d+_\d+", job_id) else ""
    return job_id, task


def match_logs(job: Job, logs: Sequence[Path], texts: Dict[Path, str]) -> List[Path]:
    """The submitit logs of ``job``: by the Hydra job id the launcher recorded in ``.hydra/hydra.yaml`` (the
    submitit job id), else by the job dir's path printed in the log, else by the Hydra job number (= array task
    index for a sweep submitted as one array)."""
    job_id = str(job.hydra_job.get("id", ""))
    by_id = [p for p in logs if _log_job_id(p)[0] == job_id]
    if by_id:
        return by_id
    path = str(job.path.resolve())
    by_path = [p for p in logs if re.search(re.escape(path) + r"(?![\w/.-])", texts[p])]
    if by_path:
        return by_path
    num = job.hydra_job.get("num")
    return [p for p in logs if num is not None and _log_job_id(p)[1] == str(num)]


def failure_reason(job: Job, logs: Sequence[Path]) -> str:
    """Why ``job`` has no results: the best error line (:func:`last_error_line`) of its submitit ``.err``/
    ``.out`` logs and its own log file, naming the file it came from."""
    candidates = sorted(logs, key=lambda p: (not p.name.endswith(".err"), str(p)))
    candidates += sorted(job.path.glob("*.log"))
    best, where = (0, ""), None
    for p in candidates:
        found = last_error_line(_read_log(p))
        if found[0] > best[0]:
            best, where = found, p
    pending = describe_pending(job.path)
    pending = f"; {pending}" if pending else ""
    if where is None:
        return f"no {RunDir.RESULTS} and no error in its logs (still running, or killed?){pending}"
    return f"{best[1]} ({where.name}){pending}"


def collect(root: Path) -> Tuple[List[Job], List[dict]]:
    """Jobs under ``root`` (with the failure reason of those without results) and the failures known only from
    submitit logs (a job whose dir was removed after an error of the user's making): ``[{job, reason}]``."""
    root = Path(root)
    jobs = [load_job(p, root) for p in find_job_dirs(root)]
    logs = submitit_logs(root)
    texts = {p: _read_log(p) for p in logs}
    used = set()
    for j in jobs:
        mine = match_logs(j, logs, texts)
        used.update(mine)
        if j.results is None:
            j.reason = j.reason or failure_reason(j, mine)
    orphans: List[dict] = []
    if is_job_dir(root):  # the other logs of the sweep belong to its other jobs
        return jobs, orphans
    by_id: Dict[str, List[Path]] = {}
    for p in logs:
        if p not in used:
            by_id.setdefault(_log_job_id(p)[0], []).append(p)
    for job_id, paths in sorted(by_id.items(), key=lambda kv: natural_key(kv[0])):
        found = max((last_error_line(texts[p]) + (p,) for p in paths), key=lambda t: (t[0], t[2].name.endswith(".err")))
        if found[0] >= 3:
            orphans.append({"job": f"submitit job {job_id} (no job dir)", "overrides": "",
                            "reason": f"{found[1]} ({found[2].relative_to(root)})"})
    return jobs, orphans
