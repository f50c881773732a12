"""Atomic writes (whole file or none, a plain open's mode) and JSON writing."""

from __future__ import annotations

import json
import os

import pytest

from pretrain_exp.core.io import atomic_path, atomic_write, write_json, write_text


def test_atomic_write_gives_the_mode_of_a_plain_open(tmp_path):
    write_text(tmp_path / "a.txt", "hello\n")
    with open(tmp_path / "b.txt", "w") as f:
        f.write("hello\n")
    assert (tmp_path / "a.txt").read_text() == "hello\n"
    assert (tmp_path / "a.txt").stat().st_mode == (tmp_path / "b.txt").stat().st_mode
    old = os.umask(0o077)
    try:
        write_text(tmp_path / "c.txt", "x")
        assert (tmp_path / "c.txt").stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(old)


def test_a_failed_write_leaves_the_old_file_and_no_temp_file(tmp_path):
    target = tmp_path / "results.json"
    target.write_text("old")

    def half(f):
        f.write("new, half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write(target, half)
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["results.json"]
    with pytest.raises(RuntimeError, match="plot failed"):
        with atomic_path(tmp_path / "plot.png") as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("plot failed")
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_binary_write_and_nested_folders(tmp_path):
    atomic_write(tmp_path / "d" / "e" / "x.bin", lambda f: f.write(b"\x00\x01"), binary=True)
    assert (tmp_path / "d" / "e" / "x.bin").read_bytes() == b"\x00\x01"


def test_write_json_writes_nan_as_null(tmp_path):
    write_json(tmp_path / "r.json", {"loss": float("nan"), "rows": [1.5, float("nan")], "n": 3})
    assert json.loads((tmp_path / "r.json").read_text()) == {"loss": None, "rows": [1.5, None], "n": 3}
