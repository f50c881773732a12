"""The docs stay true: README.md and docs/ against the code.

- every ``python -m pretrain_exp ...`` / ``pretrain-exp ...`` line (and ``pretrain-exp-prefetch``, which takes a
  run's overrides) in a code block or an inline code span composes with Hydra's compose API, nothing run;
- every repo path the docs name exists, every dotted ``pretrain_exp.*`` name imports, every relative link resolves;
- the Python snippets (```python blocks) run against a tiny run (``experiment=tiny``; slow);
- the site builds with warnings as errors (``sphinx-build -W -n``; slow), so CI (``make test``) builds the docs.

How command lines are composed: continuation lines (``\\``) are joined and ``#`` comments dropped. Hydra's own
flags that print instead of run (``--cfg``, ``--resolve``, ``--info``, ``--help``) are dropped and the overrides
composed. A multirun line (``-m``) composes its first job: each sweep override (``seed=0,1,2``,
``choice(...)``, ``+sweep=<preset>``'s keys stay as written) is replaced by its first value, parsed by Hydra's
own override parser, the way the sweep's first job is checked before launching; launcher overrides
(``hydra/launcher=slurm``, ``hydra.launcher.partition=...``) compose with the Hydra config. ``<partition>`` is
filled in; a line with any other ``<placeholder>`` (``<overrides>``, ``<run dir>``) or ``...`` cannot be
composed and is skipped: :data:`SKIPPED_ARE` lists the kinds, and a test checks that nothing else is skipped.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser

from pretrain_exp import conf_dir
from tests.conftest import CACHE_DIR, ROOT

DOCS = ROOT / "docs"
#: the documentation files checked: the README and every page of the site
DOC_FILES = [ROOT / "README.md", *sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)]
#: the command forms that take Hydra overrides
COMMANDS = ("python -m pretrain_exp ", "pretrain-exp ", "python -m pretrain_exp.app.prefetch ",
            "pretrain-exp-prefetch ")
#: Hydra flags that print instead of running (with the number of arguments each takes)
PRINT_FLAGS = {"--cfg": 1, "-c": 1, "--resolve": 0, "--info": 1, "-i": 1, "--help": 0, "-h": 0}
PLACEHOLDERS = {"<partition>": "debug"}
#: why a documented command line may not be composable (a placeholder the reader fills in)
SKIPPED_ARE = ("<overrides>", "<...>", "...")
#: paths the docs name that are not in a checkout: created by the user, by a build, or only in the wheel
NOT_IN_CHECKOUT = ("conf/local/", "pretrain_exp/conf", "docs/_build/")
ROOTS = ("pretrain_exp/", "frameworks/", "evals/", "conf/", "tests/", "benchmarks/", "multirun_scripts/",
         "docs/", ".ci/")
FILE_SUFFIXES = {"log", "yaml", "json", "jsonl", "py", "md", "csv", "png", "npz", "parquet", "txt"}
TOP_FILES = {"Makefile", "pyproject.toml", "setup.cfg", "LICENSE", "README.md"}


def _blocks(text: str):
    """``(info, first line number, lines)`` of every fenced code block."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^\s*(```+|~~~+)\s*(\{[^}]*\}|[\w-]*)", lines[i])
        if not m:
            i += 1
            continue
        fence, info, start = m.group(1), m.group(2), i + 1
        i += 1
        body = []
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        yield info, start + 1, body
        i += 1


def _outside_blocks(text: str) -> str:
    """``text`` with its fenced code blocks blanked (line numbers kept)."""
    out, fence = [], None
    for line in text.splitlines():
        m = re.match(r"^\s*(```+|~~~+)", line)
        if fence is None and m:
            fence = m.group(1)
            out.append("")
        elif fence is not None:
            if line.strip().startswith(fence):
                fence = None
            out.append("")
        else:
            out.append(line)
    return "\n".join(out)


def command_lines():
    """``(where, command line)`` of every documented command that takes overrides."""
    found = []
    for path in DOC_FILES:
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(ROOT)
        for info, start, body in _blocks(text):
            if info not in ("", "bash", "sh", "shell", "console"):
                continue
            joined, first = "", None
            for n, line in enumerate(body, start):
                first = n if not joined else first
                if line.rstrip().endswith("\\"):
                    joined += line.rstrip()[:-1] + " "
                    continue
                cmd, joined = (joined + line).strip(), ""
                if cmd.startswith(COMMANDS):
                    found.append((f"{rel}:{first}", cmd))
        prose = _outside_blocks(text)
        for n, line in enumerate(prose.splitlines(), 1):
            for span in re.findall(r"`([^`]+)`", line):
                if span.startswith(COMMANDS):
                    found.append((f"{rel}:{n}", span))
    return found


