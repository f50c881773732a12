"""The package as a researcher installs it: the wheel built from the checkout's files goes into a fresh venv (no
editable install, nothing of the checkout on ``sys.path``) and the console scripts run from an empty directory;
``pip install <dir>`` (non-editable) installs the same files; the checkout on ``PYTHONPATH`` with nothing installed
runs too.

The fresh venvs get the dependencies of this venv through a ``.pth`` line naming a folder of links to its
site-packages entries (every entry but this project's own: its editable finder, dist-info and ``.pth`` files), so
no dependency is downloaded or reinstalled: about 2 s per venv, where ``pip install torch==2.13.0`` (the local
CPU wheel) alone took 22 s and the other dependencies would come from the package index.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.conftest import CACHE_DIR, ROOT

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = None

pytestmark = [pytest.mark.slow, pytest.mark.skipif(tomllib is None, reason="Python 3.10 has no tomllib")]

TINY = ["experiment=tiny", "training.num_steps=2", "insertion.experiments.fictional_bios.repetitions=[0,1]",
        "wandb=disabled"]


def scripts() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def run(cmd, cwd, env, timeout=600):
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def checkout_copy(dest: Path) -> Path:
    """The checkout's files as a clone has them (tracked and untracked-not-ignored, so no ``.venv``, ``build/``,
    ``runs/`` or ``conf/local/``)."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for f in filter(None, files):
        if (ROOT / f).is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, dest / f)
    return dest


def fresh_venv(path: Path, deps: Path) -> Path:
    """A venv without pip whose site-packages reaches ``deps`` (links to this venv's dependencies)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(path), "platbase": str(path)}))
    (site / "_deps.pth").write_text(f"{deps}\n")
    return path / "bin" / "python"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """(tmp dir, checkout copy, wheel, deps folder, clean environment for the venvs' commands)."""
    tmp = tmp_path_factory.mktemp("packaging")
    src = checkout_copy(tmp / "src")
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", tmp / "dist", src],
        tmp, os.environ)
    wheel, = (tmp / "dist").glob("pretrain_exp-*.whl")
    deps = tmp / "deps"
    deps.mkdir()
    here = Path(sysconfig.get_path("purelib"))
    for entry in here.iterdir():
        name = entry.name.lower()
        if not (name.startswith(("pretrain_exp", "__editable__")) or name.endswith(".pth")):
            (deps / entry.name).symlink_to(entry)
    clean = {k: v for k, v in os.environ.items()
             if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PRETRAIN_EXP_RUNS")}
    clean |= {"PRETRAIN_EXP_CACHE": str(CACHE_DIR), "HF_HUB_OFFLINE": "1", "WANDB_SILENT": "true",
              "OMP_NUM_THREADS": "1", "PATH": os.defpath}
    return tmp, src, wheel, deps, clean


def test_the_wheel_holds_one_import_package_with_its_configs_and_data(env):
    _, src, wheel, _, _ = env
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"pretrain_exp"}
    conf = sorted(n.removeprefix("pretrain_exp/conf/") for n in names if n.startswith("pretrain_exp/conf/"))
    assert conf == sorted(str(p.relative_to(src / "conf")) for p in (src / "conf").rglob("*.yaml"))
    for f in ("pretrain_exp/insertion/types/sample_texts.jsonl", "pretrain_exp/frameworks/olmo_core/framework.py",
              "pretrain_exp/evals/lm_eval.py"):
        assert f in names
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA")))
    assert b"License-Expression: Apache-2.0" in meta and b"License-File: LICENSE" in meta


def test_the_checkout_on_pythonpath_runs_without_an_install(env):
    tmp, src, _, deps, clean = env
    py = fresh_venv(tmp / "venv-checkout", deps)
    empty = tmp / "empty-checkout"
    empty.mkdir()
    code = ("import pretrain_exp.frameworks.hf.framework as f, pretrain_exp.evals.shard as s, pretrain_exp as p; "
            "print(f.__file__); print(s.__file__); print(p.conf_dir())\n"
            "try:\n    import frameworks\nexcept ImportError as e:\n    print('refused:', e)")
    out = run([py, "-c", code], empty, clean | {"PYTHONPATH": str(src)}, 120).splitlines()
    assert out[:3] == [str(src / "frameworks/hf/framework.py"), str(src / "evals/shard.py"), str(src / "conf")]
    assert out[3].startswith("refused: import pretrain_exp.frameworks, not frameworks")
    out = run([py, "-m", "pretrain_exp", *TINY, "--cfg", "job"], empty, clean | {"PYTHONPATH": str(src)}, 120)
    assert "name: tiny" in out
    proc = subprocess.run([str(py), "-c", "import pretrain_exp"], cwd=empty, env=clean, capture_output=True)
    assert proc.returncode != 0  # without PYTHONPATH, nothing of the checkout is importable from this venv


