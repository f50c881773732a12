"""Property tests (Hypothesis) of the position arithmetic: global token position <-> (step, row, offset) <->
(epoch, instance, file, file offset) round-trip for random sequence lengths, batch sizes, token files, chunk sizes
and epochs, and the DP rank layout inverts (``rows_for`` / ``step_and_rank``)."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from pretrain_exp.data.order import DataOrder, step_row_offset, step_window
from pretrain_exp.data.schedule import rows_for, step_and_rank
from pretrain_exp.data.token_files import TokenFiles, write_token_file

_DIR = Path(tempfile.mkdtemp(prefix="position-properties."))
atexit.register(shutil.rmtree, _DIR, True)


@st.composite
def orders(draw):
    """A :class:`DataOrder` over 1-3 random token files (uint16, ids encode file and offset) with random L, B,
    seed, first epoch and chunk."""
    L = draw(st.integers(1, 16))
    B = draw(st.integers(1, 6))
    chunk = draw(st.sampled_from([1, 1, 2, 3]))
    n_files = draw(st.integers(1, 3))
    sizes = draw(st.lists(st.integers(0, 40 * L), min_size=n_files, max_size=n_files))
    total_instances = sum(n // (L * chunk) * chunk for n in sizes)
    if total_instances < B:  # too small for one batch: make the last file big enough
        sizes[-1] += B * L * chunk
    d = Path(tempfile.mkdtemp(dir=_DIR))
    paths = []
    for f, n in enumerate(sizes):
        if n == 0:
            tokens = []
            docs = []
        else:
            tokens = (np.arange(n, dtype=np.int64) * 7 + f * 1000) % 60000
            docs = [tokens[:-1].tolist()]
        paths.append(d / f"part-{f}.npy")
        write_token_file(paths[-1], docs, np.uint16, int(tokens[-1]) if n else 0)
    files = TokenFiles(paths, np.uint16, progress=False)
    return DataOrder(files, L, B, seed=draw(st.integers(0, 2**31)), first_epoch=draw(st.integers(0, 1)),
                     chunk=chunk)


@given(order=orders(), data=st.data())
def test_position_round_trips_through_every_coordinate(order, data):
    L, B, N = order.sequence_length, order.global_batch_size, order.rows_per_epoch
    epochs = data.draw(st.integers(1, 3), label="epochs")
    p = data.draw(st.integers(0, epochs * N * L - 1), label="position")
    loc = order.locate(p)
    # position <-> (q, step, row, offset)
    assert (loc.q, loc.offset) == divmod(p, L)
    assert (loc.step, loc.row) == (loc.q // B + 1, loc.q % B)
    assert ((loc.step - 1) * B + loc.row) * L + loc.offset == p
    assert tuple(map(int, step_row_offset(p, L, B))) == (loc.step, loc.row, loc.offset)
    vec = step_row_offset(np.array([p], np.int64), L, B)
    assert [int(v[0]) for v in vec] == [loc.step, loc.row, loc.offset]
    # q <-> (epoch, instance): the instance is the epoch's permutation entry at q's place in the epoch
    assert loc.epoch == order.first_epoch + loc.q // N
    assert int(order.permutation(loc.epoch)[loc.q % N]) == loc.instance
    assert int(order.instances(loc.q, 1)[0]) == loc.instance
    # instance <-> (file, file offset): instances never span files, the file offset is inside the file
    assert 0 <= loc.file_index < len(order.files.paths)
    row_start = loc.file_offset - loc.offset
    assert row_start % L == 0 and loc.file_offset < order.files.num_tokens[loc.file_index]
    assert order.file_starts[loc.file_index] + row_start // L == loc.instance
    assert loc.instance < order.file_starts[loc.file_index + 1]
    f, off = order.instance_locations(np.array([loc.instance]))
    assert (int(f[0]), int(off[0])) == (loc.file_index, row_start)
    # the tokens of row q are the file's tokens at that place
    row = order.row_tokens(loc.q)
    np.testing.assert_array_equal(row, order.files.read(loc.file_index, row_start, L))
    assert int(row[loc.offset]) == int(order.files.read(loc.file_index, loc.file_offset, 1)[0])


@given(order=orders(), data=st.data())
def test_each_epoch_is_a_permutation_of_whole_chunks(order, data):
    e = order.first_epoch + data.draw(st.integers(0, 2), label="epoch offset")
    perm = np.asarray(order.permutation(e), dtype=np.int64)
    assert sorted(perm.tolist()) == list(range(order.num_instances))
    if order.chunk > 1:  # chunks stay together, in order
        starts = perm[::order.chunk]
        assert (starts % order.chunk == 0).all()
        within = np.tile(np.arange(order.chunk), starts.size)
        np.testing.assert_array_equal(perm, np.repeat(starts, order.chunk) + within)


@given(B=st.integers(1, 64), data=st.data())
def test_rank_layout_inverts(B, data):
    W = data.draw(st.sampled_from([w for w in range(1, B + 1) if B % w == 0]), label="world")
    step = data.draw(st.integers(1, 1000), label="step")
    rank = data.draw(st.integers(0, W - 1), label="rank")
    q = rows_for(step, rank, W, B)
    assert q.shape == (B // W,)
    k, r, i = step_and_rank(q, W, B)
    assert (k == step).all() and (r == rank).all() and (i == np.arange(B // W)).all()
    # the ranks together train exactly the step's rows
    rows = np.sort(np.concatenate([rows_for(step, j, W, B) for j in range(W)]))
    np.testing.assert_array_equal(rows, np.arange((step - 1) * B, step * B))


@given(S=st.integers(0, 10**6), n=st.integers(0, 10**4), L=st.integers(1, 4096), B=st.integers(1, 1024))
def test_step_window_is_the_steps_tokens(S, n, L, B):
    w0, w1 = step_window(S, n, L, B)
    assert (w0, w1) == (S * B * L, (S + n) * B * L)
    if n:
        assert step_row_offset(w0, L, B) == (S + 1, 0, 0)
        assert step_row_offset(w1 - 1, L, B) == (S + n, B - 1, L - 1)
