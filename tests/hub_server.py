"""A writable HF Hub endpoint on 127.0.0.1 that records what ``huggingface_hub`` sends (``HF_ENDPOINT=<base>``), with
the Hub API's answers for existing repos, branches and files.

Routes (the ones ``create_repo``, ``create_branch``, ``upload_folder`` and ``repo_info`` call; huggingface_hub 1.x):

- ``POST /api/repos/create`` (``private`` or ``visibility``): ``200 {"url", "name"}`` for a new repo, holding one
  empty branch ``main``; ``409 {"error": "You already created this <type> repo", "url"}`` for an existing one, which
  is left as it is (its visibility too). ``create_repo(exist_ok=True)`` accepts the ``409``.
- ``POST /api/<type>s/<repo>/branch/<branch>`` (optional ``startingPoint``, default ``main``): a copy of the starting
  branch; ``409 "Reference already exists"`` for an existing branch (``create_branch(exist_ok=True)`` accepts it),
  ``404 RevisionNotFound`` for an unknown starting point, ``404 RepoNotFound`` for an unknown repo.
- ``GET /api/<type>s/<repo>[/revision/<rev>]`` (``repo_info``; default ``main``): ``id``, ``sha`` (the branch
  head), ``private``, ``siblings``.
- ``POST /api/validate-yaml``.
- ``POST /api/<type>s/<repo>/preupload/<rev>``: ``*.safetensors``, ``*.parquet``, ``*.npz``, ``*.bin`` answer
  ``lfs``, the rest ``regular``; a file already on the branch carries its ``oid`` (git blob sha1 of a regular
  file, sha256 of an LFS file's content), from which the library drops unchanged files from the commit, and makes
  no commit at all when nothing changed.
- ``POST [<type>s/]<repo>.git/info/lfs/objects/batch`` (the LFS batch API, ``basic`` transfer): an ``upload``
  action to ``PUT /lfs/<oid>`` for an object the store lacks, no action for one it holds (the client skips it).
- ``POST /api/<type>s/<repo>/commit/<rev>`` (NDJSON: inline files and LFS pointers): ``404 RevisionNotFound`` for an
  unknown branch, ``422`` for an LFS pointer to an object never uploaded; each accepted commit is appended to
  :attr:`HubServer.commits`.

Every request but the LFS ``PUT`` (a pre-signed URL on the Hub) must carry ``Authorization: Bearer <token>``;
another token answers ``401``.

Not served: the Xet storage path. With ``hf_xet`` installed (a dependency of huggingface_hub 1.x) the library
uploads every file through Xet and never calls the LFS batch API: it asks ``/api/<type>s/<repo>/xet-write-token/
<rev>`` for a CAS server and ``hf_xet`` sends that server content-defined chunks packed in binary xorbs and shards
(LZ4-compressed, merkle-hashed); serving them, and telling whether the bytes that arrived are the file's, would
take a reimplementation of the Xet CAS format. The client runs with ``HF_HUB_DISABLE_XET=1``, the library's own
switch to its LFS path (the upload path of huggingface_hub without ``hf_xet``).
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


def file_oid(path: str, data: bytes) -> str:
    """The ``oid`` the Hub's preupload answer gives a stored file: sha256 of an LFS file's content, else the git
    blob sha1 (``git hash-object``)."""
    if path.endswith(LFS_SUFFIXES):
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def tree_sha(tree: Dict[str, bytes]) -> str:
    """A commit id for a branch's files (40 hex digits; equal trees give equal ids)."""
    return hashlib.sha1(repr(sorted((k, hashlib.sha1(v).hexdigest()) for k, v in tree.items())).encode()).hexdigest()


