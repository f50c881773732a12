"""The reference pages' generated parts, written into the committed Markdown (``make reference``).

``docs/reference/config.md`` and ``docs/reference/commands.md`` are hand-written pages with generated regions, each
between a ``<!-- BEGIN <what> ... -->`` line and its ``<!-- END <what> -->`` line, so the pages read in full on the
repository host and in an editor, without building the site:

- ``config-schema``: one section per config group: the options of ``conf/<group>/`` (each with the leading comment
  of its YAML file) and a table of every field of the group's schema dataclasses (type, default, and the field's
  ``#:`` comment), plugins' own schemas included (each framework's, each insertion type's, each eval's, the
  closed-loop policies');
- ``command-help: <module> [args]``: the ``--help`` text of ``python -m <module> [args]`` (Hydra's help of
  ``pretrain_exp`` up to its config dump), run from the checkout with ``COLUMNS=100`` and colour off.

Nothing of it is written by hand: ``python docs/reference_pages.py`` rewrites the regions from the code,
``--check`` only compares (exit status 1 and the stale pages named when they differ; the docs test runs it).
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import os
import re
import subprocess
import sys
import typing
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
#: the pages with generated regions
PAGES = (ROOT / "docs" / "reference" / "config.md", ROOT / "docs" / "reference" / "commands.md")
#: what refreshes them
REFRESH = "make reference   (= python docs/reference_pages.py)"


# ---------------------------------------------------------------------------------------------------------------
# field documentation: the ``#:`` comments, read the way autodoc reads them


def _class_comments(klass: type) -> Dict[str, str]:
    """field -> its ``#:`` comment in ``klass``'s source: the comment after the field on its line plus the ``#:``
    lines that continue it, or (for a field without one) the ``#:`` lines just above it."""
    import inspect

    try:
        lines = inspect.getsourcelines(klass)[0]
    except (OSError, TypeError):
        return {}
    out: Dict[str, str] = {}
    above: List[str] = []
    last: Optional[str] = None  # the field whose inline comment the next ``#:`` lines continue
    for line in lines:
        text = line.strip()
        if text.startswith("#:"):
            if last is not None:
                out[last] += " " + text[2:].strip()
            else:
                above.append(text[2:].strip())
            continue
        m = re.match(r"^\s+([A-Za-z_]\w*)\s*:[^=]*(=.*)?$", line.rstrip("\n"))
        if m and not text.startswith(("def ", "class ", "@", "return", "#")):
            name, rest = m.group(1), line.split("#:", 1)
            if len(rest) == 2:
                out[name], last = rest[1].strip(), name
            else:
                out[name], last = " ".join(above), None
            above = []
        else:
            above, last = [], None
    return {k: v for k, v in out.items() if v}


def _attr_docs(cls: type) -> Dict[str, str]:
    """field name -> its ``#:`` comment, for ``cls`` and its bases (nearest first)."""
    out: Dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            out.update(_class_comments(klass))
    return out


_ROLE = re.compile(r":(?:py:)?(class|func|mod|meth|attr|data|exc|obj):`([^`]+)`")


def _md(text: str) -> str:
    """reST inline markup of a docstring as MyST Markdown for a table cell."""
    text = _ROLE.sub(lambda m: "{py:%s}`%s`" % (m.group(1), m.group(2)), text)
    text = text.replace("``", "`")
    return text.replace("|", "\\|").replace("\n", " ")


def _first_paragraph(doc: Optional[str]) -> str:
    if not doc:
        return ""
    return " ".join(doc.strip().split("\n\n")[0].split())


# ---------------------------------------------------------------------------------------------------------------
# types and defaults


