"""Remote token files against a real local HTTP server (tests/remote_server.py): the prefix map, the size index,
range reads, the window prefetch (bytes, resume, retries, errors) and the cached permutation.

The server serves a scaled-down OLMo-2 mix (50 ``uint32`` files under the real ``preprocessed/...`` paths, real
Shakespeare tokens when the token cache has them) that the tests name by their ``http://olmo-data.org/`` URLs,
mapped to the server by ``data.path_prefixes``. Expected tokens always come from the local copies, read with
numpy, never through the code under test.
"""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest

from pretrain_exp.core.errors import ConfigError, DataError
from pretrain_exp.core.retry import RetryPolicy
from pretrain_exp.data import order as order_mod
from pretrain_exp.data import prefetch as prefetch_mod
from pretrain_exp.data.order import DataOrder, build_permutation, permutation_path
from pretrain_exp.data.prefetch import (
    PREFETCH_MODES,
    check_window,
    prefetch,
    prefetch_ranges,
    resolve_prefetch,
    window_ranges,
)
from pretrain_exp.data.remote import RemoteReader, map_prefixes, redact, size_index_path
from pretrain_exp.data.token_files import TokenFiles
from pretrain_exp.data.window import merge_ranges, subtract_ranges, total_bytes
from tests.conftest import CACHE_DIR
from tests.remote_server import OLMO_DATA, RangeServer, build_mix

L, B, SEED = 64, 8, 3
U32 = np.dtype("<u4")


pytestmark = pytest.mark.usefixtures("no_proxy")


@pytest.fixture(scope="module")
def mix(tmp_path_factory):
    """``(server root, urls)``: 50 files of 1,000-3,000 tokens (15-46 instances of 64 tokens each)."""
    root = tmp_path_factory.mktemp("srv")
    counts = np.random.default_rng(0).integers(1000, 3000, size=50)
    return root, build_mix(root, counts, cache_dir=CACHE_DIR)


@pytest.fixture(scope="module")
def server(mix):
    with RangeServer(mix[0]) as srv:
        yield srv


@pytest.fixture
def sleeps():
    return []


@pytest.fixture
def reader(sleeps):
    return RemoteReader(RetryPolicy(max_retries=3, base_delay_s=0.001, sleep=sleeps.append), timeout_s=5.0)


def local(mix, url: str):
    return mix[0] / url[len(OLMO_DATA):]


def remote_files(mix, server, tmp_path, reader, urls=None, prefixes="server") -> TokenFiles:
    server.faults.clear()
    prefixes = {OLMO_DATA: server.base + "/"} if prefixes == "server" else prefixes
    return TokenFiles(urls or mix[1], U32, cache_dir=tmp_path, prefixes=prefixes, reader=reader, progress=False)


def expected_row(mix, order: DataOrder, q: int) -> np.ndarray:
    _, inst = order.instance(q)
    f, off = order.instance_location(inst)
    return np.fromfile(local(mix, mix[1][f]), dtype=U32)[off:off + L].astype(np.int64)


# ------------------------------------------------------------------------------------------------ pure parts


def test_map_prefixes_first_match_wins_and_is_pure():
    paths = ["http://olmo-data.org/a/x.npy", "s3://ai2-llm/b.npy", "/local/c.npy"]
    prefixes = {"http://olmo-data.org/": "http://127.0.0.1:9/", "http://olmo-data.org/a/": "/never/",
                "s3://ai2-llm/": "/mirror/"}
    assert map_prefixes(paths, prefixes) == ["http://127.0.0.1:9/a/x.npy", "/mirror/b.npy", "/local/c.npy"]
    assert map_prefixes(paths, {}) == paths and map_prefixes(paths, None) == paths


def test_redact_drops_credentials():
    assert redact("https://user:s3cret@host:8443/p/f.npy?X-Amz-Signature=abc#x") == "https://host:8443/p/f.npy"
    assert redact("/local/f.npy") == "/local/f.npy"


def test_range_arithmetic():
    r = merge_ranges(np.array([[10, 20], [0, 5], [5, 8], [18, 30], [40, 40]]))
    assert r.tolist() == [[0, 8], [10, 30]]
    assert subtract_ranges(np.array([[0, 100]]), np.array([[10, 20], [50, 60]])).tolist() == [[0, 10], [20, 50],
                                                                                              [60, 100]]
    assert total_bytes(r) == 28


