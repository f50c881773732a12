"""Hydra conventions of the entry point: unknown keys added with ``+`` are refused, ``--help`` shows the user's
groups, a sweep invalid for its jobs is refused before the launcher runs, ``training.gradient_checkpointing`` and
``training.report_to`` reach the HF Trainer, and every third-party import is a declared dependency."""

from __future__ import annotations

import ast
import copy
import json
import re
import sys
from importlib.metadata import packages_distributions

import pytest

from pretrain_exp.core.errors import ConfigError
from tests.conftest import ROOT, compose, make_config, run_entry_point


def test_a_key_added_with_plus_that_no_schema_has_is_refused(tmp_path):
    from pretrain_exp.app.validate import to_config, unknown_keys

    added = ["training.foo", "eval.tasks.perplexity.bar", "insertion.experiments.fictional_bios.qux", "zz"]
    cfg = compose(*(f"+{k}=1" for k in added), run_dir=tmp_path)  # Hydra accepts them (+ opens the struct flag)
    assert sorted(k for k, _ in unknown_keys(cfg)) == sorted(added)
    with pytest.raises(ConfigError) as e:  # ... the conversion names the first
        to_config(cfg)
    assert e.value.key in added and "unknown key" in str(e.value)


def test_gradient_checkpointing_compile_and_report_to_reach_the_hf_trainer(tmp_path, tiny_model_dir):
    from pretrain_exp.app.validate import derive, validate
    from pretrain_exp.frameworks.hf.framework import HFFramework
    from pretrain_exp.frameworks.hf.trainer import CHECKPOINTING_ARG

    cfg = make_config("experiment=tiny", "training.gradient_checkpointing=true", "training.report_to=[tensorboard,csv]",
                      "training.compile=true", run_dir=tmp_path)
    args = HFFramework(cfg, tiny_model_dir).training_arguments()
    assert getattr(args, CHECKPOINTING_ARG) is True and args.report_to == ["tensorboard"]  # csv: the run's own callback
    assert args.torch_compile is True
    plain = copy.deepcopy(cfg)
    plain.training.gradient_checkpointing, plain.training.report_to, plain.training.compile = False, "none", False
    args = HFFramework(validate(derive(plain)), tiny_model_dir).training_arguments()
    assert getattr(args, CHECKPOINTING_ARG) is False and args.report_to == [] and args.torch_compile is False
    for bad, key in (("wandb", "training.report_to[0]"), (["tensorboard", "nope"], "training.report_to[1]")):
        wrong = copy.deepcopy(cfg)
        wrong.training.report_to = bad
        with pytest.raises(ConfigError) as e:
            validate(derive(wrong))
        assert e.value.key == key


def test_cfg_job_resolve_shows_the_derived_values_the_run_uses(monkeypatch, tmp_path, capsys):
    """Hydra's own ``--cfg job --resolve`` prints ``training.report_to`` as the list of loggers and
    ``insertion.dynamic.task`` as the eval task the run reads (``${eval_task:insertion_loss}``): the values the
    validated config holds."""
    import yaml

    from pretrain_exp.app.run_record import config_dict

    overrides = ["experiment=tiny", "+insertion/dynamic=spaced_repetition", "eval=[perplexity,insertion_loss]"]
    run_entry_point(monkeypatch, tmp_path, [*overrides, "--cfg", "job", "--resolve"], exits=False)
    shown = yaml.safe_load(capsys.readouterr().out)
    used = config_dict(make_config(*overrides, run_dir=tmp_path))
    assert shown["training"]["report_to"] == used["training"]["report_to"] == []
    dyn = shown["insertion"]["dynamic"]
    assert dyn["task"] == "insertion_loss" and dyn == {k: used["insertion"]["dynamic"][k] for k in dyn}


@pytest.mark.slow
def test_help_lists_the_users_groups_under_what_the_app_does(monkeypatch, tmp_path, capsys):
    code = run_entry_point(monkeypatch, tmp_path, ["--help"])
    out = capsys.readouterr().out
    assert code in (0, None)
    assert out.startswith("pretrain_exp: continual pretraining of language models with controlled data insertion")
    groups = dict(line.split(": ", 1) for line in out.split("== Configuration groups ==")[1]
                  .split("== Config ==")[0].splitlines() if ": " in line)
    conf = ROOT / "conf"  # every group dir, nested ones (insertion/dynamic) too, but Hydra's own
    assert set(groups) == {p.parent.relative_to(conf).as_posix() for p in conf.rglob("*.yaml")
                           if p.parent != conf and p.relative_to(conf).parts[0] != "hydra"}
    assert groups["insertion"].split(", ") == sorted(p.stem for p in (ROOT / "conf" / "insertion").glob("*.yaml"))
    assert not re.search(r"^schema/", out, re.M) and "powered by Hydra" not in out


