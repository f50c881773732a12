"""Our :class:`~pretrain_exp.data.order.DataOrder` addresses exactly the rows OLMo-core trains.

Small real token files are read by both sides: OLMo-core's own ``NumpyFSLDataset`` + ``NumpyFSLDataLoader``
(built the way ``NumpyDataLoaderConfig.build`` and the ``Trainer`` build and drive them) and our ``DataOrder``.
Every token encodes where it lives (``value = file * STRIDE + offset``), so a row that came from the wrong
place cannot match by accident. Nothing here re-implements OLMo-core: the expectations come from OLMo-core
itself, the subject is our order.
"""

from __future__ import annotations

import numpy as np
import olmo_core.data as olmo_data
import pytest
import torch
from olmo_core.data import data_loader as olmo_loader

from pretrain_exp.data.order import DataOrder
from pretrain_exp.data.token_files import TokenFiles, dtype_for_vocab, write_token_file

L = 32  #: sequence length
B = 8  #: global batch size in rows (instances)
SEED = 7
SIZES = (1607, 2991, 2150)  # -> 50, 93, 67 = 210 instances; 210 % 8 = 2 rows dropped per epoch (drop_last)
EOS, PAD = 0, 1

#: dtype -> (tokens per file "stride" used in the value code, vocab size that makes OLMo-core infer that dtype)
CODES = {
    "uint16": (20_000, 50_280),  # max value 2*20000+2149 < 50280 <= 65536
    "uint32": (1_000_000, 3_000_000),  # values need uint32; vocab well above 2**16
}


def coded(f: int, off, stride: int) -> np.ndarray:
    return f * stride + np.asarray(off, dtype=np.int64)


@pytest.fixture(params=sorted(CODES))
def corpus(request, tmp_path):
    """(paths, dtype name, stride, vocab size): one document per file whose EOS is its last token."""
    stride, vocab = CODES[request.param]
    dtype = np.dtype(request.param)
    assert dtype_for_vocab(vocab) == dtype
    paths = []
    for f, n in enumerate(SIZES):
        values = coded(f, np.arange(n), stride)
        paths.append(tmp_path / "data" / f"part-{f:02d}.npy")
        assert write_token_file(paths[-1], [values[:-1].tolist()], dtype, int(values[-1])) == n
    return paths, request.param, stride, vocab


def our_order(paths, dtype_name: str, seed: int = SEED) -> DataOrder:
    return DataOrder(TokenFiles(paths, np.dtype(dtype_name)), L, B, seed, first_epoch=1)


def olmo_dataset(paths, vocab: int, work_dir):
    """OLMo-core's ``NumpyFSLDataset`` over ``paths``, dtype inferred from the vocab size as in real configs."""
    config = olmo_data.NumpyFSLDatasetConfig(
        tokenizer=olmo_data.TokenizerConfig(vocab_size=vocab, eos_token_id=EOS, pad_token_id=PAD),
        paths=[str(p) for p in paths],
        sequence_length=L,
        work_dir=str(work_dir),
    )
    dataset = config.build()
    assert isinstance(dataset, olmo_data.NumpyFSLDataset)
    return dataset


def olmo_loader_single(paths, vocab: int, work_dir, seed: int = SEED):
    """The single-process loader exactly as ``NumpyDataLoaderConfig.build`` makes it (no process group)."""
    dataset = olmo_dataset(paths, vocab, work_dir)
    loader = olmo_data.NumpyDataLoaderConfig(global_batch_size=B * L, seed=seed, work_dir=str(work_dir)).build(dataset)
    assert isinstance(loader, olmo_loader.NumpyFSLDataLoader)
    assert (loader.dp_world_size, loader.dp_rank) == (1, 0)
    return loader


def olmo_loader_rank(paths, vocab: int, work_dir, dp_world_size: int, dp_rank: int):
    """DP rank ``dp_rank`` of ``dp_world_size``: what ``build`` does under a process group, with the DP values given
    directly (``wrap_numpy_dataset`` is the call ``build`` makes; ``fs_local_rank`` = rank as on one node)."""
    dataset = olmo_dataset(paths, vocab, work_dir)
    dataset.prepare()
    return olmo_loader.NumpyDataLoaderBase.wrap_numpy_dataset(
        dataset,
        global_batch_size=B * L,
        collator=olmo_data.DataCollator(pad_token_id=PAD, vocab_size=vocab),
        work_dir=work_dir,
        seed=SEED,
        dp_world_size=dp_world_size,
        dp_rank=dp_rank,
        fs_local_rank=dp_rank,
    )


