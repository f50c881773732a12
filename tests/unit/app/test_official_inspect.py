"""``pretrain-exp-inspect`` on an official run: only its config, the rows asked for, and OLMo's own order.

The config is written by OLMo-core's own config classes (``NumpyFSLDatasetConfig`` / ``NumpyDataLoaderConfig``
``as_config_dict()``, what its ``ConfigSaverCallback`` saves as ``config.json``); the ground truth is OLMo-core's
own data loader over the same files (its global-indices file and batches, on one and on two data-parallel ranks).
Every token encodes where it lives (``value = file * STRIDE + offset``), so a row read from the wrong place cannot
match by accident. Remote reads go to a range server on 127.0.0.1 that records every request.
"""

from __future__ import annotations

import json

import numpy as np
import olmo_core.data as olmo_data
import pytest
from olmo_core.data import data_loader as olmo_loader

from pretrain_exp.app.inspect import main
from pretrain_exp.app.official import BatchView, read_order, resolve_config
from pretrain_exp.data.assets import tokenizer_dir
from pretrain_exp.data.token_files import write_token_file
from tests.conftest import CACHE_DIR
from tests.remote_server import OLMO_DATA, RangeServer

L, B, SEED, CHUNK = 32, 8, 4242, 2
SIZES = (1607, 2991, 2150)
STRIDE = 30_000  #: token value = file * STRIDE + offset (below the dolma2 vocabulary)
TEXT = "The quick brown fox jumps over the lazy dog"
TEXT_AT = (1, 1000)  #: (file, token offset) where the encoded TEXT is written


def dolma2():
    return str(tokenizer_dir("dolma2", CACHE_DIR))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """``{"root", "paths", "rels", "config", "text_ids"}``: three uint32 token files under
    ``preprocessed/`` and an OLMo-core checkpoint dir ``ckpt/step3/`` (its ``config.json`` naming the files by
    their official URLs, and a model shard that must never be fetched)."""
    from tokenizers import Tokenizer

    root = tmp_path_factory.mktemp("official")
    text_ids = Tokenizer.from_file(dolma2() + "/tokenizer.json").encode(" " + TEXT, add_special_tokens=False).ids
    rels, paths = [], []
    for f, n in enumerate(SIZES):
        values = f * STRIDE + np.arange(n, dtype=np.int64)
        if f == TEXT_AT[0]:
            a = TEXT_AT[1]
            values[a:a + len(text_ids)] = text_ids
        rels.append(f"preprocessed/src/part-{f}-00000.npy")
        paths.append(root / rels[-1])
        write_token_file(paths[-1], [values[:-1].tolist()], np.uint32, int(values[-1]))
    ckpt = root / "ckpt" / "step3"
    (ckpt / "model_and_optim").mkdir(parents=True)
    (ckpt / "model_and_optim" / "__0_0.distcp").write_bytes(b"\0" * 100_000)
    write_config(ckpt, [OLMO_DATA + r for r in rels], root / "work")
    write_config(root / "local", paths, root / "work")
    return {"root": root, "paths": paths, "rels": rels, "config": root / "local" / "config.json",
            "ckpt": ckpt, "text_ids": text_ids}


def olmo_configs(paths, work_dir):
    dataset = olmo_data.NumpyFSLDatasetConfig(
        paths=[str(p) for p in paths], sequence_length=L, max_target_sequence_length=CHUNK * L,
        dtype=olmo_data.NumpyDatasetDType.uint32, tokenizer=olmo_data.TokenizerConfig.dolma2(), work_dir=str(work_dir))
    loader = olmo_data.NumpyDataLoaderConfig(global_batch_size=B * L, seed=SEED, num_workers=0, work_dir=str(work_dir))
    return dataset, loader


def write_config(ckpt, paths, work_dir) -> None:
    """``config.json`` as OLMo-core's ``ConfigSaverCallback`` writes it (the ``dataset`` and ``data_loader``
    sections of ``ExperimentConfig.as_config_dict()``)."""
    dataset, loader = olmo_configs(paths, work_dir)
    ckpt.mkdir(parents=True, exist_ok=True)
    (ckpt / "config.json").write_text(json.dumps({"dataset": dataset.as_config_dict(),
                                                  "data_loader": loader.as_config_dict()}, indent=1))


