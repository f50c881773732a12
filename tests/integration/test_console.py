"""What a run prints, through the real CLI: the project's lines on the console (one per logged training step, no
engine progress bars or loss dicts, no harmless engine warnings), the engines' detail in the run dir's
``pretrain_exp.log``, and with ``-v`` on the console too; for OLMo-core and for resumed HF Trainer segments."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import CACHE_DIR
from tests.integration.test_cli import cli
from tests.terminal import in_terminal

#: a line of the console that only the engines print (model repr, parameter groups, callback order, their own
#: progress bars, the HF Trainer's loss dicts, Python warnings)
ENGINE_NOISE = re.compile(r"Callback order|Transformer\(|Group 0, \d+ parameter|Building AdamW|it/s\]|\{'loss'|"
                          r"Warning:|missing keys|past_key_values|\[transformers\]|transformer_engine")


def _console(proc) -> list:
    """The console's lines, a progress bar's redraws (``\\r``) counted as lines."""
    return [s for s in re.split(r"[\r\n]+", proc.stdout + proc.stderr) if s.strip()]


STEP = re.compile(r"\]\[pretrain_exp\.app\.console\]\[INFO\] - step (\d+)/")  #: a training step's console line


def _step_lines(lines: list) -> list:
    return [int(m.group(1)) for line in lines if (m := STEP.search(line))]


@pytest.mark.slow
def test_olmo_core_console_is_one_line_per_step_and_the_log_file_holds_the_engine(tmp_path):
    """``framework=olmo_core training=tiny insertion=fictional_bios_small`` (12 steps in 3 segments, 3 evals): 769
    console lines on the engines' defaults (OLMo-core's model repr at every HF export, its parameter groups, callback
    order and multi-line metric blocks), 39 here with the order and audit cached, up to 52 with a cache of its own
    (the permutation built, the audit beside training started and collected)."""
    runs = tmp_path / "runs"
    proc = cli("framework=olmo_core", "training=tiny", "insertion=fictional_bios_small", "wandb=disabled",
               "training.num_threads=1", runs=runs)
    lines = _console(proc)
    assert len(lines) <= 52, "\n".join(lines)
    assert not [line for line in lines if ENGINE_NOISE.search(line)], "\n".join(lines)
    assert _step_lines(lines) == list(range(1, 13)), "\n".join(lines)
    for kept in ("plan: 16 items", "verified plan:", "evaluating step 12:", "insertion loss at step 12",
                 "held-out perplexity"):
        assert any(kept in line for line in lines), kept
    assert lines[-1].startswith("run dir: ")
    log = (runs / lines[-1].split("run dir: ")[1].split("/")[-1] / "pretrain_exp.log").read_text()
    for detail in ("Callback order:", "Transformer(", "Group 0, 47 parameter(s)", "[step=12/12",
                   "train/CE loss=", "UserWarning: torch.distributed is disabled", "transformer_engine unavailable",
                   "][pretrain_exp.app.console][INFO] - step 12/12: loss"):
        assert detail in log, detail

    # -v: the engines' detail on the console as well (here: evaluating the initial checkpoint exports it to HF)
    verbose = cli("framework=olmo_core", "training=tiny", "training.num_steps=0", "eval=[perplexity]",
                  "wandb=disabled", "training.num_threads=1", "-v", runs=tmp_path / "runs_v")
    shown = "\n".join(_console(verbose))
    assert "][olmo_core.nn.transformer.config][INFO] - Transformer(" in shown
    assert "torch.distributed is disabled" in shown


@pytest.mark.slow
def test_resumed_hf_segments_print_no_missing_keys_or_engine_output(tmp_path):
    """``experiment=tiny`` in two segments (the second resumes the Trainer from its checkpoint) with the
    memorization eval: no ``missing keys ... ['lm_head.weight']`` (the model ties its embeddings), no
    ``past_key_values`` FutureWarning, no tqdm bars or loss dicts; one line per step. With ``-v`` the Trainer's
    harmless tokenizer warning (in the log file either way) and transformers' progress bars are on the console."""
    args = ["experiment=tiny", "training.num_steps=4", "training.checkpoint_interval=2", "eval=[memorization]",
            "insertion.experiments.fictional_bios.repetitions=[0,1,2,4]", "wandb=disabled", "training.num_threads=1"]
    runs = tmp_path / "runs"
    proc = cli(*args, runs=runs)
    lines = _console(proc)
    assert any("training steps 2 -> 4 (resumed)" in line for line in lines)
    assert not [line for line in lines if ENGINE_NOISE.search(line)], "\n".join(lines)
    assert _step_lines(lines) == [1, 2, 3, 4]
    assert len(lines) <= 25, "\n".join(lines)
    log = (runs / lines[-1].split("run dir: ")[1].split("/")[-1] / "pretrain_exp.log").read_text()
    assert "tokenizer has new PAD/BOS/EOS tokens" in log and "missing keys" not in log

    verbose = _console(cli(*args, "-v", runs=tmp_path / "runs_v"))
    shown = "\n".join(verbose)
    assert "tokenizer has new PAD/BOS/EOS tokens" in shown and "Loading weights" in shown
    assert "missing keys" not in shown and "past_key_values" not in shown
    assert _step_lines(verbose) == [1, 2, 3, 4]


