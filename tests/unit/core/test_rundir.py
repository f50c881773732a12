"""``RunDir`` owns the run dir's layout: the layout pinned name by name (a run dir written by an earlier version
must still resume), step folders parsed in one place, no other module spelling a run-dir file name or parsing
``step<N>`` (read from the source with ``ast``), and every path and reader checked against a real tiny OLMo-core
run (checkpoints, HF exports, evals, tables, logs)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from pretrain_exp.core.rundir import RunDir, parse_step, step_dirs, step_name
from tests.unit.core.test_layers import modules

#: the run-dir layout as earlier versions wrote it: RunDir path -> path relative to the run dir
LAYOUT = {
    "config": "config.resolved.yaml", "log_file": "pretrain_exp.log", "lock": ".lock", "hydra_dir": ".hydra",
    "plan": "plan.npz", "manifest": "manifest.jsonl", "items": "items.jsonl", "audit": "audit.json",
    "results": "results.json", "metrics": "metrics.jsonl", "wandb_id": "wandb_id.txt",
    "trainer_log": "trainer_log.csv", "checkpoints": "checkpoints", "olmo_core_work": "olmo_core_work",
    "torchrun_logs": "torchrun", "wandb_dir": "wandb", "plots": "plots", "release": "release", "arms": "arms",
    "hf": "hf", "dynamic": "dynamic", "evals_dir": "evals", "eval_slurm": "evals/slurm",
}
LAYOUT_CALLS = {
    ("hydra_file", "overrides"): ".hydra/overrides.yaml", ("parquet", "manifest"): "manifest.parquet",
    ("parquet", "items"): "items.parquet", ("parquet", "evals"): "evals.parquet",
    ("checkpoint", 12): "checkpoints/step12", ("checkpoint", 3, "checkpoint-"): "checkpoints/checkpoint-3",
    ("rows_log", 1): "rows/rank1.jsonl", ("plot", "loss_vs_dup"): "plots/loss_vs_dup.png",
    ("cpdt_table", "csv"): "cpdt.csv", ("hf_export", 8): "hf/step8", ("additions", 4): "dynamic/step4.json",
    ("eval_dir", 8): "evals/step8", ("evals", 8, "perplexity"): "evals/step8/perplexity.json",
    ("eval_marker", 8): "evals/step8/.async.json", ("eval_log", 8): "evals/step8/async.log",
}


def test_the_layout_is_the_one_earlier_versions_wrote(tmp_path):
    rd = RunDir(tmp_path)
    for attr, rel in LAYOUT.items():
        assert getattr(rd, attr) == tmp_path / rel, attr
    for (method, *args), rel in LAYOUT_CALLS.items():
        assert getattr(rd, method)(*args) == tmp_path / rel, method
    assert rd.arm("alone-bios", 2).path == tmp_path / "arms" / "alone-bios-seed2"
    assert [p.relative_to(tmp_path).as_posix() for p in rd.plan_files()] == [
        "plan.npz", "manifest.jsonl", "items.jsonl", "audit.json", "config.resolved.yaml"]


def test_the_hf_checkpoint_prefix_is_the_trainers():
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    assert RunDir.HF_CHECKPOINT == f"{PREFIX_CHECKPOINT_DIR}-"


@pytest.mark.parametrize("name, prefix, suffix, step", [
    ("step12", "step", "", 12), ("step0", "step", "", 0), ("step", "step", "", None), ("stepX", "step", "", None),
    ("step12a", "step", "", None), ("step-1", "step", "", None), ("step١", "step", "", None),  # Arabic-Indic 1
    ("xstep3", "step", "", None), ("checkpoint-7", "checkpoint-", "", 7), ("step4.json", "step", ".json", 4),
    ("step4.json", "step", "", None), ("step.json", "step", ".json", None),
])
def test_parse_step(name, prefix, suffix, step):
    assert parse_step(name, prefix, suffix) == step
    if step is not None:
        assert step_name(step, prefix, suffix) == name


def test_step_dirs_sorts_by_number_and_needs_the_marker(tmp_path):
    assert step_dirs(tmp_path / "missing") == []
    for n in (10, 2, 1):
        (tmp_path / f"step{n}").mkdir()
        (tmp_path / f"step{n}" / ".metadata.json").write_text("{}")
    (tmp_path / "step3").mkdir()  # a save cut short: no marker
    (tmp_path / "stepX").mkdir()
    (tmp_path / "step7.json").write_text("{}")
    assert [n for n, _ in step_dirs(tmp_path, marker=".metadata.json")] == [1, 2, 10]  # not 1, 10, 2
    assert [n for n, _ in step_dirs(tmp_path)] == [1, 2, 3, 10]
    assert [(n, p.name) for n, p in step_dirs(tmp_path, suffix=".json")] == [(7, "step7.json")]


def test_readers_of_a_run_dir_without_results_yet(tmp_path):
    rd = RunDir(tmp_path)
    assert rd.read_results() is None and rd.read_audit() is None and rd.read_config() is None
    assert rd.read_items() == [] and rd.read_wandb_id() == "" and rd.read_hydra("overrides") is None
    assert rd.eval_steps() == [] and rd.all_evals() == {} and rd.hf_exports() == [] and rd.async_markers() == []
    assert not rd.is_job_dir() and not rd.is_cpdt()
    rd.eval_dir(4).mkdir(parents=True)
    (rd.eval_dir(4) / RunDir.ASYNC_MARKER).write_text(json.dumps({"step": 4, "tasks": ["a", "b"]}))
    rd.evals(4, "a").write_text(json.dumps({"task": "a", "metrics": {"x": 1.0}}))
    assert rd.eval_files(4) == [rd.evals(4, "a")]  # the marker is no result
    assert rd.all_evals() == {4: {"a": {"task": "a", "metrics": {"x": 1.0}}}}
    assert rd.missing_evals(4, ["b", "a"]) == ["b"] and rd.async_markers() == [(4, rd.eval_marker(4))]
    rd.wandb_id.write_text("")  # an empty id file (an older, non-atomic write) counts as absent
    assert rd.read_wandb_id() == ""
    rd.results.write_text("{not json")
    with pytest.raises(ValueError):
        rd.read_results()


# --- nothing else spells the layout -------------------------------------------------------------------------------
#: run-dir file names no module but core/rundir.py spells (a ``<name>`` placeholder of a user's own file is allowed)
FILE_NAMES = [v for k, v in vars(RunDir).items() if k.isupper() and isinstance(v, str) and "." in v
              and v != RunDir.LOCK]
#: run-dir folders no module but core/rundir.py joins onto a path (``x / "evals"``)
FOLDERS = {v for k, v in vars(RunDir).items() if k.isupper() and isinstance(v, str) and "." not in v
           and k not in ("OLMO_CORE_CHECKPOINT", "HF_CHECKPOINT", "SLURM")} | {RunDir.HYDRA}
OWNER = "pretrain_exp.core.rundir"
#: (module, folder) joined onto a path that is not a run dir
NOT_RUN_DIRS = {("pretrain_exp.frameworks.olmo2.convert", "hf")}  # a sub-folder of a temporary dir (mkdtemp)


def _docstrings(tree) -> set:
    return {id(n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)}


def layout_spelled(path: Path, allowed_folders=frozenset()) -> list:
    """Where a module spells the run-dir layout by hand: ``line: what``."""
    tree = ast.parse(path.read_text(), str(path))
    docs = _docstrings(tree)
    out = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            s = node.value
            for name in FILE_NAMES:
                at = s.find(name)
                if at >= 0 and s[at - 1:at] != "<":
                    out.append(f"{line}: {name!r}")
            if s.startswith("step*") or "/step*" in s or "step(\\d" in s or "checkpoint-(\\d" in s:
                out.append(f"{line}: step pattern {s!r}")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.right, ast.Constant):
            if str(node.right.value).split("/")[0] in FOLDERS - allowed_folders:
                out.append(f"{line}: / {node.right.value!r}")
        elif isinstance(node, ast.JoinedStr) and len(node.values) in (2, 3):
            first, rest = node.values[0], node.values[1:]
            if (isinstance(first, ast.Constant) and first.value == "step" and isinstance(rest[0], ast.FormattedValue)
                    and (len(rest) == 1 or (isinstance(rest[1], ast.Constant) and rest[1].value == ".json"))):
                out.append(f"{line}: f\"step{{...}}\"")
        elif (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice)
              and isinstance(node.slice.lower, ast.Constant) and node.slice.lower.value == len("step")
              and isinstance(node.value, ast.Attribute) and node.value.attr in ("name", "stem")):
            out.append(f"{line}: .{node.value.attr}[4:]")
    return out


@pytest.mark.parametrize("lines,want", [
    ([(0, 4, 2), (4, 8, 2)], [(0, 4, 2), (4, 8, 2)]),  # uninterrupted
    ([(0, 4, 2), (4, 8, 2), (4, 8, 1)], [(0, 4, 2), (4, 8, 1)]),  # killed in the second segment, resumed at step 4
    ([(0, 8, 2), (4, 8, 1)], [(0, 4, 2), (4, 8, 1)]),  # resumed from a checkpoint inside the first line's range
    ([(0, 4, 2), (0, 4, 2), (4, 8, 1), (8, 12, 1)], [(0, 4, 2), (4, 8, 1), (8, 12, 1)]),  # a retried segment
    ([(0, 4, 2), (4, 8, 2), (8, 12, 2), (4, 8, 1)], [(0, 4, 2), (4, 8, 1)]),  # resumed before the last two
])
def test_read_layouts_gives_each_steps_last_layout(tmp_path, lines, want):
    """Lines are appended as segments start: a segment trained again supersedes what it trains again."""
    rd = RunDir(tmp_path)
    rd.layouts.write_text("".join(json.dumps({"from_step": a, "to_step": b, "world_size": w}) + "\n"
                                  for a, b, w in lines))
    assert [(r["from_step"], r["to_step"], r["world_size"]) for r in rd.read_layouts()] == want
    assert RunDir(tmp_path / "none").read_layouts() == []


def test_no_module_but_rundir_spells_a_run_dir_name_or_parses_step_n():
    found = {m: spelled for m, p in modules().items()
             if m != OWNER and (spelled := layout_spelled(p, {f for n, f in NOT_RUN_DIRS if n == m}))}
    assert found == {}


#: (benchmark, what) spelled for a file or folder that is not in a run dir: a benchmark's own summary, an items
#: file and a run dir named in a temp dir
NOT_IN_RUN_DIRS = {("first_step.py", "'results.json'"), ("step_overhead.py", "'items.jsonl'"),
                   ("step_overhead.py", "/ 'hf'")}


def test_no_benchmark_spells_a_run_dir_name():
    root = Path(__file__).resolve().parents[3] / "benchmarks"
    found = {p.name: spelled for p in sorted(root.glob("*.py"))
             if (spelled := [s for s in layout_spelled(p) if (p.name, s.split(": ", 1)[1]) not in NOT_IN_RUN_DIRS])}
    assert found == {}


def test_the_source_check_sees_each_way_of_spelling_the_layout(tmp_path):
    src = tmp_path / "m.py"
    src.write_text('"""docstring: config.resolved.yaml, evals/step<N>/ are prose."""\n'
                   'a = run_dir / "results.json"\n'
                   'b = run_dir / "evals" / f"step{s}" / f"{t}.json"\n'
                   'c = int(d.name[4:])\n'
                   'd = re.fullmatch(r"checkpoint-(\\d+)", n)\n'
                   'e = f"step{s}.json"\n'
                   'f = "set x.file=<items.jsonl>"\n'
                   'g = list(p.glob("step*"))\n')
    assert sorted(int(f.split(":")[0]) for f in layout_spelled(src)) == [2, 3, 3, 4, 5, 6, 8]  # not 1 nor 7


# --- a real run dir ------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_run_dir_of_a_tiny_olmo_core_run(tmp_path):
    """Two 2-step segments with kept HF exports and an eval at each: every path RunDir names is where the run put
    it, its readers return what the run wrote, and the framework finds its checkpoints through it."""
    from pretrain_exp.app.launch import launch
    from pretrain_exp.frameworks.olmo_core.framework import COMPLETE
    from pretrain_exp.frameworks.registry import get_framework_class
    from pretrain_exp.insertion.plan import Plan
    from pretrain_exp.report.tables import load_run
    from tests.conftest import make_config
    from tests.unit.frameworks.olmo_core.test_framework import RUN

    cfg = make_config(*RUN, "training.num_steps=4", "eval=[insertion_loss]", "training.export_hf=every",
                      "training.keep_last_checkpoints=0", run_dir=tmp_path / "run")
    results = launch(cfg)
    rd = RunDir(tmp_path / "run")
    on_disk = {p.relative_to(rd.path).as_posix() for p in rd.path.rglob("*")}
    assert {"config.resolved.yaml", "plan.npz", "manifest.jsonl", "items.jsonl", "audit.json", "results.json",
            "metrics.jsonl", "manifest.parquet", "items.parquet", "evals.parquet", "plots/loss_vs_dup.png",
            "evals/step2/insertion_loss.json", "evals/step4/insertion_loss.json", "hf/step2/config.json",
            "hf/step4/config.json", "checkpoints/step2/.metadata.json", "checkpoints/step4/.metadata.json",
            "rows/rank0.jsonl", "olmo_core_work"} <= on_disk

    assert rd.is_job_dir() and not rd.is_cpdt()
    assert rd.read_results() == json.loads((rd.path / "results.json").read_text())
    assert rd.read_results()["step"] == results["step"] == 4
    assert rd.read_config()["training"]["num_steps"] == 4 and rd.read_config()["framework"]["name"] == "olmo_core"
    plan = Plan.load(rd.plan)
    assert results["plan"]["num_items"] == plan.num_items == len(rd.read_items()) == 8
    assert [r["item_id"] for r in rd.read_items()] == list(range(8))
    assert len(rd.read_audit()["items"]) == 8
    assert [s for s, _ in rd.eval_steps()] == [2, 4]
    evals = rd.all_evals()
    assert sorted(evals) == [2, 4] and all(set(tasks) == {"insertion_loss"} for tasks in evals.values())
    assert evals[4]["insertion_loss"] == rd.read_eval(4, "insertion_loss")
    assert evals[4]["insertion_loss"]["metrics"] == results["metrics"]["insertion_loss"]
    assert rd.all_evals(upto=3) == {2: evals[2]} and rd.missing_evals(4, ["insertion_loss", "perplexity"]) == [
        "perplexity"]
    assert [s for s, _ in rd.hf_exports(marker="config.json")] == [2, 4]
    assert [s for s, _ in rd.checkpoint_dirs(RunDir.OLMO_CORE_CHECKPOINT, COMPLETE)] == [2, 4]
    assert sorted(load_run(rd.path)["step"].unique()) == [2, 4]
    assert [json.loads(line)["step"] for line in rd.rows_log(0).read_text().splitlines()] == [1, 2, 3, 4]

    cls = get_framework_class("olmo_core")
    fw = cls(cfg, cls.resolve_model(cfg))  # the framework's view of the same run dir
    assert fw.latest_checkpoint().path == rd.checkpoint(4) and sorted(fw.checkpoints()) == [2, 4]
    assert fw.work_dir == rd.olmo_core_work and any(rd.olmo_core_work.glob("global_indices_*.npy"))
