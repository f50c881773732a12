"""Release a finished run as a Hub-ready bundle (model + dataset, each with its card) and push it.

``pretrain-exp-release <run dir> <out dir> [--push REPO_ID [--private] [--revision BRANCH]] [--license ID]``
(= ``python -m pretrain_exp.release``) writes::

    <out>/model/                        the final step's HF model dir (safetensors, config, tokenizer) + README.md
    <out>/revisions/step<N>-tokens<T>/  every step with a kept HF model (the final one too), each + README.md
    <out>/dataset/                      README.md (dataset card), data/{items,placements,evals}-<id>.parquet,
                                        config.resolved.yaml, plan.npz, inputs/<experiment>.jsonl (file-based
                                        experiments only)
    <out>/release.json                  what the bundle holds: run, code, repo id, revisions, sha256 of every file

The HF model dirs of a run are its kept exports ``hf/step<N>/`` (``olmo_core``/``olmo2``: ``training.export_hf=
final|every``) and, for ``framework=hf``, its Trainer checkpoints ``checkpoints/checkpoint-<k>/`` (global step
``model.checkpoint_step + k``; ``training.keep_last_checkpoints=0`` keeps every one); only model, config and
tokenizer files are released (no optimizer, scheduler, RNG or trainer state). Revision names
(:func:`revision_name`) carry ``T``, the tokens seen by global step ``N`` (``N * B * L``, ``B`` rows of ``L`` tokens
per step): from 1e9 on in OLMo's Hub form (``allenai/OLMo-1B``: ``step20000-tokens84B`` = step 20,000 x 4,194,304
tokens, ``round(T / 1e9)``), below in K or M (``step4-tokens16K``, ``step77-tokens2.5M``).

The dataset holds the run's own insertion records only (items with text or token ids, every placement, the per-item
eval rows), never the training corpus; ``datasets.load_dataset(<out>/dataset, "items" | "placements" | "evals")``
reads one config each (split ``train``). Both cards carry the sha256 of ``plan.npz`` and of
``config.resolved.yaml``, and the pretrain_exp version and git commit that ran (``results.json``'s ``pretrain_exp``).

No local absolute path reaches a bundle (:class:`LocalPaths`): the run dir and cache dir in the config, the
overrides, ``results.json``'s entries and the tables' string columns (item texts excepted) become ``<run_dir>``,
``<cache_dir>``, any other absolute path ``<local>/<name>``. The dataset's ``config.resolved.yaml`` is that
copy of the run's config (its own sha256 beside the run's on the cards and in ``release.json``), with each experiment
that read its items from a file reading ``inputs/<experiment>.jsonl`` instead (:func:`experiment_inputs`, rebuilt
from the items); the cards' reproduce command (:func:`reproduce_command`) runs the experiment again from the
downloaded dataset. The bundle is written into a temporary sibling and renamed, so ``<out>`` is whole or
absent; an existing ``<out>`` is reused only when it is a bundle of the same run, plan, config and repo id (a retried
push), else refused.

A sweep dir gives one bundle per finished job, ``<out>/<job dir name>/``, pushed to ``<REPO_ID>-<job dir name>``.

Push (:func:`push_bundle`) goes through ``huggingface_hub``'s public API: ``create_repo`` (a model and a dataset repo
of the same id), ``upload_folder`` of ``model/`` to ``--revision`` (default ``main``) and of ``dataset/``, and
``create_branch`` + ``upload_folder`` per revision. Repos and branches that exist are pushed to as they are (the Hub
answers ``409`` to creating them): the bundle's files replace those of the same path, other files stay, unchanged files
are not sent again (a repeated push commits nothing); an existing public repo is refused with ``--private``, which
would not make it private. The token is ``huggingface_hub``'s own (``HF_TOKEN`` or ``hf auth login``); it is never
read into a file or a message here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import pandas as pd
import yaml
from omegaconf import OmegaConf

from pretrain_exp.core.commands import prog
from pretrain_exp.core.config import ReleaseConf
from pretrain_exp.core.errors import DataError, PretrainExpError, PushError
from pretrain_exp.core.io import default_mode, sha256_file, write_json
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.core.secrets import redact
from pretrain_exp.insertion.placements import KINDS, get_kind
from pretrain_exp.report.tables import RUN_COLUMNS, load_items, load_manifest, load_run

log = logging.getLogger(__name__)

#: files of an HF Trainer checkpoint that are training state, not the model (never released)
TRAINING_STATE = ("optimizer", "scheduler", "rng_state", "trainer_state", "training_args")
#: registry assets whose weights come from a Hub model (``base_model`` of the card)
ASSET_BASE_MODELS = {"smollm2_135m": "HuggingFaceTB/SmolLM2-135M-Instruct"}
#: the dataset configs; each is ``data/<config>-<bundle id>.parquet`` (:func:`data_file`)
DATASET_CONFIGS = ("items", "placements", "evals")
BUNDLE_FILE = "release.json"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


def data_file(config: str, plan_sha256: str, config_sha256: str) -> str:
    """``data/<config>-<id>.parquet``, ``id`` = 12 hex digits of sha256(plan sha256 + config sha256). ``datasets``
    caches a local dataset under its folder name and the ``data_files`` patterns of its card, so fixed file names
    would let two bundles' ``dataset/`` folders share one cache entry (the second load returns the first's rows)."""
    bundle_id = hashlib.sha256((plan_sha256 + config_sha256).encode()).hexdigest()[:12]
    return f"data/{config}-{bundle_id}.parquet"


def revision_name(step: int, tokens: int) -> str:
    """The Hub branch name of a checkpoint at global ``step`` after ``tokens`` tokens: ``step<step>-tokens<X>``.

    From a billion tokens on, ``X`` is OLMo's form ``<round(tokens / 1e9)>B`` (``allenai/OLMo-1B``:
    ``step20000-tokens84B``), unchanged. Below it, ``X`` is in the largest of K (1e3) and M (1e6) that keeps the
    number >= 1, with one decimal under 10 and none from 10 on, a trailing ``.0`` dropped (``4096`` -> ``4.1K``,
    ``16384`` -> ``16K``, ``2523136`` -> ``2.5M``; below 1,000 the plain count), so small runs' checkpoints get
    distinct names. A number that rounds to 1000 moves to the next unit (``999_999`` -> ``1M``).
    """
    step, tokens = int(step), int(tokens)
    if tokens >= 10 ** 9:
        return f"step{step}-tokens{round(tokens / 1e9)}B"
    for scale, unit, up in ((10 ** 6, "M", "B"), (10 ** 3, "K", "M")):
        if tokens >= scale:
            value = tokens / scale
            text = f"{value:.1f}".removesuffix(".0") if value < 10 else f"{value:.0f}"
            return f"step{step}-tokens" + (f"1{up}" if float(text) >= 1000 else f"{text}{unit}")
    return f"step{step}-tokens{tokens}"


# --- reading the run ----------------------------------------------------------------------------------------------
def _read_run(run_dir: Path) -> Dict[str, Any]:
    rd = RunDir(run_dir)
    for p in (rd.results, rd.config, rd.plan):
        if not p.is_file():
            raise DataError(f"{p}: missing (not a finished run dir: {p.name} is written "
                            + ("at the end of a run)" if p == rd.results else "when the run starts)"))
    try:
        results = rd.read_results()
        config = rd.read_config()
    except (ValueError, yaml.YAMLError) as e:
        raise DataError(f"{run_dir}: unreadable {RunDir.RESULTS} or {RunDir.CONFIG} ({e})") from None
    for key in ("step", "plan", "per_dup"):
        if key not in results:
            raise DataError(f"{rd.results}: no {key!r} (written by another version?)")
    paths = LocalPaths(run_dir, config)
    return {"results": paths.data(results), "config": paths.data(config), "plan_sha256": sha256_file(rd.plan),
            "config_sha256": sha256_file(rd.config), "paths": paths,
            "overrides": [paths.text(str(o)) for o in rd.read_hydra("overrides") or []]}


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


#: overrides that name where a run was written, not what it did (left out of the reproduce command)
MACHINE_KEYS = ("run_dir", "cache_dir", "hydra.run.dir", "hydra.sweep.dir", "hydra.sweep.subdir")
#: what a bundle says instead of a local path of the run (:class:`LocalPaths`)
PLACEHOLDERS = {"run_dir": "<run_dir>", "cache_dir": "<cache_dir>", "other": "<local>"}
_ABS_PATH = re.compile(r"(?:^|(?<=[=\[,\s'\"(]))/[\w.+@%-]+(?:/[\w.+@%-]*)*")


class LocalPaths:
    """The local absolute paths of a run and what a bundle says instead (no local path reaches a bundle).

    The run dir (as resolved and as the config has it) becomes ``<run_dir>``, the config's ``cache_dir``
    ``<cache_dir>``, and any other absolute path (the home dir's too) ``<local>/<its last name>``
    (:data:`PLACEHOLDERS`). Relative paths and URLs are left as they are.
    """

    def __init__(self, run_dir: Path, config: dict):
        roots: Dict[str, str] = {}
        for path, what in ((config.get("cache_dir"), "cache_dir"),
                           (config.get("run_dir"), "run_dir"), (run_dir, "run_dir")):
            if path and os.path.isabs(str(path)):
                for p in {str(path).rstrip("/"), str(Path(path).resolve())}:
                    if len(p) > 1:
                        roots[p] = PLACEHOLDERS[what]
        self.roots = roots
        self._roots = re.compile("(" + "|".join(re.escape(r) for r in sorted(roots, key=len, reverse=True))
                                 + r")(?=$|[/\s'\",:;\])}])") if roots else None

    def text(self, s: str) -> str:
        """``s`` with every local absolute path replaced (class docstring)."""
        if self._roots is not None:
            s = self._roots.sub(lambda m: self.roots[m.group(1)], s)
        return _ABS_PATH.sub(lambda m: f"{PLACEHOLDERS['other']}/{Path(m.group(0)).name}", s)

    def data(self, obj: Any) -> Any:
        """``obj`` (JSON/YAML data) with :meth:`text` applied to every string in it, dict keys included (e.g.
        ``data.path_prefixes``)."""
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, dict):
            return {self.text(k) if isinstance(k, str) else k: self.data(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [self.data(v) for v in obj]
        return obj

    def table(self, df: pd.DataFrame, keep: Sequence[str] = ("text", "token_ids")) -> pd.DataFrame:
        """``df`` with :meth:`text` applied to the strings of its object columns except ``keep`` (the data)."""
        df = df.copy()
        for col in df.columns:
            if col not in keep and (df[col].dtype == object or pd.api.types.is_string_dtype(df[col].dtype)):
                df[col] = [self.text(v) if isinstance(v, str) else v for v in df[col]]
        return df


def model_dirs(run_dir: str | Path, config: dict) -> Dict[int, Path]:
    """Global step -> HF model dir of every kept model of a run (module docstring), sorted by step
    (:meth:`RunDir.hf_models <pretrain_exp.core.rundir.RunDir.hf_models>`)."""
    return RunDir(run_dir).hf_models(int((config.get("model") or {}).get("checkpoint_step") or 0))


def _model_files(src: Path) -> List[Path]:
    files = [f for f in sorted(src.iterdir()) if f.is_file() and not f.name.startswith(TRAINING_STATE)
             and f.name != "README.md"]
    names = {f.name for f in files}
    if not any(n.endswith(".safetensors") for n in names):
        raise DataError(f"{src}: no *.safetensors weights (an HF model dir of safetensors is released)")
    if not names & {"tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json"}:
        raise DataError(f"{src}: no tokenizer files (tokenizer.json / tokenizer_config.json)")
    return files


def _link_or_copy(files: Sequence[Path], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for f in files:
        try:
            os.link(f, out / f.name)
        except OSError:
            shutil.copy2(f, out / f.name)


# --- tables -------------------------------------------------------------------------------------------------------
def dataset_tables(run_dir: str | Path, config: dict) -> Dict[str, pd.DataFrame]:
    """The dataset's three tables of a run, read with :func:`~pretrain_exp.report.tables.load_items`,
    :func:`~pretrain_exp.report.tables.load_manifest` and :func:`~pretrain_exp.report.tables.load_run`:

    - ``items``: one row per item (``items.jsonl``'s columns: id, experiment, dup count, text, sha256, source, the
      audit's counts), plus ``type`` (the experiment's insertion type), ``control`` (``dup_count == 0``: never
      inserted) and ``token_ids`` (the item's tokens as inserted, from ``plan.npz``; empty for noise items);
    - ``placements``: one row per inserted copy (``manifest.jsonl``: global token position, step, row, offset,
      length, item, dup index, sha256 of its tokens), plus ``control`` (always false);
    - ``evals``: one row per item, evaluated step and eval (``load_run``'s eval columns), plus ``control``.

    :raises DataError: if the run has no items.
    """
    from pretrain_exp.insertion.plan import Plan

    rd = RunDir(run_dir)
    items = load_items(rd.path)
    if items.empty:
        raise DataError(f"{rd.items}: missing or empty (the run inserted nothing to release)")
    plan = Plan.load(rd.plan)
    experiments = (config.get("insertion") or {}).get("experiments") or {}
    items = items.sort_values("item_id", ignore_index=True)
    items.insert(2, "type", [str((experiments.get(e) or {}).get("type", "")) for e in items["experiment"]])
    items.insert(4, "control", items["dup_count"] == 0)
    items["token_ids"] = [plan.item_tokens(int(i)).astype("int64").tolist() for i in items["item_id"]]
    placements = load_manifest(run_dir)
    placements["control"] = False
    evals = load_run(run_dir)
    item_only = set(items.columns) - set(RUN_COLUMNS)
    evals = evals[[c for c in evals.columns if c not in item_only]].copy()
    if "dup_count" in evals:
        evals["control"] = evals["dup_count"] == 0
    return {"items": items, "placements": placements, "evals": evals}


# --- the experiments' input files ---------------------------------------------------------------------------------
INPUT_TYPES = ("texts", "tokens")


def experiment_inputs(config: dict, tables: Dict[str, pd.DataFrame]) -> Dict[str, Dict[str, Any]]:
    """The input file of every experiment that read its items from a file (``insertion.experiments.<e>.file``,
    types ``texts`` and ``tokens``), rebuilt from the dataset's tables so that a bundle can reproduce the run:
    ``{experiment: {"path": "inputs/<e>.jsonl", "lines": [...], "set": {key: value}}}``.

    ``texts``: one line per item in the run's order, ``{<key, default text>: text}``; ``tokens``: the token ids as
    inserted (EOS policy already applied, so ``eos`` is set to ``none``), the line itself or under ``key``. With
    ``placement.kind=explicit`` each line also holds the item's global token positions under
    ``placement.position_key`` (from ``placements``). ``set``: the config values that read the file
    (``file`` relative to the dataset dir; ``eos``/``key`` where they change).
    """
    out: Dict[str, Dict[str, Any]] = {}
    items, placements = tables["items"], tables["placements"]
    for name, exp in sorted(((config.get("insertion") or {}).get("experiments") or {}).items()):
        exp = exp or {}
        if not exp.get("file") or exp.get("type") not in INPUT_TYPES:
            continue
        placement = exp.get("placement") or {}
        explicit = placement.get("kind", "random") in KINDS and get_kind(placement.get("kind", "random")).from_items
        texts = exp["type"] == "texts"
        path = f"inputs/{name}.jsonl"
        field, sets = exp.get("key"), {"file": path}
        if texts:
            field = field or "text"
        else:
            sets["eos"] = "none"
            if field is None and explicit:
                field = sets["key"] = "tokens"
        rows = items[items["experiment"] == name].sort_values([c for c in ("index", "item_id") if c in items])
        lines = []
        for _, r in rows.iterrows():
            payload = str(r["text"]) if texts else [int(t) for t in r["token_ids"]]
            line: Any = payload if field is None else {field: payload}
            if explicit:
                mine = placements[placements["item_id"] == r["item_id"]].sort_values("dup_index")
                line[placement.get("position_key") or "position"] = [int(p) for p in mine["position"]]
            lines.append(line)
        out[name] = {"path": path, "lines": lines, "set": sets}
    return out


# --- cards --------------------------------------------------------------------------------------------------------
def base_model(config: dict) -> Dict[str, Optional[str]]:
    """``{"base_model": Hub id or None, "revision": ..., "source": what the run started from}`` of a run's config."""
    m = config.get("model") or {}
    step = int(m.get("checkpoint_step") or 0)
    if m.get("init") == "random":
        return {"base_model": None, "revision": None, "source": f"random initialisation of {m.get('config')}"}
    if m.get("path") and _HUB_ID.match(str(m["path"])) and not Path(str(m["path"])).exists():
        return {"base_model": m["path"], "revision": m.get("revision") or "main",
                "source": f"{m['path']}@{m.get('revision') or 'main'} (step {step})"}
    if m.get("asset") in ASSET_BASE_MODELS:
        return {"base_model": ASSET_BASE_MODELS[m["asset"]], "revision": "main",
                "source": f"registry asset {m['asset']} (weights of {ASSET_BASE_MODELS[m['asset']]})"}
    if m.get("url"):
        return {"base_model": None, "revision": None, "source": f"{m['url']} step {step}"}
    return {"base_model": None, "revision": None, "source": str(m.get("asset") or m.get("path") or m.get("name"))}


def _fmt(v, spec=".3f") -> str:
    return "-" if v is None or (isinstance(v, float) and v != v) else format(v, spec)


def _md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                     + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def _facts(run: dict, tables: Dict[str, pd.DataFrame]) -> dict:
    """What both cards say: the insertion summary, the window, the checksums."""
    res, cfg = run["results"], run["config"]
    t = cfg.get("training") or {}
    L, B = int(t.get("sequence_length") or 0), int(t.get("global_batch_size") or 0)
    w0, w1 = (int(x) for x in res["plan"]["window"])
    items, placements = tables["items"], tables["placements"]
    exps = []
    for exp, g in items.groupby("experiment", sort=True):
        p = placements[placements["experiment"] == exp] if len(placements) else placements
        dups = g["dup_count"].value_counts().sort_index()
        exps.append({"experiment": exp, "type": g["type"].iloc[0], "items": int(len(g)),
                     "controls": int((g["dup_count"] == 0).sum()),
                     "dup_counts": {str(k): int(v) for k, v in dups.items()},
                     "insertions": int(len(p)), "tokens": int(p["length"].sum()) if len(p) else 0})
    return {"L": L, "B": B, "window": [w0, w1], "steps": [w0 // (B * L) + 1, w1 // (B * L)] if B * L else None,
            "experiments": exps}


def _card_metadata(run: dict, facts: dict, repo_id: str, license_id: str, kind: str) -> dict:
    res = run["results"]
    base = base_model(run["config"])
    meta = {"license": license_id, "tags": ["pretrain_exp", "continual-pretraining", "data-insertion",
                                            f"framework:{res.get('framework')}"]}
    common = {"run_name": res.get("run_name"), "framework": res.get("framework"), "step": res["step"],
              "code": _code(res), "plan_sha256": run["plan_sha256"], "config_sha256": run["config_sha256"],
              "bundle_config_sha256": run.get("bundle_config_sha256"), "base_checkpoint": base["source"],
              "window": facts["window"], "steps": facts["steps"],
              "plan": {k: res["plan"][k] for k in ("num_items", "num_insertions", "inserted_tokens",
                                                   "inserted_fraction", "experiments")},
              "experiments": facts["experiments"]}
    if kind == "model":
        meta.update(library_name="transformers", pipeline_tag="text-generation", datasets=[repo_id])
        if base["base_model"]:
            meta.update(base_model=base["base_model"], base_model_revision=base["revision"])
        common.update(per_dup=res["per_dup"], memorization=res.get("memorization", []),
                      effects=res.get("effects", []), statistics=res.get("statistics"),
                      audit=res.get("audit"), revisions=run.get("revisions", {}))
    else:
        meta.update(configs=[{"config_name": name, "data_files": [
                        {"split": "train", "path": data_file(name, run["plan_sha256"], run["config_sha256"])}]}
                             for name in DATASET_CONFIGS],
                    task_categories=["text-generation"], pretty_name=f"{res.get('run_name')}: inserted items")
        if base["base_model"]:
            meta["base_model"] = base["base_model"]
    meta["pretrain_exp"] = common
    return meta


def _code(res: dict) -> Dict[str, Optional[str]]:
    """``results.json``'s ``pretrain_exp`` entry: the version and git commit of the code that ran (None each when
    the run predates the entry)."""
    code = res.get("pretrain_exp") or {}
    return {"version": code.get("version"), "commit": code.get("commit")}


def _code_line(res: dict) -> str:
    code = _code(res)
    if code["version"] is None:
        return f"- code: not recorded (the run's `{RunDir.RESULTS}` predates the `pretrain_exp` entry)"
    return (f"- code: pretrain_exp {code['version']}, git commit "
            + (f"`{code['commit']}`" if code["commit"] else "not recorded (not run from a git checkout)"))


def _insertion_section(run: dict, facts: dict) -> List[str]:
    res = run["results"]
    plan = res["plan"]
    lines = ["## What was inserted", "",
             f"Training continued from {base_model(run['config'])['source']} and ran to global step "
             f"{res['step']} ({facts['B']} rows x {facts['L']} tokens per step). Insertion *replaces* the tokens at "
             "exact global token positions (shapes and tokens per step never change); dup-0 items are controls, "
             "drawn from the same source and never inserted.", "",
             _md_table(["experiment", "type", "items", "controls", "dup counts (dup: items)", "insertions",
                        "tokens inserted"],
                       [[e["experiment"], e["type"], e["items"], e["controls"],
                         ", ".join(f"{k}: {v}" for k, v in e["dup_counts"].items()), e["insertions"], e["tokens"]]
                        for e in facts["experiments"]]), "",
             f"- inserted tokens: {plan['inserted_tokens']:,} of {facts['window'][1] - facts['window'][0]:,} trained "
             f"({plan['inserted_fraction']:.4%})",
             f"- training window: global token positions [{facts['window'][0]:,}, {facts['window'][1]:,})"
             + (f" = steps {facts['steps'][0]}..{facts['steps'][1]}" if facts["steps"] else ""),
             f"- plan: {plan['num_items']} items, {plan['num_insertions']} insertions",
             f"- `{RunDir.PLAN}` sha256: `{run['plan_sha256']}`",
             f"- `{RunDir.CONFIG}` sha256: `{run['config_sha256']}` (the run's); the dataset's copy, with local paths "
             "replaced by placeholders (`<run_dir>`, `<cache_dir>`, `<local>/<name>`)"
             + (" and file-based experiments reading `inputs/<experiment>.jsonl`" if run.get("inputs") else "")
             + f": `{run.get('bundle_config_sha256')}`",
             _code_line(run["results"]), ""]
    return lines


def _audit_lines(audit: Optional[dict]) -> List[str]:
    lines = ["## Natural-duplicate audit", ""]
    if not audit:
        return lines + ["The run was not audited (`insertion.audit=off`).", ""]
    lines.append(f"Exact occurrences and {audit.get('ngram')}-gram overlap of every item in the "
                 f"{audit.get('window_tokens', 0):,} trained tokens (read before insertion) and the "
                 f"{audit.get('held_out_tokens', 0):,} held-out tokens: {audit.get('items_in_window')} item(s) "
                 f"occur in the window, {audit.get('items_in_held_out')} in the held-out rows, "
                 f"{len(audit.get('contaminated_controls') or [])} control(s) among them.")
    for c in (audit.get("contaminated_controls") or [])[:20]:
        at = c.get("first") or {}
        lines.append(f"- control item {c['item_id']} ({c['experiment']}): {c['natural_exact']} exact, "
                     f"{c['natural_ngram_overlap']:.0%} of its n-grams; first at step {at.get('step')}, "
                     f"row {at.get('row')}, offset {at.get('offset')}")
    return lines + [""]


def _eval_lines(res: dict) -> List[str]:
    from pretrain_exp.core.stats import LEVEL, MIN_ITEMS_PER_GROUP
    from pretrain_exp.report.summary import exact_match_interval
    from pretrain_exp.report.text import fmt_ci, fmt_items, method_label

    mem = {(r["experiment"], r["dup_count"]): r for r in res.get("memorization") or []}
    rows = []
    for r in res["per_dup"]:
        m = mem.get((r["experiment"], r["dup_count"]), {})
        low, high, em_method = exact_match_interval(m) if m else (None, None, None)
        small = r.get("small_n", r["n_items"] < MIN_ITEMS_PER_GROUP)
        rows.append([r["experiment"], r["dup_count"], fmt_items(r["n_items"], small), _fmt(r["mean_loss"]),
                     fmt_ci(r.get("ci_low"), r.get("ci_high")), r.get("ci_method") or "-",
                     _fmt(m.get("exact_match_rate"), ".2f"), fmt_ci(low, high, ".2f") if m else "-",
                     em_method or "-", _fmt(r.get("effective_dup_mean"), ".2f")])
    level = f"{LEVEL:.0%}"
    lines = [f"## Evaluation at step {res['step']}", "",
             f"Mean per-token loss (nats) of the items by dup count with {level} confidence intervals over items, and "
             f"verbatim memorization (exact-match rate of the greedy continuation, {level} CI); the method of each "
             f"interval is named beside it, `n/a` means no interval (fewer than 2 items or no spread), and `*` marks "
             f"a group of fewer than {MIN_ITEMS_PER_GROUP} items (wide intervals, coarse exact p-values). `eff. dup` "
             "adds the natural occurrences the audit found. Exact values, with each effect against the dup-0 "
             "controls (interval, randomization p, adjusted p): `pretrain_exp.per_dup` and `pretrain_exp.effects` in "
             "this card's metadata.", ""]
    if rows:
        lines += [_md_table(["experiment", "dup count", "items", "mean loss", f"{level} CI", "CI method",
                             "exact match", f"{level} CI", "CI method", "eff. dup"], rows)]
    else:
        lines.append("No insertion-loss eval in this run.")
    effects = [e for e in res.get("effects") or [] if e.get("eval_type") == "insertion_loss"]
    if effects:
        ci = method_label(e.get("effect_ci_method") for e in effects)
        lines += ["", f"Effects on the loss against the dup-0 controls, loss(dup 0) - loss(dup d) in nats/token "
                      f"({level} CI: {ci or '-'}); the trend row is the primary endpoint (slope over "
                      "log(1 + dup count), not adjusted):", "",
                  _md_table(["experiment", "contrast", "effect", f"{level} CI", "p", "p method", "p adjusted"],
                            [[e["experiment"], e["contrast"], _fmt(e.get("effect")),
                              fmt_ci(e.get("effect_ci_low"), e.get("effect_ci_high")), _fmt(e.get("p_value"), ".3g"),
                              e.get("p_method") or "-",
                              f"{_fmt(e.get('p_adjusted'), '.3g')} ({e.get('p_adjust_method')})"]
                             for e in effects])]
    by_step = res.get("by_step") or {}
    keys = sorted({k for tasks in by_step.values() for m in tasks.values() for k in m if k.endswith("/mean_loss")},
                  key=lambda k: [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", k)])
    if keys:
        flat = {s: {k: v for m in tasks.values() for k, v in m.items()} for s, tasks in by_step.items()}
        lines += ["", "Mean loss by evaluated step:", "",
                  _md_table(["step"] + [k.removesuffix("/mean_loss") for k in keys],
                            [[s] + [_fmt(flat[s].get(k)) for k in keys] for s in sorted(flat, key=int)])]
    held = {k: v for m in (res.get("metrics") or {}).values() for k, v in m.items() if k.startswith("held_out/")}
    if "held_out/perplexity" in held:
        lines += ["", f"Held-out perplexity: {held['held_out/perplexity']:.2f} over "
                      f"{int(held.get('held_out/tokens', 0))} tokens."]
    return lines + [""]


def reproduce_command(run: dict, repo_id: str, data_dir: str) -> List[str]:
    """The shell lines that run the experiment again from the bundle's dataset downloaded to ``data_dir``: the
    run's Hydra overrides (without :data:`MACHINE_KEYS`, local paths as placeholders), each file-based experiment
    reading its items from ``<data_dir>/inputs/<e>.jsonl`` (:func:`experiment_inputs`)."""
    inputs = run.get("inputs") or {}
    replaced = {f"insertion.experiments.{e}.{k}" for e, i in inputs.items() for k in i["set"]} | set(MACHINE_KEYS)
    overrides = [o for o in run["overrides"] if _override_key(o) not in replaced]
    for e, i in inputs.items():
        overrides += [f"insertion.experiments.{e}.{k}="
                      + (f"{data_dir}/{v}" if k == "file" else str(v)) for k, v in i["set"].items()]
    lines = [f"hf download {repo_id} --repo-type dataset --local-dir {data_dir}"]
    return lines + [" ".join(["pretrain-exp"] + [shlex.quote(str(o)) for o in overrides])]


def _reproduce_lines(run: dict, repo_id: str) -> List[str]:
    code = _code(run["results"])
    data_dir = repo_id.rsplit("/", 1)[-1] + "-dataset"
    command = reproduce_command(run, repo_id, data_dir)
    pin = f"pretrain_exp=={code['version']}" if code["version"] else "pretrain_exp"
    note = (f"# the code that wrote this run: pretrain_exp {code['version']}"
            + (f", git commit {code['commit']}" if code["commit"] else "") if code["version"]
            else f"# the run's {RunDir.RESULTS} does not record the pretrain_exp version")
    lines = ["## How to reproduce", "",
             "From this release's dataset" + (" (its `inputs/` hold the items that "
                                              + ", ".join(f"`{e}`" for e in run["inputs"]) + " read from a file)"
                                              if run.get("inputs") else "") + ":", "",
             "```bash", f"pip install {shlex.quote(pin)}  {note}", *command, "```", ""]
    if any(PLACEHOLDERS["other"] + "/" in line for line in command):
        lines += [f"`{PLACEHOLDERS['other']}/<name>` stands for a path on the machine of the run (not in this "
                  "release); give your own.", ""]
    return lines + [
        f"The new run's `{RunDir.PLAN}` holds the same insertions as `{data_dir}/{RunDir.PLAN}` (sha256 above). "
        f"The resolved config (`{RunDir.CONFIG}` of the dataset repo):", "",
        f"<details><summary>{RunDir.CONFIG}</summary>", "", "```yaml",
        yaml.safe_dump(run["config"], sort_keys=False).rstrip(), "```", "", "</details>", ""]


def model_card(run: dict, facts: dict, repo_id: str, license_id: str, revision: Optional[str] = None):
    """The model card (:class:`huggingface_hub.ModelCard`) of a bundle; ``revision``: the branch it describes."""
    from huggingface_hub import ModelCard

    res = run["results"]
    meta = _card_metadata(run, facts, repo_id, license_id, "model")
    revs = run.get("revisions", {})
    body = [f"# {res.get('run_name')}", "",
            f"A `{res.get('framework')}` continual-pretraining run with controlled data insertion, released by "
            "pretrain_exp. The inserted items, their placements and per-item evals are the dataset "
            f"[`{repo_id}`](https://huggingface.co/datasets/{repo_id}).", ""]
    if revision:
        body += [f"This is revision `{revision}` (global step {revs.get(revision)}).", ""]
    body += ["```python", "from transformers import AutoModelForCausalLM, AutoTokenizer",
             f'model = AutoModelForCausalLM.from_pretrained("{repo_id}"'
             + (f', revision="{revision}")' if revision else ")"),
             f'tokenizer = AutoTokenizer.from_pretrained("{repo_id}")', "```", ""]
    if revs:
        body += ["Revisions (branches `step<N>-tokens<T>`, T = tokens seen: OLMo's `<billions>B` from 1B tokens on, "
                 "else in K (1e3) or M (1e6)): "
                 + ", ".join(f"`{name}`" for name in revs) + "; `main` is the final step.", ""]
    body += _insertion_section(run, facts) + _eval_lines(res) + _audit_lines(res.get("audit"))
    body += _reproduce_lines(run, repo_id)
    body += ["## License", "", f"`{license_id}` (set with `--license`); the base model's license and the licenses "
             "of the inserted items' sources apply too.", ""]
    return ModelCard("---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n\n" + "\n".join(body))


def dataset_card(run: dict, facts: dict, tables: Dict[str, pd.DataFrame], repo_id: str, license_id: str):
    """The dataset card (:class:`huggingface_hub.DatasetCard`) of a bundle, with one ``configs`` entry per table."""
    from huggingface_hub import DatasetCard

    res = run["results"]
    meta = _card_metadata(run, facts, repo_id, license_id, "dataset")
    body = [f"# {res.get('run_name')}: inserted items", "",
            f"What run `{res.get('run_name')}` inserted into its training stream, where, and how the model "
            f"[`{repo_id}`](https://huggingface.co/{repo_id}) scored each item. No training-corpus text is included.",
            "", "```python", "from datasets import load_dataset"]
    body += [f'{name} = load_dataset("{repo_id}", "{name}", split="train")' for name in DATASET_CONFIGS]
    body += ["```", "", "| config | rows | one row per |", "|---|---|---|",
             f"| `items` | {len(tables['items'])} | item: id, experiment, type, dup count, `control` (dup 0: never "
             "inserted), text or `token_ids`, sha256, source, natural-duplicate counts |",
             f"| `placements` | {len(tables['placements'])} | inserted copy: global token `position`, `step`, `row`, "
             "`offset`, `length`, item, `dup_index`, sha256 of the tokens |",
             f"| `evals` | {len(tables['evals'])} | item x evaluated step x eval: loss, memorization, ... |", "",
             "Positions: `position = q*L + offset`, `q` the row's training-order index, `step = q // B + 1`, "
             f"`row = q % B` (L = {facts['L']}, B = {facts['B']}).", ""]
    body += _insertion_section(run, facts) + _audit_lines(res.get("audit"))
    body += [f"`{RunDir.PLAN}` (the insertion plan, numpy arrays, `allow_pickle=False`) and `{RunDir.CONFIG}` are "
             "included; their sha256 are above."]
    if run.get("inputs"):
        body += ["", "`inputs/<experiment>.jsonl`: the input file of each experiment that read its items from a file "
                 "(" + ", ".join(f"`{e}`" for e in run["inputs"]) + "), rebuilt from `items` in the run's order; "
                 f"the model card's reproduce command and `{RunDir.CONFIG}` read them."]
    body += ["", "## License", "",
             f"`{license_id}` (set with `--license`); the licenses of the items' sources (`source` column) apply.",
             ""]
    return DatasetCard("---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n\n" + "\n".join(body))


# --- the bundle ---------------------------------------------------------------------------------------------------
def _bundle_record(out: Path) -> Optional[dict]:
    try:
        return json.loads((out / BUNDLE_FILE).read_text())
    except (OSError, ValueError):
        return None


def build_bundle(run_dir: str | Path, out_dir: str | Path, repo_id: Optional[str] = None,
                 license_id: str = "other") -> Dict[str, Any]:
    """Write the release bundle of one run (module docstring) and return its ``release.json`` record.

    :param repo_id: the Hub id the cards name (default: the run name).
    :raises DataError: for a run dir without ``results.json``/``config.resolved.yaml``/``plan.npz``/items, or
        without an HF model of its final step (naming the file or dir and the setting that keeps it).
    :raises FileExistsError: if ``out_dir`` exists and is not a bundle of this run, plan, config and repo id.
    """
    run_dir, out = Path(run_dir).resolve(), Path(out_dir).resolve()
    if not run_dir.is_dir():
        raise DataError(f"{run_dir}: no such run dir")
    run = _read_run(run_dir)
    res = run["results"]
    repo_id = repo_id or str(res.get("run_name") or run_dir.name)
    if out.exists():
        rec = _bundle_record(out)
        if rec and (rec["plan_sha256"], rec["config_sha256"], rec["repo_id"]) == (
                run["plan_sha256"], run["config_sha256"], repo_id):
            log.info("release: %s is already the bundle of %s", out, run_dir)
            return rec
        raise FileExistsError(f"{out} exists and is not a release bundle of {run_dir} for {repo_id}; choose a new "
                              "directory")
    t = run["config"].get("training") or {}
    tokens_per_step = int(t.get("sequence_length") or 0) * int(t.get("global_batch_size") or 0)
    dirs = model_dirs(run_dir, run["config"])
    final = int(res["step"]) if res["step"] is not None else None
    if final not in dirs:
        kept = ", ".join(f"step {s}" for s in dirs) or "none"
        raise DataError(f"{run_dir}: no HF model of the final step {final} (kept: {kept}); it is hf/step{final}/ "
                        "(olmo_core/olmo2: training.export_hf=final or every) or checkpoints/checkpoint-<k>/ (hf: "
                        "training.keep_last_checkpoints, training.cleanup not all)")
    run["revisions"] = {revision_name(s, s * tokens_per_step): s for s in dirs}
    paths = run["paths"]
    tables = {name: paths.table(t) for name, t in dataset_tables(run_dir, run["config"]).items()}
    run["inputs"] = experiment_inputs(run["config"], tables)
    for e, i in run["inputs"].items():  # the bundle's config reads the bundle's input files
        run["config"]["insertion"]["experiments"][e].update(i["set"])
    config_text = OmegaConf.to_yaml(OmegaConf.create(run["config"]))
    run["bundle_config_sha256"] = hashlib.sha256(config_text.encode()).hexdigest()
    facts = _facts(run, tables)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    try:
        _link_or_copy(_model_files(dirs[final]), tmp / "model")
        model_card(run, facts, repo_id, license_id).save(tmp / "model" / "README.md")
        for name, step in run["revisions"].items():
            _link_or_copy(_model_files(dirs[step]), tmp / "revisions" / name)
            model_card(run, facts, repo_id, license_id, revision=name).save(tmp / "revisions" / name / "README.md")
        ds = tmp / "dataset"
        for name in DATASET_CONFIGS:
            path = ds / data_file(name, run["plan_sha256"], run["config_sha256"])
            path.parent.mkdir(parents=True, exist_ok=True)
            tables[name].to_parquet(path, index=False, engine="pyarrow")
        shutil.copy2(RunDir(run_dir).plan, ds / RunDir.PLAN)
        (ds / RunDir.CONFIG).write_text(config_text)
        for i in run["inputs"].values():
            (ds / i["path"]).parent.mkdir(parents=True, exist_ok=True)
            (ds / i["path"]).write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in i["lines"]))
        dataset_card(run, facts, tables, repo_id, license_id).save(ds / "README.md")
        rec = {"run_name": res.get("run_name"), "repo_id": repo_id, "license": license_id, "step": final,
               "code": _code(res), "plan_sha256": run["plan_sha256"], "config_sha256": run["config_sha256"],
               "bundle_config_sha256": run["bundle_config_sha256"], "revisions": run["revisions"],
               "files": {str(p.relative_to(tmp)): sha256_file(p) for p in sorted(tmp.rglob("*")) if p.is_file()}}
        write_json(tmp / BUNDLE_FILE, rec)
        for p in [tmp, *tmp.rglob("*")]:
            os.chmod(p, default_mode(directory=p.is_dir()))
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return rec


def sweep_jobs(root: Path) -> Optional[List[Path]]:
    """The finished job dirs of a sweep dir (sorted), or ``None`` when ``root`` is one run dir."""
    if RunDir(root).results.is_file() or RunDir(root).config.is_file():
        return None
    from pretrain_exp.report.failures import collect

    jobs, _ = collect(root)
    return sorted((j.path for j in jobs if j.results is not None), key=lambda p: str(p))


# --- push ---------------------------------------------------------------------------------------------------------
def _hub_api():
    """``huggingface_hub.HfApi`` once the Hub may be used: refused offline or without a token."""
    import huggingface_hub
    from huggingface_hub import HfApi

    if huggingface_hub.is_offline_mode():
        raise PushError("the Hugging Face Hub is offline here (HF_HUB_OFFLINE is set): unset HF_HUB_OFFLINE, log in "
                        "with `hf auth login` or set HF_TOKEN, then run the same command again to push")
    if not huggingface_hub.get_token():
        raise PushError("no Hugging Face token: log in with `hf auth login` or set HF_TOKEN (a token with write "
                        "access), then run the same command again to push")
    return HfApi()


def check_push_possible() -> None:
    """Raise :class:`PushError` now if a push would be refused (offline, no token), e.g. before a run trains."""
    _hub_api()


def push_bundle(bundle: str | Path, repo_id: str, private: bool = False, revision: str = "main") -> Dict[str, Any]:
    """Push a bundle (:func:`build_bundle`) to the Hub: the model repo ``repo_id`` (``model/`` on ``revision``, each
    ``revisions/<name>/`` on branch ``<name>``) and the dataset repo ``repo_id`` (``dataset/`` on ``main``).

    :returns: ``{"model": commit url, "dataset": commit url, "branches": {name: commit url}}``.
    :raises PushError: offline, without a token, for a refused token or any failed request; the bundle is left as
        it is, so the same command retries (files already on the Hub are skipped by ``huggingface_hub``). With
        ``private``, also for an existing public repo (``create_repo`` leaves an existing repo as it is), before
        anything is uploaded.
    """
    from huggingface_hub.errors import HfHubHTTPError

    bundle = Path(bundle)
    rec = _bundle_record(bundle)
    if rec is None:
        raise DataError(f"{bundle / BUNDLE_FILE}: missing; not a release bundle (write one with "
                        "pretrain-exp-release <run dir> <out dir>)")
    api = _hub_api()
    msg = f"pretrain_exp release of {rec['run_name']} (plan sha256 {rec['plan_sha256'][:12]})"
    out: Dict[str, Any] = {"branches": {}}
    try:
        for kind in ("model", "dataset"):  # an existing repo is kept as it is (the Hub answers 409)
            api.create_repo(repo_id, private=private, exist_ok=True, repo_type=kind)
            if private and not api.repo_info(repo_id, repo_type=kind).private:
                raise PushError(f"{kind} repo {repo_id} exists and is public, and --private (release.private) does "
                                "not change an existing repo: make it private on the Hub, or push without --private "
                                "(release.private=false); nothing was uploaded")
        if revision != "main":
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        out["model"] = api.upload_folder(repo_id=repo_id, folder_path=bundle / "model", revision=revision,
                                         commit_message=msg).commit_url
        for name in rec["revisions"]:
            api.create_branch(repo_id, branch=name, exist_ok=True)
            out["branches"][name] = api.upload_folder(repo_id=repo_id, folder_path=bundle / "revisions" / name,
                                                      revision=name, commit_message=f"{msg}: {name}").commit_url
        out["dataset"] = api.upload_folder(repo_id=repo_id, repo_type="dataset", folder_path=bundle / "dataset",
                                           commit_message=msg).commit_url
    except PushError:
        raise
    except HfHubHTTPError as e:
        status = getattr(e.response, "status_code", None)
        why = ("the Hub refused the token (HTTP {}): log in again with `hf auth login` or set HF_TOKEN to a token "
               "with write access to {}".format(status, repo_id) if status in (401, 403)
               else f"the Hub answered HTTP {status}: {' '.join(str(e).split())[:300]}")
        raise PushError(redact(f"push of {bundle} to {repo_id} failed: {why}; the bundle is intact, run the same "
                               "command again to retry")) from None
    except Exception as e:  # noqa: BLE001  connection errors, a failed LFS upload (RuntimeError), bad metadata
        raise PushError(redact(f"push of {bundle} to {repo_id} failed ({type(e).__name__}: "
                               f"{' '.join(str(e).split())[:300]}); the bundle is intact, run the same command "
                               "again to retry")) from None
    return out


# --- command line -------------------------------------------------------------------------------------------------
def release(path: str | Path, out_dir: str | Path, repo_id: Optional[str] = None, push: bool = False,
            private: bool = False, revision: str = "main", license_id: str = "other") -> List[Dict[str, Any]]:
    """Bundle a run dir (or each finished job of a sweep dir) into ``out_dir`` and push it if ``push``; returns the
    bundles' records (each with ``bundle`` = its dir and, when pushed, ``pushed``)."""
    path, out_dir = Path(path).resolve(), Path(out_dir).resolve()
    if not path.is_dir():
        raise DataError(f"{path}: no such run or sweep dir")
    if push:
        check_push_possible()  # refuse before writing anything
    jobs = sweep_jobs(path)
    if jobs == []:
        raise DataError(f"{path}: no finished run ({RunDir.RESULTS}) in this dir or its job dirs")
    targets = [(path, out_dir, repo_id)] if jobs is None else [
        (j, out_dir / j.relative_to(path).as_posix().replace("/", "-"),
         f"{repo_id}-{j.relative_to(path).as_posix().replace('/', '-')}" if repo_id else None) for j in jobs]
    records = []
    for run_dir, out, rid in targets:
        rec = dict(build_bundle(run_dir, out, rid, license_id), bundle=str(out))
        if push:
            rec["pushed"] = push_bundle(out, rec["repo_id"], private=private, revision=revision)
        records.append(rec)
    return records


def release_run(rundir: RunDir, conf: ReleaseConf, run_name: str) -> Dict[str, Any]:
    """Bundle the finished run in ``rundir`` and push it as ``conf`` (the ``release`` node) says
    (:func:`release`); ``run_name``: for the log line. Returns the bundle's record.

    :raises PushError: if the push fails; the bundle stays in ``release.out_dir`` (default: the run dir's
        ``release/``) and the error names the ``pretrain-exp-release`` command that retries it.
    """
    out = Path(conf.out_dir) if conf.out_dir else rundir.release
    retry = f"pretrain-exp-release {rundir.path} {out} --push {conf.repo_id}" + (" --private" if conf.private else "")
    try:
        (rec,) = release(rundir.path, out, conf.repo_id, push=True, private=conf.private, revision=conf.revision,
                         license_id=conf.license)
    except PushError as e:
        raise PushError(f"{e} (retry: {retry})") from None
    log.info("released %s: model and dataset repos %s (bundle %s)", run_name, conf.repo_id, out)
    return rec


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``pretrain-exp-release <run or sweep dir> <out dir> [--push REPO_ID] ...``; returns 0, or 2 after one
    ``error: ...`` line (bad input, a refused push)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog=prog("pretrain-exp-release", "pretrain_exp.release"),
        description="Write a finished run as a Hub-ready bundle: <out>/model (final step's HF model + model card), "
                    "<out>/revisions/step<N>-tokens<T> (every kept step), <out>/dataset (items, placements, evals "
                    "as Parquet + dataset card); optionally push it to the Hugging Face Hub. A sweep dir gives one "
                    "bundle per finished job (<out>/<job>, pushed to <REPO_ID>-<job>).")
    parser.add_argument("run_dir", type=Path, help=f"a finished run dir ({RunDir.RESULTS}) or a sweep dir")
    parser.add_argument("out_dir", type=Path, help="the bundle dir to write (an existing bundle of the same run and "
                                                   "repo id is reused, e.g. to retry a push)")
    parser.add_argument("--push", metavar="REPO_ID", default=None,
                        help="push to this Hub model repo and the dataset repo of the same id (token: HF_TOKEN or "
                             "`hf auth login`)")
    parser.add_argument("--repo-id", default=None, help="the Hub id the cards name without pushing (default: "
                                                        "--push's, else the run name)")
    parser.add_argument("--private", action="store_true", help="create the repos private")
    parser.add_argument("--revision", default="main", help="the branch the final model goes to (default main)")
    parser.add_argument("--license", dest="license_id", default="other",
                        help="the cards' license id (Hub license identifiers, e.g. apache-2.0; default other)")
    args = parser.parse_args(argv)
    if args.push and args.repo_id and args.push != args.repo_id:
        parser.error("--repo-id and --push name different repos")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        records = release(args.run_dir, args.out_dir, repo_id=args.push or args.repo_id, push=bool(args.push),
                          private=args.private, revision=args.revision, license_id=args.license_id)
    except (PretrainExpError, FileExistsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for rec in records:
        print(f"wrote {rec['bundle']}: model of step {rec['step']}, revisions {', '.join(rec['revisions'])}, "
              f"{len(rec['files'])} files")
        if "pushed" in rec:
            print(f"pushed {rec['repo_id']}: model {rec['pushed']['model']}, dataset {rec['pushed']['dataset']}, "
                  f"{len(rec['pushed']['branches'])} branch(es)")
    return 0
