"""``build_once``: built once, atomically, and rebuilt when the cached copy fails its integrity check."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from pretrain_exp.core.io import sha256_file
from pretrain_exp.data.assets import _stat, build_once, weights_intact


def make_builder(calls: list):
    def build(tmp):
        calls.append(tmp)
        (tmp / "weights.bin").write_bytes(b"weights")
        return {"sha256": hashlib.sha256(b"weights").hexdigest()}
    return build


def intact(path, marker) -> bool:
    f = path / "weights.bin"
    return f.is_file() and hashlib.sha256(f.read_bytes()).hexdigest() == marker["sha256"]


def test_built_once_then_served_from_the_cache(tmp_path):
    calls = []
    out = build_once(tmp_path / "model", make_builder(calls), intact)
    assert out == tmp_path / "model" and len(calls) == 1
    assert json.loads((out / ".complete.json").read_text())["sha256"] == hashlib.sha256(b"weights").hexdigest()
    assert build_once(tmp_path / "model", make_builder(calls), intact) == out and len(calls) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [".model.lock", "model"]  # no temp dir left


def test_a_corrupted_cached_copy_is_rebuilt(tmp_path, caplog):
    calls = []
    out = build_once(tmp_path / "model", make_builder(calls), intact)
    (out / "weights.bin").write_bytes(b"weightz")
    build_once(tmp_path / "model", make_builder(calls), intact)
    assert len(calls) == 2 and (out / "weights.bin").read_bytes() == b"weights"
    assert "corrupted" in caplog.text


def test_a_failed_build_leaves_nothing(tmp_path):
    def broken(tmp):
        (tmp / "half.bin").write_bytes(b"half")
        raise RuntimeError("conversion failed")

    with pytest.raises(RuntimeError, match="conversion failed"):
        build_once(tmp_path / "model", broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".model.lock"]


def test_model_weights_are_hashed_again_only_when_their_size_or_time_changed(tmp_path):
    w = tmp_path / "model.safetensors"
    w.write_bytes(b"weights")
    marker = {"model.safetensors": sha256_file(w), "model.safetensors.stat": _stat(w)}
    assert weights_intact(tmp_path, marker)
    assert weights_intact(tmp_path, dict(marker, **{"model.safetensors": "0" * 64}))  # stat equal: not hashed
    assert weights_intact(tmp_path, {"model.safetensors": marker["model.safetensors"]})  # a marker before stats
    assert json.loads((tmp_path / ".complete.json").read_text()) == marker  # ... gets the stats once hashed
    w.write_bytes(b"weightz")  # same size, new time: hashed, and the hash differs
    assert not weights_intact(tmp_path, marker)
    w.write_bytes(b"weights")
    os.utime(w, ns=(1, 1))  # the recorded bytes at another time: hashed, intact, and that time recorded
    assert weights_intact(tmp_path, marker)
    touched = json.loads((tmp_path / ".complete.json").read_text())
    assert touched == dict(marker, **{"model.safetensors.stat": _stat(w)}) != marker
    assert weights_intact(tmp_path, dict(touched, **{"model.safetensors": "0" * 64}))  # not hashed again
    w.unlink()
    assert not weights_intact(tmp_path, marker)