class HubServer:
    """Repos as ``{(type, repo id): {"private": bool, "branches": {name: {path: bytes}}}}``; ``requests`` lists
    ``(method, path, headers (lower-case names), body)`` of every request, ``commits`` ``(type, repo id, branch)``
    of every accepted commit. A context manager with ``base``."""

    def __init__(self, token: str):
        self.token = token
        self.repos: Dict[Tuple[str, str], dict] = {}
        self.lfs: Dict[str, bytes] = {}
        self.requests: List[tuple] = []
        self.commits: List[Tuple[str, str, str]] = []
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

            def _error(self, status: int, message: str, code: str = ""):
                return self._reply(status, {"error": message},
                                   {"X-Error-Message": message} | ({"X-Error-Code": code} if code else {}))

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
                    return self._error(401, "Invalid credentials in Authorization header")
                parts = [urllib.parse.unquote(p) for p in path.strip("/").split("/")]
                with hub.lock:
                    return self._route(parts, body)

            def _route(self, parts, body):
                if parts == ["api", "repos", "create"]:
                    req = json.loads(body)
                    repo = f"{req['organization']}/{req['name']}" if req.get("organization") else req["name"]
                    kind = req.get("type") or "model"
                    url = f"{hub.base}/{'' if kind == 'model' else kind + 's/'}{repo}"
                    if (kind, repo) in hub.repos:
                        return self._reply(409, {"error": f"You already created this {kind} repo", "url": url},
                                           {"X-Error-Message": f"You already created this {kind} repo"})
                    private = bool(req.get("private")) or req.get("visibility") == "private"
                    hub.repos[(kind, repo)] = {"private": private, "branches": {"main": {}}}
                    return self._reply(200, {"url": url, "name": repo})
                if parts == ["api", "validate-yaml"]:
                    return self._reply(200, {})
                if parts[0] == "lfs" and self.command == "PUT":
                    hub.lfs[parts[1]] = body
                    return self._reply(200, {})
                if parts[-4:] == ["info", "lfs", "objects", "batch"]:
                    objs = json.loads(body)["objects"]
                    return self._reply(200, {"transfer": "basic", "objects": [
                        {"oid": o["oid"], "size": o["size"]} if len(hub.lfs.get(o["oid"], b"")) == o["size"] > 0
                        else {"oid": o["oid"], "size": o["size"],
                              "actions": {"upload": {"href": f"{hub.base}/lfs/{o['oid']}", "header": {}}}}
                        for o in objs]})
                if parts[0] == "api" and len(parts) == 4 and self.command == "GET":  # repo_info of main
                    parts = [*parts, "revision", "main"]
                if parts[0] == "api" and len(parts) >= 6:
                    kind, repo, action, rev = parts[1][:-1], "/".join(parts[2:4]), parts[4], "/".join(parts[5:])
                    r = hub.repos.get((kind, repo))
                    if r is None:
                        return self._error(404, "Repository not found", "RepoNotFound")
                    if action == "branch":
                        start = (json.loads(body) if body else {}).get("startingPoint") or "main"
                        if rev in r["branches"]:
                            return self._error(409, "Reference already exists")
                        if start not in r["branches"]:
                            return self._error(404, f"Invalid rev id: {start}", "RevisionNotFound")
                        r["branches"][rev] = dict(r["branches"][start])
                        return self._reply(200, {})
                    if rev not in r["branches"]:
                        return self._error(404, f"Invalid rev id: {rev}", "RevisionNotFound")
                    tree = r["branches"][rev]
                    if action == "revision":
                        return self._reply(200, {"id": repo, "sha": tree_sha(tree), "private": r["private"],
                                                 "siblings": [{"rfilename": p} for p in sorted(tree)]})
                    if action == "preupload":
                        files = json.loads(body)["files"]
                        return self._reply(200, {"files": [
                            {"path": f["path"], "uploadMode": "lfs" if f["path"].endswith(LFS_SUFFIXES)
                             else "regular", "shouldIgnore": False,
                             "oid": file_oid(f["path"], tree[f["path"]]) if f["path"] in tree else None}
                            for f in files]})
                    if action == "commit":
                        new = dict(tree)
                        for line in body.decode().splitlines():
                            rec = json.loads(line)
                            if rec["key"] == "file":
                                new[rec["value"]["path"]] = base64.b64decode(rec["value"]["content"])
                            elif rec["key"] == "lfsFile":
                                if rec["value"]["oid"] not in hub.lfs:
                                    return self._error(422, f"LFS object {rec['value']['oid']} was never uploaded")
                                new[rec["value"]["path"]] = hub.lfs[rec["value"]["oid"]]
                        r["branches"][rev] = new
                        hub.commits.append((kind, repo, rev))
                        oid = tree_sha(new)
                        return self._reply(200, {"commitUrl": f"{hub.base}/{repo}/commit/{oid}", "commitOid": oid})
                return self._error(404, f"no route {'/'.join(parts)}", "EntryNotFound")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
