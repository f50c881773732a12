"""The mutation score of the last ``mutmut run`` (``make mutation``), per mutated file and in total.

Reads ``python -m mutmut results --all true`` (one ``<module>.<function>__mutmut_<n>: <status>`` line per
mutant) in the checkout's root, where mutmut keeps its ``mutants/`` folder, and prints a Markdown table: killed /
total, survived, timeout and the other statuses mutmut reports (``no tests``: no selected test runs the mutated
function; ``not checked``: the run stopped before it). The score is killed / total; a timeout is counted apart.

Run: ``python -m tests.mutation_score`` (exit status 1 where mutmut has no results).
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter, defaultdict

#: ``pretrain_exp.data.order.xǁDataOrderǁprepare__mutmut_3: survived`` -> module, status
LINE = re.compile(r"^\s*(?P<module>[\w.]+?)\.x[_ǁ]\S*__mutmut_\d+: (?P<status>.+?)\s*$")
COLUMNS = ("survived", "timeout", "no tests", "not checked", "suspicious", "segfault", "skipped")


def tally(text: str) -> dict:
    """Module -> ``Counter`` of statuses, from the output of ``mutmut results --all true``."""
    by_module: dict = defaultdict(Counter)
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            by_module[m["module"]][m["status"]] += 1
    return dict(by_module)


def table(by_module: dict) -> str:
    """The Markdown table of :func:`tally`'s counts, one row per module and a total row."""
    cols = [c for c in COLUMNS if any(c in n for n in by_module.values())]
    head = ["file", "killed / total", "score", *cols]
    rows = [head, ["---"] * len(head)]
    total: Counter = Counter()
    for module in sorted(by_module):
        counts = by_module[module]
        total += counts
        rows.append(_row(module.replace(".", "/") + ".py", counts, cols))
    rows.append(_row("**total**", total, cols))
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


def _row(name: str, counts: Counter, cols: list) -> list:
    n = sum(counts.values())
    return [name, f"{counts['killed']} / {n}", f"{100 * counts['killed'] / max(n, 1):.1f}%",
            *(str(counts[c]) for c in cols)]


def main() -> int:
    out = subprocess.run([sys.executable, "-m", "mutmut", "results", "--all", "true"], capture_output=True,
                         text=True, check=False)
    by_module = tally(out.stdout)
    if not by_module:
        print(f"no mutmut results here (run `make mutation` first)\n{out.stderr.strip()}", file=sys.stderr)
        return 1
    print(table(by_module))
    return 0


if __name__ == "__main__":
    sys.exit(main())
