"""The natural-duplicate audit on real token files with planted natural duplicates, checked against a naive search."""

from __future__ import annotations

import numpy as np
import pytest

from pretrain_exp.data.order import DataOrder
from pretrain_exp.data.token_files import TokenFiles, write_token_file
from pretrain_exp.insertion.audit import (
    AuditResult,
    ItemIndex,
    audit_plan,
    item_contents,
    merge_counts,
    row_blocks,
    scan_rows,
)
from pretrain_exp.insertion.plan import Plan

L, B, EOS = 32, 4, 0
WINDOW_ROWS = np.arange(8, 40)  # steps 3..10


def plan_of(items, dups) -> Plan:
    """A plan with these items (token lists) and dup counts, no spans (the audit reads only items)."""
    lengths = [len(t) for t in items]
    return Plan(L, B, (8 * L, 40 * L), ["exp"], np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
                np.concatenate([np.asarray(t) for t in items]).astype(np.uint32),
                np.zeros(len(items), np.int32), np.asarray(dups, np.int32), np.empty(0, np.int64),
                np.empty(0, np.int32), np.empty(0, np.int32))


def naive_count(rows: np.ndarray, content: np.ndarray) -> int:
    """Occurrences of ``content`` inside the rows (plain sliding comparison)."""
    m = content.size
    return sum(int(np.array_equal(r[o:o + m], content)) for r in rows for o in range(r.size - m + 1))


@pytest.fixture
def corpus(tmp_path):
    """Token files of random tokens in [3, 500) and their order (L=32, B=4, 60 instances)."""
    rng = np.random.default_rng(1)
    tokens = rng.integers(3, 500, size=60 * L).astype(np.int64)
    path = tmp_path / "corpus.npy"

    def write(toks):
        write_token_file(path, [toks[:-1].tolist()], np.dtype(np.uint32), int(toks[-1]))
        return DataOrder(TokenFiles([path], np.uint32), L, B, seed=3)

    return tokens, write


def plant(order, tokens, q, offset, seq):
    """Write ``seq`` into the file tokens so that training-order row ``q`` holds it at ``offset``."""
    _, inst = order.instance(q)
    f, off = order.instance_location(inst)
    tokens[off + offset:off + offset + len(seq)] = seq


def test_planted_duplicates_are_counted_exactly(corpus):
    tokens, write = corpus
    order = write(tokens)
    rng = np.random.default_rng(7)
    a, b, c, short = (rng.integers(600, 900, size=n).tolist() for n in (20, 20, 20, 5))
    spots = [(8, 0), (21, 5), (39, 12)]  # item a three times: row 8 offset 0, ..., the last window row
    for q, o in spots:
        plant(order, tokens, q, o, a)
    plant(order, tokens, 30, 3, b[:15])  # 3 of b's 8 13-grams, no exact occurrence
    plant(order, tokens, 12, 25, short)  # a 5-token item (shorter than n) once
    held = order.held_out_rows(4)
    plant(order, tokens, int(held[1]), 10, a)
    order = write(tokens)
    items = [[EOS] + a + [EOS], [EOS] + b + [EOS], [EOS] + c + [EOS], short]
    plan = plan_of(items, [0, 4, 0, 1])
    res = audit_plan(plan, order.row_tokens, WINDOW_ROWS, held, n=13, strip=EOS, block_tokens=5 * L)
    assert res.window.exact.tolist() == [3, 0, 0, 1]
    assert res.ngrams.tolist() == [8, 8, 8, 0]
    assert res.window.ngram_hits.tolist() == [8, 3, 0, 0]
    assert res.held_out.exact.tolist() == [1, 0, 0, 0]
    assert sorted(res.window.exact_at[0]) == [q * L + o for q, o in spots]
    # an independent oracle over the same rows
    rows = np.stack([order.row_tokens(int(q)) for q in WINDOW_ROWS])
    assert [naive_count(rows, np.asarray(t)) for t in item_contents(plan, EOS)] == res.window.exact.tolist()
    rec = res.item_records(plan)
    assert rec[0] == {"natural_exact": 3, "natural_ngram_overlap": 1.0, "held_out_exact": 1,
                      "held_out_ngram_overlap": 1.0, "effective_dup_count": 3}
    assert rec[1]["natural_ngram_overlap"] == 3 / 8 and rec[1]["effective_dup_count"] == 4
    assert rec[2] == {"natural_exact": 0, "natural_ngram_overlap": 0.0, "held_out_exact": 0,
                      "held_out_ngram_overlap": 0.0, "effective_dup_count": 0}
    assert res.contaminated_controls(plan) == [0]  # item 2 is a control without hits; item 1 is inserted
    msg = res.describe(plan, 0, ["exp[0] a.jsonl:1", "", "", ""])
    assert msg.startswith("item 0 (exp[0] a.jsonl:1): exact occurrence at step 3, row 0, offset 0 (position 256)")


