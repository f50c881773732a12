"""``insertion.dynamic`` through Hydra: the policy presets compose (with randomized dup-0 controls by default), and a
bad policy, a missing insertion_loss eval, no controls (unless allowed) or no static dup-0 item to draw them from is
one ConfigError naming the key."""

from __future__ import annotations

import pytest

from pretrain_exp.core.errors import ConfigError
from pretrain_exp.insertion.dynamic import parse_dynamic
from tests.conftest import make_config

BASE = ["experiment=tiny", "wandb=disabled"]


def test_policy_presets_and_the_demo_compose(tmp_path):
    cfg = make_config(*BASE, "+insertion/dynamic=spaced_repetition", "insertion.dynamic.margin=0.2",
                      run_dir=tmp_path)
    conf = parse_dynamic(cfg.insertion.dynamic, cfg.insertion.experiments, cfg.eval.tasks)
    assert (conf.policy, conf.margin, conf.task) == ("spaced_repetition", 0.2, "insertion_loss")
    demo = make_config("experiment=dynamic_demo", "wandb=disabled", run_dir=tmp_path)
    conf = parse_dynamic(demo.insertion.dynamic, demo.insertion.experiments, demo.eval.tasks)
    assert (conf.policy, conf.experiments, conf.controls) == ("until_memorized", ["fictional_bios"], 12)
    assert demo.model.name == "smollm2_135m" and demo.eval.on_load


@pytest.mark.parametrize("overrides,key", [
    (["insertion.dynamic=forever"], "insertion.dynamic.policy"),
    (["insertion.dynamic=until_memorized", "eval=[perplexity]"], "insertion.dynamic.task"),
    (["+insertion/dynamic=until_memorized", "eval=[perplexity]"], "insertion.dynamic.task"),  # ${eval_task:...}: null
    (["+insertion/dynamic=until_memorized", "insertion.dynamic.controls=0"], "insertion.dynamic.controls"),
    (["+insertion/dynamic=spaced_repetition", "insertion.experiments.fictional_bios.repetitions=[1,4]"],
     "insertion.dynamic.controls"),  # no static dup-0 item to draw controls from
])
def test_bad_dynamic_is_a_config_error(tmp_path, overrides, key):
    with pytest.raises(ConfigError) as e:
        make_config(*BASE, *overrides, run_dir=tmp_path)
    assert e.value.key == key


def test_dynamic_is_parsed_once_per_run_and_the_run_reads_the_parsed_config(tmp_path, monkeypatch, tiny_model_dir):
    """``derive`` parses ``insertion.dynamic`` (the policy's options, its default task); validation and the run read
    the result from the config instead of parsing it again."""
    import pretrain_exp.insertion.dynamic as dynamic
    from pretrain_exp.app.experiment import Experiment

    calls = []
    parse = dynamic.parse_dynamic
    monkeypatch.setattr(dynamic, "parse_dynamic", lambda *a, **k: calls.append(a) or parse(*a, **k))
    cfg = make_config(*BASE, "eval=[insertion_loss]", "training.num_steps=0", "insertion.verify=false",
                      "insertion.audit=off", "insertion.dynamic=until_memorized", run_dir=tmp_path)
    assert isinstance(cfg.insertion.dynamic, dynamic.DynamicConf) and cfg.insertion.dynamic.task == "insertion_loss"
    exp = Experiment(cfg)
    assert exp.dynamic is cfg.insertion.dynamic and len(calls) == 1
    # the default draws half of the static dup-0 items as controls (no steps to train: all 16 bios are at dup 0)
    arms = exp.dynamic_insertion.arms
    assert len(arms.controls) == 8 and (exp.plan.item_dup_count[arms.controls] == 0).all()
    assert len(arms.targets) == 8 and not set(arms.controls) & set(arms.targets)


def test_the_arms_are_drawn_when_the_run_is_prepared(tmp_path, tiny_model_dir):
    """The closed loop's arms are part of what a run decides before step 1 (:func:`prepare`, the plan's owner):
    controls the static plan cannot give are refused there, by the step the torchrun launcher runs before any rank
    starts."""
    from pretrain_exp.app.prepare import prepare

    run = [*BASE, "eval=[insertion_loss]", "training.num_steps=0", "insertion.verify=false", "insertion.audit=off",
           "+insertion/dynamic=until_memorized"]
    ctx = prepare(make_config(*run, run_dir=tmp_path / "ok"))
    arms = ctx.plan.arms
    assert len(arms.controls) == 8 and (ctx.plan.static.item_dup_count[arms.controls] == 0).all()
    with pytest.raises(ConfigError) as e:  # 17 controls from the 16 static dup-0 bios
        prepare(make_config(*run, "insertion.dynamic.controls=17", run_dir=tmp_path / "too_many"))
    assert e.value.key == "insertion.dynamic.controls" and "17 control(s)" in str(e.value)