# ------------------------------------------------------------------------------------------------ reads


def test_remote_rows_equal_local_rows(mix, server, tmp_path, reader):
    server.reset_counts()
    files = remote_files(mix, server, tmp_path, reader)
    assert server.count("HEAD") == len(mix[1]) and server.bytes_served == 0  # the size index: one HEAD per file
    index = size_index_path(tmp_path, [u.replace(OLMO_DATA, server.base + "/") for u in mix[1]])
    assert json.loads(index.read_text())["sizes"] == [local(mix, u).stat().st_size for u in mix[1]]
    local_files = TokenFiles([local(mix, u) for u in mix[1]], U32)
    assert files.num_tokens.tolist() == local_files.num_tokens.tolist()
    order = DataOrder(files, L, B, SEED, cache_dir=tmp_path)
    local_order = DataOrder(local_files, L, B, SEED)
    for q in range(5 * B, 7 * B):
        assert order.instance(q) == local_order.instance(q)
        assert np.array_equal(order.row_tokens(q), expected_row(mix, local_order, q))
    server.reset_counts()
    again = remote_files(mix, server, tmp_path, reader)  # the index is reused: no request at all
    assert server.count() == 0 and again.num_tokens.tolist() == files.num_tokens.tolist()
    worker = pickle.loads(pickle.dumps(DataOrder(again, L, B, SEED, cache_dir=tmp_path)))  # data-loader workers
    assert np.array_equal(worker.row_tokens(3), expected_row(mix, local_order, 3))


def test_5xx_and_dropped_connections_are_retried(mix, server, tmp_path, reader, sleeps):
    files = remote_files(mix, server, tmp_path, reader)
    path = "/" + mix[1][0][len(OLMO_DATA):]
    server.fault(path, ("status", 503), ("drop", 10), ("status", 502))
    server.reset_counts()
    got = files.read(0, 100, 200)
    assert np.array_equal(got, np.fromfile(local(mix, mix[1][0]), dtype=U32)[100:300])
    assert server.count("GET") == 4 and len(sleeps) == 3 and sleeps == sorted(sleeps)
    server.fault(path, *[("status", 500)] * 4)  # retries exhausted: one error naming the URL
    with pytest.raises(DataError, match=r"127\.0\.0\.1:\d+/preprocessed/dclm/.*part-0-00000\.npy: failed after 4"):
        files.read(0, 0, 10)


def test_404_is_one_clear_error_not_retried(mix, server, tmp_path, reader, sleeps):
    url = OLMO_DATA + "preprocessed/dclm/missing/part-9-00000.npy"
    secret = url.replace("http://", "http://user:s3cret@") + "?token=abc"
    server.reset_counts()
    with pytest.raises(DataError, match=r"^http://127\.0\.0\.1:\d+/preprocessed/dclm/missing/part-9-00000\.npy: "
                                        r"token file not found \(HTTP 404\)$"):
        remote_files(mix, server, tmp_path, reader, urls=mix[1][:3] + [url])
    assert server.count() == 4 and sleeps == []  # one HEAD each, the 404 not retried
    with pytest.raises(DataError) as err:  # credentials in a URL never reach a message
        remote_files(mix, server, tmp_path, reader, urls=[secret.replace(OLMO_DATA[7:], server.base[7:] + "/")],
                     prefixes=None)
    assert "part-9-00000.npy" in str(err.value) and "s3cret" not in str(err.value) and "abc" not in str(err.value)


@pytest.mark.parametrize("how", ["read", "prefetch"])
def test_changed_size_is_one_clear_error(mix, server, tmp_path, reader, how):
    urls = mix[1][:4]
    files = remote_files(mix, server, tmp_path, reader, urls=urls)
    victim = local(mix, urls[1])
    original = victim.read_bytes()
    try:
        victim.write_bytes(original + b"\0" * 4 * L)  # the remote file grew after the index was written
        order = DataOrder(files, L, B, SEED, cache_dir=tmp_path)
        rows = [q for q in range(order.rows_per_epoch) if order.instance_location(order.instance(q)[1])[0] == 1]
        with pytest.raises(DataError, match=r"part-1-00000\.npy: remote file changed since its size was indexed "
                                            rf"\({len(original)} B in the size index, {len(original) + 4 * L} B"):
            if how == "read":
                order.row_tokens(rows[0])
            else:
                prefetch_ranges(files, window_ranges(order, 0, order.rows_per_epoch), threads=2, progress=False)
    finally:
        victim.write_bytes(original)


