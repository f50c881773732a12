"""The house rule: imports point down the layers (app -> report -> plugins -> insertion engine -> data -> core),
with no import cycle at any depth. Read from the source with ``ast``, so imports inside functions count too."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
#: folder of the checkout -> its import name (pyproject.toml's package-dir)
PACKAGES = {"pretrain_exp": "pretrain_exp", "frameworks": "pretrain_exp.frameworks", "evals": "pretrain_exp.evals"}

#: (module prefix, layer); the longest matching prefix wins; a module may import only its own layer or lower ones
LAYERS = [
    ("pretrain_exp.core", 0),
    ("pretrain_exp.data", 1),
    ("pretrain_exp.insertion", 2),
    ("pretrain_exp.insertion.types", 3),
    ("pretrain_exp.frameworks", 3),
    ("pretrain_exp.evals", 3),
    ("pretrain_exp.report", 4),
    ("pretrain_exp.app", 5),
    ("pretrain_exp.__main__", 5),
    ("pretrain_exp.inspect", 5),  # python -m pretrain_exp.inspect (pretrain_exp.app.inspect)
    ("pretrain_exp", 4),  # the package itself: its __init__ holds the version and re-exports load_run/load_sweep
]


def modules() -> dict[str, Path]:
    out = {}
    for folder, pkg in PACKAGES.items():
        for p in (ROOT / folder).rglob("*.py"):
            name = ".".join((pkg, *p.relative_to(ROOT / folder).with_suffix("").parts))
            out[name.removesuffix(".__init__")] = p
    return out


def imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> project modules it imports (module level and inside functions)."""
    graph = {m: set() for m in mods}
    for m, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = m.split(".") if is_pkg else m.split(".")[:-1]
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join(parts + ([base] if base else []))
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for n in names:
                while n and n not in mods:
                    n = n.rpartition(".")[0]
                if n and n != m and not m.startswith(n + "."):
                    graph[m].add(n)
    return graph


def layer(module: str) -> int:
    return max((p for p in LAYERS if module == p[0] or module.startswith(p[0] + ".")), key=lambda p: len(p[0]))[1]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_import_graph_has_no_cycle():
    assert cycles(imports(modules())) == []


def test_imports_point_down_the_layers():
    graph = imports(modules())
    upward = sorted(f"{m} (layer {layer(m)}) imports {n} (layer {layer(n)})"
                    for m, deps in graph.items() for n in deps if layer(n) > layer(m))
    assert upward == []


def test_the_checker_sees_function_level_and_relative_imports(tmp_path):
    pkg = tmp_path / "pretrain_exp"
    (pkg / "core").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "core" / "__init__.py").write_text("")
    (pkg / "core" / "a.py").write_text("def f():\n    from ..app import b\n")
    (pkg / "app").mkdir()
    (pkg / "app" / "__init__.py").write_text("")
    (pkg / "app" / "b.py").write_text("from pretrain_exp.core import a\n")
    global ROOT
    old, ROOT = ROOT, tmp_path
    try:
        graph = imports(modules())
    finally:
        ROOT = old
    assert "pretrain_exp.app.b" in graph["pretrain_exp.core.a"]  # relative, inside a function
    assert layer("pretrain_exp.app.b") > layer("pretrain_exp.core.a")
    assert cycles(graph) == [["pretrain_exp.app.b", "pretrain_exp.core.a"]]


@pytest.mark.parametrize("module", ["pretrain_exp.app.config", "pretrain_exp.report"])
def test_loading_a_config_or_the_report_needs_no_training_stack(module):
    code = (f"import sys, {module}; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('transformers', 'olmo_core') "
            "or m.startswith('pretrain_exp.frameworks')); "
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
