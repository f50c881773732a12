"""Items/s of the insertion-loss and memorization evals against lm-eval's ``HFLM`` on the same items and model.

The items are the plan items of a run (default: the embedded default run, ``make demo``: the fictional
biographies, SmolLM2-135M); the model is the run's initial HF checkpoint, loaded once and handed to both sides.

- ``insertion_loss`` (:func:`pretrain_exp.evals.insertion_loss.insertion_loss`: mean loss of each item's tokens after
  its first) against ``HFLM.loglikelihood`` on ``(decode(item[:1]), decode(item[1:]))``;
- ``memorization`` (:func:`pretrain_exp.evals.memorization.memorization`: greedy continuation of the leading EOS
  and ``prefix_length`` text tokens, ``suffix_length`` tokens, items too short skipped) against
  ``HFLM.generate_until`` on the decoded prompt of the same items with ``max_gen_toks = suffix_length``, greedy
  (``do_sample=False``), no stop string (HFLM adds EOS). The timed call is the eval itself, so it runs the eval's
  decoding path (on a GPU: a static KV cache and the decode step replayed as a CUDA graph, captured anew in every
  timed call); it is timed also without the eval's scores and tests ("decoding only":
  :func:`~pretrain_exp.evals.memorization.greedy_continuations`), and the path is printed. Untimed, the eval's
  continuations are checked against HFLM's texts (ours cut at the first EOS and decoded as HFLM decodes) and
  against the plain ``DynamicCache`` loop at ``eval.batch_size`` (the eval's earlier decoding); the counts of
  identical items are printed.

Both sides use the run's ``eval.batch_size`` and one torch thread; each is timed ``--reps`` times, interleaved
(ours, theirs, ours, ...), and the fastest repeat counts, in wall and process CPU seconds (the figure other jobs on
a shared box disturb least); the first repeat's wall seconds are printed too. Ratio = our items/s / theirs (goal
>= 1.0; for ``memorization`` on a GPU >= 1.2). lm-eval's requests are text, so the re-encoded items can differ from
the plan's tokens; the token counts of both are printed. Numbers are printed, not asserted.

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

import numpy as np
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
    from pretrain_exp.evals.memorization import (
        MemorizationConf,
        eos_ids,
        extraction_items,
        greedy_continuations,
        memorization,
    )
    from pretrain_exp.evals.scoring import GreedyDecoder

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
    extraction = extraction_items(plan, P, new, eos_ids(ctx))[0]
    mem_items = [prompt.tolist() for prompt, _ in extraction.values()]

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

    # eval -> (our sides: label -> call, HFLM's call, items); the sides of an eval are timed interleaved
    sides = {
        "insertion_loss": ({"ours": lambda: insertion_loss(InsertionLossConf(), ctx)},
                           lambda: lm.loglikelihood(ll_requests, disable_tqdm=True), len(items)),
        "memorization": ({"ours": lambda: memorization(mem_cfg, ctx),  # the whole eval: decoding, scores, tests
                          "ours_decoding": lambda: greedy_continuations(ctx, extraction, new)},
                         hflm_generate, len(mem_items)),
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
                for label, fn in ours.items():
                    _best(fn, times, label)
                _best(theirs, times, "theirs")
        best = {s: tuple(min(t[k] for t in v) for k in (0, 1)) for s, v in times.items()}
        res = out[name] = {"n": n, "theirs_wall_s": best["theirs"][0], "theirs_cpu_s": best["theirs"][1],
                           "theirs_reps_wall_s": [t[0] for t in times["theirs"]]}
        what = "HFLM.loglikelihood" if name == "insertion_loss" else "HFLM.generate_until"
        goal = 1.2 if name == "memorization" and args.device.startswith("cuda") else 1.0
        for label in ours:
            res.update({f"{label}_wall_s": best[label][0], f"{label}_cpu_s": best[label][1],
                        f"{label}_reps_wall_s": [t[0] for t in times[label]],
                        f"ratio_wall{label[4:]}": best["theirs"][0] / best[label][0],
                        f"ratio_cpu{label[4:]}": best["theirs"][1] / best[label][1]})
            print(f"{name}{' (decoding only)' if label != 'ours' else ''}: {n} items, ours "
                  f"{n / best[label][1]:.2f} items/s CPU ({n / best[label][0]:.2f} wall), {what} "
                  f"{n / res['theirs_cpu_s']:.2f} items/s CPU ({n / res['theirs_wall_s']:.2f} wall); ratio "
                  f"{res[f'ratio_cpu{label[4:]}']:.2f} CPU, {res[f'ratio_wall{label[4:]}']:.2f} wall (goal >= {goal}); "
                  f"first repeat {times[label][0][0]:.3f} s ours, {times['theirs'][0][0]:.3f} s theirs", flush=True)
    # HFLM stops a sequence at EOS (and at the stop strings); ours always decodes the continuation's length
    ours_tokens = new * len(mem_items)
    theirs_tokens = sum(len(tok.encode(x, add_special_tokens=False)) for x in generated["texts"])
    out["memorization"].update(ours_generated_tokens=ours_tokens, theirs_generated_tokens_reencoded=theirs_tokens)
    m = out["memorization"]
    tok_ratio = ours_tokens / m["ours_wall_s"] / (max(theirs_tokens, 1) / m["theirs_wall_s"])
    print(f"memorization: tokens generated: ours {ours_tokens}, HFLM {theirs_tokens} (its outputs re-encoded); "
          f"generated tokens/s ratio {tok_ratio:.2f} wall", flush=True)
    # the eval's greedy ids against HFLM's texts and against the plain DynamicCache loop at eval.batch_size
    with torch.no_grad():
        decoder = GreedyDecoder(model, new)  # the eval's decoder, kept to read its path
        ours_ids = greedy_continuations(ctx, extraction, new, decoder)
        plain_ids = greedy_continuations(ctx, extraction, new, GreedyDecoder(model, new, static=False))
    eos = set(eos_ids(ctx))
    stop = lm.tok_decode(lm.eot_token_id, skip_special_tokens=False)

    def as_hflm_text(ids) -> str:  # cut at the first EOS (HF generate stops there), decoded and split as HFLM does
        ids = [int(t) for t in ids]
        cut = next((j for j, t in enumerate(ids) if t in eos), len(ids))
        return lm.tok_decode(ids[:cut]).split(stop)[0] if stop else lm.tok_decode(ids[:cut])

    same_hflm = sum(as_hflm_text(ours_ids[i]) == text for i, text in zip(extraction, generated["texts"]))
    same_plain = sum(np.array_equal(ours_ids[i], plain_ids[i]) for i in extraction)
    path = (f"static cache, CUDA graphs of shapes {decoder.graphed_shapes} (rows, prompt)" if decoder.graphed_shapes
            else "static cache, eager" if decoder.static else "DynamicCache loop")
    m.update(identical_to_hflm=same_hflm, identical_to_plain_loop=same_plain, decode_path=path)
    print(f"memorization: decode path: {path}; "
          f"greedy continuations identical to HFLM.generate_until's: {same_hflm}/{len(mem_items)} items; "
          f"to the plain DynamicCache loop at eval.batch_size: {same_plain}/{len(mem_items)} items", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
