"""The console shows the project's lines and the engines' real warnings; the run's log file gets everything."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path

import pytest

from pretrain_exp.core.logs import HARMLESS, ConsoleFilter, phase_progress, run_logging


def _emit_a_run_s_records():
    """Records as a run makes them: the project's, OLMo-core's INFO detail, an engine warning, transformers' own
    logger (which prints through a handler of its own unless routed), a harmless and a real Python warning."""
    from transformers.utils import logging as hf_logging

    logging.getLogger("pretrain_exp.app.experiment").info("plan: 16 items, 84 insertions")
    logging.getLogger("pretrain_exp.app.cli").debug("failed (traceback)")
    logging.getLogger("olmo_core.train.trainer").info("Callback order:\n  - Callback 1: checkpointer")
    logging.getLogger("olmo_core.optim.config").info("Group 0, 47 parameter(s):")
    logging.getLogger("olmo_core.nn.attention.te_attn_api").warning("transformer_engine unavailable, disabling TE")
    hf_logging.get_logger("transformers.trainer").warning(
        "There were missing keys in the checkpoint model loaded: ['model.norm.weight'].")
    warnings.warn("torch.distributed is disabled, unavailable or uninitialized, assuming the intent is to load in a "
                  "single process.", UserWarning)
    warnings.warn("a warning that matters", UserWarning)


FILE_ONLY = ("Callback order:", "Group 0, 47 parameter(s)", "transformer_engine unavailable",
             "torch.distributed is disabled", "failed (traceback)")
CONSOLE = ("plan: 16 items", "missing keys in the checkpoint model loaded: ['model.norm.weight']",
           "a warning that matters")


def test_console_shows_what_matters_and_the_log_file_everything(tmp_path, capsys):
    log = tmp_path / "run" / "pretrain_exp.log"
    root = logging.getLogger()
    before, showwarning = root.handlers[:], warnings.showwarning
    with run_logging(log):
        _emit_a_run_s_records()
    out = capsys.readouterr()
    for text in CONSOLE:
        assert text in out.out, text
    for text in FILE_ONLY:
        assert text not in out.out + out.err, text
    assert "[transformers]" not in out.err  # transformers' own handler no longer prints
    kept = log.read_text()
    for text in CONSOLE + FILE_ONLY:
        assert text in kept, text
    assert "][olmo_core.train.trainer][INFO] - Callback order:" in kept  # Hydra's format
    assert root.handlers == before  # a sweep's next job starts from the handlers it had
    assert warnings.showwarning is showwarning  # Python warnings are no longer captured


def test_verbose_console_shows_everything_the_file_gets(tmp_path, capsys):
    log = tmp_path / "pretrain_exp.log"
    with run_logging(log, verbose=True):
        _emit_a_run_s_records()
    out = capsys.readouterr().out
    for text in CONSOLE + FILE_ONLY:
        assert text in out, text
    assert out.count("Callback order:") == log.read_text().count("Callback order:") == 1


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full (every write to it: ENOSPC)")
def test_a_log_file_that_cannot_be_written_is_one_warning_and_leaves_the_exit_status(capsys):
    """A full disk under the run's log (``/dev/full``: every write fails with ENOSPC): one ``warning:`` line on
    stderr, no traceback per record, the console keeps its lines, and leaving the block raises nothing over the
    run's own exit status."""
    with pytest.raises(SystemExit) as exit_:
        with run_logging(Path("/dev/full")):
            for _ in range(30):
                _emit_a_run_s_records()
            sys.exit(2)
    assert exit_.value.code == 2
    out = capsys.readouterr()
    assert "Traceback" not in out.err and "Logging error" not in out.err, out.err[:3000]
    [warning] = [line for line in out.err.splitlines() if line.startswith("warning:")]
    assert warning.startswith("warning: the run's log /dev/full cannot be written (OSError: [Errno 28] No space "
                              "left on device)"), warning
    assert out.out.count("plan: 16 items") == 30


