"""Schemas of insertion experiments (``insertion=`` options; ``conf/insertion/<name>.yaml`` extends
``schema/insertion/base``) and the enums of placement and EOS policy.

Units: positions and lengths in tokens; ``placement.steps`` are global optimizer steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional

from omegaconf import II, MISSING


class InsertionType(str, Enum):
    """Where the items of an insertion experiment come from."""

    texts = "texts"  #: jsonl lines with a text under ``key`` (or a generator), tokenized with the model's tokenizer
    tokens = "tokens"  #: jsonl lines holding a list of token ids (under ``key``, or the line itself)
    benchmark = "benchmark"  #: multiple-choice questions of a benchmark asset as texts (``benchmark``, ``format``)
    gaussian = "gaussian"  #: seeded Gaussian noise on the input embeddings of whole rows (``sigma``; no tokens)
    knowledge = "knowledge"  #: generated fictional facts as texts (``num_items`` facts, ``repeat``, ``paraphrases``)
    corpus_chunks = "corpus_chunks"  #: token chunks of never-trained rows of the run's own corpus (i.i.d. control)


class KnowledgeRepeat(str, Enum):
    """How a ``knowledge`` fact with dup count ``d`` is inserted (see :mod:`pretrain_exp.insertion.knowledge`)."""

    identical = "identical"  #: the same sentence ``d`` times
    paraphrase = "paraphrase"  #: ``d`` sentences cycling through the fact's ``paraphrases`` training templates


class PlacementKind(str, Enum):
    """How insertion positions are chosen (see :mod:`pretrain_exp.insertion.placement`)."""

    random = "random"  #: uniform over the training window, never crossing a row boundary
    range = "range"  #: uniform over ``[start, end)`` of the window (fractions or token positions)
    explicit = "explicit"  #: global token positions read from each item's ``position_key``


class RangeUnit(str, Enum):
    """Unit of ``placement.start``/``placement.end`` for ``range`` placement."""

    fraction = "fraction"  #: fractions of the run's training window, 0.0 = first token, 1.0 = end
    position = "position"  #: absolute global token positions


class EosPolicy(str, Enum):
    """How an inserted item is delimited from the surrounding training text.

    ``wrap``: append EOS unless the item ends with it, then prepend EOS unless it starts with it (an item as
    its own EOS-delimited document, the way OLMo packs documents). ``append``: only the trailing EOS.
    ``none``: the tokens exactly as given.
    """

    wrap = "wrap"
    append = "append"
    none = "none"


@dataclass
class PlacementConf:
    """Placement of one insertion experiment (see :class:`PlacementKind`)."""

    kind: PlacementKind = PlacementKind.random
    start: Optional[float] = None  #: ``range`` only: window start, in ``unit``
    end: Optional[float] = None  #: ``range`` only: window end (exclusive), in ``unit``
    unit: RangeUnit = RangeUnit.fraction
    position_key: str = "position"  #: ``explicit`` only: jsonl key holding the global token position
    allow_row_crossing: bool = False  #: ``explicit`` only: let an item span two rows
    steps: List[int] = field(default_factory=list)  #: random/range: only the batches of these global steps
    every_n_steps: int = 0  #: random/range: only the batches of steps S+n, S+2n, ... of the run (0 = all)
    max_per_batch: int = 0  #: random/range: at most this many copies of the experiment per global batch (0 = any)


@dataclass
class InsertionExperimentConf:
    """One named insertion experiment: items, how often each is inserted, and where."""

    type: InsertionType = MISSING
    file: Optional[str] = None  #: jsonl file of items (exclusive with ``generator``)
    key: Optional[str] = None  #: jsonl key of the text / token list (default ``text``; ``tokens``: the line itself)
    generator: Optional[str] = None  #: built-in item generator (``texts`` only), e.g. ``fictional_bios``
    num_items: Optional[int] = None  #: items to generate, the first N items of ``file`` or of a shuffled benchmark
    repetitions: Any = 1  #: dup count: int, float (fractional, see docs) or a list of dup counts per item group
    eos: EosPolicy = EosPolicy.wrap
    placement: PlacementConf = field(default_factory=PlacementConf)
    benchmark: Optional[str] = None  #: ``type=benchmark``: arc_easy, arc_challenge, sciq, piqa, mmlu, mmlu_<subject>
    format: str = "cloze"  #: ``type=benchmark``: ``cloze`` (question + answer text) or ``lettered`` (A/B/C/D)
    sigma: Optional[float] = None  #: ``type=gaussian``: std of the noise per embedding coordinate (> 0)
    repeat: Optional[KnowledgeRepeat] = None  #: ``type=knowledge``: ``identical`` (default) or ``paraphrase``
    paraphrases: Optional[int] = None  #: ``type=knowledge``: training templates per fact in use (default: all)
    chunk_tokens: int = 64  #: ``type=corpus_chunks``: tokens per item (the start of one never-trained row)


@dataclass
class InsertionConf:
    """All insertion experiments of a run (``insertion=`` options add entries to ``experiments``)."""

    seed: int = II("seed")  # type: ignore[assignment]
    verify: bool = True  #: read every affected row back through the data path after planning
    experiments: Dict[str, InsertionExperimentConf] = field(default_factory=dict)
    withheld: List[str] = field(default_factory=list)  #: placed like the others but not inserted nor evaluated
