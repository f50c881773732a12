"""The CPDT table's statistics (:func:`pretrain_exp.report.cpdt.interaction_rows`) on simulated per-seed per-item
values: calibration of its verdicts and seed-level interval under no interaction with seed-level noise, its power
and equivalence claims, and the rows it writes (paired Welch intervals, item-count ranges, Holm over rows, no
interval or equivalence test with 2 seeds)."""

from __future__ import annotations

import numpy as np
import pytest

from pretrain_exp.core.stats import adjust, sign_flip_pvalue, welch_interval
from pretrain_exp.report.cpdt import (
    ExperimentValues,
    SeedValues,
    interaction_rows,
    seed_notes,
    seed_rows,
    seeds_needed,
    seeds_warning,
)

LOSS = -1  #: the sign of an insertion-loss effect (the loss gap: dup-0 loss minus dup-d loss)


def simulate(rng: np.random.Generator, n_seeds: int, interaction: float = 0.0, tau: float = 0.02,
             item_sd: float = 0.03, n_items: int = 8, dup: int = 4) -> dict:
    """Per-seed values of one experiment: ``n_items`` items at dup ``dup`` and ``n_items`` dup-0 controls per seed.
    ``alone`` is a per-item loss (nats/token) whose dup-d items are lower by 0.5; the together arm adds, per item,
    a paired difference ``D = (I + u_s) [item inserted] + e``: a true interaction ``I`` on the loss gap (``-I`` on
    the loss), a seed-level shock ``u_s ~ N(0, tau)`` shared by the seed's inserted items (the other experiments
    perturb the trajectory of one seed as a whole) and item noise ``e ~ N(0, item_sd)``."""
    seeds = {}
    for s in range(n_seeds):
        dups = np.repeat([0, dup], n_items)
        alone = rng.normal(3.0, 0.4, dups.size) - 0.5 * (dups > 0)
        shock = rng.normal(0.0, tau)
        d = -(interaction + shock) * (dups > 0) + rng.normal(0.0, item_sd, dups.size)
        seeds[s] = SeedValues(dups, alone + d, alone)
    return {"x": ExperimentValues(LOSS, "nats/token", seeds)}


def pooled(rows):
    return [r for r in rows if r["seed"] == "all"]


@pytest.mark.parametrize("n_seeds", [3, 6, 8])
def test_no_interaction_is_rarely_claimed_and_the_seed_interval_covers_zero(n_seeds):
    """Under no true interaction, with a seed-level shock (tau = 0.02 nats/token) beside the item noise: the verdict
    "interaction" at alpha = 0.05 comes in <= 8% of 400 simulated runs (5% plus Monte-Carlo error); the interval over
    seeds covers 0 in 92-98% of them; with a margin of 0.1 nats/token (4x the per-seed interactions' sd) the
    equivalence test declares "equivalent" in most. An interval over items alone (what the table pooled before)
    excludes 0 in 20-58% of such runs."""
    rng = np.random.default_rng(100 + n_seeds)
    reps, claimed, covered, equivalent = 400, 0, 0, 0
    for k in range(reps):
        (row,) = pooled(interaction_rows(simulate(rng, n_seeds), alpha=0.05, margin=0.1, seed=k))
        claimed += row["verdict"].startswith("interaction")
        covered += row["interaction_ci_low"] <= 0.0 <= row["interaction_ci_high"]
        equivalent += row["tost_p_adjusted"] < 0.05
        assert row["ci_method"] == "t over seeds" and row["n_seeds"] == n_seeds
    assert claimed / reps <= 0.08
    assert 0.92 <= covered / reps <= 0.98
    assert equivalent / reps >= 0.9


def test_a_real_interaction_is_found_with_enough_seeds():
    """A true interaction of 0.06 nats/token (about 2.4 per-seed sd): with 8 seeds the verdict is "interaction" in
    most runs and its interval over seeds excludes 0; with 3 seeds the sign-flip test cannot reach 0.05 (its
    smallest p is 2/2^3 = 0.25), so the verdict is never "interaction"."""
    rng = np.random.default_rng(7)
    found = [pooled(interaction_rows(simulate(rng, 8, interaction=0.06), margin=0.01))[0] for _ in range(40)]
    assert np.mean([r["verdict"].startswith("interaction") for r in found]) >= 0.8
    assert np.mean([r["interaction_ci_low"] > 0 for r in found]) >= 0.8
    assert np.mean([r["interaction"] for r in found]) == pytest.approx(0.06, abs=0.01)  # sign: the loss gap's
    few = [pooled(interaction_rows(simulate(rng, 3, interaction=0.06)))[0] for _ in range(20)]
    assert not any(r["verdict"].startswith("interaction") for r in few)
    assert min(r["p_value"] for r in few) == 0.25


