"""A SLURM submission checked against the cluster before it is made, and sbatch's refusal as one line.

:func:`check_launcher` compares the ``hydra.launcher`` settings of a sweep under ``hydra/launcher=slurm*``
(Hydra's submitit launcher) with what ``sinfo`` reports of the partition (nodes, CPUs, memory and GPUs of its
largest node, time limit): an unknown partition, GPUs asked of a partition without them, or memory, CPUs, nodes or
time over the partition's limit is refused with one :class:`~pretrain_exp.core.errors.LaunchError` naming each
``hydra.launcher.*`` option to change and the partition's limits, before anything is submitted; so is a machine
without ``sbatch``. :func:`submission_error_line` turns a refusal sbatch still makes (a limit ``sinfo`` does not
show: an account, a QOS, ``MaxMemPerNode``) into the same kind of line.

``sinfo``'s fields (``sinfo -o``): ``%P`` partition (``*``: the default), ``%D`` nodes, ``%c`` CPUs per node,
``%m`` memory per node in MB, ``%G`` generic resources (``gpu:4``, ``gpu:a100:8(S:0-1)``, ``(null)``), ``%l``
time limit (``infinite``, ``[days-]hours:minutes:seconds``); a ``+`` marks nodes of different sizes (the largest
is used).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional

from pretrain_exp.core.errors import LaunchError

#: ``sinfo`` output format: one line per partition and node group (module docstring)
SINFO_FORMAT = "%P|%D|%c|%m|%G|%l"


@dataclass
class Partition:
    """What ``sinfo`` reports of one partition: ``nodes`` (count), ``cpus`` / ``mem_mb`` / ``gpus`` of its largest
    node (memory in MB, GPUs from its ``gpu`` generic resource), ``time_min`` its time limit in minutes (``None``:
    none), ``default`` whether jobs without ``--partition`` go there."""

    name: str
    nodes: int = 0
    cpus: int = 0
    mem_mb: int = 0
    gpus: int = 0
    time_min: Optional[int] = None
    default: bool = False

    def describe(self) -> str:
        """E.g. ``partition 'debug' (sinfo): 1 node(s) of 2 CPUs, 21.5 GB, no GPU; no time limit``."""
        gpus = f"{self.gpus} GPU(s)" if self.gpus else "no GPU"
        limit = f"time limit {self.time_min} min" if self.time_min is not None else "no time limit"
        return (f"partition {self.name!r} (sinfo): {self.nodes} node(s) of {self.cpus} CPUs, "
                f"{self.mem_mb / 1024:.1f} GB, {gpus}; {limit}")


def is_slurm_launcher(target: Optional[str]) -> bool:
    """Whether ``target`` (``hydra.launcher._target_``) is Hydra's submitit SLURM launcher."""
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher

    return target == f"{SlurmLauncher.__module__}.{SlurmLauncher.__qualname__}"


def sinfo_minutes(text: str) -> Optional[int]:
    """A ``sinfo`` time limit in minutes (rounded up): ``infinite`` / ``UNLIMITED`` / ``n/a`` -> ``None``,
    ``days-hours[:minutes[:seconds]]``, ``hours:minutes:seconds``, ``minutes:seconds``, ``minutes`` (SLURM's
    time formats, ``man sbatch`` ``--time``)."""
    text = text.strip().lower()
    if not text or text in ("infinite", "unlimited", "n/a", "none"):
        return None
    days, _, rest = text.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:
        h, m, s = (parts + [0, 0, 0])[:3]
    else:
        h, m, s = {1: [0, parts[0], 0], 2: [0, *parts], 3: parts}[len(parts)]
    return int(days or 0) * 1440 + h * 60 + m + (1 if s else 0)


def gres_gpus(text: str) -> int:
    """GPUs per node in a ``sinfo`` ``%G`` field (``gpu:4``, ``gpu:a100:8(S:0-1)``, ``gpu:2,shard:4``); 0 for
    ``(null)`` or none."""
    total = 0
    for item in re.split(r",(?![^()]*\))", text):
        fields = re.sub(r"\(.*?\)", "", item).split(":")
        if fields[0] == "gpu" and len(fields) > 1 and fields[-1].isdigit():
            total += int(fields[-1])
    return total


