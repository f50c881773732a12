"""Tokenize a text source into OLMo-format token files (CLI and library).

Usage::

    python -m pretrain_exp.data.tokenize --source shakespeare --tokenizer <HF dir or model asset> --out <dir>
    python -m pretrain_exp.data.tokenize --source my_docs.jsonl --text-key body --tokenizer <dir> --out <dir>

Each document is encoded without special tokens and followed by the tokenizer's EOS (no BOS), the dtype is the
run's (``uint16`` or ``uint32`` by the vocabulary's size where none is given), and every file gets its
``.csv.gz`` document offsets (:mod:`pretrain_exp.data.token_files`). The output folder is keyed by a hash of the
source and the tokenizer (and a dtype other than the vocabulary's) and holds ``tokens.json`` (written last); a
folder with ``tokens.json`` is reused as is.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Iterator, List, Optional

import numpy as np

from pretrain_exp.core.commands import prog
from pretrain_exp.core.config import text_sources
from pretrain_exp.core.errors import DataError, PretrainExpError
from pretrain_exp.core.io import default_mode, file_lock
from pretrain_exp.core.logs import phase_progress
from pretrain_exp.core.secrets import install_log_redaction, redact
from pretrain_exp.data.assets import (
    ASSETS,
    GGUF_MEMBERS,
    TINY_MODELS,
    TOKENIZERS,
    built_dir,
    get_asset,
    hf_model_dir,
    iter_texts,
    tokenizer_dir,
)
from pretrain_exp.data.token_files import dtype_for_vocab, write_token_files

log = logging.getLogger(__name__)


def _is_asset(name_or_path: str) -> bool:
    """Whether a tokenizer name is a tokenizer or model asset (its dir is built in the cache)."""
    return name_or_path in TOKENIZERS or name_or_path in ASSETS or name_or_path in TINY_MODELS


def _tokenizer_path(name_or_path: str, cache_dir: str | Path) -> Path:
    """The dir or file a tokenizer name stands for: a tokenizer or model asset's dir in the cache (built once
    there), else the path as given."""
    if _is_asset(name_or_path):
        return (tokenizer_dir if name_or_path in TOKENIZERS else hf_model_dir)(name_or_path, cache_dir)
    return Path(name_or_path).expanduser()


def load_tokenizer(name_or_path: str, cache_dir: str | Path, eos_token_id: int | None = None,
                   pad_token_id: int | None = None):
    """An HF tokenizer from a local dir, a ``tokenizer.json`` file, a model asset name or a tokenizer asset name
    (``dolma2``).

    :param eos_token_id: the EOS id to use where the tokenizer names none (a bare ``tokenizer.json`` has no
        ``tokenizer_config.json``; an OLMo checkpoint records ``model.eos_token_id``); ``pad_token_id`` likewise.
    :raises DataError: if it cannot be loaded or has no EOS token (and ``eos_token_id`` is not given).
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    path = _tokenizer_path(name_or_path, cache_dir)
    if not path.exists() and (path.is_absolute() or name_or_path.startswith((".", "~"))):
        models = sorted(GGUF_MEMBERS) + sorted(TINY_MODELS)
        raise DataError(f"tokenizer {name_or_path!r}: directory not found (give an HF tokenizer dir, "
                        f"a tokenizer.json file, a model asset {models} or a hub id)")
    try:
        if path.is_file():
            tok = PreTrainedTokenizerFast(tokenizer_file=str(path))
        else:
            tok = AutoTokenizer.from_pretrained(str(path))
    except Exception as e:  # OSError, ValueError, or the tokenizers library's own exception
        raise DataError(f"tokenizer {name_or_path!r}: cannot load ({str(e).splitlines()[0]})") from None
    for attr, given in (("eos_token", eos_token_id), ("pad_token", pad_token_id)):
        if given is not None and getattr(tok, f"{attr}_id") is None:
            if not 0 <= int(given) < len(tok):
                raise DataError(f"tokenizer {name_or_path!r}: {attr} id {given} is outside its {len(tok)} ids")
            setattr(tok, attr, tok.convert_ids_to_tokens(int(given)))
    if tok.eos_token_id is None:
        raise DataError(f"tokenizer {name_or_path!r} has no EOS token; token files need one between "
                        "documents")
    return tok


