"""Sweeps and reports: the ``conf/sweep`` presets expand into valid jobs, the wrapper scripts, the report CLI
(``python -m pretrain_exp.report``) on a real multirun with a failed job, and checkpoint sweeps over a base series."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser

from pretrain_exp.app.validate import to_config
from tests.conftest import CACHE_DIR, CONF_DIR, ROOT, compose
from tests.wandb_records import of_type

SWEEPS = sorted(p.stem for p in (CONF_DIR / "sweep").glob("*.yaml"))
#: jobs each preset expands into
JOBS = {"demo_grid": 3, "seeds_x_dups": 4, "seeds_x_steps": 4}
#: sweep dir of the 2-job tiny sweep shared by the report tests: 4 steps, dup counts 0/1/2/4 (fits 4 steps)
TINY_SWEEP = ["experiment=tiny", "training.num_steps=4", "insertion.experiments.fictional_bios.repetitions=[0,1,2,4]",
              "training.num_threads=1"]


def _env(**extra: str) -> dict:
    env = {**os.environ, "PRETRAIN_EXP_CACHE": str(CACHE_DIR), "HF_HUB_OFFLINE": "1", "WANDB_SILENT": "true",
           "PYTHONPATH": str(ROOT)}
    env.pop("PRETRAIN_EXP_RUNS", None)
    return env | extra


def _run(args, cwd: Path, env: dict, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def _compose_with_hydra(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose("config", overrides=["run_dir=/nonexistent-run-dir", f"cache_dir={CACHE_DIR}",
                                                  *overrides], return_hydra_config=True)


def _sweep_jobs(params) -> list:
    """The job override lists the basic sweeper makes of ``hydra.sweeper.params``."""
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


# --- presets and scripts ------------------------------------------------------------------------------------------
def test_sweep_presets_exist():
    assert set(JOBS) <= set(SWEEPS)


@pytest.mark.parametrize("name", SWEEPS)
def test_sweep_preset_expands_into_valid_jobs(name):
    cfg = _compose_with_hydra(f"+sweep={name}")
    params = cfg.hydra.sweeper.params
    assert params, f"conf/sweep/{name}.yaml sets no hydra.sweeper.params"
    jobs = _sweep_jobs(params)
    assert len(jobs) == JOBS.get(name, len(jobs)) and len(jobs) >= 2
    seen = []
    for job in jobs:
        exp = to_config(compose(f"+sweep={name}", *job))  # every job composes and validates
        seen.append(exp)
    if name == "seeds_x_dups":
        reps = sorted({(e.seed, tuple(e.insertion.experiments["fictional_bios"].repetitions)) for e in seen})
        assert reps == [(s, r) for s in (0, 1) for r in ((0, 1, 4, 16), (0, 2, 4, 8))]
    if name == "seeds_x_steps":
        assert sorted((e.seed, e.model.checkpoint_step) for e in seen) == [(0, 4), (0, 8), (1, 4), (1, 8)]
        for e in seen:
            assert e.model.asset is None and e.model.name == "base_series"
            assert e.model.path.endswith(f"/base_series-smollm2_135m-step0-seed0/checkpoints/"
                                         f"checkpoint-{e.model.checkpoint_step}")
    if name == "demo_grid":
        assert sorted(e.seed for e in seen) == [0, 1, 2] and {e.name for e in seen} == {"default"}


def test_sweep_preset_overrides_compose_with_a_tiny_base_series():
    overrides = ["+sweep=seeds_x_steps", "experiment=tiny", "model=base_series_tiny", "model.checkpoint_step=8"]
    exp = to_config(compose(*overrides))
    assert (exp.name, exp.model.name, exp.model.checkpoint_step) == ("tiny", "base_series_tiny", 8)
    assert exp.model.path.endswith("/base_series-tiny_llama-step0-seed0/checkpoints/checkpoint-8")


@pytest.mark.slow
def test_cli_accepts_sweep_presets(tmp_path):
    out = _run(["-m", "pretrain_exp", "+sweep=seeds_x_dups", "--cfg", "hydra"], ROOT, _env()).stdout
    assert "choice([0,1,4,16],[0,2,4,8])" in out and "seed: 0,1" in out


@pytest.mark.parametrize("script", sorted((ROOT / "multirun_scripts").glob("*.sh")), ids=lambda p: p.name)
def test_multirun_scripts(script):
    text = script.read_text()
    assert os.access(script, os.X_OK) and text.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in text and '"$@"' in text
    subprocess.run(["bash", "-n", str(script)], check=True)
    if script.stem == "report":
        assert "-m pretrain_exp.report" in text
    else:
        assert f"-m pretrain_exp -m +sweep={script.stem} " in text and script.stem in SWEEPS


def test_report_of_a_dir_without_jobs(tmp_path):
    proc = _run(["-m", "pretrain_exp.report", str(tmp_path)], ROOT, _env(), check=False)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"error: {tmp_path.resolve()}: no job dirs (dirs with .hydra/ or config.resolved.yaml) under it"]
    assert not list(tmp_path.iterdir())


# --- real sweeps ----------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_report_of_a_real_sweep_with_a_failed_job(tmp_path, tiny_model_dir):
    sweep = tmp_path / "sweep"
    env = _env(PRETRAIN_EXP_RUNS=str(tmp_path / "runs"))
    first = _run(["-m", "pretrain_exp", "-m", *TINY_SWEEP, "seed=0,1", "wandb=disabled",
                  f"hydra.sweep.dir={sweep}"], ROOT, env)
    assert first.stdout.strip().splitlines()[-2:] == [  # the sweep ends with its dir and its report's command
        f"sweep dir: {sweep.resolve()}",
        f"report: pretrain-exp-report {sweep.resolve()}   (or python -m pretrain_exp.report {sweep.resolve()})"]
    # a third job into the same sweep dir, through the submitit launcher (its logs land in <sweep>/.submitit/ as
    # on SLURM), that fails in training: an Adam beta of 2 passes the config checks and fails when the optimizer
    # is built. W&B offline has written files by then, so the failed job keeps its dir.
    failed = _run(["-m", "pretrain_exp", "-m", *TINY_SWEEP, "seed=2", "wandb=offline", "training.adam_beta1=2.0",
                   "training.max_retries=0", "hydra/launcher=submitit_local", f"hydra.sweep.dir={sweep}",
                   "hydra.sweep.subdir=2"], ROOT, env, check=False)
    assert not (sweep / "2" / "results.json").exists()
    # the sweep's own console: one line naming the job, its error and its log, no traceback, exit status 1
    assert failed.returncode == 1 and "Traceback" not in failed.stderr, failed.stderr[-3000:]
    said = [line for line in failed.stderr.splitlines() if line.startswith("error: ")]
    assert len(said) == 1 and said[0].startswith("error: job ") and "ended without a result" in said[0], said
    assert "Invalid beta parameter" in said[0] and f"every job: pretrain-exp-report {sweep.resolve()}" in said[0], said
    log_path = Path(said[0].split("; its log: ")[1].split(";")[0])
    assert log_path.is_file() and log_path.parent.parent == sweep.resolve() / ".submitit", said

    proc = _run(["-m", "pretrain_exp.report", str(sweep)], ROOT, env)
    paths = [sweep / "report.csv", sweep / "report.md", sweep / "loss_vs_dup.png", sweep / "effect_pooled.csv",
             sweep / "effect_vs_dup.png"]
    for p in paths:
        assert f"wrote {p}" in proc.stdout
    for p in (paths[2], paths[4]):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # jobs that differ only by seed: one effect per dup count, pooled over seeds and items, with its 95% CI
    with open(paths[3], newline="") as f:
        pooled = {int(r["dup_count"]): r for r in csv.DictReader(f)}
    assert sorted(pooled) == [1, 2, 4] and "effect pooled over seeds" in proc.stdout
    assert "seed variance not identified with 2 seed(s): no interval" in " ".join(proc.stdout.split())
    with open(paths[0], newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    # seed is the only override that differs between the finished jobs, and it has its own column
    assert reader.fieldnames == ["job", "seed", "checkpoint_step", "step", "experiment", "dup_count", "n_items",
                                 "small_n", "mean_loss", "ci_low", "ci_high", "ci_method", "effect", "effect_ci_low",
                                 "effect_ci_high", "effect_ci_method", "p_value", "p_adjusted"]
    assert len(rows) == 2 * 4
    assert sorted({(r["job"], r["seed"], r["checkpoint_step"], r["step"]) for r in rows}) == [
        ("0", "0", "0", "4"), ("1", "1", "0", "4")]
    for job in ("0", "1"):
        mine = {int(r["dup_count"]): r for r in rows if r["job"] == job}
        assert sorted(mine) == [0, 1, 2, 4]
        res = json.loads((sweep / job / "results.json").read_text())
        for want in res["per_dup"]:
            got = mine[want["dup_count"]]
            assert float(got["mean_loss"]) == pytest.approx(want["mean_loss"], rel=1e-12)
            assert float(got["effect"]) == pytest.approx(res["per_dup"][0]["mean_loss"] - want["mean_loss"])
            assert int(got["n_items"]) == want["n_items"] == 4 and got["experiment"] == "fictional_bios"
        assert float(mine[0]["effect"]) == 0.0
    for d, p in pooled.items():
        per_job = [float(r["effect"]) for r in rows if int(r["dup_count"]) == d]
        assert p["seeds"] == "0,1" and int(p["n_seeds"]) == 2 and int(p["n_items"]) == 4 and p["small_n"] == "True"
        assert float(p["effect"]) == pytest.approx(sum(per_job) / 2, rel=1e-9)
        assert p["ci_low"] == p["ci_high"] == "" and p["group"] == "all"  # 2 seeds: seed variance not identified

    md = paths[1].read_text()
    # per job, then pooled: the effects, the dose response (1 row) and memorization (4 dup counts)
    assert "## Failed" in md and md.count("| fictional_bios |") == 8 + len(pooled) + 1 + 4
    failed_rows = [line for line in md.split("## Failed", 1)[1].split("\n## ", 1)[0].splitlines()
                   if line.startswith("| ") and not line.startswith("| job |")]
    assert len(failed_rows) == 1, md
    # the job's dir (or, should the bad beta ever be refused at config time, its submitit log)
    assert failed_rows[0].startswith(("| 2 | ", "| submitit job ")), failed_rows[0]
    assert "error: " in failed_rows[0] and "beta" in failed_rows[0] and "_log.err" in failed_rows[0]
    assert "seed=2" in failed_rows[0] or failed_rows[0].startswith("| submitit job ")
    assert "failed" in proc.stdout and "beta" in proc.stdout

    # the tidy tables: Parquet copies of the JSONL files, and the DataFrames the report is built on
    import pandas as pd

    import pretrain_exp

    for job in ("0", "1"):
        for name in ("manifest", "items"):
            want = [json.loads(line) for line in (sweep / job / f"{name}.jsonl").read_text().splitlines()]
            assert pd.read_parquet(sweep / job / f"{name}.parquet").to_dict("records") == want
    run = pretrain_exp.load_run(sweep / "0")
    assert list(run.columns[:6]) == ["item_id", "step", "eval", "eval_type", "experiment", "dup_count"]
    assert len(run) == 16 * 2 and sorted(run["eval"].unique()) == ["insertion_loss", "memorization"]
    assert set(run["step"]) == {4} and not run.duplicated(["item_id", "step", "eval"]).any()
    items = pd.read_parquet(sweep / "0" / "items.parquet").set_index("item_id")
    assert (run.set_index("item_id")["sha256"] == items["sha256"].reindex(run["item_id"])).all()
    loss = run[run["eval"] == "insertion_loss"].groupby("dup_count")["loss"].mean()  # per-item rows -> per dup
    res0 = json.loads((sweep / "0" / "results.json").read_text())
    assert loss.to_dict() == pytest.approx({r["dup_count"]: r["mean_loss"] for r in res0["per_dup"]}, rel=1e-9)
    frame = pretrain_exp.load_sweep(sweep)
    assert len(frame) == 3 and list(frame["job"]) == ["0", "1", "2"]
    assert list(frame["status"]) == ["done", "done", "failed"] and "beta" in frame["reason"].iloc[2]
    assert frame["seed"].tolist() == [0, 1, 2] and frame["step"].iloc[:2].tolist() == [4, 4]
    assert frame["insertion_loss/fictional_bios/dup4/mean_loss"].iloc[0] == res0["metrics"]["insertion_loss"][
        "fictional_bios/dup4/mean_loss"]

    # a single run dir is a report root too (here: --out elsewhere leaves the run dir as it was)
    one = _run(["-m", "pretrain_exp.report", str(sweep / "1"), "--out", str(tmp_path / "one")], ROOT, env)
    assert "failed" not in one.stdout
    with open(tmp_path / "one" / "report.csv", newline="") as f:
        assert [r["seed"] for r in csv.DictReader(f)] == ["1"] * 4
    assert not (sweep / "1" / "report.csv").exists()


@pytest.mark.slow
def test_base_series_checkpoints_are_continued(tmp_path, tiny_model_dir):
    """``experiment=base_series_tiny`` keeps every checkpoint; ``model=base_series_tiny`` continues one of them
    (runs root ``runs/`` relative to the working directory, as by default)."""
    env = _env()
    _run(["-m", "pretrain_exp", "experiment=base_series_tiny", "training.num_steps=8", "training.num_threads=1",
          "wandb=disabled", "name=base_series"], tmp_path, env)  # named: overrides would add a suffix
    series = tmp_path / "runs" / "base_series-tiny_llama-step0-seed0"
    assert sorted(p.name for p in (series / "checkpoints").iterdir()) == ["checkpoint-4", "checkpoint-8"]
    assert json.loads((series / "results.json").read_text())["plan"]["num_insertions"] == 0

    proc = _run(["-m", "pretrain_exp", *TINY_SWEEP, "model=base_series_tiny", "model.checkpoint_step=4",
                 "wandb=disabled"], tmp_path, env)
    run_dir = Path(proc.stdout.strip().splitlines()[-1].removeprefix("run dir: "))
    assert run_dir.parent == (tmp_path / "runs").resolve()
    assert run_dir.name.startswith("tiny-base_series_tiny-step4-seed0-")
    res = json.loads((run_dir / "results.json").read_text())
    B, L = 8, 128
    assert res["model"]["path"] == f"runs/{series.name}/checkpoints/checkpoint-4"
    assert res["model"]["checkpoint_step"] == 4 and res["step"] == 8
    assert res["plan"]["window"] == [4 * B * L, 8 * B * L]
    manifest = [json.loads(line) for line in (run_dir / "manifest.jsonl").read_text().splitlines()]
    assert len(manifest) == res["plan"]["num_insertions"] == 4 * (1 + 2 + 4)
    assert all(4 * B * L <= m["position"] < 8 * B * L and m["step"] in (5, 6, 7, 8) for m in manifest)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sorted({m["step"] for m in metrics if "train/loss" in m}) == [5, 6, 7, 8]
    assert sorted(p.name for p in (run_dir / "evals").iterdir()) == ["step8"]


def benchmark_sweep(root: Path) -> tuple:
    """Two finished jobs ``root/0`` (with a benchmark eval) and ``root/1``, each evaluated at steps 4 and 8;
    returns ``(benchmark metrics, insertion-loss metrics)`` of their results.json."""
    metrics = {"arc/dup0/acc": 0.25, "arc/dup4/acc": 0.75, "arc/dup8/acc": 0.5,
               "arc/contamination_effect_acc": 0.375, "arc/contamination_effect_acc_ci_low": 0.125,
               "arc/contamination_effect_acc_ci_high": 0.625}
    loss = {"bios/dup0/mean_loss": 3.0, "bios/dup4/mean_loss": 2.5}
    for job, seed in (("0", 0), ("1", 1)):
        d = root / job
        d.mkdir(parents=True)
        (d / "config.resolved.yaml").write_text(f"seed: {seed}\n")
        res = {"seed": seed, "step": 8, "per_dup": [], "metrics": {"benchmark": metrics} if seed == 0 else {},
               "by_step": {"4": {"insertion_loss": loss}, "8": {"insertion_loss": loss}}}
        (d / "results.json").write_text(json.dumps(res))
    return metrics, loss


@pytest.mark.slow
def test_report_of_benchmark_and_forgetting_results(tmp_path):
    """A job with a benchmark eval gets its clean vs contaminated row (benchmark.csv / .png, report.md) and a job
    evaluated at several steps its forgetting curve; the values are those of its results.json."""
    import pandas as pd

    from pretrain_exp import load_sweep
    from pretrain_exp.report import write_report

    metrics, loss = benchmark_sweep(tmp_path)
    rep = write_report(tmp_path)
    frame = rep["frame"]  # the report's own table: load_sweep's
    assert frame.drop(columns=["path"]).equals(load_sweep(tmp_path).drop(columns=["path"]))
    assert list(frame["job"]) == ["0", "1"] and frame["seed"].tolist() == [0, 1]
    assert frame["benchmark/arc/dup4/acc"].iloc[0] == 0.75 and pd.isna(frame["benchmark/arc/dup4/acc"].iloc[1])
    assert frame["by_step"].iloc[1] == {"4": {"insertion_loss": loss}, "8": {"insertion_loss": loss}}
    with open(rep["paths"]["benchmark_csv"], newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 1 and rows[0]["job"] == "0" and rows[0]["experiment"] == "arc"
    assert float(rows[0]["acc_clean"]) == 0.25 and float(rows[0]["acc_contaminated"]) == pytest.approx(0.625)
    assert (float(rows[0]["effect"]), float(rows[0]["ci_low"]), float(rows[0]["ci_high"])) == (0.375, 0.125, 0.625)
    assert "## Benchmark contamination" in (tmp_path / "report.md").read_text()
    for p in (rep["paths"]["benchmark_png"], tmp_path / "forgetting" / "0.png", tmp_path / "forgetting" / "1.png"):
        assert Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # the same tables and figures logged to an offline W&B run of the report
    from pretrain_exp.report import log_report_wandb

    wandb_dir = log_report_wandb(rep, tmp_path, "offline", "pretrain_exp", group="sweep-x")
    assert wandb_dir is not None and wandb_dir.parent == tmp_path / "wandb"
    (wb,) = wandb_dir.glob("*.wandb")
    deadline = time.monotonic() + 60  # W&B's service may still be flushing its transaction log on a busy machine
    while not of_type(wb, "run") and time.monotonic() < deadline:
        time.sleep(0.5)
    (meta,) = of_type(wb, "run")  # next to the sweep's jobs in W&B (their group is the sweep dir's name)
    assert (meta.run_group, meta.job_type) == ("sweep-x", "report")
    media = {p.name.split("_")[0] for p in (wandb_dir / "files" / "media").rglob("*") if p.is_file()}
    assert media, "no tables or images in the W&B run"


@pytest.mark.slow
def test_report_cli_wandb_offline(tmp_path, capsys):
    """``pretrain-exp-report DIR --out OUT --wandb offline --wandb-project P``: an offline W&B run under OUT/wandb,
    in project P, named ``report-<out dir name>``, grouped with the sweep (its dir name), holding every CSV the
    report wrote as a table and every PNG as an image; without ``--wandb`` no W&B run is written."""
    from pretrain_exp.core.io import sha256_file
    from pretrain_exp.report.cli import main
    from tests.wandb_records import history

    sweep, out = tmp_path / "sweep-y", tmp_path / "out-y"
    benchmark_sweep(sweep)
    assert main([str(sweep), "--out", str(tmp_path / "plain")]) == 0
    assert not (tmp_path / "plain" / "wandb").exists()
    capsys.readouterr()
    assert main([str(sweep), "--out", str(out), "--wandb", "offline", "--wandb-project", "proj-y"]) == 0
    written = [Path(line[len("wrote "):]) for line in capsys.readouterr().out.splitlines() if line.startswith("wrote ")]
    csvs, pngs = [p for p in written if p.suffix == ".csv"], [p for p in written if p.suffix == ".png"]
    assert csvs and pngs
    (wb,) = (out / "wandb").glob("offline-run-*/run-*.wandb")
    deadline = time.monotonic() + 60  # W&B's service may still be flushing its transaction log on a busy machine
    while not history(wb) and time.monotonic() < deadline:
        time.sleep(0.5)
    (meta,) = of_type(wb, "run")
    assert (meta.project, meta.display_name, meta.run_group, meta.job_type) == \
        ("proj-y", "report-out-y", "sweep-y", "report")
    (row,) = history(wb)  # one wandb.log: {"report/<name>": table, "plots/<name>": image}, flattened
    kinds = {k.rsplit("/", 1)[0]: v for k, v in row.items() if k.endswith("/_type")}
    tables = sorted(k for k, v in kinds.items() if k.startswith("report/") and v == "table-file")
    images = sorted(k for k, v in kinds.items() if k.startswith("plots/") and v == "image-file")
    assert len(tables) == len(csvs) and len(images) == len(pngs)
    with_rows = [len(list(csv.reader(p.read_text().splitlines()))) - 1 for p in csvs]
    assert sorted(row[f"{k}/nrows"] for k in tables) == sorted(with_rows)
    assert sorted(row[f"{k}/sha256"] for k in images) == sorted(sha256_file(p) for p in pngs)


def test_the_docs_document_the_outputs_a_run_and_a_report_write():
    """Every file name the code writes into a run dir or a report dir appears in the docs' tables (the run-dir
    reference, the reports section, the commands reference)."""
    pages = [ROOT / "docs" / "reference" / "run-dir.md", ROOT / "docs" / "guides" / "launching.md",
             ROOT / "docs" / "reference" / "commands.md"]
    docs = "\n".join(p.read_text() for p in pages)
    for name in ("wandb_id.txt", "olmo_core_work/", "forgetting/<job>.png", "effect_pooled.csv", "loss_vs_dup.png",
                 "effect_vs_dup.png", "pretrain-exp-eval"):
        assert f"`{name}" in docs, name