def parse_sinfo(text: str) -> Dict[str, Partition]:
    """The partitions of ``sinfo -h -o`` :data:`SINFO_FORMAT` output, by name (node groups of one partition
    merged: nodes added, the largest node's resources kept)."""
    out: Dict[str, Partition] = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 6:
            continue
        name, nodes, cpus, mem, gres, limit = fields
        default = name.endswith("*")
        p = out.setdefault(name.rstrip("*"), Partition(name.rstrip("*")))
        p.default |= default
        p.nodes += int(nodes) if nodes.isdigit() else 0
        p.cpus = max(p.cpus, int(cpus.rstrip("+") or 0))
        p.mem_mb = max(p.mem_mb, int(mem.rstrip("+") or 0))
        p.gpus = max(p.gpus, gres_gpus(gres))
        p.time_min = sinfo_minutes(limit)
    return out


def query_partitions(timeout_s: float = 30) -> Optional[Dict[str, Partition]]:
    """The cluster's partitions (:func:`parse_sinfo`), or ``None`` where ``sinfo`` is missing or fails (the
    controller does not answer): then sbatch's own answer is the check."""
    if shutil.which("sinfo") is None:
        return None
    try:
        proc = subprocess.run(["sinfo", "--all", "-h", "-o", SINFO_FORMAT], capture_output=True, text=True,
                              timeout=timeout_s)  # --all: hidden partitions too (sbatch takes them)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_sinfo(proc.stdout) if proc.returncode == 0 else None


def _int(value) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def launcher_problems(launcher: Mapping, partitions: Dict[str, Partition]) -> List[str]:
    """What SLURM would refuse in the launcher settings ``launcher`` (``hydra.launcher``, resolved) on
    ``partitions``, one phrase per ``hydra.launcher.*`` option, the partition's limits last; ``[]`` if nothing."""
    name = launcher.get("partition")
    if name and "," in str(name):  # several partitions: SLURM picks one that fits
        return []
    default = next((p for p in partitions.values() if p.default), None)
    part = partitions.get(str(name)) if name else default
    if part is None:
        from pretrain_exp.app.hydra_errors import did_you_mean

        names = ", ".join(partitions) or "none"
        if name:
            return [f"hydra.launcher.partition={name}: no such partition (sinfo: {names})"
                    + did_you_mean(str(name), partitions, "hydra.launcher.partition=")]
        return [f"hydra.launcher.partition is not set and the cluster has no default partition (sinfo: {names})"]
    where = f"partition {part.name!r}"
    out = []
    gpus = _int(launcher.get("gpus_per_node"))
    if gpus > part.gpus:
        with_gpus = [p.name for p in partitions.values() if p.gpus >= gpus]
        has = f"{part.gpus} GPU(s) per node" if part.gpus else "no GPUs"
        fixes = [f"hydra.launcher.partition={with_gpus[0]}"
                 + (f" (partitions with {gpus} GPU(s): {', '.join(with_gpus)})" if len(with_gpus) > 1 else "")
                 ] if with_gpus else []
        fixes.append(f"hydra.launcher.gpus_per_node={part.gpus}" if part.gpus else
                     "hydra.launcher.gpus_per_node=null (hydra/launcher=slurm_cpu) to run on CPUs")
        fix = ("" if with_gpus else f"no partition has {gpus} GPU(s) per node: ") + "set " + " or ".join(fixes)
        out.append(f"hydra.launcher.gpus_per_node={gpus}: {where} has {has}; {fix}")
    tasks = max(1, _int(launcher.get("tasks_per_node")))
    cpus = _int(launcher.get("cpus_per_task")) * tasks
    if part.cpus and cpus > part.cpus:
        out.append(f"hydra.launcher.cpus_per_task={launcher.get('cpus_per_task')}"
                   + (f" x tasks_per_node={tasks}" if tasks > 1 else "")
                   + f": {cpus} CPUs, more than a node of {where} has ({part.cpus})")
    mem_gb = launcher.get("mem_gb")
    if part.mem_mb and mem_gb is not None and float(mem_gb) * 1024 > part.mem_mb:
        out.append(f"hydra.launcher.mem_gb={mem_gb}: more than a node of {where} has "
                   f"({part.mem_mb / 1024:.1f} GB)")
    nodes = _int(launcher.get("nodes"))
    if part.nodes and nodes > part.nodes:
        out.append(f"hydra.launcher.nodes={nodes}: {where} has {part.nodes} node(s)")
    timeout = _int(launcher.get("timeout_min"))
    if part.time_min is not None and timeout > part.time_min:
        out.append(f"hydra.launcher.timeout_min={timeout}: over the time limit of {where} ({part.time_min} min)")
    return [*out, part.describe()] if out else []


