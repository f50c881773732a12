"""Property tests (Hypothesis) of the insertion engine: random experiments (lengths, dup counts as ints, fractions
and lists, random/range/explicit placement with steps, every-n-steps and max-per-batch, several experiments in one
run): a valid spec gives a plan whose invariants hold, or is refused because its copies do not fit (the numbers in
the error checked against the spec); an invalid spec is refused with the reason for what is wrong with it, naming
the experiment's key.

Invariants of a plan: spans sorted and non-overlapping, inside the training window and the placement's rows, in
one row unless the experiment allows crossing, exactly ``dup_count`` copies of each item (dup indices
``0..d-1``), the items' tokens stored unchanged, :meth:`Plan.apply` writes exactly the planned tokens, the same
inputs give the same digest, ``save -> load`` keeps the digest, and ``without()`` keeps every other span where
it was.
"""

from __future__ import annotations

import atexit
import math
import re
import shutil
import tempfile
from fractions import Fraction
from pathlib import Path

import numpy as np
from hypothesis import event, given
from hypothesis import strategies as st

from pretrain_exp.core.errors import ConfigError, InsertionError
from pretrain_exp.data.order import step_window
from pretrain_exp.insertion.items import ItemSet, assign_dup_counts, experiment_rng
from pretrain_exp.insertion.plan import Plan, build_plan
from pretrain_exp.insertion.schema import EosPolicy, PlacementConf, RangeUnit
from pretrain_exp.insertion.types.tokens import TokensConf

VOCAB = 1000
_DIR = Path(tempfile.mkdtemp(prefix="plan-properties."))
atexit.register(shutil.rmtree, _DIR, True)


@st.composite
def runs(draw):
    """``(L, B, window, {name: (conf, token lists, explicit positions or None)}, seed, {name: what is invalid})``:
    mostly valid specs (each experiment is made invalid in one of several ways with probability 1/6; the last
    element names the ways of the invalid experiments)."""
    L = draw(st.integers(2, 24), label="L")
    B = draw(st.integers(1, 4), label="B")
    S = draw(st.integers(0, 3), label="start step")
    n_steps = draw(st.integers(1, 6), label="steps")
    window = step_window(S, n_steps, L, B)
    first_row, end_row = window[0] // L, window[1] // L
    names = draw(st.lists(st.sampled_from(["alpha", "beta", "gamma"]), min_size=1, max_size=3, unique=True))
    free_rows = list(range(first_row, end_row))  # rows not yet used by an explicit experiment
    exps, invalid = {}, {}
    for name in names:
        n = draw(st.integers(1, 5), label=f"{name} items")
        kind = draw(st.sampled_from(["random", "range", "explicit"]), label=f"{name} placement")
        bad = draw(st.sampled_from([None] * 5 + ["reps", "steps", "every", "length", "range", "explicit"]),
                   label=f"{name} made invalid")
        if kind == "explicit" and bad is not None:  # the other ways apply to random/range placement
            bad = "explicit"
        if kind != "explicit" and bad == "explicit" or kind == "random" and bad == "range":
            bad = "steps"
        why = {bad} - {None}
        token_lists = [draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=max(1, L // 2)))
                       for _ in range(n)]
        if bad == "length":  # an item longer than a row, with copies
            token_lists[0] = draw(st.lists(st.integers(0, VOCAB - 1), min_size=L + 1, max_size=L + 2))
        pl = PlacementConf(kind=kind)
        reps, positions = 1, None
        if kind == "explicit":
            positions = []
            for tokens in token_lists:
                k = draw(st.integers(0, min(2, len(free_rows))), label="copies")
                rows = draw(st.permutations(free_rows))[:k] if k else []
                free_rows = [r for r in free_rows if r not in rows]
                positions.append([r * L + draw(st.integers(0, max(0, L - len(tokens)))) for r in rows])
            if bad == "explicit":  # outside the window, or overlapping another copy
                positions[0].append(draw(st.sampled_from([window[0] - 1, window[1], *(positions[0][:1] * 2)])))
            pl.allow_row_crossing = draw(st.booleans())
        else:
            reps = draw(st.one_of(st.integers(0, 3), st.floats(0, 3, allow_nan=False).map(lambda x: round(x, 2)),
                                  st.lists(st.integers(0, 3), min_size=1, max_size=n)), label=f"{name} repetitions")
            if bad == "reps":
                reps = draw(st.sampled_from([-1, float("nan"), float("inf"), [], [1, -2], [0] * (n + 1), "two"]))
            if bad == "length":
                reps = draw(st.integers(1, 3))
            if kind == "range":
                if draw(st.booleans(), label="fraction unit"):
                    a, b = sorted(draw(st.lists(st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0]),
                                                min_size=2, max_size=2, unique=True)))
                    pl.start, pl.end = (b, a) if bad == "range" else (a, b)
                else:
                    pl.unit = RangeUnit.position
                    a = draw(st.integers(first_row, end_row - 1))
                    b = draw(st.integers(a + 1, end_row))
                    pl.start, pl.end = float(a * L), float(b * L)
                    if bad == "range":
                        pl.start, pl.end = draw(st.sampled_from([(pl.start + 1, pl.end), (window[0] - L, pl.end),
                                                                 (pl.start, window[1] + L)]))
            sel = draw(st.sampled_from(["all", "steps", "every"]), label="step selection")
            if sel == "steps":
                pl.steps = draw(st.lists(st.integers(S + 1, S + n_steps), min_size=1, max_size=3))
            if sel == "every":
                pl.every_n_steps = draw(st.integers(1, 3))
            if bad == "steps":
                pl.steps = draw(st.sampled_from([[0], [S + n_steps + 1], [S]]))
            if bad == "every":
                pl.steps, pl.every_n_steps = draw(st.sampled_from([([], -1), ([S + 1], 2), ([], n_steps + 1)]))
            pl.max_per_batch = draw(st.integers(-1 if bad else 0, 3))
            if pl.max_per_batch < 0:
                why.add("max_per_batch")
        exps[name] = (TokensConf(file="items.jsonl", eos=EosPolicy.none, repetitions=reps, placement=pl),
                      token_lists, positions)
        if why:
            invalid[name] = why
    return L, B, window, exps, draw(st.integers(0, 2**32 - 1), label="seed"), invalid


