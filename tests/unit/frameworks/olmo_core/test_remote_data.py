"""An OLMo-core checkpoint whose ``config.json`` lists remote token files (the official ``http://olmo-data.org/``
URL paths, served by a local Range server through ``data.path_prefixes``): OLMo-core's own dataset reads the
window cache (same basenames and sizes), the run fetches only its window plus the size index, and trains the same
rows to the same weights as the run from local copies."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from tests.conftest import CACHE_DIR, make_config
from tests.remote_server import OLMO_DATA, RangeServer, build_mix
from tests.unit.frameworks.olmo2.test_remote_data import no_proxy, prefixes, weights  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

L, B = 64, 4


@pytest.fixture(scope="module")
def remote_checkpoint(tmp_path_factory):
    """The tiny OLMo-3-shaped preset with a ``config.json`` whose dataset is 50 uint32 files of real dolma2 tokens
    at the official URL paths (``L`` = 64, 4 instances per step, data-loader seed 11)."""
    from pretrain_exp.frameworks.olmo_core.presets import tiny_checkpoint

    root = tmp_path_factory.mktemp("official")
    urls = build_mix(root / "srv", tokens_per_file=[300 + 7 * k for k in range(50)], cache_dir=CACHE_DIR)
    ckpt = root / "ckpt"
    shutil.copytree(tiny_checkpoint("olmo3_tiny", CACHE_DIR), ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    config["dataset"].update(paths=urls, sequence_length=L, dtype="uint32")
    config["data_loader"].update(global_batch_size=B * L, seed=11)
    (ckpt / "config.json").write_text(json.dumps(config, indent=2))
    return root, ckpt, urls


def run_config(ckpt, run_dir, prefix: str, items, *extra: str):
    return make_config("framework=olmo_core", "model=local", f"model.path={ckpt}", "model.checkpoint_step=0",
                       prefixes(prefix), *extra,
                       f"cache_dir={run_dir}-cache", "model.tokenizer=dolma2", "insertion=tokens",
                       f"insertion.experiments.tokens.file={items}", "insertion.experiments.tokens.repetitions=2",
                       "eval=[]", "wandb=disabled", "training=tiny", "training.num_steps=2",
                       "training.checkpoint_interval=2", "training.micro_batch_size=2", "training.num_threads=1",
                       "training.log_rows=true", "data.held_out_rows=0", run_dir=run_dir)


@pytest.fixture(scope="module")
def local_run(remote_checkpoint, tmp_path_factory):
    """``(items file, run dir)`` of the run from local copies of the token files."""
    from pretrain_exp.app.experiment import Experiment

    root, ckpt, urls = remote_checkpoint
    d = tmp_path_factory.mktemp("local")
    items = d / "items.jsonl"
    items.write_text("\n".join(json.dumps(list(range(1000 + 9 * i, 1008 + 9 * i))) for i in range(3)) + "\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PRETRAIN_EXP_CACHE", str(CACHE_DIR))  # the tokenizer and corpus assets
        exp = Experiment(run_config(ckpt, d / "local", str(root / "srv") + "/", items))
        assert exp.order.files.dtype.name == "uint32" and not any(exp.order.files.remote)
        exp.run()
    return items, d / "local"


def test_continue_from_remote_config_json_equals_local_copies(remote_checkpoint, local_run, tmp_path, monkeypatch):
    from pretrain_exp.app.experiment import Experiment
    from tests.unit.frameworks.olmo_core.test_framework import trained_rows

    monkeypatch.setenv("PRETRAIN_EXP_CACHE", str(CACHE_DIR))  # the tokenizer and corpus assets
    root, ckpt, urls = remote_checkpoint
    items, local = local_run
    with RangeServer(root / "srv") as srv:
        remote = tmp_path / "remote"
        cfg = run_config(ckpt, remote, srv.base + "/", items, "data.prefetch=window")
        assert cfg.data.paths == urls and cfg.data.paths[0].startswith(OLMO_DATA)
        assert (cfg.training.sequence_length, cfg.training.global_batch_size, cfg.data.seed) == (L, B, 11)
        exp = Experiment(cfg)
        assert all(exp.order.files.remote) and exp.plan.num_insertions > 0
        exp.run()
        heads, fetched = srv.count("HEAD"), srv.bytes_served
    window_bytes = 2 * B * L * 4
    print(f"fetched {fetched} B for a {window_bytes} B window ({fetched / window_bytes:.3f}x), {heads} HEAD requests")
    assert heads == len(urls) and fetched <= 1.1 * window_bytes
    assert trained_rows(remote) == trained_rows(local) and sorted(trained_rows(remote)) == [1, 2]
    a, b = weights(local, 2), weights(remote, 2)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_streamed_window_trains_the_rows_and_weights_of_the_complete_prefetch(remote_checkpoint, local_run, tmp_path,
                                                                              monkeypatch):
    """``data.prefetch=stream`` (the default for remote files) with 30 ms per request: training starts before the
    window is fetched (OLMo-core's loader waits for each instance), and trains the same rows (tokens) to the same
    weights as the run from local copies; the window is fetched once."""
    from pretrain_exp.app.experiment import Experiment
    from tests.unit.frameworks.olmo_core.test_framework import trained_rows

    monkeypatch.setenv("PRETRAIN_EXP_CACHE", str(CACHE_DIR))
    root, ckpt, urls = remote_checkpoint
    items, local = local_run
    with RangeServer(root / "srv", latency_s=0.03) as srv:
        remote = tmp_path / "stream"
        cfg = run_config(ckpt, remote, srv.base + "/", items, "data.prefetch=stream", "data.prefetch_ahead_steps=1")
        exp = Experiment(cfg)
        assert exp.stream is not None and not exp.stream.streaming and exp.order.gate is None  # no process yet
        exp.run()
        assert exp.stream.streaming and exp.order.gate is not None  # started by the loop's first hook
        fetched = srv.bytes_served
    assert json.loads(exp.stream.progress.read_text())["state"] == "done"
    window_bytes = 2 * B * L * 4
    assert window_bytes <= fetched <= 1.1 * window_bytes
    assert trained_rows(remote) == trained_rows(local) and sorted(trained_rows(remote)) == [1, 2]
    a, b = weights(local, 2), weights(remote, 2)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