def test_a_degenerate_hash_changes_nothing(corpus):
    """Every candidate is compared token by token: with a multiplier of 0 the hash is the n-gram's last token,
    so almost every window n-gram collides with some item n-gram, yet the counts are the same."""
    tokens, write = corpus
    order = write(tokens)
    rng = np.random.default_rng(2)
    items = [rng.integers(3, 500, size=16).tolist() for _ in range(6)]
    for k, q in enumerate((9, 17, 25)):
        plant(order, tokens, q, 2 * k, items[k])
    order = write(tokens)
    plan = plan_of(items, [0] * 6)
    counts = []
    for mult in (None, np.uint64(0)):
        index = ItemIndex(item_contents(plan, None), 13, **({} if mult is None else {"multiplier": mult}))
        res = scan_rows(index, row_blocks(order.row_tokens, WINDOW_ROWS, L, 7 * L), L)
        counts.append((res.exact.tolist(), res.ngram_hits.tolist(), res.ngram_occurrences.tolist()))
    assert counts[0] == counts[1]
    assert counts[0][0] == [1, 1, 1, 0, 0, 0] and counts[0][1] == [4, 4, 4, 0, 0, 0]


def test_save_and_load_round_trip(corpus, tmp_path):
    tokens, write = corpus
    order = write(tokens)
    item = tokens[order.instance_location(order.instance(10)[1])[1]:][:18].tolist()  # the head of row 10
    plan = plan_of([item, [700] * 14], [0, 2])
    res = audit_plan(plan, order.row_tokens, WINDOW_ROWS, np.empty(0, np.int64))
    assert res.window.exact[0] >= 1 and res.window.exact[1] == 0
    res.save(tmp_path / "audit.json", plan, "on")
    back = AuditResult.load(tmp_path / "audit.json")
    assert back.item_records(plan) == res.item_records(plan) and back.plan_digest == plan.digest()
    assert back.contaminated_controls(plan) == [0] and back.describe(plan, 0) == res.describe(plan, 0)


def test_a_pool_of_processes_counts_what_one_process_counts(corpus):
    """The planted-duplicate corpus scanned by 2 processes over parts of the window: every count and kept
    position equals the one-process scan's (and the planted truth)."""
    tokens, write = corpus
    order = write(tokens)
    rng = np.random.default_rng(7)
    a, b, short = (rng.integers(600, 900, size=n).tolist() for n in (20, 20, 5))
    for q, o in [(8, 0), (21, 5), (39, 12)]:
        plant(order, tokens, q, o, a)
    plant(order, tokens, 30, 3, b[:15])
    plant(order, tokens, 12, 25, short)
    order = write(tokens)
    plan = plan_of([[EOS] + a + [EOS], [EOS] + b + [EOS], short], [0, 4, 1])
    one = audit_plan(plan, order.row_tokens, WINDOW_ROWS, order.held_out_rows(4), n=13, strip=EOS,
                     block_tokens=2 * L)
    two = audit_plan(plan, order.row_tokens, WINDOW_ROWS, order.held_out_rows(4), n=13, strip=EOS,
                     block_tokens=2 * L, workers=2)
    assert two.window.exact.tolist() == one.window.exact.tolist() == [3, 0, 1]
    assert two.window.ngram_hits.tolist() == one.window.ngram_hits.tolist() == [8, 3, 0]
    assert two.window.ngram_occurrences.tolist() == one.window.ngram_occurrences.tolist()
    assert two.window.exact_at == one.window.exact_at and two.window.ngram_at == one.window.ngram_at
    assert (two.window.rows, two.window.tokens) == (one.window.rows, one.window.tokens) == (32, 32 * L)
    assert two.to_json(plan, "on")["items"] == one.to_json(plan, "on")["items"]
    # the cap on kept positions holds across parts: the first positions, as one scan keeps them
    capped = merge_counts(ItemIndex(item_contents(plan, EOS), 13), [one.window, one.window], max_locations=4)
    assert capped.exact_at[0] == one.window.exact_at[0] + one.window.exact_at[0][:1]
    assert capped.exact.tolist() == [6, 0, 2]
