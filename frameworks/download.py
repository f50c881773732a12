"""Download OLMo checkpoints over HTTP(S): resumable, size-checked, retried, cached. Standard library only
(retries follow the project's one backoff policy, :mod:`pretrain_exp.core.retry`).

Layouts (``<base>`` is the folder that holds the ``step<N>`` folders; directory listing is not allowed on
olmo-checkpoints.org, so every file is fetched by name):

- **OLMo-2** (old trainer, unsharded), :func:`download_olmo2_checkpoint`::

      <base>/step<N>-unsharded/config.yaml                         required
      <base>/step<N>-unsharded/model.safetensors | model.pt        required (safetensors tried first)
      <base>/step<N>-unsharded/optim.safetensors | optim.pt        optional (a warning when absent)
      <base>/step<N>-unsharded/train.pt                            required

  e.g. ``https://olmo-checkpoints.org/ai2-llm/peteish{1,7,13}/`` (OLMo-2 1B/7B/13B; the step lists are the CSVs
  in allenai/OLMo ``configs/official-*/``).

- **OLMo-core** (sharded, torch DCP), :func:`download_olmo_core_checkpoint`::

      <base>/step<N>/.metadata.json                                required
      <base>/step<N>/config.json                                   required
      <base>/step<N>/data_paths.txt                                optional
      <base>/step<N>/train/rank<r>.pt                              rank0 required; r = 1, 2, ... until a 404
      <base>/step<N>/model_and_optim/.metadata                     required (torch DCP metadata)
      <base>/step<N>/model_and_optim/__<rank>_<i>.distcp           probed: r, i = 0, 1, ... until a 404

  e.g. ``https://olmo-checkpoints.org/ai2-llm/Olmo-3-1025-7B/stage{1,2,3}/`` (OLMo-3 7B; step lists in
  allenai/OLMo-core ``src/scripts/official/OLMo3/*.csv``). **Stage-1 URLs are reported broken upstream**
  (allenai/OLMo-core#729: every stage-1 file answers 404); prefer stage 2 or 3.

  A writer with several threads per rank writes ``__<r>_0.distcp``, ``__<r>_1.distcp``, ..., so for every rank
  r the indices i are probed until a 404, and ranks until ``__<r>_0.distcp`` answers 404. (``.metadata`` is a
  pickle; it is downloaded for OLMo-core to read, never unpickled here.)

Each file goes to ``<name>.part`` and is renamed to ``<name>`` only once its size equals the server's
``Content-Length`` (or ``Content-Range`` total), so a file at its final name is complete and is never fetched
again. A broken transfer continues from the bytes already in ``.part`` with an HTTP ``Range`` request. A
checkpoint whose files are all present gets a ``.download-complete.json`` listing them; a later call that finds
it (and the listed files at the listed sizes) sends no request at all.

CLI: ``python -m pretrain_exp.frameworks.download {olmo2,olmo_core} <base_url> <step> <dest>``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import os
import re
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, List, Optional, Sequence

from pretrain_exp.core.cachedir import CacheDir
from pretrain_exp.core.commands import prog
from pretrain_exp.core.errors import CheckpointError
from pretrain_exp.core.io import file_lock
from pretrain_exp.core.retry import MAX_DELAY_S, RetryPolicy, TransientError, backoff_delay  # noqa: F401
from pretrain_exp.core.rundir import step_name
from pretrain_exp.core.secrets import install_log_redaction, redact, redact_url

log = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20  #: read/write unit, bytes
DEFAULT_TIMEOUT_S = 60.0  #: socket timeout per blocking operation, seconds
PROGRESS_EVERY_S = 30.0  #: interval of progress log lines during one file, seconds
MARKER = ".download-complete.json"  #: written into a checkpoint dir once every file is present
USER_AGENT = "pretrain_exp-download/1"

SleepFn = Callable[[float], None]


class RemoteFileNotFound(CheckpointError):
    """The server answered 404 (or 410) for :attr:`url`."""

    def __init__(self, url: str, status: int = 404):
        self.url = url
        self.status = status
        super().__init__(f"{url}: not found (HTTP {status})")


_Transient = TransientError  #: a failure worth retrying (the shared policy of :mod:`pretrain_exp.core.retry`)


# ------------------------------------------------------------------------------------------------ one file


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _content_range_total(value: Optional[str]) -> tuple[Optional[int], Optional[int]]:
    """``(first byte, total size)`` of a ``Content-Range: bytes a-b/total`` (or ``bytes */total``) header."""
    m = re.fullmatch(r"\s*bytes\s+(?:(\d+)-\d+|\*)/(\d+|\*)\s*", value or "")
    if not m:
        return None, None
    start = int(m.group(1)) if m.group(1) is not None else None
    total = int(m.group(2)) if m.group(2) != "*" else None
    return start, total


def _attempt(url: str, part: Path, timeout_s: float) -> None:
    """One GET of ``url`` into ``part`` (continuing it with a Range request when it has bytes).

    Returns when ``part`` holds the whole file. Raises :class:`_Transient` for failures worth retrying,
    :class:`RemoteFileNotFound` for 404/410 and :class:`CheckpointError` for any other answer.
    """
    have = _size(part)
    headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
    if have:
        headers["Range"] = f"bytes={have}-"
    try:
        resp = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout_s)
    except urllib.error.HTTPError as e:
        status, content_range = e.code, e.headers.get("Content-Range") if e.headers else None
        e.close()
        if status in (404, 410):
            raise RemoteFileNotFound(url, status) from None
        if status == 416 and have:
            _, total = _content_range_total(content_range)
            if total == have:
                return  # the partial file already holds every byte
            part.unlink()
            raise _Transient(f"HTTP 416 for a {have}-byte partial file (server size {total}); restarting") from None
        if status >= 500 or status in (408, 429):
            raise _Transient(f"HTTP {status} {e.reason}") from None
        raise CheckpointError(f"{url}: HTTP {status} {e.reason}") from None
    except (OSError, http.client.HTTPException) as e:  # URLError, refused, reset, timeout, bad status line
        raise _Transient(f"{type(e).__name__}: {e}") from None

    with resp:
        if resp.status == 206:
            start, total = _content_range_total(resp.headers.get("Content-Range"))
            if start != have:
                part.unlink()
                raise _Transient(f"server resumed at byte {start}, not {have}; restarting")
            mode = "ab"
        elif resp.status == 200:  # a fresh GET, or a server that ignored the Range header: start over
            length = resp.headers.get("Content-Length")
            total = int(length) if length is not None and length.isdigit() else None
            have, mode = 0, "wb"
        else:
            raise CheckpointError(f"{url}: unexpected HTTP {resp.status}")
        last_log = time.monotonic()
        with open(part, mode) as f:
            while True:
                try:  # read1: whatever has arrived, so bytes received before a reset still reach the disk
                    chunk = resp.read1(CHUNK_BYTES)
                except (OSError, http.client.HTTPException) as e:  # reset, timeout, IncompleteRead
                    raise _Transient(f"connection dropped after {have} bytes: {type(e).__name__}: {e}") from None
                if not chunk:
                    break
                f.write(chunk)
                have += len(chunk)
                if time.monotonic() - last_log >= PROGRESS_EVERY_S:
                    last_log = time.monotonic()
                    log.info("%s: %.1f of %s MiB", part.name, have / 2**20,
                             f"{total / 2**20:.1f}" if total is not None else "?")
    if total is None:
        log.warning("%s: the server sent no size; %d bytes received, not size-checked", url, have)
    elif have < total:
        raise _Transient(f"short read: {have} of {total} bytes")
    elif have > total:
        part.unlink()
        raise _Transient(f"received {have} bytes, more than the {total} announced; restarting")


def download_file(url: str, dest: str | os.PathLike, *, max_retries: int = 5, base_delay_s: float = 1.0,
                  sleep: SleepFn = time.sleep, timeout_s: float = DEFAULT_TIMEOUT_S) -> Path:
    """Download ``url`` to ``dest`` unless ``dest`` already exists; returns ``dest`` as a :class:`Path`.

    Bytes go to ``<dest>.part``, continued with ``Range: bytes=<have>-`` after any break (also across calls and
    processes), and the file is renamed to ``dest`` only once its size equals the size the server announced.
    An existing ``dest`` is trusted as complete (only complete files ever get that name) and costs no request.

    :param url: http(s) URL of the file.
    :param dest: local path of the file; parent folders are created.
    :param max_retries: retries allowed after consecutive failed attempts that added no bytes (an attempt that
        made progress resets the count, so a long file may survive many drops).
    :param base_delay_s: first backoff sleep in seconds; it doubles per consecutive failure (cap 60 s) plus up
        to 50 % random jitter.
    :param sleep: called with each backoff delay in seconds (inject a recorder in tests).
    :param timeout_s: socket timeout per connect/read, seconds.
    :raises RemoteFileNotFound: (a :class:`CheckpointError`) on HTTP 404/410, at once, naming the URL; no
        ``dest`` is created (a ``.part`` from an earlier attempt is kept).
    :raises CheckpointError: on another 4xx, or when ``max_retries`` retries after connection errors, 5xx, 408,
        429 or short reads all fail; the message names the URL and the last error.
    """
    dest = Path(dest)
    if dest.is_file():
        log.debug("%s: already present", dest)
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    t0 = time.monotonic()
    log.info("downloading %s", url)

    def give_up(failures: int, e: Exception) -> CheckpointError:
        return CheckpointError(f"{url}: download failed after {failures} consecutive attempts without progress "
                               f"({_size(part)} bytes kept in {part}): {e}")

    RetryPolicy(max_retries, base_delay_s, sleep=sleep).call(lambda: _attempt(url, part, timeout_s), what=url,
                                                             give_up=give_up, progress=lambda: _size(part))
    os.replace(part, dest)
    log.info("%s: %d bytes in %.1f s", dest, _size(dest), time.monotonic() - t0)
    return dest


# ------------------------------------------------------------------------------------------------ checkpoints


def olmo2_checkpoint_url(base_url: str, step: int) -> str:
    """``<base>/step<N>-unsharded`` (no trailing slash)."""
    return f"{base_url.rstrip('/')}/{step_name(step, suffix='-unsharded')}"


def olmo_core_checkpoint_url(base_url: str, step: int) -> str:
    """``<base>/step<N>`` (no trailing slash)."""
    return f"{base_url.rstrip('/')}/{step_name(step)}"


def _read_marker(ckpt_dir: Path) -> bool:
    """True if ``ckpt_dir`` has a download marker and every file it lists, at the listed size."""
    try:
        files = json.loads((ckpt_dir / MARKER).read_text())["files"]
        return all((ckpt_dir / rel).is_file() and (ckpt_dir / rel).stat().st_size == size
                   for rel, size in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _write_marker(ckpt_dir: Path, url: str, rels: Sequence[str]) -> None:
    files = {rel: (ckpt_dir / rel).stat().st_size for rel in rels}
    tmp = ckpt_dir / (MARKER + ".tmp")
    tmp.write_text(json.dumps({"url": redact_url(url), "files": files}, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, ckpt_dir / MARKER)


class _Fetcher:
    """Downloads files of one checkpoint dir, remembering which exist."""

    def __init__(self, url: str, ckpt_dir: Path, **kwargs):
        self.url, self.dir, self.kwargs = url, ckpt_dir, kwargs
        self.files: List[str] = []

    @classmethod
    def unless_complete(cls, url: str, ckpt_dir: Path, **kwargs) -> Optional["_Fetcher"]:
        """A fetcher for ``ckpt_dir``, or ``None`` if its completion marker says it is already complete."""
        if _read_marker(ckpt_dir):
            log.info("%s: complete, nothing to download", ckpt_dir)
            return None
        return cls(url, ckpt_dir, **kwargs)

    def get(self, rel: str) -> Path:
        """Fetch required file ``rel``; raises :class:`RemoteFileNotFound` naming its URL on a 404."""
        path = download_file(f"{self.url}/{rel}", self.dir / rel, **self.kwargs)
        self.files.append(rel)
        return path

    def probe(self, rel: str) -> Optional[Path]:
        """Fetch ``rel`` if the server has it; ``None`` on a 404."""
        try:
            return self.get(rel)
        except RemoteFileNotFound:
            return None

    def first_of(self, rels: Sequence[str], required: bool, what: str) -> Optional[Path]:
        """The first of ``rels`` present locally, else the first the server has (tried in order)."""
        for rel in rels:
            if (self.dir / rel).is_file():
                self.files.append(rel)
                return self.dir / rel
        for rel in rels:
            if (path := self.probe(rel)) is not None:
                return path
        urls = ", ".join(f"{self.url}/{rel}" for rel in rels)
        if required:
            raise CheckpointError(f"{what} not found: none of {urls} exists (HTTP 404)")
        log.warning("%s not found (none of %s exists); continuing without it", what, urls)
        return None


def _download_checkpoint(url: str, ckpt_dir: Path, fetch_files: Callable[[_Fetcher], None], **kwargs) -> Path:
    """The skeleton of both checkpoint downloads: nothing to do if ``ckpt_dir``'s completion marker says it is
    complete; else ``fetch_files`` fetches the layout's files (raising :class:`CheckpointError` for a missing
    required one) and the marker listing them is written. ``kwargs`` go to :func:`download_file`."""
    ckpt_dir.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(ckpt_dir.parent / f".{ckpt_dir.name}.lock"):  # concurrent jobs: one downloads, the others wait
        fetch = _Fetcher.unless_complete(url, ckpt_dir, **kwargs)
        if fetch is not None:
            fetch_files(fetch)
            _write_marker(ckpt_dir, url, fetch.files)
    return ckpt_dir


def download_olmo2_checkpoint(base_url: str, step: int, dest_dir: str | os.PathLike, *, max_retries: int = 5,
                              base_delay_s: float = 1.0, sleep: SleepFn = time.sleep,
                              timeout_s: float = DEFAULT_TIMEOUT_S) -> Path:
    """Download the OLMo-2 unsharded checkpoint ``<base_url>/step<step>-unsharded/`` (module docstring).

    :param base_url: folder holding the ``step<N>-unsharded`` folders, e.g.
        ``https://olmo-checkpoints.org/ai2-llm/peteish7/``.
    :param step: global optimizer step of the checkpoint.
    :param dest_dir: local parent folder; the checkpoint lands in ``<dest_dir>/step<step>-unsharded/``.
    :param max_retries: see :func:`download_file` (per file).
    :param base_delay_s: first backoff sleep, seconds; see :func:`download_file`.
    :param sleep: backoff sleep function (seconds).
    :param timeout_s: socket timeout, seconds.
    :returns: the local checkpoint folder.
    :raises CheckpointError: if ``config.yaml``, ``train.pt`` or both model files answer 404 (the message
        names the URLs), or a file cannot be fetched after retries. A missing optimizer state only warns.
    """

    def fetch_files(fetch: _Fetcher) -> None:
        fetch.get("config.yaml")
        fetch.get("train.pt")
        fetch.first_of(["model.safetensors", "model.pt"], required=True, what="model state")
        fetch.first_of(["optim.safetensors", "optim.pt"], required=False, what="optimizer state")

    return _download_checkpoint(olmo2_checkpoint_url(base_url, step), Path(dest_dir) / f"step{int(step)}-unsharded",
                                fetch_files, max_retries=max_retries, base_delay_s=base_delay_s, sleep=sleep,
                                timeout_s=timeout_s)


def download_olmo_core_checkpoint(base_url: str, step: int, dest_dir: str | os.PathLike, *, max_retries: int = 5,
                                  base_delay_s: float = 1.0, sleep: SleepFn = time.sleep,
                                  timeout_s: float = DEFAULT_TIMEOUT_S,
                                  train_ranks: Optional[int] = None) -> Path:
    """Download the OLMo-core sharded checkpoint ``<base_url>/step<step>/`` (module docstring).

    :param base_url: folder holding the ``step<N>`` folders, e.g.
        ``https://olmo-checkpoints.org/ai2-llm/Olmo-3-1025-7B/stage2/`` (stage-1 URLs are broken upstream).
    :param step: global optimizer step of the checkpoint.
    :param dest_dir: local parent folder; the checkpoint lands in ``<dest_dir>/step<step>/``.
    :param max_retries: see :func:`download_file` (per file).
    :param base_delay_s: first backoff sleep, seconds; see :func:`download_file`.
    :param sleep: backoff sleep function (seconds).
    :param timeout_s: socket timeout, seconds.
    :param train_ranks: how many ``train/rank<r>.pt`` to fetch, all required; ``None`` = every rank, probed
        until the first 404. OLMo-core falls back to ``rank0.pt`` when a rank's own file is absent, so ``1`` is
        enough to resume on a different world size.
    :returns: the local checkpoint folder.
    :raises CheckpointError: if ``.metadata.json``, ``config.json``, ``train/rank0.pt``,
        ``model_and_optim/.metadata`` or ``model_and_optim/__0_0.distcp`` answers 404 (the message names the URL),
        or a file cannot be fetched after retries.
    """

    def fetch_files(fetch: _Fetcher) -> None:
        fetch.get(".metadata.json")
        fetch.get("config.json")
        fetch.probe("data_paths.txt")
        fetch.get("train/rank0.pt")
        r = 1
        while train_ranks is None or r < train_ranks:
            rel = f"train/rank{r}.pt"
            if train_ranks is not None:
                fetch.get(rel)
            elif fetch.probe(rel) is None:
                break
            r += 1
        fetch.get("model_and_optim/.metadata")
        rank = 0
        while fetch.probe(f"model_and_optim/__{rank}_0.distcp") is not None:
            i = 1
            while fetch.probe(f"model_and_optim/__{rank}_{i}.distcp") is not None:
                i += 1
            rank += 1
        if rank == 0:
            raise CheckpointError(f"{fetch.url}/model_and_optim/__0_0.distcp: not found (HTTP 404)")

    return _download_checkpoint(olmo_core_checkpoint_url(base_url, step), Path(dest_dir) / step_name(step),
                                fetch_files, max_retries=max_retries, base_delay_s=base_delay_s, sleep=sleep,
                                timeout_s=timeout_s)


def download_checkpoint_files(checkpoint_url: str, ckpt_dir: str | os.PathLike, rels: Sequence[str],
                              **kwargs) -> Path:
    """Fetch only the files ``rels`` of the checkpoint at ``checkpoint_url`` into ``ckpt_dir``; files already there
    are kept. ``kwargs`` go to :func:`download_file`.

    :raises CheckpointError: naming the URL of a file that answers 404 or cannot be fetched after retries.
    """
    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(ckpt_dir.parent / f".{ckpt_dir.name}.lock"):  # never two writers of one .part file
        for rel in rels:
            if not (ckpt_dir / rel).is_file():
                download_file(f"{checkpoint_url}/{rel}", ckpt_dir / rel, **kwargs)
    return ckpt_dir


#: layout -> (checkpoint URL of (base, step), files that record the run's settings: config and trainer state)
SETTINGS_FILES = {"olmo2": (olmo2_checkpoint_url, ("config.yaml", "train.pt")),
                  "olmo_core": (olmo_core_checkpoint_url, ("config.json", "train/rank0.pt"))}


def download_checkpoint(layout: str, base_url: str, step: int, dest_dir: str | os.PathLike,
                        settings_only: bool = False, **kwargs) -> Path:
    """The checkpoint ``<base_url>/step<step>[-unsharded]/`` of ``layout`` (``olmo2`` or ``olmo_core``) in
    ``<dest_dir>/``: all of it (:func:`download_olmo2_checkpoint` / :func:`download_olmo_core_checkpoint`), or with
    ``settings_only`` just its config and trainer state (:data:`SETTINGS_FILES`, what a run's settings are read
    from before the weights are needed). ``kwargs`` go to the download function.

    :raises CheckpointError: as the download functions.
    """
    url_of, rels = SETTINGS_FILES[layout]
    if settings_only:
        url = url_of(base_url, step)
        return download_checkpoint_files(url, Path(dest_dir) / url.rsplit("/", 1)[1], rels, **kwargs)
    download = download_olmo2_checkpoint if layout == "olmo2" else download_olmo_core_checkpoint
    return download(base_url, step, dest_dir, **kwargs)


def model_checkpoint_dir(layout: str, model, cache_dir: str | os.PathLike, preset: Callable[[str, str], Path],
                         settings_only: bool = False) -> Path:
    """The checkpoint dir of a run's ``model`` node in ``layout`` (``olmo2`` / ``olmo_core``): the tiny preset
    ``preset(model.asset, cache_dir)``, ``<model.url>/step<model.checkpoint_step>[-unsharded]/`` downloaded into
    ``<cache_dir>/models/<model.name>/`` (:func:`download_checkpoint`, ``settings_only`` as there), or
    ``model.path``.

    :raises CheckpointError: if ``model.path`` lacks the layout's config file (``config.yaml`` / ``config.json``).
    """
    if model.asset is not None:
        return preset(model.asset, str(cache_dir))
    if model.url is not None:
        return download_checkpoint(layout, model.url, model.checkpoint_step, CacheDir(cache_dir).model(model.name),
                                   settings_only)
    path, config = Path(model.path), SETTINGS_FILES[layout][1][0]
    if not (path / config).is_file():
        what = "an OLMo-2 step<N>-unsharded" if layout == "olmo2" else "an OLMo-core step<N>"
        raise CheckpointError(f"model.path={path}: not {what} checkpoint (no {config})")
    return path


# ------------------------------------------------------------------------------------------------ CLI


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m pretrain_exp.frameworks.download {olmo2,olmo_core} <base_url> <step> <dest>``; prints the checkpoint
    dir.

    Returns the exit status: 0 on success, 2 on a :class:`CheckpointError` (printed as one ``error:`` line).
    """
    ap = argparse.ArgumentParser(prog=prog("pretrain-exp-download", "pretrain_exp.frameworks.download"),
                                 description="Download an OLMo-2 (step<N>-unsharded) or OLMo-core (step<N>) "
                                             "checkpoint: resumable, size-checked, retried, cached.")
    ap.add_argument("layout", choices=["olmo2", "olmo_core"])
    ap.add_argument("base_url", help="folder holding the step folders, e.g. "
                                     "https://olmo-checkpoints.org/ai2-llm/peteish7/")
    ap.add_argument("step", type=int)
    ap.add_argument("dest", type=Path, help="local parent folder of the checkpoint folder")
    ap.add_argument("--max-retries", type=int, default=5)
    ap.add_argument("--base-delay", type=float, default=1.0, help="first backoff sleep, seconds")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="socket timeout, seconds")
    ap.add_argument("--train-ranks", type=int, default=None,
                    help="olmo_core: fetch only train/rank0..N-1.pt (default: all, probed until a 404)")
    args = ap.parse_args(argv)
    install_log_redaction()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    kwargs = dict(max_retries=args.max_retries, base_delay_s=args.base_delay, timeout_s=args.timeout)
    try:
        if args.layout == "olmo_core":
            kwargs["train_ranks"] = args.train_ranks
        path = download_checkpoint(args.layout, args.base_url, args.step, args.dest, **kwargs)
    except CheckpointError as e:
        print(f"error: {redact(str(e))}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
