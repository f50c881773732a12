"""Dynamic policies are registered plugins with their own options' schema: a policy defined here, in the test module,
and added to :data:`~pretrain_exp.insertion.policies.POLICIES` is parsed, decides and reports through the closed
loop without any other file; an option of another policy is refused naming that policy; an unknown policy lists the
registered ones; a mapping saved with every policy's options parses as its own policy's."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from pretrain_exp.core.errors import ConfigError
from pretrain_exp.insertion import dynamic
from pretrain_exp.insertion.policies import POLICIES, get_policy, schema
from pretrain_exp.insertion.policies.base import DynamicConf, Policy
from pretrain_exp.insertion.policies.spaced_repetition import SpacedRepetitionConf
from pretrain_exp.insertion.policies.until_memorized import UntilMemorizedConf
from tests.unit.insertion.test_dynamic import _Exp, _plan, _Task

EXPS, TASKS = {"a": _Exp(), "b": _Exp()}, {"loss": _Task()}


@dataclass
class AboveConf(DynamicConf):
    """Options of the test policy ``above``."""

    policy: str = "above"
    ceiling: float = 5.0  #: insert while the loss is above this

    def validate(self, key):
        if self.ceiling <= 0:
            raise ConfigError(f"{key}.ceiling", f"must be > 0, got {self.ceiling}")


class Above(Policy):
    """A new policy: insert every target whose loss is above ``ceiling``."""

    name = "above"
    schema = AboveConf

    def choose(self, targets, step, history, last_copy_step, planned):
        return np.asarray([i for i in targets if history[step].get(int(i), 0.0) > self.conf.ceiling], np.int64)

    def item_report(self, item, history, copy_steps, start):
        return {"copies": int(copy_steps.size)}


@pytest.fixture
def above(monkeypatch):
    """``insertion.dynamic.policy: above`` registered for the test: one registry line, nothing else."""
    monkeypatch.setitem(POLICIES, "above", f"{__name__}:Above")


def test_a_policy_registered_in_a_test_runs_the_closed_loop(above):
    conf = dynamic.parse_dynamic({"policy": "above", "ceiling": 2.0, "controls": 0, "allow_no_controls": True},
                                 EXPS, TASKS)
    assert type(conf) is AboveConf and conf.task == "loss" and get_policy("above") is Above
    plan = _plan()
    arms = dynamic.assign_arms(plan, conf, 0)
    hist = {0: {0: 3.0, 1: 1.5, 2: 2.5, 3: 2.0, 4: 9.0, 5: 0.1}}
    rec = dynamic.decide(plan, conf, 0, 4, hist, 0, arms)
    assert rec["items"] == [0, 2, 4] and rec["policy"] == "above"
    plan = dynamic.apply_additions(plan, rec)
    rows = dynamic.report(plan, conf, hist, [rec], arms)
    assert {r["item_id"]: r["copies"] for r in rows} == {0: 2, 1: 1, 2: 2, 3: 0, 4: 1, 5: 0}
    out = dynamic.summary(plan, conf, hist, rows, permutations=99)
    assert out["ceiling"] == 2.0 and "threshold" not in out and "margin" not in out
    with pytest.raises(ConfigError) as e:
        dynamic.parse_dynamic({"policy": "above", "ceiling": 0}, EXPS, TASKS)
    assert e.value.key == "insertion.dynamic.ceiling"


@pytest.mark.parametrize("value,key,match", [
    ({"policy": "until_memorized", "margin": 0.2}, "insertion.dynamic.margin",
     "only for policy=spaced_repetition, not until_memorized"),
    ({"policy": "spaced_repetition", "threshold": 2.0}, "insertion.dynamic.threshold",
     "only for policy=until_memorized, not spaced_repetition"),
    ({"policy": "spaced_repetition", "treshold": 2.0}, "insertion.dynamic.treshold", "unknown option"),
    ({"policy": "forever"}, "insertion.dynamic.policy", r"unknown policy 'forever'; allowed: \['spaced_repetition', "
     r"'until_memorized'\]"),
])
def test_options_follow_the_policy_schema(value, key, match):
    with pytest.raises(ConfigError, match=match) as e:
        dynamic.parse_dynamic(value, EXPS, TASKS)
    assert e.value.key == key


def test_each_policy_has_its_own_schema():
    assert schema("until_memorized") is UntilMemorizedConf and schema("spaced_repetition") is SpacedRepetitionConf
    assert type(dynamic.parse_dynamic("spaced_repetition", EXPS, TASKS)) is SpacedRepetitionConf
    assert not hasattr(UntilMemorizedConf(), "margin") and not hasattr(SpacedRepetitionConf(), "threshold")
    for name in POLICIES:
        assert get_policy(name).name == name and schema(name)().policy == name


def test_a_mapping_saved_with_every_policys_options_parses_as_its_own():
    old = {"policy": "until_memorized", "experiments": [], "task": "loss", "copies": 1, "threshold": 2.0,
           "margin": 0.5, "max_per_batch": 0, "controls": None, "allow_no_controls": False}
    conf = dynamic.parse_dynamic(dynamic.own_options(old), EXPS, TASKS)
    assert type(conf) is UntilMemorizedConf and conf.threshold == 2.0
    assert dynamic.own_options({**old, "treshold": 1})["treshold"] == 1  # an unknown option stays, to be refused
    assert dynamic.own_options("until_memorized") == "until_memorized"
