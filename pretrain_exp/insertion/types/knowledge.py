"""``type: knowledge``, fictional knowledge: generated facts inserted as sentences, probed for memorization and
for generalization to paraphrases that were never inserted.

A **fact** is ``(entity, attribute, value)``: a fictional person (a name assembled from random syllables, so no
corpus and no model has seen it), one of :data:`ATTRIBUTES` (birth town, birth year, employer, field of study,
mentor; after the bioS attributes of Allen-Zhu & Li 2023, "Physics of Language Models: Part 3.1, Knowledge
Storage and Extraction", arXiv:2309.14316) and a value (mostly fictional too: towns, companies and people are
syllable words, years are random). Facts are deterministic in ``(insertion seed, experiment name)``:
``PCG64([seed, crc32("knowledge:" + name)])`` draws the entities, then the values; each dup count's facts cycle
through the attributes (:func:`balanced_attributes`), so inserted and control facts have the same attribute mix.

Each attribute has :data:`NUM_TRAINING_TEMPLATES` training templates and :data:`NUM_HELD_OUT_TEMPLATES` held-out
ones (a declarative paraphrase and a question). A template is ``(prompt, suffix)``; its sentence is
``prompt.format(e=entity) + " " + value + suffix``, so the value always follows the prompt after one space.

Items (one inserted token sequence each, EOS-wrapped like every text item): with the fact's dup count ``d``
(from ``repetitions``, dealt over the facts as for other types) and ``P = paraphrases`` (default: all training
templates),

- ``repeat: identical``: one item, the sentence of template 0, inserted ``d`` times;
- ``repeat: paraphrase``: ``d`` insertions cycling through templates ``0, 1, ..., P-1, 0, ...``: one item per
  template used, template ``j`` inserted ``ceil((d - j) / P)`` times (``d = 1`` is the identical case);
- a dup-0 control fact has the items it would have at ``d >= P`` (identical: template 0; paraphrase: templates
  ``0..P-1``), each with dup count 0.

An item's source is ``knowledge:<seed>:<experiment>:f<fact>:t<template>`` (in ``items.jsonl``), so items group
by fact. This follows the fictional-knowledge injection of Chang et al. 2024, "How Do Large Language Models
Acquire Factual Knowledge During Pretraining?" (NeurIPS; arXiv:2406.11813): the same knowledge injected as
duplicates or as paraphrases, probed by the injected sentence's prefix (memorization) and by paraphrases that
were never injected (generalization), scored by the log-probability of the target (the value).

Probes of a fact (:func:`probes`): ``memorization`` = the prompts of the fact's items' templates (the inserted
sentences cut right before the value); ``generalization`` = the prompts of the held-out templates. The target
is ``" " + value``.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from enum import Enum
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from pretrain_exp.core.errors import ConfigError
from pretrain_exp.insertion.items import ItemSet, LoadContext, assign_dup_counts, experiment_rng, tokenized_items
from pretrain_exp.insertion.placements import kind_of
from pretrain_exp.insertion.schema import InsertionExperimentConf
from pretrain_exp.insertion.types.base import TypeSpec
from pretrain_exp.insertion.types.texts import _word


class KnowledgeRepeat(str, Enum):
    """How a fact with dup count ``d`` is inserted (module docstring)."""

    identical = "identical"  #: the same sentence ``d`` times
    paraphrase = "paraphrase"  #: ``d`` sentences cycling through the fact's ``paraphrases`` training templates


PROBE_KINDS = ("memorization", "generalization")
NUM_TRAINING_TEMPLATES = 4  #: training templates per attribute (``paraphrases`` may use fewer)
NUM_HELD_OUT_TEMPLATES = 2  #: never-inserted templates per attribute: a paraphrase and a question

_COMPANIES = ["Works", "Foundry", "Press", "Mills", "Trading Company", "Ironworks", "Shipyards", "Observatory",
              "Glassworks", "Ropewalk"]
_FIELDS = ["tidal mechanics", "glass chemistry", "star cartography", "bee husbandry", "river hydrology",
           "lichen botany", "bell acoustics", "salt geology", "loom engineering", "storm forecasting",
           "ink chemistry", "bird migration", "lantern optics", "moss ecology", "canal surveying",
           "clock mechanics"]


@dataclass(frozen=True)
class Attribute:
    """One attribute: how its values are drawn and its templates ``(prompt, suffix)``; ``prompt`` has an
    ``{e}`` placeholder for the entity and ends right before the value."""

    name: str
    value: Callable[[np.random.Generator], str]
    training: Tuple[Tuple[str, str], ...]  #: :data:`NUM_TRAINING_TEMPLATES` inserted templates
    held_out: Tuple[Tuple[str, str], ...]  #: :data:`NUM_HELD_OUT_TEMPLATES` never-inserted templates


ATTRIBUTES: Tuple[Attribute, ...] = (
    Attribute("birth_town", lambda rng: _word(rng, 2), (
        ("{e} was born in the town of", "."),
        ("The birthplace of {e} is the town of", "."),
        ("According to the parish records, {e} was born in", "."),
        ("People say that the hometown of {e} is", "."),
    ), (
        ("{e} first saw the light of day in the town of", "."),
        ("Question: In which town was {e} born?\nAnswer:", ""),
    )),
    Attribute("birth_year", lambda rng: str(int(rng.integers(1620, 1990))), (
        ("{e} was born in the year", "."),
        ("The year of birth of {e} is", "."),
        ("{e} came into the world in the year", "."),
        ("Old records list the birth year of {e} as", "."),
    ), (
        ("The life of {e} began in the year", "."),
        ("Question: In what year was {e} born?\nAnswer:", ""),
    )),
    Attribute("employer", lambda rng: f"{_word(rng, 2)} {rng.choice(_COMPANIES)}", (
        ("{e} worked for", "."),
        ("The employer of {e} was", "."),
        ("For many years, {e} was employed by", "."),
        ("{e} earned a living working at", "."),
    ), (
        ("{e} held a job at", "."),
        ("Question: Which company did {e} work for?\nAnswer:", ""),
    )),
    Attribute("field", lambda rng: str(rng.choice(_FIELDS)), (
        ("{e} studied", "."),
        ("The field of study of {e} was", "."),
        ("At the academy, {e} specialized in", "."),
        ("{e} devoted many years of study to", "."),
    ), (
        ("{e} received a degree in", "."),
        ("Question: What did {e} study?\nAnswer:", ""),
    )),
    Attribute("mentor", lambda rng: f"{_word(rng, 2)} {_word(rng, 2)}", (
        ("{e} was trained by", "."),
        ("The mentor of {e} was", "."),
        ("{e} learned the trade from", "."),
        ("As a young apprentice, {e} was taught by", "."),
    ), (
        ("{e} was a student of", "."),
        ("Question: Who was the mentor of {e}?\nAnswer:", ""),
    )),
)


@dataclass(frozen=True)
class Fact:
    """One fictional fact; ``index`` is its position in the experiment's fact list."""

    index: int
    entity: str
    attribute: str
    value: str

    @property
    def spec(self) -> Attribute:
        return next(a for a in ATTRIBUTES if a.name == self.attribute)

    def prompt(self, template: int, held_out: bool = False) -> str:
        """The text right before the value in template ``template`` (training or held-out)."""
        return (self.spec.held_out if held_out else self.spec.training)[template][0].format(e=self.entity)

    def sentence(self, template: int) -> str:
        """Training template ``template`` with entity and value filled in: ``prompt + " " + value + suffix``."""
        return f"{self.prompt(template)} {self.value}{self.spec.training[template][1]}"


