"""A job's override columns show the value of its ``config.resolved.yaml`` (what the run used), so an override
Hydra recorded for a refused re-run cannot show up in the sweep report."""

from __future__ import annotations

from pretrain_exp.report.jobs import load_job


def test_override_values_come_from_the_resolved_config(tmp_path):
    job = tmp_path / "0"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(
        "- training.learning_rate=1e-3\n- model=tiny_llama\n- +extra.key=7\n- insertion.verify=false\n")
    (job / "config.resolved.yaml").write_text(
        "training:\n  learning_rate: 0.005\nmodel:\n  name: tiny_llama\ninsertion:\n  verify: true\n")
    want = {"training.learning_rate": "0.005", "model": "tiny_llama", "extra.key": "7", "insertion.verify": "true"}
    assert load_job(job, tmp_path).overrides == want
