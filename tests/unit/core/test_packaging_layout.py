"""pyproject.toml against the tree: every package of the three source folders is listed under its installed name,
the folder mapping is the one the checkout finder uses, every console script resolves and ``--help`` names it."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import yaml

import pretrain_exp
from tests.conftest import ROOT

tomllib = pytest.importorskip("tomllib", reason="Python 3.10 has no tomllib")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]


def test_every_package_of_the_tree_is_listed_under_its_installed_name():
    mapping = SETUPTOOLS["package-dir"]
    found = {"pretrain_exp.conf"}  # the Hydra configs: data only
    for name, folder in mapping.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            found.add(".".join((name, *init.parent.relative_to(ROOT / folder).parts)))
    assert sorted(SETUPTOOLS["packages"]) == sorted(found)


def test_the_folder_mapping_is_the_checkouts():
    mapping = SETUPTOOLS["package-dir"]
    assert {k: v for k, v in mapping.items() if k not in ("pretrain_exp", "pretrain_exp.conf")} \
        == pretrain_exp.CHECKOUT_PACKAGES
    assert mapping["pretrain_exp.conf"] == "conf" and pretrain_exp.conf_dir() == ROOT / "conf"
    assert pretrain_exp.checkout_root() == ROOT
    for name, folder in pretrain_exp.CHECKOUT_PACKAGES.items():
        assert Path(importlib.import_module(f"{name}.registry").__file__) == ROOT / folder / "registry.py"


def test_a_second_import_name_for_a_plugin_folder_is_refused():
    with pytest.raises(ImportError, match="import pretrain_exp.evals, not evals"):
        importlib.import_module("evals")


def test_every_console_script_resolves_and_the_main_help_names_it():
    footer = yaml.safe_load((ROOT / "conf/hydra/help/pretrain_exp.yaml").read_text())["footer"]
    for script, target in PYPROJECT["project"]["scripts"].items():
        module, attr = target.split(":")
        assert callable(getattr(importlib.import_module(module), attr)), target
        assert f"\n{script} " in "\n" + footer, script
