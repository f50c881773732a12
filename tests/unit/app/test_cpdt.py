"""CPDT (continual pretraining dependence testing): the sign-flip test, the ``cpdt.*`` config rules and warning, the
arms' shared placement, the i.i.d. control items, and a tiny end-to-end run (``experiment=cpdt_tiny``) through the
command line and the report CLI. The table's statistics on simulated values are in
``tests/unit/report/test_cpdt_stats.py``."""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from pretrain_exp.core.errors import ConfigError, InsertionError
from pretrain_exp.core.stats import sign_flip_pvalue
from pretrain_exp.insertion.items import ItemSet
from pretrain_exp.insertion.plan import Plan, build_plan
from pretrain_exp.insertion.types.tokens import TokensConf
from tests.conftest import CHECKOUT_PYTHONPATH

ROOT = Path(__file__).resolve().parents[3]


# --- statistics ------------------------------------------------------------------------------------------------

def brute_force_pvalue(x: np.ndarray) -> float:
    """Two-sided sign-flip p-value by listing every sign vector."""
    t = abs(x.mean())
    tol = 1e-12 * max(1.0, float(np.abs(x).max()))
    hits = sum(abs((np.array(s) * x).mean()) >= t - tol for s in itertools.product([1, -1], repeat=x.size))
    return hits / 2 ** x.size


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_sign_flip_pvalue_is_exact(n):
    rng = np.random.default_rng(n)
    for shift in (0.0, 0.5, 2.0):
        for _ in range(10):
            x = rng.normal(shift, 1.0, size=n)
            assert sign_flip_pvalue(x) == brute_force_pvalue(x)
    ones = np.arange(1.0, n + 1)  # all one sign: only the identity and its negation reach |mean|
    assert sign_flip_pvalue(ones) == brute_force_pvalue(ones) == 2 / 2 ** n


def test_sign_flip_monte_carlo_agrees_with_exact():
    x = np.random.default_rng(0).normal(0.4, 1.0, size=12)
    exact = sign_flip_pvalue(x)
    sampled = sign_flip_pvalue(x, samples=20000, seed=3, max_exact=4)
    assert abs(sampled - exact) < 0.02
    assert sampled == sign_flip_pvalue(x, samples=20000, seed=3, max_exact=4)  # seeded


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")]])
def test_sign_flip_rejects_bad_input(bad):
    with pytest.raises(ValueError, match="finite"):
        sign_flip_pvalue(np.array(bad))


# --- the config -----------------------------------------------------------------------------------------------

def compose_cpdt(overrides, tmp_path):
    """``experiment=cpdt_tiny`` with ``overrides``, composed and validated (no run)."""
    from hydra import compose, initialize_config_dir

    from pretrain_exp.app.config import register_configs
    from pretrain_exp.app.validate import to_config

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[f"run_dir={tmp_path / 'run'}", f"cache_dir={tmp_path / 'cache'}",
                                           "experiment=cpdt_tiny", *overrides])
    return to_config(cfg)


@pytest.mark.parametrize("overrides, needles", [
    (["cpdt.margin=0"], ["cpdt.margin", "> 0", "got 0"]),
    (["cpdt.margin=-0.05"], ["cpdt.margin", "-0.05"]),
    (["cpdt.alpha=0"], ["cpdt.alpha", "(0, 1)"]),
    (["cpdt.alpha=1.5"], ["cpdt.alpha", "1.5"]),
])
def test_bad_alpha_or_margin_names_the_key(overrides, needles, tmp_path):
    with pytest.raises(ConfigError) as ei:
        compose_cpdt(overrides, tmp_path)
    text = str(ei.value)
    assert "\n" not in text.strip() and all(n in text for n in needles), text


@pytest.mark.parametrize("seeds, warned", [
    ("[0,1]", "2 seeds: the sign-flip test's smallest p-value is 2/2^2 = 0.5 > alpha = 0.05"),
    ("[0,1,2,3,4,5]", "6 seeds: after Holm over 2 tests the smallest adjusted p-value is 2 x 2/2^6 = 0.0625"),
    ("[0,1,2,3,4,5,6]", None),
])
def test_too_few_seeds_for_alpha_is_a_logged_warning(seeds, warned, tmp_path, caplog):
    """The preset tests 2 rows (bios at dup 4, the i.i.d. control at dup 1), Holm-adjusted: 7 seeds reach 0.05.
    Too few seeds still validate (a warning, not an error), and the preset's margin and alpha come through."""
    with caplog.at_level(logging.WARNING, logger="pretrain_exp.app.validate"):
        cfg = compose_cpdt([f"cpdt.seeds={seeds}"], tmp_path)
    assert (cfg.cpdt.alpha, cfg.cpdt.margin) == (0.05, 0.05)
    messages = [r.getMessage() for r in caplog.records if r.name == "pretrain_exp.app.validate"]
    if warned is None:
        assert messages == []
    else:
        assert len(messages) == 1 and warned in messages[0] and "cpdt.seeds" in messages[0]
        assert caplog.records[-1].levelno == logging.WARNING
    assert compose_cpdt(["cpdt.margin=null"], tmp_path).cpdt.margin is None