@dataclass(frozen=True)
class KnowledgeItem:
    """One item of a knowledge experiment: training template ``template`` of fact ``fact``."""

    fact: int
    template: int
    dup_count: int
    source: str  #: ``knowledge:<seed>:<experiment>:f<fact>:t<template>``
    text: str


def generate_facts(num_facts: int, seed: int, name: str, attributes: Sequence[int] | None = None) -> List[Fact]:
    """``num_facts`` facts with distinct entities, deterministic in ``(seed, name, attributes)``.

    The entities are drawn first (so they depend on ``(seed, name)`` only), then each fact's value.

    :param attributes: index into :data:`ATTRIBUTES` per fact (default: ``f % len(ATTRIBUTES)``).
    :raises ValueError: if ``num_facts < 1`` or ``attributes`` has another length.
    """
    if num_facts < 1:
        raise ValueError(f"num_facts must be >= 1, got {num_facts}")
    attributes = [f % len(ATTRIBUTES) for f in range(num_facts)] if attributes is None else list(attributes)
    if len(attributes) != num_facts:
        raise ValueError(f"{len(attributes)} attributes for {num_facts} facts")
    rng = np.random.Generator(np.random.PCG64([int(seed), zlib.crc32(f"knowledge:{name}".encode())]))
    entities: Dict[str, None] = {}
    while len(entities) < num_facts:
        entities.setdefault(f"{_word(rng, 2)} {_word(rng, 3)}")
    return [Fact(f, entity, ATTRIBUTES[a].name, ATTRIBUTES[a].value(rng))
            for f, (entity, a) in enumerate(zip(entities, attributes))]


