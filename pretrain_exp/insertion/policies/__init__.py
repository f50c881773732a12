"""The dynamic-policy registry: ``insertion.dynamic.policy`` name -> its
:class:`~pretrain_exp.insertion.policies.base.Policy` subclass as a ``"module:attr"`` string, imported only when the
name is used.

Each policy is one module of this package: its options (a
:class:`~pretrain_exp.insertion.policies.base.DynamicConf` subclass with a ``validate(key)`` of its own checks) and
its decision rule (a :class:`~pretrain_exp.insertion.policies.base.Policy` subclass, ``schema`` naming the options).
A new policy is that module, one line in :data:`POLICIES`, one ``conf/insertion/dynamic/<name>.yaml`` preset and its
tests; the closed loop around it is :mod:`pretrain_exp.insertion.dynamic`.
"""

from __future__ import annotations

from typing import Dict

from pretrain_exp.core.registry import lookup

#: policy name -> ``"module:attr"`` of its :class:`~pretrain_exp.insertion.policies.base.Policy` subclass
POLICIES: Dict[str, str] = {
    "until_memorized": "pretrain_exp.insertion.policies.until_memorized:UntilMemorized",
    "spaced_repetition": "pretrain_exp.insertion.policies.spaced_repetition:SpacedRepetition",
}


def get_policy(name: str, key: str = "insertion.dynamic.policy") -> type:
    """The :class:`~pretrain_exp.insertion.policies.base.Policy` subclass registered as ``name``.

    :param key: dotted config key, for messages.
    :raises ConfigError: for an unknown policy, listing the registered ones.
    """
    return lookup(POLICIES, name, key, "policy")


def schema(name: str) -> type:
    """The options dataclass of policy ``name`` (a :class:`~pretrain_exp.insertion.policies.base.DynamicConf`
    subclass).

    :raises ConfigError: for an unknown policy.
    """
    return get_policy(name).schema


__all__ = ["POLICIES", "get_policy", "schema"]
