"""File I/O shared by every layer: atomic writes, jsonl reading, sha256 of files, the default cache dir.

Atomic writes go to a temp file in the target's folder and are renamed over the target, so a reader sees the
old file or the whole new one, never a half-written one; the file gets the mode a plain ``open(path, "w")``
would give (``0o666`` minus the umask), not ``mkstemp``'s ``0o600``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import IO, Callable, Iterator, Optional

from pretrain_exp.core.errors import DataError, StorageError


def _umask() -> int:
    """The process's umask, read from ``/proc/self/status`` where it is listed (setting it to read it back, the
    fallback, briefly changes it for every thread)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask


def default_mode(directory: bool = False) -> int:
    """The permission bits a plain ``open(path, "w")`` (``0o666``) or ``os.mkdir`` (``0o777``) gives under the
    current umask: what files and folders made by ``mkstemp``/``mkdtemp`` (``0o600``/``0o700``) get before they
    are renamed into place, so that a run's group can read its results and a shared cache."""
    return (0o777 if directory else 0o666) & ~_umask()


def apply_default_modes(root: str | Path) -> None:
    """Give every file under ``root`` (a folder, recursively, or one file) :func:`default_mode`: for outputs of
    libraries that write ``0o600`` files (``safetensors`` does), so a run's group can read them. Symlinks are
    left alone."""
    root = Path(root)
    files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    mode = default_mode()
    for p in files:
        if p.stat().st_mode & 0o777 != mode:
            os.chmod(p, mode)


#: errno values of a full filesystem or an exhausted quota
_FULL = (errno.ENOSPC, errno.EDQUOT)
#: how engines word a full disk in errors that are not ``OSError`` (safetensors' Rust I/O error, torch's writer)
_FULL_TEXT = ("No space left on device", "os error 28", "Disk quota exceeded", "os error 122")


def free_bytes(path: str | Path) -> Optional[int]:
    """Free bytes on the filesystem holding ``path`` (or its nearest existing parent); ``None`` if unknown."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def is_disk_full(err: BaseException) -> bool:
    """Whether ``err`` (or an error it was raised from) says the filesystem or the quota is full."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in _FULL or any(t in str(err) for t in _FULL_TEXT):
            return True
        err = err.__cause__ or err.__context__
    return False


def disk_full_error(doing: str, path: str | Path, err: BaseException) -> StorageError:
    """The :class:`StorageError` for a full disk while ``doing`` (e.g. ``"writing"``) ``path``: names both, the
    free space left and how to go on (a re-run of the same command resumes from what was written completely)."""
    free = free_bytes(path)
    left = f"{free / 2**20:.1f} MiB free there" if free is not None else "free space unknown"
    return StorageError(f"no space left on device while {doing} {path} ({left}; {type(err).__name__}: "
                        f"{' '.join(str(err).split())}); free space or move the run dir, then re-run the same "
                        "command: it resumes from the last complete checkpoint")