def _type_name(tp: Any) -> str:
    if isinstance(tp, str):
        return tp
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union:
        rest = [a for a in args if a is not type(None)]
        inner = " | ".join(_type_name(a) for a in rest)
        return f"{inner} or null" if len(rest) < len(args) else inner
    if origin in (list, List):
        return f"list[{_type_name(args[0])}]" if args else "list"
    if origin in (dict, Dict):
        return f"dict[{', '.join(_type_name(a) for a in args)}]" if args else "dict"
    if origin in (tuple, Tuple):
        return f"tuple[{', '.join(_type_name(a) for a in args)}]"
    if tp is Any:
        return "any"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return " | ".join(f"`{m.value}`" for m in tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return f"{tp.__name__} (below)"
    return getattr(tp, "__name__", str(tp))


def _default(f: dataclasses.Field) -> str:
    from omegaconf import MISSING

    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
        if dataclasses.is_dataclass(value):
            return "(below)"
    else:
        return "required"
    if value == MISSING:
        return "required (`???`)"
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None:
        return "`null`"
    text = repr(value) if not isinstance(value, str) else value
    if isinstance(value, bool):
        text = "true" if value else "false"
    text = text.replace("`", "'")
    if len(text) > 60:
        text = text[:57] + "..."
    return f"`{text}`" if text else '`""`'


# ---------------------------------------------------------------------------------------------------------------
# tables


def schema_table(cls: type, key: str) -> Tuple[List[str], List[Tuple[type, str]]]:
    """Markdown lines of ``cls``'s field table under the dotted ``key``, and its nested dataclass fields."""
    hints = typing.get_type_hints(cls)
    docs = _attr_docs(cls)
    lines = ["| key | type | default | description |", "|---|---|---|---|"]
    nested: List[Tuple[type, str]] = []
    for f in dataclasses.fields(cls):
        if f.name.startswith("_"):
            continue
        tp = hints.get(f.name, f.type)
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            nested.append((tp, f"{key}.{f.name}"))
        full = f"{key}.{f.name}" if key else f.name
        lines.append(f"| `{full}` | {_md(_type_name(tp))} | {_md(_default(f))} | {_md(docs.get(f.name, ''))} |")
    return lines, nested


def schema_section(cls: type, key: str, title: str, level: int = 4, seen: Optional[set] = None) -> List[str]:
    """A heading, the class's first docstring paragraph, its table, then its nested dataclasses' tables (each nested
    class once a page: ``seen``)."""
    seen = set() if seen is None else seen
    out = [f"{'#' * level} {title}", "", f"{{py:class}}`{cls.__module__}.{cls.__qualname__}`. "
           + _md(_first_paragraph(cls.__doc__)), ""]
    table, nested = schema_table(cls, key)
    out += table + [""]
    for sub, subkey in nested:
        if sub.__module__.startswith("pretrain_exp") and sub not in seen:
            seen.add(sub)
            out += schema_section(sub, subkey, f"`{subkey}`", level + 1, seen)
    return out


def _yaml_comment(path: Path) -> str:
    """The leading comment of a YAML option (without ``@package`` and indented example lines)."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        text = line[1:]
        if text.strip().startswith("@package"):
            continue
        if text.startswith("   ") or text.strip().startswith(("python ", "pretrain-exp")):
            break
        lines.append(text.strip())
    return " ".join(lines).strip()


def options_table(conf: Path, group: str) -> List[str]:
    """The YAML options of ``conf/<group>/`` (sub-folders of options included) with their comments."""
    folder = conf / group
    rows = ["| option | what |", "|---|---|"]
    for path in sorted(folder.rglob("*.yaml")):
        if "local" in path.relative_to(conf).parts:
            continue
        name = path.relative_to(folder).with_suffix("").as_posix()
        rows.append(f"| `{group}={name}` | {_md(_yaml_comment(path))} |")
    return rows + [""]


# ---------------------------------------------------------------------------------------------------------------
# the page


def render() -> str:
    """The generated Markdown of every config group (module docstring)."""
    import pretrain_exp
    from pretrain_exp.app.config import CpdtConf, ExperimentConfig
    from pretrain_exp.core.config import DataConf, EvalConf, FrameworkConf, ModelConf, TrainingConf, WandbConf
    from pretrain_exp.core.registry import load
    from pretrain_exp.evals.registry import EVALS
    from pretrain_exp.frameworks.registry import SCHEMAS
    from pretrain_exp.insertion.policies import POLICIES
    from pretrain_exp.insertion.policies import schema as policy_schema
    from pretrain_exp.insertion.schema import InsertionConf
    from pretrain_exp.insertion.types import TYPES, schema

    conf = pretrain_exp.conf_dir()
    out: List[str] = ["## Root keys", ""]
    table, _ = schema_table(ExperimentConfig, "")
    out += ["{py:class}`~pretrain_exp.app.config.ExperimentConfig`: "
            "the root of the composed config; each group below is one of its keys.", ""] + table + [""]

    groups: List[Tuple[str, List[Tuple[type, str, str]]]] = [
        ("framework", [(FrameworkConf, "framework", "Common fields")]
         + [(load(t), "framework", f"`framework={n}`") for n, t in SCHEMAS.items()]),
        ("model", [(ModelConf, "model", "Schema")]),
        ("data", [(DataConf, "data", "Schema")]),
        ("insertion", [(InsertionConf, "insertion", "Common fields")]
         + [(schema(n), "insertion.experiments.<name>", f"`type: {n}`") for n in TYPES]
         + [(policy_schema(n), "insertion.dynamic", f"Closed-loop policy `insertion.dynamic.policy: {n}`")
            for n in POLICIES]),
        ("eval", [(EvalConf, "eval", "Common fields")]
         + [(spec.config, "eval.tasks.<name>", f"`type: {n}`") for n, spec in EVALS.items()]),
        ("training", [(TrainingConf, "training", "Schema")]),
        ("wandb", [(WandbConf, "wandb", "Schema")]),
        ("cpdt", [(CpdtConf, "cpdt", "Schema")]),
    ]
    covered = {g for g, _ in groups}  # any other dataclass key of the root config gets its schema too
    for f in dataclasses.fields(ExperimentConfig):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else None  # type: ignore[misc]
        if f.name not in covered and dataclasses.is_dataclass(default):
            groups.append((f.name, [(type(default), f.name, "Schema")]))
    seen: set = set()
    for group, schemas in groups:
        out += [f"## `{group}`", ""]
        if (conf / group).is_dir():
            out += ["Options (`conf/" + group + "/`):", ""] + options_table(conf, group)
        for cls, key, title in schemas:
            out += schema_section(cls, key, title, level=3, seen=seen)
    for group, title in (("experiment", "Presets: `experiment`"), ("sweep", "Sweep presets: `+sweep`"),
                         ("hydra/launcher", "Launchers: `hydra/launcher`")):
        out += [f"## {title}", ""] + options_table(conf, group)
    return "\n".join(out) + "\n"


def command_help(module: str, args: str = "") -> str:
    """``python -m <module> [args] --help`` as a fenced ``text`` block, run from the checkout (Hydra's help of
    ``pretrain_exp`` up to its config dump). Raises :class:`RuntimeError` if the command fails."""
    env = {**os.environ, "COLUMNS": "100", "NO_COLOR": "1", "PYTHON_COLORS": "0", "PYTHONPATH": str(ROOT)}
    env.pop("FORCE_COLOR", None)
    out = subprocess.run([sys.executable, "-m", module, *args.split(), "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"python -m {module}{args} --help exited {out.returncode}: {out.stderr[-2000:]}")
    text = out.stdout.split("== Config ==")[0].rstrip()
    return "```text\n" + "\n".join(line.rstrip() for line in text.splitlines()) + "\n```"


# ---------------------------------------------------------------------------------------------------------------
# the regions of the pages

#: ``<!-- BEGIN <what> ... -->`` ... ``<!-- END <what> -->``; ``<what>`` is ``config-schema`` or
#: ``command-help: <module> [args]``
_NOTE = "(generated by make reference: do not edit)"
REGION = re.compile(r"^<!-- BEGIN (?P<what>config-schema|command-help: [\w.]+(?: [\w-]+)*) "
                    + re.escape(_NOTE) + r" -->\n(?P<body>.*?)^<!-- END (?P=what) -->$",
                    re.S | re.M)


def _generate(what: str) -> str:
    if what == "config-schema":
        return render().rstrip("\n")
    module, _, args = what[len("command-help: "):].partition(" ")
    return command_help(module, args)


def refreshed(text: str, jobs: int = 4) -> str:
    """``text`` (a page) with each generated region rewritten from the code (the regions generated in parallel:
    each command's help is a process)."""
    whats = [m.group("what") for m in REGION.finditer(text)]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        bodies = dict(zip(whats, pool.map(_generate, whats)))
    return REGION.sub(lambda m: _region(m.group("what"), bodies[m.group("what")]), text)


def _region(what: str, body: str) -> str:
    return f"<!-- BEGIN {what} {_NOTE} -->\n{body}\n<!-- END {what} -->"


def stale_pages(pages=PAGES, write: bool = False) -> List[Path]:
    """The pages whose generated regions differ from what the code generates now (rewritten if ``write``)."""
    stale = []
    for page in pages:
        old = page.read_text(encoding="utf-8")
        new = refreshed(old)
        if new != old:
            stale.append(page)
            if write:
                page.write_text(new, encoding="utf-8")
    return stale


def main(argv: Optional[List[str]] = None) -> int:
    """``python docs/reference_pages.py [--check]``: rewrite (or only compare) the generated regions; exit status 1
    with ``--check`` when a page is stale."""
    ap = argparse.ArgumentParser(prog="python docs/reference_pages.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only compare: exit 1 naming the stale pages")
    args = ap.parse_args(argv)
    stale = stale_pages(write=not args.check)
    for page in stale:
        rel = page.relative_to(ROOT)
        print(f"{rel}: stale; refresh with: {REFRESH}" if args.check else f"{rel}: rewritten")
    if not stale:
        print("reference pages: current")
    return 1 if (stale and args.check) else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