@pytest.mark.slow
def test_a_sweep_invalid_for_its_jobs_is_refused_once_before_submission(monkeypatch, tmp_path, capsys):
    """With the SLURM launcher the first job's config is validated before submitit is called; a valid sweep runs,
    and its jobs get the sweep's W&B group."""
    from submitit.core.core import Executor

    submitted = []

    def map_array(self, fn, *args):  # what hydra-submitit-launcher calls with one entry per job (sbatch)
        submitted.append([list(job[0]) for job in zip(*args)])
        raise SystemExit(7)  # never sbatch from a test (Hydra would turn an exception into exit status 1)

    monkeypatch.setattr(Executor, "map_array", map_array)
    argv = ["-m", "experiment=tiny", "hydra/launcher=slurm", "seed=0,1"]
    code = run_entry_point(monkeypatch, tmp_path, [*argv, "training.learning_rate=-1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and submitted == []
    assert err[-1].startswith("error: training.learning_rate: must be a finite number >= 0, got -1.0 (the "
                              "sweep's first job: ") and err[-1].endswith("nothing was launched")
    assert not (tmp_path / "runs").exists()
    ran = []  # a valid sweep runs, its jobs in one W&B group, the sweep's dir name (Hydra's basic launcher)
    sweep = ["-m", "experiment=tiny", "seed=3", f"hydra.sweep.dir={tmp_path / 'sweep-a'}"]
    run_entry_point(monkeypatch, tmp_path, sweep, ran.append, exits=False)
    assert [(cfg.seed, cfg.wandb.group) for cfg in ran] == [(3, "sweep-a")]


def _distribution(req: str) -> str:
    return re.split(r"[\s\[<>=!~;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-").replace(".", "-")


def test_every_third_party_import_is_a_declared_dependency():
    """Every import of the packages, tests and benchmarks (module level and inside functions) maps, through the
    installed distributions, to a dependency or an extra of pyproject.toml."""
    tomllib = pytest.importorskip("tomllib", reason="Python 3.10 has no tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {_distribution(r) for r in project["dependencies"]}
    extras = {_distribution(r) for v in project["optional-dependencies"].values() for r in v}
    owners = packages_distributions()
    first_party = {"pretrain_exp", "tests", "benchmarks"}
    missing = []
    for folder in ("pretrain_exp", "frameworks", "evals", "tests", "benchmarks"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top in sys.stdlib_module_names or top in first_party:
                        continue
                    # an optional package that is not installed here (torchao of the fp8 extra) by its own name
                    dists = {_distribution(d) for d in owners.get(top, [])} or {_distribution(top)}
                    if not dists & (core | extras):
                        missing.append(f"{path.relative_to(ROOT)}: {top} ({sorted(dists) or 'not installed'})")
    assert not missing, "imports not declared in pyproject.toml:\n" + "\n".join(sorted(set(missing)))


def test_olmo2_with_texts_as_typed_gets_past_config_and_plan_building(tmp_path, caplog):
    """``python -m pretrain_exp framework=olmo2 insertion=texts`` (tiny preset, 6 steps): no file given, the sample
    texts shipped with the package are planned a quarter each at dup 0/1/4/16, and the log says so."""
    from pretrain_exp.app.experiment import Experiment
    from pretrain_exp.insertion.types.texts import SAMPLE_TEXTS

    cfg = make_config("framework=olmo2", "insertion=texts", "training.num_steps=6", "training.checkpoint_interval=6",
                      "training.num_threads=1", "eval=[insertion_loss]", "wandb=disabled", run_dir=tmp_path / "run")
    with caplog.at_level("INFO"):
        exp = Experiment(cfg)  # model, tokens, order, plan, and the plan verified on OLMo-core's batches
    assert any("no file given, using the sample texts" in r.getMessage() for r in caplog.records)
    items = [json.loads(line) for line in (tmp_path / "run" / "items.jsonl").read_text().splitlines()]
    assert len(items) == 16 and all(str(SAMPLE_TEXTS) in it["source"] for it in items)
    dups = sorted(it["dup_count"] for it in items)
    assert dups == [0] * 4 + [1] * 4 + [4] * 4 + [16] * 4
    assert exp.plan.num_insertions == 4 * (1 + 4 + 16)
