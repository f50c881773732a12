"""The release card's pieces that need no run: revision names, local paths replaced, the reproduce command (the
whole bundle of real tiny runs: tests/integration/test_release.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pretrain_exp.report.release import LocalPaths, reproduce_command, revision_name


@pytest.mark.parametrize("step,tokens,name", [
    (4, 4 * 4096, "step4-tokens16K"),  # 16,384 tokens: no decimal from 10 on
    (4, 4 * 1024, "step4-tokens4.1K"),  # one decimal under 10
    (2, 2 * 1024, "step2-tokens2K"),  # no trailing .0
    (77, 77 * 32768, "step77-tokens2.5M"),
    (1, 512, "step1-tokens512"),  # under 1,000: the count
    (1, 999_999, "step1-tokens1M"),  # 1000K rounds into M
    (1, 999_400_000, "step1-tokens999M"),
    (1, 999_600_000, "step1-tokens1B"),
    (2000, 2000 * 2_000_000, "step2000-tokens4B"),
    (20000, 20000 * 4_194_304, "step20000-tokens84B"),  # allenai/OLMo-1B's branch, unchanged
])
def test_revision_names_use_the_largest_unit_that_keeps_the_number_at_least_1(step, tokens, name):
    assert revision_name(step, tokens) == name


def test_revision_names_of_small_runs_differ():
    names = {revision_name(s, s * 8 * 128) for s in range(1, 200)}
    assert len(names) == 199


def test_local_paths_become_placeholders(tmp_path):
    run_dir = tmp_path / "runs" / "r1"
    config = {"run_dir": str(run_dir), "cache_dir": str(tmp_path / "cache"),
              "data": {"token_dir": str(tmp_path / "cache" / "tokens"), "paths": ["/data/corpus/part-0.npy"]},
              "model": {"path": "allenai/OLMo-1B", "url": "https://olmo-checkpoints.org/a/b"},
              "note": "loss in nats/token"}
    paths = LocalPaths(run_dir, config)
    assert paths.data(config) == {
        "run_dir": "<run_dir>", "cache_dir": "<cache_dir>",
        "data": {"token_dir": "<cache_dir>/tokens", "paths": ["<local>/part-0.npy"]},
        "model": {"path": "allenai/OLMo-1B", "url": "https://olmo-checkpoints.org/a/b"}, "note": "loss in nats/token"}
    assert paths.text(f"{run_dir}/items.jsonl:3") == "<run_dir>/items.jsonl:3"
    assert paths.text(f"{Path.home()}/me/items.jsonl:3") == "<local>/items.jsonl:3"
    assert paths.text("x.file=/srv/me/items.jsonl") == "x.file=<local>/items.jsonl"


def test_reproduce_command_reads_the_bundles_inputs_and_drops_machine_overrides():
    run = {"overrides": ["experiment=tiny", "insertion.experiments.t.file=<local>/items.jsonl",
                         "insertion.experiments.t.eos=wrap", "training.num_steps=4", "run_dir=<run_dir>",
                         "data.paths=[a,b]"],
           "inputs": {"t": {"path": "inputs/t.jsonl", "lines": [], "set": {"file": "inputs/t.jsonl", "eos": "none"}}}}
    assert reproduce_command(run, "org/name", "name-dataset") == [
        "hf download org/name --repo-type dataset --local-dir name-dataset",
        "pretrain-exp experiment=tiny training.num_steps=4 'data.paths=[a,b]' "
        "insertion.experiments.t.file=name-dataset/inputs/t.jsonl insertion.experiments.t.eos=none"]
