"""Every file a run writes through a temp file + rename (results, plan, manifest, items, evals, the resolved
config, token files, cache folders, checkpoints written by safetensors) gets the mode a plain ``open()`` gives
under the umask, not ``mkstemp``'s ``0o600``: the run's group can read a shared run dir and cache."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from pretrain_exp.app.run_record import save_resolved_config
from pretrain_exp.core.io import apply_default_modes, write_json
from pretrain_exp.data.assets import build_once
from pretrain_exp.data.token_files import write_token_file
from pretrain_exp.insertion import text_cache
from pretrain_exp.insertion.items import ItemSet
from tests.conftest import make_config, make_plan


@pytest.fixture(params=[0o022, 0o002], ids=["umask022", "umask002"])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def modes(root):
    """``{relative path: permission bits}`` of every file and folder under ``root``."""
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in sorted(root.rglob("*"))}


def test_run_and_cache_writers_follow_the_umask(tmp_path, umask):
    run = tmp_path / "run"
    run.mkdir()
    items = [([1, 5, 6, 1], 1, 0), ([1, 7, 8, 9, 1], 0, 0)]
    plan = make_plan(items)
    plan.save(run / "plan.npz")
    sets = {"bios": ItemSet.from_token_lists("bios", [t for t, _, _ in items], [d for _, d, _ in items])}
    plan.write_manifest(run / "manifest.jsonl", sets)
    write_json(run / "results.json", {"step": 1})
    write_json(run / "evals" / "step1" / "insertion_loss.json", {"loss": 1.0})
    save_resolved_config(make_config("experiment=tiny", run_dir=run), run)
    save_file({"w": torch.zeros(2)}, str(run / "model.safetensors"))  # the library itself writes 0o600
    assert stat.S_IMODE((run / "model.safetensors").stat().st_mode) == 0o600
    apply_default_modes(run / "model.safetensors")
    cache = tmp_path / "cache"
    write_token_file(cache / "tokens" / "part-00000.npy", [[5, 6], [7]], np.uint16, 2)
    text_cache.save(cache / "item_tokens" / "x.npz", np.arange(3), np.array([3]), {"file": "f"})
    build_once(cache / "built", lambda tmp: (tmp / "a.bin").write_bytes(b"x") and {"ok": 1})

    f, d = 0o666 & ~umask, 0o777 & ~umask
    got = modes(run) | {f"cache/{k}": v for k, v in modes(cache).items()}
    want = {k: d if (tmp_path / ("" if k.startswith("cache/") else "run") / k).is_dir() else f for k in got}
    assert got == want
    assert {"plan.npz", "manifest.jsonl", "items.jsonl", "results.json", "evals/step1/insertion_loss.json",
            "config.resolved.yaml", "cache/tokens/part-00000.npy", "cache/tokens/part-00000.npy.csv.gz",
            "cache/built", "cache/built/.complete.json"} <= set(got)
