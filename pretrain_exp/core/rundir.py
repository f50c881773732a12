"""The layout of a run directory, in one place: :class:`RunDir` names every file and folder of a run dir and reads
the plain-data ones; nothing else in the project spells a run-dir file name or parses ``step<N>``
(``tests/unit/core/test_rundir.py`` checks the source).

A run dir (one Hydra job; docs/reference/run-dir.md)::

    config.resolved.yaml          the resolved config (credentials redacted); re-runs compare with it
    .hydra/{config,hydra,overrides}.yaml   Hydra's files, written by the app
    pretrain_exp.log              the job's log: the console's lines and the engines' detail (core/logs.py)
    .lock                         the run-dir lock (:mod:`~pretrain_exp.core.runlock`)
    plan.npz, manifest.jsonl, items.jsonl, audit.json    the insertion plan, its tables and the audit
    dynamic/step<N>.json          closed-loop additions decided at step N
    checkpoints/                  the framework's checkpoints (``step<N>/`` OLMo-core, ``checkpoint-<k>/`` HF)
    olmo_core_work/               OLMo-core's data work dir (global-indices files)
    rows/rank<r>.jsonl            the rows each rank trained (``training.log_rows``)
    torchrun/                     the ranks' logs of a multi-process run
    trainer_log.csv               the HF Trainer's scalars (``training.report_to=[csv]``)
    hf/step<N>/                   kept HF exports
    evals/step<N>/<task>.json     eval results; ``.async.json`` and ``async.log`` of background evals;
    evals/slurm/                  submitit's folder of SLURM eval jobs
    results.json, metrics.jsonl, wandb_id.txt, wandb/   the summary, every logged scalar, the W&B run
    manifest.parquet, items.parquet, evals.parquet       Parquet copies of the tables
    plots/<name>.png              figures
    release/                      the default release bundle
    arms/<arm>-seed<s>/           a CPDT run's arms (each one a run dir)
    cpdt.{json,csv,md}            a CPDT run's interaction table (and ``plots/cpdt.png``)

Only the standard library and PyYAML are used (no training stack), so the report and the inspector read run dirs
without torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

STEP = "step"  #: prefix of step folders and files: ``step<N>``


def step_name(step: int, prefix: str = STEP, suffix: str = "") -> str:
    """``<prefix><step><suffix>``, e.g. ``step12`` or ``step12.json``."""
    return f"{prefix}{int(step)}{suffix}"


def parse_step(name: str, prefix: str = STEP, suffix: str = "") -> Optional[int]:
    """``N`` of a name ``<prefix><N><suffix>`` (``N`` decimal digits), else ``None`` (``step12`` -> 12,
    ``checkpoint-7`` with ``prefix="checkpoint-"`` -> 7, ``stepX`` -> None)."""
    if not (name.startswith(prefix) and name.endswith(suffix)) or len(name) <= len(prefix) + len(suffix):
        return None
    digits = name[len(prefix):len(name) - len(suffix)]
    return int(digits) if digits.isascii() and digits.isdigit() else None


def step_dirs(parent: str | Path, prefix: str = STEP, marker: Optional[str] = None,
              suffix: str = "") -> List[Tuple[int, Path]]:
    """The entries of ``parent`` named ``<prefix><N><suffix>`` (:func:`parse_step`), as ``[(N, path), ...]`` by
    ``N``; with ``marker``, only folders holding that file (what a framework writes last into a checkpoint).
    ``[]`` if ``parent`` does not exist."""
    parent = Path(parent)
    if not parent.is_dir():
        return []
    out = []
    for p in parent.iterdir():
        n = parse_step(p.name, prefix, suffix)
        if n is not None and (marker is None or (p / marker).is_file()):
            out.append((n, p))
    return sorted(out)


def _read_json(path: Path) -> Optional[Any]:
    return json.loads(path.read_text()) if path.is_file() else None


class RunDir:
    """One run directory (module docstring): its paths, its step folders and readers of its plain-data files.

    Paths are computed, never created; readers return ``None`` (or empty) for a file the run has not written yet
    and raise the parser's own error (``json.JSONDecodeError``, ``yaml.YAMLError``) for a malformed one.

    :param path: the run dir (absolute or relative; kept as given).
    """

    # --- names (the layout) -------------------------------------------------------------------------------------
    CONFIG = "config.resolved.yaml"
    HYDRA = ".hydra"
    LOG = "pretrain_exp.log"
    PHASES = "phases.json"  #: where the time before the first step went (:mod:`pretrain_exp.core.phases`)
    LOCK = ".lock"
    PLAN = "plan.npz"
    MANIFEST = "manifest.jsonl"
    ITEMS = "items.jsonl"
    AUDIT = "audit.json"
    RESULTS = "results.json"
    METRICS = "metrics.jsonl"
    LAYOUTS = "layouts.jsonl"
    WANDB_ID = "wandb_id.txt"
    TRAINER_LOG = "trainer_log.csv"
    MANIFEST_PARQUET = "manifest.parquet"
    ITEMS_PARQUET = "items.parquet"
    EVALS_PARQUET = "evals.parquet"
    ASYNC_MARKER = ".async.json"  #: ``evals/step<N>/.async.json``: a background eval's ``{step, tasks, ...}``
    ASYNC_LOG = "async.log"  #: ``evals/step<N>/async.log``: its output
    EVALS = "evals"
    HF = "hf"
    CHECKPOINTS = "checkpoints"
    DYNAMIC = "dynamic"
    PLOTS = "plots"
    ARMS = "arms"
    RELEASE = "release"
    OLMO_CORE_WORK = "olmo_core_work"
    ROWS = "rows"
    TORCHRUN = "torchrun"
    WANDB = "wandb"
    SLURM = "slurm"
    #: checkpoint folders under ``checkpoints/``: OLMo-core's ``step<N>`` (global step) and the HF Trainer's
    #: ``checkpoint-<k>`` (``transformers.trainer_utils.PREFIX_CHECKPOINT_DIR``; step ``k`` of this run)
    OLMO_CORE_CHECKPOINT = STEP
    HF_CHECKPOINT = "checkpoint-"
    #: the file the HF Trainer writes last into a checkpoint (``transformers.trainer.TRAINER_STATE_NAME``)
    HF_TRAINER_STATE = "trainer_state.json"

    #: the files logged as the run's ``insertion-plan`` W&B artifact (those present)
    PLAN_FILES = (PLAN, MANIFEST, ITEMS, AUDIT, CONFIG)
    #: what Hydra and the entry point write before any training; a fresh run dir holding only these is discarded
    #: on an error of the user's making
    SCAFFOLD = frozenset({HYDRA, LOG, PHASES, CONFIG, PLAN, MANIFEST, ITEMS})
    #: folders of a run dir that never hold another job dir (the report does not walk into them)
    OUTPUTS = frozenset({CHECKPOINTS, EVALS, PLOTS, WANDB})

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, RunDir) and self.path == other.path

    def __hash__(self) -> int:
        return hash(self.path)

    def resolve(self) -> "RunDir":
        """The same run dir with an absolute, resolved path."""
        return RunDir(self.path.resolve())

    # --- files at the top ---------------------------------------------------------------------------------------
    @property
    def config(self) -> Path:
        """``config.resolved.yaml``: the resolved config (what re-runs compare with and workers read)."""
        return self.path / self.CONFIG

    @property
    def hydra_dir(self) -> Path:
        """``.hydra/``: Hydra's ``config.yaml``, ``hydra.yaml`` and ``overrides.yaml``."""
        return self.path / self.HYDRA

    def hydra_file(self, name: str) -> Path:
        """``.hydra/<name>.yaml`` (``config``, ``hydra`` or ``overrides``)."""
        return self.hydra_dir / f"{name}.yaml"

    @property
    def phases(self) -> Path:
        """``phases.json``: the phases of the time before the first step (:class:`~pretrain_exp.core.phases.Phases`)."""
        return self.path / self.PHASES

    @property
    def log_file(self) -> Path:
        """``pretrain_exp.log``: the job's log, every line the console shows and the engines' detail it leaves out
        (:func:`~pretrain_exp.core.logs.run_logging`)."""
        return self.path / self.LOG

    @property
    def lock(self) -> Path:
        """``.lock``: the run-dir lock file (:class:`~pretrain_exp.core.runlock.RunDirLock`)."""
        return self.path / self.LOCK

    @property
    def plan(self) -> Path:
        """``plan.npz``: the insertion plan (``Plan.save`` / ``Plan.load``)."""
        return self.path / self.PLAN

    @property
    def manifest(self) -> Path:
        """``manifest.jsonl``: one line per inserted span."""
        return self.path / self.MANIFEST

    @property
    def items(self) -> Path:
        """``items.jsonl``: one line per item (written beside the manifest)."""
        return self.path / self.ITEMS

    @property
    def audit(self) -> Path:
        """``audit.json``: the natural-duplicate audit of the plan."""
        return self.path / self.AUDIT

    @property
    def results(self) -> Path:
        """``results.json``: the run's summary, written at its end."""
        return self.path / self.RESULTS

    @property
    def metrics(self) -> Path:
        """``metrics.jsonl``: every logged scalar, one ``{"step", ...}`` line per call."""
        return self.path / self.METRICS

    @property
    def layouts(self) -> Path:
        """``layouts.jsonl``: one line per training segment, ``{"from_step", "to_step", "world_size", ...}``, the
        device layout that trains it (a run may resume on another one), appended as the segment starts."""
        return self.path / self.LAYOUTS

    def read_layouts(self) -> List[dict]:
        """``layouts.jsonl`` as the layout of each step: its lines in file order, where a line starting at or before
        an earlier line's ``from_step`` replaces it (the segment was trained again, after a kill or a retry) and one
        starting inside an earlier line's range ends that range at its ``from_step`` (a resume from a checkpoint
        before the segment's end); ``[]`` if absent.

        :raises DataError: for a malformed line, naming the file and line (:func:`~pretrain_exp.core.io.read_jsonl`).
        """
        from pretrain_exp.core.io import read_jsonl

        out: List[dict] = []
        for _, rec in (read_jsonl(self.layouts) if self.layouts.is_file() else ()):
            while out and out[-1]["from_step"] >= rec["from_step"]:
                out.pop()
            if out and out[-1]["to_step"] > rec["from_step"]:
                out[-1]["to_step"] = rec["from_step"]
            out.append(rec)
        return out

    @property
    def wandb_id(self) -> Path:
        """``wandb_id.txt``: the W&B run id a resumed run continues."""
        return self.path / self.WANDB_ID

    @property
    def trainer_log(self) -> Path:
        """``trainer_log.csv``: the HF Trainer's scalars as ``step,name,value``."""
        return self.path / self.TRAINER_LOG

    def plan_files(self) -> List[Path]:
        """The provenance files of the plan (:data:`PLAN_FILES`: plan, manifest, items, audit, resolved config),
        present or not; a run logs those present as its ``insertion-plan`` W&B artifact."""
        return [self.path / name for name in self.PLAN_FILES]

    def parquet(self, table: str) -> Path:
        """The Parquet copy of a table: ``manifest``, ``items`` or ``evals`` -> ``<table>.parquet``.

        :raises KeyError: for another table name.
        """
        return self.path / {"manifest": self.MANIFEST_PARQUET, "items": self.ITEMS_PARQUET,
                            "evals": self.EVALS_PARQUET}[table]

    # --- folders ------------------------------------------------------------------------------------------------
    @property
    def checkpoints(self) -> Path:
        """``checkpoints/``: the framework's checkpoints."""
        return self.path / self.CHECKPOINTS

    def checkpoint(self, step: int, prefix: str = STEP) -> Path:
        """``checkpoints/<prefix><N>/``: the checkpoint folder of the framework's step ``step``."""
        return self.checkpoints / step_name(step, prefix)

    def checkpoint_dirs(self, prefix: str = STEP, marker: Optional[str] = None) -> List[Tuple[int, Path]]:
        """The complete checkpoints ``checkpoints/<prefix><N>/`` (holding ``marker``, the file the framework writes
        last) as ``[(N, path), ...]`` by ``N`` (:func:`step_dirs`); ``N`` is the framework's own count
        (OLMo-core's global step, the HF Trainer's step of this run)."""
        return step_dirs(self.checkpoints, prefix, marker)

    @classmethod
    def hf_checkpoint_complete(cls, path: Path) -> bool:
        """Whether the HF Trainer checkpoint ``path`` is complete: its ``trainer_state.json``, which the Trainer
        writes last and with a plain ``open``, holds a whole JSON document (a kill can leave it empty or cut
        short)."""
        try:
            json.loads((Path(path) / cls.HF_TRAINER_STATE).read_bytes())
        except (OSError, ValueError):
            return False
        return True

    def hf_checkpoint_dirs(self) -> List[Tuple[int, Path]]:
        """The complete HF Trainer checkpoints ``checkpoints/checkpoint-<k>/`` (:meth:`hf_checkpoint_complete`) as
        ``[(k, path), ...]`` by ``k``. One a kill cut short is left out: the re-run trains that segment again and
        writes the checkpoint anew."""
        return [(k, d) for k, d in self.checkpoint_dirs(self.HF_CHECKPOINT, self.HF_TRAINER_STATE)
                if self.hf_checkpoint_complete(d)]

    @property
    def olmo_core_work(self) -> Path:
        """``olmo_core_work/``: OLMo-core's data work dir (its global-indices files)."""
        return self.path / self.OLMO_CORE_WORK

    def rows_log(self, rank: int) -> Path:
        """``rows/rank<r>.jsonl``: the rows DP rank ``r`` trained (``training.log_rows``)."""
        return self.path / self.ROWS / f"rank{int(rank)}.jsonl"

    @property
    def torchrun_logs(self) -> Path:
        """``torchrun/``: torchrun's per-rank logs (``--log-dir``)."""
        return self.path / self.TORCHRUN

    @property
    def wandb_dir(self) -> Path:
        """``wandb/``: W&B's own folder of the run."""
        return self.path / self.WANDB

    @property
    def plots(self) -> Path:
        """``plots/``."""
        return self.path / self.PLOTS

    def plot(self, name: str) -> Path:
        """``plots/<name>.png``."""
        return self.plots / f"{name}.png"

    @property
    def release(self) -> Path:
        """``release/``: where a release bundle goes unless ``release.out_dir`` says otherwise."""
        return self.path / self.RELEASE

    @property
    def arms(self) -> Path:
        """``arms/``: the arms of a CPDT run."""
        return self.path / self.ARMS

    def cpdt_table(self, ext: str) -> Path:
        """``cpdt.<ext>`` (``json``, ``csv``, ``md``): a CPDT run's interaction table."""
        return self.path / f"cpdt.{ext}"

    def arm(self, arm: str, seed: int) -> "RunDir":
        """``arms/<arm>-seed<seed>/``: the run dir of one CPDT arm."""
        return RunDir(self.arms / f"{arm}-seed{int(seed)}")

    # --- step folders -------------------------------------------------------------------------------------------
    @property
    def hf(self) -> Path:
        """``hf/``: the kept HF exports."""
        return self.path / self.HF

    def hf_export(self, step: int) -> Path:
        """``hf/step<N>/``: the kept HF export of the checkpoint at global step ``step``."""
        return self.hf / step_name(step)

    def hf_exports(self, marker: Optional[str] = None) -> List[Tuple[int, Path]]:
        """The kept HF exports ``hf/step<N>/`` (folders; with ``marker``, those holding that file, e.g.
        ``config.json``) as ``[(N, path), ...]`` by step."""
        return [(s, d) for s, d in step_dirs(self.hf, marker=marker) if d.is_dir()]

    def hf_models(self, start_step: int = 0) -> Dict[int, Path]:
        """Global step -> HF model dir of every kept model, sorted by step: the HF exports ``hf/step<N>/`` and the
        HF Trainer's ``checkpoints/checkpoint-<k>/`` holding a ``config.json`` (global step ``start_step + k``, the
        run's ``model.checkpoint_step`` plus the Trainer's count); an export wins over a checkpoint of its step."""
        found: Dict[int, Path] = dict(self.hf_exports(marker="config.json"))
        for k, d in self.hf_checkpoint_dirs():
            if (d / "config.json").is_file():
                found.setdefault(start_step + k, d)
        return dict(sorted(found.items()))

    @property
    def dynamic(self) -> Path:
        """``dynamic/``: the closed-loop additions."""
        return self.path / self.DYNAMIC

    def additions(self, step: int) -> Path:
        """``dynamic/step<N>.json``: the additions decided at step ``step``."""
        return self.dynamic / step_name(step, suffix=".json")

    def additions_files(self) -> List[Tuple[int, Path]]:
        """Every ``dynamic/step<N>.json`` as ``[(N, path), ...]`` by decision step."""
        return step_dirs(self.dynamic, suffix=".json")

    @property
    def evals_dir(self) -> Path:
        """``evals/``."""
        return self.path / self.EVALS

    def eval_dir(self, step: int) -> Path:
        """``evals/step<N>/``: the evals of the checkpoint at global step ``step``."""
        return self.evals_dir / step_name(step)

    def evals(self, step: int, task: str) -> Path:
        """``evals/step<N>/<task>.json``: one eval task's result at global step ``step``."""
        return self.eval_dir(step) / f"{task}.json"

    def eval_marker(self, step: int) -> Path:
        """``evals/step<N>/.async.json``: the record of the background evals started for ``step``."""
        return self.eval_dir(step) / self.ASYNC_MARKER

    def eval_log(self, step: int) -> Path:
        """``evals/step<N>/async.log``: the background evals' output."""
        return self.eval_dir(step) / self.ASYNC_LOG

    @property
    def eval_slurm(self) -> Path:
        """``evals/slurm/``: submitit's folder of the SLURM eval jobs."""
        return self.evals_dir / self.SLURM

    def eval_steps(self) -> List[Tuple[int, Path]]:
        """Every ``evals/step<N>/`` folder as ``[(N, path), ...]`` by step (evaluated or being evaluated)."""
        return [(s, d) for s, d in step_dirs(self.evals_dir) if d.is_dir()]

    def eval_files(self, step: int) -> List[Path]:
        """The result files ``evals/step<N>/<task>.json`` of ``step``, by name (not the hidden ``.async.json``)."""
        d = self.eval_dir(step)
        return sorted(f for f in d.glob("*.json") if not f.name.startswith(".")) if d.is_dir() else []

    def missing_evals(self, step: int, tasks: Iterable[str]) -> List[str]:
        """The ``tasks`` whose ``evals/step<N>/<task>.json`` is not written yet, in the given order."""
        return [t for t in tasks if not self.evals(step, t).is_file()]

    def async_markers(self) -> List[Tuple[int, Path]]:
        """The background-eval markers ``evals/step<N>/.async.json`` present, as ``[(N, path), ...]`` by step."""
        return [(s, d / self.ASYNC_MARKER) for s, d in self.eval_steps() if (d / self.ASYNC_MARKER).is_file()]

    # --- readers ------------------------------------------------------------------------------------------------
    def read_eval(self, step: int, task: str) -> Optional[dict]:
        """The saved result of ``task`` at ``step`` (``{task, type, step, metrics, per_dup, rows, ...}``), or
        ``None`` if not written."""
        return _read_json(self.evals(step, task))

    def read_evals(self, step: int) -> Dict[str, dict]:
        """``{task: result}`` of every eval saved for ``step``, by task name."""
        return {f.stem: json.loads(f.read_text()) for f in self.eval_files(step)}

    def all_evals(self, upto: Optional[int] = None) -> Dict[int, Dict[str, dict]]:
        """``{step: {task: result}}`` of every ``evals/step<N>/`` (``N <= upto`` if given), by step; a step folder
        without results maps to ``{}``."""
        return {s: self.read_evals(s) for s, _ in self.eval_steps() if upto is None or s <= upto}

    def read_results(self) -> Optional[dict]:
        """``results.json``, or ``None`` before the run has written it."""
        return _read_json(self.results)

    def read_audit(self) -> Optional[dict]:
        """``audit.json`` (``{n, plan_digest, items: [...], ...}``), or ``None`` if the run has no audit."""
        return _read_json(self.audit)

    def read_items(self) -> List[dict]:
        """``items.jsonl`` as a list of dicts (one per item, file order); ``[]`` if absent.

        :raises DataError: for a malformed line, naming the file and line (:func:`~pretrain_exp.core.io.read_jsonl`).
        """
        from pretrain_exp.core.io import read_jsonl

        return [rec for _, rec in read_jsonl(self.items)] if self.items.is_file() else []

    def read_config(self) -> Optional[dict]:
        """``config.resolved.yaml`` as plain data (``yaml.safe_load``; no validation), or ``None`` if absent."""
        import yaml

        return (yaml.safe_load(self.config.read_text()) or {}) if self.config.is_file() else None

    def read_hydra(self, name: str) -> Optional[Any]:
        """``.hydra/<name>.yaml`` as plain data (``yaml.safe_load``), or ``None`` if absent."""
        import yaml

        path = self.hydra_file(name)
        return yaml.safe_load(path.read_text()) if path.is_file() else None

    def read_wandb_id(self) -> str:
        """The W&B run id of ``wandb_id.txt``; ``""`` when absent or empty."""
        return self.wandb_id.read_text().strip() if self.wandb_id.is_file() else ""

    # --- what kind of dir -----------------------------------------------------------------------------------------
    def is_job_dir(self) -> bool:
        """Whether this is a job dir of a sweep or a run dir (holds ``.hydra/`` or ``config.resolved.yaml``)."""
        return self.hydra_dir.is_dir() or self.config.is_file()

    def is_cpdt(self) -> bool:
        """Whether this is a CPDT run dir (``arms/`` next to ``config.resolved.yaml``)."""
        return self.arms.is_dir() and self.config.is_file()
