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

import ast
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
from tests.conftest import CACHE_DIR, CHECKOUT_PYTHONPATH, ROOT

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


#: what validating a documented command may fail on here, where the command needs what only the reader has: the
#: network (the checkpoint hosts and the Hub are unreachable offline; the error is the download's), a run an
#: earlier documented command makes (``parent=runs/<name>``), or a path on the reader's machine
OFFLINE_ERRORS = (r"^https?://\S+: download failed after \d+ consecutive attempts.*(URLError|Name or service)",
                  r"^parent: \S+/runs/[\w.-]+ is not a run dir",
                  r"^model\.path=/\S+: not an OLMo-core step<N> checkpoint")


def validate_as_the_cli_does(cfg, overrides):
    """What the CLI does with a composed config before it runs anything: :func:`pretrain_exp.app.validate.to_config`
    with the command line's overrides (on the config without Hydra's node, as the task function gets it)."""
    from omegaconf import OmegaConf

    from pretrain_exp.app.validate import to_config

    cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    return to_config(cfg, list(overrides))


@pytest.mark.parametrize("where,overrides", UNIQUE, ids=[w for w, _ in UNIQUE])
def test_documented_command_composes(where, overrides, tmp_path, _hydra):
    cfg = _compose(overrides, tmp_path)
    assert cfg.framework.name and cfg.training is not None


@pytest.mark.slow  # ~1 s a command (70 of them): the validation's plugins, tokenizers and checkpoint settings
@pytest.mark.parametrize("where,overrides", UNIQUE, ids=[w for w, _ in UNIQUE])
def test_documented_command_passes_the_clis_validation(where, overrides, tmp_path, _hydra, monkeypatch):
    """Each documented command passes the CLI's validation; offline, a command that needs the network or what
    only the reader has fails on that (:data:`OFFLINE_ERRORS`), never on its config."""
    from pretrain_exp.core.errors import PretrainExpError
    from pretrain_exp.core.retry import RetryPolicy

    cfg = _compose(overrides, tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(RetryPolicy, "delay", lambda self, failures: 0.0)  # a download offline fails at once
    try:
        exp = validate_as_the_cli_does(cfg, overrides)
    except PretrainExpError as e:
        assert any(re.search(p, str(e)) for p in OFFLINE_ERRORS), f"{where}: {type(e).__name__}: {e}"
    else:
        assert exp.framework.name == cfg.framework.name


@pytest.mark.slow  # the validation's plugins and checkpoint settings: ~5 s
def test_a_validation_error_is_caught(tmp_path, _hydra):
    """A documented line that composes but breaks a rule of the CLI's validation fails the check."""
    from pretrain_exp.core.errors import ConfigError

    bad = overrides_of("python -m pretrain_exp experiment=tiny training.precision=fp8")  # fp8 is OLMo-core's
    with pytest.raises(ConfigError, match="training.precision"):
        validate_as_the_cli_does(_compose(bad, tmp_path), bad)
    ok = overrides_of("python -m pretrain_exp experiment=tiny")
    assert validate_as_the_cli_does(_compose(ok, tmp_path), ok).name == "tiny"


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
           "OMP_NUM_THREADS": "1", "PYTHONPATH": CHECKOUT_PYTHONPATH}
    out = subprocess.run([sys.executable, "-m", "pretrain_exp", "experiment=tiny", "wandb=disabled"], cwd=root,
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:]
    (root / "console.txt").write_text(out.stdout, encoding="utf-8")  # what the run printed, in its order
    return root


def test_the_docs_have_snippets():
    assert any(w.startswith("docs/getting-started/quickstart.md") for w, _ in SNIPPETS)
    assert any(w.startswith("docs/reference/") for w, _ in SNIPPETS)


TINY_RUN = "runs/tiny-tiny_llama-step0-seed0"