# --- the arms' plans -------------------------------------------------------------------------------------------

def test_withheld_experiments_leave_the_others_in_place():
    rng = np.random.default_rng(0)
    L, B, window, vocab = 32, 4, (0, 32 * 4 * 20), 500
    items = {n: ItemSet.from_token_lists(n, [rng.integers(3, vocab, size=int(k)) for k in rng.integers(4, 20, 12)],
                                         [0, 1, 3] * 4) for n in ("a", "b", "c")}
    exps = {n: TokensConf(file="x.jsonl") for n in items}
    plan = build_plan(items, exps, window, L, B, seed=1, vocab_size=vocab)
    alone = plan.without(["a", "c"])
    assert alone.experiments == ["b"] and alone.num_items == 12
    k = plan.experiments.index("b")
    first = int(np.flatnonzero(plan.item_experiment == k)[0])
    mine = plan.item_experiment[plan.item_ids] == k
    np.testing.assert_array_equal(alone.positions, plan.positions[mine])
    np.testing.assert_array_equal(alone.item_ids, plan.item_ids[mine] - first)
    np.testing.assert_array_equal(alone.dup_index, plan.dup_index[mine])
    for i in range(alone.num_items):
        np.testing.assert_array_equal(alone.item_tokens(i), plan.item_tokens(first + i))
        assert alone.item_dup_count[i] == plan.item_dup_count[first + i]
    row = np.zeros(L, dtype=np.int64)
    for q in np.unique(alone.positions // L):  # applying the alone plan writes only b's copies
        written = alone.apply(int(q), row)
        assert written == int(np.sum(alone.positions // L == q))
    assert plan.without([]).digest() == plan.digest()
    with pytest.raises(InsertionError, match="'d'"):
        plan.without(["d"])


# --- end to end ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cpdt_run(tmp_path_factory):
    """``python -m pretrain_exp experiment=cpdt_tiny`` (2 experiments x 2 seeds = 6 arms of 6 steps)."""
    run = tmp_path_factory.mktemp("cpdt") / "run"
    env = dict(os.environ, PYTHONPATH=CHECKOUT_PYTHONPATH)
    proc = subprocess.run([sys.executable, "-m", "pretrain_exp", "experiment=cpdt_tiny", "training.num_threads=1",
                           "wandb=disabled", f"hydra.run.dir={run}"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run, proc.stdout


@pytest.mark.slow
def test_cpdt_table_with_two_seeds_cannot_conclude_and_says_so(cpdt_run):
    """Per seed: Welch intervals over items; pooled over the preset's 2 seeds: means, no interval (seed variance
    not identified), the sign-flip p (0.5 at best), no equivalence test, verdict "inconclusive", and the warnings."""
    run, stdout = cpdt_run
    table = json.loads((run / "cpdt.json").read_text())
    assert "CPDT at step 6" in stdout
    rows = table["rows"]
    assert {(r["experiment"], r["dup_count"], r["seed"]) for r in rows} == {
        (e, d, s) for e, d in (("fictional_bios", 4), ("iid_control", 1)) for s in (0, 1, "all")}
    for r in rows:
        assert r["interaction"] == pytest.approx(r["effect_together"] - r["effect_alone"], abs=1e-9)
        assert "ci_covers_zero" not in r
    for r in (r for r in rows if r["seed"] != "all"):
        for key in ("effect_together", "effect_alone", "interaction"):
            low, v, high = r[f"{key}_ci_low"], r[key], r[f"{key}_ci_high"]
            assert np.isfinite([low, v, high]).all() and low < v < high
        assert r["ci_method"] == "Welch t over items (paired by item)" and (r["n_treated"], r["n_control"]) == (8, 8)
    for r in (r for r in rows if r["seed"] == "all"):
        per_seed = [s for s in rows if s["experiment"] == r["experiment"] and s["seed"] != "all"]
        assert r["interaction"] == pytest.approx(np.mean([s["interaction"] for s in per_seed]))
        assert r["p_value"] == sign_flip_pvalue(np.array([s["interaction"] for s in per_seed])) >= 0.5
        assert r["interaction_ci_low"] is None and "seed variance not identified" in r["ci_method"]  # NaN in JSON
        assert r["tost_p"] is None and r["margin"] == 0.05 and r["verdict"] == "inconclusive"
        assert (r["n_treated_min"], r["n_treated_max"]) == (8, 8)
        assert r["effect_together"] > 0  # inserted items are learned in the tiny run
    assert table["alpha"] == 0.05 and table["n_tests"] == 2 and len(table["notes"]) == 2
    md = (run / "cpdt.md").read_text()
    assert "2 seeds: the sign-flip test's smallest p-value is 2/2^2 = 0.5" in md and "[n/a]" in md
    assert "Holm-adjusted over the 2 experiment x dup count tests" in md
    assert "cpdt.seeds: 2 seeds: the sign-flip test" in stdout  # the warning logged when the run is set up
    assert (run / "cpdt.csv").read_text().startswith("experiment,dup_count,seed,")
    assert (run / "plots" / "cpdt.png").stat().st_size > 0


@pytest.mark.slow
def test_cpdt_arms_share_data_order_and_positions(cpdt_run):
    run, _ = cpdt_run
    for seed in (0, 1):
        together = Plan.load(run / "arms" / f"together-seed{seed}" / "plan.npz")
        tcfg = yaml.safe_load((run / "arms" / f"together-seed{seed}" / "config.resolved.yaml").read_text())
        for name in ("fictional_bios", "iid_control"):
            arm = run / "arms" / f"alone-{name}-seed{seed}"
            acfg = yaml.safe_load((arm / "config.resolved.yaml").read_text())
            for key in ("seed",):
                assert acfg[key] == tcfg[key] == seed
            assert acfg["data"] == tcfg["data"] and acfg["training"] == tcfg["training"]
            assert acfg["insertion"]["withheld"] == [n for n in ("fictional_bios", "iid_control") if n != name]
            alone = Plan.load(arm / "plan.npz")
            assert alone.digest() == together.without(acfg["insertion"]["withheld"]).digest()
            k = together.experiments.index(name)
            mine = together.item_experiment[together.item_ids] == k
            np.testing.assert_array_equal(alone.positions, together.positions[mine])
            np.testing.assert_array_equal(alone.item_dup_count, together.item_dup_count[together.item_experiment == k])


@pytest.mark.slow
def test_iid_control_items_come_from_never_trained_rows(cpdt_run):
    run, _ = cpdt_run
    for seed in (0, 1):
        arm = run / "arms" / f"together-seed{seed}"
        plan = Plan.load(arm / "plan.npz")
        items = [json.loads(line) for line in (arm / "items.jsonl").read_text().splitlines()]
        rows = [int(re.fullmatch(r"corpus:row(\d+)", it["source"])[1]) for it in items
                if it["experiment"] == "iid_control"]
        assert len(rows) == 16 and rows == list(range(rows[0], rows[0] + 16))
        assert rows[0] >= plan.window[1] // plan.sequence_length  # after every trained row of the run
        lengths = [it["length"] for it in items if it["experiment"] == "iid_control"]
        assert set(lengths) == {64}  # chunk_tokens, no EOS added (eos: none)
    first = [it["sha256"] for it in map(json.loads, (run / "arms/together-seed0/items.jsonl").read_text().splitlines())
             if it["experiment"] == "iid_control"]
    other = [it["sha256"] for it in map(json.loads, (run / "arms/together-seed1/items.jsonl").read_text().splitlines())
             if it["experiment"] == "iid_control"]
    assert first != other  # another seed, another data order, other rows


@pytest.mark.slow
def test_report_cli_on_a_cpdt_run(cpdt_run, tmp_path):
    from pretrain_exp import report

    run, _ = cpdt_run
    assert report.main([str(run), "--out", str(tmp_path)]) == 0
    md = (tmp_path / "cpdt.md").read_text()
    assert "| fictional_bios | 4 | all |" in md and "| iid_control | 1 | all |" in md
    assert json.loads((tmp_path / "cpdt.json").read_text())["rows"] == json.loads((run / "cpdt.json").read_text())[
        "rows"]
    jobs = {line.split(",")[0] for line in (tmp_path / "report.csv").read_text().splitlines()[1:]}
    assert jobs == {f"arms/{a}-seed{s}" for a in ("together", "alone-fictional_bios", "alone-iid_control")
                    for s in (0, 1)}
