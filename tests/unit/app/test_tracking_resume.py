"""The W&B run id of a run dir survives a kill: ``wandb_id.txt`` is written atomically, and an empty one (what a
kill between truncating and writing it left before) is treated as absent rather than passed to W&B as ``id=""``."""

from __future__ import annotations

import pytest

from pretrain_exp.app.tracking import Tracker
from tests.conftest import make_config


@pytest.mark.slow
def test_an_empty_wandb_id_file_gets_a_fresh_id_and_a_second_run_reuses_it(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "wandb_id.txt").write_text("")
    cfg = make_config("experiment=tiny", "wandb=offline", run_dir=run_dir)
    with Tracker(cfg) as t:
        first = t.run.id
    assert len(first) == 8 and (run_dir / "wandb_id.txt").read_text() == first
    with Tracker(cfg) as t:
        assert t.run.id == first
