"""Source rules of the application layer (``pretrain_exp/app``): no class over 250 lines, no function over 60, and
no constructor (nor :func:`~pretrain_exp.app.prepare.prepare`, which prepares a run as plain data) starts a process
or a thread."""

from __future__ import annotations

import ast
from pathlib import Path

import pretrain_exp.app
import pretrain_exp.insertion.run_plan

APP = Path(pretrain_exp.app.__file__).parent
MAX_CLASS, MAX_FUNCTION = 250, 60
#: what starts a process or a thread when called
STARTS = {"Popen", "start", "Process", "Thread", "check_call", "check_output", "system", "spawn", "fork",
          "start_new_thread"}
#: modules whose every function prepares without starting anything: ``prepare`` and the plan's owner (``RUN_PLAN``)
PREPARE_ONLY = ("prepare.py", "run_plan.py")
RUN_PLAN = Path(pretrain_exp.insertion.run_plan.__file__)


def _defs(paths=None):
    for path in paths or sorted(APP.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                yield path.name, node, node.end_lineno - node.lineno + 1


def _calls(node) -> set:
    names = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            f = n.func
            names.add(f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None))
    return names


def test_no_class_over_250_lines_and_no_function_over_60():
    classes = [f"{f}:{n.name} ({size})" for f, n, size in _defs()
               if isinstance(n, ast.ClassDef) and size > MAX_CLASS]
    functions = {f"{f}:{n.name}": size for f, n, size in _defs()
                 if not isinstance(n, ast.ClassDef) and size > MAX_FUNCTION}
    assert classes == []
    assert functions == {}


def test_no_constructor_in_app_starts_a_process():
    starting = [f"{f}:{n.name} calls {sorted(_calls(n) & STARTS)}" for f, n, _ in _defs([*APP.glob("*.py"), RUN_PLAN])
                if isinstance(n, ast.FunctionDef) and (n.name == "__init__" or f in PREPARE_ONLY)
                and _calls(n) & STARTS]
    assert starting == []
