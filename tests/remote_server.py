"""A Range-capable HTTP file server on 127.0.0.1 for offline tests of remote token files, and a scaled-down
"official" OLMo-2 data mix laid out under the real ``http://olmo-data.org/preprocessed/...`` URL paths.

:class:`RangeServer` serves the files under ``root`` with ``HEAD`` and ``GET`` (``Range: bytes=a-b`` or
``bytes=a-`` answered ``206`` with ``Content-Range``; no Range answered ``200``), HTTP/1.1 keep-alive, one thread
per connection. It counts requests and body bytes served, and can inject per-request latency and, per path, the
next answers: a status code (``("status", 503)``) or a connection dropped after ``n`` body bytes
(``("drop", n)``). A changed remote file is a test rewriting the file under ``root``.

Use::

    with RangeServer(root) as srv:
        prefixes = {OLMO_DATA: srv.base + "/"}          # the data.path_prefixes a test run uses
        ...
        srv.bytes_served, srv.requests

:func:`build_mix` writes the mix (real tokens of the project's Shakespeare corpus when the token cache has them,
else seeded random tokens) and returns its URLs in config order.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

OLMO_DATA = "http://olmo-data.org/"  #: the prefix of OLMo's official token-file URLs

#: (folder under ``preprocessed/``, files) of the scaled-down mix: the sources of OLMo-2's stage-1 config
MIX_SOURCES: Sequence[Tuple[str, int]] = (
    ("dclm/text_openhermes_reddit_eli5_vs_rw_v2_bigram_200k_train/allenai/dolma2-tokenizer", 24),
    ("starcoder/v1-decon-100_to_20k-2star-top_token_030/allenai/dolma2-tokenizer", 8),
    ("proof-pile-2/v0_decontaminated/algebraic-stack/train/allenai/dolma2-tokenizer", 4),
    ("proof-pile-2/v0_decontaminated/arxiv/train/allenai/dolma2-tokenizer", 4),
    ("proof-pile-2/v0_decontaminated/open-web-math/train/allenai/dolma2-tokenizer", 4),
    ("pes2o/allenai/dolma2-tokenizer", 4),
    ("olmo-mix/danyh-compiled-v1_7/documents/wiki/allenai/dolma2-tokenizer", 2),
)


class RangeServer:
    """A threaded HTTP server of the files under ``root`` (module docstring); a context manager.

    :param root: served folder; URL path ``/a/b.npy`` is ``root/a/b.npy``.
    :param latency_s: sleep before answering each request, seconds.
    """

    def __init__(self, root: str | Path, latency_s: float = 0.0):
        self.root = Path(root)
        self.latency_s = float(latency_s)
        self.lock = threading.Lock()
        self.requests: List[Tuple[str, str, Optional[str]]] = []  #: (method, path, Range header) of each request
        self.bytes_served = 0  #: body bytes written (HEAD: 0)
        self.faults: Dict[str, List[tuple]] = {}
        self.httpd: Optional[ThreadingHTTPServer] = None
        self.base = ""  #: ``http://127.0.0.1:<port>``

    def fault(self, path: str, *actions: tuple) -> None:
        """Queue answers for the next requests of URL path ``path`` (``/preprocessed/...``):
        ``("status", code)`` or ``("drop", n)`` (send headers and ``n`` body bytes, then close)."""
        with self.lock:
            self.faults.setdefault(path, []).extend(actions)

    def reset_counts(self) -> None:
        """Forget the recorded requests and bytes served."""
        with self.lock:
            self.requests.clear()
            self.bytes_served = 0

    def count(self, method: Optional[str] = None) -> int:
        """Requests recorded, of ``method`` only when given."""
        with self.lock:
            return sum(1 for m, _, _ in self.requests if method is None or m == method)

    def start(self) -> "RangeServer":
        ThreadingHTTPServer.request_queue_size = 256
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.state = self
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self._thread.join(5)
            self.httpd = None

    def __enter__(self) -> "RangeServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed-ACK stall per answer

    def log_message(self, *args):
        pass

    def _empty(self, status: int, headers: Optional[dict] = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_HEAD(self):
        self._serve(head=True)

    def do_GET(self):
        self._serve(head=False)

    def _serve(self, head: bool) -> None:
        state: RangeServer = self.server.state
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        rng = self.headers.get("Range")
        with state.lock:
            state.requests.append(("HEAD" if head else "GET", path, rng))
            queue = state.faults.get(path)
            action = queue.pop(0) if queue else ("none",)
        if state.latency_s:
            time.sleep(state.latency_s)
        if action[0] == "status":
            return self._empty(action[1])
        file = state.root / path.lstrip("/")
        if ".." in path.split("/") or not file.is_file():
            return self._empty(404)
        size = file.stat().st_size
        start, end = 0, size
        if rng:
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
            if not m:
                return self._empty(416, {"Content-Range": f"bytes */{size}"})
            start = int(m.group(1))
            end = min(size, int(m.group(2)) + 1) if m.group(2) else size
            if start >= size or end <= start:
                return self._empty(416, {"Content-Range": f"bytes */{size}"})
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        else:
            self.send_response(200)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(end - start))
        self.end_headers()
        if head:
            return
        with open(file, "rb") as f:
            f.seek(start)
            body = f.read(end - start)
        if action[0] == "drop":
            body = body[: action[1]]
            self.close_connection = True
        self.wfile.write(body)
        with state.lock:
            state.bytes_served += len(body)
        if action[0] == "drop":
            self.wfile.flush()
            self.connection.shutdown(2)


def _real_tokens(cache_dir: Optional[Path]) -> Optional[np.ndarray]:
    """Tokens of the project's tokenized Shakespeare corpus if the token cache holds it, else ``None``."""
    if cache_dir is None:
        return None
    for f in sorted(Path(cache_dir).glob("tokens/shakespeare-*/part-00000.npy")):
        import json

        meta = f.with_name("tokens.json")
        try:
            dtype = np.dtype(json.loads(meta.read_text()).get("dtype", "uint16"))
        except (OSError, ValueError, TypeError):
            continue
        arr = np.fromfile(f, dtype=dtype.newbyteorder("<"))
        if arr.size > 100_000:
            return arr.astype(np.uint32)
    return None