def _eval_table_lines(out, ns):
    """The step x dup count table of mean insertion losses the pages print: one column per dup count of the
    tiny run, one row per evaluated step (its evals/step<N>/)."""
    import json

    from pretrain_exp.core.rundir import RunDir

    dups = sorted({r["dup_count"] for r in json.loads(open(f"{TINY_RUN}/results.json").read())["per_dup"]})
    steps = [s for s, _ in RunDir(TINY_RUN).eval_steps()]
    assert out[0].split() == ["dup_count", *map(str, dups)] and out[1].split() == ["step"], out
    assert [int(line.split()[0]) for line in out[2:2 + len(steps)]] == steps, out
    return out[2 + len(steps):]


def _check_table(out, ns):
    assert _eval_table_lines(out, ns) == []


def _check_table_and_columns(out, ns):
    rest = _eval_table_lines(out, ns)
    columns = set(ast.literal_eval(rest[0])) if len(rest) == 1 else set()
    assert {"item_id", "step", "eval", "experiment", "dup_count", "loss"} <= columns, rest


def _check_rundir(out, ns):
    """``step {task: record}`` per evaluated step, in step order, then the per-dup rows and the HF exports."""
    steps = [s for s, _ in ns["rd"].eval_steps()]
    assert steps == sorted(steps) and len(out) == len(steps) + 1, out
    assert all(line.startswith(f"{s} {{'insertion_loss': {{") for s, line in zip(steps, out)), out
    assert out[-1].startswith("[{'experiment': 'fictional_bios', 'dup_count': 0"), out[-1][:200]


def _check_capabilities(out, ns):
    """The comment's declaration, both capabilities held, the refusal of an insertion type's on a framework."""
    assert out[:2] == ["Capabilities(kind='insertion type', names=frozenset({'embedding_noise'}))", "True True"]
    assert len(out) == 3 and out[2].startswith("unknown framework capability 'embedding_noise'; known: ["), out


def _check_items_per_group(out, ns):
    """The page's table: items per group at alpha = 0.05, power 0.8, for sd 0.49."""
    assert out == ["0.1 378", "0.2 96", "0.3 43", "0.5 17"]


def _check_last_step(out, ns):
    """One step, each item of the plan once, counted per experiment and dup count."""
    import json

    plan = json.loads(open(f"{TINY_RUN}/results.json").read())["plan"]
    last = ns["last"]
    assert last["step"].nunique() == 1 and len(last) == last["item_id"].nunique() == plan["num_items"]
    assert out[0].split() == ["mean", "count"] and sum(int(line.split()[-1]) for line in out[2:]) == plan["num_items"]


def _check_plan(out, ns):
    """The plan's counts as results.json records them."""
    import json

    plan = json.loads(open(f"{TINY_RUN}/results.json").read())["plan"]
    assert out == [f"{plan['num_items']} {plan['num_insertions']} {plan['inserted_tokens']} {plan['experiments']}"]


def _check_per_dup(out, ns):
    """A line per experiment and dup count, as results.json has them."""
    rows = ns["results"]["per_dup"]
    assert [line.split()[:3] for line in out] == [
        [r["experiment"], str(r["dup_count"]), str(round(r["mean_loss"], 3))] for r in rows] and len(rows) >= 2


#: what each ```python snippet of the docs prints, as the page around it says (a line of the snippet -> a check of
#: its printed lines and its namespace); a snippet without one fails
SNIPPET_OUTPUT = {
    'print(df[df["eval"] == "insertion_loss"].groupby(["step", "dup_count"])["loss"].mean().unstack())\n'
    "print(df.columns.tolist())": _check_table_and_columns,
    'print(df[df["eval"] == "insertion_loss"].groupby(["step", "dup_count"])["loss"].mean().unstack())': _check_table,
    "for step, _ in rd.eval_steps():": _check_rundir,
    "print(GaussianConf.capabilities)": _check_capabilities,
    "print(delta, items_per_group(delta, sd, alpha=0.05, power=0.8))": _check_items_per_group,
    'print(last.groupby(["experiment", "dup_count"])["loss"].agg(["mean", "count"]))': _check_last_step,
    "print(plan.num_items, plan.num_insertions, int(plan.lengths.sum()), plan.experiments)": _check_plan,
    'for row in results["per_dup"]:': _check_per_dup,
}


