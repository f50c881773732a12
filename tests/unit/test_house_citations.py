"""The house rule on citations: project files speak of the repository only. No file names a design file that is
not in the repository, and no module, benchmark, docs page or config cites a path outside it (a ``../`` path that
does not resolve to a file or folder of the checkout, or an absolute path of some machine)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
THIS = Path(__file__).resolve()
#: a design file the project once cited but does not hold
DESIGN = re.compile(r"\bDESIGN\.md\b")
#: a relative path climbing out of its folder, e.g. ``../guides/x.md`` or ``../../notes/y.txt``
UP = re.compile(r"(?<![\w./-])((?:\.\./)+[\w./-]*[\w/])")
#: an absolute path of a machine (a user's or a workspace's folder)
ABSOLUTE = re.compile(r"(?<![\w.~/-])(/(?:work|home|Users|mnt|root|scratch)/[\w./-]+)")
#: the files that cite (the project's modules, the benchmarks, the docs pages, the configs, the README)
CITING = ("pretrain_exp", "frameworks", "evals", "benchmarks", "docs", "conf")


def checkout_files() -> list:
    """The checkout's files as a clone has them (tracked and untracked-not-ignored)."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split("\0")
    return [ROOT / f for f in out if f and (ROOT / f).is_file()]


def citations_outside(path: Path, text: str) -> list:
    """``line: path`` for each path ``text`` (the content of ``path``) cites outside the repository."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        for rel in UP.findall(line):
            target = (path.parent / rel).resolve()
            if not (target.is_relative_to(ROOT) and target.exists()):
                out.append(f"{n}: {rel}")
        out += [f"{n}: {a}" for a in ABSOLUTE.findall(line)]
    return out


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:  # a binary file (an image)
        return ""


def test_no_file_names_a_design_file_outside_the_repository():
    found = [f"{p.relative_to(ROOT)}:{n}" for p in checkout_files() if p != THIS
             for n, line in enumerate(_text(p).splitlines(), 1) if DESIGN.search(line)]
    assert found == []


def test_no_module_page_or_config_cites_a_path_outside_the_repository():
    files = [p for p in checkout_files()
             if p.relative_to(ROOT).parts[0] in CITING and p.suffix in (".py", ".md", ".yaml", ".txt", ".rst")]
    files.append(ROOT / "README.md")
    found = {str(p.relative_to(ROOT)): c for p in files if (c := citations_outside(p, _text(p)))}
    assert found == {}


def test_the_check_sees_a_citation_outside_the_repository():
    page = ROOT / "docs" / "guides" / "x.md"
    text = ("See [launching](../guides/launching.md) and ../development/benchmarks.md.\n"
            "See ../shared/docs/notes.md and ../../outside.md.\n"
            "Kept in /work/shared/tools/x.sh or /home/me/data, not s3://bucket/work/x nor ~/.cache/pretrain_exp.\n")
    assert citations_outside(page, text) == ["2: ../shared/docs/notes.md", "2: ../../outside.md",
                                             "3: /work/shared/tools/x.sh", "3: /home/me/data"]
    assert DESIGN.search("see DESIGN.md") and not DESIGN.search("MY_DESIGN.mdx")
