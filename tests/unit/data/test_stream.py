"""The window stream against a real local HTTP server (tests/remote_server.py): rows read through its gate equal the
local copies, a reader waits (and a long wait is logged as a stall), the stream stays ``ahead_steps`` ahead of the
trainer, a failure reaches every reader, a killed stream resumes with what is missing, one process streams a window.

Expected tokens come from the local copies, read with numpy, never through the code under test.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time

import numpy as np
import pytest

from pretrain_exp.core.errors import DataError
from pretrain_exp.data.order import DataOrder
from pretrain_exp.data.prefetch import check_window, window_ranges
from pretrain_exp.data.rows import TrainingRows
from pretrain_exp.data.stream import StreamGate, WindowStream
from pretrain_exp.data.token_files import TokenFiles
from pretrain_exp.data.window import WindowCache
from tests.conftest import CACHE_DIR
from tests.remote_server import OLMO_DATA, RangeServer, build_mix

L, B, SEED = 64, 8, 3
U32 = np.dtype("<u4")


pytestmark = pytest.mark.usefixtures("no_proxy")


@pytest.fixture(scope="module")
def mix(tmp_path_factory):
    """``(server root, urls)``: 50 files of 1,000-3,000 tokens (15-46 instances of 64 tokens each)."""
    root = tmp_path_factory.mktemp("srv")
    counts = np.random.default_rng(1).integers(1000, 3000, size=50)
    return root, build_mix(root, counts, cache_dir=CACHE_DIR)


@pytest.fixture
def server(mix):
    with RangeServer(mix[0]) as srv:
        yield srv


def remote_order(mix, server, cache) -> DataOrder:
    files = TokenFiles(mix[1], U32, cache_dir=cache, prefixes={OLMO_DATA: server.base + "/"}, progress=False)
    return DataOrder(files, L, B, SEED, cache_dir=cache)


def expected_row(mix, order: DataOrder, q: int) -> np.ndarray:
    f, off = order.instance_location(order.instance(q)[1])
    return np.fromfile(mix[0] / mix[1][f][len(OLMO_DATA):], dtype=U32)[off:off + L].astype(np.int64)


def progress(stream: WindowStream) -> dict:
    return json.loads(stream.progress.read_text())


def wait_for(predicate, timeout: float = 30.0) -> None:
    t0 = time.monotonic()
    while not predicate():
        assert time.monotonic() - t0 < timeout, "timed out"
        time.sleep(0.02)


def test_streamed_rows_equal_the_local_rows_and_the_window_ends_complete(mix, server, tmp_path):
    order = remote_order(mix, server, tmp_path)
    first, n = 3 * B, 20 * B
    server.latency_s = 0.01
    server.reset_counts()
    stream = WindowStream(order, first, n, threads=4, chunk_bytes=4 * L * 4).start()
    assert stream.streaming
    order.gate = stream.gate()
    rows = TrainingRows(order, None, first, n)  # the map-style dataset the hf framework trains on
    for i in range(n):
        assert np.array_equal(rows[i]["input_ids"].numpy(), expected_row(mix, order, first + i))
    stream.close(wait_s=60)
    assert stream.proc.returncode == 0 and progress(stream)["state"] == "done"
    assert progress(stream)["ready_row"] == first + n
    check_window(order.files, window_ranges(order, first, n))  # every range recorded in the manifests
    window = n * L * 4
    assert window <= server.bytes_served <= 1.1 * window  # the window once (rows read in the stream's wake)
    assert order.row_tokens(first + n) is not None  # a row outside the window: read as without a stream


def test_readers_wait_for_the_stream_and_a_stall_is_logged_once_per_step(mix, server, tmp_path, caplog):
    """The rows of step 12 read by 4 threads at once (as OLMo-core's loader reads a batch): one log line, and the
    step's stall is the longest wait, not the sum of the four."""
    order = remote_order(mix, server, tmp_path)
    server.latency_s = 0.05
    stream = WindowStream(order, 0, 12 * B, threads=1, chunk_bytes=L * 4).start()
    order.gate = stream.gate()
    rows = list(range(11 * B, 11 * B + 4))
    got = {}
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="pretrain_exp.data.stream"):
        readers = [threading.Thread(target=lambda q=q: got.__setitem__(q, order.row_tokens(q))) for q in rows]
        for t in readers:
            t.start()
        for t in readers:
            t.join(60)
    waited = time.monotonic() - t0
    assert all(np.array_equal(got[q], expected_row(mix, order, q)) for q in rows)
    assert order.gate.stalls == 1 and 0.5 < order.gate.stall_s <= waited
    msg = [r.getMessage() for r in caplog.records if r.getMessage().startswith("data stall")]
    assert len(msg) == 1 and msg[0].startswith("data stall: step 12 (row ") and "for the window stream" in msg[0]
    stream.close(wait_s=60)