def snippet_check(code: str):
    """The :data:`SNIPPET_OUTPUT` check of ``code`` (the first whose line it holds), or ``None``."""
    return next((check for line, check in SNIPPET_OUTPUT.items() if line in code), None)


def test_every_snippet_has_its_documented_output():
    missing = [where for where, code in SNIPPETS if snippet_check(code) is None]
    assert not missing, f"snippets without a check of what they print (SNIPPET_OUTPUT): {missing}"


@pytest.mark.slow
@pytest.mark.parametrize("where,code", SNIPPETS, ids=[w for w, _ in SNIPPETS])
def test_python_snippet_runs_on_the_tiny_run(where, code, tiny_runs_root, monkeypatch, capsys):
    monkeypatch.chdir(tiny_runs_root)
    ns = {"__name__": "__docs__"}
    exec(compile(code, where, "exec"), ns)
    out = capsys.readouterr().out.strip().splitlines()
    snippet_check(code)(out, ns)


@pytest.mark.slow
def test_the_docs_build_without_warnings(tmp_path):
    """``sphinx-build -W --keep-going -n`` (what ``make docs`` runs) on the checkout's docs/. ``make test`` installs
    the docs extra; elsewhere a missing Sphinx skips, except under CI."""
    if importlib.util.find_spec("sphinx") is None or importlib.util.find_spec("myst_parser") is None:
        if os.environ.get("CI"):
            pytest.fail("the docs extra is not installed (make test installs it: pip install -e '.[docs]')")
        pytest.skip("the docs extra is not installed (pip install -e '.[docs]')")
    sources = _doc_sources()
    out = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html",
                          "-d", str(tmp_path / "doctrees"), str(DOCS), str(tmp_path / "html")],
                         cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, (out.stdout + out.stderr)[-6000:]
    assert (tmp_path / "html" / "reference" / "config.html").is_file()
    assert _doc_sources() == sources, "the docs build changed files under docs/"
    shutil.rmtree(tmp_path / "html", ignore_errors=True)


def _doc_sources():
    """Path -> content of every source file under docs/ (the build output and caches left out)."""
    return {p: p.read_bytes() for p in DOCS.rglob("*")
            if p.is_file() and "_build" not in p.parts and "__pycache__" not in p.parts}


# ---------------------------------------------------------------------------------------------------------------
# the reference pages are committed, generated Markdown (docs/reference_pages.py, make reference)


