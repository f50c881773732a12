"""The OLMo safetensors key reader decodes plain pickles from their opcodes and refuses anything that would run
code (``pretrain_exp.frameworks.olmo2.checkpoint._plain_unpickle``)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from pretrain_exp.frameworks.olmo2.checkpoint import _plain_unpickle

VALUES = [
    (("model", "transformer.blocks.0.att_proj.weight"), False),  # an OLMo safetensors key
    {"lr": 4e-4, "betas": [0.9, 0.95], "step": 2 ** 40, "name": "adamw", "fused": None, "amsgrad": False},
    [1, -1, 255, 65536, -(2 ** 70), 1.5, "é", b"\x00\xff", (), [], {}, (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)],
]


@pytest.mark.parametrize("protocol", [0, 2, 3, 4, 5])
@pytest.mark.parametrize("value", VALUES)
def test_plain_values_read_as_pickle_loads_them(value, protocol):
    data = pickle.dumps(value, protocol=protocol)
    if protocol < 3 and isinstance(value, list) and b"\x00\xff" in value:  # protocols 0-2 pickle bytes through a
        with pytest.raises(ValueError, match="refusing to load .*encode"):  # global (_codecs.encode): refused
            _plain_unpickle(data)
        return
    assert _plain_unpickle(data) == pickle.loads(data)


def test_shared_references_come_back_through_the_memo():
    inner = ["x"]
    got = _plain_unpickle(pickle.dumps([inner, inner], protocol=4))
    assert got == [["x"], ["x"]] and got[0] is got[1]


@pytest.mark.parametrize("protocol", [2, 4])
@pytest.mark.parametrize("value, named", [(Path("a"), "pathlib"), ({"f": print}, "print"),
                                          (range(3), "range")])
def test_a_global_is_refused_by_name(value, named, protocol):
    with pytest.raises(ValueError, match=f"refusing to load .*{named}"):
        _plain_unpickle(pickle.dumps(value, protocol=protocol))
