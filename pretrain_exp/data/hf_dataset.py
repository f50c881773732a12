"""``datasets`` corpora (``data=hf_dataset``) tokenized into OLMo-format token files.

``data.dataset`` is a Hub dataset id (``load_dataset(id, data.subset, split=data.split)``), a local data file or
glob pattern (``.parquet``, ``.arrow``, ``.json``/``.jsonl``, ``.csv``, ``.txt``: ``load_dataset(<builder>,
data_files=...)``), a folder of such files (``load_dataset(folder)``) or a folder written by
``Dataset.save_to_disk`` (``load_from_disk``). Column ``data.text_key`` is tokenized by a batched ``Dataset.map``
(``num_proc`` processes, ``datasets``' own progress bar), each document followed by the tokenizer's EOS (no BOS),
and written as token files with their ``.csv.gz`` document offsets (:mod:`pretrain_exp.data.token_files`).

The output folder ``<out_root>/<name>-<key>`` is keyed by the dataset's fingerprint (``datasets``' hash of its
source files or Hub revision and of every transform), the split, the text key, the tokenizer's vocabulary and the
EOS policy; ``tokens.json`` is written last and a folder holding it is reused as is. Hub access follows the
``datasets`` / ``huggingface_hub`` environment (``HF_HOME``, ``HF_DATASETS_OFFLINE``, ``HF_HUB_OFFLINE``,
``HF_TOKEN``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator, List, Optional

import numpy as np

from pretrain_exp.core.errors import ConfigError, DataError
from pretrain_exp.data.token_files import dtype_for_vocab, write_token_files

log = logging.getLogger(__name__)

#: ``datasets`` packaged builder of a data-file suffix
BUILDERS = {".parquet": "parquet", ".arrow": "arrow", ".json": "json", ".jsonl": "json", ".csv": "csv",
            ".txt": "text"}
EOS_POLICY = "eos-after-each-document"  #: part of the cache key: how documents are joined


def load_text_dataset(spec: str, split: str = "train", subset: Optional[str] = None):
    """The ``datasets.Dataset`` of ``spec`` (module docstring) at ``split``.

    :raises DataError: (naming ``data.dataset`` or ``data.split``) if the dataset cannot be found or read, or has
        no such split.
    """
    import datasets

    path = Path(spec).expanduser()
    try:
        if path.is_dir() and ((path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file()):
            ds = datasets.load_from_disk(str(path))
            if isinstance(ds, datasets.DatasetDict):
                if split not in ds:
                    raise DataError(f"data.split={split}: not a split of {spec} (splits: {sorted(ds)})")
                ds = ds[split]
            return ds
        if path.is_dir():
            return datasets.load_dataset(str(path), subset, split=split)
        builder = BUILDERS.get("".join(path.suffixes[-1:]).lower())
        if path.is_file() or (builder and any(c in spec for c in "*?[")):
            if builder is None:
                raise DataError(f"data.dataset={spec}: unknown data-file type {path.suffix!r}; known: "
                                f"{sorted(BUILDERS)}")
            return datasets.load_dataset(builder, data_files={split: str(path)}, split=split)
        if spec.startswith(("/", ".", "~")):
            raise DataError(f"data.dataset={spec}: no such file or folder")
        return datasets.load_dataset(spec, subset, split=split)
    except DataError:
        raise
    except (FileNotFoundError, datasets.exceptions.DatasetNotFoundError) as e:
        raise DataError(f"data.dataset={spec}: not found ({str(e).splitlines()[0]})") from None
    except ValueError as e:
        msg = str(e).splitlines()[0]
        if "split" in msg.lower():
            raise DataError(f"data.split={split}: {msg}") from None
        raise DataError(f"data.dataset={spec}: cannot load ({msg})") from None


def tokenize_dataset(spec: str, tokenizer, out_root: str | Path, split: str = "train",
                     subset: Optional[str] = None, text_key: str = "text", num_proc: int = 1,
                     progress: bool = True, dtype: Optional[np.dtype] = None) -> List[Path]:
    """Token files of dataset ``spec`` (module docstring), tokenized once and cached under ``out_root``.

    :param tokenizer: an HF fast tokenizer (its EOS separates documents).
    :param dtype: the token files' dtype, as :func:`~pretrain_exp.data.tokenize.tokenize_source`'s (``None``: the
        dtype the tokenizer's vocabulary needs; another is part of the cache key).
    :param num_proc: processes of the tokenizing ``map`` (1: in this process).
    :param progress: show ``datasets``' progress bar of the ``map``.
    :returns: the token-file paths, in order (documents in dataset order).
    :raises DataError: as :func:`load_text_dataset`; also for a missing or non-string ``text_key`` column, or a
        dataset without tokens.
    :raises ConfigError: (``data.num_proc``) for ``num_proc < 1``.
    """
    import datasets

    if num_proc < 1:
        raise ConfigError("data.num_proc", f"must be >= 1, got {num_proc}")
    ds = load_text_dataset(spec, split, subset)
    if text_key not in ds.column_names:
        raise DataError(f"data.text_key={text_key}: not a column of {spec} (columns: {ds.column_names})")
    feature = ds.features[text_key]
    if getattr(feature, "dtype", None) not in ("string", "large_string"):
        raise DataError(f"data.text_key={text_key}: column of {spec} holds {feature}, not text")
    eos = int(tokenizer.eos_token_id)
    vocab = (tokenizer.backend_tokenizer.to_str() if hasattr(tokenizer, "backend_tokenizer") else repr(tokenizer))
    parts = [ds._fingerprint, split, subset or "", text_key, vocab, EOS_POLICY, str(eos)]
    key = hashlib.sha256("\n".join(parts + ([] if dtype is None else [np.dtype(dtype).name])).encode()
                         ).hexdigest()[:16]
    slug = "".join(c if c.isalnum() or c in "-_." else "_" for c in Path(spec.rstrip("/")).name.split("*")[0])
    out = Path(out_root) / f"{slug or 'dataset'}-{key}"
    meta_path = out / "tokens.json"
    if meta_path.is_file():
        return [out / f for f in json.loads(meta_path.read_text())["files"]]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    os.chmod(tmp, 0o755)
    try:
        def encode(batch):
            texts = batch[text_key]
            if any(t is None for t in texts):
                raise DataError(f"data.text_key={text_key}: {spec} has an empty (null) document")
            ids = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
            return {"input_ids": [np.asarray(x, dtype=np.int64) for x in ids]}  # numpy: a fast Arrow conversion

        (tmp / "map").mkdir()
        quiet = not progress and not datasets.utils.are_progress_bars_disabled()
        if quiet:
            datasets.utils.disable_progress_bars()
        try:
            tokenized = ds.map(encode, batched=True, batch_size=256, num_proc=num_proc if num_proc > 1 else None,
                               remove_columns=ds.column_names, cache_file_name=str(tmp / "map" / "tokens.arrow"),
                               desc=f"tokenizing {spec}")
        finally:
            if quiet:
                datasets.utils.enable_progress_bars()
        docs = _documents(tokenized)
        dtype = dtype_for_vocab(len(tokenizer)) if dtype is None else np.dtype(dtype)
        files, total = write_token_files(docs, tmp, dtype, eos)
        shutil.rmtree(tmp / "map", ignore_errors=True)
        del tokenized
        if total == 0:
            raise DataError(f"data.dataset={spec}: split {split!r} yields no tokens")
        (tmp / "tokens.json").write_text(json.dumps({
            "source": spec, "split": split, "subset": subset, "text_key": text_key, "fingerprint": ds._fingerprint,
            "dtype": dtype.name, "eos_token_id": eos, "eos_policy": EOS_POLICY, "vocab_size": len(tokenizer),
            "num_documents": len(ds), "num_tokens": total, "files": files}, indent=1))
        if meta_path.is_file():  # another process finished first
            shutil.rmtree(tmp)
        else:
            if out.exists():  # a folder without tokens.json is incomplete
                shutil.rmtree(out)
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("data.dataset=%s: %d documents, %d tokens -> %s", spec, len(ds), total, out)
    return [out / f for f in json.loads(meta_path.read_text())["files"]]


def _documents(tokenized) -> Iterator[np.ndarray]:
    """The documents of the ``input_ids`` column of ``tokenized``, in order, read in Arrow batches."""
    for batch in tokenized.with_format("arrow").iter(batch_size=4096):
        for chunk in batch.column("input_ids").chunks:
            offsets, values = chunk.offsets.to_numpy(), chunk.values.to_numpy()
            for i in range(len(chunk)):
                yield values[offsets[i]:offsets[i + 1]]
