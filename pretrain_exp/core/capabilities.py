"""What a plugin can do, declared one way for every plugin kind (frameworks, insertion types, evals).

A plugin's class holds ``capabilities: ClassVar[Capabilities] = Capabilities(<kind>, {<name>, ...})``: a
framework on its :class:`~pretrain_exp.frameworks.base.Framework` subclass, an insertion type on its schema
(:class:`~pretrain_exp.insertion.schema.InsertionExperimentConf` subclass), an eval on its schema
(:class:`~pretrain_exp.evals.base.EvalTaskConf` subclass). Every check reads them through :func:`has`. The names
are the constants below, each listed under the one kind that may declare it (:data:`KNOWN`); a name that is not
one of its kind's is a ``ValueError`` when the class is defined (so at import), and :func:`has` refuses a name
that the plugin's kind does not know.

The rules that need two plugins at once (a framework that must apply the noise an insertion type adds, ...) read
them in :func:`pretrain_exp.app.validate.check_plugins`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, FrozenSet

FRAMEWORK = "framework"
INSERTION_TYPE = "insertion type"
EVAL = "eval"

# --- frameworks ---------------------------------------------------------------------------------------------------
#: ``train`` adds the Gaussian-poisoning noise of ``embedding_noise`` experiments (through
#: :class:`~pretrain_exp.frameworks.noise_feed.NoiseFeed`)
APPLIES_EMBEDDING_NOISE = "applies_embedding_noise"
#: ``model.init=random`` (pretraining from the engine's own initialisation of ``model.config``) works
SUPPORTS_RANDOM_INIT = "supports_random_init"
#: ``train`` reads ``rows.plan`` anew on every call, so spans added between segments (``insertion.dynamic``) are
#: trained by the next segment
READS_PLAN_PER_SEGMENT = "reads_plan_per_segment"
#: ``train`` can return before its segment-end checkpoint is on disk (``training.checkpoint_async``)
SAVES_ASYNC = "saves_async"
#: ``resolve_model`` loads HF Hub model ids (``model.path=<org>/<name>``, ``model.revision``)
LOADS_HUB_MODELS = "loads_hub_models"
#: its checkpoints are HF model dirs, so a release has the final step's model without ``training.export_hf``
CHECKPOINTS_ARE_HF = "checkpoints_are_hf"
#: ``training.precision=fp8`` trains (float8 matmuls in the linear layers; the machine's own rules are
#: :func:`pretrain_exp.app.launch.check_machine`'s)
TRAINS_FP8 = "trains_fp8"
# --- insertion types ----------------------------------------------------------------------------------------------
#: its copies add noise to the input embeddings instead of inserting tokens: only a framework that
#: :data:`APPLIES_EMBEDDING_NOISE` trains them, and dynamic insertion cannot place them
EMBEDDING_NOISE = "embedding_noise"
# --- evals --------------------------------------------------------------------------------------------------------
#: it shares its model forwards over the ranks under ``eval.mode=distributed``
#: (:func:`pretrain_exp.evals.shard.map_batches`, or lm-eval's data-parallel path), so it runs on every rank; an
#: eval without it runs on rank 0 alone while the others wait
SHARDED = "sharded"

#: plugin kind -> the capability names it may declare
KNOWN: Dict[str, FrozenSet[str]] = {
    FRAMEWORK: frozenset({APPLIES_EMBEDDING_NOISE, SUPPORTS_RANDOM_INIT, READS_PLAN_PER_SEGMENT, SAVES_ASYNC,
                          LOADS_HUB_MODELS, CHECKPOINTS_ARE_HF, TRAINS_FP8}),
    INSERTION_TYPE: frozenset({EMBEDDING_NOISE}),
    EVAL: frozenset({SHARDED}),
}


@dataclass(frozen=True)
class Capabilities:
    """The capabilities one plugin declares: its ``kind`` (:data:`FRAMEWORK`, :data:`INSERTION_TYPE` or
    :data:`EVAL`) and the names it has (a subset of ``KNOWN[kind]``).

    :raises ValueError: for an unknown kind, or a name that is not one of that kind's (listing the known ones).
    """

    kind: str
    names: FrozenSet[str] = frozenset()

    def __post_init__(self):
        if self.kind not in KNOWN:
            raise ValueError(f"unknown plugin kind {self.kind!r}; known: {sorted(KNOWN)}")
        names = frozenset([self.names] if isinstance(self.names, str) else self.names)
        for name in sorted(names):
            self._check(name)
        object.__setattr__(self, "names", names)

    def _check(self, name: str) -> None:
        if name not in KNOWN[self.kind]:
            raise ValueError(f"unknown {self.kind} capability {name!r}; known: {sorted(KNOWN[self.kind])}")

    def __contains__(self, name: object) -> bool:
        self._check(name)  # type: ignore[arg-type]
        return name in self.names

    def without(self, *names: str) -> "Capabilities":
        """These capabilities less ``names`` (a subclass that cannot do what its parent does)."""
        for name in names:
            self._check(name)
        return Capabilities(self.kind, self.names - set(names))


def has(plugin: Any, name: str) -> bool:
    """Whether ``plugin`` (a class or an instance) declares capability ``name`` in its ``capabilities`` (an object
    without that attribute declares none).

    :raises ValueError: for a name that its kind does not know (or, for an object that declares none, that no kind
        knows). :raises TypeError: for a ``capabilities`` that is not a :class:`Capabilities`.
    """
    caps = getattr(plugin, "capabilities", None)
    if caps is None:
        if not any(name in names for names in KNOWN.values()):
            raise ValueError(f"unknown capability {name!r}; known: {sorted(set().union(*KNOWN.values()))}")
        return False
    if not isinstance(caps, Capabilities):
        owner = getattr(plugin, "__name__", type(plugin).__name__)
        raise TypeError(f"{owner}.capabilities must be a Capabilities, got {type(caps).__name__}")
    return name in caps