# ------------------------------------------------------------------------------------------------ window prefetch


def test_window_prefetch_fetches_the_window_once(mix, server, tmp_path, reader):
    files = remote_files(mix, server, tmp_path, reader)
    order = DataOrder(files, L, B, SEED, cache_dir=tmp_path)
    first_row, num_rows = 10 * B, 20 * B
    ranges = window_ranges(order, first_row, num_rows)
    window_bytes = num_rows * L * U32.itemsize
    assert sum(total_bytes(r) for r in ranges.values()) == window_bytes
    server.reset_counts()
    files2, _, stats = prefetch(mix[1], U32, L, B, SEED, 1, first_row, num_rows, tmp_path,
                                {OLMO_DATA: server.base + "/"}, threads=8, progress=False)
    assert server.bytes_served == stats.fetched_bytes == window_bytes <= 1.1 * window_bytes
    assert server.count("HEAD") == 0 and stats.requests == server.count("GET")  # sizes came from the index
    # the cached files have the remote basenames and sizes (OLMo-core's fingerprint) and the window's tokens
    for url, path in zip(mix[1], files2.local_paths()):
        assert path.endswith("/" + url.rsplit("/", 1)[1]) and "127.0.0.1" in path
    for fi in ranges:
        path = files2.local_paths()[fi]
        assert os.path.getsize(path) == local(mix, mix[1][fi]).stat().st_size
    local_order = DataOrder(TokenFiles([local(mix, u) for u in mix[1]], U32), L, B, SEED)
    server.reset_counts()
    for q in range(first_row, first_row + num_rows):  # training reads: all from the window cache
        _, inst = order.instance(q)
        f, off = order.instance_location(inst)
        from_disk = np.fromfile(files2.local_paths()[f], dtype=U32)[off:off + L]
        assert np.array_equal(from_disk, expected_row(mix, local_order, q))
        assert np.array_equal(files2.read(f, off, L), from_disk)
    assert server.count() == 0
    check_window(files2, ranges)
    with pytest.raises(DataError, match=r"not in the window cache .*run the prefetch"):
        check_window(files2, window_ranges(order, first_row + num_rows, B))
    files2, _, stats = prefetch(mix[1], U32, L, B, SEED, 1, first_row, num_rows, tmp_path,
                                {OLMO_DATA: server.base + "/"}, threads=8, progress=False)
    assert server.count() == 0 and stats.fetched_bytes == 0 and stats.cached_bytes == window_bytes


def test_killed_prefetch_resumes_with_only_the_missing_bytes(mix, server, tmp_path, reader):
    files = remote_files(mix, server, tmp_path, reader)
    order = DataOrder(files, L, B, SEED, cache_dir=tmp_path)
    ranges = window_ranges(order, 0, 40 * B)
    needed = sum(total_bytes(r) for r in ranges.values())
    done = []

    def kill_after_5(fi, a, b):
        done.append((fi, a, b))
        if len(done) == 5:
            raise KeyboardInterrupt  # what a Ctrl-C (or any failure) in the middle of a prefetch looks like

    server.reset_counts()
    with pytest.raises(KeyboardInterrupt):
        prefetch_ranges(files, ranges, threads=3, chunk_bytes=2 * L * 4, progress=False, on_chunk=kill_after_5)
    first = server.bytes_served
    assert 0 < first < needed
    fresh = remote_files(mix, server, tmp_path, reader)  # a new process: only the manifests on disk are known
    server.reset_counts()
    stats = prefetch_ranges(fresh, ranges, threads=3, chunk_bytes=2 * L * 4, progress=False)
    assert stats.cached_bytes == first and first + server.bytes_served == needed == stats.needed_bytes
    check_window(fresh, ranges)
    local_order = DataOrder(TokenFiles([local(mix, u) for u in mix[1]], U32), L, B, SEED)
    for q in range(0, 40 * B, 7):
        _, inst = order.instance(q)
        f, off = order.instance_location(inst)
        assert np.array_equal(np.fromfile(fresh.local_paths()[f], dtype=U32)[off:off + L],
                              expected_row(mix, local_order, q))