def test_no_controls_is_accepted_when_asked_for(tmp_path):
    cfg = make_config(*BASE, "+insertion/dynamic=until_memorized", "insertion.dynamic.controls=0",
                      "insertion.dynamic.allow_no_controls=true", run_dir=tmp_path)
    assert (cfg.insertion.dynamic.controls, cfg.insertion.dynamic.allow_no_controls) == (0, True)


def test_a_run_dir_saved_with_the_dynamic_policy_as_given_resumes_and_a_real_change_is_named(tmp_path):
    """A run dir whose ``config.resolved.yaml`` holds ``insertion.dynamic`` as the user gave it (no ``task``, newer
    options missing: how runs saved it before ``derive`` parsed it) is the same run on a re-run of its command; a
    changed option is still refused, naming the key."""
    import yaml

    from pretrain_exp.app.run_record import save_resolved_config
    from pretrain_exp.core.rundir import RunDir

    args = [*BASE, "+insertion/dynamic=until_memorized"]
    cfg = make_config(*args, run_dir=tmp_path)
    save_resolved_config(cfg, tmp_path)
    path = RunDir(tmp_path).config
    saved = yaml.safe_load(path.read_text())
    assert saved["insertion"]["dynamic"]["task"] == "insertion_loss"
    saved["insertion"]["dynamic"] = {"policy": "until_memorized", "experiments": [], "task": None, "copies": 1,
                                     "threshold": 1.0, "max_per_batch": 0}
    path.write_text(yaml.safe_dump(saved))
    _check_same_run(*args, run_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"insertion.dynamic.threshold changes \(1.0 -> 2.0\)"):
        _check_same_run(*args, "insertion.dynamic.threshold=2.0", run_dir=tmp_path)


def test_a_saved_dynamic_policy_without_a_task_is_derived_from_the_eval_tasks_it_saved(tmp_path):
    """A run dir saved with ``insertion.dynamic`` as given (``task`` unset) decided on the first ``insertion_loss``
    task of its own ``eval.tasks``: a re-run whose first such task is another one (``eval.*`` may change) would
    decide on other losses, so it is refused, naming ``insertion.dynamic.task``; with the saved task named, it is the
    same run."""
    import yaml

    from pretrain_exp.app.run_record import save_resolved_config
    from pretrain_exp.core.rundir import RunDir

    args = [*BASE, "+insertion/dynamic=until_memorized"]
    save_resolved_config(make_config(*args, run_dir=tmp_path), tmp_path)
    path = RunDir(tmp_path).config
    saved = yaml.safe_load(path.read_text())
    saved["eval"]["tasks"] = {"bios_loss": saved["eval"]["tasks"]["insertion_loss"]}  # that run's only loss task
    saved["insertion"]["dynamic"]["task"] = None
    path.write_text(yaml.safe_dump(saved))
    with pytest.raises(ConfigError) as e:
        _check_same_run(*args, run_dir=tmp_path)
    assert e.value.key == "insertion.dynamic.task" and "('bios_loss' -> 'insertion_loss')" in str(e.value)
    _check_same_run(*args, "+eval.tasks.bios_loss={type: insertion_loss}", "insertion.dynamic.task=bios_loss",
                    run_dir=tmp_path)


def _check_same_run(*args, run_dir):
    from pretrain_exp.app.run_record import check_same_run, recorded_form

    cfg = make_config(*args, run_dir=run_dir)
    check_same_run(run_dir, recorded_form(cfg))


def test_a_run_dir_saved_with_every_policys_options_resumes(tmp_path):
    """A run dir whose saved ``insertion.dynamic`` holds every policy's options (``threshold`` and ``margin``: how
    runs saved it before each policy had its own schema) is the same run on a re-run of its command."""
    import yaml

    from pretrain_exp.app.run_record import save_resolved_config
    from pretrain_exp.core.rundir import RunDir

    args = [*BASE, "+insertion/dynamic=spaced_repetition"]
    cfg = make_config(*args, run_dir=tmp_path)
    save_resolved_config(cfg, tmp_path)
    path = RunDir(tmp_path).config
    saved = yaml.safe_load(path.read_text())
    assert "threshold" not in saved["insertion"]["dynamic"] and saved["insertion"]["dynamic"]["margin"] == 0.5
    saved["insertion"]["dynamic"]["threshold"] = 1.0
    path.write_text(yaml.safe_dump(saved))
    _check_same_run(*args, run_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"insertion.dynamic.margin changes \(0.5 -> 0.2\)"):
        _check_same_run(*args, "insertion.dynamic.margin=0.2", run_dir=tmp_path)
