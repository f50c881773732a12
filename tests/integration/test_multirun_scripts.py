"""The wrapper scripts of ``multirun_scripts/`` run as documented: each sweep script with the tiny model (one job:
the command line's ``seed`` and dup counts replace the preset's lists), ``seeds_x_steps.sh`` on a tiny base series,
then ``report.sh`` on each sweep dir."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CACHE_DIR, CHECKOUT_PYTHONPATH, ROOT

pytestmark = pytest.mark.slow  # trains 4 tiny runs through the scripts: ~2 min on 2 cores

SCRIPTS = ROOT / "multirun_scripts"
TINY = ["experiment=tiny", "training.num_steps=4", "insertion.experiments.fictional_bios.repetitions=[0,1,2,4]",
        "training.num_threads=1", "wandb=disabled", "seed=1"]


def script(name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": CHECKOUT_PYTHONPATH,
           "PRETRAIN_EXP_CACHE": str(CACHE_DIR), "HF_HUB_OFFLINE": "1", "WANDB_SILENT": "true"}
    env.pop("PRETRAIN_EXP_RUNS", None)  # runs/ under cwd, as model=base_series_tiny expects by default
    proc = subprocess.run([str(SCRIPTS / f"{name}.sh"), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, f"{name}.sh: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def test_every_script_runs_and_the_report_gathers_its_sweep(tmp_path, tiny_model_dir):
    assert sorted(p.stem for p in SCRIPTS.glob("*.sh")) == ["demo_grid", "report", "seeds_x_dups", "seeds_x_steps"]
    subprocess.run([sys.executable, "-m", "pretrain_exp", "experiment=base_series_tiny", "training.num_steps=4",
                    "training.num_threads=1", "wandb=disabled", "name=base_series"], cwd=tmp_path, check=True,
                   capture_output=True, env={**os.environ, "PYTHONPATH": CHECKOUT_PYTHONPATH, "WANDB_SILENT": "true",
                                             "PRETRAIN_EXP_CACHE": str(CACHE_DIR)} | {"PRETRAIN_EXP_RUNS": "runs"},
                   timeout=900)
    extra = {"demo_grid": [], "seeds_x_dups": [], "seeds_x_steps": ["model=base_series_tiny",
                                                                    "model.checkpoint_step=4"]}
    for name, more in extra.items():
        sweep = tmp_path / name
        out = script(name, *TINY, *more, f"hydra.sweep.dir={sweep}", cwd=tmp_path).stdout
        assert f"sweep dir: {sweep.resolve()}" in out, out[-2000:]
        res = json.loads((sweep / "0" / "results.json").read_text())
        assert res["step"] == 4 + (4 if name == "seeds_x_steps" else 0)
        assert not (sweep / "1").exists()  # the command line's seed replaced the preset's seeds
        report = script("report", str(sweep), cwd=tmp_path).stdout
        assert "failed" not in report
        with open(sweep / "report.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        assert rows and {r["seed"] for r in rows} == {"1"}
