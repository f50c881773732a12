"""``datasets`` corpora (``data=hf_dataset``): local Parquet and Arrow files (written by pyarrow and by
``datasets`` itself) tokenized through ``load_dataset`` + batched ``map`` into OLMo token files, the same tokens as
the small-corpus path, cached by dataset fingerprint + tokenizer + EOS policy, and clear errors."""

from __future__ import annotations

import csv
import gzip
import json

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pretrain_exp.app.experiment import Experiment
from pretrain_exp.core.errors import ConfigError, DataError
from pretrain_exp.data import hf_dataset
from pretrain_exp.data.assets import iter_texts
from pretrain_exp.data.hf_dataset import tokenize_dataset
from pretrain_exp.data.tokenize import load_tokenizer, tokenize_source
from tests.conftest import CACHE_DIR, make_config

#: documents of the real corpus: 60 Shakespeare passages of 2,000 characters (plus an empty and a non-ASCII one)
DOCS = [t[i:i + 2000] for _, t in list(iter_texts("shakespeare", CACHE_DIR))[:3] for i in range(0, 40000, 2000)]
DOCS += ["", "non-ASCII \u2014 \u00fcn\u00efc\u00f6d\u00e9 \U0001F3AD"]


@pytest.fixture(autouse=True)
def _datasets_cache(tmp_path, monkeypatch):
    """``load_dataset``'s Arrow cache in the test's tmp dir, not the user's HF cache."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_datasets")


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return load_tokenizer(str(tiny_model_dir), CACHE_DIR)


@pytest.fixture
def files(tmp_path):
    """The corpus as a Parquet file (pyarrow), an Arrow file and a ``save_to_disk`` folder (datasets' writers) with
    an extra ``id`` column, and a ``.jsonl`` file."""
    pq.write_table(pa.table({"id": list(range(len(DOCS))), "text": DOCS}), tmp_path / "docs.parquet")
    ds = datasets.Dataset.from_dict({"id": list(range(len(DOCS))), "body": DOCS})
    ds.save_to_disk(str(tmp_path / "saved"))
    arrow = sorted((tmp_path / "saved").glob("*.arrow"))
    assert len(arrow) == 1
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    return {"parquet": tmp_path / "docs.parquet", "arrow": arrow[0], "saved": tmp_path / "saved",
            "jsonl": tmp_path / "docs.jsonl"}


def _read(paths, dtype=np.uint16):
    return np.concatenate([np.fromfile(p, dtype=dtype) for p in paths])


def test_parquet_and_arrow_give_the_documents_tokens_joined_by_eos(tmp_path, files, tok):
    want = np.concatenate([tok(d, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for d in DOCS])
    parquet = tokenize_dataset(str(files["parquet"]), tok, tmp_path / "tokens", progress=False)
    np.testing.assert_array_equal(_read(parquet), want)
    meta = json.loads((parquet[0].parent / "tokens.json").read_text())
    assert meta["num_documents"] == len(DOCS) and meta["num_tokens"] == want.size and meta["dtype"] == "uint16"
    assert meta["eos_policy"] == "eos-after-each-document" and meta["split"] == "train"
    with gzip.open(str(parquet[0]) + ".csv.gz", "rt") as f:
        spans = [(int(a), int(b)) for a, b in csv.reader(f)]
    assert len(spans) == len(DOCS) and spans[0][0] == 0 and spans[-1][1] == want.size
    assert all(want[b - 1] == tok.eos_token_id for _, b in spans)
    for key in ("arrow", "saved"):  # datasets' own Arrow file, and its save_to_disk folder; text column "body"
        got = tokenize_dataset(str(files[key]), tok, tmp_path / "tokens", text_key="body", progress=False)
        np.testing.assert_array_equal(_read(got), want)
    # the small-corpus path writes the very same token files for the same documents
    small = tokenize_source(str(files["jsonl"]), tok, tmp_path / "small", CACHE_DIR, progress=False)
    assert parquet[0].read_bytes() == small[0].read_bytes()


@pytest.mark.slow
def test_two_processes_write_the_same_tokens(tmp_path, files, tok):
    one = tokenize_dataset(str(files["parquet"]), tok, tmp_path / "a", progress=False)
    two = tokenize_dataset(str(files["parquet"]), tok, tmp_path / "b", num_proc=2, progress=False)
    assert one[0].name == two[0].name and one[0].read_bytes() == two[0].read_bytes()


def test_cached_by_fingerprint_tokenizer_and_eos(tmp_path, files, tok, monkeypatch):
    first = tokenize_dataset(str(files["parquet"]), tok, tmp_path / "t", progress=False)
    calls = []
    monkeypatch.setattr(hf_dataset, "write_token_files", lambda *a: calls.append(a))  # a cache hit writes nothing
    assert tokenize_dataset(str(files["parquet"]), tok, tmp_path / "t", progress=False) == first and not calls
    monkeypatch.undo()
    pq.write_table(pa.table({"text": DOCS[:-1]}), files["parquet"])  # changed data: a new fingerprint, new files
    changed = tokenize_dataset(str(files["parquet"]), tok, tmp_path / "t", progress=False)
    assert changed[0].parent != first[0].parent and first[0].is_file()
    other_eos = load_tokenizer(str(tok.name_or_path), CACHE_DIR)
    other_eos.eos_token = other_eos.convert_ids_to_tokens(0)
    assert tokenize_dataset(str(files["parquet"]), other_eos, tmp_path / "t", progress=False)[0].parent not in (
        first[0].parent, changed[0].parent)
    assert not [p for p in (tmp_path / "t").iterdir() if p.name.startswith(".")]  # no half-written folder left


def test_bad_datasets_are_one_clear_error(tmp_path, files, tok):
    with pytest.raises(DataError, match=r"^data\.text_key=content: not a column of .*docs\.parquet \(columns: "
                                        r"\['id', 'text'\]\)"):
        tokenize_dataset(str(files["parquet"]), tok, tmp_path / "t", text_key="content", progress=False)
    with pytest.raises(DataError, match=r"^data\.text_key=id: column of .* holds .*int64.*, not text"):
        tokenize_dataset(str(files["parquet"]), tok, tmp_path / "t", text_key="id", progress=False)
    with pytest.raises(DataError, match=r"^data\.dataset=/nonexistent/x\.parquet: no such file or folder"):
        tokenize_dataset("/nonexistent/x.parquet", tok, tmp_path / "t", progress=False)
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": DOCS})}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(DataError, match=r"^data\.split=test: not a split of .*dd \(splits: \['train'\]\)"):
        tokenize_dataset(str(tmp_path / "dd"), tok, tmp_path / "t", split="test", progress=False)
    with pytest.raises(ConfigError, match=r"^data\.num_proc: must be >= 1"):
        tokenize_dataset(str(files["parquet"]), tok, tmp_path / "t", num_proc=0, progress=False)
    assert not (tmp_path / "t").exists() or not list((tmp_path / "t").iterdir())


@pytest.mark.slow
def test_a_run_reads_its_corpus_from_a_parquet_file(tmp_path, files, tiny_model_dir):
    cfg = make_config("experiment=tiny", "wandb=disabled", "data=hf_dataset", f"data.dataset={files['parquet']}",
                      f"data.token_dir={tmp_path / 'tokens'}", "training.num_steps=2", "data.held_out_rows=2",
                      "insertion.experiments.fictional_bios.repetitions=[0,1]", run_dir=tmp_path / "run")
    assert (cfg.data.dataset, cfg.data.split, cfg.data.text_key, cfg.data.num_proc) == (
        str(files["parquet"]), "train", "text", 1)
    exp = Experiment(cfg)
    assert [p.parent.parent for p in exp.order.files.paths] == [tmp_path / "tokens"]
    with pytest.raises(ConfigError, match=r"^data\.dataset: set either data\.dataset or data\.paths"):
        make_config("experiment=tiny", "data=hf_dataset", f"data.dataset={files['parquet']}", "data.text=x",
                    run_dir=tmp_path / "r2")
