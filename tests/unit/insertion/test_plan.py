"""Tests of placement, the insertion Plan (apply, save/load, manifest) and the verifier.

Expectations come from hand computation or from brute-force references (a token-level coverage array of the
whole window; the window materialized as one array with every span written by a plain loop).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
import torch

from pretrain_exp.core.errors import CheckpointError, ConfigError, InsertionError
from pretrain_exp.data.order import DataOrder
from pretrain_exp.data.rows import TrainingRows
from pretrain_exp.data.token_files import TokenFiles, write_token_file
from pretrain_exp.insertion.items import ItemSet, sha256_tokens
from pretrain_exp.insertion.placement import Occupancy, expand_copies
from pretrain_exp.insertion.plan import Plan, build_plan
from pretrain_exp.insertion.schema import (
    EosPolicy,
    InsertionExperimentConf,
    PlacementConf,
    RangeUnit,
)
from pretrain_exp.insertion.types import load_items, validate_experiment
from pretrain_exp.insertion.types.tokens import TokensConf
from pretrain_exp.insertion.verify import verify_plan

VOCAB = 50_000
MANIFEST_FIELDS = {"position", "step", "row", "offset", "length", "item_id", "experiment", "dup_index",
                   "sha256"}


# --- helpers --------------------------------------------------------------------------------------

def conf(kind: str = "random", **placement) -> TokensConf:
    return TokensConf(file="items.jsonl", eos=EosPolicy.none,
                      placement=PlacementConf(kind=kind, **placement))


def make_items(name, lengths, dups, rng, positions=None, low=0, high=VOCAB, text=False):
    n = len(lengths)
    return ItemSet.from_token_lists(
        name, [rng.integers(low, high, size=int(k)).astype(np.int64) for k in lengths], [int(d) for d in dups],
        sources=[f"{name}.jsonl:{i + 1}" for i in range(n)],
        positions=[list(p) for p in positions] if positions is not None else None,
        texts=[f"text {i} of {name}" for i in range(n)] if text else None)


def flatten(items):
    return [it for n in sorted(items) for it in items[n]]


def range_bounds(exp: InsertionExperimentConf, window, L):
    """Token interval ``[a, b)`` a random/range experiment's spans must lie in (independent of row_range)."""
    pl = exp.placement
    w0, w1 = window
    if pl.kind == "random":
        return Fraction(w0), Fraction(w1)
    if pl.unit == RangeUnit.position:
        return Fraction(int(pl.start)), Fraction(int(pl.end))
    width = w1 - w0
    return w0 + Fraction(str(pl.start)) * width, w0 + Fraction(str(pl.end)) * width


def check_invariants(plan: Plan, items, experiments, window, L):
    """Every property the placement docstring promises, checked by brute force."""
    flat = flatten(items)
    names = sorted(items)
    w0, w1 = window
    assert plan.experiments == names
    assert plan.num_items == len(flat)
    # items stored exactly, experiments by sorted name, dup counts kept
    for i, it in enumerate(flat):
        np.testing.assert_array_equal(plan.item_tokens(i), it.tokens)
        assert names[plan.item_experiment[i]] == it.experiment
        assert plan.item_dup_count[i] == it.dup_count
    # positions strictly increasing, lengths from the item
    assert np.all(np.diff(plan.positions) > 0)
    assert plan.lengths.tolist() == [flat[i].tokens.size for i in plan.item_ids]
    # every span in the window, no token covered twice (across ALL experiments)
    cover = np.zeros(w1 - w0, dtype=np.int64)
    for p, e in zip(plan.positions.tolist(), plan.ends.tolist()):
        assert w0 <= p and e <= w1
        cover[p - w0:e - w0] += 1
    assert cover.max(initial=0) <= 1
    assert cover.sum() == sum(flat[i].tokens.size * flat[i].dup_count for i in range(len(flat)))
    # copies per item = dup count; dup indices 0..dup-1
    copies = Counter(plan.item_ids.tolist())
    for i, it in enumerate(flat):
        assert copies.get(i, 0) == it.dup_count
        assert sorted(plan.dup_index[plan.item_ids == i].tolist()) == list(range(it.dup_count))
    for k in range(plan.num_insertions):
        it = flat[plan.item_ids[k]]
        exp = experiments[it.experiment]
        p, e = int(plan.positions[k]), int(plan.ends[k])
        if exp.placement.kind == "explicit":
            assert p == it.positions[plan.dup_index[k]]  # honoured exactly, copy i at positions[i]
            continue
        assert p // L == (e - 1) // L, f"random/range span [{p}, {e}) crosses a row boundary"
        a, b = range_bounds(exp, window, L)
        assert a <= p and e <= b, f"span [{p}, {e}) outside the range [{a}, {b})"


