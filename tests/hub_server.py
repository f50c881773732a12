"""A writable HF Hub endpoint on 127.0.0.1 that records what ``huggingface_hub`` sends (``HF_ENDPOINT=<base>``).

Routes (the ones ``create_repo``, ``create_branch`` and ``upload_folder`` call; huggingface_hub 1.x):
``POST /api/repos/create`` (``private`` or ``visibility``), ``POST /api/<type>s/<repo>/branch/<branch>``,
``POST /api/validate-yaml``, ``POST /api/<type>s/<repo>/preupload/<rev>`` (``*.safetensors``, ``*.parquet``,
``*.npz`` answer ``lfs``, the rest ``regular``), ``POST [<type>s/]<repo>.git/info/lfs/objects/batch`` (``basic``
transfer to ``PUT /lfs/<oid>``) and ``POST /api/<type>s/<repo>/commit/<rev>`` (NDJSON: inline files and LFS
pointers). Every request but the LFS ``PUT`` (a pre-signed URL on the Hub) must carry ``Authorization: Bearer
<token>``; another token answers ``401``. The Xet upload path needs a CAS server: run the client with
``HF_HUB_DISABLE_XET=1``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, List, Tuple

LFS_SUFFIXES = (".safetensors", ".parquet", ".npz", ".bin")


class HubServer:
    """Repos as ``{(type, repo id): {"private": bool, "branches": {name: {path: bytes}}}}``; ``requests`` lists
    ``(method, path, headers (lower-case names), body)`` of every request. A context manager with ``base``."""

    def __init__(self, token: str):
        self.token = token
        self.repos: Dict[Tuple[str, str], dict] = {}
        self.lfs: Dict[str, bytes] = {}
        self.requests: List[tuple] = []
        self.lock = threading.Lock()

    def __enter__(self) -> "HubServer":
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, status: int, obj=None, headers: dict = ()):
                body = b"" if obj is None else json.dumps(obj).encode()
                self.send_response(status)
                for k, v in dict(headers).items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_PUT(self):
                self.do_POST()

            def do_GET(self):
                self.do_POST()

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                path = urllib.parse.urlparse(self.path).path
                with hub.lock:
                    hub.requests.append((self.command, path, {k.lower(): v for k, v in self.headers.items()}, body))
                if not path.startswith("/lfs/") and self.headers.get("Authorization") != f"Bearer {hub.token}":
                    return self._reply(401, {"error": "Invalid credentials in Authorization header"},
                                       {"X-Error-Message": "Invalid credentials in Authorization header"})
                parts = [urllib.parse.unquote(p) for p in path.strip("/").split("/")]
                with hub.lock:
                    return self._route(parts, body)

            def _route(self, parts, body):
                if parts == ["api", "repos", "create"]:
                    req = json.loads(body)
                    repo = f"{req['organization']}/{req['name']}" if req.get("organization") else req["name"]
                    key = (req.get("type") or "model", repo)
                    private = bool(req.get("private")) or req.get("visibility") == "private"
                    hub.repos.setdefault(key, {"private": private, "branches": {"main": {}}})
                    return self._reply(200, {"url": f"{hub.base}/{repo}", "name": repo})
                if parts == ["api", "validate-yaml"]:
                    return self._reply(200, {})
                if parts[0] == "lfs" and self.command == "PUT":
                    hub.lfs[parts[1]] = body
                    return self._reply(200, {})
                if parts[-4:] == ["info", "lfs", "objects", "batch"]:
                    objs = json.loads(body)["objects"]
                    return self._reply(200, {"transfer": "basic", "objects": [
                        {"oid": o["oid"], "size": o["size"],
                         "actions": {"upload": {"href": f"{hub.base}/lfs/{o['oid']}", "header": {}}}}
                        for o in objs]})
                if parts[0] == "api" and len(parts) >= 6:
                    kind, repo, action, rev = parts[1][:-1], "/".join(parts[2:4]), parts[4], "/".join(parts[5:])
                    r = hub.repos.get((kind, repo))
                    if r is None:
                        return self._reply(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
                    if action == "branch":
                        start = (json.loads(body) if body else {}).get("startingPoint") or "main"
                        if rev in r["branches"]:
                            return self._reply(409, {"error": "Reference already exists"})
                        r["branches"][rev] = dict(r["branches"][start])
                        return self._reply(200, {})
                    if action == "preupload":
                        files = json.loads(body)["files"]
                        return self._reply(200, {"files": [
                            {"path": f["path"], "uploadMode": "lfs" if f["path"].endswith(LFS_SUFFIXES)
                             else "regular", "shouldIgnore": False, "oid": None} for f in files]})
                    if action == "commit":
                        if rev not in r["branches"]:
                            return self._reply(404, {"error": "Revision not found"},
                                               {"X-Error-Code": "RevisionNotFound"})
                        tree = r["branches"][rev]
                        for line in body.decode().splitlines():
                            rec = json.loads(line)
                            if rec["key"] == "file":
                                tree[rec["value"]["path"]] = base64.b64decode(rec["value"]["content"])
                            elif rec["key"] == "lfsFile":
                                tree[rec["value"]["path"]] = hub.lfs[rec["value"]["oid"]]
                        oid = hashlib.sha1(repr(sorted((k, hashlib.sha1(v).hexdigest()) for k, v in tree.items()))
                                           .encode()).hexdigest()
                        return self._reply(200, {"commitUrl": f"{hub.base}/{repo}/commit/{oid}", "commitOid": oid})
                return self._reply(404, {"error": f"no route {'/'.join(parts)}"}, {"X-Error-Code": "EntryNotFound"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
