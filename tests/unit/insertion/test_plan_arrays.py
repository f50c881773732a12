"""The Plan's arrays on hand-built plans: the token and noise span views, the earlier ``plan.npz`` layout, select,
then and the manifest. Every expectation is written out by hand (L=4, B=2)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pretrain_exp.core.errors import InsertionError
from pretrain_exp.insertion.items import ItemSet, sha256_tokens
from pretrain_exp.insertion.noise import noise_seed
from pretrain_exp.insertion.plan import ARRAYS, Plan, build_plan
from pretrain_exp.insertion.schema import EosPolicy, PlacementConf
from pretrain_exp.insertion.types.tokens import TokensConf

L, B = 4, 2


def mixed_plan(noise_seed: int = 77) -> Plan:
    """Experiments ``a`` (token items 0 = [100, 101, 102], 1 = [200, 201]) and ``n`` (noise item 2, seed 77,
    sigma 0.5; no tokens): item 0 at [5, 8), item 1 at [11, 13) (across rows 2 and 3), a noise copy of item 2 on
    row 6 ([24, 28)) and item 0 again at [33, 36)."""
    return Plan(L, B, (0, 48), ["a", "n"],
                token_offsets=np.array([0, 3, 5, 5], np.int64),
                tokens=np.array([100, 101, 102, 200, 201], np.uint16),
                item_experiment=np.array([0, 0, 1], np.int32), item_dup_count=np.array([2, 1, 1], np.int32),
                span_positions=np.array([5, 11, 24, 33], np.int64),
                span_item_ids=np.array([0, 1, 2, 0], np.int32), span_dup_index=np.array([0, 0, 0, 1], np.int32),
                item_noise_seed=np.array([-1, -1, noise_seed], np.int64), noise_sigma={"n": 0.5})


def test_the_span_views_split_token_and_noise_spans():
    plan = mixed_plan()
    assert plan.span_lengths.dtype == np.int64 and plan.span_lengths.tolist() == [3, 2, 4, 3]
    assert plan.positions.tolist() == [5, 11, 33] and plan.ends.tolist() == [8, 13, 36]
    assert plan.item_ids.tolist() == [0, 1, 0] and plan.dup_index.tolist() == [0, 0, 1]
    assert plan.lengths.tolist() == [3, 2, 3]
    assert plan.noise_rows.dtype == np.int64 and plan.noise_rows.tolist() == [6]
    assert plan.noise_item_ids.tolist() == [2]
    assert plan.noise_dup_index.tolist() == [0]
    assert (plan.num_items, plan.num_insertions) == (3, 3)
    assert plan.affected_rows().tolist() == [1, 2, 3, 8]  # the noise row is not a token span's
    assert plan.item_tokens(1).tolist() == [200, 201] and plan.item_tokens(2).size == 0


def test_a_plan_without_noise_seeds_has_token_items_only():
    plan = mixed_plan()
    tokens_only = Plan(L, B, (0, 48), ["a"], plan.token_offsets[:3], plan.tokens, plan.item_experiment[:2],
                       plan.item_dup_count[:2], np.array([5, 11], np.int64), np.array([0, 1], np.int32),
                       np.array([0, 0], np.int32))
    assert tokens_only.item_noise_seed.dtype == np.int64 and tokens_only.item_noise_seed.tolist() == [-1, -1]
    assert tokens_only.noise_rows.size == 0 and tokens_only.positions.tolist() == [5, 11]


def test_the_earlier_layout_loads_as_the_same_plan(tmp_path):
    """``plan.npz`` written before the span arrays were merged: token spans (``positions``, ``item_ids``,
    ``dup_index``) and noise rows (``noise_rows``, ``noise_item_ids``, ``noise_dup_index``) apart."""
    plan = mixed_plan()
    path = tmp_path / "plan.npz"
    np.savez(path, meta=np.array(json.dumps(plan._meta())), token_offsets=plan.token_offsets, tokens=plan.tokens,
             item_experiment=plan.item_experiment, item_dup_count=plan.item_dup_count,
             item_noise_seed=plan.item_noise_seed, positions=np.array([5, 11, 33], np.int32),
             item_ids=np.array([0, 1, 0], np.int64), dup_index=np.array([0, 0, 1], np.int64),
             noise_rows=np.array([6], np.int64), noise_item_ids=np.array([2], np.int64),
             noise_dup_index=np.array([0], np.int64))
    back = Plan.load(path)
    assert back.digest() == plan.digest()
    for k in ARRAYS:
        a, b = getattr(plan, k), getattr(back, k)
        assert a.dtype == b.dtype and a.tolist() == b.tolist(), k
    assert back.noise_sigma == {"n": 0.5} and back.window == (0, 48)

    # the earliest layout: no noise arrays at all, token spans out of position order
    path = tmp_path / "old.npz"
    np.savez(path, meta=np.array(json.dumps({**plan._meta(), "experiments": ["a"]})),
             token_offsets=plan.token_offsets[:3], tokens=plan.tokens, item_experiment=plan.item_experiment[:2],
             item_dup_count=plan.item_dup_count[:2], positions=np.array([33, 5, 11]),
             item_ids=np.array([0, 0, 1]), dup_index=np.array([1, 0, 0]))
    old = Plan.load(path)
    assert old.span_positions.dtype == np.int64 and old.span_positions.tolist() == [5, 11, 33]
    assert old.span_item_ids.dtype == old.span_dup_index.dtype == np.int32
    assert old.span_item_ids.tolist() == [0, 1, 0] and old.span_dup_index.tolist() == [0, 0, 1]
    assert old.item_noise_seed.tolist() == [-1, -1] and old.noise_rows.size == 0


def later_plan() -> Plan:
    """Experiment ``b`` of a run continuing at token 48: item [300, 301] (``uint32``) at [50, 52) and [61, 63)."""
    return Plan(L, B, (48, 96), ["b"], token_offsets=np.array([0, 2], np.int64),
                tokens=np.array([300, 301], np.uint32), item_experiment=np.array([0], np.int32),
                item_dup_count=np.array([2], np.int32), span_positions=np.array([50, 61], np.int64),
                span_item_ids=np.array([0, 0], np.int32), span_dup_index=np.array([0, 1], np.int32))


def test_select_keeps_the_named_experiments_and_renumbers_their_items():
    plan = mixed_plan()
    noise = plan.select(["n"])
    assert noise.experiments == ["n"] and noise.num_items == 1 and noise.num_insertions == 0
    assert noise.span_positions.tolist() == [24] and noise.noise_rows.tolist() == [6]
    assert noise.span_item_ids.tolist() == [0] and noise.item_noise_seed.tolist() == [77]
    assert noise.noise_sigma == {"n": 0.5} and noise.item_experiment.tolist() == [0]
    tokens = plan.select(np.array([True, False]))
    assert tokens.digest() == plan.select(["a"]).digest() == plan.without(["n"]).digest()
    assert tokens.experiments == ["a"] and tokens.positions.tolist() == [5, 11, 33] and tokens.noise_sigma == {}
    assert tokens.tokens.tolist() == [100, 101, 102, 200, 201] and tokens.noise_rows.size == 0
    with pytest.raises(InsertionError) as e:
        plan.select(np.array([True]))
    assert str(e.value) == "select: mask of shape (1,) for 2 experiments"
    with pytest.raises(InsertionError) as e:
        plan.select(["n", "zz"])
    assert str(e.value) == "cannot select ['zz']: the plan's experiments are ['a', 'n']"


@pytest.mark.parametrize("earlier_first", [True, False])
def test_then_joins_two_plans_keeping_every_span_where_it_was(earlier_first):
    a, b = mixed_plan(), later_plan()
    joined = a.then(b) if earlier_first else b.then(a)
    assert (joined.sequence_length, joined.global_batch_size, joined.window) == (L, B, (0, 96))
    assert joined.span_positions.tolist() == [5, 11, 24, 33, 50, 61]
    assert joined.tokens.dtype == (np.uint16 if earlier_first else np.uint32)  # the first plan's dtype
    assert joined.item_experiment.dtype == joined.item_dup_count.dtype == joined.span_item_ids.dtype == np.int32
    assert joined.noise_rows.tolist() == [6] and joined.noise_sigma == {"n": 0.5}
    assert [joined.item_tokens(int(i)).tolist() for i in joined.span_item_ids] == \
        [[100, 101, 102], [200, 201], [], [100, 101, 102], [300, 301], [300, 301]]
    names = [joined.experiments[joined.item_experiment[i]] for i in joined.span_item_ids]
    assert names == ["a", "a", "n", "a", "b", "b"]
    assert joined.span_dup_index.tolist() == [0, 0, 0, 1, 0, 1]
    assert sorted(joined.item_noise_seed.tolist()) == [-1, -1, -1, 77]
    assert joined.item_dup_count.tolist() == ([2, 1, 1, 2] if earlier_first else [2, 2, 1, 1])


def test_the_manifest_and_item_table_of_token_and_noise_spans(tmp_path):
    """A noise item of seed 0 is a noise item (no sha256, its seed and sigma on every line)."""
    plan = mixed_plan(noise_seed=0)
    items = {"a": ItemSet.from_token_lists("a", [[100, 101, 102], [200, 201]], [2, 1],
                                           sources=["a.jsonl:1", "a.jsonl:2"], texts=["x", "y"]),
             "n": ItemSet("n", np.empty(0, np.int64), np.array([0, 0], np.int64), np.array([1], np.int64),
                          noise_sigma=0.5)}
    path = tmp_path / "run" / "manifest.jsonl"
    path.parent.mkdir()
    table = tmp_path / "elsewhere" / "items.jsonl"
    plan.write_manifest(path, items, natural=[{"natural": k} for k in range(3)],
                        span_fields={24: {"decided_at": 3}}, items_path=table)
    sha0, sha1 = sha256_tokens(np.array([100, 101, 102])), sha256_tokens(np.array([200, 201]))
    span = dict(experiment="a", sha256=sha0, length=3, item_id=0)
    assert [json.loads(x) for x in path.read_text().splitlines()] == [
        dict(position=5, step=1, row=1, offset=1, dup_index=0, **span),
        dict(position=11, step=2, row=0, offset=3, length=2, item_id=1, experiment="a", dup_index=0, sha256=sha1),
        dict(position=24, step=4, row=0, offset=0, length=4, item_id=2, experiment="n", dup_index=0, sha256=None,
             noise_seed=0, sigma=0.5, decided_at=3),
        dict(position=33, step=5, row=0, offset=1, dup_index=1, **span),
    ]
    assert sorted(p.name for p in path.parent.iterdir()) == ["manifest.jsonl"]  # the table went to items_path
    assert [json.loads(x) for x in table.read_text().splitlines()] == [
        dict(item_id=0, experiment="a", index=0, dup_count=2, length=3, sha256=sha0, source="a.jsonl:1",
             natural=0, text="x"),
        dict(item_id=1, experiment="a", index=1, dup_count=1, length=2, sha256=sha1, source="a.jsonl:2",
             natural=1, text="y"),
        dict(item_id=2, experiment="n", index=0, dup_count=1, length=0, sha256=None, source="n:0", natural=2,
             noise_seed=0, sigma=0.5),
    ]


def test_save_load_and_the_digest_saved_records_compare():
    """The digest is kept by the audit and the dynamic decisions of a run and compared when it resumes: the same
    plan has the same digest in every version."""
    plan = mixed_plan()
    assert plan.digest() == "4d7892a4833dcb066c084529beb61cf6f3ffac71c43e2c9fb8c1b28da87a17a6"
    assert plan.select(["a", "n"]).digest() == plan.digest() != plan.select(["a"]).digest()


def test_a_saved_plan_loads_with_its_noise_sigma_or_none(tmp_path):
    plan = mixed_plan()
    plan.save(tmp_path / "plan.npz")
    back = Plan.load(tmp_path / "plan.npz")
    assert back.digest() == plan.digest() and back.noise_sigma == {"n": 0.5}
    tokens = plan.select(["a"])
    tokens.save(tmp_path / "tokens.npz")
    back = Plan.load(tmp_path / "tokens.npz")
    assert back.noise_sigma == {} and back.select(["a"]).digest() == tokens.digest()


def test_without_an_unknown_experiment_is_refused():
    with pytest.raises(InsertionError) as e:
        mixed_plan().without(["a", "zz"])
    assert str(e.value) == "cannot withhold ['zz']: the plan's experiments are ['a', 'n']"


def random_conf() -> TokensConf:
    return TokensConf(file="items.jsonl", eos=EosPolicy.none, placement=PlacementConf(kind="random"))


def test_a_plan_of_no_experiments_is_empty():
    plan = build_plan({}, {}, (0, 64), 16, 2, seed=0, vocab_size=1000)
    assert plan.experiments == [] and plan.num_items == 0 and plan.num_insertions == 0
    assert plan.token_offsets.tolist() == [0] and plan.tokens.size == 0 and plan.item_noise_seed.size == 0
    with pytest.raises(InsertionError) as e:
        build_plan({}, {}, (8, 64), 16, 2, seed=0, vocab_size=1000)
    assert str(e.value) == "training window [8, 64) is not aligned to the sequence length 16"


@pytest.mark.parametrize("noise_name", ["g", "0g"])  # the noise experiment after and before the token one
def test_build_plan_gives_noise_items_whole_rows_and_no_tokens(noise_name):
    L = 8
    items = {"a": ItemSet.from_token_lists("a", [[1, 2, 3], [4, 5]], [2, 1]),
             noise_name: ItemSet(noise_name, np.empty(0, np.int64), np.zeros(3, np.int64), np.array([2, 1]),
                                 noise_sigma=0.25)}
    plan = build_plan(items, {n: random_conf() for n in items}, (0, 16 * L), L, 2, seed=5, vocab_size=1000)
    noise_ids = [plan.experiments.index(noise_name)]
    noise_items = np.flatnonzero(np.isin(plan.item_experiment, noise_ids))
    assert plan.noise_rows.size == 3 and plan.num_insertions == 3
    assert sorted(plan.noise_item_ids.tolist()) == sorted(noise_items.tolist() + [int(noise_items[0])])  # dups 2, 1
    assert plan.item_noise_seed[noise_items].tolist() == [noise_seed(5, noise_name, j) for j in range(2)]
    assert (plan.item_noise_seed[plan.item_noise_seed < 0]).size == 2  # the token items
    assert np.diff(plan.token_offsets)[noise_items].tolist() == [0, 0]
    assert plan.noise_sigma == {noise_name: 0.25}
    assert not set(plan.noise_rows.tolist()) & set(plan.affected_rows().tolist())  # a noise row is its own
    assert (plan.span_positions[np.isin(plan.span_item_ids, noise_items)] % L == 0).all()
    assert plan.tokens.tolist() == [1, 2, 3, 4, 5]  # the token items' only
