"""Items/s of the insertion-loss and memorization evals against lm-eval's ``HFLM`` on the same items and model.

The items are the plan items of a run (default: the embedded default run, ``make demo``: the fictional
biographies, SmolLM2-135M); the model is the run's initial HF checkpoint, loaded once and handed to both sides.

- ``insertion_loss`` (:func:`pretrain_exp.evals.insertion_loss.insertion_loss`: mean loss of each item's tokens after
  its first) against ``HFLM.loglikelihood`` on ``(decode(item[:1]), decode(item[1:]))``;
- ``memorization`` (:func:`pretrain_exp.evals.memorization.memorization`: greedy continuation of the leading EOS
  and ``prefix_length`` text tokens, ``suffix_length`` tokens, items too short skipped) against
  ``HFLM.generate_until`` on the decoded prompt of the same items with ``max_gen_toks = suffix_length``, greedy
  (``do_sample=False``), no stop string (HFLM adds EOS).

Both sides use the run's ``eval.batch_size`` and one torch thread; each is timed ``--reps`` times, interleaved
(ours, theirs, ours, ...), and the fastest repeat counts, in wall and process CPU seconds (the figure other jobs on a
shared box disturb least). Ratio = our items/s / theirs (goal >= 1.0). lm-eval's requests are text, so the
re-encoded items can differ from the plan's tokens; the token counts of both are printed. Numbers are printed, not
asserted.

On a GPU (``--device cuda``, the default where there is one) both sides get the model in bf16 on the GPU, and the
wall-clock ratio is the figure (the CPU seconds are the host's share).

Usage: ``python benchmarks/eval_throughput.py [--reps 3] [--device cuda] [--json OUT.json] [-- HYDRA OVERRIDES ...]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

import torch


def _best(fn, reps_out: dict, name: str) -> None:
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    reps_out.setdefault(name, []).append((time.perf_counter() - t0, time.process_time() - c0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="where both sides run (default: the GPU where there is one)")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of the run whose items and model are used")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)

    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoModelForCausalLM

    from pretrain_exp.app.experiment import Experiment
    from pretrain_exp.app.prefetch import compose_run_config
    from pretrain_exp.evals.base import EvalContext
    from pretrain_exp.evals.insertion_loss import InsertionLossConf, insertion_loss
    from pretrain_exp.evals.memorization import MemorizationConf, eos_ids, extraction_items, memorization

    with tempfile.TemporaryDirectory() as tmp:
        cfg = compose_run_config(["wandb=disabled", f"run_dir={Path(tmp) / 'run'}", *args.overrides])
        exp = Experiment(cfg)
    plan, tok, bs = exp.plan, exp.tokenizer, cfg.eval.batch_size
    mem_task = cfg.eval.tasks.get("memorization")
    P = mem_task.prefix_length if mem_task is not None else MemorizationConf().prefix_length
    new = mem_task.suffix if mem_task is not None else MemorizationConf().suffix
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    model = AutoModelForCausalLM.from_pretrained(str(exp.model_dir), dtype=dtype).to(args.device).eval()
    ctx = EvalContext(model, tok, plan, exp.held_out, 0, bs, cfg.seed, cfg.cache_dir)
    mem_cfg = MemorizationConf(prefix_length=P, suffix_length=new)
    items = [plan.item_tokens(i).astype(int).tolist() for i in range(plan.num_items)]
    mem_items = [prompt.tolist() for prompt, _ in extraction_items(plan, P, new, eos_ids(ctx))[0].values()]

    lm = HFLM(pretrained=model, tokenizer=tok, batch_size=bs)
    ll_requests = [Instance("loglikelihood", {}, (tok.decode(t[:1]), tok.decode(t[1:])), i)
                   for i, t in enumerate(items)]
    greedy = {"until": [], "max_gen_toks": new, "do_sample": False}
    gen_requests = [Instance("generate_until", {}, (tok.decode(t), dict(greedy)), i)
                    for i, t in enumerate(mem_items)]
    reencoded = sum(len(lm.tok_encode(r.args[0])) + len(lm.tok_encode(r.args[1])) for r in ll_requests)

    generated: dict = {}

    def hflm_generate():
        generated["texts"] = lm.generate_until(gen_requests, disable_tqdm=True)

    sides = {
        "insertion_loss": (lambda: insertion_loss(InsertionLossConf(), ctx),
                           lambda: lm.loglikelihood(ll_requests, disable_tqdm=True), len(items)),
        "memorization": (lambda: memorization(mem_cfg, ctx), hflm_generate, len(mem_items)),
    }
    out = {"model": str(exp.model_dir), "items": len(items), "item_tokens": int(sum(map(len, items))),
           "lm_eval_reencoded_tokens": reencoded, "batch_size": bs, "prefix_length": P, "max_new_tokens": new}
    out["device"] = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"{len(items)} items ({out['item_tokens']} tokens; {reencoded} as lm-eval re-encodes their text), "
          f"model {exp.model_dir.name} ({dtype}), batch size {bs}, {args.threads} torch thread(s), {out['device']}")
    for name, (ours, theirs, n) in sides.items():
        times: dict = {}
        with torch.no_grad():
            for _ in range(args.reps):
                _best(ours, times, "ours")
                _best(theirs, times, "theirs")
        best = {s: tuple(min(t[k] for t in v) for k in (0, 1)) for s, v in times.items()}
        res = out[name] = {"n": n, "ours_wall_s": best["ours"][0], "ours_cpu_s": best["ours"][1],
                           "theirs_wall_s": best["theirs"][0], "theirs_cpu_s": best["theirs"][1],
                           "ratio_wall": best["theirs"][0] / best["ours"][0],
                           "ratio_cpu": best["theirs"][1] / best["ours"][1]}
        what = "HFLM.loglikelihood" if name == "insertion_loss" else "HFLM.generate_until"
        print(f"{name}: {n} items, ours {n / res['ours_cpu_s']:.2f} items/s CPU ({n / res['ours_wall_s']:.2f} wall), "
              f"{what} {n / res['theirs_cpu_s']:.2f} items/s CPU ({n / res['theirs_wall_s']:.2f} wall); ratio "
              f"{res['ratio_cpu']:.2f} CPU, {res['ratio_wall']:.2f} wall (goal >= 1.0)", flush=True)
    # HFLM stops a sequence at EOS (and at the stop strings); ours always decodes the continuation's length
    ours_tokens = new * len(mem_items)
    theirs_tokens = sum(len(tok.encode(x, add_special_tokens=False)) for x in generated["texts"])
    out["memorization"].update(ours_generated_tokens=ours_tokens, theirs_generated_tokens_reencoded=theirs_tokens)
    m = out["memorization"]
    tok_ratio = ours_tokens / m["ours_wall_s"] / (max(theirs_tokens, 1) / m["theirs_wall_s"])
    print(f"memorization: tokens generated: ours {ours_tokens}, HFLM {theirs_tokens} (its outputs re-encoded); "
          f"generated tokens/s ratio {tok_ratio:.2f} wall", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
