"""Plugin capabilities are declared one way for frameworks, insertion types and evals
(:mod:`pretrain_exp.core.capabilities`): an unknown name is refused when the class is defined, every registered
plugin declares its kind's, and no plugin keeps a flag of its own beside them."""

from __future__ import annotations

import ast
import dataclasses
from typing import ClassVar

import pytest

from pretrain_exp.core.capabilities import (
    APPLIES_EMBEDDING_NOISE,
    EMBEDDING_NOISE,
    EVAL,
    FRAMEWORK,
    INSERTION_TYPE,
    KNOWN,
    SHARDED,
    SUPPORTS_RANDOM_INIT,
    Capabilities,
    has,
)
from pretrain_exp.evals.registry import EVALS, EvalSpec
from pretrain_exp.frameworks.registry import FRAMEWORKS, get_framework_class
from pretrain_exp.insertion.schema import InsertionExperimentConf
from pretrain_exp.insertion.types import TYPES, schema
from tests.conftest import ROOT


def test_an_unknown_capability_is_refused_when_the_plugin_class_is_defined():
    with pytest.raises(ValueError, match=r"unknown framework capability 'applies_noise'; known: \["):
        class Typo:  # noqa: F841
            capabilities = Capabilities(FRAMEWORK, {"applies_noise"})
    with pytest.raises(ValueError, match=r"unknown insertion type capability 'sharded'; known: \['embedding_noise'\]"):
        @dataclasses.dataclass
        class OtherKinds(InsertionExperimentConf):  # noqa: F841  # an eval's capability on an insertion type
            capabilities: ClassVar[Capabilities] = Capabilities(INSERTION_TYPE, {SHARDED})
    with pytest.raises(ValueError, match="unknown plugin kind 'trainer'"):
        Capabilities("trainer")


def test_has_reads_the_declaration_and_refuses_a_name_of_another_kind():
    hf = get_framework_class("hf")
    assert has(hf, APPLIES_EMBEDDING_NOISE) and has(hf, SUPPORTS_RANDOM_INIT)
    continues_only = type("ContinuesOnly", (hf,), {"capabilities": hf.capabilities.without(SUPPORTS_RANDOM_INIT)})
    assert not has(continues_only, SUPPORTS_RANDOM_INIT) and has(continues_only, APPLIES_EMBEDDING_NOISE)
    with pytest.raises(ValueError, match="unknown framework capability 'sharded'"):
        has(hf, SHARDED)
    with pytest.raises(ValueError, match="unknown capability 'nope'"):
        has(object(), "nope")
    assert not has(object(), EMBEDDING_NOISE)  # declares none
    with pytest.raises(TypeError, match="must be a Capabilities"):
        has(type("Flags", (), {"capabilities": {APPLIES_EMBEDDING_NOISE}}), APPLIES_EMBEDDING_NOISE)


def _plugins():
    frameworks = list(FRAMEWORKS)  # the olmo extra is installed with the tests
    return ([(FRAMEWORK, get_framework_class(n)) for n in frameworks]
            + [(INSERTION_TYPE, schema(n)) for n in TYPES]
            + [(EVAL, EVALS[n].config) for n in EVALS])


def test_every_registered_plugin_declares_its_kinds_capabilities_and_no_flag_besides():
    plugins = _plugins()
    assert {kind for kind, _ in plugins} == set(KNOWN)
    every = set().union(*KNOWN.values())
    for kind, cls in plugins:
        assert isinstance(cls.capabilities, Capabilities) and cls.capabilities.kind == kind, cls
        assert not every & set(vars(cls)) and not any(every & set(vars(c)) for c in cls.__mro__), cls
    assert not hasattr(EvalSpec, "sharded")  # read from the eval's schema
    assert {name for name, spec in EVALS.items() if has(spec.config, SHARDED)} >= {"insertion_loss", "perplexity"}
    assert has(schema("gaussian"), EMBEDDING_NOISE) and not has(schema("texts"), EMBEDDING_NOISE)


def test_the_frameworks_declare_what_they_did_before():
    caps = {n: get_framework_class(n).capabilities.names for n in FRAMEWORKS}
    assert caps == {
        "hf": {"applies_embedding_noise", "supports_random_init", "reads_plan_per_segment", "loads_hub_models",
               "checkpoints_are_hf"},
        "olmo_core": {"applies_embedding_noise", "supports_random_init", "reads_plan_per_segment", "saves_async",
                      "trains_fp8"},
        "olmo2": {"applies_embedding_noise", "reads_plan_per_segment", "saves_async", "trains_fp8"},
    }


def test_the_framework_base_is_framework_neutral():
    from pretrain_exp.frameworks.base import Framework

    tree = ast.parse((ROOT / "frameworks" / "base.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    concrete = {f"pretrain_exp.frameworks.{n}" for n in FRAMEWORKS}
    assert not {m for m in imported if m and any(m == c or m.startswith(c + ".") for c in concrete)}
    assert not Framework.capabilities.names
    assert {"resolve_model", "tokenizer_path", "vocab_size", "initial_checkpoint"} <= Framework.__abstractmethods__
