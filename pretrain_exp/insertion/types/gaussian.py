"""``type: gaussian``: Gaussian poisoning, seeded noise patterns added to the input embeddings of whole training
rows (definition, seeds and the framework hook: :mod:`pretrain_exp.insertion.noise`).

An experiment has ``num_items`` noise patterns (its items, without tokens) of std ``sigma``; a pattern's dup count
is how many rows get it. With explicit placement each line of ``file`` gives the global token positions of one
pattern's rows under ``placement.position_key`` (each a row start ``q * L``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from pretrain_exp.core.capabilities import EMBEDDING_NOISE, INSERTION_TYPE, Capabilities
from pretrain_exp.core.errors import ConfigError, InsertionError
from pretrain_exp.insertion.items import (
    ItemSet,
    LoadContext,
    assign_dup_counts,
    experiment_rng,
    first_items,
    read_item_file,
)
from pretrain_exp.insertion.placements import kind_of
from pretrain_exp.insertion.schema import InsertionExperimentConf
from pretrain_exp.insertion.types.base import TypeSpec


@dataclass
class GaussianConf(InsertionExperimentConf):
    """A ``type: gaussian`` experiment: ``num_items`` noise patterns of std ``sigma``."""

    capabilities = Capabilities(INSERTION_TYPE, {EMBEDDING_NOISE})
    type: str = "gaussian"
    sigma: Optional[float] = None  #: std of the noise per embedding coordinate (> 0; the reference uses 0.075)

    def validate(self, key: str) -> None:
        """Static checks (no files read).

        :raises ConfigError: naming the offending key.
        """
        if self.sigma is None:
            raise ConfigError(f"{key}.sigma", "required for type=gaussian: the noise std per embedding coordinate "
                              "(e.g. 0.075)")
        if not (math.isfinite(self.sigma) and self.sigma > 0):
            raise ConfigError(f"{key}.sigma", f"must be a finite number > 0, got {self.sigma}")
        explicit = kind_of(self, key).from_items
        if self.file is not None and not explicit:
            raise ConfigError(f"{key}.file", "type=gaussian reads a file only for explicit placement (the rows of "
                              "each pattern); random/range patterns are generated: set num_items instead")
        if not explicit and self.num_items is None:
            raise ConfigError(f"{key}.num_items", "required for type=gaussian: the number of noise patterns")
        if self.placement.allow_row_crossing:
            raise ConfigError(f"{key}.placement.allow_row_crossing", "gaussian noise covers whole rows")
        super().validate(key)


def load_items(name: str, exp: GaussianConf, ctx: LoadContext) -> ItemSet:
    """The noise patterns: items without tokens, ``noise_sigma = exp.sigma`` (sources ``gaussian:<seed>:<index>``,
    or ``file:line`` for explicit placement, whose lines give the positions of the pattern's rows).

    :raises DataError: for file problems (naming file and line).
    :raises InsertionError: for a file without items.
    """
    key = f"insertion.experiments.{name}"
    sigma = float(exp.sigma)
    if kind_of(exp, key).from_items:
        raw = first_items(key, exp, list(read_item_file(key, exp, None)))  # a line holds only its positions
        if not raw:
            raise InsertionError(f"{key}: {exp.file} yields no items")
        return ItemSet.from_token_lists(name, [[] for _ in raw], [len(r[2]) for r in raw],
                                        sources=[r[0] for r in raw], positions=[r[2] for r in raw],
                                        noise_sigma=sigma)
    n = int(exp.num_items)
    dups = assign_dup_counts(n, exp.repetitions, experiment_rng(ctx.seed, name), f"{key}.repetitions")
    return ItemSet.from_token_lists(name, [[] for _ in range(n)], dups,
                                    sources=[f"gaussian:{ctx.seed}:{i}" for i in range(n)], noise_sigma=sigma)


TYPE = TypeSpec(GaussianConf, load_items)
