"""The one helper the plugin registries type a config node with (:func:`pretrain_exp.core.config.typed_node`),
and the one argument order ``typed_node(key, node)`` of frameworks, insertion types and evals."""

import inspect

import pytest
from omegaconf import OmegaConf

from pretrain_exp.core.config import typed_node
from pretrain_exp.core.errors import ConfigError
from pretrain_exp.evals import registry as evals
from pretrain_exp.frameworks import registry as frameworks
from pretrain_exp.insertion import types


@pytest.mark.parametrize("module", [frameworks, types, evals])
def test_every_plugin_kind_types_a_node_with_key_first(module):
    assert list(inspect.signature(module.typed_node).parameters)[:2] == ["key", "node"]


def test_a_node_is_typed_by_its_tag_and_named_by_its_key():
    node = OmegaConf.create({"name": "hf", "attn_implementation": "eager"})
    typed = frameworks.typed_node("sweep.framework", node)
    assert OmegaConf.get_type(typed).__name__ == "HFConf"
    assert typed.attn_implementation == "eager"
    assert frameworks.typed_node("framework", typed) is typed
    with pytest.raises(ConfigError) as e:
        frameworks.typed_node("sweep.framework", {"name": "hf", "lr_schedule": "run"})
    assert e.value.key == "sweep.framework.lr_schedule"
    with pytest.raises(ConfigError) as e:
        types.typed_node("insertion.experiments.mine", {"type": "nope"})
    assert e.value.key == "insertion.experiments.mine.type" and "allowed" in str(e.value)


def test_unknown_or_unset_tag_lists_the_registered_names():
    with pytest.raises(ConfigError) as e:
        typed_node("eval.tasks.x", {}, "type", {"a": 1, "b": 2}, lambda n: dict, "eval type")
    assert e.value.key == "eval.tasks.x.type" and "['a', 'b']" in str(e.value)
