"""The components of the segment loop, each alone (:mod:`pretrain_exp.app.hooks`): the segments, the hook order, the
HF export and its keep decision, the evaluator's variants, the plan history of dynamic insertion, the results and
the cleanup — on real files, a real tiny model and a real eval."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pretrain_exp.app.async_eval import AsyncEvals
from pretrain_exp.app.cleanup import RunDirCleanup, clean_run_dir
from pretrain_exp.app.evaluator import AsyncEvaluator, DistributedEvaluator, Evaluator, make_evaluator
from pretrain_exp.app.hf_export import HFExport
from pretrain_exp.app.hooks import Hooks, RunHook, segments
from pretrain_exp.app.results import write_results
from pretrain_exp.app.tracking import NullTracker
from pretrain_exp.core.config import Cleanup, EvalConf, EvalMode, ExportHF
from pretrain_exp.core.errors import TrainingError
from pretrain_exp.core.io import write_json
from pretrain_exp.core.rundir import RunDir
from pretrain_exp.evals.base import EvalContext
from pretrain_exp.evals.insertion_loss import InsertionLossConf
from pretrain_exp.frameworks.base import Checkpoint
from pretrain_exp.insertion.run_plan import PlanHistory
from pretrain_exp.report.summary import summarize
from tests.conftest import make_config, make_plan, random_item, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Recorder(NullTracker):
    """A tracker that keeps what is logged: ``[(metrics, step), ...]``."""

    def __init__(self):
        self.logged = []

    def log(self, metrics, step):
        self.logged.append((metrics, step))


class ModelCheckpoint(Checkpoint):
    """A checkpoint that is not an HF dir: its HF export is a tiny Llama written by ``save_pretrained``."""

    is_hf = False
    exports = 0

    def to_hf(self, out_dir: Path) -> Path:
        type(self).exports += 1
        tiny_model().save_pretrained(out_dir)
        return out_dir


@pytest.fixture
def plan():
    rng = np.random.default_rng(0)
    return make_plan([(random_item(rng), d, 0) for d in (0, 1, 0, 1)])


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("model")
    tiny_model().save_pretrained(d)
    return d


def test_segments_of_a_run():
    assert segments(0, 10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert segments(0, 8, 4) == [(0, 4), (4, 8)]
    assert segments(3, 5, 10) == [(3, 5)]  # one segment shorter than the interval
    assert segments(7, 7, 4) == [(7, 7)]  # 0 steps: the initial checkpoint's one empty segment


def test_hooks_run_in_the_given_order_and_skip_none():
    calls = []

    class Named(RunHook):
        def __init__(self, name):
            self.name = name

        def pre_segment(self, a, b):
            calls.append((self.name, "pre_segment", a, b))

        def post_segment(self, ckpt, final):
            calls.append((self.name, "post_segment", ckpt.step, final))

    hooks = Hooks([Named("dynamic"), None, Named("hf"), RunHook()])
    hooks.pre_train()  # a no-op in every hook not overriding it
    hooks.pre_segment(0, 2)
    hooks.post_segment(Checkpoint(Path("x"), 2), True)
    assert calls == [("dynamic", "pre_segment", 0, 2), ("hf", "pre_segment", 0, 2),
                     ("dynamic", "post_segment", 2, True), ("hf", "post_segment", 2, True)]


@pytest.mark.parametrize("mode, kept, kept_hf", [
    (ExportHF.every, {2, 4}, {2, 4}), (ExportHF.final, {4}, set()), (ExportHF.none, set(), set())])
def test_the_export_hf_keep_decision(tmp_path, mode, kept, kept_hf):
    """``training.export_hf``: which exports are kept (one rule, for the kept export after a segment and for the
    HF dir of a background eval once its evals are written); for a checkpoint that is an HF dir only under
    ``every`` (under ``final`` the last checkpoint itself is the final model)."""
    hf = HFExport(RunDir(tmp_path), mode, end_step=4)
    assert {s for s in (2, 4) if hf.keeps(s, is_hf=False)} == kept
    assert {s for s in (2, 4) if hf.keeps(s, is_hf=True)} == kept_hf


def test_the_hf_export_is_written_once_logged_and_dropped_unless_kept(tmp_path, caplog):
    rd = RunDir(tmp_path)
    hf = HFExport(rd, ExportHF.final, end_step=4)
    ModelCheckpoint.exports = 0
    with caplog.at_level(logging.INFO, logger="pretrain_exp.app.hf_export"):
        for step in (2, 4):
            hf.post_segment(ModelCheckpoint(tmp_path / "checkpoints" / f"s{step}", step), final=step == 4)
        assert hf.keep(ModelCheckpoint(tmp_path, 4)) == rd.hf_export(4)  # there already: not written again
    assert ModelCheckpoint.exports == 1 and not rd.hf_export(2).exists()
    assert (rd.hf_export(4) / "config.json").is_file()
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["HF export of step 4"]

    assert hf.export(ModelCheckpoint(tmp_path, 2)) == rd.hf_export(2)  # e.g. for a background eval
    hf.drop(2, is_hf=False)
    hf.drop(4, is_hf=False)
    assert not rd.hf_export(2).exists() and rd.hf_export(4).is_dir()
    HFExport(rd, ExportHF.none, end_step=4).drop(4, is_hf=False)
    assert not rd.hf.exists()  # hf/ itself once empty


def test_an_eval_reads_the_kept_export_else_a_temporary_one(tmp_path):
    rd = RunDir(tmp_path)
    hf = HFExport(rd, ExportHF.every, end_step=2, main=True)
    ModelCheckpoint.exports = 0
    with hf.read(ModelCheckpoint(tmp_path, 1)) as d:
        assert (d / "config.json").is_file() and rd.path not in d.parents
    assert not d.exists() and ModelCheckpoint.exports == 1
    kept = hf.keep(ModelCheckpoint(tmp_path, 2))
    with hf.read(ModelCheckpoint(tmp_path, 2)) as d:
        assert d == kept
    with hf.shared(ModelCheckpoint(tmp_path, 2)) as d:  # one process: no other rank to wait for
        assert d == kept
    assert kept.is_dir() and ModelCheckpoint.exports == 2


def _evaluator(mode, tmp_path, plan, tracker, initial=None, start=0, end=0, **kw):
    conf = EvalConf(mode=EvalMode[mode], tasks={"loss": InsertionLossConf()}, **kw)

    def context(model, step):
        return EvalContext(model, None, plan, np.empty((0, 64), np.int64), step, 4, 0)

    return make_evaluator(conf, RunDir(tmp_path), HFExport(RunDir(tmp_path), ExportHF.none, end), context, tracker,
                          True, initial, start, end, worker_config=lambda: (tmp_path / "config.yaml", False),
                          model_dir=tmp_path / "model")


@pytest.mark.parametrize("mode, cls", [("inline", Evaluator), ("distributed", DistributedEvaluator),
                                       ("async", AsyncEvaluator)])
def test_one_evaluator_interface_for_each_eval_mode(tmp_path, plan, mode, cls):
    ev = _evaluator(mode, tmp_path, plan, NullTracker())
    assert type(ev) is cls and not ev.distributed()  # one process: distributed is inline


def test_an_eval_is_written_logged_at_its_step_and_read_back(tmp_path, plan, hf_model):
    """The evaluator writes ``evals/step<N>/<task>.json``, logs ``eval/<task>/<metric>`` at the step, reads a
    written task back instead of running it again (unless ``redo``)."""
    tracker = Recorder()
    ev = _evaluator("inline", tmp_path, plan, tracker, initial=Checkpoint(hf_model, 0), start=0, end=2, on_load=True)
    ev.pre_train()  # eval.on_load: the initial checkpoint
    rd = RunDir(tmp_path)
    rd.evals(2, "loss").parent.mkdir(parents=True)
    orphan = rd.evals(2, "loss").parent / ".loss.k3e7y_ds.json"  # a writer of that file killed mid-write
    orphan.write_text('{"task": "lo')
    other = rd.evals(2, "loss").parent / ".lossy.k3e7y_ds.json"  # not a temp file of that file
    other.write_text("{}")
    ev.post_segment(Checkpoint(hf_model, 2), final=True)
    assert not orphan.exists() and other.exists()
    rec = rd.read_eval(2, "loss")
    assert set(ev.evaluated) == {0, 2} and ev.evaluated[2]["loss"] == rec
    assert rec["step"] == 2 and rec["type"] == "insertion_loss" and rec["metrics"]
    assert [s for _, s in tracker.logged] == [0, 2]
    assert tracker.logged[1][0] == {f"eval/loss/{k}": v for k, v in rec["metrics"].items()}

    mtime = rd.evals(2, "loss").stat().st_mtime_ns
    assert ev.evaluate(Checkpoint(hf_model, 2)) == {"loss": rec}  # read back, not run again
    assert rd.evals(2, "loss").stat().st_mtime_ns == mtime and len(tracker.logged) == 2
    again = ev.evaluate(Checkpoint(hf_model, 2), redo=True)
    assert again["loss"]["metrics"] == rec["metrics"] and len(tracker.logged) == 3


def test_a_run_of_0_steps_evaluates_its_initial_checkpoint(tmp_path, plan, hf_model):
    ev = _evaluator("inline", tmp_path, plan, NullTracker(), initial=Checkpoint(hf_model, 5), start=5, end=5)
    ev.pre_train()
    assert set(ev.evaluated) == {5} and RunDir(tmp_path).read_eval(5, "loss") is not None
    off = _evaluator("inline", tmp_path / "b", plan, NullTracker(), initial=Checkpoint(hf_model, 0), end=4)
    off.pre_train()
    assert off.evaluated == {}


def test_async_evals_written_before_a_kill_are_collected_at_the_end(tmp_path, plan):
    """``eval.mode=async``: at the end, the marker and the HF dir of a step whose evals were all written (by a
    process of an earlier invocation) are removed; a re-run refuses missing evals whose HF dir is gone."""
    rd = RunDir(tmp_path)
    ev = _evaluator("async", tmp_path, plan, NullTracker(), initial=ModelCheckpoint(tmp_path / "model", 0), end=4)
    ev.jobs = AsyncEvals(tmp_path, tmp_path / "config.yaml", "local")  # what pre_train builds (no process here)
    write_json(rd.evals(2, "loss"), {"task": "loss", "step": 2, "metrics": {"mean_loss": 1.0}})
    write_json(rd.eval_marker(2), {"step": 2, "tasks": ["loss"]})
    rd.hf_export(2).mkdir(parents=True)
    ev.resumed_segment(2, final=False)  # nothing missing: nothing started
    assert ev.jobs.jobs == {}
    ev.post_train()
    assert not rd.eval_marker(2).exists() and not rd.hf_export(2).exists()
    assert rd.read_eval(2, "loss") is not None
    with pytest.raises(TrainingError, match="evals of step 4 are missing and its HF model dir .* is gone"):
        ev.resumed_segment(4, final=True)


def test_the_plan_history_answers_each_step_with_the_plan_decided_before_it(plan):
    """Dynamic insertion: the plan of an eval at step ``s`` holds the additions decided before ``s``."""
    h = PlanHistory(plan)
    rng = np.random.default_rng(1)
    later, last = (make_plan([(random_item(rng), 1, 0)]) for _ in range(2))
    h.add(4, later, {"decided_at": 4})
    h.add(8, last, {"decided_at": 8})
    assert h.current is last and h.decided(4) and not h.decided(6)
    assert [h.for_step(s) is p for s, p in ((0, plan), (4, plan), (5, later), (8, later), (9, last))] == [True] * 5
    assert h.additions == [{"decided_at": 4}, {"decided_at": 8}] and plan.digest() in h.digests()


def test_the_run_plan_is_the_one_owner_of_the_plan(tmp_path, plan):
    """:class:`RunPlan`: a decision added to it is what the training rows read from then on and what the evals of
    later steps measure; a rank other than 0 writes no plan file."""
    from types import SimpleNamespace

    from pretrain_exp.insertion.run_plan import RunPlan

    rows = SimpleNamespace(plan=plan)  # the training rows' one field the owner sets
    owner = RunPlan(PlanHistory(plan), {}, RunDir(tmp_path), main=False)
    owner.rows = rows
    later = make_plan([(random_item(np.random.default_rng(2)), 1, 0)])
    owner.add(4, later, {"decided_at": 4, "positions": []})
    assert rows.plan is later and owner.current is later and owner.static is plan
    assert owner.as_of(4) is plan and owner.as_of(5) is later and owner.decided(4) and not owner.decided(2)
    assert owner.additions == [{"decided_at": 4, "positions": []}]
    assert not RunDir(tmp_path).plan.exists() and not RunDir(tmp_path).manifest.exists()


def test_results_plots_and_tables_are_written(tmp_path, plan):
    cfg = make_config("experiment=tiny", "wandb=disabled", run_dir=tmp_path)
    rd = RunDir(tmp_path)
    for step, loss in ((0, 3.0), (2, 2.5)):
        write_json(rd.evals(step, "insertion_loss"), {
            "task": "insertion_loss", "type": "insertion_loss", "step": step, "metrics": {"mean_loss": loss},
            "per_dup": [], "rows": [{"item_id": 0, "experiment": "bios", "dup_count": 1, "loss": loss}]})
    results = summarize(cfg, plan, {2: rd.read_evals(2)}, rd.all_evals(), 1.5)
    initial = Checkpoint(tmp_path / "model", 0)
    assert write_results(rd, NullTracker(), results, rd.all_evals(), Checkpoint(tmp_path, 2), initial) is results
    assert json.loads(rd.results.read_text()) == results and set(results["by_step"]) == {"0", "2"}
    assert rd.plot("loss_vs_step").is_file() and rd.plot("loss_vs_dup").is_file()
    evals = pd.read_parquet(rd.parquet("evals"))
    assert sorted(evals["step"]) == [0, 2] and sorted(evals["loss"]) == [2.5, 3.0]


def _checkpoints(root: Path) -> RunDir:
    rd = RunDir(root)
    for step in (2, 4):
        d = rd.checkpoint(step, prefix=RunDir.HF_CHECKPOINT)
        d.mkdir(parents=True)
        for name in ("model.safetensors", "config.json", "optimizer.pt", "scheduler.pt", "rng_state.pth"):
            (d / name).write_bytes(b"x")
    write_json(rd.results, {})
    return rd


@pytest.mark.parametrize("mode", list(Cleanup))
def test_cleanup_of_a_finished_run(tmp_path, mode):
    rd = _checkpoints(tmp_path / "run")
    last = Checkpoint(rd.checkpoint(4, prefix=RunDir.HF_CHECKPOINT), 4)
    RunDirCleanup(rd, mode, lambda: last).close()
    if mode == Cleanup.all:
        assert not rd.path.exists()
        return
    assert rd.results.is_file()
    left = {p.relative_to(rd.checkpoints).as_posix() for p in rd.checkpoints.rglob("*") if p.is_file()}
    both = {f"{c}/{f}" for c in (last.path.name, rd.checkpoint(2, RunDir.HF_CHECKPOINT).name)
            for f in ("model.safetensors", "config.json", "optimizer.pt", "scheduler.pt", "rng_state.pth")}
    if mode == Cleanup.none:
        assert left == both
    else:
        assert left == {f"{last.path.name}/model.safetensors", f"{last.path.name}/config.json"}


def test_cleanup_without_a_checkpoint_keeps_the_rest(tmp_path):
    rd = _checkpoints(tmp_path / "run")
    clean_run_dir(rd, Cleanup.bulky, None)
    assert not any(rd.checkpoints.iterdir()) and rd.results.is_file()
