"""Tests of the token files and the data order (global token position <-> step/row/offset/instance/file).

Token files are written with ``write_token_file`` as ONE document each whose EOS is the last token, so every
token's value encodes where it lives: ``value = file * 100000 + offset``. Expectations are computed by hand or
by an independent re-implementation of OLMo's rule, never by calling the code under test.
"""

from __future__ import annotations

import csv
import gzip
import logging
import os
import pickle

import numpy as np
import pytest
import torch

from pretrain_exp.core.errors import DataError
from pretrain_exp.data.order import (
    DataOrder,
    cached_permutation,
    permutation_path,
    step_row_offset,
    step_window,
)
from pretrain_exp.data.rows import TrainingRows
from pretrain_exp.data.token_files import TokenFiles, dtype_for_vocab, write_token_file

L = 32
SIZES = (1607, 991, 100)  # -> 50, 30 and 3 instances of 32 tokens (tails 7, 31, 4 dropped)
U32 = np.dtype(np.uint32)


def value(f: int, off) -> np.ndarray:
    return f * 100000 + np.asarray(off, dtype=np.int64)


def write_coded(path, f: int, n: int, dtype=U32) -> None:
    """A token file of ``n`` tokens whose token at offset ``o`` is ``value(f, o)`` (EOS = the last token)."""
    assert write_token_file(path, [value(f, np.arange(n - 1)).tolist()], dtype, int(value(f, n - 1))) == n


@pytest.fixture
def files(tmp_path) -> TokenFiles:
    paths = []
    for f, n in enumerate(SIZES):
        paths.append(tmp_path / f"part-{f}.npy")
        write_coded(paths[-1], f, n)
    return TokenFiles(paths, U32)


def reference_perm(seed: int, epoch: int, n: int) -> np.ndarray:
    perm = np.arange(n, dtype=np.uint32)
    np.random.Generator(np.random.PCG64(seed + epoch)).shuffle(perm)
    return perm