def random_setup(seed: int):
    """A random run: 1-4 experiments of random kinds (random, range by fraction/position, explicit)."""
    rng = np.random.default_rng(seed)
    L = int(rng.choice([16, 32, 64]))
    B = int(rng.choice([1, 2, 4]))
    S, n_steps = int(rng.integers(0, 5)), int(rng.integers(8, 17))
    window = (S * B * L, (S + n_steps) * B * L)
    first_row, rows = S * B, n_steps * B
    names = list(rng.permutation(["beta", "alpha", "delta", "gamma"])[:int(rng.integers(1, 5))])
    kinds = rng.choice(["random", "fraction", "position", "explicit"], size=len(names))
    free_rows = list(rng.permutation(np.arange(first_row, first_row + rows)))  # explicit copies: 1 per row
    explicit_budget = rows // 4  # rows that explicit copies may take, so the rest stays roomy
    items, experiments = {}, {}
    for name, kind in zip(names, kinds):
        if kind == "explicit":
            n = int(rng.integers(1, 4))
            lengths = rng.integers(1, L + 1, size=n)
            positions = []
            for ln in lengths:
                k = min(int(rng.integers(0, 3)), explicit_budget)  # 0 = control
                explicit_budget -= k
                positions.append([int(free_rows.pop()) * L + int(rng.integers(0, L - ln + 1))
                                  for _ in range(k)])
            items[name] = make_items(name, lengths, [len(p) for p in positions], rng, positions)
            experiments[name] = conf("explicit")
            continue
        if kind == "random":
            experiments[name] = conf("random")
            cap_rows = rows
        elif kind == "fraction":
            start = float(rng.choice([0.0, 0.1, 0.25, 0.33, 0.5]))
            end = float(rng.choice([0.75, 0.9, 0.97, 1.0]))
            experiments[name] = conf("range", start=start, end=end, unit=RangeUnit.fraction)
            cap_rows = max(1, rows // 4 - 1)
        else:
            lo = first_row + int(rng.integers(0, rows // 2))
            hi = lo + int(rng.integers(2, rows // 2 + 1))
            experiments[name] = conf("range", start=float(lo * L), end=float(hi * L), unit=RangeUnit.position)
            cap_rows = hi - lo
        n = int(rng.integers(1, 30))
        lengths = rng.integers(1, L // 2, size=n)
        dups = rng.integers(0, 4, size=n)
        while (lengths * dups).sum() > cap_rows * L // 5:  # stay well below the fill limit
            dups[np.argmax(lengths * dups)] -= 1
        items[name] = make_items(name, lengths, dups, rng)
    return items, experiments, window, L, B


# --- placement primitives -------------------------------------------------------------------------

def test_occupancy_conflicts_brute_force():
    rng = np.random.default_rng(0)
    occ = Occupancy()
    cover = np.zeros(2000, dtype=bool)
    for _ in range(5):  # several adds, each of non-overlapping spans
        s = np.sort(rng.choice(np.arange(0, 2000, 20), size=15, replace=False))
        e = s + rng.integers(1, 20, size=15)
        keep = ~occ.conflicts(s, e)
        occ.add(s[keep], e[keep])
        for a, b in zip(s[keep], e[keep]):
            cover[a:b] = True
    assert np.all(np.diff(occ.starts) > 0) and np.all(occ.ends[:-1] <= occ.starts[1:])
    qs = rng.integers(0, 1990, size=500)
    qe = qs + rng.integers(1, 10, size=500)
    want = np.array([cover[a:b].any() for a, b in zip(qs, qe)])
    np.testing.assert_array_equal(occ.conflicts(qs, qe), want)
    one = Occupancy()
    one.add(np.array([10]), np.array([20]))
    qs, qe = np.array([5, 19, 20, 0, 12]), np.array([10, 25, 30, 40, 13])
    assert one.conflicts(qs, qe).tolist() == [False, True, False, True, True]  # touching is not overlapping


def test_expand_copies_item_major():
    dups = np.array([2, 0, 3, 1], dtype=np.int64)
    item, dup = expand_copies(dups)
    assert item.tolist() == [0, 0, 2, 2, 2, 3]
    assert dup.tolist() == [0, 1, 0, 1, 2, 0]


# --- build_plan invariants ------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(20))
def test_build_plan_invariants_random_configs(seed):
    items, experiments, window, L, B = random_setup(seed)
    plan = build_plan(items, experiments, window, L, B, seed=seed, vocab_size=VOCAB)
    check_invariants(plan, items, experiments, window, L)
    again = build_plan(items, experiments, window, L, B, seed=seed, vocab_size=VOCAB)
    assert again.digest() == plan.digest()


def test_random_placement_spread_and_full_rows():
    """Copies land all over the window (uniform rows), offsets reach both ends of [0, L - n]."""
    L, B = 32, 4
    window = (0, 250 * B * L)  # 1000 rows
    rng = np.random.default_rng(1)
    items = {"b": make_items("b", [8] * 2000, [1] * 2000, rng), "a": make_items("a", [L] * 50, [1] * 50, rng)}
    exps = {"a": conf(), "b": conf()}  # the full rows first (sorted names), then 2000 short copies
    plan = build_plan(items, exps, window, L, B, seed=3, vocab_size=VOCAB)
    check_invariants(plan, items, exps, window, L)
    a = plan.positions[plan.item_experiment[plan.item_ids] == 1]
    rows, offs = a // L, a % L
    quarter = np.bincount(rows * 4 // 1000, minlength=4)
    assert quarter.min() > 400 and quarter.max() < 600  # ~500 each
    assert offs.min() == 0 and offs.max() == L - 8
    assert len(np.unique(offs)) == L - 8 + 1
    full = plan.positions[plan.item_experiment[plan.item_ids] == 0]
    assert np.all(full % L == 0)


def test_determinism_and_seed_dependence():
    L, B, window = 32, 2, (0, 20 * 2 * 32)
    rng = np.random.default_rng(5)
    items = {"ex": make_items("ex", [20, 30], [1, 1], rng, [[40], [290]]),
             "zz": make_items("zz", [4] * 40, [2] * 40, rng)}
    experiments = {"ex": conf("explicit"), "zz": conf()}
    p1 = build_plan(items, experiments, window, L, B, seed=7, vocab_size=VOCAB)
    p2 = build_plan(items, experiments, window, L, B, seed=7, vocab_size=VOCAB)
    p3 = build_plan(items, experiments, window, L, B, seed=8, vocab_size=VOCAB)
    assert p1.digest() == p2.digest()
    np.testing.assert_array_equal(p1.positions, p2.positions)
    np.testing.assert_array_equal(p1.item_ids, p2.item_ids)
    assert p1.digest() != p3.digest()
    zz = p1.experiments.index("zz")
    assert not np.array_equal(np.sort(p1.positions[p1.item_experiment[p1.item_ids] == zz]),
                              np.sort(p3.positions[p3.item_experiment[p3.item_ids] == zz]))


def test_adding_a_later_experiment_keeps_earlier_positions():
    """Random experiments are placed in sorted name order, each with its own RNG: adding one that sorts later
    leaves the earlier experiment's items, ids and positions unchanged."""
    L, B, window = 32, 2, (0, 40 * 2 * 32)
    rng = np.random.default_rng(2)
    a = make_items("a", rng.integers(1, 9, size=50), rng.integers(1, 3, size=50), rng)
    b = make_items("b", rng.integers(1, 9, size=50), rng.integers(1, 3, size=50), rng)
    alone = build_plan({"a": a}, {"a": conf()}, window, L, B, seed=0, vocab_size=VOCAB)
    both = build_plan({"a": a, "b": b}, {"a": conf(), "b": conf()}, window, L, B, seed=0, vocab_size=VOCAB)
    in_a = both.item_experiment[both.item_ids] == 0
    np.testing.assert_array_equal(both.positions[in_a], alone.positions)
    np.testing.assert_array_equal(both.item_ids[in_a], alone.item_ids)
    np.testing.assert_array_equal(both.dup_index[in_a], alone.dup_index)
    check_invariants(both, {"a": a, "b": b}, {"a": conf(), "b": conf()}, window, L)


def test_range_placement_bounds():
    L, B = 16, 1
    window = (10 * L, 110 * L)  # 100 rows: 10..109
    rng = np.random.default_rng(4)
    items = {"f": make_items("f", [2] * 15, [1] * 15, rng), "p": make_items("p", [3] * 9, [1] * 9, rng)}
    exps = {"f": conf("range", start=0.255, end=0.29, unit=RangeUnit.fraction),  # rows 10+26 .. 10+29
            "p": conf("range", start=float(50 * L), end=float(53 * L), unit=RangeUnit.position)}
    plan = build_plan(items, exps, window, L, B, seed=0, vocab_size=VOCAB)
    check_invariants(plan, items, exps, window, L)
    rows = plan.positions // L
    f_rows = set(rows[plan.item_experiment[plan.item_ids] == 0].tolist())
    p_rows = set(rows[plan.item_experiment[plan.item_ids] == 1].tolist())
    assert f_rows == {36, 37, 38}  # 0.29 * 100 = 29 exactly (not floor(28.999...)); 0.255 * 100 -> row 26
    assert p_rows == {50, 51, 52}


def test_range_config_errors():
    L, B, window = 16, 1, (0, 10 * 16)
    items = {"r": make_items("r", [4], [1], np.random.default_rng(0))}
    bad = [
        (conf("range", start=0.21, end=0.29, unit=RangeUnit.fraction), "no complete row"),
        (conf("range", start=8.0, end=64.0, unit=RangeUnit.position), "not aligned"),
        (conf("range", start=64.0, end=192.0, unit=RangeUnit.position), "outside the training window"),
    ]
    for exp, msg in bad:
        with pytest.raises(ConfigError, match=msg):
            build_plan(items, {"r": exp}, window, L, B, seed=0, vocab_size=VOCAB)


# --- dup counts through load_items ----------------------------------------------------------------

def load(tmp_path, n, repetitions, seed=0, L=32, name="e"):
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps([i + 1, i + 2, 7]) + "\n" for i in range(n)))
    exp = TokensConf(file=str(path), eos=EosPolicy.none,
                     repetitions=repetitions)
    return exp, load_items(name, exp, tokenizer=None, vocab_size=VOCAB, sequence_length=L, seed=seed)


def plan_copies(tmp_path, exp, items, L=32):
    plan = build_plan({"e": items}, {"e": exp}, (0, 400 * L), L, 4, seed=0, vocab_size=VOCAB)
    check_invariants(plan, {"e": items}, {"e": exp}, (0, 400 * L), L)
    return np.bincount(plan.item_ids, minlength=len(items))


def test_load_items_tokens_exact(tmp_path):
    _, items = load(tmp_path, 3, 1)
    assert [it.tokens.tolist() for it in items] == [[1, 2, 7], [2, 3, 7], [3, 4, 7]]
    assert [it.source for it in items] == [f"{tmp_path / 'e.jsonl'}:{k}" for k in (1, 2, 3)]


@pytest.mark.parametrize("r", [0, 1, 3])
def test_int_repetitions(tmp_path, r):
    exp, items = load(tmp_path, 12, r)
    assert [it.dup_count for it in items] == [r] * 12
    assert plan_copies(tmp_path, exp, items).tolist() == [r] * 12


@pytest.mark.parametrize("n, sizes", [(100, [25, 25, 25, 25]), (10, [3, 3, 2, 2]), (4, [1, 1, 1, 1])])
def test_list_repetitions_equal_groups(tmp_path, n, sizes):
    exp, items = load(tmp_path, n, [0, 1, 4, 16])
    dups = [it.dup_count for it in items]
    assert [dups.count(r) for r in (0, 1, 4, 16)] == sizes
    np.testing.assert_array_equal(plan_copies(tmp_path, exp, items), dups)


def test_list_repetitions_seeded_shuffle(tmp_path):
    d0 = [it.dup_count for it in load(tmp_path, 100, [0, 1, 4, 16], seed=0)[1]]
    d0b = [it.dup_count for it in load(tmp_path, 100, [0, 1, 4, 16], seed=0)[1]]
    d1 = [it.dup_count for it in load(tmp_path, 100, [0, 1, 4, 16], seed=1)[1]]
    assert d0 == d0b and d0 != d1
    assert d0 != [[0, 1, 4, 16][i % 4] for i in range(100)]  # shuffled, not dealt in file order


@pytest.mark.parametrize("n, r, k, extra", [(10, 2.5, 2, 5), (7, 2.5, 2, 4), (7, 1.3, 1, 2), (13, 0.3, 0, 4),
                                            (8, 0.5, 0, 4)])
def test_fractional_repetitions(tmp_path, n, r, k, extra):
    exp, items = load(tmp_path, n, r)
    dups = [it.dup_count for it in items]
    assert sorted(dups) == [k] * (n - extra) + [k + 1] * extra
    np.testing.assert_array_equal(plan_copies(tmp_path, exp, items), dups)


# --- explicit placement ---------------------------------------------------------------------------

def test_explicit_positions_honoured_exactly():
    L, B, window = 16, 2, (2 * 2 * 16, 10 * 2 * 16)  # rows 4..19
    rng = np.random.default_rng(0)
    pos = [[100, 290], [], [64], [116]]
    items = {"x": make_items("x", [12, 5, 16, 4], [2, 0, 1, 1], rng, pos)}
    plan = build_plan(items, {"x": conf("explicit")}, window, L, B, seed=0, vocab_size=VOCAB)
    assert plan.positions.tolist() == [64, 100, 116, 290]
    assert plan.item_ids.tolist() == [2, 0, 3, 0]
    assert plan.dup_index.tolist() == [0, 0, 0, 1]
    assert plan.item_dup_count.tolist() == [2, 0, 1, 1]


def test_explicit_via_load_items(tmp_path):
    path = tmp_path / "ex.jsonl"
    lines = [{"tokens": [5, 6, 7], "position": 40}, {"tokens": [9], "position": [3, 70]}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    exp = TokensConf(file=str(path), key="tokens", eos=EosPolicy.none,
                     placement=PlacementConf(kind="explicit"))
    items = load_items("ex", exp, tokenizer=None, vocab_size=VOCAB, sequence_length=32, seed=0)
    assert [it.dup_count for it in items] == [1, 2]
    plan = build_plan({"ex": items}, {"ex": exp}, (0, 4 * 32), 32, 2, seed=0, vocab_size=VOCAB)
    assert plan.positions.tolist() == [3, 40, 70]
    assert plan.item_ids.tolist() == [1, 0, 1]


def test_explicit_overlap_same_experiment_names_both():
    rng = np.random.default_rng(0)
    items = {"x": make_items("x", [10, 4, 3], [1, 1, 1], rng, [[20], [0], [29]])}
    with pytest.raises(InsertionError, match=r"x item 0 .*x item 2|x item 2 .*x item 0"):
        build_plan(items, {"x": conf("explicit")}, (0, 4 * 32), 32, 1, seed=0, vocab_size=VOCAB)


def test_explicit_overlap_same_item_twice():
    items = {"x": make_items("x", [10], [2], np.random.default_rng(0), [[2, 5]])}
    with pytest.raises(InsertionError, match="overlapping explicit positions"):
        build_plan(items, {"x": conf("explicit")}, (0, 4 * 32), 32, 1, seed=0, vocab_size=VOCAB)


def test_explicit_overlap_across_experiments_names_both():
    rng = np.random.default_rng(0)
    items = {"one": make_items("one", [4, 6], [1, 1], rng, [[0], [50]]),
             "two": make_items("two", [3, 5], [1, 1], rng, [[10], [55]])}
    exps = {"one": conf("explicit"), "two": conf("explicit")}
    with pytest.raises(InsertionError) as e:
        build_plan(items, exps, (0, 4 * 32), 32, 1, seed=0, vocab_size=VOCAB)
    msg = str(e.value)
    assert "insertion.experiments.one item 1" in msg and "insertion.experiments.two item 1" in msg
    assert "[50, 56)" in msg and "[55, 60)" in msg


def test_explicit_touching_spans_are_fine():
    items = {"x": make_items("x", [10, 6], [1, 1], np.random.default_rng(0), [[6], [16]])}
    plan = build_plan(items, {"x": conf("explicit")}, (0, 64), 32, 1, seed=0, vocab_size=VOCAB)
    assert plan.positions.tolist() == [6, 16] and plan.ends.tolist() == [16, 22]


@pytest.mark.parametrize("pos", [[30], [126], [128]])
def test_explicit_outside_window(pos):
    items = {"x": make_items("x", [4], [1], np.random.default_rng(0), [pos])}
    with pytest.raises(InsertionError, match="outside the training window"):
        build_plan(items, {"x": conf("explicit")}, (32, 128), 32, 1, seed=0, vocab_size=VOCAB)


def test_explicit_dup_count_must_match_positions():
    items = {"x": make_items("x", [4, 4], [2, 1], np.random.default_rng(0), [[0], [40, 80]])}
    with pytest.raises(InsertionError, match="x item 0 .*dup count 2 but 1 explicit positions"):
        build_plan(items, {"x": conf("explicit")}, (0, 128), 32, 1, seed=0, vocab_size=VOCAB)


def test_explicit_row_crossing():
    L, B = 16, 2
    window = (0, 8 * L)
    rng = np.random.default_rng(0)
    items = {"x": make_items("x", [6, 6], [1, 1], rng, [[3 * L + 13], [2 * L + 10]])}  # item 1 ends at 48: ok
    with pytest.raises(InsertionError, match="crosses the row boundary at 64.*allow_row_crossing"):
        build_plan(items, {"x": conf("explicit")}, window, L, B, seed=0, vocab_size=VOCAB)
    exp = conf("explicit", allow_row_crossing=True)
    plan = build_plan(items, {"x": exp}, window, L, B, seed=0, vocab_size=VOCAB)
    toks = items["x"][0].tokens
    base = np.full(L, -1, dtype=np.int64)
    r3, r4 = base.copy(), base.copy()
    assert plan.apply(3, r3) == 1 and plan.apply(4, r4) == 1
    np.testing.assert_array_equal(r3[13:], toks[:3])
    np.testing.assert_array_equal(r3[:13], -1)
    np.testing.assert_array_equal(r4[:3], toks[3:])
    np.testing.assert_array_equal(r4[3:], -1)
    assert plan.affected_rows().tolist() == [2, 3, 4]


# --- Plan.apply against a brute-force reference ---------------------------------------------------

L16 = 16
EXPLICIT = [[5 * L16 + 12], [6 * L16 + 4], [6 * L16 + 9], [7 * L16], [9 * L16 + 14, 12 * L16 + 15],
            [43 * L16 + 8]]
EXPLICIT_LENGTHS = [8, 5, 7, 6, 4, 8]
# [92, 100) crosses 5|6; [100, 105) and [105, 112) touch it and each other, the latter ends at the row end;
# [112, 118) starts a row touching it; [158, 162) and [207, 211) cross rows; [696, 704) ends the window


def apply_setup(explicit=EXPLICIT, window=(2 * 2 * L16, 22 * 2 * L16), seed=1):
    """Explicit crossing/touching/edge spans plus many short random spans in rows 14..29 (L=16, B=2);
    rows with 0, 1 and several spans. Item tokens are >= 60000."""
    L, B = L16, 2
    rng = np.random.default_rng(11)
    items = {
        "exp": make_items("exp", EXPLICIT_LENGTHS, [len(p) for p in explicit], rng, explicit, low=60_000,
                          high=70_000),
        "rnd": make_items("rnd", rng.integers(1, 5, size=40), rng.integers(0, 3, size=40), rng, low=60_000,
                          high=70_000),
    }
    exps = {"exp": conf("explicit", allow_row_crossing=True),
            "rnd": conf("range", start=float(14 * L), end=float(30 * L), unit=RangeUnit.position)}
    plan = build_plan(items, exps, window, L, B, seed=seed, vocab_size=100_000)
    flat = flatten(items)
    return plan, flat, items, exps, window, L, B


def brute_force_window(plan, flat, base, lo):
    """``base`` (tokens from position ``lo``) with every planned copy written by a plain loop."""
    out = base.copy()
    for p, i in zip(plan.positions.tolist(), plan.item_ids.tolist()):
        toks = flat[i].tokens
        out[p - lo:p - lo + toks.size] = toks
    return out


def test_apply_matches_brute_force():
    plan, flat, items, exps, window, L, B = apply_setup()
    check_invariants(plan, items, exps, window, L)
    lo, hi = window[0] - 3 * L, window[1] + 3 * L  # also rows outside the window
    base = np.random.default_rng(0).integers(0, 50_000, size=hi - lo)
    want = brute_force_window(plan, flat, base, lo)
    counts = []
    for q in range(lo // L, hi // L):
        row = base[q * L - lo:(q + 1) * L - lo].copy()
        n = plan.apply(q, row)
        np.testing.assert_array_equal(row, want[q * L - lo:(q + 1) * L - lo], err_msg=f"row {q}")
        spans = sum(1 for p, e in zip(plan.positions, plan.ends) if p < (q + 1) * L and e > q * L)
        assert n == spans, f"row {q}"
        counts.append(spans)
        row32 = base[q * L - lo:(q + 1) * L - lo].astype(np.int32)
        assert plan.apply(q, row32) == n
        np.testing.assert_array_equal(row32, want[q * L - lo:(q + 1) * L - lo])
    assert 0 in counts and max(counts) >= 3  # rows with none and rows with several
    assert counts[6 - lo // L] == 3  # row 6: the tail of a crossing span and two touching spans
    assert counts[7 - lo // L] == 1 and counts[43 - lo // L] == 1 and counts[44 - lo // L] == 0
    assert (want != base).sum() == plan.lengths.sum()  # item tokens >= 60000 differ from every base token


def test_apply_on_empty_plan():
    items = {"c": make_items("c", [4, 4], [0, 0], np.random.default_rng(0))}
    plan = build_plan(items, {"c": conf()}, (0, 64), 16, 1, seed=0, vocab_size=VOCAB)
    assert plan.num_insertions == 0 and plan.num_items == 2
    row = np.arange(16)
    assert plan.apply(0, row) == 0 and row.tolist() == list(range(16))
    assert plan.affected_rows().size == 0


# --- save / load / manifest -----------------------------------------------------------------------

PLAN_ARRAYS = ("token_offsets", "tokens", "item_experiment", "item_dup_count", "span_positions", "span_item_ids",
               "span_dup_index", "item_noise_seed")


def test_save_load_round_trip(tmp_path):
    plan, *_ = apply_setup()
    path = tmp_path / "run" / "plan.npz"
    plan.save(path)
    assert sorted(p.name for p in path.parent.iterdir()) == ["plan.npz"]  # no temp file left
    with np.load(path, allow_pickle=False) as z:
        assert set(z.files) == set(PLAN_ARRAYS) | {"meta"}
        assert all(z[k].dtype != object for k in z.files)
    back = Plan.load(path)
    assert back.digest() == plan.digest()
    assert (back.sequence_length, back.global_batch_size, back.window, back.experiments) == \
           (plan.sequence_length, plan.global_batch_size, plan.window, plan.experiments)
    for k in PLAN_ARRAYS + ("positions", "item_ids", "dup_index", "ends", "lengths"):
        a, b = getattr(plan, k), getattr(back, k)
        assert a.dtype == b.dtype, k
        np.testing.assert_array_equal(a, b, err_msg=k)
    assert plan.tokens.dtype == np.uint32  # vocab 100k


def test_digest_sees_changes():
    plan, *_ = apply_setup()
    moved = Plan(plan.sequence_length, plan.global_batch_size, plan.window, plan.experiments,
                 plan.token_offsets, plan.tokens, plan.item_experiment, plan.item_dup_count,
                 plan.positions + 1, plan.item_ids, plan.dup_index)
    assert moved.digest() != plan.digest()


def test_load_bad_files(tmp_path):
    plan, *_ = apply_setup()
    good = tmp_path / "plan.npz"
    plan.save(good)
    data = good.read_bytes()
    (tmp_path / "truncated.npz").write_bytes(data[:len(data) // 2])
    (tmp_path / "garbage.npz").write_bytes(b"not a plan at all" * 10)
    np.savez(tmp_path / "other.npz", x=np.arange(3))
    for name in ("truncated.npz", "garbage.npz", "other.npz", "missing.npz"):
        with pytest.raises(CheckpointError, match="not a readable plan"):
            Plan.load(tmp_path / name)


def test_manifest_and_items_tables(tmp_path):
    L, B = 32, 4
    window = (3 * B * L, 13 * B * L)
    rng = np.random.default_rng(3)
    items = {"bios": make_items("bios", rng.integers(3, 20, size=12), [0, 1, 2, 3] * 3, rng, text=True,
                                low=60_000, high=100_000),
             "codes": make_items("codes", [4, 5], [1, 2], rng,
                                 [[window[0] + 7], [window[0] + 40, window[1] - 5]])}
    exps = {"bios": conf(), "codes": conf("explicit")}
    plan = build_plan(items, exps, window, L, B, seed=0, vocab_size=100_000)
    flat = flatten(items)
    path = tmp_path / "out" / "manifest.jsonl"
    plan.write_manifest(path, items)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(lines) == plan.num_insertions == 3 * (0 + 1 + 2 + 3) + 3
    pairs = set()
    for rec in lines:
        assert set(rec) == MANIFEST_FIELDS
        p = rec["position"]
        assert (rec["step"], rec["row"], rec["offset"]) == ((p // L) // B + 1, (p // L) % B, p % L)
        it = flat[rec["item_id"]]
        assert rec["length"] == it.tokens.size
        assert rec["experiment"] == it.experiment
        assert rec["sha256"] == hashlib.sha256(np.asarray(it.tokens, dtype="<i8").tobytes()).hexdigest()
        assert rec["sha256"] == sha256_tokens(it.tokens)
        pairs.add((rec["item_id"], rec["dup_index"]))
    assert [r["position"] for r in lines] == plan.positions.tolist()
    assert pairs == {(i, d) for i, it in enumerate(flat) for d in range(it.dup_count)}
    codes = [r for r in lines if r["experiment"] == "codes"]
    assert sorted((r["position"], r["step"], r["row"], r["offset"]) for r in codes) == [
        (window[0] + 7, 4, 0, 7), (window[0] + 40, 4, 1, 8), (window[1] - 5, 13, 3, 27)]

    table = [json.loads(x) for x in (path.parent / "items.jsonl").read_text().splitlines()]
    assert len(table) == len(flat) == 14
    for i, (rec, it) in enumerate(zip(table, flat)):
        assert rec["item_id"] == i
        assert (rec["experiment"], rec["index"], rec["dup_count"], rec["length"], rec["source"]) == \
               (it.experiment, it.index, it.dup_count, it.tokens.size, it.source)
        assert rec["sha256"] == sha256_tokens(it.tokens)
        assert rec.get("text") == it.text
    assert sum(r["dup_count"] == 0 for r in table) == 3  # the controls are listed too
    assert sorted(p.name for p in path.parent.iterdir()) == ["items.jsonl", "manifest.jsonl"]


# --- verifier -------------------------------------------------------------------------------------

@pytest.fixture
def verify_setup(tmp_path):
    """Real token files (values < 60000) and a plan (tokens >= 60000) over rows [8, 48) of L=16, B=2."""
    L, B = 16, 2
    path = tmp_path / "corpus.npy"
    n = 60 * L + 5
    write_token_file(path, [list(range(n - 1))], np.dtype(np.uint32), n - 1)
    order = DataOrder(TokenFiles([path], np.uint32), L, B, seed=4)
    explicit = [[9 * L + 12], [20 * L], [20 * L + 5], [21 * L + 10], [30 * L + 14], [40 * L + 1]]
    plan, *_ = apply_setup(explicit, window=(4 * B * L, 24 * B * L), seed=2)  # rows 8..47
    rows = TrainingRows(order, plan, first_row=8, num_rows=40)
    return plan, order, rows


def test_verify_passes(verify_setup):
    plan, order, rows = verify_setup
    report = verify_plan(plan, rows.row, order.row_tokens, (8, 48), untouched_sample=1000)
    affected = {q for p, e in zip(plan.positions.tolist(), plan.ends.tolist())
                for q in range(p // 16, (e - 1) // 16 + 1)}
    assert report.rows_checked == len(affected)
    assert report.spans_checked == plan.num_insertions
    assert report.tokens_inserted == int(plan.lengths.sum())
    assert report.untouched_rows_checked == 40 - len(affected)
    via_getitem = verify_plan(plan, lambda q: rows[q - 8]["input_ids"].numpy(), order.row_tokens, (8, 48))
    assert via_getitem.rows_checked == report.rows_checked


def test_training_rows_getitem(verify_setup):
    plan, order, rows = verify_setup
    assert len(rows) == 40
    item = rows[3]
    assert item["input_ids"].dtype == torch.int64
    assert item["input_ids"].tolist() == item["labels"].tolist() == rows.row(11).tolist()
    with pytest.raises(IndexError):
        rows[40]


def corrupted(rows, order, plan, how):
    """A read_row that gets one thing wrong."""
    L = plan.sequence_length
    k = int(np.flatnonzero((plan.positions // L == (plan.ends - 1) // L) & (plan.positions % L > 0)
                           & (plan.ends % L > 0))[0])  # a span inside one row, not touching its edges
    s, e = int(plan.positions[k]), int(plan.ends[k])
    target = s // L
    crossing = int(np.flatnonzero(plan.positions // L != (plan.ends - 1) // L)[0])
    affected = set(plan.affected_rows().tolist())
    untouched = min(set(range(8, 48)) - affected)
    free = np.ones(L, dtype=bool)  # offsets of the target row outside every span
    for p, q in zip(plan.positions.tolist(), plan.ends.tolist()):
        free[max(p, target * L) - target * L:max(min(q, target * L + L) - target * L, 0)] = False
    outside = int(np.flatnonzero(free)[0])

    def read_row(q):
        row = rows.row(q)
        base = order.row_tokens(q)
        if how == "drop" and q == target:
            row[s % L:e % L] = base[s % L:e % L]
        elif how == "shift" and q == target:
            row[s % L:e % L] = base[s % L:e % L]
            row[s % L + 1:e % L + 1] = plan.item_tokens(int(plan.item_ids[k]))
        elif how == "outside" and q == target:
            row[outside] += 1
        elif how == "untouched" and q == untouched:
            row[5] += 1
        elif how == "half_crossing" and q == int(plan.ends[crossing] - 1) // L:
            cut = int(plan.ends[crossing]) % L
            row[:cut] = base[:cut]
        elif how == "wrong_row":
            row = order.row_tokens(q)
            plan.apply(q + 1, row)
        return row

    assert rows.row(target)[outside] == order.row_tokens(target)[outside]
    return read_row


@pytest.mark.parametrize("how, msg", [
    ("drop", "did not land"), ("shift", "did not land"), ("outside", "outside every planned span"),
    ("untouched", "no planned insertion but changed"), ("half_crossing", "did not land"),
    ("wrong_row", "did not land"),
])
def test_verify_catches_corruption(verify_setup, how, msg):
    plan, order, rows = verify_setup
    with pytest.raises(InsertionError, match=msg):
        verify_plan(plan, corrupted(rows, order, plan, how), order.row_tokens, (8, 48), untouched_sample=1000)


# --- errors: full or misaligned windows -----------------------------------------------------------

def test_window_not_aligned():
    items = {"a": make_items("a", [4], [1], np.random.default_rng(0))}
    for window in [(8, 64), (0, 70)]:
        with pytest.raises(InsertionError, match="not aligned to the sequence length 16"):
            build_plan(items, {"a": conf()}, window, 16, 1, seed=0, vocab_size=VOCAB)


def test_window_too_small_for_tokens():
    items = {"a": make_items("a", [8] * 10, [1] * 10, np.random.default_rng(0))}
    with pytest.raises(InsertionError, match=r"experiments.a: 80 tokens to insert do not fit .*64 tokens"):
        build_plan(items, {"a": conf()}, (0, 64), 16, 1, seed=0, vocab_size=VOCAB)


def test_window_too_full_to_pack():
    """5 copies of 9 tokens fit in 64 tokens by count, but a 16-token row holds only one of them."""
    L = 16
    rng = np.random.default_rng(0)
    items = {"a": make_items("a", [9] * 5, [1] * 5, rng),
             "b": make_items("b", [16] * 4, [1] * 4, rng, [[4 * L], [5 * L], [6 * L], [7 * L]])}
    exps = {"a": conf("range", start=0.0, end=float(4 * L), unit=RangeUnit.position), "b": conf("explicit")}
    with pytest.raises(InsertionError) as e:
        build_plan(items, exps, (0, 8 * L), L, 1, seed=0, vocab_size=VOCAB)
    msg = str(e.value)
    assert "insertion.experiments.a: could not place 1 of 5 copies" in msg
    assert "rows [0, 4) are 56% full" in msg  # 4 x 9 of 64 tokens; the explicit rows 4..7 do not count


def test_random_item_longer_than_row():
    items = {"a": make_items("a", [17], [1], np.random.default_rng(0))}
    with pytest.raises(InsertionError, match="17 tokens cannot fit in a row of 16"):
        build_plan(items, {"a": conf()}, (0, 64), 16, 1, seed=0, vocab_size=VOCAB)


# --- scale ----------------------------------------------------------------------------------------

def test_twenty_thousand_items_at_scale():
    L, B = 64, 8
    window = (100 * B * L, 600 * B * L)  # 4000 rows, 256k tokens
    rng = np.random.default_rng(9)
    n = 20_000
    lengths = rng.integers(2, 12, size=n)
    dups = rng.integers(0, 3, size=n)
    items = {"big": make_items("big", lengths, dups, rng),
             "a_mid": make_items("a_mid", rng.integers(20, 60, size=300), [1] * 300, rng)}
    exps = {"big": conf(), "a_mid": conf("range", start=0.5, end=0.75, unit=RangeUnit.fraction)}
    plan = build_plan(items, exps, window, L, B, seed=0, vocab_size=VOCAB)
    flat = flatten(items)
    assert plan.num_insertions == int(dups.sum()) + 300
    assert np.all(np.diff(plan.positions) > 0) and np.all(plan.ends[:-1] <= plan.positions[1:])
    assert np.all(plan.positions // L == (plan.ends - 1) // L)
    assert plan.positions[0] >= window[0] and plan.ends[-1] <= window[1]
    np.testing.assert_array_equal(np.bincount(plan.item_ids, minlength=len(flat)),
                                  [it.dup_count for it in flat])
    mid = plan.item_experiment[plan.item_ids] == 0
    assert plan.positions[mid].min() >= window[0] + 2000 * L and plan.ends[mid].max() <= window[0] + 3000 * L
    # apply every row of the window against the brute-force reference
    base = np.zeros(window[1] - window[0], dtype=np.int64) - 1
    want = brute_force_window(plan, flat, base, window[0])
    got = np.empty_like(want)
    for q in range(window[0] // L, window[1] // L):
        row = np.full(L, -1, dtype=np.int64)
        plan.apply(q, row)
        got[q * L - window[0]:(q + 1) * L - window[0]] = row
    np.testing.assert_array_equal(got, want)


# --- step-based placement: exact steps, every n-th step, at most k per batch ------------------------------

def _steps_of(plan, B, L):
    return plan.positions // L // B + 1


@pytest.mark.parametrize("seed", range(3))
def test_exact_steps_and_every_n_steps(seed):
    L, B, S, n = 32, 4, 10, 12  # a run continuing step 10 for 12 steps
    window = (S * B * L, (S + n) * B * L)
    rng = np.random.default_rng(seed)
    items = {"a": make_items("a", rng.integers(3, 12, size=6), [2] * 6, rng),
             "b": make_items("b", rng.integers(3, 12, size=6), [1] * 6, rng)}
    exps = {"a": conf(steps=[12, 17, 22]), "b": conf(every_n_steps=4)}
    plan = build_plan(items, exps, window, L, B, seed=seed, vocab_size=VOCAB)
    steps = _steps_of(plan, B, L)
    exp_of = plan.item_experiment[plan.item_ids]
    assert set(steps[exp_of == plan.experiments.index("a")].tolist()) <= {12, 17, 22}
    assert set(steps[exp_of == plan.experiments.index("b")].tolist()) <= {14, 18, 22}  # S+4, S+8, S+12
    check_invariants(plan, items, exps, window, L)


def test_every_n_steps_within_a_range():
    L, B = 32, 2
    window = (0, 40 * B * L)
    rng = np.random.default_rng(0)
    items = {"a": make_items("a", [5] * 8, [1] * 8, rng)}
    exps = {"a": conf("range", start=0.5, end=1.0, every_n_steps=5)}
    plan = build_plan(items, exps, window, L, B, seed=0, vocab_size=VOCAB)
    assert set(_steps_of(plan, B, L).tolist()) <= {25, 30, 35, 40}


@pytest.mark.parametrize("cap", [1, 2])
def test_at_most_k_copies_per_batch(cap):
    L, B = 64, 8
    window = (0, 10 * B * L)
    rng = np.random.default_rng(cap)
    items = {"a": make_items("a", rng.integers(4, 10, size=5), [2] * 5, rng)}  # 10 copies over 10 batches
    plan = build_plan(items, {"a": conf(max_per_batch=cap)}, window, L, B, seed=0, vocab_size=VOCAB)
    _, counts = np.unique(_steps_of(plan, B, L), return_counts=True)
    assert counts.max() <= cap and counts.sum() == 10
    if cap == 1:
        assert counts.size == 10  # one copy in every batch


def test_too_many_copies_for_one_per_batch_is_an_error():
    L, B = 64, 8
    items = {"a": make_items("a", [5] * 11, [1] * 11, np.random.default_rng(0))}
    with pytest.raises(InsertionError, match="11 copies at most 1 per batch need 11 batches; the placement allows 10"):
        build_plan(items, {"a": conf(max_per_batch=1)}, (0, 10 * B * L), L, B, seed=0, vocab_size=VOCAB)


@pytest.mark.parametrize("placement,key,needle", [
    (dict(steps=[3, 99]), "insertion.experiments.a.placement.steps", "steps [99] are outside the run's steps [3, 12]"),
    (dict(steps=[2]), "insertion.experiments.a.placement.steps", "outside the run's steps"),
])
def test_steps_outside_the_run_are_config_errors(placement, key, needle):
    L, B = 32, 2
    items = {"a": make_items("a", [5], [1], np.random.default_rng(0))}
    with pytest.raises(ConfigError) as e:
        build_plan(items, {"a": conf(**placement)}, (2 * B * L, 12 * B * L), L, B, seed=0, vocab_size=VOCAB)
    assert e.value.key == key and needle in str(e.value)


@pytest.mark.parametrize("placement,key", [
    (dict(steps=[0]), "insertion.experiments.x.placement.steps"),
    (dict(every_n_steps=-1), "insertion.experiments.x.placement.every_n_steps"),
    (dict(max_per_batch=-2), "insertion.experiments.x.placement.max_per_batch"),
    (dict(steps=[3], every_n_steps=2), "insertion.experiments.x.placement"),
])
def test_step_placement_options_are_validated(placement, key):
    with pytest.raises(ConfigError) as e:
        validate_experiment("insertion.experiments.x", conf(**placement))
    assert e.value.key == key


def test_an_empty_window_inserts_nothing_so_every_item_is_a_control():
    """An evaluate-only run (``training.num_steps=0``) places nothing: its tables must not show dup counts 1/4/16
    (and an effective dup count of 16) for items that were never inserted."""
    rng = np.random.default_rng(0)
    items = {"ex": make_items("ex", [5] * 8, [0, 1, 4, 16] * 2, rng)}
    plan = build_plan(items, {"ex": conf()}, (4096, 4096), 32, 2, seed=0, vocab_size=VOCAB)
    assert plan.num_insertions == 0 and plan.num_items == 8
    assert plan.item_dup_count.tolist() == [0] * 8
    full = build_plan(items, {"ex": conf()}, (0, 4096), 32, 2, seed=0, vocab_size=VOCAB)
    assert sorted(full.item_dup_count.tolist()) == sorted([0, 1, 4, 16] * 2)


def test_every_insertion_type_has_controls_by_default_and_explicit_placement_needs_no_repetitions_key():
    """One rule across types: each ``conf/insertion`` option's default dup counts include 0 (controls); explicit
    placement takes the counts from the positions whatever ``repetitions`` says."""
    from omegaconf import OmegaConf

    from pretrain_exp.insertion.schema import validate_placement
    from tests.conftest import CONF_DIR

    for path in sorted((CONF_DIR / "insertion").glob("*.yaml")):
        reps = OmegaConf.load(path).get("repetitions")
        if reps is not None:
            assert isinstance(reps, (list, type(OmegaConf.create([])))) and 0 in list(reps), (path.name, reps)
    exp = TokensConf(file="items.jsonl", repetitions=[0, 1, 4, 16],
                     placement=PlacementConf(kind="explicit"))
    validate_placement("insertion.experiments.tokens", exp)


def test_copies_that_do_not_fit_say_how_many_steps_would():
    from pretrain_exp.insertion.placement import place_random

    L, B = 128, 8
    with pytest.raises(InsertionError) as ei:  # 316,000 tokens into 12 steps of 8 x 128 (12,288 tokens)
        place_random(np.full(2500, 126), (0, 96), L, np.random.default_rng(0), Occupancy(), "insertion.experiments.x",
                     B)
    msg = str(ei.value)
    assert "do not fit in rows [0, 96) (12288 tokens)" in msg
    assert "training.num_steps=616" in msg and "fewer items or repetitions" in msg and "\n" not in msg


def test_then_joins_a_continued_runs_plan_after_its_parents():
    """``Plan.then``: the parent's items keep their ids, the child's follow; every span keeps its position and
    writes the same tokens into the same rows; experiments and windows are joined; clashes are refused."""
    rng = np.random.default_rng(7)
    L, B = 64, 4
    first = build_plan({"bios": make_items("bios", [20, 30, 25, 12], [0, 1, 4, 2], rng)}, {"bios": conf()},
                       (0, 40 * L * B), L, B, seed=1, vocab_size=VOCAB)
    later = build_plan({"new": make_items("new", [15, 18], [3, 0], rng)}, {"new": conf()},
                       (40 * L * B, 60 * L * B), L, B, seed=2, vocab_size=VOCAB)
    both = first.then(later)
    assert both.experiments == ["bios", "new"] and both.window == (0, 60 * L * B)
    assert both.num_items == 6 and both.num_insertions == first.num_insertions + later.num_insertions
    assert list(both.item_dup_count) == [0, 1, 4, 2, 3, 0]
    assert list(both.item_experiment) == [0, 0, 0, 0, 1, 1]
    for i in range(4):
        assert np.array_equal(both.item_tokens(i), first.item_tokens(i))
    for i in range(2):
        assert np.array_equal(both.item_tokens(4 + i), later.item_tokens(i))
    assert np.all(np.diff(both.span_positions) >= 0)
    for plan in (first, later):  # each training row gets exactly what its own plan wrote
        for q in plan.affected_rows():
            mine, joined = np.zeros(L, np.int64), np.zeros(L, np.int64)
            plan.apply(int(q), mine)
            both.apply(int(q), joined)
            assert np.array_equal(mine, joined)
    assert both.digest() != first.digest()
    with pytest.raises(InsertionError, match=r"both hold experiment\(s\) \['bios'\]"):
        first.then(first)
    other = build_plan({"new": make_items("new", [15], [1], rng)}, {"new": conf()}, (0, 10 * L * 2), L, 2, seed=2,
                       vocab_size=VOCAB)
    with pytest.raises(InsertionError, match="L x B 64 x 4 and 64 x 2"):
        first.then(other)
