"""Closed-loop insertion on the tiny model (hf): each segment's additions follow the policy's rule on the saved
insertion losses of the targets (the randomized dup-0 controls are never inserted), land in that segment (verified on
the framework's batches), are in the plan and manifest with the segment that decided them, the results compare the
arms by intent to treat, and a kill between segments re-derives the identical additions and results."""

from __future__ import annotations

import json

import numpy as np
import pytest

import pretrain_exp.insertion.dynamic as dynamic
from pretrain_exp.app.experiment import Experiment
from pretrain_exp.insertion.plan import Plan
from tests.conftest import make_config

B, STEPS, SEG = 4, 6, 2
TINY = ["experiment=tiny", "wandb=disabled", "eval=[insertion_loss]", "training.num_threads=1",
        f"training.num_steps={STEPS}", f"training.checkpoint_interval={SEG}", f"training.global_batch_size={B}",
        "training.micro_batch_size=4", "eval.on_load=true", "insertion.experiments.fictional_bios.num_items=6",
        "insertion.experiments.fictional_bios.repetitions=[0,1]"]
ITEMS = list(range(6))


def _arms(recs) -> tuple:
    """``(targets, controls)``: the controls every decision record names (2 of the 3 static dup-0 items)."""
    controls = recs[min(recs)]["controls"]
    assert all(r["controls"] == controls for r in recs.values()) and len(controls) == 2
    return [i for i in ITEMS if i not in controls], controls


def _losses(run_dir) -> dict:
    return {int(d.name[4:]): dynamic.read_losses(d / "insertion_loss.json") for d in (run_dir / "evals").glob("step*")}


def _records(run_dir) -> dict:
    return {r["decided_at"]: r for r in dynamic.load_additions(run_dir)}


def _check_landed(run_dir, recs):
    """Every addition is a manifest span of its segment, with the segment that decided it."""
    L = 128
    man = [json.loads(line) for line in (run_dir / "manifest.jsonl").read_text().splitlines()]
    dyn = {m["position"]: m for m in man if "decided_at" in m}
    assert sum(len(r["positions"]) for r in recs.values()) == len(dyn) > 0
    for a, r in recs.items():
        assert r["segment"] == [a, a + SEG]
        for p, i in zip(r["positions"], r["item_ids"]):
            m = dyn[p]
            assert (m["item_id"], m["decided_at"], m["segment"]) == (i, a, [a, a + SEG])
            assert a < m["step"] <= a + SEG and m["step"] == p // L // B + 1
    plan = Plan.load(run_dir / "plan.npz")
    static = [m for m in man if "decided_at" not in m]
    assert plan.num_insertions == len(man) and len(static) == 3  # 3 of 6 items at dup 1
    return plan


@pytest.mark.slow
def test_until_memorized_follows_its_rule_and_a_kill_between_segments_rederives_it(tmp_path, monkeypatch,
                                                                                   tiny_model_dir):
    dyn = "insertion.dynamic={policy:until_memorized,threshold:10.3}"
    res_a = Experiment(make_config(*TINY, dyn, run_dir=tmp_path / "a")).run()
    losses, recs = _losses(tmp_path / "a"), _records(tmp_path / "a")
    assert sorted(recs) == [0, 2, 4]
    targets, controls = _arms(recs)
    for a, r in recs.items():  # inserted iff the loss never fell below the threshold at an evaluated step <= a
        want = [i for i in targets if all(losses[s][i] >= 10.3 for s in losses if s <= a)]
        assert r["items"] == want, (a, losses)
    plan = _check_landed(tmp_path / "a", recs)
    table = {row["item_id"]: row for row in res_a["dynamic"]["items"]}
    assert sorted(table) == ITEMS and sorted(i for i in table if table[i]["arm"] == "control") == controls
    for i in ITEMS:
        assert table[i]["dynamic_dups"] == sum(i in r["items"] for r in recs.values())
        assert plan.item_dup_count[i] == table[i]["static_dups"] + table[i]["dynamic_dups"]
    assert plan.item_dup_count[controls].tolist() == [0, 0]
    itt = res_a["dynamic"]["itt"][0]
    assert (itt["n_treated"], itt["n_control"], itt["step"]) == (4, 2, STEPS) and itt["effect_ci_method"] == "Welch t"
    assert 0 < itt["p_value"] <= 1 and itt["effect_ci_low"] <= itt["effect"] <= itt["effect_ci_high"]
    assert any(row["memorized_at_step"] is not None for row in table.values()), losses  # the loop stopped some
    assert any(row["dynamic_dups"] >= 2 for row in table.values()), losses  # and kept inserting others

    real_save = dynamic.save_additions

    def kill_at_4(run_dir, rec):
        if rec["decided_at"] == 4:
            raise KeyboardInterrupt("simulated kill between segments 2 and 3")
        return real_save(run_dir, rec)

    monkeypatch.setattr(dynamic, "save_additions", kill_at_4)
    with pytest.raises(KeyboardInterrupt):
        Experiment(make_config(*TINY, dyn, run_dir=tmp_path / "b")).run()
    assert sorted(_records(tmp_path / "b")) == [0, 2]
    monkeypatch.setattr(dynamic, "save_additions", real_save)
    res_b = Experiment(make_config(*TINY, dyn, run_dir=tmp_path / "b")).run()
    for a in (0, 2, 4):
        assert (tmp_path / "b" / "dynamic" / f"step{a}.json").read_bytes() == \
            (tmp_path / "a" / "dynamic" / f"step{a}.json").read_bytes()
    assert (tmp_path / "b" / "manifest.jsonl").read_bytes() == (tmp_path / "a" / "manifest.jsonl").read_bytes()
    assert Plan.load(tmp_path / "b" / "plan.npz").digest() == plan.digest()
    assert res_b["per_dup"] == res_a["per_dup"] and res_b["dynamic"] == res_a["dynamic"]
    assert _losses(tmp_path / "b") == losses


@pytest.mark.slow
def test_spaced_repetition_reinserts_on_a_loss_rise(tmp_path, tiny_model_dir):
    Experiment(make_config(*TINY, "insertion.dynamic={policy:spaced_repetition,margin:0.0}",
                           run_dir=tmp_path)).run()
    losses, recs = _losses(tmp_path), _records(tmp_path)
    plan = _check_landed(tmp_path, recs)
    static_step = {}
    for m in map(json.loads, (tmp_path / "manifest.jsonl").read_text().splitlines()):
        if "decided_at" not in m:
            static_step[m["item_id"]] = m["step"]
    targets, controls = _arms(recs)
    assert recs[0]["items"] == [i for i in targets if i not in static_step]  # the dup-0 targets first
    for a in (2, 4):  # afterwards: re-inserted iff the loss rose since the eval after its last copy
        want = []
        for i in targets:
            steps = [static_step[i]] if i in static_step else []
            steps += [p // 128 // B + 1 for d, r in recs.items() if d < a
                      for p, j in zip(r["positions"], r["item_ids"]) if j == i]
            last = max([s for s in steps if s <= a], default=None)
            if last is None:
                continue
            ref = losses[min(s for s in losses if s >= last)][i]
            if losses[a][i] - ref > 0.0:
                want.append(i)
        assert recs[a]["items"] == want, (a, losses)
    assert np.all(plan.item_dup_count[targets] >= 1) and plan.item_dup_count[controls].tolist() == [0, 0]
