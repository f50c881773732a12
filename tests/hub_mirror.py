"""A read-only HF Hub endpoint on 127.0.0.1 (the few routes ``huggingface_hub.snapshot_download`` calls), so tests
fill an HF cache with the Hub library's own download code (``HF_ENDPOINT=<base>``) and then run offline.

Routes: ``GET /api/models/<repo>/revision/<rev>`` (model info: ``id``, ``sha``, ``siblings``),
``GET /api/models/<repo>/tree/<rev>`` (the file listing), ``HEAD``/``GET /<repo>/resolve/<rev>/<file>`` (a file,
with ``X-Repo-Commit``, ``ETag`` and ``Content-Length``). A revision is a name given to :meth:`HubMirror.add` or its
commit hash (the sha1 of the folder's file hashes); anything else answers ``404`` with the Hub's
``X-Error-Code`` (``RepoNotFound`` / ``RevisionNotFound`` / ``EntryNotFound``), which the library maps to its errors.
"""

from __future__ import annotations

import hashlib
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, Tuple


class HubMirror:
    """Serves model repos from local folders (module docstring); a context manager with ``base`` (the endpoint)."""

    def __init__(self):
        self.repos: Dict[str, Dict[str, Tuple[str, Path]]] = {}  #: repo -> revision -> (commit, folder)
        self.requests = []

    def add(self, repo_id: str, revision: str, folder: Path) -> str:
        """Serve ``folder``'s files as ``repo_id`` at ``revision``; returns the commit hash."""
        h = hashlib.sha1()
        for f in sorted(Path(folder).rglob("*")):
            if f.is_file():
                h.update(f"{f.relative_to(folder)}:{hashlib.sha1(f.read_bytes()).hexdigest()}".encode())
        commit = h.hexdigest()
        revs = self.repos.setdefault(repo_id, {})
        revs[revision] = revs[commit] = (commit, Path(folder))
        return commit

    def __enter__(self) -> "HubMirror":
        mirror = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self._answer(head=True)

            def do_GET(self):
                self._answer(head=False)

            def _send(self, status: int, body: bytes = b"", headers: dict = (), head: bool = False):
                self.send_response(status)
                for k, v in dict(headers).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _json(self, obj, head: bool):
                self._send(200, json.dumps(obj).encode(), {"Content-Type": "application/json"}, head)

            def _lookup(self, repo: str, rev: str):
                if repo not in mirror.repos:
                    return None, "RepoNotFound"
                if rev not in mirror.repos[repo]:
                    return None, "RevisionNotFound"
                return mirror.repos[repo][rev], None

            def _answer(self, head: bool):
                path = urllib.parse.urlparse(self.path).path
                mirror.requests.append((self.command, path))
                parts = [urllib.parse.unquote(p) for p in path.strip("/").split("/")]
                if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] in ("revision", "tree"):
                    repo, kind, rev = "/".join(parts[2:4]), parts[4], parts[5]
                    found, err = self._lookup(repo, rev)
                    if err:
                        return self._send(404, b"{}", {"X-Error-Code": err}, head)
                    commit, folder = found
                    files = sorted(f for f in folder.rglob("*") if f.is_file())
                    if kind == "revision":
                        return self._json({"id": repo, "modelId": repo, "sha": commit, "private": False,
                                           "siblings": [{"rfilename": str(f.relative_to(folder))} for f in files]},
                                          head)
                    return self._json([{"type": "file", "path": str(f.relative_to(folder)), "size": f.stat().st_size,
                                        "oid": hashlib.sha1(f.read_bytes()).hexdigest()} for f in files], head)
                if len(parts) >= 5 and parts[2] == "resolve":
                    repo, rev, name = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
                    found, err = self._lookup(repo, rev)
                    if err:
                        return self._send(404, b"", {"X-Error-Code": err}, head)
                    commit, folder = found
                    f = folder / name
                    if not f.is_file():
                        return self._send(404, b"", {"X-Error-Code": "EntryNotFound"}, head)
                    body = f.read_bytes()
                    return self._send(200, body, {"X-Repo-Commit": commit,
                                                  "ETag": f'"{hashlib.sha1(body).hexdigest()}"'}, head)
                self._send(404, b"", {"X-Error-Code": "EntryNotFound"}, head)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