def expected(order: DataOrder, qs) -> tuple[list, torch.Tensor]:
    """(instance ids, input ids) our order gives for training-order rows ``qs``."""
    qs = list(qs)
    return [order.instance(q)[1] for q in qs], torch.as_tensor(np.stack([order.row_tokens(q) for q in qs]))


def check_batch(batch, order: DataOrder, qs) -> None:
    ids, tokens = expected(order, qs)
    assert batch["index"].tolist() == ids, f"instance ids differ for rows {qs[0]}..{qs[-1]}"
    assert batch["input_ids"].dtype == torch.long
    assert torch.equal(batch["input_ids"], tokens), f"tokens differ for rows {qs[0]}..{qs[-1]}"


def test_instances_and_global_indices_file(corpus, tmp_path):
    paths, dtype_name, stride, vocab = corpus
    order = our_order(paths, dtype_name)
    loader = olmo_loader_single(paths, vocab, tmp_path / "work")
    dataset = loader.dataset

    assert np.dtype(dataset.dtype) == np.dtype(dtype_name)  # OLMo-core inferred the dtype our files use
    assert len(dataset) == order.num_instances == 210
    assert [end - start for start, end in dataset.offsets] == order.instances_per_file.tolist()
    assert [start for start, _ in dataset.offsets] == order.file_starts[:-1].tolist()
    assert loader.total_size == order.rows_per_epoch == 208
    assert loader.total_batches == order.rows_per_epoch // B

    for epoch in (1, 2):
        loader.reshuffle(epoch=epoch)
        files = sorted(p.name for p in (tmp_path / "work").glob("global_indices_*"))
        name = f"global_indices_dataset_size{order.num_instances}_epoch{epoch}_seed{SEED}_v1.npy"
        assert name in files
        on_disk = np.fromfile(tmp_path / "work" / name, dtype=np.uint32)  # raw uint32, no header
        assert on_disk.shape == (order.num_instances,)
        assert np.array_equal(on_disk, order.permutation(epoch))
        assert np.array_equal(on_disk[: order.rows_per_epoch], order.permutation(epoch)[: order.rows_per_epoch])

    # every instance read through OLMo-core is the window our order says, and the tokens decode to that place
    for inst in (0, 49, 50, 142, 143, 209):
        f, off = order.instance_location(inst)
        row = dataset[inst]["input_ids"]
        assert torch.equal(row, torch.as_tensor(coded(f, off + np.arange(L), stride)))


def test_two_epochs_of_batches(corpus, tmp_path):
    """Batch k of epoch 1 = rows [(k-1)B, kB); epoch 2 (``reshuffle(epoch=2)``) continues at row rows_per_epoch."""
    paths, dtype_name, _, vocab = corpus
    order = our_order(paths, dtype_name)
    loader = olmo_loader_single(paths, vocab, tmp_path / "work")
    rows_per_epoch = order.rows_per_epoch

    for epoch in (1, 2):  # what Trainer._fit_epoch does: reshuffle(epoch), iterate, reset()
        loader.reshuffle(epoch=epoch)
        first = (epoch - 1) * rows_per_epoch
        n = 0
        for k, batch in enumerate(loader, start=1):
            qs = range(first + (k - 1) * B, first + k * B)
            assert {order.instance(q)[0] for q in qs} == {epoch}
            check_batch(batch, order, qs)
            n += 1
        assert n == loader.total_batches == rows_per_epoch // B
        # random access (NumpyFSLDataLoader.__getitem__, 0-based batch index) agrees too
        check_batch(loader[3], order, range(first + 3 * B, first + 4 * B))
        loader.reset()


