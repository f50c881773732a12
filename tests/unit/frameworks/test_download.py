"""Checkpoint download against a real local HTTP server (``ThreadingHTTPServer`` in a thread, Range support).

The server serves a tmp dir of fake checkpoints (random bytes, real file names) and can be told to fail a path's
next requests: answer a status, drop the connection after N body bytes (clean close or TCP reset), or ignore
the Range header. It records every request's path and Range header.
"""

from __future__ import annotations

import logging
import random
import re
import socket
import struct
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pretrain_exp.core.errors import CheckpointError
from pretrain_exp.frameworks import download as dl
from pretrain_exp.frameworks.download import (
    MARKER,
    backoff_delay,
    download_checkpoint,
    download_file,
    download_olmo2_checkpoint,
    download_olmo_core_checkpoint,
)

#: ``model_and_optim/.metadata`` is opaque here (OLMo-core reads it); the shards are found by probing
DCP_METADATA = b"torch DCP metadata (opaque to the downloader)"
DISTCP = ["__0_0.distcp", "__0_1.distcp", "__1_0.distcp", "__1_1.distcp"]


class Server:
    """State of the fake server: files under ``root``, recorded requests, queued faults per path."""

    def __init__(self, root: Path):
        self.root = root
        self.requests: list[tuple[str, str | None]] = []  #: (path, Range header) of every GET
        self.faults: dict[str, list[tuple]] = {}
        self.lock = threading.Lock()
        self.base = ""

    def fault(self, path: str, *actions: tuple) -> None:
        """Queue actions for the next requests of ``path``: ``("status", code)``, ``("drop", n)``,
        ``("reset", n)``, ``("ignore_range",)``, ``("stall", seconds)`` (no answer before then)."""
        self.faults.setdefault(path, []).extend(actions)

    def paths(self, suffix: str = "") -> list[str]:
        return [p for p, _ in self.requests if p.endswith(suffix)]


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # keep test output clean
        pass

    def _empty(self, status: int, headers: dict | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        state: Server = self.server.state
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        rng = self.headers.get("Range")
        with state.lock:
            state.requests.append((path, rng))
            queue = state.faults.get(path)
            action = queue.pop(0) if queue else ("none",)
        if action[0] == "status":
            return self._empty(action[1])
        if action[0] == "stall":  # answer nothing for a while, then as usual
            time.sleep(action[1])
        file = state.root / path.lstrip("/")
        if not file.is_file():
            return self._empty(404)
        data = file.read_bytes()
        start = 0
        if rng and action[0] != "ignore_range":
            start = int(re.fullmatch(r"bytes=(\d+)-", rng).group(1))
            if start >= len(data):
                return self._empty(416, {"Content-Range": f"bytes */{len(data)}"})
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        body = data[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if action[0] in ("drop", "reset"):
            self.wfile.write(body[: action[1]])
            self.wfile.flush()
            if action[0] == "reset":  # abortive close: the client sees ECONNRESET, not EOF
                time.sleep(0.2)
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            return
        self.wfile.write(body)


pytestmark = pytest.mark.usefixtures("no_proxy")


@pytest.fixture
def server(tmp_path):
    state = Server(tmp_path / "srv")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    httpd.state = state
    state.base = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield state
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)


def put(root: Path, rel: str, n: int, seed: int) -> bytes:
    data = random.Random(seed).randbytes(n)
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_bytes(data)
    return data


OLMO2_STEP, CORE_STEP = 1000, 2000
OLMO2_DIR = f"peteish/step{OLMO2_STEP}-unsharded"
CORE_DIR = f"olmo3/stage2/step{CORE_STEP}"


@pytest.fixture
def olmo2(server):
    """An OLMo-2 checkpoint with model.safetensors and optim.pt (so both fallbacks are exercised)."""
    root = server.root / OLMO2_DIR
    put(root, "config.yaml", 2_000, 1)
    put(root, "train.pt", 9_000, 2)
    put(root, "model.safetensors", 300_000, 3)
    put(root, "optim.pt", 200_000, 4)
    return f"{server.base}/peteish/", root


@pytest.fixture
def olmo_core(server):
    root = server.root / CORE_DIR
    put(root, ".metadata.json", 40, 10)
    put(root, "config.json", 3_000, 11)
    put(root, "data_paths.txt", 500, 12)
    put(root, "train/rank0.pt", 8_000, 13)
    put(root, "train/rank1.pt", 8_000, 14)
    (root / "model_and_optim").mkdir()
    (root / "model_and_optim" / ".metadata").write_bytes(DCP_METADATA)
    for i, name in enumerate(DISTCP):
        put(root, f"model_and_optim/{name}", 120_000 + 1_000 * i, 20 + i)
    return f"{server.base}/olmo3/stage2", root


@pytest.fixture
def sleeps():
    return []


@pytest.fixture
def kw(sleeps):
    return dict(max_retries=3, base_delay_s=0.01, sleep=sleeps.append, timeout_s=5.0)


def files_under(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def assert_same_tree(src: Path, got: Path) -> None:
    local = files_under(got)
    assert local.pop(MARKER, None) is not None, "no completion marker"
    assert not [k for k in local if k.endswith(".part")]
    assert local == files_under(src)


def test_olmo2_full_download(server, olmo2, tmp_path, kw, sleeps):
    base, src = olmo2
    path = download_olmo2_checkpoint(base, OLMO2_STEP, tmp_path / "dest", **kw)
    assert path == tmp_path / "dest" / f"step{OLMO2_STEP}-unsharded"
    assert_same_tree(src, path)
    names = [p.rsplit("/", 1)[1] for p in server.paths()]
    assert names == ["config.yaml", "train.pt", "model.safetensors", "optim.safetensors", "optim.pt"]
    assert all(r is None for _, r in server.requests) and sleeps == []  # no Range, a 404 is not retried


def test_olmo2_model_pt_fallback(server, olmo2, tmp_path, kw):
    base, src = olmo2
    (src / "model.safetensors").rename(src / "model.pt")
    path = download_olmo2_checkpoint(base, OLMO2_STEP, tmp_path / "dest", **kw)
    assert_same_tree(src, path)
    assert (path / "model.pt").is_file() and not (path / "model.safetensors").exists()


def test_olmo_core_full_download(server, olmo_core, tmp_path, kw, sleeps):
    base, src = olmo_core
    path = download_olmo_core_checkpoint(base, CORE_STEP, tmp_path / "dest", **kw)
    assert path == tmp_path / "dest" / f"step{CORE_STEP}"
    assert_same_tree(src, path)
    # every rank's files are probed until a 404 (incl. __0_1/__1_1, which probing __<r>_0 alone would miss)
    probed = [p.rsplit("/", 1)[1] for p in server.paths(".distcp")]
    assert probed == ["__0_0.distcp", "__0_1.distcp", "__0_2.distcp", "__1_0.distcp", "__1_1.distcp",
                      "__1_2.distcp", "__2_0.distcp"]
    assert server.paths("train/rank2.pt") == [f"/{CORE_DIR}/train/rank2.pt"]  # the probe that ended the ranks
    assert sleeps == []


def test_olmo_core_train_ranks_limit(server, olmo_core, tmp_path, kw):
    base, _ = olmo_core
    path = download_olmo_core_checkpoint(base, CORE_STEP, tmp_path / "dest", train_ranks=1, **kw)
    assert (path / "train" / "rank0.pt").is_file() and not (path / "train" / "rank1.pt").exists()
    assert server.paths("rank1.pt") == []


@pytest.mark.parametrize("layout", ["olmo2", "olmo_core"])
def test_settings_only_fetches_config_and_trainer_state(server, olmo2, olmo_core, tmp_path, kw, layout):
    """What a run's settings are read from, before the weights are needed: config and trainer state only; the full
    download later keeps them and fetches the rest."""
    (base, src), step = (olmo2, OLMO2_STEP) if layout == "olmo2" else (olmo_core, CORE_STEP)
    path = download_checkpoint(layout, base, step, tmp_path / "dest", settings_only=True, **kw)
    want = ["config.yaml", "train.pt"] if layout == "olmo2" else ["config.json", "train/rank0.pt"]
    assert path == tmp_path / "dest" / src.name
    assert sorted(files_under(path)) == sorted(want)
    assert [p.rsplit(src.name + "/", 1)[1] for p in server.paths()] == want
    assert download_checkpoint(layout, base, step, tmp_path / "dest", **kw) == path
    assert_same_tree(src, path)
    assert [p.rsplit(src.name + "/", 1)[1] for p in server.paths()].count(want[0]) == 1  # not fetched again


@pytest.mark.parametrize("how", ["drop", "reset"])
def test_dropped_connection_resumes(server, olmo2, tmp_path, kw, sleeps, how):
    base, src = olmo2
    n = 100_000
    server.fault(f"/{OLMO2_DIR}/model.safetensors", (how, n))
    path = download_olmo2_checkpoint(base, OLMO2_STEP, tmp_path / "dest", **kw)
    assert_same_tree(src, path)
    model = [r for p, r in server.requests if p.endswith("model.safetensors")]
    assert len(model) == 2 and model[0] is None
    start = int(re.fullmatch(r"bytes=(\d+)-", model[1]).group(1))  # the retry continued with a Range request
    assert (start == n) if how == "drop" else (0 < start <= n)
    assert len(sleeps) == 1


def test_part_file_from_earlier_run_resumes(server, olmo2, tmp_path, kw):
    base, src = olmo2
    ckpt = tmp_path / "dest" / f"step{OLMO2_STEP}-unsharded"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors.part").write_bytes((src / "model.safetensors").read_bytes()[:123_456])
    download_olmo2_checkpoint(base, OLMO2_STEP, tmp_path / "dest", **kw)
    assert_same_tree(src, ckpt)
    assert [r for p, r in server.requests if p.endswith("model.safetensors")] == ["bytes=123456-"]


def test_server_ignoring_range_restarts_from_zero(server, olmo2, tmp_path, kw):
    base, src = olmo2
    ckpt = tmp_path / "dest" / f"step{OLMO2_STEP}-unsharded"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors.part").write_bytes(b"\0" * 5_000)  # wrong bytes: must not survive
    server.fault(f"/{OLMO2_DIR}/model.safetensors", ("ignore_range",))
    download_olmo2_checkpoint(base, OLMO2_STEP, tmp_path / "dest", **kw)
    assert_same_tree(src, ckpt)


def test_complete_part_file_gets_416_and_is_kept(server, olmo2, tmp_path, kw):
    base, src = olmo2
    ckpt = tmp_path / "dest" / f"step{OLMO2_STEP}-unsharded"
    ckpt.mkdir(parents=True)
    (ckpt / "train.pt.part").write_bytes((src / "train.pt").read_bytes())
    download_olmo2_checkpoint(base, OLMO2_STEP, tmp_path / "dest", **kw)
    assert_same_tree(src, ckpt)
    assert [r for p, r in server.requests if p.endswith("train.pt")] == ["bytes=9000-"]  # answered 416


@pytest.mark.parametrize("missing", ["config.yaml", "train.pt"])
def test_404_on_required_file(server, olmo2, tmp_path, kw, sleeps, missing):
    base, src = olmo2
    (src / missing).unlink()
    with pytest.raises(CheckpointError, match=re.escape(f"{server.base}/{OLMO2_DIR}/{missing}")) as err:
        download_olmo2_checkpoint(base, OLMO2_STEP, tmp_path / "dest", **kw)
    assert isinstance(err.value, dl.RemoteFileNotFound) and "404" in str(err.value)
    ckpt = tmp_path / "dest" / f"step{OLMO2_STEP}-unsharded"
    assert not (ckpt / missing).exists() and not (ckpt / MARKER).exists()
    assert [p.name for p in ckpt.glob(f"{missing}*")] in ([], [f"{missing}.part"])
    assert sleeps == [] and len(server.paths(missing)) == 1


def test_404_on_both_model_files_names_both_urls(server, olmo2, tmp_path, kw):
    base, src = olmo2
    (src / "model.safetensors").unlink()
    with pytest.raises(CheckpointError) as err:
        download_olmo2_checkpoint(base, OLMO2_STEP, tmp_path / "dest", **kw)
    for name in ("model.safetensors", "model.pt"):
        assert f"{server.base}/{OLMO2_DIR}/{name}" in str(err.value)
    assert not list((tmp_path / "dest").rglob("model*"))


def test_404_on_the_first_shard(server, olmo_core, tmp_path, kw):
    base, src = olmo_core
    (src / "model_and_optim" / "__0_0.distcp").unlink()
    with pytest.raises(CheckpointError, match=re.escape(f"{server.base}/{CORE_DIR}/model_and_optim/__0_0.distcp")):
        download_olmo_core_checkpoint(base, CORE_STEP, tmp_path / "dest", **kw)
    assert not (tmp_path / "dest" / f"step{CORE_STEP}" / "model_and_optim" / "__0_0.distcp").exists()


def test_500_twice_then_ok_retries_with_growing_sleeps(server, olmo2, tmp_path, kw, sleeps):
    base, src = olmo2
    server.fault(f"/{OLMO2_DIR}/config.yaml", ("status", 500), ("status", 503))
    path = download_olmo2_checkpoint(base, OLMO2_STEP, tmp_path / "dest", **kw)
    assert_same_tree(src, path)
    assert len(server.paths("config.yaml")) == 3
    assert len(sleeps) == 2 and sleeps[0] < sleeps[1]
    assert 0.01 <= sleeps[0] <= 0.015 and 0.02 <= sleeps[1] <= 0.03  # base * 2**k plus <= 50 % jitter


def test_retries_exhausted(server, olmo2, tmp_path, kw, sleeps):
    base, _ = olmo2
    server.fault(f"/{OLMO2_DIR}/config.yaml", *[("status", 502)] * 10)
    with pytest.raises(CheckpointError, match=re.escape(f"{server.base}/{OLMO2_DIR}/config.yaml")) as err:
        download_olmo2_checkpoint(base, OLMO2_STEP, tmp_path / "dest", **kw)
    assert "4 consecutive attempts" in str(err.value) and "502" in str(err.value)
    assert len(sleeps) == 3 and sleeps == sorted(sleeps)
    assert not (tmp_path / "dest" / f"step{OLMO2_STEP}-unsharded" / "config.yaml").exists()


def test_connection_refused_is_retried(tmp_path, kw, sleeps):
    with socket.socket() as s:  # a port bound and not listening (held, so nobody else listens there)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with pytest.raises(CheckpointError, match=f"127.0.0.1:{port}/x.bin"):
            download_file(f"http://127.0.0.1:{port}/x.bin", tmp_path / "x.bin", **kw)
    assert len(sleeps) == 3


@pytest.mark.parametrize("layout", ["olmo2", "olmo_core"])
def test_second_call_sends_no_request(server, olmo2, olmo_core, tmp_path, kw, layout):
    fn, (base, src), step = {
        "olmo2": (download_olmo2_checkpoint, olmo2, OLMO2_STEP),
        "olmo_core": (download_olmo_core_checkpoint, olmo_core, CORE_STEP),
    }[layout]
    first = fn(base, step, tmp_path / "dest", **kw)
    server.requests.clear()
    assert fn(base, step, tmp_path / "dest", **kw) == first
    assert server.requests == []
    assert_same_tree(src, first)


def test_download_file_skips_existing_file(server, olmo2, tmp_path, kw):
    base, src = olmo2
    url = f"{server.base}/{OLMO2_DIR}/train.pt"
    dest = download_file(url, tmp_path / "t" / "train.pt", **kw)
    assert dest.read_bytes() == (src / "train.pt").read_bytes() and not dest.with_name("train.pt.part").exists()
    server.requests.clear()
    assert download_file(url, dest, **kw) == dest and server.requests == []


def test_lost_marker_file_refetches_only_what_is_missing(server, olmo2, tmp_path, kw):
    base, src = olmo2
    path = download_olmo2_checkpoint(base, OLMO2_STEP, tmp_path / "dest", **kw)
    (path / MARKER).unlink()
    (path / "train.pt").unlink()
    server.requests.clear()
    download_olmo2_checkpoint(base, OLMO2_STEP, tmp_path / "dest", **kw)
    assert [p.rsplit("/", 1)[1] for p in server.paths()] == ["train.pt"]
    assert_same_tree(src, path)


def test_optional_optim_missing_still_succeeds(server, olmo2, tmp_path, kw, caplog):
    base, src = olmo2
    (src / "optim.pt").unlink()
    with caplog.at_level(logging.WARNING, logger=dl.__name__):
        path = download_olmo2_checkpoint(base, OLMO2_STEP, tmp_path / "dest", **kw)
    assert "optimizer state not found" in caplog.text and f"{server.base}/{OLMO2_DIR}/optim.pt" in caplog.text
    assert_same_tree(src, path)
    assert not list(path.glob("optim*"))
    server.requests.clear()
    download_olmo2_checkpoint(base, OLMO2_STEP, tmp_path / "dest", **kw)  # cached: the 404s are not asked again
    assert server.requests == []


def test_backoff_delay_grows_and_is_capped():
    for _ in range(20):
        d = [backoff_delay(k, 1.0) for k in range(1, 10)]
        assert all(1.0 * 2 ** (k - 1) <= d[k - 1] <= 1.5 * 2 ** (k - 1) for k in range(1, 7))
        assert d[:6] == sorted(d[:6]) and all(60.0 <= x <= 90.0 for x in d[6:])


def test_cli(server, olmo2, olmo_core, tmp_path, capsys):
    base, src = olmo2
    assert dl.main(["olmo2", base, str(OLMO2_STEP), str(tmp_path / "a"), "--base-delay", "0.01"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "a" / f"step{OLMO2_STEP}-unsharded")
    base, _ = olmo_core
    assert dl.main(["olmo_core", base, "7", str(tmp_path / "b"), "--max-retries", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and f"{server.base}/olmo3/stage2/step7/.metadata.json" in err


def test_cli_train_ranks_and_timeout(server, olmo_core, tmp_path, capsys):
    """``--train-ranks N`` fetches ``train/rank0..N-1.pt`` only, each required; ``--timeout`` is the socket timeout:
    an answer slower than it fails the download (no retry left), one within it arrives."""
    base, src = olmo_core
    args = ["olmo_core", base, str(CORE_STEP)]
    assert dl.main([*args, str(tmp_path / "one"), "--train-ranks", "1"]) == 0
    ckpt = Path(capsys.readouterr().out.strip())
    assert sorted(p.name for p in (ckpt / "train").iterdir()) == ["rank0.pt"]
    assert (ckpt / "train" / "rank0.pt").read_bytes() == (src / "train" / "rank0.pt").read_bytes()
    assert not any(p.endswith("rank1.pt") for p in server.paths())
    assert dl.main([*args, str(tmp_path / "three"), "--train-ranks", "3", "--max-retries", "0"]) == 2
    assert "train/rank2.pt" in capsys.readouterr().err
    assert dl.main([*args, str(tmp_path / "all")]) == 0
    ckpt = Path(capsys.readouterr().out.strip())
    assert sorted(p.name for p in (ckpt / "train").iterdir()) == ["rank0.pt", "rank1.pt"]

    cfg = f"/{CORE_DIR}/config.json"
    server.fault(cfg, ("stall", 3.0))
    assert dl.main([*args, str(tmp_path / "slow"), "--timeout", "0.5", "--max-retries", "0"]) == 2
    err = capsys.readouterr().err
    assert "timed out" in err and "config.json" in err, err
    server.fault(cfg, ("stall", 1.0))
    assert dl.main([*args, str(tmp_path / "slow"), "--timeout", "30", "--max-retries", "0"]) == 0
