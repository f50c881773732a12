"""``eval.mode=distributed``'s primitive (:mod:`pretrain_exp.evals.shard`): every eval that scores through the model
gives, sharded over 2 gloo ranks, exactly the result of one process."""

from __future__ import annotations

import faulthandler
import json
import os
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

from pretrain_exp.evals.base import EvalContext
from pretrain_exp.evals.gaussian import GaussianConf
from pretrain_exp.evals.insertion_loss import InsertionLossConf
from pretrain_exp.evals.knowledge import KnowledgeConf
from pretrain_exp.evals.lm_eval import LmEvalConf
from pretrain_exp.evals.memorization import MemorizationConf
from pretrain_exp.evals.mia import MiaConf
from pretrain_exp.evals.perplexity import PerplexityConf
from pretrain_exp.evals.registry import run_eval
from pretrain_exp.evals.shard import map_batches, sharded
from pretrain_exp.insertion.schema import InsertionConf
from tests.conftest import CACHE_DIR, make_plan, random_item

TASKS = {"insertion_loss": InsertionLossConf(), "memorization": MemorizationConf(prefix_length=4, max_new_tokens=6),
         "perplexity": PerplexityConf(), "mia": MiaConf(), "knowledge": KnowledgeConf(),
         "gaussian": GaussianConf(max_rows_per_item=2, permutations=50),
         # lm-eval's data-parallel path: 7 ARC-Easy docs (4 on rank 0, 3 + lm-eval's padding on rank 1)
         "lm_eval": LmEvalConf(tasks=["arc_easy"], limit=7)}
#: multiple-choice questions for the benchmark eval's scorer (``score_multiple_choice``), 5: an odd split
QUESTIONS = [(f"Question {k}: which word comes {k} after the start?",
              ["one", "two three", "four", "five six"][: 2 + k % 3], k % 2) for k in range(5)]