def test_dp_ranks_get_strided_rows(corpus, tmp_path):
    """DP rank r of W=2 gets rows r, r+2, ... of each global batch."""
    paths, dtype_name, _, vocab = corpus
    order = our_order(paths, dtype_name)
    world = 2
    work_dir = tmp_path / "work"
    loaders = [olmo_loader_rank(paths, vocab, work_dir, world, r) for r in range(world)]
    for loader in loaders:  # rank 0 (fs_local_rank 0) writes the global indices file, rank 1 reads it
        loader.reshuffle(epoch=1)
    assert len(list(work_dir.glob("global_indices_*"))) == 1
    for r, loader in enumerate(loaders):
        assert loader.rank_batch_size == B * L // world
        n = 0
        for k, batch in enumerate(loader, start=1):
            assert batch["input_ids"].shape == (B // world, L)
            check_batch(batch, order, range((k - 1) * B + r, k * B, world))
            n += 1
        assert n == order.rows_per_epoch // B


@pytest.mark.parametrize("epoch, resume_batch", [(1, 5), (2, 3)])
def test_resume_continues_at_row_n_times_b(corpus, tmp_path, epoch, resume_batch):
    """A fresh loader restored from ``state_dict()`` taken after N batches (what ``train/rank0.pt`` holds) continues
    at row N*B of that epoch; the Trainer restores with ``load_state_dict`` then ``reshuffle(epoch)``."""
    paths, dtype_name, _, vocab = corpus
    order = our_order(paths, dtype_name)
    first = (epoch - 1) * order.rows_per_epoch

    loader = olmo_loader_single(paths, vocab, tmp_path / "work")
    for e in range(1, epoch):  # earlier epochs run to the end, as in Trainer.fit
        loader.reshuffle(epoch=e)
        assert sum(1 for _ in loader) == loader.total_batches
        loader.reset()
    loader.reshuffle(epoch=epoch)
    state = None
    for k, _ in enumerate(loader, start=1):
        if k == resume_batch:
            state = loader.state_dict()  # saved while the epoch is in flight, like a checkpoint
    assert state["batches_processed"] == resume_batch and state["epoch"] == epoch
    assert state["tokens_processed"] == resume_batch * B * L

    # a new process: new dataset and loader objects; different configured seed, as the checkpoint's seed wins
    resumed = olmo_loader_single(paths, vocab, tmp_path / "work2", seed=SEED + 1)
    resumed.load_state_dict(state)
    assert resumed.seed == SEED and resumed.batches_processed == resume_batch
    resumed.reshuffle(epoch=epoch)
    batches = list(resumed)
    assert len(batches) == resumed.total_batches - resume_batch
    for j, batch in enumerate(batches):
        start = first + (resume_batch + j) * B
        check_batch(batch, order, range(start, start + B))


@pytest.mark.parametrize("vocab", [2, 256, 257, 50_280, 65_536, 65_537, 100_278])
def test_dtype_inference_agrees(vocab):
    """OLMo-core infers the token dtype from the vocab size when ``dtype`` is unset; ours must give the same."""
    config = olmo_data.NumpyFSLDatasetConfig(
        tokenizer=olmo_data.TokenizerConfig(vocab_size=vocab, eos_token_id=EOS, pad_token_id=PAD),
        paths=["unused.npy"],
        sequence_length=L,
    )
    assert np.dtype(config.get_dtype()) == dtype_for_vocab(vocab)


@pytest.mark.parametrize("chunk", [2, 4])
def test_chunked_order_of_max_target_sequence_length(corpus, tmp_path, chunk):
    """With ``max_target_sequence_length = chunk * L`` OLMo-core keeps whole chunks per file and shuffles chunks
    (its loader's ``chunk_size``); our order with ``chunk`` gives the same instances, global indices and batches."""
    paths, dtype_name, stride, vocab = corpus
    order = DataOrder(TokenFiles(paths, np.dtype(dtype_name)), L, B, SEED, first_epoch=1, chunk=chunk,
                      cache_dir=tmp_path / "cache")
    dataset = olmo_data.NumpyFSLDatasetConfig(
        tokenizer=olmo_data.TokenizerConfig(vocab_size=vocab, eos_token_id=EOS, pad_token_id=PAD),
        paths=[str(p) for p in paths], sequence_length=L, max_target_sequence_length=chunk * L,
        work_dir=str(tmp_path / "work")).build()
    loader = olmo_data.NumpyDataLoaderConfig(global_batch_size=B * L, seed=SEED,
                                             work_dir=str(tmp_path / "work")).build(dataset)
    assert loader.chunk_size == chunk
    assert [end - start for start, end in dataset.offsets] == order.instances_per_file.tolist()
    assert len(dataset) == order.num_instances and loader.total_size == order.rows_per_epoch
    for epoch in (1, 2):
        loader.reshuffle(epoch=epoch)
        assert np.array_equal(np.asarray(loader.get_global_indices()), order.permutation(epoch))
    loader.reshuffle(epoch=1)
    for k, batch in enumerate(loader, start=1):
        check_batch(batch, order, range((k - 1) * B, k * B))
        if k == 3:
            break