#: what a terminal's console must not show: a logger prefix, a traceback, tqdm bars, git's complaint, a rate over
#: an unmeasurable time
NOT_ON_A_TERMINAL = re.compile(r"^\[\d{4}-\d\d-\d\d |\]\[pretrain_exp\.|Traceback|it/s\]|\d+%\||fatal:| 0\.0 s \(")


@pytest.mark.slow
def test_on_a_terminal_the_console_shows_bare_lines_and_the_log_file_the_full_format(tmp_path):
    """``experiment=tiny`` and the lm-eval path on a pseudo-terminal: the project's lines without the logger's
    prefix (``step 5/12: loss ...``), no engine output; the run's ``pretrain_exp.log`` keeps the full format and
    what lm-eval's ``git describe`` said outside a repository."""
    runs = tmp_path / "runs"
    env = {"PRETRAIN_EXP_RUNS": str(runs), "PRETRAIN_EXP_CACHE": str(CACHE_DIR), "WANDB_SILENT": "true"}
    con = in_terminal(["experiment=tiny", "wandb=disabled", "training.num_threads=1"], env)
    assert con.rc == 0, con.raw[-3000:]
    lines = con.lines
    assert not [line for line in lines if NOT_ON_A_TERMINAL.search(line)], "\n".join(lines)
    steps = [line for line in lines if line.startswith("step ")]
    assert [int(re.match(r"step (\d+)/12: loss \d", s).group(1)) for s in steps] == list(range(1, 13)), steps
    assert all(re.fullmatch(r"step \d+/12: loss [\d.]+, grad norm [\d.]+, lr [\d.e+-]+, [\d,]+ tokens/s", s)
               for s in steps[:5]), steps[:5]
    for kept in ("plan: 16 items", "verified plan:", "evaluating step 12:", "held-out perplexity"):
        assert any(line.startswith(kept) for line in lines), kept
    assert lines[-1].startswith("run dir: ")
    run_dir = Path(lines[-1].split("run dir: ")[1])
    assert "][pretrain_exp.app.console][INFO] - step 12/12: loss" in (run_dir / "pretrain_exp.log").read_text()

    # lm-eval, from a folder outside any git repository: its git complaint and bars go to the log file
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    lm = in_terminal(["experiment=tiny", "training.num_steps=0", "eval=[lm_eval]",
                      "eval.tasks.lm_eval.tasks=[arc_easy]", "eval.tasks.lm_eval.limit=2", "wandb=disabled",
                      "training.num_threads=1"],
                     env | {"GIT_CEILING_DIRECTORIES": str(tmp_path)}, cwd=outside)
    assert lm.rc == 0, lm.raw[-3000:]
    assert not [line for line in lm.lines if NOT_ON_A_TERMINAL.search(line)], "\n".join(lm.lines)
    assert "evaluating step 0: lm_eval" in lm.lines
    lm_dir = Path(lm.lines[-1].split("run dir: ")[1])
    assert "fatal: not a git repository" in (lm_dir / "pretrain_exp.log").read_text()
