"""The entry point in process: a failed fresh run leaves no run dir; a failed re-run keeps the existing one; the
engines' detail goes to the run's log file, and with -v to the console too."""

from __future__ import annotations

from pathlib import Path

import pytest

from pretrain_exp.app.run_record import save_resolved_config
from pretrain_exp.core.errors import ConfigError, InsertionError
from pretrain_exp.core.rundir import RunDir
from tests.conftest import make_config, run_entry_point


def test_fresh_run_failing_after_planning_is_removed(monkeypatch, tmp_path, capsys):
    """A failure after ``plan.npz`` was written leaves no run dir behind, so a corrected re-run in the same
    dir does not meet a stale plan; the message is one line even if the error's text is not."""
    def fake_run(cfg):
        run_dir = Path(cfg.run_dir)
        (run_dir / "config.resolved.yaml").write_text("x: 1\n")
        for name in ("plan.npz", "manifest.jsonl", "items.jsonl"):
            (run_dir / name).write_bytes(b"")
        raise InsertionError("first line\n  second line\n")

    argv = ["experiment=tiny", f"hydra.run.dir={tmp_path / 'runs' / 'r'}"]
    code = run_entry_point(monkeypatch, tmp_path, argv, fake_run)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert err[-1] == "error: first line | second line"
    assert not (tmp_path / "runs" / "r").exists()


def test_failed_rerun_keeps_existing_run_dir(monkeypatch, tmp_path, capsys):
    run_dir = tmp_path / "runs" / "r"
    run_dir.mkdir(parents=True)
    save_resolved_config(make_config("experiment=tiny", run_dir=run_dir), run_dir)  # a run that started before
    (run_dir / "plan.npz").write_bytes(b"")

    def fake_run(cfg):
        raise ConfigError("insertion", "holds the plan of a different config")

    code = run_entry_point(monkeypatch, tmp_path, ["experiment=tiny", f"hydra.run.dir={run_dir}"], fake_run)
    assert code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: insertion: holds the plan")
    assert (run_dir / "plan.npz").is_file() and (run_dir / "config.resolved.yaml").is_file()


def test_the_hydra_files_are_recorded_with_the_run_and_kept_by_a_failed_sweep_job(monkeypatch, tmp_path, capsys):
    """A run writes ``.hydra/`` when it records itself (beside ``config.resolved.yaml``); a job of a sweep that
    fails before that (a config error) keeps its dir with its ``.hydra/``, so the sweep report lists it."""
    import yaml

    from pretrain_exp.report.jobs import find_job_dirs, load_job

    run_dir = tmp_path / "runs" / "r"
    run_entry_point(monkeypatch, tmp_path, ["experiment=tiny", f"hydra.run.dir={run_dir}", "seed=3"],
                    lambda cfg: {}, exits=False)
    assert yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text()) == ["experiment=tiny", "seed=3"]
    assert yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())["seed"] == 3
    assert (run_dir / "config.resolved.yaml").is_file()

    sweep = tmp_path / "sweep"  # its first job is checked before the sweep starts; its second fails in its job
    code = run_entry_point(monkeypatch, tmp_path, ["-m", "experiment=tiny", "training.num_steps=0,-1",
                                                   f"hydra.sweep.dir={sweep}"], lambda cfg: {})
    assert code == 2 and "error: training.num_steps: must be >= 0" in capsys.readouterr().err
    assert not RunDir(sweep / "1").config.exists()  # it failed before it was recorded
    assert find_job_dirs(sweep) == [sweep / "0", sweep / "1"]
    assert load_job(sweep / "1", sweep).overrides == {"experiment": "tiny", "training.num_steps": "-1"}


@pytest.mark.parametrize("flag", [[], ["-v"], ["hydra.verbose=[olmo_core]"]])
def test_engine_detail_goes_to_the_log_file_and_with_v_to_the_console(monkeypatch, tmp_path, capsys, flag):
    """The engines' INFO records (OLMo-core's callback order, its model repr) land in the run dir's
    ``pretrain_exp.log`` only; ``-v`` (= ``verbose=true``), or Hydra's ``hydra.verbose``, shows them on the console
    too. The project's lines and the last line (``run dir: ...``) are on the console either way."""
    import logging

    seen = {}

    def fake_run(cfg):
        seen["verbose"] = getattr(cfg, "verbose", None)
        logging.getLogger("pretrain_exp.app.experiment").info("plan: 16 items, 84 insertions")
        logging.getLogger("olmo_core.train.trainer").info("Callback order:")
        logging.getLogger("olmo_core.nn.transformer.config").debug("Transformer(...) debug detail")
        return {}

    run_dir = tmp_path / "runs" / "r"
    try:
        run_entry_point(monkeypatch, tmp_path, ["experiment=tiny", f"hydra.run.dir={run_dir}", *flag], fake_run,
                        exits=False)
    finally:
        logging.getLogger("olmo_core").setLevel(logging.NOTSET)  # hydra.verbose set it for this process
    out = capsys.readouterr().out
    assert "plan: 16 items" in out and out.strip().splitlines()[-1] == f"run dir: {run_dir.resolve()}"
    assert ("Callback order:" in out) is bool(flag)
    assert seen["verbose"] is (flag == ["-v"])
    log = (run_dir / "pretrain_exp.log").read_text()
    assert "plan: 16 items" in log and "][olmo_core.train.trainer][INFO] - Callback order:" in log
    assert ("Transformer(...) debug detail" in log) is (flag == ["hydra.verbose=[olmo_core]"])  # Hydra's DEBUG


def test_v_becomes_the_verbose_key_among_the_overrides():
    """Hydra's argparse takes the overrides only as one run of words: ``verbose=true`` joins them wherever ``-v``
    was written (``--cfg job`` takes a value that is not an override)."""
    from pretrain_exp.app.cli import verbose_flag_to_key

    want = ["verbose=true", "experiment=tiny", "--cfg", "job"]
    assert verbose_flag_to_key(["experiment=tiny", "-v", "--cfg", "job"]) == want
    assert verbose_flag_to_key(["--cfg", "job", "--verbose"]) == ["--cfg", "job", "verbose=true"]
    assert verbose_flag_to_key(["-m", "seed=0,1", "-v"]) == ["-m", "verbose=true", "seed=0,1"]
    assert verbose_flag_to_key(["--config-dir=/x", "seed=1"]) == ["--config-dir=/x", "seed=1"]