def test_disk_too_small_is_one_clear_error(mix, server, tmp_path, reader, monkeypatch):
    files = remote_files(mix, server, tmp_path, reader)
    order = DataOrder(files, L, B, SEED)
    monkeypatch.setattr(prefetch_mod.shutil, "disk_usage", lambda p: type("U", (), {"free": 1000})())
    server.reset_counts()
    with pytest.raises(DataError, match=r"window cache needs 0\.1 MB more, the disk has 0\.0 MB free"):
        prefetch_ranges(files, window_ranges(order, 0, 32 * B), progress=False)
    assert server.count() == 0


# ------------------------------------------------------------------------------------------------ permutation


def test_permutation_cache_equals_in_memory_and_is_reused(tmp_path, monkeypatch):
    n, seed = 100_003, 11
    paths = []
    for k, size in enumerate((4 * 50_000, 4 * 50_003)):
        paths.append(tmp_path / f"part-{k}.npy")
        np.zeros(size, "<u4").tofile(paths[-1])
    files = TokenFiles(paths, U32)
    in_memory = DataOrder(files, 4, 16, seed)
    cached = DataOrder(files, 4, 16, seed, cache_dir=tmp_path / "c")
    assert cached.num_instances == n
    for epoch in (1, 2):
        perm = cached.permutation(epoch)
        assert isinstance(perm, np.memmap) and perm.dtype == np.uint32
        assert np.array_equal(perm, in_memory.permutation(epoch))
        path = permutation_path(tmp_path / "c", n, seed + epoch)
        assert path.stat().st_size == 4 * n
        assert np.array_equal(np.fromfile(path, "<u4"), build_permutation(n, seed + epoch))
    calls = []
    real = order_mod.build_permutation
    monkeypatch.setattr(order_mod, "build_permutation", lambda *a: calls.append(a) or real(*a))
    again = DataOrder(files, 4, 16, seed, cache_dir=tmp_path / "c")  # another process, same cache
    assert again.instance(5) == in_memory.instance(5) and calls == []


def test_resolve_prefetch(mix, server, tmp_path, reader):
    remote = remote_files(mix, server, tmp_path, reader, urls=mix[1][:2])
    local_only = TokenFiles([local(mix, u) for u in mix[1][:2]], U32)
    assert [resolve_prefetch(m, remote) for m in PREFETCH_MODES] == ["stream", "stream", "window", "none"]
    assert [resolve_prefetch(m, local_only) for m in PREFETCH_MODES] == ["none", "stream", "window", "none"]
    assert local_only.local_paths() == [str(local(mix, u)) for u in mix[1][:2]]
    with pytest.raises(ConfigError,
                       match=r"^data\.prefetch: unknown mode 'always'; allowed: auto, stream, window, none$"):
        resolve_prefetch("always", remote)
    with pytest.raises(ConfigError, match=r"^cache_dir: remote token files \(http://olmo-data\.org/"):
        TokenFiles(mix[1][:2], U32)


CHILD = """
import sys
import numpy as np
from pretrain_exp.data.prefetch import prefetch
urls, base, cache = sys.argv[1].split(","), sys.argv[2], sys.argv[3]
prefetch(urls, np.uint32, 64, 8, 3, 1, 0, 40 * 8, cache, {"http://olmo-data.org/": base + "/"}, threads=2,
         chunk_bytes=64 * 4, progress=False)
"""