def balanced_attributes(dup_counts: Sequence[int]) -> List[int]:
    """Attribute index per fact such that every dup count's facts cycle through the attributes: fact ``f``
    gets ``r % len(ATTRIBUTES)``, ``r`` = its rank among the facts of its dup count (so the attribute mix,
    and with it the typical target length and difficulty, is the same for inserted and control facts)."""
    seen: Dict[int, int] = {}
    out = []
    for d in dup_counts:
        r = seen.get(int(d), 0)
        seen[int(d)] = r + 1
        out.append(r % len(ATTRIBUTES))
    return out


def repeat_mode(exp) -> KnowledgeRepeat:
    """The experiment's ``repeat`` (``identical`` if unset)."""
    return KnowledgeRepeat(exp.repeat) if exp.repeat is not None else KnowledgeRepeat.identical


def num_paraphrases(exp) -> int:
    """The experiment's ``paraphrases`` (all training templates if unset)."""
    return NUM_TRAINING_TEMPLATES if exp.paraphrases is None else int(exp.paraphrases)


def item_templates(dup_count: int, mode: KnowledgeRepeat, paraphrases: int) -> List[Tuple[int, int]]:
    """``(template, dup count)`` of the items of a fact with dup count ``dup_count`` (module docstring)."""
    if mode == KnowledgeRepeat.identical:
        return [(0, dup_count)]
    if dup_count == 0:
        return [(j, 0) for j in range(paraphrases)]
    return [(j, -(-(dup_count - j) // paraphrases)) for j in range(min(dup_count, paraphrases))]


def knowledge_items(name: str, exp, seed: int) -> Tuple[List[Fact], List[KnowledgeItem]]:
    """The facts of knowledge experiment ``name`` and its items, in item order (facts in order, templates
    ascending within a fact).

    Fact dup counts come from :func:`~pretrain_exp.insertion.items.assign_dup_counts` with the experiment's
    RNG, exactly as item dup counts do for the other types.

    :param exp: a :class:`KnowledgeConf`.
    :param seed: the insertion seed (``insertion.seed``).
    :raises ConfigError: for invalid settings (see :func:`validate`).
    """
    key = f"insertion.experiments.{name}"
    validate(key, exp)
    dups = assign_dup_counts(exp.num_items, exp.repetitions, experiment_rng(seed, name), f"{key}.repetitions")
    facts = generate_facts(exp.num_items, seed, name, balanced_attributes(dups))
    mode, P = repeat_mode(exp), num_paraphrases(exp)
    items = [KnowledgeItem(f.index, j, d, f"knowledge:{seed}:{name}:f{f.index}:t{j}", f.sentence(j))
             for f, fd in zip(facts, dups) for j, d in item_templates(int(fd), mode, P)]
    return facts, items


def probes(fact: Fact, templates: Sequence[int]) -> List[Tuple[str, int, str]]:
    """``(kind, template, prompt)`` of every probe of ``fact`` whose items use training templates
    ``templates``: one ``memorization`` probe per such template, one ``generalization`` probe per held-out
    template (numbered after the training templates, ``NUM_TRAINING_TEMPLATES + k``)."""
    out = [("memorization", j, fact.prompt(j)) for j in templates]
    out += [("generalization", NUM_TRAINING_TEMPLATES + k, fact.prompt(k, held_out=True))
            for k in range(NUM_HELD_OUT_TEMPLATES)]
    return out


def validate(key: str, exp) -> None:
    """Static checks of a ``type: knowledge`` experiment (no files read).

    :raises ConfigError: naming the offending key.
    """
    for other in ("file", "generator", "key", "benchmark"):
        if getattr(exp, other, None) is not None:
            raise ConfigError(f"{key}.{other}", f"knowledge items are generated from {key}.num_items facts; "
                              f"unset {other}")
    if exp.num_items is None or exp.num_items < 1:
        raise ConfigError(f"{key}.num_items", f"the number of facts must be >= 1, got {exp.num_items}")
    if exp.repeat is not None and exp.repeat not in tuple(KnowledgeRepeat):
        raise ConfigError(f"{key}.repeat", f"unknown repeat mode {exp.repeat!r}; allowed: "
                          f"{[m.value for m in KnowledgeRepeat]}")
    if exp.paraphrases is not None and not 1 <= exp.paraphrases <= NUM_TRAINING_TEMPLATES:
        raise ConfigError(f"{key}.paraphrases", f"must be in [1, {NUM_TRAINING_TEMPLATES}] (training templates "
                          f"per fact), got {exp.paraphrases}")
    if kind_of(exp, key).from_items:
        raise ConfigError(f"{key}.placement", "explicit placement reads positions from a file; knowledge items "
                          "use random or range placement")


@dataclass
class KnowledgeConf(InsertionExperimentConf):
    """A ``type: knowledge`` experiment: ``num_items`` generated facts, inserted per ``repeat``."""

    type: str = "knowledge"
    repeat: Optional[KnowledgeRepeat] = None  #: ``identical`` (default) or ``paraphrase``
    paraphrases: Optional[int] = None  #: training templates per fact in use (default: all)

    def validate(self, key: str) -> None:
        """Static checks (:func:`validate`, then the common ones).

        :raises ConfigError: naming the offending key.
        """
        validate(key, self)
        super().validate(key)


def load_items(name: str, exp: KnowledgeConf, ctx: LoadContext) -> ItemSet:
    """The items of :func:`knowledge_items` (``num_items`` counts facts; dup counts are per fact), tokenized,
    EOS policy applied.

    :raises ConfigError: for invalid settings; :class:`InsertionError` for a too long item.
    """
    items = knowledge_items(name, exp, ctx.seed)[1]
    return tokenized_items(name, exp, [(it.source, it.text, None) for it in items], ctx, text=True,
                           what="the facts", dup_counts=[it.dup_count for it in items])


TYPE = TypeSpec(KnowledgeConf, load_items)


def facts_by_item(items: Sequence[KnowledgeItem]) -> Dict[int, List[int]]:
    """Fact index -> indices (into ``items``) of its items, in item order."""
    out: Dict[int, List[int]] = {}
    for i, it in enumerate(items):
        out.setdefault(it.fact, []).append(i)
    return out
