""":class:`~pretrain_exp.core.cachedir.CacheDir` is the only place that spells the cache's sub-folders: its paths
against the layout earlier versions wrote, and every module of the project (benchmarks and the test conftest
included) read with ``ast`` for a cache sub-folder joined onto a cache path by hand."""

from __future__ import annotations

import ast
from pathlib import Path

from pretrain_exp.core.cachedir import CacheDir
from tests.unit.core.test_layers import ROOT, modules

#: every cache sub-folder name
NAMES = frozenset(v for k, v in vars(CacheDir).items() if k.isupper() and isinstance(v, str))
OWNER = ROOT / "pretrain_exp" / "core" / "cachedir.py"


def test_the_layout_is_the_one_earlier_versions_wrote(tmp_path):
    c = CacheDir(tmp_path)
    assert [c.assets, c.model("scratch-x"), c.tokenizer("dolma2"), c.tokens, c.benchmarks, c.hf_datasets,
            c.permutations, c.size_index, c.audits, c.item_tokens, c.window] == [
        tmp_path / p for p in ("assets", "models/scratch-x", "tokenizers/dolma2", "tokens", "benchmarks",
                               "hf_datasets", "permutations", "size_index", "audits", "item_tokens", "window")]
    assert set(CacheDir.SHARED) | set(CacheDir.DERIVED) == NAMES and not set(CacheDir.SHARED) & set(CacheDir.DERIVED)
    assert not tmp_path.joinpath("assets").exists()  # computed, never created
    assert CacheDir(str(tmp_path)) == c and len({c, CacheDir(tmp_path)}) == 1 and c != CacheDir(tmp_path / "x")


def _mentions_cache(node: ast.AST) -> bool:
    return "cache" in ast.unparse(node).lower()


def _leftmost(node: ast.AST) -> ast.AST:
    while isinstance(node, ast.BinOp):
        node = node.left
    return node


def _name(node: ast.AST) -> str:
    """The first path part of a string constant (``"models/x"`` -> ``models``; ``"/tokens"`` -> ``tokens``)."""
    return node.value.strip("/").split("/")[0] if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""


def cache_spelled(path: Path) -> list:
    """Where a module spells a cache sub-folder by hand: ``line: what``. Seen: ``<cache> / "name"``,
    ``<cache> + "/name"``, ``Path(<cache>, "name")`` (``<cache>``: an expression naming a cache) and a tuple or list
    of two or more sub-folder names."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        line = getattr(node, "lineno", 0)
        if (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Div, ast.Add)) and _name(node.right) in NAMES
                and _mentions_cache(_leftmost(node.left))):
            out.append(f"{line}: {ast.unparse(node)}")
        elif (isinstance(node, ast.Call) and len(node.args) > 1 and _mentions_cache(node.args[0])
              and any(_name(a) in NAMES for a in node.args[1:])):
            out.append(f"{line}: {ast.unparse(node)}")
        elif (isinstance(node, (ast.Tuple, ast.List)) and len(node.elts) > 1
              and all(_name(e) in NAMES and e.value.strip("/") == _name(e) for e in node.elts)):
            out.append(f"{line}: {ast.unparse(node)}")
    return out


def project_files() -> list:
    """The project's modules, the benchmarks and the test conftest."""
    return [*modules().values(), *sorted((ROOT / "benchmarks").glob("*.py")), ROOT / "tests" / "conftest.py"]


def test_no_module_but_cachedir_spells_a_cache_sub_folder():
    found = {str(p.relative_to(ROOT)): spelled for p in project_files() if p != OWNER and (spelled := cache_spelled(p))}
    assert found == {}


def test_the_source_check_sees_each_way_of_spelling_the_cache(tmp_path):
    src = tmp_path / "m.py"
    src.write_text('"""docstring: <cache_dir>/models/ is prose."""\n'
                   'a = Path(cache_dir) / "models" / name\n'
                   'b = self.cache / "audits/x.json"\n'
                   'c = Path(cache_dir, "tokens")\n'
                   'd = II("cache_dir") + "/tokens"\n'
                   'e = ("permutations", "size_index")\n'
                   'f = tmp / "tokens"\n'
                   'g = ("tokens", "texts")\n'
                   'h = CacheDir(cache_dir).models / "configs"\n')
    assert sorted(int(f.split(":")[0]) for f in cache_spelled(src)) == [2, 3, 4, 5, 6]  # not 1, 7, 8 nor 9
