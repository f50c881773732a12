"""lm-eval interop: the project's benchmark renderings equal the stock lm-eval tasks of the same name (lm-eval's own
``doc_to_text``/``doc_to_choice``/``doc_to_target`` on the same rows), and stock tasks run on local data."""

from __future__ import annotations

import pytest

from pretrain_exp.core.errors import ConfigError
from pretrain_exp.evals.base import EvalContext
from pretrain_exp.evals.lm_eval import LmEvalConf, lm_eval_tasks, stock_task_config
from pretrain_exp.insertion.types.benchmark import prompt, read_benchmark, stock_task, task_name
from tests.conftest import CACHE_DIR

N_DOCS = 40  #: first rows compared per task


def stock_docs(name: str):
    """lm-eval's task ``name`` built by lm-eval from its stock config (local data) and its first docs."""
    from lm_eval.tasks import TaskManager

    task = TaskManager(include_defaults=False).load([stock_task_config(name, CACHE_DIR)])["tasks"][name]
    docs = list(task.eval_docs)[:N_DOCS]
    return task, docs


@pytest.mark.parametrize("benchmark,fmt", [("arc_easy", "cloze"), ("arc_challenge", "cloze"), ("sciq", "cloze"),
                                           ("piqa", "cloze"), ("mmlu_high_school_biology", "lettered"),
                                           ("mmlu_anatomy", "cloze")])
def test_benchmark_rendering_equals_the_stock_lm_eval_task(benchmark, fmt):
    name = stock_task(benchmark, fmt)
    task, docs = stock_docs(name)
    ours = read_benchmark(benchmark, CACHE_DIR)[:N_DOCS]
    assert len(docs) == len(ours) == N_DOCS
    for k, (doc, mine) in enumerate(zip(docs, ours)):
        context, choices = prompt(mine, fmt)
        assert (task.config.description or "") + task.doc_to_text(doc) == context, (name, k)
        assert list(task.doc_to_choice(doc)) == choices, (name, k)
        assert task.doc_to_target(doc) == mine.gold, (name, k)
        assert task.config.target_delimiter == " "


def test_names_of_renderings_without_a_stock_task_are_the_projects_own():
    assert stock_task("sciq", "lettered") is None and task_name("sciq", "lettered") == "sciq_lettered"
    assert task_name("arc_easy", "lettered") == "arc_easy_lettered"
    assert task_name("mmlu", "lettered") == "mmlu" and task_name("mmlu", "cloze") == "mmlu_continuation"
    sciq = read_benchmark("sciq", CACHE_DIR)[1]  # lettered SciQ keeps the support passage and lm-eval's choice order
    context, letters = prompt(sciq, "lettered")
    assert context.startswith(sciq.support.lstrip() + "\nQuestion: ") and letters[sciq.gold] == "D"


@pytest.mark.slow
def test_stock_tasks_run_on_local_data(tiny_model_dir, one_torch_thread):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).eval()
    ctx = EvalContext(model, AutoTokenizer.from_pretrained(str(tiny_model_dir)), None, None, 0, 8, 0,
                      str(CACHE_DIR))
    # winogrande: a stock config with !function doc_to_text / doc_to_choice helpers
    res = lm_eval_tasks(LmEvalConf(tasks=["winogrande", "mmlu_anatomy"], limit=4), ctx)
    assert [(r["task"], r["split"], r["n_docs"]) for r in res.rows] == [("winogrande", "validation", 4),
                                                                        ("mmlu_anatomy", "test", 4)]
    for r in res.rows:
        assert 0.0 <= r["acc"] <= 1.0 and r["acc"] * 4 == round(r["acc"] * 4)
        assert res.metrics[f"{r['task']}/acc"] == r["acc"]


def test_unknown_or_hub_only_tasks_are_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"eval.tasks.lm_eval.tasks.1.*boolq"):
        LmEvalConf(tasks=["arc_easy", "boolq"]).validate("eval.tasks.lm_eval")
    with pytest.raises(ConfigError, match="eval.tasks.lm_eval.limit"):
        LmEvalConf(limit=0).validate("eval.tasks.lm_eval")
