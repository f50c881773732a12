"""What an official OLMo-2 / OLMo-3 run trained on at any step, from its config alone (no weights, no run dir).

``pretrain-exp-inspect <source> step=N [row=R] | step=A-B | search=TEXT step=A-B [--out FILE]`` where ``<source>``
is one of (:func:`resolve_config`):

- a model preset of ``conf/model/`` (``olmo2_1b``, ``olmo2_7b``, ``olmo3_7b_stage2``, ...): only the config of
  its checkpoint ``<model.url>/step<checkpoint_step>[-unsharded]/`` is downloaded, into
  ``<cache_dir>/models/<name>/`` (``--checkpoint-step`` picks another checkpoint's config; every checkpoint of
  one run records the same data). Presets named ``olmo2*`` are old-trainer OLMo-2 checkpoints (``config.yaml``),
  the others OLMo-core checkpoints (``config.json``); a tiny preset (``model.asset``) is built as training builds
  it;
- a checkpoint URL (``.../step<N>-unsharded`` or ``.../step<N>``): its ``config.yaml`` or ``config.json`` only;
- a checkpoint dir, or the ``config.yaml`` / ``config.json`` file itself.

The run's order is the one training uses (:class:`~pretrain_exp.data.order.DataOrder`: OLMo-2's
``config.yaml`` through :func:`~pretrain_exp.frameworks.olmo2.data_order.data_order`, OLMo-core's ``config.json``
``dataset`` / ``data_loader`` as :meth:`OlmoCoreFramework.checkpoint_settings
<pretrain_exp.frameworks.olmo_core.framework.OlmoCoreFramework.checkpoint_settings>` reads them), its
permutation built once into ``<cache_dir>/permutations/`` and the remote files' sizes into
``<cache_dir>/size_index/``; then only the rows asked for are fetched, each by one HTTP range request
(:class:`~pretrain_exp.data.remote.RemoteReader`, in parallel), ``data.path_prefixes``-style ``--prefix
OLD=NEW`` mapping the official URLs to a mirror. Global batch ``K`` (1-based) is training-order rows
``[(K-1) B, K B)``; with ``--world-size W`` each row also gets the data-parallel rank that trained it (rank ``r``
takes rows ``r, r+W, ...`` of each global batch, OLMo-2's and OLMo-core's split).

Text is decoded with the run's tokenizer (``tokenizers``' ``Tokenizer.decode_batch``, special tokens kept), loaded
while the rows are fetched and run in a thread beside the printing or writing of the rows before, while a third
thread fetches the next rows (:meth:`BatchView.records`). JSON Lines are written with ``orjson``, byte for byte what
``json.dumps(record, ensure_ascii=False)`` writes (:func:`jsonl_line`).
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

import numpy as np
import orjson

from pretrain_exp.core.cachedir import CacheDir
from pretrain_exp.core.errors import CheckpointError, ConfigError

MAX_HITS = 1000  #: search hits kept
BLOCK_ROWS = 4096  #: rows fetched at once by a search
RECORD_ROWS = 128  #: rows fetched at once by :meth:`BatchView.records` (the next block while these are decoded)
THREADS = 32  #: parallel range requests
DECODE_ROWS = 64  #: rows per ``decode_batch`` call of :meth:`BatchView.records` (decoded ahead in a thread)
AHEAD = 2  #: chunks of :data:`DECODE_ROWS` rows converted and decoding ahead of the one being written


@dataclass(frozen=True)
class OfficialOrder:
    """The data order of an official run, read from its config file (module docstring)."""

    config: Path  #: the ``config.yaml`` / ``config.json`` it came from
    layout: str  #: ``olmo2`` (old trainer, ``config.yaml``) or ``olmo_core`` (``config.json``)
    paths: List[str]  #: token files / URLs in instance-id order, as the config lists them
    dtype: str  #: token dtype of the files
    sequence_length: int  #: L, tokens per row
    global_batch_size: int  #: B, rows per optimizer step
    seed: int  #: data-order seed with OLMo-core's epoch count (``first_epoch`` 1)
    chunk: int = 1  #: instances shuffled together (OLMo-core ``max_target_sequence_length / L``)
    tokenizer: Optional[str] = None  #: the config's tokenizer identifier
    eos_token_id: Optional[int] = None  #: as the config records it
    pad_token_id: Optional[int] = None  #: as the config records it


def _preset(name: str) -> Optional[dict]:
    """``conf/model/<name>.yaml`` as a dict, or ``None`` when ``name`` is no model preset."""
    from pretrain_exp import conf_dir

    path = conf_dir() / "model" / f"{name}.yaml"
    if not re.fullmatch(r"[A-Za-z0-9_]+", name) or not path.is_file():
        return None
    import yaml

    return yaml.safe_load(path.read_text()) or {}


def _config_in(path: Path) -> Optional[Path]:
    for name in ("config.yaml", "config.json"):
        if (path / name).is_file():
            return path / name
    return None


def resolve_config(source: str, cache_dir: str | Path, checkpoint_step: Optional[int] = None) -> Path:
    """The local config file of ``source`` (module docstring), downloading only that file.

    :raises ConfigError: (key ``source``) for a source that is none of the forms, or a preset without a URL or asset.
    :raises CheckpointError: naming the URL when the config cannot be downloaded.
    """
    cache_dir = Path(cache_dir)
    preset = None if "/" in source or source.startswith(".") else _preset(source)
    if preset is not None:
        return _preset_config(source, preset, cache_dir, checkpoint_step)
    if re.match(r"https?://", source):
        return _url_config(source, cache_dir)
    path = Path(source).expanduser()
    if path.is_file() and path.suffix in (".yaml", ".yml", ".json"):
        return path
    if path.is_dir():
        found = _config_in(path)
        if found is not None:
            return found
    raise ConfigError("source", f"{source!r}: not a run dir, a model preset of conf/model/ with an official "
                                "checkpoint, a checkpoint URL or dir, or a config.yaml / config.json")


def _preset_config(source: str, preset: dict, cache_dir: Path, checkpoint_step: Optional[int]) -> Path:
    """The config file of a model preset: from its registry asset's checkpoint, or downloaded from its URL."""
    olmo2 = source.startswith("olmo2")
    if preset.get("asset"):
        if olmo2:
            from pretrain_exp.frameworks.olmo2.presets import tiny_checkpoint
        else:
            from pretrain_exp.frameworks.olmo_core.presets import tiny_checkpoint
        found = _config_in(Path(tiny_checkpoint(preset["asset"], str(cache_dir))))
        if found is None:
            raise ConfigError("source", f"preset {source}: its checkpoint has no config.yaml / config.json")
        return found
    if not preset.get("url"):
        raise ConfigError("source", f"preset {source} (conf/model/{source}.yaml) names no url or asset of an "
                                    "official checkpoint")
    from pretrain_exp.frameworks.download import (  # http and ssl: imported only where a config is downloaded
        download_checkpoint_files,
        olmo2_checkpoint_url,
        olmo_core_checkpoint_url,
    )

    step = int(checkpoint_step if checkpoint_step is not None else preset.get("checkpoint_step") or 0)
    url = (olmo2_checkpoint_url if olmo2 else olmo_core_checkpoint_url)(preset["url"], step)
    rel = "config.yaml" if olmo2 else "config.json"
    dest = CacheDir(cache_dir).model(preset.get("name", source)) / url.rsplit("/", 1)[1]
    return download_checkpoint_files(url, dest, [rel]) / rel