def _reference_pages():
    spec = importlib.util.spec_from_file_location("reference_pages", DOCS / "reference_pages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_config_reference_is_committed_and_current():
    """``docs/reference/config.md`` holds every field of the schema in the file itself (it reads on the repository
    host, without a build) and equals what the dataclasses generate now; when stale, the message names the command
    that refreshes it."""
    pages = _reference_pages()
    page = DOCS / "reference" / "config.md"
    text = page.read_text(encoding="utf-8")
    assert [m.group("what") for m in pages.REGION.finditer(text)] == ["config-schema"]
    for row in ("| `training.num_steps` |", "| `insertion.experiments.<name>.repetitions` |", "| option | what |"):
        assert row in text, row
    assert pages.refreshed(text) == text, f"{page.relative_to(ROOT)} is stale: run {pages.REFRESH}"


def test_a_stale_page_is_told_with_the_command_that_refreshes_it(tmp_path):
    """The check would catch a field added to a dataclass: a page whose generated table lacks a row is stale."""
    pages = _reference_pages()
    text = (DOCS / "reference" / "config.md").read_text(encoding="utf-8")
    stale = tmp_path / "config.md"
    stale.write_text(text.replace("| `training.num_steps` |", "| `training.no_such_field` |"), encoding="utf-8")
    assert pages.stale_pages([stale]) == [stale]
    assert pages.stale_pages([stale], write=True) == [stale]
    assert stale.read_text(encoding="utf-8") == pages.refreshed(text) and pages.stale_pages([stale]) == []
    assert "make reference" in pages.REFRESH


@pytest.mark.slow
def test_the_command_reference_is_committed_and_current():
    """``docs/reference/commands.md`` holds every command's ``--help`` text, equal to what the commands print now
    (``python docs/reference_pages.py --check``: it runs them)."""
    text = (DOCS / "reference" / "commands.md").read_text(encoding="utf-8")
    pages = _reference_pages()
    helped = [m.group("what") for m in pages.REGION.finditer(text)]
    scripts = re.findall(r"^\| `(pretrain-exp[\w-]*)` \| `([\w. -]+)` \|", text, re.M)
    assert len(scripts) >= 9
    assert {f"command-help: {module}" for _, module in scripts} == set(helped)
    assert text.count("usage: ") >= len(scripts) - 1  # Hydra's help says "Usage:"
    out = subprocess.run([sys.executable, str(DOCS / "reference_pages.py"), "--check"], cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]


def test_read_the_docs_builds_the_site_as_make_docs_does():
    """``.readthedocs.yaml``: Sphinx on ``docs/conf.py`` with warnings as errors (``make docs``'s ``-W``; conf.py is
    nitpicky itself), the project installed with the extras the build imports, a Python the project supports."""
    import yaml

    rtd = yaml.safe_load((ROOT / ".readthedocs.yaml").read_text(encoding="utf-8"))
    make = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert rtd["version"] == 2
    assert rtd["sphinx"]["configuration"] == "docs/conf.py" and rtd["sphinx"]["fail_on_warning"] is True
    assert re.search(r"^docs:.*\n\t\$\(PY\) -m sphinx -W .* docs docs/_build/html", make, re.M)
    assert "nitpicky = True" in (DOCS / "conf.py").read_text(encoding="utf-8")
    (install,) = rtd["python"]["install"]
    assert install["method"] == "pip" and install["path"] == "."
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    extras = set(re.findall(r"^([\w-]+) = \[", pyproject.split("[project.optional-dependencies]")[1].split("\n[")[0],
                            re.M))
    assert {"docs", "olmo"} <= set(install["extra_requirements"]) <= extras
    major, minor = map(int, str(rtd["build"]["tools"]["python"]).split("."))
    lowest = re.search(r'^requires-python = ">=(\d+)\.(\d+)"', pyproject, re.M).groups()
    assert (major, minor) >= tuple(map(int, lowest))
    pin = re.search(r"torch==([\d.]+)", make).group(1)
    assert any(f"torch=={pin}" in cmd for cmd in rtd["build"]["jobs"]["pre_install"])


# ---------------------------------------------------------------------------------------------------------------
# documented results of commands: run names and eval lists, composed


def _commented_commands(marker: str):
    """``(where, command, what the comment says)`` of each command line of a bash block whose ``# <marker> ...``
    comment (on its line or the next) documents what it gives."""
    found = []
    for path in DOC_FILES:
        rel = path.relative_to(ROOT)
        for info, start, body in _blocks(path.read_text(encoding="utf-8")):
            if info not in ("", "bash", "sh", "shell"):
                continue
            for n, line in enumerate(body):
                cmd, _, comment = line.partition("  # ")
                if not cmd.strip().startswith(COMMANDS):
                    continue
                if not comment and n + 1 < len(body) and body[n + 1].lstrip().startswith("# "):
                    comment = body[n + 1].lstrip()[2:]
                if comment.strip().startswith(marker):
                    found.append((f"{rel}:{start + n}", cmd.strip(), comment.strip()[len(marker):].strip()))
    return found


def test_documented_run_names_are_the_run_names(tmp_path, _hydra):
    """``# run dir: runs/<name>`` after a command is the run dir that command gets: the composed ``run_name``
    (preset, model, step, seed) plus the suffix of its overrides (:func:`pretrain_exp.app.run_name.run_suffix`, what
    ``${run_suffix:}`` gives in a Hydra run)."""
    from pretrain_exp.app.run_name import run_suffix

    documented = _commented_commands("run dir:")
    assert len(documented) >= 4 and any("-texts-" in what for _, _, what in documented)
    template = (ROOT / "conf" / "config.yaml").read_text(encoding="utf-8")
    assert re.search(r"^run_name: .*\$\{run_suffix:\}$", template, re.M)  # the suffix ends the name
    for where, cmd, what in documented:
        overrides = overrides_of(cmd)
        cfg = _compose(overrides, tmp_path)
        name, suffix = str(cfg.run_name), run_suffix(overrides)
        name = name if suffix and name.endswith(suffix) else name + suffix  # outside a Hydra run it resolves to ""
        assert what.split()[0] == f"runs/{name}", f"{where}: {cmd} gives runs/{name}, the docs say {what}"


def test_documented_eval_lists_are_what_hydra_composes(tmp_path, _hydra):
    """``# eval.tasks: a, b`` after a command is exactly the list of tasks it composes (``eval=x`` replaces the
    default list, ``+eval=x`` adds to it)."""
    documented = _commented_commands("eval.tasks:")
    assert any("+eval=" in cmd for _, cmd, _ in documented)
    assert any(re.search(r"(?<![+\w])eval=\w", cmd) for _, cmd, _ in documented)
    for where, cmd, what in documented:
        tasks = [t.strip() for t in what.split("(")[0].split(",")]
        got = list(_compose(overrides_of(cmd), tmp_path).eval.tasks)
        assert got == tasks, f"{where}: {cmd} composes eval.tasks {got}, the docs say {tasks}"


# ---------------------------------------------------------------------------------------------------------------
# what the tiny run prints and writes, against what the docs show of it

#: the console forms the docs quote (an inline code span starting so)
CONSOLE_FORMS = ("step ", "training steps ", "evaluating step ", "run dir: ")
#: the logger prefix a console line may carry (``[time][logger][LEVEL] - ``)
_PREFIX = re.compile(r"^\[[^\]]*\]\[[^\]]*\]\[[A-Z]+\] - ")


def _console(root):
    return [_PREFIX.sub("", line).rstrip() for line in (root / "console.txt").read_text(encoding="utf-8").splitlines()]


def _form_regex(span: str) -> str:
    """A documented console line as a regex: numbers, ``...``, ``<placeholders>`` and one-letter names (``a``,
    ``N``) stand for any word, everything else is literal."""
    span = re.sub(r"<[^>]*>", "<>", " ".join(span.split()))
    out = []
    for word in span.split(" "):
        core, tail = re.match(r"^(.*?)([,:;]*)$", word).groups()
        if re.fullmatch(r"[\d,./e+-]+|\.\.\.|<>|[a-zA-Z]", core) and re.search(r"[\d.<>]|^[a-zA-Z]$", core):
            out.append(r"\S+" + re.escape(tail))
        elif re.fullmatch(r"\d+/\d+", core) or re.fullmatch(r"[\d.,]+/\d+", core):
            out.append(r"\S+" + re.escape(tail))
        else:
            out.append(re.escape(word))
    return "^" + " ".join(out) + "$"


def _documented_console_forms():
    forms = set()
    for path in (DOCS / "getting-started" / "quickstart.md", DOCS / "reference" / "commands.md",
                 DOCS / "guides" / "evals.md"):
        for span in re.findall(r"`([^`]+)`", _outside_blocks(path.read_text(encoding="utf-8"))):
            if span.startswith(CONSOLE_FORMS) and re.search(r"\d|\.\.\.|<", span) and "=" not in span:
                forms.add(span)
    return sorted(forms)


def test_the_console_forms_are_found():
    forms = _documented_console_forms()
    assert any(f.startswith("step ") and "loss" in f for f in forms), forms
    assert any(f.startswith("run dir: ") for f in forms), forms
    assert re.match(_form_regex("step 5/12: loss 10.35, grad norm 0.807, lr 4.14e-03, 1,173 tokens/s"),
                    "step 1/12: loss 10.79, grad norm 0.438, lr 0.00e+00, 297 tokens/s")
    assert not re.match(_form_regex("step 5/12: loss 10.35, grad norm 0.807"), "step 1/12: loss 10.79, norm 0.4")


def _table_headers(lines):
    """The column names of each rich table (its ``┃ a ┃ b ┃`` header lines)."""
    return [tuple(c.strip() for c in line.strip().strip("┃").split("┃")) for line in lines
            if line.strip().startswith("┃")]


@pytest.mark.slow
def test_the_tiny_run_prints_and_writes_what_the_docs_show(tiny_runs_root):
    """The quickstart's and the command reference's console lines, run name, table columns and run-dir files, each
    found in a real ``experiment=tiny`` run."""
    console = _console(tiny_runs_root)
    printed = "\n".join(console)
    for form in _documented_console_forms():
        assert any(re.match(_form_regex(form), line) for line in console), f"no console line is like `{form}`"
    quick = (DOCS / "getting-started" / "quickstart.md").read_text(encoding="utf-8")
    # the run name and the last line
    (name,) = set(re.findall(r"`runs/(tiny-[^/`]+)/?`", quick))
    last = [line for line in console if line.strip()][-1]
    assert last == f"run dir: {tiny_runs_root / 'runs' / name}", last
    # the results tables: the demo's, as the quickstart shows it, has the tiny run's columns
    documented = [block for info, _, block in _blocks(quick) if any("┃" in line for line in block)]
    assert documented and _table_headers(documented[0]) == _table_headers(console)[:len(_table_headers(documented[0]))]
    for column in re.findall(r"^\| `([^`]+)`", quick, re.M):
        assert column in printed, f"the quickstart explains the column `{column}`, which the run does not print"
    # the files the quickstart names (a bare name anywhere in the run dir, `evals/step<N>/...` at every step)
    run = tiny_runs_root / "runs" / name
    steps = sorted(int(p.name[4:]) for p in (run / "evals").glob("step*"))
    assert steps == [4, 8, 12]
    files = {w for span in re.findall(r"`([^`\s]+)`", _outside_blocks(quick))
             for w in [span] if not w.startswith(ROOTS + ("runs/", "../", "python", "make"))
             and re.search(r"\.(jsonl|json|png|parquet|log|npz)$|^[a-z]+/$", w)}
    assert {"manifest.jsonl", "results.json", "plots/loss_vs_dup.png", "metrics.jsonl"} <= files, files
    for word in sorted(files):
        if "<N>" in word:
            assert all((run / word.replace("<N>", str(s))).exists() for s in steps), word
        elif "/" in word:
            assert (run / word).exists(), word
        else:
            assert next(run.rglob(word), None) is not None, word


@pytest.mark.slow
def test_documented_model_dirs_are_what_an_hf_run_keeps(tiny_runs_root):
    """A model dir the docs hand to lm-eval (``pretrained=runs/<run>/...``) exists in an ``hf`` run (the tiny run,
    ``<N>`` its last step) and holds an HF model; a dir the run does not keep (``hf/step<N>`` without
    ``training.export_hf=every``) is caught."""
    run = next((tiny_runs_root / "runs").iterdir())
    dirs = [(path.name, d) for path in DOC_FILES for info, _, body in _blocks(path.read_text(encoding="utf-8"))
            for line in body if line.lstrip().startswith("lm_eval ")
            for d in re.findall(r"pretrained=runs/<run>/(\S+)", line)]
    assert dirs
    for where, rel in dirs:
        model = run / rel.replace("<N>", "12")
        assert (model / "config.json").is_file(), f"{where}: an hf run has no {rel} ({sorted(os.listdir(run))})"
    assert not (run / "hf" / "step12" / "config.json").exists()


@pytest.mark.slow
def test_the_api_example_reads_one_step(tiny_runs_root, monkeypatch, capsys):
    """The Python API page's first example counts each item once per dup group: it selects a step, so its ``count``
    column is the items per dup count of ``items.jsonl``."""
    import json

    monkeypatch.chdir(tiny_runs_root)
    (where, code) = next((w, c) for w, c in SNIPPETS if w.startswith("docs/reference/api.md"))
    scope = {"__name__": "__docs__"}
    exec(compile(code, where, "exec"), scope)
    run = next((tiny_runs_root / "runs").iterdir())
    per_dup = {}
    for line in (run / "items.jsonl").read_text(encoding="utf-8").splitlines():
        item = json.loads(line)
        per_dup[item["dup_count"]] = per_dup.get(item["dup_count"], 0) + 1
    frame = [v for k, v in scope.items() if k not in ("df", "pretrain_exp") and hasattr(v, "groupby")][-1]
    counts = frame.groupby("dup_count")["item_id"].count().to_dict()
    assert counts == per_dup, f"{where}: counts {counts}, items per dup count {per_dup}"


@pytest.mark.slow
def test_the_inspector_prints_what_the_docs_show(tiny_runs_root):
    """The audit guide's inspector view of the tiny run (``step=2 row=4``): its span labels (experiment, item,
    ``dup index`` 0-based as in the placements table) are the inspector's."""
    guide = (DOCS / "guides" / "audit-and-inspect.md").read_text(encoding="utf-8")
    shown = next(block for info, _, block in _blocks(guide) if any("⟦" in line for line in block))
    flat = lambda lines: re.sub(r"\s+", " ", " ".join(line.strip("│ ") for line in lines))  # noqa: E731
    labels = re.findall(r"⟦([^⟧]+)⟧", flat(shown))
    assert labels
    run = next((tiny_runs_root / "runs").iterdir())
    out = subprocess.run([sys.executable, "-m", "pretrain_exp.inspect", str(run), "step=2", "row=4"],
                         cwd=tiny_runs_root, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "COLUMNS": "112", "PYTHONPATH": CHECKOUT_PYTHONPATH})
    assert out.returncode == 0, out.stderr[-2000:]
    assert re.findall(r"⟦([^⟧]+)⟧", flat(out.stdout.splitlines())) == labels
    # one term for one number: the span's label and the placements table both say "dup index" (0-based)
    assert "┃ dup index ┃" in "\n".join(shown) and all(" dup index " in label for label in labels), labels


