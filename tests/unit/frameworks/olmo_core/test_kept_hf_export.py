"""The kept HF export of an ``olmo_core`` run (``training.export_hf``) and the run's items as an lm-eval task
directory, both read by stock tools: ``transformers.AutoModelForCausalLM``, ``lm_eval.simple_evaluate(model="hf")``
and ``lm_eval.tasks.TaskManager(include_path=...)``."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from pretrain_exp.app.launch import launch as run
from pretrain_exp.frameworks.olmo_core.checkpoint import OlmoCoreCheckpoint, load_model
from pretrain_exp.report.cli import main as report_main
from tests.conftest import CACHE_DIR, make_config

#: 2 steps of 4 rows x 128 tokens, one segment per step; 8 ARC-Easy questions (4 inserted once, 4 clean) and
#: 4 fictional bios (2 inserted once, 2 controls)
RUN = ["framework=olmo_core", "training=tiny", "training.num_steps=2", "training.checkpoint_interval=1",
       "training.global_batch_size=4", "training.micro_batch_size=2",
       "training.num_threads=1", "data.held_out_rows=8", "insertion=[benchmark,fictional_bios]",
       "insertion.experiments.benchmark.num_items=8", "insertion.experiments.benchmark.repetitions=[0,1]",
       "insertion.experiments.fictional_bios.num_items=4", "insertion.experiments.fictional_bios.repetitions=[0,1]",
       "eval=[perplexity]", "wandb=disabled"]


@pytest.fixture(scope="module")
def olmo_core_run(tmp_path_factory):
    """The run with ``training.export_hf=every``; counts the HF conversions made while it runs."""
    run_dir = tmp_path_factory.mktemp("export") / "run"
    calls = []
    original = OlmoCoreCheckpoint.to_hf

    def counting(self, out_dir):
        calls.append(self.step)
        return original(self, out_dir)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(OlmoCoreCheckpoint, "to_hf", counting)
        run(make_config(*RUN, "training.export_hf=every", run_dir=run_dir))
    return run_dir, calls


@pytest.mark.slow
def test_kept_hf_export_loads_in_transformers_and_reproduces_the_run_logits(olmo_core_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run_dir, calls = olmo_core_run
    assert calls == [1, 2]  # one conversion per segment, shared by the export and every eval of that step
    assert sorted(p.name for p in (run_dir / "hf").iterdir()) == ["step1", "step2"]
    export = run_dir / "hf" / "step2"
    hf = AutoModelForCausalLM.from_pretrained(str(export), dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(str(export))  # the tokenizer files are saved beside the model
    assert tok.eos_token_id == 100257 and hf.config.eos_token_id == 100257
    ours = load_model(run_dir / "checkpoints" / "step2")
    texts = ["To be, or not to be, that is the question: whether 'tis nobler in the mind",
             "Shall I compare thee to a summer's day? Thou art more lovely and more temperate"]
    ids = torch.tensor([(tok(t).input_ids * 8)[:96] for t in texts])  # longer than the 64-token sliding window
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, ours(ids), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_export_hf_none_keeps_nothing(olmo_core_run, tmp_path):
    """(``final``, the default, keeps only the last segment's: the olmo2 CLI test checks it.)"""
    run_dir, _ = olmo_core_run
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    shutil.rmtree(copy / "hf")
    run(make_config(*RUN, "training.export_hf=none", run_dir=copy))  # finished: resumes, no training
    assert not (copy / "hf").exists() and (copy / "results.json").is_file()


@pytest.mark.slow
def test_exported_lm_eval_tasks_score_the_export_with_stock_lm_eval(olmo_core_run, tmp_path, capsys):
    import lm_eval
    from lm_eval.tasks import TaskManager

    run_dir, _ = olmo_core_run
    out = tmp_path / "tasks"
    assert report_main(["export-lm-eval", str(run_dir), str(out), "--prefix", "pe"]) == 0
    assert "pe_benchmark_contaminated: 4 docs" in capsys.readouterr().out
    manager = TaskManager(include_path=str(out), include_defaults=False)
    assert {"pe_benchmark_contaminated", "pe_benchmark_clean", "pe_fictional_bios_inserted",
            "pe_fictional_bios_control", "pe"} <= set(manager.all_tasks)
    res = lm_eval.simple_evaluate(
        model="hf", model_args=f"pretrained={run_dir / 'hf' / 'step2'},dtype=float32", tasks=["pe"],
        task_manager=manager, log_samples=True, bootstrap_iters=0, batch_size=4, device="cpu")
    # stock lm-eval on the export scores each question as the project's benchmark eval does on the same model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pretrain_exp.evals.benchmark import score_multiple_choice
    from pretrain_exp.insertion.types.benchmark import prompt, sample_docs

    export = run_dir / "hf" / "step2"
    docs = sample_docs("arc_easy", num_items=8, seed=0, cache_dir=CACHE_DIR)
    ours = score_multiple_choice(AutoModelForCausalLM.from_pretrained(str(export), dtype=torch.float32).eval(),
                                 AutoTokenizer.from_pretrained(str(export)),
                                 [prompt(d, "cloze") + (d.gold,) for d in docs], batch_size=8)
    items = [json.loads(line) for line in (run_dir / "items.jsonl").read_text().splitlines()]
    by_id = {r["item_id"]: (r, ours[r["index"]]) for r in items if r["experiment"] == "benchmark"}
    assert sum(len(res["samples"][f"pe_benchmark_{s}"]) for s in ("contaminated", "clean")) == 8
    for split in ("contaminated", "clean"):
        for s in res["samples"][f"pe_benchmark_{split}"]:
            item, score = by_id[s["doc"]["item_id"]]
            assert (item["dup_count"] > 0) == (split == "contaminated") and s["doc"]["source"] == item["source"]
            assert s["acc"] == score["acc"] and s["acc_norm"] == score["acc_norm"]
            assert [r[0] for r in s["filtered_resps"]] == pytest.approx(score["loglikelihoods"], abs=1e-3)
    for split in ("inserted", "control"):
        assert res["results"][f"pe_fictional_bios_{split}"]["bits_per_byte,none"] > 0
    assert report_main(["export-lm-eval", str(run_dir), str(out)]) == 2  # never over an existing dir