def _url_config(source: str, cache_dir: Path) -> Path:
    """The config file of a checkpoint URL (or the URL of the config file itself), downloaded into the cache."""
    import hashlib

    from pretrain_exp.frameworks.download import download_checkpoint_files

    url = source.rstrip("/")
    if url.endswith((".yaml", ".json")):
        url, rel = url.rsplit("/", 1)
        rels = [rel]
    else:
        rels = ["config.yaml", "config.json"] if url.endswith("-unsharded") else ["config.json", "config.yaml"]
    dest = CacheDir(cache_dir).model("configs") / hashlib.sha256(url.encode()).hexdigest()[:16]
    errors = []
    for rel in rels:
        try:
            return download_checkpoint_files(url, dest, [rel]) / rel
        except CheckpointError as e:
            errors.append(str(e))
    raise CheckpointError(f"{source}: no checkpoint config ({'; '.join(errors)})")


def read_order(config: Path) -> OfficialOrder:
    """The :class:`OfficialOrder` of an OLMo-2 ``config.yaml`` or OLMo-core ``config.json``.

    :raises ConfigError: naming the config file and key for a missing or unsupported data setting.
    """
    text = config.read_text()
    if config.suffix == ".json":
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError("source", f"{config}:{e.lineno}: not valid JSON ({e.msg})") from None
        return _olmo_core_order(config, raw)
    import yaml

    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise ConfigError("source", f"{config}{f':{mark.line + 1}' if mark else ''}: not valid YAML") from None
    if not isinstance(raw, dict):
        raise ConfigError("source", f"{config}: expected a mapping at the top level")
    from pretrain_exp.frameworks.olmo2.data_order import TrainPosition, data_order

    try:
        params = data_order(raw, TrainPosition(0, 0, 0, 0, None), remote_ok=True)
    except ConfigError as e:
        raise ConfigError(e.key, f"{config}: {e}") from None
    model = raw.get("model") or {}
    tok = raw.get("tokenizer") or {}
    return OfficialOrder(config, "olmo2", params.paths, params.memmap_dtype, params.sequence_length,
                         params.global_batch_size, params.seed, 1, tok.get("identifier"), model.get("eos_token_id"),
                         model.get("pad_token_id"))


