"""Hub model ids with revisions (``model=hf model.path=<org>/<name> model.revision=<rev>``), offline.

The HF cache is filled by ``huggingface_hub.snapshot_download`` itself from a Hub endpoint on 127.0.0.1
(:mod:`tests.hub_mirror`) serving the tiny model (written by ``save_pretrained``); the runs then use that cache with
``HF_HUB_OFFLINE=1`` and ``HF_HOME=<tmp>``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import constants, snapshot_download

from pretrain_exp.core.capabilities import LOADS_HUB_MODELS
from pretrain_exp.core.errors import CheckpointError, ConfigError
from pretrain_exp.frameworks.hf.framework import HFFramework
from tests.conftest import CACHE_DIR, ROOT, make_config
from tests.hub_mirror import HubMirror

REPO, REV = "acme/tiny-llama", "stage1-step4"


def _fill_cache(home, model_dir, monkeypatch):
    """Download ``acme/tiny-llama`` at ``stage1-step4`` from a local Hub endpoint into ``<home>/hub`` with the Hub
    library (online for the download, whatever ``HF_HUB_OFFLINE`` the tests run under); ``(commit, snapshot)``."""
    with monkeypatch.context() as m, HubMirror() as hub:
        m.setattr(constants, "HF_HUB_OFFLINE", False)
        commit = hub.add(REPO, REV, model_dir)
        return commit, snapshot_download(REPO, revision=REV, cache_dir=home / "hub", endpoint=hub.base)


@pytest.fixture
def hf_home(tmp_path, tiny_model_dir, monkeypatch):
    """An HF home whose cache holds ``acme/tiny-llama`` at ``stage1-step4`` (downloaded by the Hub library), as
    the offline Hub library of this process sees it; yields ``(hf_home, snapshot dir, commit)``."""
    home = tmp_path / "hf_home"
    commit, snap = _fill_cache(home, tiny_model_dir, monkeypatch)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return home, snap, commit


def _cfg(tmp_path, *overrides):
    return make_config("experiment=tiny", "wandb=disabled", "model=hf", f"model.path={REPO}", *overrides,
                       run_dir=tmp_path / "run")


def test_hub_id_and_revision_resolve_to_the_cached_snapshot(tmp_path, hf_home):
    home, snap, commit = hf_home
    got = HFFramework.resolve_model(_cfg(tmp_path, f"model.revision={REV}"))
    assert str(got) == snap and got.name == commit and (got / "model.safetensors").is_file()
    assert HFFramework.resolve_model(_cfg(tmp_path, f"model.revision={commit}")) == got  # a commit is a revision


def test_a_revision_resolves_to_its_cached_commit(hf_home):
    from pretrain_exp.frameworks.hub import resolved_commit

    _, snap, commit = hf_home
    assert len(commit) == 40 and resolved_commit(REPO, REV) == commit == Path(snap).name
    assert resolved_commit(REPO, commit) == commit
    assert resolved_commit(REPO, "nope") is None and resolved_commit("acme/absent", None) is None


def test_unknown_revision_or_model_is_one_clear_error(tmp_path, hf_home, tiny_model_dir):
    with pytest.raises(ConfigError, match=r"^model\.revision: 'nope' of Hub model 'acme/tiny-llama' is not in the "
                                          r"HF cache .*cached: \[.*'stage1-step4'\]"):
        HFFramework.resolve_model(_cfg(tmp_path, "model.revision=nope"))
    with pytest.raises(CheckpointError, match=r"^model\.path=acme/other: no such local dir, and Hub model "
                                              r"'acme/other' is not in the HF cache .*HF_HUB_OFFLINE=1"):
        HFFramework.resolve_model(_cfg(tmp_path, "model.path=acme/other"))
    with pytest.raises(ConfigError, match=r"^model\.revision: 'main': revisions select a Hub model's version; "
                                          r"model.path=.* is a local path"):
        HFFramework.resolve_model(_cfg(tmp_path, f"model.path={tiny_model_dir}", "model.revision=main"))


def test_revision_needs_a_framework_that_loads_hub_models(tmp_path, monkeypatch):
    monkeypatch.setattr(HFFramework, "capabilities",  # as the olmo_core and olmo2 frameworks
                        HFFramework.capabilities.without(LOADS_HUB_MODELS))
    with pytest.raises(ConfigError, match=r"^model\.revision: 'main': .*only the hf framework loads"):
        _cfg(tmp_path, "model.revision=main")


@pytest.mark.slow
def test_a_run_on_a_hub_id_and_revision_trains_offline(tmp_path, tiny_model_dir, monkeypatch):
    home = tmp_path / "hf_home"
    commit, _ = _fill_cache(home, tiny_model_dir, monkeypatch)
    env = {**os.environ, "PRETRAIN_EXP_CACHE": str(CACHE_DIR), "HF_HOME": str(home), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(ROOT), "PRETRAIN_EXP_RUNS": str(tmp_path / "runs")}
    env.pop("HF_HUB_CACHE", None)
    args = [sys.executable, "-m", "pretrain_exp", "experiment=tiny", "model=hf", f"model.path={REPO}",
            "wandb=disabled", "eval=[insertion_loss]", "training.num_steps=2",
            "insertion.experiments.fictional_bios.repetitions=[0,1]", "training.checkpoint_interval=2",
            "training.num_threads=1"]
    proc = subprocess.run([*args, f"model.revision={REV}"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = Path(proc.stdout.strip().splitlines()[-1].removeprefix("run dir: "))
    assert run_dir.name.startswith("tiny-hf-step0-seed0-")
    res = json.loads((run_dir / "results.json").read_text())
    assert res["model"]["path"] == REPO and res["model"]["revision"] == REV and res["step"] == 2
    assert res["model"]["commit"] == commit  # the branch as it was: a moving ref stays reproducible
    assert (run_dir / "checkpoints" / "checkpoint-2" / "model.safetensors").is_file()
    assert f"snapshots/{commit}" in (run_dir / "pretrain_exp.log").read_text()

    bad = subprocess.run([*args, "model.revision=stage9", f"hydra.run.dir={tmp_path / 'bad'}"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1].startswith("error: model.revision: 'stage9' of Hub model "
                                                          "'acme/tiny-llama' is not in the HF cache")
