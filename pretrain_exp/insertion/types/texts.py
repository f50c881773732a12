"""``type: texts``: texts read from a jsonl file (under ``key``, default ``text``) or made by a built-in generator,
tokenized with the model's tokenizer.

Without ``file`` and ``generator`` (``python -m pretrain_exp insertion=texts`` as typed) the experiment uses the
16 sample texts shipped with the package (:data:`SAMPLE_TEXTS`: short invented biographies and facts, so novel to
any model) and says so in the log; ``conf/insertion/texts.yaml`` inserts a quarter of them 0/1/4/16 times.

Built-in generators (``generator``) make novel texts, deterministic from a seed: each maps ``(num_items, seed)``
to a list of texts that are not in any corpus: names and places are assembled from random syllables, so a model
cannot have seen them in pretraining and every item is distinct.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np

from pretrain_exp.core.errors import ConfigError, DataError
from pretrain_exp.core.io import check_text, file_lock
from pretrain_exp.insertion import text_cache
from pretrain_exp.insertion.items import (
    ItemSet,
    LoadContext,
    encode_texts,
    first_items,
    read_item_file,
    tokenized_items,
)
from pretrain_exp.insertion.schema import InsertionExperimentConf
from pretrain_exp.insertion.types.base import LOSS_GAP, TypeSpec

log = logging.getLogger(__name__)

#: the sample items of an experiment without ``file`` and ``generator`` (package data, jsonl, key ``text``)
SAMPLE_TEXTS = Path(__file__).with_name("sample_texts.jsonl")

_ONSETS = ["b", "br", "d", "dr", "f", "g", "gl", "k", "kr", "l", "m", "n", "p", "pl", "r", "s", "st", "t",
           "th", "v", "z", "qu", "sh", "ch", "w", "y"]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ei", "ou", "ia", "y"]
_CODAS = ["", "n", "r", "l", "s", "th", "x", "m", "nd", "rk", "sk", "v"]
_PROFESSIONS = ["cartographer", "glassblower", "beekeeper", "astronomer", "clockmaker", "botanist",
                "ferryman", "archivist", "lute maker", "salt merchant", "bridge engineer", "dyer",
                "falconer", "cooper", "lighthouse keeper", "mapmaker", "apothecary", "stonemason", "weaver",
                "shipwright"]
_OBJECTS = ["tidal clocks", "copper lanterns", "river maps", "winter bees", "blue glass", "star charts",
            "salt roads", "paper boats", "iron bells", "moss gardens", "silver looms", "storm kites"]
_TRAITS = ["kept a tame heron", "refused to travel by boat", "wrote only in green ink",
           "collected broken compasses", "spoke four forgotten dialects",
           "slept in a lighthouse every summer", "never ate bread", "carried a brass owl",
           "walked barefoot in snow", "counted every step of the harbour stairs"]


def _word(rng: np.random.Generator, syllables: int) -> str:
    parts = [rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables)]
    return "".join(parts).capitalize()


def fictional_bios(num_items: int, seed: int) -> List[str]:
    """Short biographies of fictional people (about 40 tokens each), unique names, deterministic in
    ``seed``."""
    rng = np.random.Generator(np.random.PCG64([int(seed), 0xB105]))
    names: set = set()
    out = []
    while len(out) < num_items:
        name = f"{_word(rng, 2)} {_word(rng, 3)}"
        if name in names:
            continue
        names.add(name)
        first = name.split()[0]
        out.append(
            f"{name} was born in {int(rng.integers(1610, 1890))} in the village of {_word(rng, 2)}. "
            f"A {rng.choice(_PROFESSIONS)} by trade, {first} built {int(rng.integers(3, 40))} "
            f"{rng.choice(_OBJECTS)} and {rng.choice(_TRAITS)}."
        )
    return out


GENERATORS: Dict[str, Callable[[int, int], List[str]]] = {"fictional_bios": fictional_bios}


@dataclass
class TextsConf(InsertionExperimentConf):
    """A ``type: texts`` experiment: ``file`` (texts under ``key``, default ``text``) or ``generator``; neither:
    the sample texts (:data:`SAMPLE_TEXTS`)."""

    type: str = "texts"
    generator: Optional[str] = None  #: built-in item generator (exclusive with ``file``), e.g. ``fictional_bios``

    def validate(self, key: str) -> None:
        """Static checks (no files read).

        :raises ConfigError: naming the offending key.
        """
        if self.file is not None and self.generator is not None:
            raise ConfigError(key, f"file ({self.file!r}) and generator ({self.generator!r}) are exclusive; "
                              "set only one")
        if self.generator is not None:
            if self.generator not in GENERATORS:
                raise ConfigError(f"{key}.generator",
                                  f"unknown generator {self.generator!r}; allowed: {sorted(GENERATORS)}")
            if self.num_items is None:
                raise ConfigError(f"{key}.num_items", "required with a generator")
        super().validate(key)


def load_items(name: str, exp: TextsConf, ctx: LoadContext) -> ItemSet:
    """The experiment's items: generated texts (sources ``<generator>:<seed>:<index>``) or the texts of
    ``exp.file`` (sources ``file:line``), tokenized in batches, EOS policy applied, dup counts assigned. With
    ``ctx.cache_dir`` set, the token ids of a file are cached (:mod:`~pretrain_exp.insertion.text_cache`), so a
    second build of the same file does not run the tokenizer.

    :raises DataError: for file problems (naming file and line).
    :raises InsertionError: for an empty or too long item, naming it.
    """
    key = f"insertion.experiments.{name}"
    if exp.file is None and exp.generator is None:
        exp = dataclasses.replace(exp, file=str(SAMPLE_TEXTS), key=None)
        log.info(f"{key}: no file given, using the sample texts shipped with pretrain_exp ({SAMPLE_TEXTS}) at dup "
                 f"counts {exp.repetitions}; set {key}.file=<items.jsonl> (key: text) for your own")
    if exp.generator is not None:
        raw = [(f"{exp.generator}:{ctx.seed}:{i}", text, None)
               for i, text in enumerate(GENERATORS[exp.generator](exp.num_items, ctx.seed))]
    else:
        field = exp.key or "text"

        def check(where, payload):
            if not isinstance(payload, str):
                raise DataError(f"{where}: {field!r} must be a string, got {type(payload).__name__}")
            check_text(where, field, payload)

        raw = list(read_item_file(key, exp, field, check))
    raw = first_items(key, exp, raw)
    encoded = None
    path = (text_cache.cache_path(ctx.cache_dir, exp.file, ctx.tokenizer, exp.eos.value, exp.num_items)
            if exp.file is not None and ctx.cache_dir and raw else None)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with file_lock(path.with_suffix(".lock")):  # the jobs of a sweep tokenize one file once
            t0 = time.perf_counter()
            encoded = text_cache.load(path, len(raw))
            if encoded is not None:
                log.info(f"{exp.file}: token ids of {len(raw):,} texts from the cache {path} "
                         f"({time.perf_counter() - t0:.2f} s)")
            else:
                encoded = encode_texts([r[1] for r in raw], ctx.tokenizer, exp.file, sources=[r[0] for r in raw])
                text_cache.save(path, *encoded, {"file": str(exp.file), "eos": exp.eos.value,
                                                 "num_items": exp.num_items})
    return tokenized_items(name, exp, raw, ctx, text=True, what=exp.file or exp.generator, encoded=encoded)


TYPE = TypeSpec(TextsConf, load_items, effect=LOSS_GAP)