def test_a_record_that_cannot_be_formatted_is_still_reported_as_logging_does(tmp_path, capsys):
    with run_logging(tmp_path / "pretrain_exp.log"):
        logging.getLogger("pretrain_exp.app.experiment").info("%d items", "not a number")
        logging.getLogger("pretrain_exp.app.experiment").info("the next record")
    assert "--- Logging error ---" in capsys.readouterr().err
    assert "the next record" in (tmp_path / "pretrain_exp.log").read_text()  # the file still takes records


def test_other_ranks_print_warnings_only(capsys):
    with run_logging(None, console_level=logging.WARNING):
        logging.getLogger("pretrain_exp.app.experiment").info("plan: 16 items")
        logging.getLogger("pretrain_exp.app.experiment").warning("audit: control 3 occurs in the window")
    out = capsys.readouterr().out
    assert "plan: 16 items" not in out and "audit: control 3" in out


def test_console_filter_by_logger_and_level():
    f = ConsoleFilter()

    def rec(name, level, msg="m"):
        return logging.LogRecord(name, level, __file__, 1, msg, None, None)

    assert f.filter(rec("pretrain_exp.app.console", logging.INFO))
    assert f.filter(rec("hydra", logging.INFO))  # a sweep's "#1 : seed=1" launch lines
    assert not f.filter(rec("pretrain_exp.app.console", logging.DEBUG))
    assert not f.filter(rec("olmo_core.train.trainer", logging.INFO))
    assert f.filter(rec("olmo_core.train.trainer", logging.WARNING))
    assert not f.filter(rec("pretrain_exp_other", logging.INFO))  # a name prefix is not a child logger
    assert ConsoleFilter(verbose=True).filter(rec("olmo_core.train.trainer", logging.DEBUG))
    samples = {  # as the engines word them
        "py.warnings": "/x/torch/distributed/checkpoint/utils.py:485: UserWarning: torch.distributed is disabled, "
                       "unavailable or uninitialized, assuming the intent is to save in a single process.",
        "olmo_core.nn.attention.te_attn_api": "transformer_engine unavailable, disabling TE attention: No module "
                                              "named 'transformer_engine'",
        "transformers.trainer_utils": "The tokenizer has new PAD/BOS/EOS tokens that differ from the model config "
                                      "and generation config. The model config and generation config were aligned",
        "lm_eval.models.huggingface": "`pretrained` model kwarg is not of type `str`. Many other model arguments "
                                      "may be ignored.",
        "lm_eval.evaluator": "Overwriting default num_fewshot of arc_easy from None to 0",
    }
    assert len(samples) == len(HARMLESS) and all(h.why for h in HARMLESS)
    for name, msg in samples.items():
        assert not f.filter(rec(name, logging.WARNING, msg)), name
        assert f.filter(rec("pretrain_exp.app.experiment", logging.WARNING, msg)), name  # under its logger only


@pytest.mark.parametrize("enabled", [None, False])
def test_a_phase_off_a_terminal_prints_nothing(capsys, enabled):
    """No bar and no stray blank line when stdout is not a terminal (rich's own bar prints one when it stops)."""
    done = []
    with phase_progress("training steps 0 -> 4", 4, enabled=enabled) as progress:
        for k in range(1, 5):
            progress(k)
            done.append(k)
    assert done == [1, 2, 3, 4]
    assert capsys.readouterr().out == ""


# --- the console on a terminal ----------------------------------------------------------------------------------