def _olmo_core_order(config: Path, raw: dict) -> OfficialOrder:
    from pretrain_exp.data.token_files import dtype_for_vocab

    dataset, loader = raw.get("dataset") or {}, raw.get("data_loader") or {}
    tok = dataset.get("tokenizer") or {}
    kind = str(dataset.get("_CLASS_", "olmo_core.data.numpy_dataset.NumpyFSLDatasetConfig"))
    if kind.rpartition(".")[2] != "NumpyFSLDatasetConfig":  # as training (OlmoCoreFramework) refuses it
        raise ConfigError("dataset._CLASS_", f"{config}: dataset is {kind}; only NumpyFSLDatasetConfig's order is "
                                             "reproduced")
    if dataset.get("paths") and not dataset.get("expand_glob") and dataset.get("source_permutation_seed") is None:
        paths = [str(p) for p in dataset["paths"]]
    else:  # globs, mixes and permuted sources resolve as OLMo-core resolves them
        from pretrain_exp.frameworks.olmo_core.framework import dataset_paths

        paths = dataset_paths(dataset, config)
    if not paths:
        raise ConfigError("dataset.paths", f"{config}: no token files (dataset.paths or dataset.mix)")
    L = dataset.get("sequence_length")
    tokens = loader.get("global_batch_size")
    for key, value in (("dataset.sequence_length", L), ("data_loader.global_batch_size", tokens),
                       ("data_loader.seed", loader.get("seed"))):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigError(key, f"{config}: must be a non-negative integer, got {value!r}")
    if not L or tokens % L:
        raise ConfigError("data_loader.global_batch_size", f"{config}: {tokens} tokens is not a multiple of "
                                                           f"dataset.sequence_length={L}")
    target = dataset.get("max_target_sequence_length") or L
    dtype = dataset.get("dtype") or dtype_for_vocab(int(tok.get("vocab_size") or 100_278)).name
    return OfficialOrder(config, "olmo_core", paths, str(dtype), int(L), int(tokens) // int(L), int(loader["seed"]),
                         int(target) // int(L), tok.get("identifier"), tok.get("eos_token_id"),
                         tok.get("pad_token_id"))


def tokenizer_file(identifier: Optional[str], cache_dir: str | Path, given: Optional[str] = None) -> Path:
    """The ``tokenizer.json`` to decode with: ``given`` (a file or a dir holding one), else the config's
    identifier (the dolma2 asset for OLMo-2/OLMo-3's, :func:`~pretrain_exp.data.assets.tokenizer_for_identifier`).

    :raises ConfigError: (key ``--tokenizer``) when neither names a local ``tokenizer.json``.
    """
    from pretrain_exp.data.assets import TOKENIZERS, tokenizer_dir, tokenizer_for_identifier

    name = given or tokenizer_for_identifier(str(identifier or "dolma2"))
    if name in TOKENIZERS:
        return tokenizer_dir(name, cache_dir) / "tokenizer.json"
    path = Path(name).expanduser()
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise ConfigError("--tokenizer", f"tokenizer {name!r} is not a local tokenizer.json or tokenizer dir; "
                                         "give one with --tokenizer PATH")
    return path


