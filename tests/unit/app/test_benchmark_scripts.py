"""The step-overhead and eval-throughput benchmarks run end to end at tiny sizes and report positive times."""

from __future__ import annotations

import json
import math
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


def test_step_overhead_hf_reports_step_times_and_ratios(tmp_path, monkeypatch, capsys, tiny_model_dir,
                                                        restore_threads):
    out = tmp_path / "out.json"
    _run(monkeypatch, "step_overhead.py", "--only", "hf", "--short", "1", "--long", "2", "--reps", "1",
         "--json", str(out))
    res = json.loads(out.read_text())["hf"]
    assert res["rows"] == 2 * res["global_batch_size"] and res["insertions"] >= 1
    for key in ("ours_cpu_step_s", "theirs_cpu_step_s", "ours_wall_step_s", "theirs_wall_step_s"):
        assert math.isfinite(res[key]), key
    assert len(res["times_s"]["wall"]["ours"]["2"]) == 1
    assert "hf: per step, ours" in capsys.readouterr().out


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