def test_a_terminal_console_shows_bare_lines_and_the_log_file_the_full_format(tmp_path, capsys, monkeypatch):
    """On a terminal (here: ``PRETRAIN_EXP_CONSOLE=plain``, as a launching process hands it to its ranks) the
    console's lines carry no logger prefix; warnings and errors say so, naming a library's; an exception shows its
    last line only. The log file keeps Hydra's format; ``verbose`` shows it on the console too."""
    from pretrain_exp.core.logs import CONSOLE_ENV, FILE_ONLY

    monkeypatch.setenv(CONSOLE_ENV, "plain")
    log = tmp_path / "pretrain_exp.log"
    with run_logging(log):
        logging.getLogger("pretrain_exp.app.console").info("step 5/12: loss 10.35, grad norm 0.807")
        logging.getLogger("pretrain_exp.app.audit_hook").warning("audit: control bios[3] in the window")
        logging.getLogger("lm_eval.api.task").warning("a doc without an answer")
        logging.getLogger("pretrain_exp.app.cli").info("interrupted (SIGINT)", extra=FILE_ONLY)
        try:
            raise ValueError("bad row\nsecond line")
        except ValueError:
            logging.getLogger("pretrain_exp.app.experiment").exception("error: training failed")
    out = capsys.readouterr().out.splitlines()
    assert out == ["step 5/12: loss 10.35, grad norm 0.807", "warning: audit: control bios[3] in the window",
                   "warning (lm_eval): a doc without an answer", "error: training failed (ValueError: bad row second "
                   "line)"]
    kept = log.read_text()
    assert "][pretrain_exp.app.console][INFO] - step 5/12: loss 10.35" in kept
    assert "][pretrain_exp.app.cli][INFO] - interrupted (SIGINT)" in kept and "Traceback" in kept

    with run_logging(tmp_path / "v.log", verbose=True):
        logging.getLogger("pretrain_exp.app.console").info("step 6/12: loss 10.2")
    assert "][pretrain_exp.app.console][INFO] - step 6/12: loss 10.2" in capsys.readouterr().out
    monkeypatch.setenv(CONSOLE_ENV, "full")  # a pipe, a SLURM job's output file: the full format
    with run_logging(None):
        logging.getLogger("pretrain_exp.app.console").info("step 7/12: loss 10.1")
    assert "][pretrain_exp.app.console][INFO] - step 7/12: loss 10.1" in capsys.readouterr().out


def test_what_engines_print_to_stderr_goes_to_the_log_file_unless_verbose(tmp_path, capfd):
    """lm-eval runs ``git describe`` (which says ``fatal: not a git repository`` outside one) and draws tqdm bars
    on ``sys.stderr``: inside :func:`engine_output_to_log` they reach the log file, not the console; with
    ``verbose`` the console; outside a run nothing changes."""
    import subprocess

    from pretrain_exp.core.logs import engine_output_to_log

    log = tmp_path / "run" / "pretrain_exp.log"
    outside = tmp_path / "not_a_repo"
    outside.mkdir()
    env = os.environ | {"GIT_CEILING_DIRECTORIES": str(tmp_path)}
    with run_logging(log):
        with engine_output_to_log():
            subprocess.run(["git", "describe", "--always"], cwd=outside, env=env, stdout=subprocess.DEVNULL)
            print("building contexts: 100%|##########| 3/3 [00:00<00:00, 71089.90it/s]", file=sys.stderr)  # tqdm's
    shown = capfd.readouterr()
    assert "fatal" not in shown.err + shown.out and "building contexts" not in shown.err + shown.out
    kept = log.read_text()
    assert "fatal: not a git repository" in kept and "building contexts" in kept
    with run_logging(tmp_path / "v.log", verbose=True):
        with engine_output_to_log():
            subprocess.run(["git", "describe", "--always"], cwd=outside, env=env, stdout=subprocess.DEVNULL)
    assert "fatal: not a git repository" in capfd.readouterr().err


def test_a_rate_is_printed_only_over_a_measurable_time():
    from pretrain_exp.core.logs import rate

    assert rate(787, 0.0, "tokens") == "" and rate(1.43e13, 0.04, "tokens", "{:.2e}") == ""
    assert rate(13312, 0.1, "tokens") == " (133,120 tokens/s)"
    assert rate(5.0, 2.0, "MB", "{:.1f}") == " (2.5 MB/s)"