def olmo_core_batches(paths, work_dir, world: int, rank: int, steps: int):
    """OLMo-core's own batches of DP rank ``rank`` of ``world`` for steps ``1..steps``: ``[(index, input_ids)]``."""
    dataset_config, _ = olmo_configs(paths, work_dir)
    dataset = dataset_config.build()
    dataset.prepare()
    loader = olmo_loader.NumpyDataLoaderBase.wrap_numpy_dataset(
        dataset, global_batch_size=B * L, collator=olmo_data.DataCollator(pad_token_id=100277, vocab_size=100278),
        work_dir=str(work_dir), seed=SEED, dp_world_size=world, dp_rank=rank, fs_local_rank=rank)
    assert loader.chunk_size == CHUNK
    loader.reshuffle(epoch=1)
    out = []
    for k, batch in enumerate(loader, start=1):
        out.append((batch["index"].tolist(), batch["input_ids"].numpy()))
        if k == steps:
            return out
    return out


@pytest.mark.parametrize("world", [1, 2])
def test_every_step_is_the_batches_olmo_core_trains(run, tmp_path, world):
    """Steps 1..6 of the viewer, split by ``--world-size``, are OLMo-core's own batches of each rank: the same
    instance ids and tokens (its loader with chunk 2 over the same files)."""
    view = BatchView(read_order(run["config"]), tmp_path / "cache", world_size=world, tokenizer=dolma2())
    assert (view.L, view.B, view.order.chunk, view.order.seed) == (L, B, CHUNK, SEED)
    for rank in range(world):
        truth = olmo_core_batches(run["paths"], tmp_path / "work", world, rank, steps=6)  # rank 0 writes the file
        for k, (index, input_ids) in enumerate(truth, start=1):
            tokens, info = view.fetch(view.rows_of_steps(k, k))
            mine = info["rank"] == rank
            assert info["instance"][mine].tolist() == index, f"step {k} rank {rank}"
            np.testing.assert_array_equal(tokens[mine], input_ids)
            f, off = info["file"][mine], info["file_offset"][mine]
            for i in range(len(index)):  # the coded tokens say where each row was read
                if f[i] != TEXT_AT[0] or not off[i] <= TEXT_AT[1] < off[i] + L:
                    assert tokens[mine][i, 0] == f[i] * STRIDE + off[i]


