"""The ``Framework`` contract declares what its callers read: every attribute the rest of the project reads from a
framework is declared on :class:`~pretrain_exp.frameworks.base.Framework` (read from the source with ``ast``), and
none is reached with ``getattr``/``hasattr``; a checkpoint's temporary HF dir leaves nothing behind."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from pretrain_exp.core.rundir import RunDir
from pretrain_exp.frameworks import registry
from pretrain_exp.frameworks.base import Checkpoint, Framework
from tests.unit.core.test_layers import modules

#: names of a run config (whose ``framework`` is the config node, not a framework)
CONFIGS = ("cfg", "config", "conf", "_root_")


def _is_framework(node: ast.AST) -> bool:
    """Whether an expression names a framework object (``framework``, ``fw``, ``<x>.framework`` where ``<x>`` is
    not a config)."""
    if isinstance(node, ast.Name):
        return node.id in ("framework", "fw")
    owner = node.value if isinstance(node, ast.Attribute) and node.attr == "framework" else None
    name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
    return owner is not None and name not in CONFIGS


def declared() -> set:
    """What ``Framework`` declares: its class attributes, properties and methods, and the attributes its
    constructor sets."""
    init = ast.parse(textwrap.dedent(inspect.getsource(Framework.__init__)))
    return set(dir(Framework)) | {t.attr for n in ast.walk(init) if isinstance(n, ast.Assign) for t in n.targets
                                  if isinstance(t, ast.Attribute) and ast.unparse(t.value) == "self"}


def undeclared_reads(source: str) -> list:
    """``line: what`` for each read of a framework's attribute that ``Framework`` does not declare, and each
    ``getattr``/``hasattr`` on a framework."""
    names, out = declared(), []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and _is_framework(node.value) and node.attr not in names:
            out.append(f"{node.lineno}: {ast.unparse(node)}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
              and node.args and _is_framework(node.args[0])):
            out.append(f"{node.lineno}: {ast.unparse(node)}")
    return out


def test_callers_read_only_what_framework_declares():
    found = {m: reads for m, p in modules().items()
             if not m.startswith("pretrain_exp.frameworks") and (reads := undeclared_reads(p.read_text()))}
    assert found == {}


def test_the_source_check_sees_undeclared_reads():
    src = ('a = self.framework.checkpoint_dir\n'
           'b = getattr(self.framework, "checkpoint_dir", None)\n'
           'c = fw.engine_internals\n'
           'd = hasattr(framework, "x")\n'
           'e = other.engine_internals\n'
           'f = cfg.framework.name + self.cfg.framework.name\n'
           'g = exp.framework.model_dir\n')
    assert [int(f.split(":")[0]) for f in undeclared_reads(src)] == [2, 3, 4]  # not 1, 7 (declared), 5 nor 6


def test_every_framework_saves_into_the_run_dirs_checkpoints(tmp_path):
    from tests.conftest import make_config

    cfg = make_config("experiment=tiny", run_dir=tmp_path)
    for name in ("hf", "olmo_core", "olmo2"):
        cls = registry.get_framework_class(name)
        assert cls(cfg, tmp_path / "model").checkpoint_dir == RunDir(tmp_path).checkpoints, name


def test_a_temporary_hf_dir_is_the_checkpoint_itself_or_a_conversion_removed_afterwards(tmp_path, monkeypatch):
    """An HF checkpoint is read where it is (no temporary dir is made); another format is converted into a
    temporary dir that is gone after the ``with`` block, also when the block fails."""
    import dataclasses
    import tempfile

    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    hf = Checkpoint(tmp_path / "model", 3)
    with hf.as_hf_temporary() as d:
        assert d == hf.path and not list(temp.iterdir())

    @dataclasses.dataclass
    class Sharded(Checkpoint):
        is_hf = False

        def to_hf(self, out_dir):
            (out_dir / "config.json").write_text("{}")
            return out_dir

    with Sharded(tmp_path / "step3", 3).as_hf_temporary() as d:
        assert d.parent == temp and (d / "config.json").is_file()
    assert not list(temp.iterdir())
    with pytest.raises(RuntimeError), Sharded(tmp_path / "step3", 3).as_hf_temporary():
        raise RuntimeError("the eval failed")
    assert not list(temp.iterdir())
