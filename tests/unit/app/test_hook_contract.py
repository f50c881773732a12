"""The hook contract of the segment loop (:mod:`pretrain_exp.app.hooks`), kept by the loop on a real tiny run: a
component named in the config by its import path runs without editing the loop, the results are written by a
``post_train`` component, every hook runs in the list's order, and an error calls ``on_error`` on every component,
then ``close``, once."""

from __future__ import annotations

import json

import pytest

from pretrain_exp.app.experiment import Experiment
from pretrain_exp.app.hooks import RunHook, load_hooks
from pretrain_exp.core.errors import ConfigError
from tests.conftest import make_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = ["experiment=tiny", "wandb=disabled", "eval=[insertion_loss]", "training.num_threads=1",
        "training.num_steps=4", "training.checkpoint_interval=2", "training.global_batch_size=4",
        "training.micro_batch_size=4", "insertion.experiments.fictional_bios.num_items=4",
        "insertion.experiments.fictional_bios.repetitions=[0,1]", "insertion.audit=off"]

EVENTS: list = []  #: ``(component, hook, args)`` in the order the loop called them


class Recorder(RunHook):
    """A component of one's own: records every hook call, and whether ``results.json`` was there."""

    name = "recorder"

    def __init__(self, ctx):
        self.ctx = ctx

    def _rec(self, hook, *args):
        EVENTS.append((self.name, hook, args, self.ctx.rundir.results.is_file()))

    def pre_train(self):
        self._rec("pre_train")

    def resumed_segment(self, step, final):
        self._rec("resumed_segment", step, final)

    def pre_segment(self, a, b):
        self._rec("pre_segment", a, b)

    def post_segment(self, ckpt, final):
        self._rec("post_segment", ckpt.step, final)

    def post_train(self):
        self._rec("post_train")

    def on_error(self, exc):
        self._rec("on_error", type(exc).__name__)

    def close(self):
        self._rec("close")


class Failing(Recorder):
    """Fails after the second segment's checkpoint."""

    name = "failing"

    def post_segment(self, ckpt, final):
        super().post_segment(ckpt, final)
        if ckpt.step == 4:
            raise RuntimeError("a component failed")


def hooks_of(events, name):
    return [(h, a) for n, h, a, _ in events if n == name]


@pytest.mark.slow
def test_a_component_named_in_the_config_runs_under_the_contract(tmp_path, tiny_model_dir):
    here = f"{__name__}:Recorder"
    EVENTS.clear()
    res = Experiment(make_config(*TINY, f"hooks=[{here}]", run_dir=tmp_path / "run")).run()
    assert hooks_of(EVENTS, "recorder") == [
        ("pre_train", ()), ("pre_segment", (0, 2)), ("post_segment", (2, False)), ("pre_segment", (2, 4)),
        ("post_segment", (4, True)), ("post_train", ()), ("close", ())]
    # the results are a post_train component after the config's components: written after their post_train
    assert [r for _, h, _, r in EVENTS if h in ("post_train", "close")] == [False, True]
    written = json.loads((tmp_path / "run" / "results.json").read_text())
    assert written["steps_evaluated_now"] == res["steps_evaluated_now"] == [2, 4]
    EVENTS.clear()  # the same command again: every segment was trained by the earlier invocation
    Experiment(make_config(*TINY, f"hooks=[{here}]", run_dir=tmp_path / "run")).run()
    assert hooks_of(EVENTS, "recorder") == [
        ("pre_train", ()), ("resumed_segment", (2, False)), ("post_segment", (4, True)), ("post_train", ()),
        ("close", ())]


@pytest.mark.slow
def test_an_error_calls_on_error_on_every_component_then_close_once(tmp_path, tiny_model_dir):
    """``Failing`` raises in ``post_segment`` of the last segment: every component gets ``on_error`` (the
    recorder after it: the list's order), then every one ``close``; no results; the cleanup of a finished run
    (``training.cleanup=all``) keeps the failed run's dir."""
    EVENTS.clear()
    cfg = make_config(*TINY, f"hooks=[{__name__}:Failing,{__name__}:Recorder]", "training.cleanup=all",
                      run_dir=tmp_path / "run")
    with pytest.raises(RuntimeError, match="a component failed"):
        Experiment(cfg).run()
    assert [(n, h) for n, h, _, _ in EVENTS][-5:] == [
        ("failing", "post_segment"), ("failing", "on_error"), ("recorder", "on_error"), ("failing", "close"),
        ("recorder", "close")]
    assert [h for n, h, _, _ in EVENTS].count("close") == 2 and "post_train" not in [h for _, h, _, _ in EVENTS]
    assert (tmp_path / "run" / "checkpoints").is_dir() and not (tmp_path / "run" / "results.json").exists()


def test_a_component_path_that_does_not_name_a_hook_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"^hooks\[1\]: 'json:dumps' is not a RunHook subclass"):
        load_hooks([f"{__name__}:Recorder", "json:dumps"], None)
    with pytest.raises(ConfigError, match=r"^hooks\[0\]: 'no_such_module_here:X' does not import"):
        load_hooks(["no_such_module_here:X"], None)
