"""Bad insertion items: malformed or missing files, wrong payloads, empty or too long items, token ids outside
the vocabulary."""

from __future__ import annotations

import pytest

from pretrain_exp.core.errors import ConfigError, DataError, InsertionError
from pretrain_exp.core.io import read_jsonl
from pretrain_exp.insertion.schema import (
    PlacementConf,
)
from tests.bad_input import VOCAB, L, assert_error, items_of, write_jsonl


def test_malformed_jsonl_line_names_file_and_line(tmp_path):
    f = write_jsonl(tmp_path / "items.jsonl", [{"text": "a"}, "", '{"text": "b",}', {"text": "c"}])
    with pytest.raises(DataError) as ei:
        list(read_jsonl(f))
    assert_error(ei, f"{f}:3", "malformed JSON")
    with pytest.raises(DataError) as ei:
        items_of(f)
    assert_error(ei, f"{f}:3")


def test_missing_key_names_file_line_and_key(tmp_path):
    f = write_jsonl(tmp_path / "items.jsonl", [{"text": "hello"}, {"txt": "typo"}])
    with pytest.raises(DataError) as ei:
        items_of(f)
    assert_error(ei, f"{f}:2", "'text'", "insertion.experiments.exp.key")


def test_wrong_payload_types(tmp_path):
    f = write_jsonl(tmp_path / "items.jsonl", [{"text": ["not", "a", "string"]}])
    with pytest.raises(DataError) as ei:
        items_of(f)
    assert_error(ei, f"{f}:1", "'text'", "string")
    g = write_jsonl(tmp_path / "tokens.jsonl", [[5, 6], [5, "7"]])
    with pytest.raises(DataError) as ei:
        items_of(g, type_="tokens")
    assert_error(ei, f"{g}:2", "integer token ids")


@pytest.mark.parametrize("type_, line", [("texts", {"text": ""}), ("tokens", [])])
def test_empty_item(tmp_path, type_, line):
    f = write_jsonl(tmp_path / "items.jsonl", [{"text": "ok"} if type_ == "texts" else [5], line])
    with pytest.raises(InsertionError) as ei:
        items_of(f, type_=type_)
    assert_error(ei, "insertion.experiments.exp item 1", f"{f}:2", "empty item")


def test_item_longer_than_sequence_length(tmp_path):
    f = write_jsonl(tmp_path / "items.jsonl", [{"text": "short"}, {"text": "x" * (L + 1)}])
    with pytest.raises(InsertionError) as ei:
        items_of(f)
    assert_error(ei, "item 1", f"{f}:2", f"{L + 1} tokens", f"sequence length {L}")
    # exactly L tokens fits (no room left for the EOS delimiters, which are then dropped)
    (item,) = items_of(write_jsonl(tmp_path / "fits.jsonl", [{"text": "y" * L}]))
    assert item.tokens.size == L


@pytest.mark.parametrize("bad", [VOCAB, VOCAB + 1, 2 ** 70, -1])
def test_token_id_outside_vocabulary(tmp_path, bad):
    """Including an id too large for int64 (was an OverflowError traceback)."""
    f = write_jsonl(tmp_path / "tokens.jsonl", [[5, 6, 7], [5, bad, 7]])
    with pytest.raises(InsertionError) as ei:
        items_of(f, type_="tokens")
    assert_error(ei, "item 1", f"{f}:2", f"token id {bad}", f"[0, {VOCAB})")


def test_missing_items_file(tmp_path):
    f = tmp_path / "nope.jsonl"
    with pytest.raises(DataError) as ei:
        items_of(f)
    assert_error(ei, str(f), "not found")
    with pytest.raises(DataError) as ei:
        list(read_jsonl(tmp_path))  # a folder instead of a file
    assert_error(ei, str(tmp_path), "directory")


def test_non_utf8_items_names_file_and_line(tmp_path):
    f = tmp_path / "items.jsonl"
    f.write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(DataError) as ei:
        items_of(f)
    assert_error(ei, f"{f}:2", "UTF-8")


def test_more_items_requested_than_in_file(tmp_path):
    f = write_jsonl(tmp_path / "items.jsonl", [{"text": "a"}, {"text": "b"}])
    with pytest.raises(ConfigError) as ei:
        items_of(f, num_items=5)
    assert_error(ei, "insertion.experiments.exp.num_items", "2 items", "5")


def test_more_dup_groups_than_items(tmp_path):
    f = write_jsonl(tmp_path / "items.jsonl", [{"text": "a"}, {"text": "b"}])
    with pytest.raises(ConfigError) as ei:
        items_of(f, repetitions=[0, 1, 4])
    assert_error(ei, "insertion.experiments.exp.repetitions", "3 dup-count groups")


@pytest.mark.parametrize("line, needle", [({"text": "a"}, "missing position key 'position'"),
                                          ({"text": "a", "position": -3}, "-3"),
                                          ({"text": "a", "position": [16, "x"]}, "'x'")])
def test_bad_explicit_position_field(tmp_path, line, needle):
    f = write_jsonl(tmp_path / "items.jsonl", [line])
    with pytest.raises(DataError) as ei:
        items_of(f, placement=PlacementConf(kind="explicit"))
    assert_error(ei, f"{f}:1", needle)