def test_remote_checkpoint_url_reads_its_config_and_only_the_rows(run, tmp_path, capsys):
    """A checkpoint URL: its ``config.json`` and the step's rows (one range request each, ``L`` tokens) are all
    that is fetched; never a model shard or a whole token file. A second query sends only the row requests (the
    size index and the permutation are cached) and answers the same; ``--out`` writes JSONL and Parquet."""
    import pyarrow.parquet as pq

    cache = tmp_path / "cache"
    with RangeServer(run["root"]) as srv:
        args = [f"{srv.base}/ckpt/step3", "step=5", "--prefix", f"{OLMO_DATA}={srv.base}/", "--cache-dir",
                str(cache), "--tokenizer", dolma2(), "--world-size", "2"]
        assert main([*args, "--out", str(tmp_path / "a.jsonl")]) == 0
        first = list(srv.requests)
        srv.reset_counts()
        assert main([*args, "--out", str(tmp_path / "b.parquet")]) == 0
        second, served = list(srv.requests), srv.bytes_served
    err = capsys.readouterr().err
    assert f"8 rows: {8 * L * 4:,} bytes of tokens fetched in 8 range request(s)" in err
    assert [r for r in first if "distcp" in r[1] or "model" in r[1]] == []
    assert [m for m, p, _ in first if p.endswith("config.json")] == ["GET"]
    assert sorted(m for m, p, _ in first if p.endswith(".npy")) == ["GET"] * 8 + ["HEAD"] * 3
    assert [m for m, _, _ in second] == ["GET"] * 8 and served == 8 * L * 4
    for _, _, rng in second:
        a, b = map(int, rng.removeprefix("bytes=").split("-"))
        assert b - a + 1 == L * 4 and a % (L * 4) == 0
    rows = [json.loads(x) for x in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert rows == pq.read_table(tmp_path / "b.parquet").to_pylist()
    local = BatchView(read_order(run["config"]), cache, world_size=2, tokenizer=dolma2())
    want = list(local.records(local.rows_of_steps(5, 5)))
    assert [{k: v for k, v in r.items() if k != "path"} for r in rows] == \
        [{k: v for k, v in r.items() if k != "path"} for r in want]
    assert [r["path"] for r in rows] == [f"{srv.base}/{run['rels'][r['file']]}" for r in rows]
    assert [r["step"] for r in rows] == [5] * 8 and [r["rank"] for r in rows] == [0, 1] * 4


def test_one_row_printed_and_search_over_a_range(run, tmp_path, capsys):
    """``step=K row=R`` prints that row's text and ids; ``search=TEXT step=A-B`` finds the text where the files
    hold it (and ids where they occur), at the step, row and offset of the order."""
    cache, tok = tmp_path / "cache", dolma2()
    view = BatchView(read_order(run["config"]), cache, tokenizer=tok)
    tokens, info = view.fetch(view.rows_of_steps(3, 3, row=5))
    assert main([str(run["config"]), "step=3", "row=5", "--cache-dir", str(cache), "--tokenizer", tok]) == 0
    out = capsys.readouterr().out
    assert f"--- step 3, row 5 (training-order row {2 * B + 5}, instance {info['instance'][0]}" in out
    assert "token ids: " + " ".join(map(str, tokens[0].tolist())) in out
    assert view.decode(tokens)[0] in out

    steps = view.num_steps
    q = view.rows_of_steps(1, steps)
    inst = view.order.instances(0, q.size)
    f, off = view.order.instance_locations(inst)
    n = len(run["text_ids"])
    where = [(int(x), TEXT_AT[1] - int(o)) for x, fi, o in zip(q, f, off)
             if fi == TEXT_AT[0] and o <= TEXT_AT[1] and TEXT_AT[1] + n <= o + L]
    assert len(where) == 1  # the text lies inside one instance, trained in the first epoch
    hits = view.search(TEXT, q)
    assert [(h["q"], h["offset"]) for h in hits] == where
    assert TEXT in hits[0]["context"]
    ids = ",".join(map(str, tokens[0, 10:13].tolist()))
    assert [(h["step"], h["row"], h["offset"]) for h in view.search(ids, q)] == [(3, 5, 10)]
    assert main([str(run["config"]), f"search={TEXT}", f"step=1-{steps}", "--cache-dir", str(cache),
                 "--tokenizer", tok]) == 0
    out = capsys.readouterr().out
    assert "1 occurrence(s)" in out and f"step {where[0][0] // B + 1} row {where[0][0] % B} offset {where[0][1]}" in out


def test_olmo2_config_yaml_is_olmo2s_order(run, tmp_path):
    """An OLMo-2 ``config.yaml`` (old trainer): epoch 0 shuffles ``arange(N)`` with ``PCG64(seed)`` and step ``k``
    trains entries ``[(k-1) B, k B)`` (allenai/OLMo ``IterableDataset``), ``L``-token instances file by file."""
    from tests.unit.frameworks.olmo2 import olmo2_checkpoint as fx

    ckpt = tmp_path / "step37-unsharded"
    ckpt.mkdir()
    import yaml

    config = fx.olmo2_config(run["paths"])
    config["data"]["memmap_dtype"] = "uint32"
    (ckpt / "config.yaml").write_text(yaml.safe_dump(config))
    spec = read_order(resolve_config(str(ckpt), tmp_path / "cache"))
    assert (spec.layout, spec.sequence_length, spec.global_batch_size) == ("olmo2", fx.SEQ_LEN, fx.BATCH)
    view = BatchView(spec, tmp_path / "cache", tokenizer=dolma2())
    starts = np.concatenate([[0], np.cumsum(np.asarray(SIZES) // fx.SEQ_LEN)])
    perm = np.arange(starts[-1], dtype=np.uint32)
    np.random.Generator(np.random.PCG64(fx.SEED)).shuffle(perm)
    for k in (1, 2, 40):
        tokens, info = view.fetch(view.rows_of_steps(k, k))
        assert info["instance"].tolist() == perm[(k - 1) * fx.BATCH:k * fx.BATCH].tolist()
        for inst, row in zip(info["instance"], tokens):
            fi = int(np.searchsorted(starts, inst, side="right") - 1)
            expect = np.fromfile(run["paths"][fi], dtype=np.uint32)[(inst - starts[fi]) * fx.SEQ_LEN:][:fx.SEQ_LEN]
            np.testing.assert_array_equal(row, expect)


@pytest.mark.parametrize("argv, needle", [
    (["{config}", "step=0"], "error: step: step range 0-0"),
    (["{config}", "step=9999"], "error: step: step 9999 is past the first epoch"),
    (["{config}", "search=fox"], "error: step: give step=N"),
    (["{config}", "step=2-3", "row=1"], "error: row: row='1': an integer, with a single step"),
    (["{config}", "item=3"], "error: item: an official run has no insertion plan"),
    (["{config}", "step=1", "--out", "x.csv"], "error: --out: x.csv: write .jsonl or .parquet"),
    (["{config}", "step=1", "--prefix", "nonsense"], "error: --prefix: 'nonsense': give OLD=NEW"),
    (["/nonexistent/dir", "step=1"], "error: source: '/nonexistent/dir': not a run dir, a model preset"),
    (["{ckpt_json}", "step=1"], "error: data_loader.global_batch_size"),
    (["{vsl_json}", "step=1"], "error: dataset._CLASS_"),
])
def test_bad_queries_and_sources_name_the_key(run, tmp_path, capsys, argv, needle):
    bad = tmp_path / "bad"
    bad.mkdir()
    raw = json.loads(run["config"].read_text())
    raw["data_loader"]["global_batch_size"] = B * L + 1
    (bad / "config.json").write_text(json.dumps(raw))
    raw = json.loads(run["config"].read_text())
    raw["dataset"]["_CLASS_"] = "olmo_core.data.numpy_dataset.NumpyVSLDatasetConfig"
    (bad / "vsl.json").write_text(json.dumps(raw))
    argv = [a.format(config=run["config"], ckpt_json=bad / "config.json", vsl_json=bad / "vsl.json") for a in argv]
    assert main([*argv, "--cache-dir", str(tmp_path / "cache"), "--tokenizer", dolma2()]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(needle) and len(err.splitlines()) == 1, err


def test_a_preset_names_its_official_checkpoint_config(run, tmp_path):
    """``olmo2_1b`` (``conf/model/olmo2_1b.yaml``) is ``<url>/step100000-unsharded/config.yaml`` in
    ``<cache>/models/olmo2_1b/`` (fetched once: a config already there is read without a request) and
    ``--checkpoint-step`` picks another checkpoint's; ``olmo3_7b_stage2`` is an OLMo-core ``config.json``."""
    import yaml

    from tests.unit.frameworks.olmo2 import olmo2_checkpoint as fx

    cache = tmp_path / "cache"
    for name, step, rel, text in (
            ("olmo2_1b", 100000, "step100000-unsharded/config.yaml", yaml.safe_dump(fx.olmo2_config(run["paths"]))),
            ("olmo2_1b", 5000, "step5000-unsharded/config.yaml", yaml.safe_dump(fx.olmo2_config(run["paths"]))),
            ("olmo3_7b_stage2", 10000, "step10000/config.json", run["config"].read_text())):
        (cache / "models" / name / rel).parent.mkdir(parents=True, exist_ok=True)
        (cache / "models" / name / rel).write_text(text)
        path = resolve_config(name, cache, None if step in (100000, 10000) else step)
        assert path == cache / "models" / name / rel
        spec = read_order(path)
        assert spec.layout == ("olmo2" if name.startswith("olmo2") else "olmo_core")
        assert spec.paths == [str(p) for p in run["paths"]]


def test_records_decoded_in_chunks_are_each_rows_own_text(run, tmp_path, monkeypatch):
    """Rows written as JSONL carry their own text (``Tokenizer.decode`` of their own ids) when the texts are decoded
    a few rows at a time in a thread beside the writing, across chunk and block edges."""
    from tokenizers import Tokenizer

    import pretrain_exp.app.official as official

    monkeypatch.setattr(official, "DECODE_ROWS", 3)
    monkeypatch.setattr(official, "RECORD_ROWS", 7)
    out = tmp_path / "rows.jsonl"
    assert main([str(run["config"]), "step=1-3", "--cache-dir", str(tmp_path / "cache"), "--tokenizer", dolma2(),
                 "--out", str(out)]) == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    tok = Tokenizer.from_file(dolma2() + "/tokenizer.json")
    assert [r["q"] for r in recs] == list(range(3 * B))
    for r in recs:
        assert r["text"] == tok.decode(r["token_ids"], skip_special_tokens=False)


def test_jsonl_is_json_dumps_byte_for_byte(tmp_path):
    """``--out FILE.jsonl`` writes exactly ``json.dumps(record, ensure_ascii=False)`` per line (texts of random ids,
    so invalid UTF-8, control characters and special tokens; every escape ``json`` writes; ids as lists and as
    ``numpy`` rows), on rows of OLMo's length (4,096 ids). Its speed is ``benchmarks/batch_view.py``'s."""
    from tokenizers import Tokenizer

    from pretrain_exp.app.official import write_records

    tok = Tokenizer.from_file(dolma2() + "/tokenizer.json")
    ids = np.random.default_rng(0).integers(0, tok.get_vocab_size(with_added_tokens=True), (64, 4096))
    texts = tok.decode_batch(ids.tolist(), skip_special_tokens=False)
    texts[0] += "".join(map(chr, range(0x80))) + "\u2028\u2029\ufeff\U0001f600"
    recs = [{"step": 1, "row": i, "q": i, "instance": 7 * i, "file": 0, "file_offset": 4096 * i, "rank": i % 2,
             "path": "/data/part-0.npy", "token_ids": row.tolist(), "text": t} for i, (row, t) in
            enumerate(zip(ids, texts))]
    want = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs).encode()
    out = tmp_path / "rows.jsonl"
    assert write_records(recs, out) == 64 and out.read_bytes() == want
    assert write_records([{**r, "token_ids": ids[i]} for i, r in enumerate(recs)], out) == 64
    assert out.read_bytes() == want


def test_a_local_query_imports_no_http_client_and_no_torch(run, tmp_path):
    """A query of a local config loads neither the download code (``http``, ``ssl``) nor torch: the command's
    start is the interpreter, numpy, the order and the tokenizer."""
    import subprocess
    import sys

    code = ("import sys; from pretrain_exp.app.inspect import main; "
            f"rc = main([{str(run['config'])!r}, 'step=1', 'row=0', '--cache-dir', {str(tmp_path / 'cache')!r}, "
            f"'--tokenizer', {dolma2()!r}]); "
            "print(sorted(m for m in ('ssl', 'http.client', 'torch', 'transformers', 'hydra', 'datasets') "
            "if m in sys.modules)); sys.exit(rc)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "[]"


def test_the_decoder_without_merges_decodes_as_the_whole_tokenizer(run, tmp_path):
    """The decode-only tokenizer (the BPE merges left out, written once into the cache) gives the whole tokenizer's
    text for every id of the vocabulary, alone and in random sequences (bytes split across tokens included)."""
    view = BatchView(read_order(run["config"]), tmp_path / "cache", tokenizer=dolma2(), preload=True)
    full = view.tokenizer
    n = full.get_vocab_size(with_added_tokens=True)
    singles = [[i] for i in range(n)]
    assert view.decoder.decode_batch(singles, skip_special_tokens=False) == full.decode_batch(
        singles, skip_special_tokens=False)
    rows = np.random.default_rng(0).integers(0, n, (64, 200)).tolist()
    assert view.decode(np.asarray(rows)) == full.decode_batch(rows, skip_special_tokens=False)
    written = list((tmp_path / "cache" / "tokenizers" / "decode-only").iterdir())
    assert len(written) == 1 and json.loads(written[0].read_text())["model"]["merges"] == []