def build_mix(root: str | Path, tokens_per_file: Sequence[int] | int = 3000, cache_dir: Optional[Path] = None,
              seed: int = 0, sources: Sequence[Tuple[str, int]] = MIX_SOURCES) -> List[str]:
    """Write the scaled-down official mix under ``root/preprocessed/...`` as ``uint32`` token files.

    :param tokens_per_file: tokens of every file, or one count per file (file sizes differ as in the real mix).
    :param cache_dir: the project cache; its tokenized Shakespeare corpus supplies real tokens when present.
    :returns: the ``http://olmo-data.org/preprocessed/...`` URLs of the files, in config order.
    """
    root = Path(root)
    rels = [f"preprocessed/{folder}/part-{k}-00000.npy" for folder, n in sources for k in range(n)]
    counts = [int(tokens_per_file)] * len(rels) if np.ndim(tokens_per_file) == 0 else list(tokens_per_file)
    real = _real_tokens(cache_dir)
    rng = np.random.default_rng(seed)
    pos = 0
    for rel, n in zip(rels, counts):
        if real is not None and real.size >= n:
            if pos + n > real.size:
                pos = 0
            toks, pos = real[pos:pos + n], pos + n
        else:
            toks = rng.integers(0, 100_278, size=n, dtype=np.uint32)
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        toks.astype("<u4").tofile(root / rel)
    return [OLMO_DATA + rel for rel in rels]


def main(argv: Optional[Sequence[str]] = None) -> None:
    """``python -m tests.remote_server ROOT [--latency-ms MS]``: serve ``ROOT`` in this process (its own GIL, for
    benchmarks); prints ``<base url>`` on the first line, then, when stdin closes, ``<requests> <bytes served>``."""
    import argparse
    import sys

    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--latency-ms", type=float, default=0.0)
    args = ap.parse_args(argv)
    with RangeServer(args.root, latency_s=args.latency_ms / 1e3) as srv:
        print(srv.base, flush=True)
        sys.stdin.read()
        print(srv.count(), srv.bytes_served, flush=True)


if __name__ == "__main__":
    main()