def check_launcher(launcher: Mapping, partitions: Optional[Dict[str, Partition]] = None) -> None:
    """Refuse a SLURM sweep that SLURM would refuse (module docstring), before anything is submitted.

    :param launcher: the resolved ``hydra.launcher`` settings of a ``hydra/launcher=slurm*`` sweep.
    :param partitions: the cluster's partitions; ``None``: ask ``sinfo`` (:func:`query_partitions`).
    :raises LaunchError: one line naming every ``hydra.launcher.*`` option to change and the partition's limits;
        ``sbatch`` missing names ``hydra/launcher``.
    """
    if shutil.which("sbatch") is None:
        raise LaunchError("hydra/launcher=slurm: there is no `sbatch` on this machine's PATH (not a SLURM login "
                          "node); submit the sweep from one, or run it here with hydra/launcher=local")
    partitions = query_partitions() if partitions is None else partitions
    if not partitions:
        return
    problems = launcher_problems(launcher, partitions)
    if problems:
        raise LaunchError("SLURM would refuse this sweep: " + "; ".join(problems))


#: sbatch's refusals (its stderr) -> the launcher option to change
_SBATCH_ERRORS = [
    (r"invalid partition", "hydra.launcher.partition"),
    (r"feature", "hydra.launcher.constraint"),
    (r"generic resource|gres|gpu", "hydra.launcher.gpus_per_node"),
    (r"memory specification|mem", "hydra.launcher.mem_gb"),
    (r"time limit", "hydra.launcher.timeout_min"),
    (r"more processors|cpus|cpu count", "hydra.launcher.cpus_per_task"),
    (r"node count|nodes", "hydra.launcher.nodes"),
    (r"account", "hydra.launcher.account"),
    (r"qos", "hydra.launcher.qos"),
    (r"node configuration", "hydra.launcher.mem_gb, cpus_per_task or gpus_per_node"),
]


def submission_error_line(e: BaseException, launcher: Optional[Mapping] = None) -> Optional[str]:
    """One line (without ``error:``) for a SLURM submission that failed (submitit's ``FailedJobError`` raised by
    ``sbatch``, or no ``srun``/``sbatch`` on the machine), naming the launcher option to change and, where
    ``sinfo`` answers, the partition's limits; ``None`` for any other error (e.g. a job that failed)."""
    from submitit.core.utils import UncompletedJobError

    cause = e.__cause__
    if not (isinstance(cause, subprocess.CalledProcessError) and cause.cmd and "sbatch" in str(cause.cmd[0])):
        # a job that ran and failed (its log may name srun and slurm) is no submission
        if isinstance(e, RuntimeError) and not isinstance(e, UncompletedJobError) and "srun" in str(e) \
                and "slurm" in str(e).lower():
            return ("hydra/launcher=slurm: there is no `srun`/`sbatch` on this machine's PATH (not a SLURM login "
                    "node); submit the sweep from one, or run it here with hydra/launcher=local; nothing was submitted")
        return None
    said = [ln.split("error:", 1)[-1].strip().removeprefix("Batch job submission failed: ")
            for ln in str(cause.stderr or e).splitlines() if ln.strip()]
    reason = " / ".join(said) or "refused"
    option = next((opt for pat, opt in _SBATCH_ERRORS if re.search(pat, " ".join(said), re.I)),
                  "hydra.launcher.*")
    line = f"sbatch refused the sweep ({reason}): change {option}"
    if launcher is not None:
        partitions = query_partitions()
        name = launcher.get("partition")
        part = (partitions or {}).get(str(name)) if name else next(
            (p for p in (partitions or {}).values() if p.default), None)
        if part is not None:
            line += f"; {part.describe()}"
    return line + "; nothing was submitted"
