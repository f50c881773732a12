"""The phase record of a run (``phases.json``): phases with their seconds and details, events, failures."""

from __future__ import annotations

import json
import logging
import os
import time

import pytest

from pretrain_exp.core.phases import FIRST_STEP, Phases, process_start_time


def test_phases_are_logged_and_written_with_their_seconds(tmp_path, caplog):
    rec = Phases()
    with caplog.at_level(logging.DEBUG, logger="pretrain_exp.core.phases"):
        with rec.phase("size index", files=3) as extra:
            time.sleep(0.05)
            extra["remote"] = 2
        rec.attach(tmp_path)  # what came before is written too
        rec.add("startup", 1.5)
        rec.mark(FIRST_STEP, step=1)
        rec.mark(FIRST_STEP, step=2)  # only the first
    doc = json.loads((tmp_path / "phases.json").read_text())
    assert [p["name"] for p in doc["phases"]] == ["size index", "startup"]
    size = doc["phases"][0]
    assert size["files"] == 3 and size["remote"] == 2 and 0.05 <= size["seconds"] < 5
    assert doc["phases"][1]["seconds"] == 1.5
    first = doc["events"][FIRST_STEP]
    assert first["step"] == 1 and first["at_s"] >= size["start_s"] + size["seconds"]
    assert abs(first["unix"] - (doc["process_start"] + first["at_s"])) < 1e-3
    lines = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("phase size index: 0.") and m.endswith("(files=3, remote=2)") for m in lines)
    assert any(m.startswith("phase event first step: ") for m in lines)


def test_a_failed_phase_is_recorded_as_failed(tmp_path):
    rec = Phases()
    rec.attach(tmp_path)
    with pytest.raises(RuntimeError):
        with rec.phase("plan"):
            raise RuntimeError("no")
    assert json.loads((tmp_path / "phases.json").read_text())["phases"][0]["failed"] is True


def test_process_start_time_is_this_process_start():
    # this process started before now and (the test session) not more than a day ago
    assert time.time() - 86400 < process_start_time() <= time.time()
    assert os.path.exists("/proc/self/stat")