def _first_job(overrides):
    """The overrides of a sweep's first job: every sweep override replaced by its first value."""
    parser = OverridesParser.create()
    out = []
    for raw, ov in zip(overrides, parser.parse_overrides(overrides)):
        if ov.is_sweep_override():
            value = next(iter(ov.sweep_string_iterator()))
            out.append(f"{ov.get_key_element()}={value}")
        else:
            out.append(raw)
    return out


def overrides_of(cmd: str):
    """The overrides a documented command line composes (module docstring), or a string: why it is skipped."""
    for hole, value in PLACEHOLDERS.items():
        cmd = cmd.replace(hole, value)
    words = shlex.split(cmd, comments=True)
    words = words[3:] if words[0] == "python" else words[1:]
    if any("<" in w or w == "..." or w.endswith("...") for w in words):
        return "placeholder"
    multirun, overrides, i = False, [], 0
    while i < len(words):
        w = words[i]
        if w in ("-m", "--multirun"):
            multirun = True
        elif w in PRINT_FLAGS:
            i += PRINT_FLAGS[w]
        elif w in ("-v", "--verbose"):  # the entry point turns it into the key (pretrain_exp.app.cli)
            overrides.append("verbose=true")
        elif w.startswith("-"):
            return f"flag {w}"
        else:
            overrides.append(w)
        i += 1
    return _first_job(overrides) if multirun else overrides


def _compose(overrides, tmp_path):
    """The composed config (with the Hydra node, for launcher overrides); Hydra is initialized once per module
    (:func:`_hydra`), else here."""
    from hydra.core.global_hydra import GlobalHydra

    args = dict(overrides=[f"run_dir={tmp_path / 'run'}", f"cache_dir={CACHE_DIR}", *overrides],
                return_hydra_config=True)
    if GlobalHydra.instance().is_initialized():
        return compose("config", **args)
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return compose("config", **args)


@pytest.fixture(scope="module")
def _hydra():
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        yield


COMMAND_LINES = command_lines()


def _unique_overrides():
    """``(where, overrides)`` of each distinct composable override list (the first place that names it): a compose
    costs Hydra about half a second, and many lines repeat."""
    seen = {}
    for where, cmd in COMMAND_LINES:
        overrides = overrides_of(cmd)
        if not isinstance(overrides, str):
            seen.setdefault(tuple(overrides), where)
    return [(where, list(ov)) for ov, where in seen.items()]


UNIQUE = _unique_overrides()


def test_the_docs_name_commands():
    """The extraction finds the documented commands (a change in the docs' format would silently test nothing)."""
    assert len(COMMAND_LINES) >= 60, COMMAND_LINES
    assert any(w.startswith("README.md:") for w, _ in COMMAND_LINES)
    skipped = [(w, c) for w, c in COMMAND_LINES if isinstance(overrides_of(c), str)]
    assert all(overrides_of(c) == "placeholder" for _, c in skipped), skipped
    assert len(skipped) <= 8, skipped  # placeholders stay the exception


@pytest.mark.parametrize("where,overrides", UNIQUE, ids=[w for w, _ in UNIQUE])
def test_documented_command_composes(where, overrides, tmp_path, _hydra):
    cfg = _compose(overrides, tmp_path)
    assert cfg.framework.name and cfg.training is not None