def _contexts(model_dir: str) -> dict:
    """task -> the EvalContext it runs on: the tiny_llama asset, batch size 3, batch counts of 2 to 6 (odd ones
    too, so the ranks' shares differ), items of varied lengths (varied padding)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.unit.insertion.types.test_gaussian import _noise_plan
    from tests.unit.insertion.types.test_knowledge import kexp, plan_of

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rng = np.random.default_rng(0)
    items = [(random_item(rng, int(n)), d, 0) for n, d in zip(rng.integers(8, 30, 13), [0, 1, 2, 4] * 4)]
    plan = make_plan(items)
    held_out = rng.integers(3, 128, size=(7, 24))
    data = rng.integers(3, 128, size=(16, 16))
    noise = _noise_plan([2, 2, 2, 0, 0, 0], [[0, 5], [3, 9], [7, 12], [], [], []], 0.05, 16, 16)
    facts = {"facts": kexp(num_items=8, repetitions=[0, 4])}
    kplan, _ = plan_of(facts, tokenizer, steps=16)

    def ctx(p, **kw):
        return EvalContext(model, tokenizer, p, kw.pop("held_out", np.empty((0, 24), np.int64)), 1, 3, 7, **kw)

    return {"insertion_loss": ctx(plan), "memorization": ctx(plan), "mia": ctx(plan),
            "perplexity": ctx(plan, held_out=held_out),
            "knowledge": ctx(kplan, insertion=InsertionConf(seed=0, experiments=facts)),
            "gaussian": ctx(noise, row_tokens=lambda q: data[q]), "lm_eval": ctx(None, cache_dir=str(CACHE_DIR))}


def _run_all(model_dir: str) -> dict:
    """task -> ``{"result": EvalResult as JSON text, "forwards": model forward calls of this process}``."""
    out = {}
    for name, ctx in _contexts(model_dir).items():
        calls = []
        handle = ctx.model.register_forward_hook(lambda *a: calls.append(1))
        res = run_eval(TASKS[name], ctx)
        handle.remove()
        out[name] = {"result": json.dumps(asdict(res)), "forwards": len(calls)}
    from pretrain_exp.evals.benchmark import score_multiple_choice

    ctx = _contexts(model_dir)["insertion_loss"]
    out["multiple_choice"] = {"result": json.dumps(score_multiple_choice(ctx.model, ctx.tokenizer, QUESTIONS, 3)),
                              "forwards": 0}
    return out


def _worker(rank: int, world: int, model_dir: str, out: str) -> None:
    # this rank's stderr goes to rank<r>.log, with Python's stacks on a fatal signal, so a rank that dies on a signal
    # (SIGABRT from a C++ terminate, SIGSEGV) leaves what it printed for the test's failure message
    log = open(Path(out, f"rank{rank}.log"), "w")
    os.dup2(log.fileno(), 2)
    faulthandler.enable(file=log, all_threads=True)
    torch.set_num_threads(1)
    # a FileStore rendezvous: no port to pick (another test could take a freed one) and no store server thread in
    # rank 0 to outlive its peer at exit
    torch.distributed.init_process_group("gloo", init_method=f"file://{Path(out, 'store')}", rank=rank,
                                         world_size=world)
    try:
        with sharded() as on:
            assert on
            res = _run_all(model_dir)
            try:  # a batch failing on rank 1 only: every rank raises, none waits in the gather
                map_batches(lambda b: 1 // (b - 1), [0, 1, 2, 3])
            except (ZeroDivisionError, RuntimeError) as e:
                res["error"] = f"{type(e).__name__}: {e}"
        Path(out, f"rank{rank}.json").write_text(json.dumps(res))
        torch.distributed.barrier()  # no rank closes its connections while the other is still inside a collective
    finally:
        torch.distributed.destroy_process_group()
    # the results are written: leave without the interpreter's teardown, where a C++ thread still joinable in rank 0
    # has aborted the process after its work ("terminate called without an active exception", no Python frame)
    log.flush()
    os._exit(0)


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else "(none)"


def test_map_batches_is_a_plain_loop_without_a_process_group():
    seen = []
    with sharded() as on:
        assert not on
        assert map_batches(lambda b: seen.append(b) or b * 2, range(5)) == [0, 2, 4, 6, 8]
    assert seen == [0, 1, 2, 3, 4]


@pytest.mark.slow
def test_two_gloo_ranks_give_exactly_the_numbers_of_one_process(tmp_path, tiny_model_dir):
    """insertion_loss, memorization, perplexity, mia, knowledge, gaussian and the lm-eval-scored lm_eval and
    benchmark scorer, sharded over 2 spawned gloo ranks, return metrics, per_dup and rows identical (as JSON text:
    every float to the last digit) to one process, and each rank ran a strict share of the forwards. Both sides use
    1 torch thread: CPU matmuls may reduce in a thread-count-dependent order, so only equal thread settings make the
    comparison fair."""
    try:
        torch.multiprocessing.spawn(_worker, args=(2, str(tiny_model_dir), str(tmp_path)), nprocs=2)
    except torch.multiprocessing.ProcessExitedException as e:
        tails = "".join(f"\n--- rank {r} (result written: {(tmp_path / f'rank{r}.json').exists()}), last lines of "
                        f"stderr:\n" + "\n".join(_read(tmp_path / f"rank{r}.log").splitlines()[-40:]) for r in (0, 1))
        pytest.fail(f"{e}{tails}")
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        inline = _run_all(str(tiny_model_dir))
    finally:
        torch.set_num_threads(old)
    for name, ref in inline.items():
        assert json.loads(ref["result"]), name  # each eval scored something
        for r in ranks:
            assert r[name]["result"] == ref["result"], name
        shares = [r[name]["forwards"] for r in ranks]
        if name == "lm_eval":  # each rank scored its docs (+ lm-eval's padding to equal request counts)
            assert 0 < max(shares) < ref["forwards"], (shares, ref["forwards"])
        elif name != "multiple_choice":
            assert sum(shares) == ref["forwards"] and min(shares) > 0, (name, shares, ref["forwards"])
    assert ranks[1]["error"] == "ZeroDivisionError: integer division or modulo by zero"
    assert ranks[0]["error"].startswith("RuntimeError: map_batches: a batch failed on another rank (rank 1: ")