class TokenizerFile:
    """A tokenizer read with the ``tokenizers`` library alone, for readers of rows tokenized before (the
    inspector): encode without special tokens, decode, EOS id, vocabulary size and the corpus cache key, as the HF
    fast tokenizer of the same ``tokenizer.json`` gives them. Importing ``tokenizers`` takes about 0.03 s; loading
    the HF tokenizer imports ``transformers`` and, through the model's config class, torch (seconds).

    :param backend: a ``tokenizers.Tokenizer``.
    :param eos_token_id: the EOS id (``tokenizer_config.json``'s ``eos_token``, or the checkpoint's).
    """

    def __init__(self, backend, eos_token_id: int):
        self.backend_tokenizer, self.eos_token_id = backend, int(eos_token_id)

    def __len__(self) -> int:
        """Ids including added tokens (``len()`` of the HF tokenizer)."""
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def all_special_ids(self) -> List[int]:
        """Ids of the added tokens marked special (EOS, pad, ...), sorted."""
        return sorted(i for i, t in self.backend_tokenizer.get_added_tokens_decoder().items() if t.special)

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        """``{"input_ids": [int, ...]}`` of ``text``."""
        return {"input_ids": self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids}

    def decode(self, ids, clean_up_tokenization_spaces: bool = False) -> str:
        """The text of ``ids`` (a sequence of ints), special tokens kept; no clean-up of spaces (only ``False``).

        :raises ValueError: for ``clean_up_tokenization_spaces=True`` (the HF tokenizer's own rules).
        """
        if clean_up_tokenization_spaces:
            raise ValueError("TokenizerFile.decode does not clean up tokenization spaces")
        return self.backend_tokenizer.decode(list(ids), skip_special_tokens=False)


def read_tokenizer(name_or_path: str, cache_dir: str | Path,
                   eos_token_id: int | None = None) -> Optional[TokenizerFile]:
    """The :class:`TokenizerFile` of what :func:`load_tokenizer` loads (a local dir or ``tokenizer.json`` file, or
    an asset already in the cache), or ``None`` where only the HF tokenizer can say (no ``tokenizer.json``, an
    asset not built yet, an EOS the files do not name, a Hub id).

    :param eos_token_id: the EOS id where ``tokenizer_config.json`` names none (as :func:`load_tokenizer`).
    """
    import tokenizers

    # an asset only where it was built already (by the HF path), a path as given
    path = built_dir(name_or_path, cache_dir) if _is_asset(name_or_path) else Path(name_or_path).expanduser()
    file = None if path is None else path if path.is_file() else path / "tokenizer.json"
    if file is None or not file.is_file():
        return None
    backend = tokenizers.Tokenizer.from_file(str(file))
    eos = eos_token_id
    config = path / "tokenizer_config.json"
    if path.is_dir() and config.is_file():
        named = json.loads(config.read_text()).get("eos_token")
        named = named.get("content") if isinstance(named, dict) else named
        if isinstance(named, str):
            eos = backend.token_to_id(named)
    return None if eos is None else TokenizerFile(backend, eos)


