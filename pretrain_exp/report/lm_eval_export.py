"""A run's inserted items as an lm-eval task directory, so any checkpoint (the run's HF export, or a public model)
can be scored with stock lm-eval::

    python -m pretrain_exp.report export-lm-eval <run dir> <out dir> [--prefix NAME]
    lm_eval --model hf --model_args pretrained=<run dir>/hf/step<N> --include_path <out dir> --tasks <prefix>

Per insertion experiment with texts (read from the run's ``items.jsonl`` and ``config.resolved.yaml``):

- ``type: benchmark``: two ``multiple_choice`` tasks, ``<prefix>_<exp>_contaminated`` (items inserted, dup > 0) and
  ``<prefix>_<exp>_clean`` (the dup-0 controls), with the contexts, choices and gold the run inserted and its
  ``benchmark`` eval scores (:func:`~pretrain_exp.insertion.types.benchmark.prompt`; the docs are rebuilt from the
  experiment's ``(benchmark, num_items, insertion.seed)`` and each is checked against the item text the run
  inserted). Their ``metadata.lm_eval_task`` names the stock task the rendering equals (or the project's own
  name, e.g. ``sciq_lettered``).
- other text experiments (texts, knowledge, bios): two ``loglikelihood_rolling`` tasks, ``<prefix>_<exp>_inserted``
  and ``<prefix>_<exp>_control``, scoring each item's text (``word_perplexity``, ``byte_perplexity``,
  ``bits_per_byte``).

Items without text (token sequences, noise) are left out (listed in the directory's ``README.md``). The group
``<prefix>`` holds every task. Each task reads a ``.jsonl`` beside its YAML through an absolute ``data_files`` path
(lm-eval resolves relative ones against the working directory): export again after moving the directory. The
directory is written to a temporary sibling and renamed into place; an existing ``<out dir>`` is refused.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import yaml

from pretrain_exp.core.commands import prog
from pretrain_exp.core.errors import ConfigError, DataError
from pretrain_exp.core.io import read_jsonl
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.insertion.types.benchmark import item_text, prompt, sample_docs, task_name

MC_METRICS = [{"metric": m, "aggregation": "mean", "higher_is_better": True} for m in ("acc", "acc_norm")]
ROLLING_METRICS = [{"metric": m} for m in ("word_perplexity", "byte_perplexity", "bits_per_byte")]


def _task_yaml(name: str, data: Path, **fields: Any) -> Dict[str, Any]:
    return {"task": name, "dataset_path": "json", "dataset_name": None,
            "dataset_kwargs": {"data_files": {"test": str(data)}}, "test_split": "test", **fields}


def _load_run(run_dir: Path):
    cfg_path, items_path = RunDir(run_dir).config, RunDir(run_dir).items
    for p in (cfg_path, items_path):
        if not p.is_file():
            raise DataError(f"{p}: missing (not a run dir, or its plan was never written)")
    config = yaml.safe_load(cfg_path.read_text())
    items: Dict[str, List[dict]] = {}
    for _, rec in read_jsonl(items_path):
        items.setdefault(rec["experiment"], []).append(rec)
    return config, items


def export_lm_eval(run_dir: str | Path, out_dir: str | Path, prefix: Optional[str] = None,
                   cache_dir: Optional[str] = None) -> Dict[str, Any]:
    """Write the lm-eval task directory of run ``run_dir`` to ``out_dir`` (module docstring).

    :param prefix: task-name prefix (default: the run name with characters other than ``[A-Za-z0-9_]`` as ``_``).
    :param cache_dir: asset cache for the benchmark docs (default: the run's ``cache_dir``).
    :returns: ``{"group": prefix, "tasks": {task name: number of docs}, "skipped": {experiment: reason}}``.
    :raises FileExistsError: if ``out_dir`` exists.
    :raises DataError: if the run dir lacks its config or ``items.jsonl``, or a benchmark item is not the doc
        its experiment's config gives.
    """
    run_dir, out_dir = Path(run_dir).resolve(), Path(out_dir).resolve()
    if out_dir.exists():
        raise FileExistsError(f"{out_dir} exists; choose a new directory")
    config, items = _load_run(run_dir)
    prefix = prefix or re.sub(r"[^A-Za-z0-9_]+", "_", str(config.get("run_name") or run_dir.name))
    experiments = (config.get("insertion") or {}).get("experiments") or {}
    seed = int((config.get("insertion") or {}).get("seed", 0))
    cache_dir = cache_dir or config.get("cache_dir")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}-"))
    tasks: Dict[str, int] = {}
    skipped: Dict[str, str] = {}

    def write_task(name: str, docs: List[dict], **fields: Any) -> None:
        data = tmp / f"{name}.jsonl"
        data.write_text("".join(json.dumps(d) + "\n" for d in docs))
        final = out_dir / data.relative_to(tmp)  # where it lives once tmp is renamed
        (tmp / f"{name}.yaml").write_text(yaml.safe_dump(_task_yaml(name, final, **fields), sort_keys=False,
                                                         allow_unicode=True))
        tasks[name] = len(docs)

    try:
        for exp, recs in items.items():
            conf = experiments.get(exp) or {}
            recs = sorted(recs, key=lambda r: r["index"])
            if conf.get("type") == "benchmark":
                docs = sample_docs(conf["benchmark"], num_items=conf.get("num_items"), seed=seed,
                                   cache_dir=cache_dir, key=f"insertion.experiments.{exp}")
                if len(docs) != len(recs):
                    raise DataError(f"{RunDir(run_dir).items}: experiment {exp!r} has {len(recs)} items, its config "
                                    f"gives {len(docs)} {conf['benchmark']} questions")
                fmt = conf.get("format", "cloze")
                rows = {"contaminated": [], "clean": []}
                for rec, doc in zip(recs, docs):
                    if rec.get("text") != item_text(doc, fmt):
                        raise DataError(f"{RunDir(run_dir).items}: item {rec['item_id']} of {exp!r} is not "
                                        f"{doc.source} in format {fmt!r}")
                    context, choices = prompt(doc, fmt)
                    rows["contaminated" if rec["dup_count"] > 0 else "clean"].append(
                        {"query": context, "choices": choices, "gold": doc.gold, "item_id": rec["item_id"],
                         "dup_count": rec["dup_count"], "source": doc.source})
                for split, docs_ in rows.items():
                    if docs_:
                        write_task(f"{prefix}_{exp}_{split}", docs_, output_type="multiple_choice",
                                   doc_to_text="{{query}}", doc_to_choice="{{choices}}", doc_to_target="{{gold}}",
                                   metric_list=MC_METRICS, metadata={
                                       "version": 1.0, "lm_eval_task": task_name(conf["benchmark"], fmt),
                                       "benchmark": conf["benchmark"], "format": fmt, "experiment": exp,
                                       "split": split})
            elif all(r.get("text") is not None for r in recs):
                rows = {"inserted": [], "control": []}
                for rec in recs:
                    rows["inserted" if rec["dup_count"] > 0 else "control"].append(
                        {"text": rec["text"], "item_id": rec["item_id"], "dup_count": rec["dup_count"],
                         "source": rec.get("source")})
                for split, docs_ in rows.items():
                    if docs_:
                        write_task(f"{prefix}_{exp}_{split}", docs_, output_type="loglikelihood_rolling",
                                   doc_to_text="", doc_to_target="{{text}}", metric_list=ROLLING_METRICS,
                                   metadata={"version": 1.0, "experiment": exp, "split": split})
            else:
                skipped[exp] = "items without text (token sequences or noise)"
        if not tasks:
            raise DataError(f"{run_dir}: no insertion experiment with text items to export"
                            + (f" (skipped: {', '.join(skipped)})" if skipped else ""))
        (tmp / f"{prefix}.yaml").write_text(yaml.safe_dump({"group": prefix, "task": sorted(tasks)},
                                                           sort_keys=False))
        lines = [f"# lm-eval tasks of run {run_dir}", "", f"`lm_eval --include_path {out_dir} --tasks {prefix} "
                 "--model hf --model_args pretrained=<HF model dir>`", "", "| task | docs |", "|---|---|"]
        lines += [f"| {t} | {n} |" for t, n in sorted(tasks.items())]
        lines += [f"\nleft out: {exp} ({why})" for exp, why in skipped.items()]
        (tmp / "README.md").write_text("\n".join(lines) + "\n")
        os.chmod(tmp, 0o755)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"group": prefix, "tasks": tasks, "skipped": skipped}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m pretrain_exp.report export-lm-eval <run dir> <out dir> [--prefix NAME]``; returns 0, or 2 after
    one ``error: ...`` line."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(
        prog=prog("pretrain-exp-export-lm-eval", "pretrain_exp.report export-lm-eval"),
        description="Write a run's inserted benchmark items (contaminated and clean) and insertion items as an "
                    "lm-eval task directory: lm_eval --include_path <out dir> --tasks <prefix>.")
    parser.add_argument("run_dir", type=Path, help=f"a run dir (holds {RunDir.CONFIG} and {RunDir.ITEMS})")
    parser.add_argument("out_dir", type=Path, help="the task directory to write (must not exist)")
    parser.add_argument("--prefix", default=None, help="task-name prefix and group name (default: the run name)")
    args = parser.parse_args(argv)
    try:
        out = export_lm_eval(args.run_dir, args.out_dir, args.prefix)
    except (FileExistsError, DataError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for name, n in sorted(out["tasks"].items()):
        print(f"{name}: {n} docs")
    for exp, why in out["skipped"].items():
        print(f"left out {exp}: {why}")
    print(f"wrote {Path(args.out_dir).resolve()} (lm_eval --include_path {Path(args.out_dir).resolve()} "
          f"--tasks {out['group']})")
    return 0