def test_the_installed_wheel_runs_from_an_empty_directory(env):
    tmp, src, wheel, deps, clean = env
    venv = tmp / "venv-wheel"
    py = fresh_venv(venv, deps)
    run([sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-deps", "--no-index", wheel], tmp, clean)
    work = tmp / "work"
    work.mkdir()
    bin_ = venv / "bin"
    code = ("import sys, pretrain_exp; print(pretrain_exp.__file__); print(pretrain_exp.checkout_root()); "
            "print('\\n'.join(sys.path))")
    where = run([py, "-c", code], work, clean).splitlines()
    site = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    assert where[0] == str(site / "pretrain_exp" / "__init__.py") and where[1] == "None"
    for p in filter(None, where[2:]):  # no checkout (a folder with frameworks/ or pretrain_exp/) on sys.path
        assert not (Path(p) / "frameworks").exists() and (Path(p) == site or not (Path(p) / "pretrain_exp").exists()), p
    for name in ("frameworks", "evals"):  # the wheel installs no generic top-level import names
        proc = subprocess.run([str(py), "-c", f"import {name}"], cwd=work, env=clean, capture_output=True, text=True)
        assert "ModuleNotFoundError" in proc.stderr

    help_text = run([bin_ / "pretrain-exp", "--help"], work, clean)
    assert "== Configuration groups ==" in help_text and "framework: hf, olmo2, olmo_core" in help_text
    for script in scripts():
        assert script in help_text
        assert (bin_ / script).is_file()
        if script != "pretrain-exp":
            assert "usage:" in run([bin_ / script, "--help"], work, clean, 120)

    out = run([bin_ / "pretrain-exp", *TINY], work, clean).strip().splitlines()
    run_dir = Path(out[-1].removeprefix("run dir: "))
    assert run_dir.parent == work / "runs" and run_dir.name.startswith("tiny-tiny_llama-step0-seed0-")
    assert (run_dir / "results.json").is_file() and (run_dir / "evals" / "step2" / "insertion_loss.json").is_file()
    report = run([bin_ / "pretrain-exp-report", run_dir], work, clean)
    assert f"wrote {run_dir / 'report.csv'}" in report and (run_dir / "report.csv").is_file()
    assert "step 1, row 0" in run([bin_ / "pretrain-exp-inspect", run_dir, "step=1", "row=0"], work, clean)
    # the python -m forms of the same commands
    assert "pretrain-exp-report" in run([py, "-m", "pretrain_exp", "--help"], work, clean)
    assert "usage: python -m pretrain_exp.inspect" in run([py, "-m", "pretrain_exp.inspect", "--help"], work, clean)
    assert "usage: python -m pretrain_exp.report" in run([py, "-m", "pretrain_exp.report", "--help"], work, clean)
    assert sorted(p.name for p in work.iterdir()) == ["runs"]  # nothing but the runs root in the user's dir


def test_pip_install_of_the_directory_installs_the_wheels_files(env):
    """``pip install <checkout>`` (non-editable) builds a wheel with the same backend and installs it: the same
    files as the built wheel, and the configs are found from an empty dir; the run itself is the wheel's test."""
    tmp, src, wheel, deps, clean = env
    venv = tmp / "venv-dir"
    py = fresh_venv(venv, deps)
    run([sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-deps", "--no-build-isolation", src],
        tmp, clean)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    record, = site.glob("pretrain_exp-*.dist-info/RECORD")
    installed = {line.split(",")[0] for line in record.read_text().splitlines()
                 if line.startswith("pretrain_exp/") and not line.endswith(".pyc") and "__pycache__" not in line}
    in_wheel = {n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("pretrain_exp/")}
    assert installed == in_wheel
    empty = tmp / "empty-dir"
    empty.mkdir()
    assert "name: tiny" in run([venv / "bin" / "pretrain-exp", *TINY, "--cfg", "job"], empty, clean, 120)