def _source_identity(source: str) -> str:
    if source in ASSETS:
        return f"asset:{get_asset(source).sha256}"
    p = Path(source)
    files = sorted(p.glob("*.txt")) if p.is_dir() else [p]
    return ";".join(f"{f.resolve()}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files if f.exists())


def tokenize_sources(text, tokenizer, out_root: str | Path, cache_dir: str | Path, text_key: str = "text",
                     progress: bool = True, dtype: Optional[np.dtype] = None) -> List[Path]:
    """Token files of every source of ``text`` (:func:`pretrain_exp.core.config.text_sources`), each tokenized
    and cached on its own (:func:`tokenize_source`, ``dtype`` as there), concatenated in the order given.

    :raises DataError: as :func:`tokenize_source`, for the first bad source.
    """
    return [p for source in text_sources(text)
            for p in tokenize_source(str(source), tokenizer, out_root, cache_dir, text_key, progress, dtype)]


def token_folder(source: str, tokenizer, out_root: str | Path, text_key: str = "text",
                 dtype: Optional[np.dtype] = None) -> Path:
    """The cache folder of ``source`` tokenized by ``tokenizer`` (an HF tokenizer or a :class:`TokenizerFile`):
    ``<out_root>/<source name>-<key>``, the key a hash of the source's identity, ``text_key``, the tokenizer's
    ``tokenizers`` JSON and its EOS id, and ``dtype`` when given (``None``: the vocabulary's own,
    :func:`~pretrain_exp.data.token_files.dtype_for_vocab`). Complete once it holds ``tokens.json``."""
    vocab_json = (tokenizer.backend_tokenizer.to_str() if hasattr(tokenizer, "backend_tokenizer")
                  else repr(tokenizer))
    parts = [_source_identity(source), text_key, vocab_json, str(tokenizer.eos_token_id)]
    key = hashlib.sha256("\n".join(parts + ([] if dtype is None else [np.dtype(dtype).name])).encode()
                         ).hexdigest()[:16]
    slug = Path(source).stem if source not in ASSETS else source
    return Path(out_root) / f"{slug}-{key}"


def cached_token_files(text, tokenizer, out_root: str | Path, text_key: str = "text",
                       dtype: Optional[np.dtype] = None) -> Optional[List[Path]]:
    """The token files of every source of ``text`` as :func:`tokenize_sources` returns them, read from the cache
    without tokenizing anything: ``None`` when a source is not tokenized yet by ``tokenizer`` into ``dtype``."""
    paths: List[Path] = []
    for source in text_sources(text):
        meta = token_folder(str(source), tokenizer, out_root, text_key, dtype) / "tokens.json"
        if not meta.is_file():
            return None
        paths += [meta.parent / f for f in json.loads(meta.read_text())["files"]]
    return paths


def tokenize_source(source: str, tokenizer, out_root: str | Path, cache_dir: str | Path,
                    text_key: str = "text", progress: bool = True, dtype: Optional[np.dtype] = None) -> List[Path]:
    """Token files of ``source`` (see :func:`pretrain_exp.data.assets.iter_texts`) under ``out_root``.

    :param tokenizer: an HF tokenizer (its EOS separates documents).
    :param dtype: the token files' dtype, the run's (its ``data.dtype``, or what its model's vocabulary needs);
        ``None``: the dtype the tokenizer's vocabulary needs (:func:`~pretrain_exp.data.token_files.dtype_for_vocab`).
    :returns: the token-file paths, in order. Concurrent calls for one source and tokenizer (the jobs of a sweep)
        take turns on a file lock (``<out_root>/.<folder>.lock``): the first tokenizes, the others reuse its folder.
    :raises DataError: for a bad source (see ``iter_texts``) or a source with no tokens.
    """
    out = token_folder(source, tokenizer, out_root, text_key, dtype)
    meta_path = out / "tokens.json"
    if not meta_path.is_file():
        _tokenize_into(out, source, tokenizer, cache_dir, text_key, progress, dtype)
    return [out / f for f in json.loads(meta_path.read_text())["files"]]


def _tokenize_into(out: Path, source: str, tokenizer, cache_dir, text_key: str, progress: bool,
                   dtype: Optional[np.dtype]) -> None:
    """Tokenize ``source`` into the folder ``out`` (:func:`tokenize_source`) under its file lock, unless another
    process did meanwhile: into a temp folder renamed to ``out`` once whole (``tokens.json`` written last). A failed
    build leaves nothing behind: no temp folder, no lock file, no folder it created."""
    meta_path = out / "tokens.json"
    created = not out.parent.exists()
    out.parent.mkdir(parents=True, exist_ok=True)
    lock, tmp = out.parent / f".{out.name}.lock", None
    try:
        with file_lock(lock):  # the jobs of a sweep tokenize a source once
            if meta_path.is_file():
                return
            eos = int(tokenizer.eos_token_id)
            docs = list(iter_texts(source, cache_dir, text_key))  # a bad source fails before anything is written
            if not docs:
                raise DataError(f"text source {source!r} holds no documents")
            tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
            os.chmod(tmp, default_mode(directory=True))
            dtype = dtype_for_vocab(len(tokenizer)) if dtype is None else np.dtype(dtype)
            files, total = _write_files(docs, tokenizer, tmp, dtype, eos, progress, source)
            if total == 0:
                raise DataError(f"text source {source!r} yields no tokens")
            (tmp / "tokens.json").write_text(json.dumps({
                "source": source, "text_key": text_key, "dtype": dtype.name, "eos_token_id": eos,
                "vocab_size": len(tokenizer), "num_documents": len(docs), "num_tokens": total, "files": files,
            }, indent=1))
            if meta_path.is_file():  # another process finished first
                shutil.rmtree(tmp)
            else:
                if out.exists():  # a folder without tokens.json is incomplete (not written by this function)
                    shutil.rmtree(out)
                try:
                    os.replace(tmp, out)
                except OSError:
                    if not meta_path.is_file():  # not a concurrent writer that finished first
                        raise
                    shutil.rmtree(tmp)
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        lock.unlink(missing_ok=True)
        if created:
            try:
                out.parent.rmdir()
            except OSError:
                pass
        raise


def _write_files(docs, tokenizer, out: Path, dtype: np.dtype, eos: int, progress: bool, source: str):
    """``docs`` (``(name, text)`` pairs) encoded and written as token files of ``dtype`` into ``out``
    (:func:`~pretrain_exp.data.token_files.write_token_files`); returns ``(file names, tokens)``."""
    encoded = _encoded(docs, tokenizer, progress, source)
    return write_token_files(encoded, out, dtype, eos)


def _encoded(docs, tokenizer, progress: bool, source: str) -> Iterator[List[int]]:
    """The token ids of each document of ``docs``, encoded 16 at a time without special tokens, with a progress
    bar; a document the tokenizer fails on is a :class:`DataError` naming it (:func:`_tokenizer_error`)."""
    with phase_progress(f"tokenizing {source}", len(docs), enabled=None if progress else False) as done:
        for i in range(0, len(docs), 16):
            chunk = [text for _, text in docs[i:i + 16]]
            try:
                encoded = tokenizer(chunk, add_special_tokens=False, verbose=False)["input_ids"]
            except Exception as e:
                raise _tokenizer_error(docs, i, tokenizer, source, e) from None
            yield from encoded
            done(i + len(chunk))


def _tokenizer_error(docs, start: int, tokenizer, source: str, error: Exception) -> DataError:
    """The error naming the first document of ``docs[start:start + 16]`` the tokenizer raises on."""
    for name, text in docs[start:start + 16]:
        try:
            tokenizer([text], add_special_tokens=False, verbose=False)
        except Exception as e:
            error = e
            break
    else:
        name, text = docs[start]
    first = (str(error).strip().splitlines() or [""])[0]
    return DataError(f"text source {source!r}, document {name}: the tokenizer fails on {text[:40]!r}: "
                     f"{type(error).__name__}: {first[:200]}")


def main(argv: List[str] | None = None) -> int:
    """CLI entry point; returns the exit status (2 on a data error, printed as one line)."""
    ap = argparse.ArgumentParser(prog=prog("pretrain-exp-tokenize", "pretrain_exp.data.tokenize"),
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", required=True, help=f"asset {sorted(ASSETS)}, a .txt folder or a .jsonl file")
    ap.add_argument("--tokenizer", required=True, help="HF tokenizer dir or model asset name")
    ap.add_argument("--out", required=True, help="output root; files land in <out>/<source>-<hash>/")
    ap.add_argument("--text-key", default="text", help="jsonl key of the document text")
    ap.add_argument("--cache-dir", default=os.environ.get("PRETRAIN_EXP_CACHE",
                                                          str(Path.home() / ".cache" / "pretrain_exp")))
    args = ap.parse_args(argv)
    install_log_redaction()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        tok = load_tokenizer(args.tokenizer, args.cache_dir)
        paths = tokenize_source(args.source, tok, args.out, args.cache_dir, args.text_key)
    except PretrainExpError as e:
        print(f"error: {redact(str(e))}", file=sys.stderr)
        return 2
    for p in paths:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
