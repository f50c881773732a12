"""The eval-throughput benchmark runs end to end at tiny sizes and reports positive times."""

from __future__ import annotations

import json
import runpy
import sys

import pytest

from tests.conftest import ROOT


def _run(monkeypatch, script: str, *argv: str) -> None:
    monkeypatch.setattr(sys, "argv", [script, *argv])
    runpy.run_path(str(ROOT / "benchmarks" / script), run_name="__main__")


@pytest.fixture
def restore_threads():
    import torch

    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.mark.slow
def test_eval_throughput_reports_items_per_second(tmp_path, monkeypatch, capsys, tiny_model_dir, restore_threads):
    out = tmp_path / "out.json"
    _run(monkeypatch, "eval_throughput.py", "--reps", "1", "--json", str(out), "experiment=tiny",
         "eval.tasks.memorization.max_new_tokens=4")
    res = json.loads(out.read_text())
    assert res["items"] > 0 and res["max_new_tokens"] == 4
    for name in ("insertion_loss", "memorization"):
        assert res[name]["n"] > 0
        assert res[name]["ours_cpu_s"] > 0 and res[name]["theirs_cpu_s"] > 0
    text = capsys.readouterr().out
    assert "insertion_loss:" in text and "memorization:" in text