def test_two_seeds_give_no_interval_no_equivalence_and_say_so():
    rows = interaction_rows(simulate(np.random.default_rng(0), 2), margin=1.0)
    (row,) = pooled(rows)
    assert np.isnan(row["interaction_ci_low"]) and np.isnan(row["interaction_ci_high"])
    assert "seed variance not identified" in row["ci_method"]
    assert row["tost_p"] is None and row["tost_p_adjusted"] is None and row["verdict"] == "inconclusive"
    assert row["p_value"] == 0.5 and row["min_p"] == 0.5
    notes = seed_notes(2, 0.05, None)
    assert any("smallest p-value is 2/2^2 = 0.5 > alpha = 0.05" in n and ">= 6 seeds" in n for n in notes)
    assert any("seed variance is not identified" in n for n in notes)
    assert any("cpdt.margin" in n for n in notes)


def test_seeds_needed_for_the_sign_flip_test():
    assert [seeds_needed(0.05, m) for m in (1, 2, 4)] == [6, 7, 8]
    assert seeds_needed(0.01) == 8
    assert seeds_warning(5, 0.05) is not None and seeds_warning(6, 0.05) is None
    assert "after Holm over 2 tests" in seeds_warning(6, 0.05, 2) and seeds_warning(7, 0.05, 2) is None
    assert seed_notes(8, 0.05, 0.05, 2) == []


def test_per_seed_rows_are_paired_welch_intervals_over_items():
    """A per-seed interaction is the loss-gap contrast of the per-item differences together - alone, its interval
    the Welch t interval of that contrast (signs follow the loss gap); a shift common to every item of the seed
    cancels exactly (interaction 0, no spread: no interval, never a zero-width one)."""
    rng = np.random.default_rng(3)
    dups = np.array([0] * 9 + [4] * 7)
    alone = rng.normal(3.0, 0.5, dups.size)
    together = alone + rng.normal(0.0, 0.05, dups.size)
    (row,) = seed_rows("x", 0, SeedValues(dups, together, alone), LOSS, "nats/token")
    d = together - alone
    est, low, high, _ = welch_interval(d[dups == 4], d[dups == 0])
    assert (row["interaction"], row["interaction_ci_low"], row["interaction_ci_high"]) == pytest.approx(
        (-est, -high, -low))
    est, low, high, _ = welch_interval(alone[dups == 4], alone[dups == 0])
    assert (row["effect_alone"], row["effect_alone_ci_low"]) == pytest.approx((-est, -high))
    assert row["interaction"] == pytest.approx(row["effect_together"] - row["effect_alone"])
    assert row["ci_method"] == "Welch t over items (paired by item)"
    assert (row["n_treated"], row["n_control"], row["small_n"]) == (7, 9, True)
    grid = rng.integers(16, 32, dups.size) / 8  # exact in binary: + 0.5 shifts every item by exactly 0.5
    (shifted,) = seed_rows("x", 0, SeedValues(dups, grid + 0.5, grid), LOSS, "nats/token")
    assert shifted["interaction"] == pytest.approx(0.0, abs=1e-12)
    assert np.isnan(shifted["interaction_ci_low"]) and "all values equal" in shifted["ci_method"]


def test_pooled_rows_range_items_over_seeds_and_holm_adjust_over_rows():
    rng = np.random.default_rng(5)
    seeds = {}
    for s, (n_t, n_c) in enumerate([(6, 10), (8, 8), (9, 7)]):
        dups = np.array([0] * n_c + [1] * n_t + [4] * 8)
        alone = rng.normal(3.0, 0.4, dups.size)
        seeds[s] = SeedValues(dups, alone + rng.normal(0.0, 0.05, dups.size), alone)
    exps = simulate(rng, 3) | {"y": ExperimentValues(LOSS, "nats/token", seeds)}
    rows = interaction_rows(exps, margin=0.2)
    pool = pooled(rows)
    assert [(r["experiment"], r["dup_count"]) for r in pool] == [("x", 4), ("y", 1), ("y", 4)]
    y1 = pool[1]
    assert (y1["n_treated_min"], y1["n_treated_max"], y1["n_control_min"], y1["n_control_max"]) == (6, 9, 7, 10)
    assert y1["n_treated"] is None and y1["small_n"]
    for r in pool:
        per_seed = [s["interaction"] for s in rows if s["seed"] != "all" and
                    (s["experiment"], s["dup_count"]) == (r["experiment"], r["dup_count"])]
        assert r["interaction"] == pytest.approx(np.mean(per_seed))
        assert r["p_value"] == sign_flip_pvalue(np.array(per_seed))
    assert [r["p_adjusted"] for r in pool] == adjust([r["p_value"] for r in pool], "holm")
    assert [r["tost_p_adjusted"] for r in pool] == adjust([r["tost_p"] for r in pool], "holm")
    assert all(r["p_adjust_method"] == "holm" for r in pool)
    assert "ci_covers_zero" not in rows[0] and all("ci_covers_zero" not in r for r in rows)