def test_the_stream_stays_ahead_steps_ahead_of_the_trainer(mix, server, tmp_path):
    """It fetches ``ahead_steps`` steps past the latest row the trainer waited for; the audit's gate only follows."""
    order = remote_order(mix, server, tmp_path)
    start, steps = 5, 16
    stream = WindowStream(order, start * B, steps * B, threads=4, ahead_steps=3).start()
    wait_for(lambda: progress(stream)["ready_row"] == (start + 3) * B)
    follower = StreamGate.from_json(stream.gate().to_json())  # as the audit beside training has it
    waiting = threading.Thread(target=follower.wait_row, args=((start + 6) * B,))
    waiting.start()
    time.sleep(1.0)
    assert progress(stream)["ready_row"] == (start + 3) * B and progress(stream)["state"] == "running"
    assert waiting.is_alive()
    trainer = stream.gate()
    assert trainer.wait_row((start + 4) * B)  # the trainer reads global step start + 5
    wait_for(lambda: progress(stream)["ready_row"] == (start + 7) * B)
    waiting.join(30)
    assert not waiting.is_alive()
    assert trainer.wait_row((start + steps) * B - 1)
    wait_for(lambda: progress(stream)["state"] == "done")
    stream.close(wait_s=30)


def test_a_failed_stream_is_an_error_in_every_reader(mix, server, tmp_path):
    order = remote_order(mix, server, tmp_path)
    inst = order.instances(6 * B, B)
    f = int(order.instance_locations(inst)[0][0])
    server.fault("/" + mix[1][f][len(OLMO_DATA):], *[("status", 404)] * 50)  # a file of step 7 is gone
    stream = WindowStream(order, 0, 10 * B, threads=1).start()
    gate = StreamGate.from_json(json.loads(json.dumps(stream.gate().to_json())))  # as another process has it
    with pytest.raises(DataError, match=r"^the window stream failed: DataError: .*token file not found"):
        gate.wait_row(10 * B - 1)
    stream.close(wait_s=30)
    assert stream.proc.returncode == 1 and progress(stream)["state"] == "failed"


@pytest.mark.slow  # waits for the dead stream's heartbeat
def test_a_killed_stream_resumes_with_only_what_is_missing(mix, server, tmp_path):
    order = remote_order(mix, server, tmp_path)
    n = 24 * B
    server.latency_s = 0.02
    stream = WindowStream(order, 0, n, threads=2, chunk_bytes=L * 4).start()
    wait_for(lambda: progress(stream)["ready_row"] >= 6 * B)
    os.kill(stream.proc.pid, signal.SIGKILL)
    stream.proc.wait()
    gate = stream.gate()
    with pytest.raises(DataError, match=r"^the window stream \(process \d+\) ended before row"):
        gate.wait_row(n - 1)
    assert gate.wait_row(B)  # a row it fetched before it died
    server.reset_counts()
    again = WindowStream(order, 0, n, threads=2, chunk_bytes=L * 4).start()
    assert again.streaming  # the dead stream's lock went with it
    order.gate = again.gate()
    for q in range(n):
        assert np.array_equal(order.row_tokens(q), expected_row(mix, order, q))
    again.close(wait_s=60)
    assert progress(again)["state"] == "done" and 0 < server.bytes_served < n * L * 4


def test_one_process_streams_a_window_the_others_wait_on_it(mix, server, tmp_path):
    order = remote_order(mix, server, tmp_path)
    server.latency_s = 0.01
    first = WindowStream(order, 0, 8 * B, threads=2).start()
    second = WindowStream(remote_order(mix, server, tmp_path), 0, 8 * B, threads=2).start()  # another rank
    assert first.streaming and not second.streaming and second.proc is None
    other = remote_order(mix, server, tmp_path)
    other.gate = second.gate()
    assert np.array_equal(other.row_tokens(8 * B - 1), expected_row(mix, other, 8 * B - 1))
    first.close(wait_s=30)


def test_manifests_keep_the_ranges_of_every_writer(tmp_path):
    url, size = "http://127.0.0.1:1/a/part-0.npy", 1000
    one, two = WindowCache(tmp_path), WindowCache(tmp_path)  # two processes filling one cache file
    one.create(url, size)
    one.record(url, size, np.array([[0, 100]]))
    two.record(url, size, np.array([[500, 600]]))
    one.record(url, size, np.array([[0, 200]]))
    assert one.present(url, size).tolist() == [[0, 200], [500, 600]]
