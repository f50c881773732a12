"""The suite skips only for the reasons it lists (``SKIP_REASONS`` in ``tests/conftest.py``): every skip site in
``tests/`` gives a listed reason, no required dependency is import-skipped, and a run fails on a skip it does not
list (under CI, ``PRETRAIN_EXP_STRICT_SKIPS=1``, also on a listed skip that is not for missing hardware)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from xml.etree import ElementTree

import pytest

from tests.conftest import ROOT, SKIP_REASONS, skip_not_allowed

#: the only modules a test may import-skip: an extra installed where the hardware it needs is, and the standard
#: library's tomllib (Python >= 3.11; the project supports 3.10)
OPTIONAL_IMPORTS = {"torchao", "tomllib"}


def skip_sites():
    """``(file:line, kind, reason or None)`` of every ``pytest.skip``, ``skipif`` and ``importorskip`` call in
    ``tests/`` (reason ``None`` where it is not a string literal, e.g. a harness's own message)."""
    for path in sorted((ROOT / "tests").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("skip", "skipif", "importorskip")):
                continue
            base = ast.unparse(node.func.value)
            if base not in ("pytest", "pytest.mark"):
                continue
            reason = next((k.value for k in node.keywords if k.arg in ("reason", "msg")), None)
            if reason is None and node.func.attr == "skip" and node.args:
                reason = node.args[0]
            text = reason.value if isinstance(reason, ast.Constant) and isinstance(reason.value, str) else None
            module = node.args[0].value if node.func.attr == "importorskip" and node.args \
                and isinstance(node.args[0], ast.Constant) else None
            yield f"{path.relative_to(ROOT)}:{node.lineno}", node.func.attr, text, module


def test_every_skip_site_gives_a_listed_reason():
    sites = list(skip_sites())
    assert len(sites) >= 10  # the walk finds the suite's skip sites
    unlisted = [(where, reason) for where, kind, reason, _ in sites
                if reason is not None and skip_not_allowed(reason, strict=False) is not None]
    assert not unlisted, unlisted
    # pytest.skip(<a harness's message>) is checked when it happens (the hook); every other site names its reason
    assert all(reason is not None for where, kind, reason, _ in sites if kind != "skip"), sites


def test_no_required_dependency_is_import_skipped():
    skipped = {(where, module) for where, kind, _, module in skip_sites() if kind == "importorskip"}
    assert {m for _, m in skipped} <= OPTIONAL_IMPORTS, sorted(skipped)


def test_listed_reasons_by_tier():
    assert skip_not_allowed("needs a CUDA device", strict=True) is None
    assert skip_not_allowed("no SLURM controller answers `sinfo` (start one)", strict=False) is None
    assert "hardware" in skip_not_allowed("no SLURM controller answers `sinfo` (start one)", strict=True)
    assert "not a skip reason" in skip_not_allowed("ai2-olmo-core is not installed", strict=False)
    assert all(p.endswith("$") or not p.endswith("\\") for p in SKIP_REASONS)


INNER = '''
import pytest

def test_hardware():
    pytest.skip("needs a CUDA device")

def test_slurm():
    pytest.skip("no SLURM controller answers `sinfo` (start one)")

def test_unlisted():
    pytest.skip("ai2-olmo-core is not installed")

@pytest.mark.skipif(True, reason="a reason nobody listed")
def test_marked():
    pass

def test_plain():
    pass
'''


@pytest.mark.slow  # a pytest subprocess that imports tests/conftest.py (torch, transformers, Hydra): ~15 s
@pytest.mark.parametrize("strict", ["0", "1"])
def test_a_run_fails_on_a_skip_it_does_not_list(tmp_path, strict):
    (tmp_path / "test_inner.py").write_text(INNER)
    (tmp_path / "test_inner_module.py").write_text("import pytest\n\npytest.importorskip('no_such_module_here')\n")
    xml = tmp_path / "report.xml"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-q",
                           str(tmp_path / "test_inner.py"), str(tmp_path / "test_inner_module.py"),
                           "--rootdir", str(tmp_path), f"--junitxml={xml}", "--continue-on-collection-errors"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=os.environ | {"PYTHONPATH": str(ROOT), "PRETRAIN_EXP_STRICT_SKIPS": strict})
    out = proc.stdout + proc.stderr
    outcome = {}
    for case in ElementTree.parse(xml).getroot().iter("testcase"):
        kinds = [c.tag for c in case if c.tag in ("failure", "error", "skipped")]
        outcome[case.get("name")] = {"failure": "FAILED", "error": "FAILED", "skipped": "SKIPPED"}[kinds[0]] \
            if kinds else "PASSED"
    assert outcome == {"test_hardware": "SKIPPED", "test_slurm": "FAILED" if strict == "1" else "SKIPPED",
                       "test_unlisted": "FAILED", "test_marked": "FAILED", "test_plain": "PASSED",
                       "test_inner_module": "FAILED"}, out  # a module-level skip: a collection error
    assert proc.returncode == 1 and "not a skip reason the suite lists" in out
