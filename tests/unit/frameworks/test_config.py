"""Each framework's own schema: registered as ``schema/framework/<name>``, chosen when composing and when loading a
``config.resolved.yaml``, with its one-schema checks naming the dotted key."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from pretrain_exp.app.config import register_configs
from pretrain_exp.app.run_record import save_resolved_config
from pretrain_exp.app.validate import load_resolved, to_config
from pretrain_exp.core.config import FrameworkConf
from pretrain_exp.core.errors import ConfigError
from pretrain_exp.frameworks.hf.config import ATTN_IMPLEMENTATIONS, HFConf
from pretrain_exp.frameworks.olmo2.config import Olmo2Conf
from pretrain_exp.frameworks.olmo_core.config import OlmoCoreConf
from pretrain_exp.frameworks.registry import FRAMEWORKS, SCHEMAS, schema
from tests.bad_input import REPO, assert_error
from tests.conftest import compose, make_config

SCHEMA_OF = {"hf": HFConf, "olmo_core": OlmoCoreConf, "olmo2": Olmo2Conf}


@pytest.fixture(scope="module", autouse=True)
def _schemas():
    register_configs()


def test_every_framework_has_a_schema():
    assert set(SCHEMAS) == set(FRAMEWORKS) == set(SCHEMA_OF)
    for name, cls in SCHEMA_OF.items():
        assert schema(name) is cls and issubclass(cls, FrameworkConf) and cls().name == name


def test_unknown_schema_name():
    with pytest.raises(ConfigError) as ei:
        schema("olmo9")
    assert_error(ei, "framework.name", "'olmo9'", "'hf'")


@pytest.mark.parametrize("name", sorted(SCHEMA_OF))
def test_composed_framework_is_its_schema(name, tmp_path):
    assert OmegaConf.get_type(compose(f"framework={name}", run_dir=tmp_path).framework) is SCHEMA_OF[name]
    cfg = make_config(f"framework={name}", run_dir=tmp_path)
    assert type(cfg.framework) is SCHEMA_OF[name] and cfg.framework.name == name


@pytest.mark.parametrize("name", sorted(SCHEMA_OF))
def test_resolved_config_round_trip(name, tmp_path):
    """A written ``config.resolved.yaml`` loads back (no Hydra) into the same framework schema and values."""
    overrides = {"hf": ["framework.attn_implementation=eager"], "olmo2": ["framework.lr_schedule=run"]}
    cfg = make_config(f"framework={name}", *overrides.get(name, []), run_dir=tmp_path)
    loaded = load_resolved(str(save_resolved_config(cfg, tmp_path)))
    assert type(loaded.framework) is SCHEMA_OF[name] and loaded.framework == cfg.framework
    assert loaded == cfg


def test_overrides_of_a_framework_field(tmp_path):
    assert make_config("framework.attn_implementation=eager", run_dir=tmp_path).framework.attn_implementation == "eager"
    olmo2 = make_config("framework=olmo2", run_dir=tmp_path).framework
    assert olmo2.lr_schedule == "checkpoint" and not olmo2.uses_run_lr_schedule()
    olmo2 = make_config("framework=olmo2", "framework.lr_schedule=run", run_dir=tmp_path).framework
    assert olmo2.lr_schedule == "run" and olmo2.uses_run_lr_schedule()


@pytest.mark.parametrize("overrides, needles", [
    (["framework.attn_implementation=flash"], ["framework.attn_implementation", "'flash'", "'sdpa'", "'eager'"]),
    (["framework=olmo2", "framework.lr_schedule=sometimes"],
     ["framework.lr_schedule", "'sometimes'", "'run'", "'checkpoint'"]),
])
def test_bad_framework_value(overrides, needles, tmp_path):
    with pytest.raises(ConfigError) as ei:
        make_config(*overrides, run_dir=tmp_path)
    assert_error(ei, *needles)


@pytest.mark.parametrize("overrides, key", [
    (["framework.lr_schedule=run"], "framework.lr_schedule"),  # olmo2's field, not hf's
    (["framework=olmo_core", "framework.attn_implementation=eager"], "framework.attn_implementation"),
    (["framework=olmo2", "framework.attn_implementation=eager"], "framework.attn_implementation"),
    (["framework.attn_implementaton=eager"], "framework.attn_implementaton"),  # typo
])
def test_foreign_or_typod_field_refused_while_composing(overrides, key, tmp_path):
    with pytest.raises(ConfigCompositionException) as ei:
        compose(*overrides, run_dir=tmp_path)
    text = str(ei.value) + " " + str(ei.value.__cause__ or "")
    assert key in text


def test_name_override_of_another_framework(tmp_path):
    with pytest.raises(ConfigError) as ei:
        make_config("framework.name=olmo2", run_dir=tmp_path)  # hf's fields with olmo2's name
    assert_error(ei, "framework.name", "'olmo2'", "framework=olmo2")


@pytest.mark.parametrize("framework, needles", [
    ({"name": "hf", "lr_schedule": "run"}, ["framework.lr_schedule"]),
    ({"name": "olmo_core", "attn_implementation": "eager"}, ["framework.attn_implementation"]),
    ({"name": "olmo9"}, ["framework.name", "'olmo9'", "'olmo2'"]),
    ({"name": "hf", "attn_implementation": "flash"}, ["framework.attn_implementation", "'flash'"]),
    ({"name": "olmo2", "lr_schedule": "sometimes"}, ["framework.lr_schedule", "'sometimes'"]),
])
def test_bad_framework_in_a_resolved_config(framework, needles, tmp_path):
    """A hand-edited ``config.resolved.yaml``: a field of another framework or a bad value names the key."""
    cfg = OmegaConf.to_container(OmegaConf.load(save_resolved_config(make_config(run_dir=tmp_path), tmp_path)))
    cfg["framework"] = framework
    with pytest.raises(ConfigError) as ei:
        to_config(OmegaConf.create(cfg))
    assert_error(ei, *needles)


def test_validate_names_the_key():
    HFConf().validate()
    Olmo2Conf().validate()
    OlmoCoreConf().validate()
    assert "eager" in ATTN_IMPLEMENTATIONS
    with pytest.raises(ConfigError) as ei:
        HFConf(attn_implementation="bad").validate("framework")
    assert_error(ei, "framework.attn_implementation", "'bad'")
    with pytest.raises(ConfigError) as ei:
        Olmo2Conf(lr_schedule="bad").validate("x")
    assert_error(ei, "x.lr_schedule", "'bad'")


def test_schemas_are_light():
    """Registering the framework schemas imports neither torch, transformers nor OLMo-core."""
    code = ("import sys; from hydra.core.config_store import ConfigStore; "
            "from pretrain_exp.frameworks.registry import register_framework_schemas; "
            "register_framework_schemas(ConfigStore.instance()); "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'olmo_core')); "
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
