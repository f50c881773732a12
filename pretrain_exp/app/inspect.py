"""Inspect a run's training stream, or an official OLMo run's: ``python -m pretrain_exp.inspect <source> <query>``.

``<source>`` is a run dir, or an official OLMo-2 / OLMo-3 run (a model preset, a checkpoint URL or dir, or its
``config.yaml`` / ``config.json``: :mod:`pretrain_exp.app.official`, which answers ``step=K [row=R]``, ``step=A-B``
and ``search=TEXT step=A-B`` from the run's config alone, fetching only the rows asked for).

Built from the run dir's ``config.resolved.yaml`` and ``plan.npz`` alone (no checkpoint, any framework): the rows
come out of the same data order and :meth:`Plan.apply <pretrain_exp.insertion.plan.Plan.apply>` the frameworks
train on (:class:`~pretrain_exp.data.rows.TrainingRows`). Queries:

- ``step=K [row=R]``: the decoded rows of global batch ``K`` (or its row ``R``) as trained, every inserted span
  highlighted with its experiment, item id and dup index;
- ``item=ID`` (a global item id, or ``<experiment>:<index>``): every place the item landed (step, row, offset,
  dup index), its loss and memorization at every evaluated step (``evals/step*/``), and its natural occurrences
  (``audit.json``);
- ``search="text"`` or ``search="1,2,3"`` (token ids): where the sequence occurs in the run's window as trained,
  each hit marked inserted (with the item) or natural. A text is searched as encoded alone and with a leading
  space (how a word inside a document tokenizes).

Output goes to the terminal with rich; ``--html OUT`` also writes the same view as an HTML page (rich's
``Console.save_html``).
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional

import numpy as np

from pretrain_exp.core.commands import prog
from pretrain_exp.core.errors import ConfigError, PretrainExpError
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.data.order import step_row_offset

if TYPE_CHECKING:  # torch comes with them: imported where used, so a query of an official run starts fast
    from pretrain_exp.data.rows import TrainingRows
    from pretrain_exp.insertion.plan import Plan

COLORS = ("yellow", "cyan", "green", "magenta", "bright_blue", "bright_red")  #: span colours, by item id
MAX_HITS = 200  #: search hits listed


@dataclass
class RunView:
    """A run dir opened for inspection: config, plan, data order, tokenizer, training rows and item table."""

    run_dir: Path
    cfg: object
    plan: Plan
    tokenizer: object
    rows: TrainingRows

    @classmethod
    def open(cls, run_dir: str | Path) -> "RunView":
        """Open ``run_dir`` (its ``config.resolved.yaml`` and ``plan.npz``).

        :raises ConfigError: (key ``run_dir``) if either file is missing.
        """
        from pretrain_exp.app.prepare import run_data
        from pretrain_exp.app.validate import load_resolved
        from pretrain_exp.data.rows import TrainingRows
        from pretrain_exp.insertion.plan import Plan

        run_dir = Path(run_dir).resolve()
        rd = RunDir(run_dir)
        for path in (rd.config, rd.plan):
            if not path.is_file():
                raise ConfigError("run_dir", f"{path} not found: not a run dir (plan built?)")
        cfg = load_resolved(rd.config, check=False)  # validated when the run recorded it
        plan = Plan.load(rd.plan)
        _, tokenizer, _, order = run_data(cfg, progress=False, reader=True)
        L = plan.sequence_length
        first, end = plan.window[0] // L, plan.window[1] // L
        return cls(run_dir, cfg, plan, tokenizer, TrainingRows(order, plan, first, end - first))

    @cached_property
    def items(self) -> List[dict]:
        """``items.jsonl`` rows by item id (an entry per plan item; ``{}`` where the table is missing)."""
        rows = RunDir(self.run_dir).read_items()
        by_id = {r["item_id"]: r for r in rows}
        return [by_id.get(i, {}) for i in range(self.plan.num_items)]

    def label(self, item: int) -> str:
        """``<experiment>:<index> (item <id>)``."""
        exp = self.plan.experiments[int(self.plan.item_experiment[item])]
        return f"{exp}:{self.items[item].get('index', '?')} (item {item})"

    def item_id(self, key: str) -> int:
        """A global item id from ``ID`` or ``<experiment>:<index>``.

        :raises ConfigError: (key ``item``) for an unknown item.
        """
        if re.fullmatch(r"\d+", key) and int(key) < self.plan.num_items:
            return int(key)
        exp, _, idx = key.rpartition(":")
        for i, rec in enumerate(self.items):
            if exp and rec.get("experiment") == exp and str(rec.get("index")) == idx:
                return i
        raise ConfigError("item", f"{key!r} is not an item of the plan (ids 0..{self.plan.num_items - 1} or "
                          f"<experiment>:<index> with experiments {self.plan.experiments})")

    def decode(self, tokens: np.ndarray) -> str:
        return self.tokenizer.decode([int(t) for t in tokens], clean_up_tokenization_spaces=False)


def row_text(view: RunView, q: int):
    """The decoded row ``q`` as trained: a rich ``Text`` with each inserted span highlighted and labelled."""
    from rich.text import Text

    plan, L = view.plan, view.plan.sequence_length
    tokens = view.rows.row(q)
    i0, i1 = plan.spans_in_row(q)
    out, cur = Text(), 0
    for i in range(i0, i1):
        s, e = int(plan.positions[i]) - q * L, int(plan.ends[i]) - q * L
        a, b = max(s, 0), min(e, L)
        if a > cur:
            out.append(view.decode(tokens[cur:a]))
        item = int(plan.item_ids[i])
        color = COLORS[item % len(COLORS)]
        out.append(f"⟦{view.label(item)} dup index {int(plan.dup_index[i])} of {int(plan.item_dup_count[item])}⟧",
                   style=f"bold {color}")
        out.append(view.decode(tokens[a:b]), style=f"black on {color}")
        cur = b
    if cur < L:
        out.append(view.decode(tokens[cur:]))
    noise = np.flatnonzero(plan.noise_rows == q)
    if noise.size:
        out = Text(f"[gaussian noise on this row's embeddings: {view.label(int(plan.noise_item_ids[noise[0]]))}] ",
                   style="bold red") + out
    return out


def show_step(view: RunView, step: int, row: Optional[int] = None) -> list:
    """Renderables of global batch ``step`` (or only its ``row``).

    :raises ConfigError: (key ``step``/``row``) outside the run's window.
    """
    from rich.panel import Panel

    plan, B, L = view.plan, view.plan.global_batch_size, view.plan.sequence_length
    first_step, last_step = plan.window[0] // (L * B) + 1, plan.window[1] // (L * B)
    if not first_step <= step <= last_step:
        raise ConfigError("step", f"step {step} is outside the run's steps [{first_step}, {last_step}]")
    if row is not None and not 0 <= row < B:
        raise ConfigError("row", f"row {row} is outside the global batch [0, {B})")
    out = []
    for r in ([row] if row is not None else range(B)):
        q = (step - 1) * B + r
        i0, i1 = plan.spans_in_row(q)
        title = f"step {step}, row {r} (training-order row {q}): {i1 - i0} insertion(s)"
        out.append(Panel(row_text(view, q), title=title, title_align="left"))
    return out


def eval_rows(run_dir: Path, item: int) -> List[dict]:
    """``{step, loss, exact_match, matched_length}`` of ``item`` at every evaluated step (``None`` where an eval
    has no row for it), from ``evals/step*/`` ``insertion_loss`` and ``memorization`` records."""
    out = []
    rd = RunDir(run_dir)
    for step, _ in rd.eval_steps():
        rec: Dict[str, object] = {"step": step, "loss": None, "exact_match": None, "matched_length": None}
        for doc in rd.read_evals(step).values():
            for r in doc.get("rows", []):
                if r.get("item_id") != item:
                    continue
                if doc.get("type") == "insertion_loss":
                    rec["loss"] = r.get("loss")
                elif doc.get("type") == "memorization":
                    rec["exact_match"], rec["matched_length"] = r.get("exact_match"), r.get("matched_length")
        out.append(rec)
    return out


def show_item(view: RunView, key: str) -> list:
    """Renderables of one item: its text, placements, evals by step and natural occurrences."""
    from rich.table import Table
    from rich.text import Text

    plan = view.plan
    item = view.item_id(key)
    L, B = plan.sequence_length, plan.global_batch_size
    out = [Text(f"{view.label(item)}: dup count {int(plan.item_dup_count[item])}, "
                f"{plan.item_tokens(item).size} tokens, source {view.items[item].get('source')}", style="bold"),
           Text(view.decode(plan.item_tokens(item)))]
    sel = np.flatnonzero(plan.span_item_ids == item)
    step, row, off = step_row_offset(plan.span_positions[sel], L, B)
    t = Table(title="placements")
    for c in ("dup index", "step", "row", "offset", "position"):
        t.add_column(c, justify="right")
    for k, i in enumerate(sel):
        t.add_row(str(int(plan.span_dup_index[i])), str(int(step[k])), str(int(row[k])), str(int(off[k])),
                  str(int(plan.span_positions[i])))
    out.append(t)
    ev = eval_rows(view.run_dir, item)
    t = Table(title="evals by step")
    for c in ("step", "loss (nats/token)", "exact match", "matched tokens"):
        t.add_column(c, justify="right")
    for r in ev:
        t.add_row(str(r["step"]), "-" if r["loss"] is None else f"{r['loss']:.3f}",
                  "-" if r["exact_match"] is None else str(r["exact_match"]),
                  "-" if r["matched_length"] is None else str(r["matched_length"]))
    out.append(t if ev else Text("no evals in the run dir yet"))
    audit = RunDir(view.run_dir).read_audit()
    if audit is not None:
        rec = next((r for r in audit["items"] if r["item_id"] == item), None)
        if rec is not None:
            at = ", ".join(f"step {w['step']} row {w['row']} offset {w['offset']}" for w in rec["exact_at"][:5])
            out.append(Text(f"natural occurrences (audit): {rec['natural_exact']} exact in the window"
                            + (f" ({at})" if at else "") + f", {rec['natural_ngram_overlap']:.0%} of its n-grams; "
                            f"{rec['held_out_exact']} in the held-out rows; effective dup count "
                            f"{rec['effective_dup_count']}"))
    return out


def parse_pattern(view: RunView, query: str) -> List[np.ndarray]:
    """The token sequences to search for: ids (``"1,2,3"`` or ``"[1, 2, 3]"``), or a text encoded alone and with a
    leading space (distinct encodings only).

    :raises ConfigError: (key ``search``) for an empty query.
    """
    if re.fullmatch(r"\s*\[?\s*\d+(\s*[,\s]\s*\d+)*\s*\]?\s*", query):
        ids = [int(x) for x in re.findall(r"\d+", query)]
        return [np.asarray(ids, np.int64)]
    pats = []
    for text in (query, " " + query):
        ids = np.asarray(view.tokenizer(text, add_special_tokens=False)["input_ids"], np.int64)
        if ids.size and not any(np.array_equal(ids, p) for p in pats):
            pats.append(ids)
    if not pats:
        raise ConfigError("search", "empty query")
    return pats


def search(view: RunView, query: str) -> List[dict]:
    """Every occurrence of ``query`` (:func:`parse_pattern`) in the window as trained: ``{position, step, row,
    offset, pattern, kind, item}`` (``kind`` ``inserted`` when the hit lies inside an inserted span of ``item``,
    ``partly inserted`` when it overlaps one, else ``natural``), by position; at most :data:`MAX_HITS`."""
    from pretrain_exp.insertion.audit import ItemIndex, row_blocks, scan_rows

    plan, L, B = view.plan, view.plan.sequence_length, view.plan.global_batch_size
    pats = [p for p in parse_pattern(view, query) if p.size <= L]
    index = ItemIndex(pats, n=max(p.size for p in pats) + 1)  # n > every pattern: exact whole-pattern matches
    rows = np.arange(view.rows.first_row, view.rows.first_row + len(view.rows), dtype=np.int64)
    res = scan_rows(index, row_blocks(view.rows.row, rows, L), L, max_locations=MAX_HITS)
    hits = []
    for k, positions in res.exact_at.items():
        for p in positions:
            q = p // L
            i0, i1 = plan.spans_in_row(q)
            kind, item = "natural", None
            for i in range(i0, i1):
                s, e = int(plan.positions[i]), int(plan.ends[i])
                if s < p + pats[k].size and p < e:
                    item = int(plan.item_ids[i])
                    kind = "inserted" if s <= p and p + pats[k].size <= e else "partly inserted"
            step, row, off = step_row_offset(p, L, B)
            hits.append({"position": int(p), "step": int(step), "row": int(row), "offset": int(off), "pattern": k,
                         "kind": kind, "item": item})
    return sorted(hits, key=lambda h: h["position"])[:MAX_HITS]


def show_search(view: RunView, query: str) -> list:
    """Renderables of :func:`search`."""
    from rich.table import Table
    from rich.text import Text

    hits = search(view, query)
    t = Table(title=f"{query!r} in the window as trained: {len(hits)} occurrence(s)"
              + (f" (first {MAX_HITS})" if len(hits) >= MAX_HITS else ""))
    for c in ("step", "row", "offset", "position", "kind", "item"):
        t.add_column(c, justify="left" if c in ("kind", "item") else "right")
    for h in hits:
        t.add_row(str(h["step"]), str(h["row"]), str(h["offset"]), str(h["position"]), h["kind"],
                  "" if h["item"] is None else view.label(h["item"]))
    pats = parse_pattern(view, query)
    return [Text("token ids searched: " + "; ".join(str(p.tolist()) for p in pats)), t]


def main(argv: Optional[List[str]] = None) -> int:
    """The command line (module docstring); returns the exit status (2 with one line for a user error)."""
    ap = argparse.ArgumentParser(prog=prog("pretrain-exp-inspect", "pretrain_exp.inspect"),
                                 description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", metavar="SOURCE", help="a run dir, or an official run: a model preset (olmo2_1b), "
                    "a checkpoint URL or dir, or its config.yaml / config.json")
    ap.add_argument("query", nargs="+", help="step=K [row=R] | item=ID | search=TEXT_OR_IDS (official runs: "
                    "step=K [row=R] | step=A-B | search=TEXT step=A-B)")
    ap.add_argument("--html", metavar="OUT", help="also write the view as an HTML page (run dirs)")
    official = ap.add_argument_group("official runs (pretrain_exp.app.official)")
    official.add_argument("--out", metavar="FILE", help="write the rows or hits to FILE.jsonl or FILE.parquet")
    official.add_argument("--prefix", metavar="OLD=NEW", action="append", default=[],
                          help="map token-file URL prefixes to a mirror (as data.path_prefixes); repeatable")
    official.add_argument("--world-size", type=int, metavar="W", help="show the data-parallel rank of each row")
    official.add_argument("--tokenizer", metavar="PATH", help="tokenizer.json or dir (default: the config's)")
    official.add_argument("--checkpoint-step", type=int, metavar="N",
                          help="with a preset: read the config of this checkpoint (default: the preset's)")
    official.add_argument("--cache-dir", metavar="DIR", help="the project cache (default $PRETRAIN_EXP_CACHE)")
    official.add_argument("--no-ids", action="store_true", help="print the text only")
    args = ap.parse_args(argv)

    try:
        q = {}
        for a in args.query:
            k, sep, v = a.partition("=")
            if not sep or k not in ("step", "row", "item", "search"):
                raise ConfigError(k or a, f"unknown query {a!r}; use step=K [row=R], item=ID or search=TEXT")
            q[k] = v
        if not RunDir(Path(args.run_dir).expanduser()).config.is_file():
            return _official(args, q)
        if len({"step", "item", "search"} & set(q)) != 1 or ("row" in q and "step" not in q):
            raise ConfigError("query", "give exactly one of step=K [row=R], item=ID, search=TEXT")
        for k in ("step", "row"):
            if k in q and not re.fullmatch(r"\d+", q[k]):
                raise ConfigError(k, f"must be an integer, got {q[k]!r}")
        view = RunView.open(args.run_dir)
        if "step" in q:
            parts = show_step(view, int(q["step"]), int(q["row"]) if "row" in q else None)
        elif "item" in q:
            parts = show_item(view, q["item"])
        else:
            parts = show_search(view, q["search"])
    except PretrainExpError as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    from rich.console import Console

    console = Console(record=args.html is not None, width=max(100, Console().width))
    for p in parts:
        console.print(p)
    if args.html:
        from pretrain_exp.core.io import atomic_path

        with atomic_path(Path(args.html)) as tmp:
            console.save_html(str(tmp))
        print(f"wrote {args.html}")
    return 0


def _official(args, query: Dict[str, str]) -> int:
    """An official run's rows (:func:`pretrain_exp.app.official.run`); the summary goes to stderr."""
    from pretrain_exp.app.official import run
    from pretrain_exp.core.io import default_cache_dir

    if args.html:
        raise ConfigError("--html", "an official run is printed as text or written with --out FILE.jsonl|.parquet")
    if args.world_size is not None and args.world_size < 1:
        raise ConfigError("--world-size", f"must be >= 1, got {args.world_size}")
    res = run(args.run_dir, query, cache_dir=args.cache_dir or default_cache_dir(), prefixes=args.prefix,
              world_size=args.world_size, tokenizer=args.tokenizer, out=args.out,
              checkpoint_step=args.checkpoint_step, ids=not args.no_ids)
    what = f"{res['rows']} rows" + (f", {res['hits']} hit(s)" if res["hits"] is not None else "")
    print(f"{what}: {res['bytes']:,} bytes of tokens fetched in {res['requests']} range request(s), "
          f"{res['seconds']:.2f} s" + (f"; wrote {args.out}" if args.out else ""), file=sys.stderr)
    return 0