# ---------------------------------------------------------------------------------------------------------------
# the guides: what to type first, how it works last

GUIDES = sorted((DOCS / "guides").glob("*.md"))
#: implementation and test details: a test file, a source file, "tested", an API role
IMPLEMENTATION = re.compile(r"`(?:tests/|benchmarks/[\w/]+\.py|(?:pretrain_exp|frameworks|evals)/[\w/]*\.py)[^`]*`"
                            r"|\btested\b|\{py:[a-z]+\}")


def _guide_problems(text: str):
    """Why a guide does not lead with what to type or keeps implementation details outside its last section."""
    lines = text.splitlines()
    heads = [(i, line.strip()) for i, line in enumerate(lines) if line.startswith("## ")]
    first_head = heads[0][0] if heads else len(lines)
    first_block = next((i for i, line in enumerate(lines) if line.lstrip().startswith("```")), len(lines))
    problems = []
    if first_block > first_head:
        problems.append("no command block before its first section")
    if not heads or heads[-1][1] != "## How it works":
        problems.append("its last section is not '## How it works'")
    end = heads[-1][0] if heads and heads[-1][1] == "## How it works" else len(lines)
    prose = _outside_blocks("\n".join(lines[:end])).splitlines()
    problems += [f"line {n}: {m}" for n, line in enumerate(prose, 1) for m in IMPLEMENTATION.findall(line)]
    return problems


def test_each_guide_leads_with_what_to_type_and_ends_with_how_it_works():
    """Every guide under docs/guides opens with the commands to type (a code block before its first section) and
    keeps test files, source files and API roles to its last section, ``## How it works``."""
    assert len(GUIDES) >= 10
    bad = {g.name: p for g in GUIDES if (p := _guide_problems(g.read_text(encoding="utf-8")))}
    assert not bad, bad
    assert _guide_problems("# T\n\n## A\n\n```bash\nx\n```\n\nsee `tests/unit/x.py`\n") == [
        "no command block before its first section", "its last section is not '## How it works'",
        "line 9: `tests/unit/x.py`"]
