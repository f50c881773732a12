"""What every eval gets and returns (docs/development/contributing.md): :class:`EvalContext` in,
:class:`EvalResult` out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Dict, List, Optional

import numpy as np
from omegaconf import MISSING

from pretrain_exp.core.capabilities import EVAL, SHARDED, Capabilities


@dataclass
class EvalTaskConf:
    """The schema every eval's config extends (``eval.tasks.<name>``; ``type`` is its registry name). An eval checks
    its own values in :meth:`validate`, called with the key it is configured under, so a task named otherwise than
    its type (``eval.tasks.mybench`` with ``type: benchmark``) is reported under its own key."""

    #: what the eval can do (:mod:`pretrain_exp.core.capabilities`): ``sharded`` here (it shares its forwards over
    #: the ranks under ``eval.mode=distributed``); an eval that does not overrides it with ``Capabilities(EVAL)``
    capabilities: ClassVar[Capabilities] = Capabilities(EVAL, {SHARDED})
    type: str = MISSING

    def validate(self, key: str) -> None:
        """The eval's one-schema checks (none here).

        :param key: the dotted key the task is configured under (``eval.tasks.<name>``).
        :raises ConfigError: naming ``<key>.<field>``.
        """

    def check_experiments(self, key: str, experiments: Dict[str, Any]) -> None:
        """The eval's rules against the run's insertion experiments (name -> their schemas), checked when the
        run's config is validated (none here).

        :raises ConfigError: naming ``key`` or a key under it.
        """


@dataclass
class EvalContext:
    """What an eval gets besides its config.

    ``model`` is an HF causal LM in eval mode; ``plan`` the run's insertion plan (items, including dup-0
    controls); ``held_out`` the held-out rows of the corpus as an ``int64`` array of shape ``(n, L)``.
    """

    model: Any
    tokenizer: Any
    plan: Any
    held_out: np.ndarray
    step: int
    batch_size: int
    seed: int
    cache_dir: Optional[str] = None  #: the run's asset cache (None: ``$PRETRAIN_EXP_CACHE`` or ``~/.cache/...``)
    row_tokens: Optional[Callable[[int], np.ndarray]] = None  #: training-order row q -> its tokens as trained
    insertion: Any = None  #: the run's :class:`~pretrain_exp.insertion.schema.InsertionConf`, if known
    #: Monte-Carlo relabellings of a randomization test that is not exact (``eval.permutations``)
    permutations: int = 9999
    p_adjust: str = "holm"  #: multiplicity adjustment within an eval's effects at a step (``eval.p_adjust``)


@dataclass
class EvalResult:
    """Output of one eval on one checkpoint."""

    metrics: Dict[str, float] = field(default_factory=dict)  #: flat name -> value
    per_dup: List[Dict[str, Any]] = field(default_factory=list)  #: per (experiment, dup count) summary rows
    rows: List[Dict[str, Any]] = field(default_factory=list)  #: optional per-item rows
    #: effect rows (:func:`pretrain_exp.core.stats.per_dup_effects`): each dup-vs-control contrast with its
    #: interval, randomization p and adjusted p, and the trend test (the primary endpoint)
    effects: List[Dict[str, Any]] = field(default_factory=list)
