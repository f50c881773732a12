"""``python -m pretrain_exp.inspect`` on a run dir whose plan is built without training: the demo config's (the
embedded default: SmolLM2, Shakespeare, random biographies) plus two explicit token items in one row, one of them
at offset 0. The tiny run's plan is inspected after training in ``tests/integration/test_cli.py``."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from pretrain_exp.app.experiment import Experiment
from pretrain_exp.app.inspect import RunView, main, search, show_step
from pretrain_exp.app.run_record import save_resolved_config
from tests.conftest import make_config

pytestmark = pytest.mark.slow  # builds a real plan (tokenizer, corpus, verifier): ~25 s on 2 cores

L, B = 128, 8
A = list(range(3001, 3011))  # explicit item 0: training-order row 10 (step 2, row 2), offset 0
A_POS = 10 * L
C = list(range(4001, 4009))  # explicit item 1: the same row, offset 50
C_POS = 10 * L + 50


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("inspect")
    items = d / "probe.jsonl"
    items.write_text("".join(json.dumps({"ids": t, "position": p}) + "\n" for t, p in ((A, A_POS), (C, C_POS))))
    cfg = make_config("insertion=[fictional_bios,tokens]",
                      f"insertion.experiments.tokens.file={items}", "insertion.experiments.tokens.key=ids",
                      "insertion.experiments.tokens.eos=none",
                      "insertion.experiments.tokens.placement.kind=explicit", run_dir=d / "run")
    # builds and saves the plan; nothing is trained. The audit (insertion.audit=on) runs beside training in a
    # process of its own unless the cache holds one of the same rows and items: wait for it, so that the item view
    # does not depend on what the cache held
    Experiment(cfg).finish_audit()
    save_resolved_config(cfg, d / "run")
    return d / "run"


@pytest.fixture(scope="module")
def view(run_dir):
    return RunView.open(run_dir)


def test_a_row_with_two_insertions_one_at_offset_0(view):
    plan = view.plan
    assert plan.experiments == ["fictional_bios", "tokens"]
    ids = {tuple(plan.item_tokens(i).tolist()): i for i in range(plan.num_items)}
    a, c = ids[tuple(A)], ids[tuple(C)]
    q = 10
    row = view.rows.row(q)
    assert row[:10].tolist() == A and row[50:58].tolist() == C  # what the framework trains
    text = show_step(view, step=2, row=2)[0].renderable
    assert text.plain.startswith(f"⟦tokens:0 (item {a}) dup index 0 of 1⟧")
    assert f"⟦tokens:1 (item {c}) dup index 0 of 1⟧" in text.plain
    highlighted = [text.plain[s.start:s.end] for s in text.spans if str(s.style).startswith("black on")]
    assert highlighted[0] == view.decode(A) and view.decode(C) in highlighted
    # every row of the batch, each with its own count of insertions
    panels = show_step(view, step=2)
    assert len(panels) == B
    counts = [int(p.title.split(": ")[1].split()[0]) for p in panels]
    assert counts == [len(range(*plan.spans_in_row((2 - 1) * B + r))) for r in range(B)] and counts[2] >= 2


def test_item_placements_and_search(view, capsys, run_dir):
    plan = view.plan
    bio = int(np.flatnonzero(plan.item_dup_count == 16)[0])
    assert main([str(run_dir), f"item={bio}"]) == 0
    out = capsys.readouterr().out
    spans = plan.span_positions[plan.span_item_ids == bio]
    assert len(spans) == 16 and all(f" {int(p)} │" in out for p in spans)
    assert "no evals in the run dir yet" in out and "effective dup count 16" in out
    # the inserted explicit item is found where the plan put it, and labelled
    hits = search(view, ",".join(map(str, A)))
    assert [(h["step"], h["row"], h["offset"], h["kind"]) for h in hits] == [(2, 2, 0, "inserted")]
    # a natural snippet (base tokens of a row outside every span) is found as natural
    q = next(int(q) for q in range(0, 96) if plan.spans_in_row(q)[0] == plan.spans_in_row(q)[1])
    snippet = view.rows.row(q)[20:28].tolist()
    hits = search(view, str(snippet))
    assert any(h["position"] == q * L + 20 and h["kind"] == "natural" for h in hits)


def test_cli_html_and_errors(run_dir, tmp_path, capsys):
    out = tmp_path / "view.html"
    assert main([str(run_dir), "step=2", "row=2", "--html", str(out)]) == 0
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and "tokens:0" in page
    assert main([str(run_dir), "step=99"]) == 2
    assert "step: step 99 is outside the run's steps [1, 24]" in capsys.readouterr().err  # the demo's 24 steps
    assert main([str(run_dir), "item=nope:3"]) == 2
    assert main([str(tmp_path), "step=1"]) == 2
    assert "not a run dir" in capsys.readouterr().err


def test_a_step_is_read_without_torch_or_transformers(run_dir, view):
    """The inspector reads a run whose corpus is in the cache with ``tokenizers`` alone (``TokenizerFile``): the
    command imports neither torch nor transformers, and prints what the in-process view renders."""
    from rich.console import Console

    code = ("import sys; from pretrain_exp.app.inspect import main; rc = main(sys.argv[1:]); "
            "print('heavy:', sorted(m for m in ('torch', 'transformers', 'datasets') if m in sys.modules)); "
            "sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code, str(run_dir), "step=2", "row=2"], capture_output=True,
                          text=True, env=dict(os.environ, COLUMNS="100"))
    assert proc.returncode == 0, proc.stderr
    assert "heavy: []" in proc.stdout
    console = Console(width=100, record=True, file=io.StringIO())
    console.print(*show_step(view, step=2, row=2))
    assert console.export_text().strip() in proc.stdout


def test_the_viewer_benchmark_times_a_step_of_the_run_beside_a_bare_read(run_dir):
    """``benchmarks/batch_view.py --run-dir``: the command, the in-process view and a bare ``numpy.memmap`` read of
    the same rows (checked equal to the order's rows inside the script), 8 rows of 128 uint16 tokens."""
    import runpy

    from tests.conftest import ROOT

    bench = runpy.run_path(str(ROOT / "benchmarks" / "batch_view.py"))
    rows = bench["run_dir_rows"](run_dir, 2, 1)
    assert [r[0].split(",")[:2] for r in rows] == [["run dir", " step 2 (8 rows of 128)"], ["run dir", " step 2"],
                                                   ["run dir", " step 2"]]
    assert all(r[1] > 0 and r[2] > 0 for r in rows[:2]) and rows[0][3] == rows[2][3] == 8 * 128 * 2


def test_search_text_on_the_command_line(view, run_dir, capsys):
    """``search=TEXT``: a text of an inserted item, encoded by the run's tokenizer, is found at each of the item's
    16 copies, every hit marked inserted with the item's label; the ids searched are printed."""
    plan, tok = view.plan, view.tokenizer
    bio = int(np.flatnonzero(plan.item_dup_count == 16)[0])
    tokens = plan.item_tokens(bio).tolist()
    start = next(k for k, t in enumerate(tokens) if t not in tok.all_special_ids) + 2
    ids = tokens[start:start + 8]
    text = tok.decode(ids)
    assert tok(text, add_special_tokens=False)["input_ids"] == ids  # the text encodes to the item's own tokens
    assert main([str(run_dir), f"search={text}"]) == 0
    out = capsys.readouterr().out
    assert f"token ids searched: {ids}" in out
    assert "16 occurrence(s)" in out
    rows = [line for line in out.splitlines() if line.count("│") >= 6]
    hits = sorted(int(line.split("│")[4]) for line in rows)
    assert hits == sorted(int(p) + start for p in plan.span_positions[plan.span_item_ids == bio])
    assert all("inserted" in line and view.label(bio) in line and "partly" not in line for line in rows)