class BatchView:
    """Rows of an official run's training order, fetched on demand.

    :param order: from :func:`read_order`.
    :param cache_dir: the project cache (permutations, size index, tokenizer).
    :param prefixes: ``{old prefix: new prefix}`` applied to every token-file path (``data.path_prefixes``).
    :param world_size: data-parallel ranks, for the ``rank`` of each row (``None``: not shown).
    :param tokenizer: a ``tokenizer.json`` or tokenizer dir overriding the config's.
    :param preload: start loading the decoder (:attr:`decoder`) now, in a thread (``Tokenizer.from_file`` releases
        the GIL), while the order is opened and the rows are fetched; its errors are raised where it is first used.
    """

    def __init__(self, order: OfficialOrder, cache_dir: str | Path, prefixes: Optional[Dict[str, str]] = None,
                 world_size: Optional[int] = None, tokenizer: Optional[str] = None, progress: bool = False,
                 preload: bool = False):
        from pretrain_exp.data.order import DataOrder
        from pretrain_exp.data.token_files import TokenFiles

        self.spec, self.cache_dir, self.world_size = order, Path(cache_dir), world_size
        self._tokenizer_arg = tokenizer
        self._loading = None
        if preload:
            pool = ThreadPoolExecutor(1)
            self._loading = pool.submit(self._load_decoder)
            pool.shutdown(wait=False)
        self.files = TokenFiles(order.paths, np.dtype(order.dtype), cache_dir=cache_dir, prefixes=prefixes,
                                progress=progress)
        self.order = DataOrder(self.files, order.sequence_length, order.global_batch_size, order.seed, 1,
                               cache_dir=cache_dir, chunk=order.chunk)
        self.bytes_fetched = 0  #: bytes read for rows (remote: over HTTP; local: from the files)
        self.requests = 0  #: range requests sent for rows

    @property
    def B(self) -> int:
        return self.order.global_batch_size

    @property
    def L(self) -> int:
        return self.order.sequence_length

    @property
    def num_steps(self) -> int:
        """Steps in the first epoch."""
        return self.order.rows_per_epoch // self.B

    @cached_property
    def tokenizer_path(self) -> Path:
        """The run's ``tokenizer.json`` (:func:`tokenizer_file`)."""
        return tokenizer_file(self.spec.tokenizer, self.cache_dir, self._tokenizer_arg)

    @cached_property
    def tokenizer(self):
        """The run's ``tokenizers.Tokenizer`` (loaded on first use: searches encode with it)."""
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(self.tokenizer_path))

    @cached_property
    def decoder(self):
        """The run's tokenizer for decoding (:meth:`decode`, :meth:`records`): the same vocabulary, added tokens and
        decoder, so the same texts, without a BPE model's merges, which only encoding reads and which are half of
        the loading time. Loaded on first use, or from the start with ``preload``."""
        return self._loading.result() if self._loading is not None else self._load_decoder()

    def _load_decoder(self):
        """:attr:`decoder` from ``<cache_dir>/tokenizers/decode-only/<key>.json``, written once from the
        ``tokenizer.json`` (``key``: a hash of its path, size and modification time)."""
        import hashlib

        from tokenizers import Tokenizer

        from pretrain_exp.core.io import atomic_path

        src = self.tokenizer_path.resolve()
        st = src.stat()
        key = hashlib.sha256(f"{src}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
        dst = CacheDir(self.cache_dir).tokenizers / "decode-only" / f"{key}.json"
        if not dst.is_file():
            raw = json.loads(src.read_text(encoding="utf-8"))
            if isinstance(raw.get("model"), dict) and raw["model"].get("type") == "BPE":
                raw["model"]["merges"] = []
            dst.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(dst) as tmp:
                tmp.write_text(json.dumps(raw, ensure_ascii=False), encoding="utf-8")
        return Tokenizer.from_file(str(dst))

    def decode(self, rows: np.ndarray) -> List[str]:
        """Texts of token rows ``(n, L)``: :attr:`decoder`'s ``decode_batch(rows, skip_special_tokens=False)``."""
        return self.decoder.decode_batch(np.asarray(rows, np.int64).reshape(len(rows), -1).tolist(),
                                         skip_special_tokens=False)

    def rows_of_steps(self, first: int, last: int, row: Optional[int] = None) -> np.ndarray:
        """Training-order rows ``q`` of steps ``first..last`` (1-based, inclusive), or only their row ``row``.

        :raises ConfigError: (key ``step``/``row``) for a step outside the first epoch or a row outside the batch.
        """
        if not 1 <= first <= last:
            raise ConfigError("step", f"step range {first}-{last}: steps count from 1 and the range must not be empty")
        if row is not None and not 0 <= row < self.B:
            raise ConfigError("row", f"row {row} is outside the global batch [0, {self.B})")
        cols = np.arange(self.B, dtype=np.int64) if row is None else np.asarray([row], np.int64)
        steps = np.arange(first - 1, last, dtype=np.int64)
        return (steps[:, None] * self.B + cols[None, :]).reshape(-1)

    def fetch(self, q: np.ndarray, threads: int = THREADS) -> tuple[np.ndarray, dict]:
        """Tokens of training-order rows ``q`` (``int64`` array): ``(tokens (n, L) int64, info)`` where ``info``
        holds ``int64`` arrays ``step``, ``row``, ``q``, ``instance``, ``file``, ``file_offset`` (tokens) and, with
        a world size, ``rank``. Each remote row is one range request; requests run ``threads`` at a time."""
        q = np.asarray(q, dtype=np.int64)
        lo, hi = int(q.min()), int(q.max()) + 1
        if hi - lo <= 4 * q.size:  # dense (a step, a step range): one vectorized lookup of the span
            inst = self.order.instances(lo, hi - lo)[q - lo]
        else:  # sparse (one row of each step of a range)
            inst = np.concatenate([self.order.instances(int(x), 1) for x in q])
        f, off = self.order.instance_locations(inst)
        out = np.empty((q.size, self.L), np.int64)
        isz = self.files.dtype.itemsize

        def one(i: int) -> None:
            k = int(f[i])
            p = self.files.paths[k]
            if isinstance(p, str):
                data = self.files.reader.read(p, int(off[i]) * isz, self.L * isz, int(self.files.num_bytes[k]))
                out[i] = np.frombuffer(data, dtype=self.files.dtype)
            else:
                out[i] = self.files.read(k, int(off[i]), self.L)

        remote = np.asarray([self.files.remote[int(k)] for k in f], bool)
        if remote.any() and q.size > 1:
            with ThreadPoolExecutor(min(threads, q.size)) as pool:
                list(pool.map(one, range(q.size)))
        else:
            for i in range(q.size):
                one(i)
        self.bytes_fetched += q.size * self.L * isz
        self.requests += int(remote.sum())
        info = {"step": q // self.B + 1, "row": q % self.B, "q": q, "instance": inst, "file": f, "file_offset": off}
        if self.world_size:
            info["rank"] = (q % self.B) % self.world_size
        return out, info

    def records(self, q: np.ndarray, text: bool = True) -> Iterator[dict]:
        """One dict per row of ``q``: the :meth:`fetch` fields as ints, ``path`` (the token file, URLs without
        credentials), ``token_ids`` (a list of ints) and, with ``text``, ``text``.

        The rows are fetched :data:`RECORD_ROWS` at a time in a thread, the next block while the rows before it are
        decoded and written; the texts are decoded (``Tokenizer.decode_batch``, which releases the GIL) in another
        thread, :data:`DECODE_ROWS` rows a call and :data:`AHEAD` calls ahead, while the caller writes the records
        before them; each chunk's token lists are converted once, for both the decoder and ``token_ids``."""
        from pretrain_exp.core.secrets import redact_url

        def decode(chunk: List[List[int]]) -> List[str]:
            return self.decoder.decode_batch(chunk, skip_special_tokens=False)

        paths: Dict[int, str] = {}

        def emit(cols: dict, first: int, chunk: List[List[int]], texts) -> Iterator[dict]:
            texts = texts.result() if text else None
            for j, row in enumerate(chunk):
                rec = {k: v[first + j] for k, v in cols.items()}
                k = rec["file"]
                if k not in paths:
                    p = self.files.paths[k]
                    paths[k] = redact_url(p) if isinstance(p, str) else str(p)
                rec["path"] = paths[k]
                rec["token_ids"] = row
                if text:
                    rec["text"] = texts[j]
                yield rec

        pool, fetcher = ThreadPoolExecutor(1), ThreadPoolExecutor(1)
        try:
            pending: deque = deque()  # (columns, first row, token lists, texts decoding) of chunks, in order
            ahead = fetcher.submit(self.fetch, q[:RECORD_ROWS]) if q.size else None
            for a in range(0, q.size, RECORD_ROWS):
                tokens, info = ahead.result()
                if a + RECORD_ROWS < q.size:
                    ahead = fetcher.submit(self.fetch, q[a + RECORD_ROWS:a + 2 * RECORD_ROWS])
                cols = {k: v.tolist() for k, v in info.items()}
                for b in range(0, len(tokens), DECODE_ROWS):
                    chunk = tokens[b:b + DECODE_ROWS].tolist()
                    pending.append((cols, b, chunk, pool.submit(decode, chunk) if text else None))
                    if len(pending) > AHEAD:
                        yield from emit(*pending.popleft())
            while pending:
                yield from emit(*pending.popleft())
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            fetcher.shutdown(wait=False, cancel_futures=True)

    def patterns(self, query: str) -> List[np.ndarray]:
        """Token sequences of a search: ids (``"1,2,3"``), or the text encoded alone and after a space.

        :raises ConfigError: (key ``search``) for an empty query.
        """
        if re.fullmatch(r"\s*\[?\s*\d+(\s*[,\s]\s*\d+)*\s*\]?\s*", query):
            return [np.asarray([int(x) for x in re.findall(r"\d+", query)], np.int64)]
        pats: List[np.ndarray] = []
        for text in (query, " " + query):
            ids = np.asarray(self.tokenizer.encode(text, add_special_tokens=False).ids, np.int64)
            if ids.size and not any(np.array_equal(ids, p) for p in pats):
                pats.append(ids)
        if not pats:
            raise ConfigError("search", "empty query")
        return pats

    def search(self, query: str, q: np.ndarray, max_hits: int = MAX_HITS) -> List[dict]:
        """Occurrences of ``query`` (:meth:`patterns`) inside the rows ``q`` (never across rows): ``{step, row, q,
        offset, instance, file, file_offset, pattern, context}`` by row then offset; at most ``max_hits``."""
        pats = [p for p in self.patterns(query) if p.size <= self.L]
        hits: List[dict] = []
        for a in range(0, q.size, BLOCK_ROWS):
            tokens, info = self.fetch(q[a:a + BLOCK_ROWS])
            found = []
            for k, p in enumerate(pats):
                m = p.size
                r, o = np.nonzero(tokens[:, :self.L - m + 1] == p[0])
                ok = np.ones(r.size, bool)
                for j in range(1, m):
                    ok &= tokens[r, o + j] == p[j]
                found += [(int(i), int(x), k) for i, x in zip(r[ok], o[ok])]
            for i, o, k in sorted(found):
                ctx = tokens[i, max(0, o - 8):o + pats[k].size + 8]
                hits.append({**{key: int(v[i]) for key, v in info.items()}, "offset": o, "pattern": k,
                             "context": self.decode(ctx[None, :])[0]})
                if len(hits) >= max_hits:
                    return hits
        return hits


def parse_steps(value: str) -> tuple[int, int]:
    """``N`` or ``A-B`` / ``A..B`` -> ``(first, last)``.

    :raises ConfigError: (key ``step``) otherwise.
    """
    m = re.fullmatch(r"\s*(\d+)\s*(?:(?:-|\.\.)\s*(\d+))?\s*", value)
    if not m:
        raise ConfigError("step", f"must be N or A-B (a step range), got {value!r}")
    first = int(m.group(1))
    return first, int(m.group(2) or first)


def jsonl_line(rec: dict) -> bytes:
    """``json.dumps(rec, ensure_ascii=False) + "\\n"`` in UTF-8, the same bytes, faster: ``token_ids`` (a list of
    ints or an integer ``numpy`` row), strings and ints are written by ``orjson`` (which escapes a string as ``json``
    does with ``ensure_ascii=False``), the ids' ``,`` separators widened to ``json``'s ``", "``; other values by
    ``json``.

    :raises TypeError: (``orjson.JSONEncodeError``) for a string holding a lone surrogate or an id outside 64 bits.
    """
    parts = []
    for k, v in rec.items():
        if k == "token_ids":
            value = orjson.dumps(v, option=orjson.OPT_SERIALIZE_NUMPY).replace(b",", b", ")
        elif isinstance(v, str) or (type(v) is int and -2 ** 63 <= v < 2 ** 64):
            value = orjson.dumps(v)
        else:
            value = json.dumps(v, ensure_ascii=False).encode()
        parts.append(orjson.dumps(k) + b": " + value)
    return b"{" + b", ".join(parts) + b"}\n"


def write_records(records, out: Path) -> int:
    """Write ``records`` (dicts; a ``token_ids`` entry may be a ``numpy`` row) to ``out``: JSON Lines for
    ``.jsonl``, Parquet (pyarrow; ``token_ids`` a list of ``int64``) for ``.parquet``; atomically. Returns the
    number written.

    :raises ConfigError: (key ``--out``) for another suffix.
    """
    from pretrain_exp.core.io import atomic_path

    if out.suffix not in (".jsonl", ".parquet"):
        raise ConfigError("--out", f"{out}: write .jsonl or .parquet")
    n = 0
    with atomic_path(out) as tmp:
        if out.suffix == ".jsonl":
            with open(tmp, "wb") as fh:
                for rec in records:
                    fh.write(jsonl_line(rec))
                    n += 1
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            rows = list(records)
            n = len(rows)
            columns = {k: [r.get(k) for r in rows] for k in dict.fromkeys(k for r in rows for k in r)}
            pq.write_table(pa.table(columns), str(tmp))
    return n


def _prefixes(values: Sequence[str]) -> Dict[str, str]:
    out = {}
    for v in values:
        old, sep, new = v.partition("=")
        if not sep or not old:
            raise ConfigError("--prefix", f"{v!r}: give OLD=NEW (e.g. http://olmo-data.org/=http://mirror/)")
        out[old] = new
    return out


def run(source: str, query: Dict[str, str], *, cache_dir: str | Path, prefixes: Sequence[str] = (),
        world_size: Optional[int] = None, tokenizer: Optional[str] = None, out: Optional[str] = None,
        checkpoint_step: Optional[int] = None, ids: bool = True, stream=None) -> dict:
    """The command for an official run (module docstring): prints rows or search hits to ``stream`` (stdout), or
    writes them to ``out``; returns ``{"rows", "hits", "bytes", "requests", "seconds"}``.

    :raises ConfigError: for a bad query (``step``, ``row``, ``search``, ``item``) or source.
    """
    t0 = time.perf_counter()
    stream = stream or sys.stdout
    if "item" in query:
        raise ConfigError("item", "an official run has no insertion plan: query step=N [row=R] or search=TEXT step=A-B")
    if "step" not in query:
        raise ConfigError("step", "give step=N [row=R], step=A-B, or search=TEXT with step=A-B (the range searched)")
    first, last = parse_steps(query["step"])
    if "row" in query and (first != last or not re.fullmatch(r"\d+", query["row"])):
        raise ConfigError("row", f"row={query['row']!r}: an integer, with a single step")
    view = BatchView(read_order(resolve_config(source, cache_dir, checkpoint_step)), cache_dir,
                     _prefixes(prefixes), world_size, tokenizer, preload=True)
    if last > view.num_steps:
        raise ConfigError("step", f"step {last} is past the first epoch of {view.spec.config} ({view.num_steps} steps "
                                  f"of {view.B} rows)")
    q = view.rows_of_steps(first, last, int(query["row"]) if "row" in query else None)
    summary = {"rows": int(q.size), "hits": None}
    if "search" in query:
        hits = view.search(query["search"], q)
        summary["hits"] = len(hits)
        if out:
            write_records(hits, Path(out))
        else:
            pats = view.patterns(query["search"])
            print(f"{query['search']!r} in steps {first}-{last} ({q.size} rows): {len(hits)} occurrence(s)"
                  + (f" (first {MAX_HITS})" if len(hits) >= MAX_HITS else "")
                  + "; token ids searched: " + "; ".join(str(p.tolist()) for p in pats), file=stream)
            for h in hits:
                print(f"step {h['step']} row {h['row']} offset {h['offset']} (instance {h['instance']}): "
                      f"{h['context']!r}", file=stream)
    elif out:
        write_records(view.records(q), Path(out))
    else:
        for rec in view.records(q):
            rank = f", rank {rec['rank']} of {world_size}" if "rank" in rec else ""
            print(f"--- step {rec['step']}, row {rec['row']}{rank} (training-order row {rec['q']}, instance "
                  f"{rec['instance']}, {rec['path']} tokens {rec['file_offset']}..{rec['file_offset'] + view.L})",
                  file=stream)
            print(rec["text"], file=stream)
            if ids:  # " ".join(map(str, ids)), from orjson's "[1,2,3]"
                print("token ids: " + orjson.dumps(rec["token_ids"])[1:-1].replace(b",", b" ").decode(), file=stream)
    summary.update(bytes=view.bytes_fetched, requests=view.requests, seconds=time.perf_counter() - t0)
    return summary