def test_a_composition_error_is_caught(tmp_path, _hydra):
    """The check would catch a stale line: a key no schema has, an option that does not exist."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    for bad in ("python -m pretrain_exp training.no_such_key=1", "pretrain-exp experiment=no_such_preset",
                "pretrain-exp -m seed=0,1 insertion=no_such_type"):
        with pytest.raises((HydraException, OmegaConfBaseException)):
            _compose(overrides_of(bad), tmp_path)
    assert _first_job(["seed=0,1,2", "+sweep=seeds_x_dups", "x=choice([0,1],[2])"]) == \
        ["seed=0", "+sweep=seeds_x_dups", "x=[0,1]"]


def _named_paths():
    """``(where, path)`` of every repo path in an inline code span or a relative link."""
    out = []
    for path in DOC_FILES:
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(ROOT)
        for n, line in enumerate(text.splitlines(), 1):
            for span in re.findall(r"`([^`\n]+)`", line):
                for word in span.split():
                    word = word.strip(",;:()'\"")
                    if any(c in word for c in "<>*{}$[]") or "://" in word:
                        continue
                    if word.startswith(ROOTS) or word in TOP_FILES:
                        out.append((f"{rel}:{n}", ROOT / word.split("#")[0], word))
            for target in re.findall(r"\]\(([^)\s]+)\)", line):
                if "://" in target or target.startswith(("#", "mailto:")):
                    continue
                out.append((f"{rel}:{n}", (path.parent / target.split("#")[0]).resolve(), target))
    return out


def test_every_path_the_docs_name_exists():
    named = _named_paths()
    assert len(named) > 100
    missing = [f"{where}: {word}" for where, p, word in named
               if not p.exists() and not any(word.startswith(x) for x in NOT_IN_CHECKOUT)]
    assert not missing, "paths named in the docs that do not exist:\n" + "\n".join(missing)


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        try:
            if importlib.util.find_spec(name) is None:
                continue
        except ModuleNotFoundError:
            continue
        obj = importlib.import_module(name)
        try:
            for attr in parts[n:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def test_every_dotted_name_the_docs_use_imports():
    """``pretrain_exp.core.runlock``, ``pretrain_exp.load_run``, ``pretrain_exp.insertion.noise.EmbeddingNoise``, ...
    (a ``python -m`` module too) resolve under the installed import names."""
    names = set()
    for path in DOC_FILES:
        for span in re.findall(r"`([^`\n]+)`", path.read_text(encoding="utf-8")):
            for word in re.findall(r"(?<![\w/.-])pretrain_exp(?:\.[A-Za-z_]\w*)+", span):
                if word.rsplit(".", 1)[1] not in FILE_SUFFIXES:  # pretrain_exp.log is a file of the run dir
                    names.add(word)
    assert len(names) > 15
    bad = sorted(n for n in names if not _resolves(n))
    assert not bad, f"dotted names in the docs that do not resolve: {bad}"


def python_snippets():
    """``(where, code)`` of every ```python block of the docs."""
    out = []
    for path in DOC_FILES:
        for info, start, body in _blocks(path.read_text(encoding="utf-8")):
            if info == "python":
                out.append((f"{path.relative_to(ROOT)}:{start}", "\n".join(body)))
    return out


SNIPPETS = python_snippets()


@pytest.fixture(scope="module")
def tiny_runs_root(tmp_path_factory):
    """A working directory holding ``runs/<the tiny run>`` (``python -m pretrain_exp experiment=tiny``, as the
    quickstart runs it)."""
    root = tmp_path_factory.mktemp("docs-tiny")
    env = {**os.environ, "PRETRAIN_EXP_RUNS": str(root / "runs"), "WANDB_MODE": "disabled",
           "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "pretrain_exp", "experiment=tiny", "wandb=disabled"], cwd=root,
                         env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return root


def test_the_docs_have_snippets():
    assert any(w.startswith("docs/getting-started/quickstart.md") for w, _ in SNIPPETS)
    assert any(w.startswith("docs/reference/") for w, _ in SNIPPETS)


@pytest.mark.slow
@pytest.mark.parametrize("where,code", SNIPPETS, ids=[w for w, _ in SNIPPETS])
def test_python_snippet_runs_on_the_tiny_run(where, code, tiny_runs_root, monkeypatch, capsys):
    monkeypatch.chdir(tiny_runs_root)
    exec(compile(code, where, "exec"), {"__name__": "__docs__"})
    assert capsys.readouterr().out.strip(), f"{where} printed nothing"


@pytest.mark.slow
def test_the_docs_build_without_warnings(tmp_path):
    """``sphinx-build -W --keep-going -n`` (what ``make docs`` runs) on the checkout's docs/. ``make test`` installs
    the docs extra; elsewhere a missing Sphinx skips, except under CI."""
    if importlib.util.find_spec("sphinx") is None or importlib.util.find_spec("myst_parser") is None:
        if os.environ.get("CI"):
            pytest.fail("the docs extra is not installed (make test installs it: pip install -e '.[docs]')")
        pytest.skip("the docs extra is not installed (pip install -e '.[docs]')")
    out = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html",
                          "-d", str(tmp_path / "doctrees"), str(DOCS), str(tmp_path / "html")],
                         cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, (out.stdout + out.stderr)[-6000:]
    assert (tmp_path / "html" / "reference" / "config.html").is_file()
    shutil.rmtree(tmp_path / "html", ignore_errors=True)
