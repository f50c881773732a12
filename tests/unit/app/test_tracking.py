"""W&B tracking, read back from the offline run's own transaction log and files: one step axis (the trainer's global
step) for training, eval, tables and figures; group, job type and tags; per-dup and per-item tables; the plan
artifact; login detection through wandb itself; the HF Trainer's ``report_to`` and gradient checkpointing."""

from __future__ import annotations

import csv
import json
import os
import sys

import pytest

from tests.conftest import make_config
from tests.wandb_records import history, of_type


def test_a_disabled_tracker_writes_metrics_jsonl_without_importing_wandb(tmp_path, monkeypatch):
    from pretrain_exp.app.tracking import Tracker

    monkeypatch.setitem(sys.modules, "wandb", None)  # any `import wandb` now raises ImportError
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = make_config("experiment=tiny", "wandb=disabled", run_dir=run_dir)
    with Tracker(cfg) as t:
        t.log({"train/loss": 2.5, "train/grad_norm": float("nan")}, 3)
        t.log_media({"plots/x": None}, 3)
        t.log_results({"per_dup": [{"dup_count": 0}]}, {}, 3)
        t.log_artifacts()
        assert t.run is None and t.wandb_dir is None
    assert [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [
        {"step": 3, "train/loss": 2.5}]
    assert sorted(p.name for p in run_dir.iterdir()) == ["metrics.jsonl"]  # no wandb/ dir, no wandb_id.txt


def test_a_self_hosted_login_counts_and_a_key_for_another_host_does_not(tmp_path, monkeypatch):
    import wandb

    from pretrain_exp.report.wandb_log import has_wandb_login

    netrc = tmp_path / "netrc"
    netrc.write_text("machine wandb.example.org\n  login user\n  password " + "a" * 40 + "\n")
    netrc.chmod(0o600)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(netrc))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    found = {}
    for host in ("https://api.wandb.ai", "https://wandb.example.org"):
        monkeypatch.setenv("WANDB_BASE_URL", host)
        wandb.teardown()  # wandb reads its settings (the base URL) once per process
        found[host] = has_wandb_login()
    netrc.unlink()
    wandb.teardown()
    found["none"] = has_wandb_login()
    wandb.teardown()
    assert found == {"https://api.wandb.ai": False, "https://wandb.example.org": True, "none": False}


@pytest.mark.slow
def test_offline_run_has_one_step_axis_tables_and_artifacts(tmp_path, tiny_model_dir, monkeypatch):
    import transformers

    from pretrain_exp.app.launch import launch as run

    enabled = []
    method = next(m for m in ("activation_checkpointing_enable", "gradient_checkpointing_enable")  # transformers 5, 4
                  if hasattr(transformers.PreTrainedModel, m))
    enable = getattr(transformers.PreTrainedModel, method)

    def spy(self, *args, **kwargs):  # what the Trainer calls for TrainingArguments.(activation|gradient)_checkpointing
        enabled.append(type(self).__name__)
        return enable(self, *args, **kwargs)

    monkeypatch.setattr(transformers.PreTrainedModel, method, spy)
    monkeypatch.setenv("WANDB_MODE", "offline")
    run_dir = tmp_path / "run"
    cfg = make_config("experiment=tiny", "training.num_steps=2", "training.checkpoint_interval=1",
                      "training.num_threads=1", "insertion.experiments.fictional_bios.num_items=4",
                      "insertion.experiments.fictional_bios.repetitions=[0,1,2,4]", "eval=[insertion_loss]",
                      "wandb=offline", "wandb.group=g1", "wandb.tags=[extra]", "training.gradient_checkpointing=true",
                      "training.report_to=csv", run_dir=run_dir)
    run(cfg)
    assert enabled == ["LlamaForCausalLM", "LlamaForCausalLM"]  # one Trainer per segment
    with open(run_dir / "trainer_log.csv", newline="") as f:
        logged = list(csv.DictReader(f))
    assert sorted({int(r["step"]) for r in logged if r["name"] == "loss"}) == [1, 2]

    (wb,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    rows = history(wb)
    assert all("global_step" in r for r in rows), [sorted(r) for r in rows if "global_step" not in r]
    assert [r["global_step"] for r in rows if "train/loss" in r] == [1, 2]
    assert sorted(r["global_step"] for r in rows if "eval/insertion_loss/fictional_bios/dup4/mean_loss" in r) == [1, 2]
    assert max(r["_step"] for r in rows) > 2  # W&B's own counter runs ahead; the charts use global_step
    assert any(m.glob_name == "*" and m.step_metric == "global_step" for m in of_type(wb, "metric"))
    (meta,) = of_type(wb, "run")
    assert (meta.run_group, meta.job_type) == ("g1", "train")
    assert list(meta.tags) == ["hf", "tiny_llama", "tiny", "extra"]

    last = [r for r in rows if "tables/per_dup/_type" in r]
    assert len(last) == 1 and last[0]["global_step"] == 2
    assert [r["global_step"] for r in rows if r.get("plots/loss_vs_dup/_type") == "image-file"] == [2]
    files = wb.parent / "files"
    per_dup = json.loads((files / last[0]["tables/per_dup/path"]).read_text())
    assert [row[per_dup["columns"].index("dup_count")] for row in per_dup["data"]] == [0, 1, 2, 4]
    items = json.loads((files / last[0]["tables/insertion_loss/items/path"]).read_text())
    steps = [row[items["columns"].index("step")] for row in items["data"]]
    assert sorted(set(steps)) == [1, 2] and len(steps) == 2 * 4  # 4 items, evaluated after each segment

    arts = {a.type: a for a in of_type(wb, "artifact")}
    plan = arts["insertion-plan"]
    assert plan.name == f"plan-{(run_dir / 'wandb_id.txt').read_text().strip()}"
    assert {f.path for f in plan.manifest.contents} >= {"plan.npz", "manifest.jsonl", "config.resolved.yaml"}
    assert "checkpoint" not in arts  # off by default (wandb.log_checkpoints)
    assert os.environ.get("WANDB_MODE") == "offline"


@pytest.mark.slow
def test_olmo_core_gets_activation_checkpointing_and_forwards_all_its_metrics(tmp_path, monkeypatch):
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    from pretrain_exp.app.experiment import Experiment
    from pretrain_exp.frameworks.olmo_core import framework as olmo_core_framework
    from pretrain_exp.frameworks.olmo_core.callbacks import METRICS

    built = []
    build = olmo_core_framework.OlmoCoreFramework._build_trainer

    def spy(self, *args, **kwargs):
        built.append(build(self, *args, **kwargs))
        return built[-1]

    monkeypatch.setattr(olmo_core_framework.OlmoCoreFramework, "_build_trainer", spy)
    cfg = make_config("framework=olmo_core", "training=tiny", "training.num_steps=2", "training.global_batch_size=4",
                      "training.micro_batch_size=2", "training.checkpoint_interval=2", "training.num_threads=1",
                      "data.held_out_rows=8", "insertion=none", "eval=[]", "wandb=disabled",
                      "training.gradient_checkpointing=true", run_dir=tmp_path / "run")
    Experiment(cfg).run()
    blocks = list(built[0].train_module.model.blocks.values())
    assert blocks and all(isinstance(b, CheckpointWrapper) for b in blocks)
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    keys = set().union(*metrics) - {"step"}
    assert {"train/loss", "train/grad_norm", "train/learning_rate"} <= keys
    others = keys - set(METRICS.values())
    assert others and not others & set(METRICS), sorted(keys)  # OLMo-core's other metrics, under their own names
