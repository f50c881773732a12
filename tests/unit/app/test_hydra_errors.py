"""Mistyped keys and wrong group options through the entry point: one ``error:`` line with the closest name, exit 2
(Hydra alone prints several lines, exits 1 and suggests ``+key=value``)."""

from __future__ import annotations

import os

import pytest

from tests.conftest import run_entry_point


def _main(monkeypatch, tmp_path, capsys, *argv):
    """``python -m pretrain_exp argv`` in process: (exit status, stderr lines)."""
    code = run_entry_point(monkeypatch, tmp_path, argv)
    return code, [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]


@pytest.mark.parametrize("override, needles", [
    ("training.num_step=5", ["training.num_step: unknown key: TrainingConf has no field 'num_step'",
                             "did you mean training.num_steps?", "(fields: num_steps, "]),
    ("+training.num_step=5", ["training.num_step", "did you mean training.num_steps?"]),
    ("insertion=text", ["insertion=text", "options: benchmark, fictional_bios", "did you mean insertion=texts?"]),
    ("eval=[insertion_los]", ["eval=insertion_los", "did you mean eval=insertion_loss?"]),
    ("trainin.num_steps=3", ["did you mean training?"]),
    ("training.num_steps=abc", ["training.num_steps", "'abc'"]),
])
def test_a_typo_is_one_line_with_the_closest_name_and_exit_2(monkeypatch, tmp_path, capsys, override, needles):
    code, lines = _main(monkeypatch, tmp_path, capsys, "experiment=tiny", override)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), lines
    for n in needles:
        assert n in lines[0], (n, lines[0])
    assert "+training" not in lines[0].replace(override, "")  # no advice to append a key the schema lacks
    assert not list((tmp_path / "runs").glob("*"))  # no run dir left
    assert "HYDRA_FULL_ERROR" not in os.environ  # set only while Hydra composes