def _temp_affixes(path: Path) -> tuple[str, str]:
    """The (prefix, suffix) of :func:`atomic_path`'s temp files for ``path``: ``.<stem>.`` and ``<suffix>``."""
    return f".{path.stem}.", path.suffix


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temp path next to ``path`` for a writer that wants a file name (``savefig``, ``np.save``); renamed to
    ``path`` when the ``with`` block ends without error, removed otherwise.

    :raises StorageError: if the filesystem (or the quota) is full; ``path`` is left as it was.
    """
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        prefix, suffix = _temp_affixes(path)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=suffix)
        os.close(fd)
        yield Path(tmp)
        os.chmod(tmp, default_mode())
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        if is_disk_full(e) and not isinstance(e, StorageError):
            raise disk_full_error("writing", path, e) from e
        raise


def orphaned_temps(path: str | Path) -> list[Path]:
    """The temp files :func:`atomic_path` made for ``path`` and never renamed (their writer was killed between
    creating and renaming one): ``.<stem>.<8 characters of mkstemp's>.<suffix>`` beside it. Only a caller that is
    the one writer of ``path`` may remove them (another writer's temp file would look the same)."""
    path = Path(path)
    prefix, suffix = _temp_affixes(path)
    name = re.compile(rf"{re.escape(prefix)}[a-z0-9_]{{8}}{re.escape(suffix)}")  # mkstemp: 8 random characters
    if not path.parent.is_dir():
        return []
    return sorted(f for f in path.parent.iterdir() if name.fullmatch(f.name) and f.is_file())


def atomic_write(path: str | Path, write: Callable[[IO], None], binary: bool = False) -> Path:
    """Write ``path`` atomically: ``write(f)`` fills a temp file in the same folder, which is then renamed.

    :param write: called with the open temp file (text mode, or binary with ``binary=True``).
    :returns: ``path``. On any error the temp file is removed and the target is left as it was.
    """
    with atomic_path(path) as tmp, open(tmp, "wb" if binary else "w") as f:
        write(f)
    return Path(path)


def write_text(path: str | Path, text: str) -> Path:
    """Write a text file atomically (:func:`atomic_write`)."""
    return atomic_write(path, lambda f: f.write(text))


def _nan_to_none(obj):
    if isinstance(obj, float) and obj != obj:
        return None
    if isinstance(obj, dict):
        return {k: _nan_to_none(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_nan_to_none(v) for v in obj]
    return obj


def write_json(path: str | Path, obj) -> Path:
    """Write JSON atomically, indented, NaN written as ``null``."""
    return write_text(path, json.dumps(_nan_to_none(obj), indent=1) + "\n")


def read_jsonl(path: str | Path) -> Iterator[tuple[int, object]]:
    """``(line number, parsed object)`` of each non-blank line of a jsonl file (1-based line numbers). A UTF-8
    byte-order mark at the start of the file is skipped (``utf-8-sig``, as Windows tools write it); ``\\r\\n``
    line ends are accepted.

    :raises DataError: for a missing file, non-UTF-8 bytes or malformed JSON (a syntax error, an integer of more
        digits than Python converts, nesting too deep to parse), naming the file and line.
    """
    path = Path(path)
    if not path.is_file():
        what = "is a directory, not a jsonl file" if path.is_dir() else "file not found"
        raise DataError(f"{path}: {what}")
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{path}:{lineno}: not valid UTF-8 (byte {e.start})") from None
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: malformed JSON ({e.msg} at column {e.colno})") from None
            except ValueError as e:  # an integer beyond sys.get_int_max_str_digits()
                raise DataError(f"{path}:{lineno}: malformed JSON ({str(e).split(';')[0]})") from None
            except RecursionError:
                raise DataError(f"{path}:{lineno}: malformed JSON (nested too deeply to parse)") from None


def check_text(where: str, key: str, text: str) -> str:
    """``text`` if it is valid Unicode (encodable as UTF-8), for a text read from a user file.

    JSON's ``\\ud800`` escapes decode to lone surrogates, which no tokenizer accepts.

    :param where: ``file:line`` of the text; ``key``: its field name, both for the message.
    :raises DataError: for a lone surrogate, naming ``where``, ``key``, the character index and its code.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise DataError(f"{where}: {key!r} holds a lone surrogate {text[e.start]!r} at character {e.start} "
                        "(not valid Unicode text)") from None
    return text


def sha256_file(path: str | Path, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file's bytes, read in ``chunk``-byte blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def default_cache_dir() -> Path:
    """The asset/token/checkpoint cache when none is configured: ``$PRETRAIN_EXP_CACHE`` or
    ``~/.cache/pretrain_exp`` (the same rule as ``cache_dir`` in ``conf/config.yaml``)."""
    return Path(os.environ.get("PRETRAIN_EXP_CACHE") or Path.home() / ".cache" / "pretrain_exp")


@contextlib.contextmanager
def file_lock(path: str | Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if absent, never written) for the ``with`` block: processes
    that build the same cache entry (the ranks of a job, the jobs of a sweep) take turns."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