def reference_instances(sizes, seq_len: int) -> list:
    """``(file, offset)`` of every instance, by plain loops."""
    out = []
    for f, n in enumerate(sizes):
        for k in range(n // seq_len):
            out.append((f, k * seq_len))
    return out


# --- token files ----------------------------------------------------------------------------------------

def test_token_files_sizes_and_reads(files):
    assert files.num_tokens.tolist() == list(SIZES)
    np.testing.assert_array_equal(files.read(0, 0, 5), value(0, range(5)))
    np.testing.assert_array_equal(files.read(1, 960, 31), value(1, range(960, 991)))
    np.testing.assert_array_equal(files.read(2, 99, 1), [value(2, 99)])
    assert files.read(0, 3, 4).dtype == np.int64
    with pytest.raises(DataError, match="read past the end"):
        files.read(2, 90, 11)


def test_write_token_file_offsets_csv(tmp_path):
    docs = [[5, 6, 7], [], [1, 2, 3, 4, 5]]
    path = tmp_path / "sub" / "docs.npy"
    n = write_token_file(path, docs, np.dtype(np.uint32), eos_id=9)
    assert n == 3 + 1 + 0 + 1 + 5 + 1
    raw = np.fromfile(path, dtype="<u4")
    np.testing.assert_array_equal(raw, [5, 6, 7, 9, 9, 1, 2, 3, 4, 5, 9])
    with gzip.open(str(path) + ".csv.gz", "rt", newline="") as g:
        rows = [tuple(map(int, r)) for r in csv.reader(g)]
    assert rows == [(0, 4), (4, 5), (5, 11)]
    for (s, e), doc in zip(rows, docs):
        assert raw[s:e].tolist() == doc + [9]
    assert sorted(p.name for p in path.parent.iterdir()) == ["docs.npy", "docs.npy.csv.gz"]  # no temp files


def test_write_token_file_accepts_scalar_type(tmp_path):
    """``np.uint16`` (a scalar type, not a dtype instance) is what callers naturally pass."""
    path = tmp_path / "t.npy"
    assert write_token_file(path, [[1, 2]], np.uint16, 0) == 3
    np.testing.assert_array_equal(np.fromfile(path, dtype="<u2"), [1, 2, 0])


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0


def test_write_token_file_out_of_range_leaves_nothing(tmp_path):
    """No file, no temp file and no open file descriptor survives a failed write."""
    path = tmp_path / "bad.npy"
    fds = open_fds()
    with pytest.raises(DataError, match="out of range"):
        write_token_file(path, [[1, 2], [70000]], np.dtype(np.uint16), 0)
    with pytest.raises(DataError, match="out of range"):
        write_token_file(path, [[-1]], np.dtype(np.uint32), 0)
    assert list(tmp_path.iterdir()) == []
    assert open_fds() == fds


def test_uint16_little_endian(tmp_path):
    path = tmp_path / "u16.npy"
    toks = [0x1234, 0xABCD, 65535, 0, 258]
    write_token_file(path, [toks], np.dtype(np.uint16), eos_id=7)
    data = path.read_bytes()
    assert data[:4] == bytes([0x34, 0x12, 0xCD, 0xAB])  # little-endian on any host
    assert len(data) == 2 * 6
    tf = TokenFiles([path], np.uint16)
    assert tf.num_tokens.tolist() == [6]
    np.testing.assert_array_equal(tf.read(0, 0, 6), toks + [7])


def test_uint16_data_order(tmp_path):
    """A uint16 corpus: 10 instances of L=8, B=3 -> 9 rows per epoch; rows read the right slices."""
    path = tmp_path / "c.npy"
    toks = (np.arange(85) * 771 % 65536).tolist()  # 85 tokens incl. EOS: 10 instances, tail of 5
    write_token_file(path, [toks[:-1]], np.dtype(np.uint16), toks[-1])
    order = DataOrder(TokenFiles([path], np.dtype(np.uint16)), 8, 3, seed=11)
    assert order.num_instances == 10 and order.rows_per_epoch == 9
    for q in range(20):
        epoch = 1 + q // 9
        inst = int(reference_perm(11, epoch, 10)[q % 9])
        np.testing.assert_array_equal(order.row_tokens(q), toks[inst * 8:inst * 8 + 8])


def test_dtype_for_vocab():
    assert dtype_for_vocab(50_000) == np.uint16
    assert dtype_for_vocab(65_536) == np.uint16
    assert dtype_for_vocab(65_537) == np.uint32
    assert dtype_for_vocab(100_278) == np.uint32
    with pytest.raises(DataError):
        dtype_for_vocab(2**32 + 1)


def test_bad_files(tmp_path):
    odd = tmp_path / "odd.npy"
    odd.write_bytes(b"\x00" * 7)
    with pytest.raises(DataError, match="not a multiple"):
        TokenFiles([odd], np.uint16)
    six = tmp_path / "six.npy"
    six.write_bytes(b"\x00" * 6)
    TokenFiles([six], np.uint16)  # 3 tokens: fine
    with pytest.raises(DataError, match="not a multiple"):
        TokenFiles([six], np.uint32)
    with pytest.raises(DataError, match="not found"):
        TokenFiles([tmp_path / "missing.npy"], np.uint32)
    with pytest.raises(DataError, match="no token files"):
        TokenFiles([], np.uint32)


def test_fewer_instances_than_batch(files):
    DataOrder(files, L, 83, seed=0)  # 83 instances: exactly one batch of 83
    with pytest.raises(DataError, match="fewer than one global batch"):
        DataOrder(files, L, 84, seed=0)
    with pytest.raises(DataError, match="0 instances"):
        DataOrder(files, 2000, 1, seed=0)  # every file is shorter than L


# --- instances and order --------------------------------------------------------------------------------

def test_instances_count_file_by_file(files):
    order = DataOrder(files, L, 4, seed=0)
    assert order.instances_per_file.tolist() == [50, 30, 3]
    assert order.num_instances == 83
    expected = reference_instances(SIZES, L)
    assert len(expected) == 83
    for inst in (0, 1, 49, 50, 51, 79, 80, 82):
        assert order.instance_location(inst) == expected[inst]
    assert order.instance_location(49) == (0, 1568)
    assert order.instance_location(50) == (1, 0)
    assert order.instance_location(79) == (1, 928)
    assert order.instance_location(82) == (2, 64)


def test_file_without_instances_is_skipped(tmp_path):
    sizes = (70, 20, 40)  # 2, 0 and 1 instances of 32
    paths = []
    for f, n in enumerate(sizes):
        paths.append(tmp_path / f"{f}.npy")
        write_coded(paths[-1], f, n)
    order = DataOrder(TokenFiles(paths, U32), L, 1, seed=3)
    assert order.num_instances == 3
    assert [order.instance_location(i) for i in range(3)] == [(0, 0), (0, 32), (2, 0)]
    for q in range(3):
        f, off = reference_instances(sizes, L)[int(reference_perm(3, 1, 3)[q])]
        np.testing.assert_array_equal(order.row_tokens(q), value(f, range(off, off + L)))


@pytest.mark.parametrize("B, rows", [(1, 83), (4, 80), (7, 77), (83, 83), (41, 82)])
def test_rows_per_epoch(files, B, rows):
    assert DataOrder(files, L, B, seed=0).rows_per_epoch == rows == B * (83 // B)


@pytest.mark.parametrize("seed, epoch", [(0, 0), (0, 1), (7, 1), (7, 2), (123456, 5)])
def test_permutation_is_olmo_shuffle(files, seed, epoch):
    order = DataOrder(files, L, 4, seed=seed)
    perm = order.permutation(epoch)
    assert perm.dtype == np.uint32 and perm.shape == (83,)
    np.testing.assert_array_equal(perm, reference_perm(seed, epoch, 83))
    assert sorted(perm.tolist()) == list(range(83))


def test_permutations_differ_between_epochs(files):
    order = DataOrder(files, L, 4, seed=5)
    assert not np.array_equal(order.permutation(1), order.permutation(2))


@pytest.mark.parametrize("first_epoch", [0, 1])
def test_row_tokens_brute_force(files, first_epoch):
    B, seed = 4, 42
    order = DataOrder(files, L, B, seed=seed, first_epoch=first_epoch)
    instances = reference_instances(SIZES, L)
    for q in list(range(0, 8)) + list(range(76, 84)) + [159, 160, 161, 250]:
        epoch = first_epoch + q // 80
        inst = int(reference_perm(seed, epoch, 83)[q % 80])
        assert order.instance(q) == (epoch, inst)
        f, off = instances[inst]
        np.testing.assert_array_equal(order.row_tokens(q), value(f, range(off, off + L)))


def test_olmo2_seed_equals_olmo_core_seed_minus_one(files):
    olmo2 = DataOrder(files, L, 4, seed=10, first_epoch=0)
    core = DataOrder(files, L, 4, seed=9, first_epoch=1)
    same_seed = DataOrder(files, L, 4, seed=10, first_epoch=1)
    for q in range(0, 250, 7):
        np.testing.assert_array_equal(olmo2.row_tokens(q), core.row_tokens(q))
    assert any(not np.array_equal(olmo2.row_tokens(q), same_seed.row_tokens(q)) for q in range(10))


def test_locate(files):
    B, seed = 4, 1
    order = DataOrder(files, L, B, seed=seed)
    instances = reference_instances(SIZES, L)
    # (position, q, step, row, offset): hand-computed with L=32, B=4, 80 rows per epoch
    cases = [
        (0, 0, 1, 0, 0),
        (31, 0, 1, 0, 31),  # last token of row 0
        (32, 1, 1, 1, 0),  # first token of row 1
        (127, 3, 1, 3, 31),  # last token of step 1
        (128, 4, 2, 0, 0),  # first token of step 2
        (5 * 128 + 2 * 32 + 17, 22, 6, 2, 17),
        (80 * 32 - 1, 79, 20, 3, 31),  # last token of epoch 1
        (80 * 32, 80, 21, 0, 0),  # first token of epoch 2
        (80 * 32 + 5, 80, 21, 0, 5),
        (161 * 32 + 9, 161, 41, 1, 9),  # epoch 3
    ]
    for p, q, step, row, off in cases:
        loc = order.locate(p)
        epoch = 1 + q // 80
        inst = int(reference_perm(seed, epoch, 83)[q % 80])
        f, foff = instances[inst]
        assert (loc.position, loc.q, loc.step, loc.row, loc.offset) == (p, q, step, row, off)
        assert (loc.epoch, loc.instance, loc.file_index, loc.file_offset) == (epoch, inst, f, foff + off)
        assert order.row_tokens(q)[off] == value(f, foff + off)  # the token really comes from there
        assert all(type(v) is int for v in vars(loc).values())
    assert order.locate(80 * 32).epoch == 2 and order.locate(80 * 32 - 1).epoch == 1


def test_held_out_rows(files):
    order = DataOrder(files, L, 4, seed=0)
    np.testing.assert_array_equal(order.held_out_rows(3), [77, 78, 79])


# --- step/row/offset arithmetic ---------------------------------------------------------------------------

def test_step_row_offset_hand_computed():
    Lb, B = 4096, 512
    assert step_row_offset(5 * 512 * 4096 + 3 * 4096 + 17, Lb, B) == (6, 3, 17)
    assert step_row_offset(0, Lb, B) == (1, 0, 0)
    assert step_row_offset(B * Lb - 1, Lb, B) == (1, 511, 4095)
    assert step_row_offset(B * Lb, Lb, B) == (2, 0, 0)
    assert step_row_offset(4096, Lb, B) == (1, 1, 0)


def test_step_row_offset_vectorized_int64():
    Lb, B = 4096, 512
    big = 1_000_000 * B * Lb + 511 * Lb + 4095  # > 2**31: no int32 overflow
    p = np.array([0, 4095, 4096, 5 * B * Lb + 3 * Lb + 17, big], dtype=np.int64)
    step, row, off = step_row_offset(p, Lb, B)
    assert step.tolist() == [1, 1, 1, 6, 1_000_001]
    assert row.tolist() == [0, 0, 1, 3, 511]
    assert off.tolist() == [0, 4095, 0, 17, 4095]


def test_step_window():
    Lb, B = 4096, 512
    w0, w1 = step_window(1000, 10, Lb, B)
    assert (w0, w1) == (1000 * 2_097_152, 1010 * 2_097_152)
    assert step_row_offset(w0, Lb, B) == (1001, 0, 0)  # the first step trained after a step-1000 checkpoint
    assert step_row_offset(w1 - 1, Lb, B) == (1010, 511, 4095)
    assert step_window(0, 3, 8, 2) == (0, 48)


# --- pickling (data-loader workers) -------------------------------------------------------------------------

def test_token_files_pickle_without_memmaps(files):
    files.read(0, 0, 4)
    files.read(1, 0, 4)
    assert len(files._maps) == 2
    blob = pickle.dumps(files)
    assert len(blob) < 2000  # the 6 KB of file 0 are not in it
    clone = pickle.loads(blob)
    assert clone._maps == {}
    np.testing.assert_array_equal(clone.read(1, 960, 31), value(1, range(960, 991)))
    assert len(files._maps) == 2  # pickling did not touch the original


def test_data_order_pickles(files):
    order = DataOrder(files, L, 4, seed=2)
    want = [order.row_tokens(q) for q in (0, 85)]
    clone = pickle.loads(pickle.dumps(order))
    for q, w in zip((0, 85), want):
        np.testing.assert_array_equal(clone.row_tokens(q), w)


@pytest.mark.slow
def test_training_rows_in_spawned_worker(files):
    """A spawned DataLoader worker must pickle the dataset (memmaps and all) and read the same rows."""
    order = DataOrder(files, L, 4, seed=2)
    for f in range(3):
        files.read(f, 0, 1)  # open every memmap in the parent first
    rows = TrainingRows(order, None, first_row=78, num_rows=4)  # crosses the epoch boundary at row 80
    loader = torch.utils.data.DataLoader(rows, batch_size=2, num_workers=1, multiprocessing_context="spawn")
    got = torch.cat([b["input_ids"] for b in loader]).numpy()
    want = np.stack([order.row_tokens(q) for q in range(78, 82)])
    np.testing.assert_array_equal(got, want)


# --- the permutation cache ------------------------------------------------------------------------------------

def test_cached_permutation_is_built_once_and_memory_mapped(tmp_path, caplog):
    path = permutation_path(tmp_path, 83, 7)
    assert path == tmp_path / "permutations" / "83-7.npy"
    with caplog.at_level(logging.INFO, logger="pretrain_exp.data.order"):
        perm = cached_permutation(tmp_path, 83, 7)
    assert isinstance(perm, np.memmap) and perm.dtype == np.uint32 and perm.shape == (83,)
    assert not perm.flags.writeable
    np.testing.assert_array_equal(perm, reference_perm(7, 0, 83))
    np.testing.assert_array_equal(np.fromfile(path, dtype="<u4"), reference_perm(7, 0, 83))  # raw, no header
    assert path.stat().st_size == 4 * 83
    assert path.with_name("83-7.npy.lock").is_file()  # the lock other processes building it take turns on
    built = [r.getMessage() for r in caplog.records]
    assert len(built) == 1 and built[0].startswith("permutation of 83 instances (seed 7) built in ")
    assert built[0].endswith(f" s -> {path}")
    assert 0 <= float(built[0].split(" built in ")[1].split(" s ")[0]) < 60

    other = np.arange(83, dtype="<u4")[::-1].copy()
    other.tofile(path)  # a cached file of the right size is read as it is, never rebuilt
    caplog.clear()
    np.testing.assert_array_equal(cached_permutation(tmp_path, 83, 7), other)
    assert not caplog.records
    other[:82].tofile(path)  # a file of the wrong size is rebuilt
    np.testing.assert_array_equal(cached_permutation(tmp_path, 83, 7), reference_perm(7, 0, 83))
    assert path.stat().st_size == 4 * 83


def test_a_permutation_cache_that_cannot_be_written_names_the_file(tmp_path):
    path = permutation_path(tmp_path, 83, 7)
    path.mkdir(parents=True)  # a directory where the file goes: the rename onto it fails
    with pytest.raises(DataError) as e:
        cached_permutation(tmp_path, 83, 7)
    assert str(e.value).startswith(f"{path}: cannot write the permutation cache (")


def test_the_data_order_reads_its_permutations_from_the_cache(files, tmp_path):
    cached = DataOrder(files, L, 4, seed=3, cache_dir=tmp_path)
    plain = DataOrder(files, L, 4, seed=3)

    def built():
        return sorted(p.name for p in (tmp_path / "permutations").glob("*.npy"))

    assert plain.prepare(0, 200) is False  # no cache: built in memory
    assert cached.prepare(79, 0) is False and built() == ["83-4.npy"]  # no rows: the epoch of first_row (1)
    assert cached.prepare(0, 80) is True and built() == ["83-4.npy"]  # rows 0..79: all of epoch 1
    assert cached.prepare(70, 20) is False  # rows 70..89: epochs 1 and 2 of 80 rows, 2 built now
    assert built() == ["83-4.npy", "83-5.npy"]
    assert cached.prepare(70, 20) is True and cached.prepare(0, 1) is True
    assert cached.prepare(160, 1) is False  # epoch 3 (seed 6) alone
    assert built() == ["83-4.npy", "83-5.npy", "83-6.npy"]
    assert (tmp_path / "permutations" / "83-6.npy").stat().st_size == 4 * 83
    permutation_path(tmp_path, 83, 6).write_bytes(b"\0" * 8)  # wrong size: not counted as cached
    assert DataOrder(files, L, 4, seed=3, cache_dir=tmp_path).prepare(160, 1) is False
    assert isinstance(cached.permutation(1), np.memmap)
    for q in (0, 79, 80, 159, 160, 239):
        assert cached.instance(q) == plain.instance(q)
        np.testing.assert_array_equal(cached.row_tokens(q), plain.row_tokens(q))


def test_chunked_prepare_caches_the_chunk_permutation(files, tmp_path):
    """chunk=2: each file keeps whole chunks (50, 30, 2 instances), an epoch shuffles the 41 chunks."""
    order = DataOrder(files, L, 4, seed=3, cache_dir=tmp_path, chunk=2)
    assert order.num_instances == 82 and order.prepare(0, 4) is False
    assert sorted(p.name for p in (tmp_path / "permutations").glob("*.npy")) == ["41-4.npy"]
    assert order.prepare(0, 4) is True
    perm = order.permutation(1)  # instance ids: each chunk's two instances in a row
    assert perm.dtype == np.uint32 and sorted(perm.tolist()) == list(range(82))
    chunks = reference_perm(3, 1, 41).astype(np.int64)
    assert perm.tolist() == np.stack([2 * chunks, 2 * chunks + 1], axis=1).ravel().tolist()


def test_instances_of_a_row_range_across_epochs(files):
    order = DataOrder(files, L, 4, seed=3)
    got = order.instances(75, 10)  # rows 75..84: the end of epoch 1 and the start of epoch 2
    assert got.dtype == np.int64 and got.shape == (10,)
    want = [int(reference_perm(3, 1 + q // 80, 83)[q % 80]) for q in range(75, 85)]
    assert got.tolist() == want == [order.instance(q)[1] for q in range(75, 85)]
    f, off = order.instance_locations(got)
    assert f.dtype == off.dtype == np.int64
    assert list(zip(f.tolist(), off.tolist())) == [reference_instances(SIZES, L)[i] for i in want]
    assert order.instances(5, 0).shape == (0,)


def test_training_rows_items(files):
    """Item ``i`` is row ``first_row + i`` with its index; without a plan the rows are the files' rows."""
    order = DataOrder(files, L, 4, seed=2)
    rows = TrainingRows(order, None, first_row=78, num_rows=4)  # rows 78..81 cross into epoch 2
    assert len(rows) == 4
    for i in range(4):
        item = rows[i]
        assert sorted(item) == ["input_ids", "labels", "row_index"]
        assert item["row_index"].dtype == torch.int64 and item["row_index"].shape == () and \
            int(item["row_index"]) == 78 + i
        assert item["input_ids"].dtype == torch.int64
        np.testing.assert_array_equal(item["input_ids"].numpy(), order.row_tokens(78 + i))
        assert item["labels"].tolist() == item["input_ids"].tolist()
        assert item["labels"].data_ptr() != item["input_ids"].data_ptr()  # a copy: the trainer may edit labels
    for i in (4, -1):
        with pytest.raises(IndexError) as e:
            rows[i]
        assert e.value.args == (i,)
