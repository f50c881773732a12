"""OLMo-core's private members are reached through one adapter, :mod:`pretrain_exp.frameworks.olmo_core.upstream`:
one test per member fails with the member's name and the installed OLMo-core version when an upgrade moves or
changes it; the accessors do on real OLMo-core objects (a loader over small real token files, a dataset config, the
checkpointer callback) what the framework relied on; and no other module reaches those members."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import olmo_core.data as olmo_data
import pytest
from olmo_core.data import data_loader as olmo_loader
from olmo_core.distributed import parallel
from olmo_core.train.callbacks import CheckpointerCallback

from pretrain_exp.data.schedule import rows_for
from pretrain_exp.data.token_files import write_token_file
from pretrain_exp.frameworks.olmo_core import upstream
from pretrain_exp.frameworks.olmo_core.upstream import MEMBERS, Member, OlmoCoreChanged
from tests.unit.core.test_layers import ROOT, modules
from tests.unit.frameworks.olmo_core.test_order import SIZES, B, L, coded, expected, olmo_loader_rank, our_order


@pytest.mark.parametrize("key", sorted(MEMBERS))
def test_member(key):
    """Fails with ``OLMo-core <installed version>: <module.Class.member> is gone | has no parameter(s) ...``."""
    upstream.check_member(key)


def test_the_tested_version_is_the_one_pyproject_pins():
    import tomllib

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["olmo"]
    assert f"ai2-olmo-core=={upstream.TESTED_WITH}" in extra


@pytest.mark.parametrize("owner, attr, replacement, key, why", [
    (olmo_loader.NumpyDataLoaderBase, "_get_dataset_item", None, "_get_dataset_item", "is gone"),
    (olmo_loader.NumpyFSLDataLoader, "_get_local_instance_indices", lambda self, idx: idx,
     "_get_local_instance_indices", "has no parameter(s) ['indices']"),
    (olmo_loader.NumpyFSLDataLoader, "_global_indices_file", lambda self: None, "_global_indices_file",
     "is no longer a property"),
    (CheckpointerCallback, "_save_checkpoint", lambda self, save_async=None: "", "_save_checkpoint",
     "has no parameter(s) ['ephemeral']"),
    (parallel, "_WORLD_MESH", None, "_WORLD_MESH", "is gone"),
])
def test_a_moved_member_is_named_with_the_installed_version(monkeypatch, owner, attr, replacement, key, why):
    if replacement is None:
        monkeypatch.delattr(owner, attr)
    else:
        monkeypatch.setattr(owner, attr, replacement)
    with pytest.raises(OlmoCoreChanged) as e:
        upstream.check_member(key)
    msg = str(e.value)
    assert msg.startswith(f"OLMo-core {upstream.installed_version()}: ") and why in msg
    assert MEMBERS[key].label in msg and f"ai2-olmo-core=={upstream.TESTED_WITH}" in msg
    assert any(key in line for line in upstream.problems())
    monkeypatch.undo()
    upstream.check_member(key)  # checked again, not cached as broken


@pytest.mark.parametrize("kind, why", [("field", "is no longer a field"), ("instance", "is no longer set by"),
                                       ("method", "is gone")])
def test_fields_and_instance_attributes_are_checked_too(kind, why):
    owner = "olmo_core.train.callbacks:CheckpointerCallback" if kind == "field" else \
        "olmo_core.data.data_loader:NumpyFSLDataLoader"
    assert why in upstream.problem_of(Member(owner, "_renamed_upstream", kind, "a test"))
    assert upstream.problem_of(Member("olmo_core.nowhere:X", "_x", "method", "a test")).startswith("cannot be")


def test_an_object_missing_the_member_is_a_clear_error():
    with pytest.raises(OlmoCoreChanged, match=r"NumpyFSLDataLoader\._epoch is missing on this object"):
        upstream.loader_epoch(object())


# --- the accessors on real OLMo-core objects ---------------------------------------------------------------------
@pytest.fixture
def files(tmp_path):
    """Three token files (uint16) whose tokens encode their file and offset (as ``test_order``'s corpus)."""
    stride, dtype = 20_000, np.dtype("uint16")
    paths = []
    for f, n in enumerate(SIZES):
        values = coded(f, np.arange(n), stride)
        paths.append(tmp_path / "data" / f"part-{f:02d}.npy")
        write_token_file(paths[-1], [values[:-1].tolist()], dtype, int(values[-1]))
    return paths


def test_loader_epoch_order_and_rank_slicing(files, tmp_path):
    order = our_order(files, "uint16")
    world = 2
    loaders = [olmo_loader_rank(files, 50_280, tmp_path / "work", world, r) for r in range(world)]
    loader = loaders[1]
    assert upstream.loader_epoch(loader) is None  # before its first reshuffle
    upstream.set_loader_epoch(loader, 2)
    assert upstream.loader_epoch(loader) == 2 and "epoch2" in upstream.global_indices_file(loader).name
    built = upstream.build_global_indices(loader)
    loader.reshuffle(epoch=2, in_memory=True)  # OLMo-core's own public path to the same order
    assert np.array_equal(built, loader.get_global_indices()) and built.dtype == np.uint32
    upstream.set_global_indices(loader, None)
    assert not upstream.global_indices_file(loader).is_file()  # nothing written by any of this
    upstream.set_loader_epoch(loader, 1)
    upstream.set_global_indices(loader, upstream.build_global_indices(loader))
    global_batch = np.asarray(loader.get_global_indices()[:B])
    for r, rank_loader in enumerate(loaders):  # step 1: rank r holds rows rows_for(1, r, 2, B) of our order
        mine = upstream.local_instance_indices(rank_loader, global_batch)
        ids, tokens = expected(order, rows_for(1, r, world, B))
        assert mine.dtype == np.int64 and mine.tolist() == ids
        items = [upstream.dataset_item(rank_loader, i) for i in mine]
        assert [int(it["index"]) for it in items] == ids
        assert np.array_equal(np.stack([it["input_ids"].numpy() for it in items]), tokens.numpy())


def test_resolve_paths_expands_globs_as_olmo_core(files, tmp_path):
    config = olmo_data.NumpyFSLDatasetConfig(
        tokenizer=olmo_data.TokenizerConfig(vocab_size=50_280, eos_token_id=0, pad_token_id=1),
        paths=[str(files[0].parent / "part-*.npy")], expand_glob=True, sequence_length=L, work_dir=str(tmp_path))
    assert upstream.resolve_paths(config) == [str(p) for p in files]


def test_reset_world_mesh(monkeypatch):
    monkeypatch.setattr(parallel, "_WORLD_MESH", "a mesh of an earlier segment")
    upstream.reset_world_mesh()
    assert parallel._WORLD_MESH is None


def test_checkpointer_bookkeeping():
    cb = CheckpointerCallback(save_interval=2)
    assert upstream.latest_checkpoint_step(cb) == -1 and upstream.latest_checkpoint_path(cb) == Path("")
    upstream.saved_checkpoints(cb).append("/runs/r/checkpoints/step2")
    assert cb._checkpoints == ["/runs/r/checkpoints/step2"]  # the callback's own list, not a copy
    upstream.await_last_checkpoint(cb)  # nothing pending: returns at once


# --- nobody else reaches them ------------------------------------------------------------------------------------
def private_reaches(path: Path) -> list:
    """``line: .member`` of every attribute read or write of a :data:`MEMBERS` name in a source file (a subclass's
    override of one, ``def _save_checkpoint``, is a definition: its member's test checks it)."""
    return sorted(f"{n.lineno}: .{n.attr}" for n in ast.walk(ast.parse(path.read_text(), str(path)))
                  if isinstance(n, ast.Attribute) and n.attr in MEMBERS)


def test_no_other_module_reaches_olmo_cores_private_members():
    found = {m: hits for m, path in modules().items()
             if m != upstream.__name__ and (hits := private_reaches(path))}
    assert found == {}


def test_the_source_check_sees_reads_writes_and_super_calls(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("def f(loader, cb):\n    e = loader._epoch\n    loader._global_indices = None\n"
                   "    return super()._save_checkpoint(), cb.latest\n"
                   "class C:\n    def _save_checkpoint(self):\n        return self._own\n")
    assert private_reaches(src) == ["2: ._epoch", "3: ._global_indices", "4: ._save_checkpoint"]
