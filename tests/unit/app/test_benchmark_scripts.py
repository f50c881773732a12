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


@pytest.mark.slow
def test_first_step_benchmark_prints_every_phase_and_the_total(tmp_path, monkeypatch, capsys, tiny_model_dir):
    """The whole-path benchmark at toy sizes: two runs of the real command against its generated remote mix, each
    stopped at its first step, the table of phases and the ratio of the audit on / off."""
    _run(monkeypatch, "first_step.py", "--files", "40", "--instances", "60", "--sequence-length", "128",
         "--global-batch-size", "8", "--steps", "20", "--items", "8", "--latency-ms", "2",
         "--cases", "cold,warm-audit-off", "--keep", str(tmp_path / "work"))
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if line.startswith("| ")]
    phases = {line.split(" | ")[0][2:] for line in table}
    for name in ("startup", "settings", "size index", "permutation", "prefetch", "plan", "audit", "verify",
                 "model build", "engine data loader", "checkpoint load", "first batch", "**total to first step**"):
        assert name in phases, name
    total = next(line for line in table if line.startswith("| **total"))
    cold, off = (float(c.strip(" *")) for c in total.strip("| ").split(" | ")[1:])
    assert 0 < cold and 0 < off
    assert "cached=False" in next(line for line in table if line.startswith("| permutation"))
    res = json.loads((tmp_path / "work" / "results.json").read_text())
    assert set(res) == {"cold", "warm, audit off"}
    assert all(r["events"]["first step"]["step"] == 1 for runs in res.values() for r in runs)


@pytest.mark.slow
def test_batch_view_benchmark_prints_the_viewer_beside_a_bare_read(tmp_path, monkeypatch, capsys):
    """The official-run viewer's benchmark at toy sizes: every case of its table, a step's bytes and requests."""
    _run(monkeypatch, "batch_view.py", "--files", "20", "--instances", "50", "--sequence-length", "128",
         "--global-batch-size", "8", "--local-rows", "20", "--repeat", "1", "--latency-ms", "1", "--keep",
         str(tmp_path / "work"))
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line]
    cases = {line.split(" | ")[0][2:]: line.split(" | ")[1:] for line in table[1:]}
    assert len(cases) == 9
    for name in ("remote step, command, warm", "remote step, in process, warm (fetch only)",
                 "remote step, bare requests + numpy.frombuffer of the same ranges"):
        wall, cpu, nbytes, requests = (c.strip(" |") for c in cases[name])
        assert float(wall) > 0 and nbytes == f"{8 * 128 * 4:,}" and requests == "8"
    assert "local 20 rows, bare numpy.memmap slices of the same rows" in cases