def build(L, B, window, exps, seed, dups_out=None):
    """Validate every experiment, assign dup counts and build the plan (the engine's path for loaded items);
    ``dups_out`` (a dict) receives each experiment's dup counts as they are assigned."""
    items, confs = {}, {}
    for name, (conf, token_lists, positions) in exps.items():
        key = f"insertion.experiments.{name}"
        conf.validate(key)
        if positions is not None:
            dups = [len(p) for p in positions]
        else:
            dups = assign_dup_counts(len(token_lists), conf.repetitions, experiment_rng(seed, name),
                                     f"{key}.repetitions")
        if dups_out is not None:
            dups_out[name] = list(dups)
        items[name] = ItemSet.from_token_lists(name, token_lists, dups, positions=positions,
                                               sources=[f"{name}.jsonl:{i + 1}" for i in range(len(token_lists))])
        confs[name] = conf
    return items, build_plan(items, confs, window, L, B, seed, VOCAB)


def check_plan(plan: Plan, items, exps, L, B, window) -> None:
    pos, ends = plan.positions, plan.ends
    assert (np.diff(pos) >= 0).all(), "spans not sorted"
    assert (pos[1:] >= ends[:-1]).all(), "overlapping spans"
    assert (pos >= window[0]).all() and (ends <= window[1]).all(), "span outside the window"
    names = sorted(items)
    assert plan.experiments == names
    first = 0
    for name in names:
        conf, token_lists, positions = exps[name]
        k = names.index(name)
        for i, tokens in enumerate(token_lists):
            gid = first + i
            np.testing.assert_array_equal(plan.item_tokens(gid), tokens)
            assert plan.item_experiment[gid] == k
            mine = np.flatnonzero(plan.item_ids == gid)
            assert mine.size == plan.item_dup_count[gid] == items[name].dup_counts[i], "copy count"
            assert sorted(plan.dup_index[mine].tolist()) == list(range(mine.size))
            if positions is not None:
                assert sorted(pos[mine].tolist()) == sorted(positions[i])
        span = np.flatnonzero(plan.item_experiment[plan.item_ids] == k)
        s, e = pos[span], ends[span]
        pl = conf.placement
        if not pl.allow_row_crossing:
            assert (s // L == (e - 1) // L).all(), "span crosses a row"
        if pl.kind != "explicit":
            rows = s // L
            if pl.kind == "range" and pl.unit == RangeUnit.position:
                assert ((rows >= pl.start // L) & (rows < pl.end // L)).all(), "span outside the range"
            if pl.kind == "range" and pl.unit == RangeUnit.fraction:  # the complete rows inside it
                first_row, n_rows = window[0] // L, (window[1] - window[0]) // L
                lo = first_row + math.ceil(Fraction(str(pl.start)) * n_rows)
                hi = first_row + math.floor(Fraction(str(pl.end)) * n_rows)
                assert ((rows >= lo) & (rows < hi)).all(), "span outside the range"
            steps = rows // B + 1
            if pl.steps:
                assert np.isin(steps, pl.steps).all(), "span outside placement.steps"
            if pl.every_n_steps:
                assert ((steps - window[0] // (L * B)) % pl.every_n_steps == 0).all(), "span off every_n_steps"
            if pl.max_per_batch and steps.size:
                assert np.bincount(steps).max() <= pl.max_per_batch, "more than max_per_batch in a batch"
        first += len(token_lists)
    # apply writes exactly the planned tokens, row by row
    for q in plan.affected_rows()[:8]:
        row = np.full(L, -1, dtype=np.int64)
        plan.apply(int(q), row)
        for i in np.flatnonzero((pos < (q + 1) * L) & (ends > q * L)):
            a, b = max(pos[i], q * L), min(ends[i], (q + 1) * L)
            toks = plan.item_tokens(int(plan.item_ids[i]))
            np.testing.assert_array_equal(row[a - q * L:b - q * L], toks[a - pos[i]:b - pos[i]])


#: what the error says for each way :func:`runs` makes an experiment invalid (``{name}``: the experiment)
REASONS = {
    "reps": r"insertion\.experiments\.{name}\.repetitions: ",
    "steps": r"insertion\.experiments\.{name}\.placement(\.steps)?: ",
    "every": r"insertion\.experiments\.{name}\.placement(\.every_n_steps)?: ",
    "range": r"insertion\.experiments\.{name}\.placement: (range|start|fractions)",
    "max_per_batch": r"insertion\.experiments\.{name}\.placement\.max_per_batch: must be >= 0",
    "length": r"insertion\.experiments\.{name}: a copy of \d+ tokens cannot fit in a row",
    "explicit": r"insertion\.experiments\.{name} item 0 .*(lies outside the training window|\) and )",
}


def eligible_rows(conf, window, L, B) -> list:
    """The training-order rows a random/range experiment may use, computed from the spec as the placement's
    documentation states it (the range's complete rows; steps S+k, S+2k, ... for ``every_n_steps`` k)."""
    pl, first, last = conf.placement, window[0] // L, window[1] // L
    lo, hi = first, last
    if pl.kind == "range" and pl.unit == RangeUnit.fraction:
        lo = first + math.ceil(Fraction(str(pl.start)) * (last - first))
        hi = first + math.floor(Fraction(str(pl.end)) * (last - first))
    elif pl.kind == "range":
        lo, hi = int(pl.start) // L, int(pl.end) // L
    S, n_steps = window[0] // (L * B), (window[1] - window[0]) // (L * B)
    steps = set(pl.steps) if pl.steps else set(range(S + pl.every_n_steps, S + n_steps + 1, pl.every_n_steps)) \
        if pl.every_n_steps else set(range(S + 1, S + n_steps + 1))
    return [q for q in range(lo, hi) if q // B + 1 in steps]


def does_not_fit(msg: str, name: str, exps, dups, L, B, window) -> bool:
    """Whether ``msg`` refuses experiment ``name`` because its copies do not fit where its placement allows, with
    numbers that agree with the spec (``dups``: its assigned dup counts)."""
    conf, token_lists, positions = exps[name]
    if positions is not None or name not in dups:
        return False
    rows = eligible_rows(conf, window, L, B)
    lengths = [len(t) for t, d in zip(token_lists, dups[name]) for _ in range(d)]
    key = f"insertion.experiments.{name}"
    if msg.startswith(f"{key}.placement: ") and ("hold no row" in msg or "holds no complete row" in msg):
        return not rows
    if msg.startswith(f"{key}: a copy of "):
        return int(re.search(r"a copy of (\d+) tokens", msg)[1]) == max(lengths) > L
    m = re.match(rf"{re.escape(key)}: (\d+) tokens to insert do not fit in .* \((\d+) tokens\)", msg)
    if m:
        return int(m[1]) == sum(lengths) > int(m[2]) == len(rows) * L
    m = re.match(rf"{re.escape(key)}: (\d+) copies at most (\d+) per batch need (\d+) batches; "
                 r"the placement allows (\d+)", msg)
    if m:
        batches = len({q // B for q in rows})
        return (int(m[1]) == len(lengths) and int(m[2]) == conf.placement.max_per_batch
                and int(m[4]) == batches and len(lengths) > batches * int(m[2]))
    m = re.match(rf"{re.escape(key)}: could not place (\d+) of (\d+) copies without overlap", msg)
    return bool(m) and int(m[2]) == len(lengths) and 0 < int(m[1]) <= len(lengths)


def check_refusal(e: Exception, run, dups) -> None:
    """A refusal is right if it names an invalid experiment with the reason for what is wrong with it, or if the
    copies of an experiment it names do not fit where its placement allows (:func:`does_not_fit`)."""
    L, B, window, exps, seed, invalid = run
    assert isinstance(e, (ConfigError, InsertionError)), f"{type(e).__name__}: {e}"
    msg = str(e)
    named = set(re.findall(r"insertion\.experiments\.(\w+)", msg)) & set(exps)
    assert named, f"the error names no experiment: {msg}"
    for name in named:
        if any(re.search(REASONS[w].format(name=name), msg) for w in invalid.get(name, ())):
            event(f"refused: {', '.join(sorted(invalid[name]))}")
            return
        if does_not_fit(msg, name, exps, dups, L, B, window):
            event("refused: does not fit")
            return
    raise AssertionError(f"refused for a reason the spec does not give (invalid: {invalid}): {msg}")


def build_or_refuse(run):
    """``(items, plan)`` of a spec that builds, else ``None`` after checking the refusal (:func:`check_refusal`);
    an invalid spec must be refused."""
    L, B, window, exps, seed, invalid = run
    dups = {}
    try:
        out = build(L, B, window, exps, seed, dups)
    except (ConfigError, InsertionError) as e:
        check_refusal(e, run, dups)
        return None
    assert not invalid, f"an invalid spec was not refused: {invalid}"
    return out


@given(run=runs())
def test_a_plan_holds_its_invariants_or_the_spec_is_refused_clearly(run):
    L, B, window, exps, seed, invalid = run
    built = build_or_refuse(run)
    if built is None:
        return
    items, plan = built
    event("plan built" if plan.num_insertions else "plan built (no copies)")
    check_plan(plan, items, exps, L, B, window)
    # deterministic for a seed
    assert build(L, B, window, exps, seed)[1].digest() == plan.digest()
    # save -> load keeps every array
    path = Path(tempfile.mkdtemp(dir=_DIR)) / "plan.npz"
    plan.save(path)
    assert Plan.load(path).digest() == plan.digest()


@given(run=runs(), data=st.data())
def test_without_keeps_every_other_span_where_it_was(run, data):
    built = build_or_refuse(run)
    if built is None:
        return
    plan = built[1]
    assert plan.without([]).digest() == plan.digest()
    gone = data.draw(st.lists(st.sampled_from(plan.experiments), unique=True), label="withheld")
    rest = plan.without(gone)
    assert rest.experiments == [n for n in plan.experiments if n not in gone]
    kept = ~np.isin(np.asarray(plan.experiments)[plan.item_experiment[plan.item_ids]], gone) if plan.num_insertions \
        else np.zeros(0, bool)
    np.testing.assert_array_equal(rest.positions, plan.positions[kept])
    np.testing.assert_array_equal(rest.lengths, plan.lengths[kept])
    np.testing.assert_array_equal(rest.dup_index, plan.dup_index[kept])
    for i in range(rest.num_insertions):
        np.testing.assert_array_equal(rest.item_tokens(int(rest.item_ids[i])),
                                      plan.item_tokens(int(plan.item_ids[np.flatnonzero(kept)[i]])))
    # the kept experiments' plan does not depend on what else was withheld
    assert rest.without([]).digest() == rest.digest()
    assert plan.without(plan.experiments).num_items == 0
    for name in gone:
        assert rest.digest() == plan.without([name]).without([n for n in gone if n != name]).digest()