@pytest.mark.slow
def test_prefetch_killed_by_sigkill_resumes(mix, tmp_path, reader):
    import subprocess
    import sys
    import time

    with RangeServer(mix[0], latency_s=0.01) as srv:
        env = dict(os.environ, PYTHONPATH=os.getcwd(), no_proxy="127.0.0.1")
        child = subprocess.Popen([sys.executable, "-c", CHILD, ",".join(mix[1]), srv.base, str(tmp_path)], env=env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and srv.bytes_served < 20_000:  # some manifests written, far from done
            time.sleep(0.05)
        time.sleep(1.2)  # past one manifest interval
        child.kill()
        child.wait()
        first = srv.bytes_served
        files = TokenFiles(mix[1], U32, cache_dir=tmp_path, prefixes={OLMO_DATA: srv.base + "/"}, reader=reader,
                           progress=False)
        ranges = window_ranges(DataOrder(files, L, B, SEED, cache_dir=tmp_path), 0, 40 * B)
        needed = sum(total_bytes(r) for r in ranges.values())
        assert 0 < first < needed
        srv.reset_counts()
        stats = prefetch_ranges(files, ranges, threads=4, progress=False)
        assert stats.cached_bytes > 0 and srv.bytes_served == needed - stats.cached_bytes  # only what is missing
        assert stats.cached_bytes <= first  # the manifests never claim bytes that were not received
        check_window(files, ranges)


def test_object_store_urls_go_through_olmo_core_io(mix, tmp_path, monkeypatch, sleeps):
    """``s3://`` (likewise ``gs://``, ``r2://``) is read by ``olmo_core.io.get_file_size``/``get_bytes_range``;
    here those two read the local copies (no S3 endpoint offline), so the plumbing around them is what is tested:
    sizes, rows, retries of a flaky client, a missing object, a changed size seen by the prefetch."""
    from olmo_core import io as olmo_io

    def path_of(url):
        assert url.startswith("s3://ai2-llm/")
        return local(mix, OLMO_DATA + url[len("s3://ai2-llm/"):])

    flaky = {"n": 1}

    def get_bytes_range(url, start, n):
        if flaky["n"]:
            flaky["n"] -= 1
            raise ConnectionError("endpoint reset the connection")
        with open(path_of(url), "rb") as f:
            f.seek(start)
            return f.read(n)

    def get_file_size(url):
        if not path_of(url).is_file():
            raise FileNotFoundError(url)
        return path_of(url).stat().st_size

    monkeypatch.setattr(olmo_io, "get_file_size", get_file_size)
    monkeypatch.setattr(olmo_io, "get_bytes_range", get_bytes_range)
    reader = RemoteReader(RetryPolicy(max_retries=2, base_delay_s=0.001, sleep=sleeps.append))
    urls = mix[1][:6]
    files = TokenFiles(urls, U32, cache_dir=tmp_path, prefixes={OLMO_DATA: "s3://ai2-llm/"}, reader=reader,
                       progress=False)
    order = DataOrder(files, L, B, SEED)
    local_order = DataOrder(TokenFiles([local(mix, u) for u in urls], U32), L, B, SEED)
    assert np.array_equal(order.row_tokens(5), expected_row(mix, local_order, 5)) and len(sleeps) == 1
    with pytest.raises(DataError, match=r"^s3://ai2-llm/preprocessed/nope/part-0-00000\.npy: token file not found$"):
        TokenFiles(["s3://ai2-llm/preprocessed/nope/part-0-00000.npy"], U32, cache_dir=tmp_path, reader=reader)
    victim = local(mix, urls[2])
    original = victim.read_bytes()
    try:
        victim.write_bytes(original[:-4 * L])
        with pytest.raises(DataError, match=r"part-2-00000\.npy: remote file changed since its size was indexed"):
            prefetch_ranges(files, window_ranges(order, 0, order.rows_per_epoch), progress=False)
    finally:
        victim.write_bytes(original)


@pytest.fixture(scope="module")
def s3_endpoint(mix):
    """A local S3 endpoint (moto's server on 127.0.0.1) whose bucket ``ai2-llm`` holds the mix under the same keys
    as ``http://olmo-data.org/``; boto3 (under ``olmo_core.io``) finds it through ``AWS_ENDPOINT_URL_S3``."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    env = {"AWS_ENDPOINT_URL_S3": endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
           "AWS_DEFAULT_REGION": "us-east-1", "OLMO_NO_SSL": "1"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    s3 = boto3.client("s3", endpoint_url=endpoint)
    s3.create_bucket(Bucket="ai2-llm")
    for url in mix[1][:6]:
        s3.upload_file(str(local(mix, url)), "ai2-llm", url[len(OLMO_DATA):])
    from olmo_core import io as olmo_io

    olmo_io._get_s3_client.cache_clear()
    yield endpoint
    olmo_io._get_s3_client.cache_clear()
    for k, v in old.items():
        os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    server.stop()


@pytest.fixture
def r2_endpoint(s3_endpoint, tmp_path, monkeypatch):
    """moto's S3 server as a Cloudflare R2 endpoint: OLMo-core reads ``r2://`` with boto3 under the profile named by
    ``R2_PROFILE`` (here from a credentials file of its own) at ``R2_ENDPOINT_URL``."""
    from olmo_core import io as olmo_io

    creds = tmp_path / "aws-credentials"
    creds.write_text("[r2-test]\naws_access_key_id = r2\naws_secret_access_key = r2\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    monkeypatch.setenv("R2_PROFILE", "r2-test")
    monkeypatch.setenv("R2_ENDPOINT_URL", s3_endpoint)
    olmo_io._get_s3_client.cache_clear()
    yield s3_endpoint
    olmo_io._get_s3_client.cache_clear()


@pytest.fixture(scope="module")
def gcs_endpoint(mix):
    """A local Google Cloud Storage endpoint (``gcp-storage-emulator`` on 127.0.0.1, bound to a free port by the
    OS) whose bucket ``ai2-llm`` holds the mix under the same keys as ``http://olmo-data.org/``, uploaded with
    ``olmo_core.io.upload``; the GCS client under ``olmo_core.io`` finds it through ``STORAGE_EMULATOR_HOST``."""
    from gcp_storage_emulator.server import create_server
    from olmo_core import io as olmo_io

    server = create_server("127.0.0.1", 0, in_memory=True, default_bucket="ai2-llm")
    server.start()
    endpoint = "http://127.0.0.1:%d" % server._api._httpd.server_address[1]
    env = {"STORAGE_EMULATOR_HOST": endpoint, "NO_GCE_CHECK": "True"}  # no probe of a GCE metadata server
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    olmo_io._get_gcs_client.cache_clear()
    for url in mix[1][:6]:
        olmo_io.upload(local(mix, url), "gs://ai2-llm/" + url[len(OLMO_DATA):])
    yield endpoint
    olmo_io._get_gcs_client.cache_clear()
    for k, v in old.items():
        os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    server.stop()


@pytest.mark.parametrize("scheme", ["s3", "r2", "gs"])
def test_object_store_urls_against_a_local_endpoint(mix, scheme, request, tmp_path):
    """``s3://``, ``r2://`` and ``gs://`` token files through OLMo-core's own clients (boto3; google-cloud-storage)
    against local endpoints (moto's S3 server, also as R2; gcp-storage-emulator): the size index, rows equal to the
    local copies', a window prefetch of exactly the window's bytes, a missing object."""
    request.getfixturevalue({"s3": "s3_endpoint", "r2": "r2_endpoint", "gs": "gcs_endpoint"}[scheme])
    urls = mix[1][:6]
    files = TokenFiles(urls, U32, cache_dir=tmp_path, prefixes={OLMO_DATA: f"{scheme}://ai2-llm/"}, progress=False)
    assert all(files.remote) and files.paths[0].startswith(f"{scheme}://ai2-llm/preprocessed/")
    local_files = TokenFiles([local(mix, u) for u in urls], U32)
    assert np.array_equal(files.num_tokens, local_files.num_tokens)
    order = DataOrder(files, L, B, SEED, cache_dir=tmp_path)
    local_order = DataOrder(local_files, L, B, SEED)
    for q in (0, 7, order.rows_per_epoch - 1):
        assert np.array_equal(order.row_tokens(q), local_order.row_tokens(q))
    ranges = window_ranges(order, 0, 2 * B)
    stats = prefetch_ranges(files, ranges, threads=4, progress=False)
    assert stats.fetched_bytes == sum(total_bytes(r) for r in ranges.values())
    check_window(files, ranges)
    with pytest.raises(DataError, match=rf"^{scheme}://ai2-llm/preprocessed/nope\.npy: token file not found$"):
        TokenFiles([f"{scheme}://ai2-llm/preprocessed/nope.npy"], U32, cache_dir=tmp_path, progress=False)
