"""An OLMo-2 checkpoint whose ``config.yaml`` lists the official ``http://olmo-data.org/preprocessed/...`` token-file
URLs, continued with insertions from a local Range server (``data.path_prefixes`` maps the URLs onto it, as onto a
mirror): the run fetches only its window (plus the size index), and trains the same rows to the same weights as
the run from local copies of the files."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.conftest import make_config
from tests.remote_server import MIX_SOURCES, OLMO_DATA, RangeServer
from tests.unit.frameworks.olmo2 import olmo2_checkpoint as fx

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

INSTANCES_PER_FILE = 4


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch):
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="module")
def official(tmp_path_factory):
    """The served folder (50 uint16 token files under the official URL paths, in-vocabulary tokens), the
    checkpoint listing their ``http://olmo-data.org/`` URLs, and its bare tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    root = tmp_path_factory.mktemp("official")
    rels = [f"preprocessed/{folder}/part-{k}-00000.npy" for folder, n in MIX_SOURCES for k in range(n)]
    rng = np.random.default_rng(0)
    for rel in rels:
        n = fx.SEQ_LEN * INSTANCES_PER_FILE + int(rng.integers(0, fx.SEQ_LEN))  # files differ in size, as real ones
        (root / "srv" / rel).parent.mkdir(parents=True, exist_ok=True)
        rng.integers(2, fx.VOCAB, size=n).astype("<u2").tofile(root / "srv" / rel)
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(fx.VOCAB)}, unk_token="t2"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(root / "tokenizer.json"))
    ckpt = fx.write_olmo2_checkpoint(root / "ckpt", [OLMO_DATA + rel for rel in rels], config_changes={
        "tokenizer": {"identifier": str(root / "tokenizer.json")}, "data.instance_filter": None})
    return root, ckpt, len(rels)


def prefixes(new: str) -> str:
    """The command-line form of ``data.path_prefixes={OLMO_DATA: new}`` (Hydra: ``++`` adds a key, ``\\:`` escapes
    the key's colon)."""
    return "++data.path_prefixes={%s: %s}" % (OLMO_DATA.replace(":", "\\:"), new)


def run_config(ckpt, run_dir, prefix: str, items):
    return make_config(
        "framework=olmo2", "model=local", f"model.path={ckpt}", prefixes(prefix), f"cache_dir={run_dir}-cache",
        "insertion=tokens", f"insertion.experiments.tokens.file={items}", "insertion.experiments.tokens.repetitions=2",
        "eval=[]", "wandb=disabled", "training=tiny", "training.num_steps=2", "training.checkpoint_interval=2",
        "training.micro_batch_size=2", "training.num_threads=1", "training.log_rows=true", "data.held_out_rows=0",
        run_dir=run_dir)


def weights(run_dir, step: int) -> dict:
    from pretrain_exp.frameworks.olmo_core.checkpoint import load_model

    return {k: v.clone() for k, v in load_model(run_dir / "checkpoints" / f"step{step}").state_dict().items()}


def test_continue_from_official_urls_equals_local_copies(official, tmp_path):
    from pretrain_exp.app.experiment import Experiment
    from tests.unit.frameworks.olmo_core.test_framework import trained_rows

    root, ckpt, num_files = official
    items = tmp_path / "items.jsonl"
    items.write_text("\n".join(json.dumps(list(range(10 + 5 * i, 18 + 5 * i))) for i in range(3)) + "\n")
    last = fx.STEP + 2

    local = tmp_path / "local"
    exp = Experiment(run_config(ckpt, local, str(root / "srv") + "/", items))
    assert not any(exp.order.files.remote)
    exp.run()

    with RangeServer(root / "srv") as srv:
        remote = tmp_path / "remote"
        cfg = run_config(ckpt, remote, srv.base + "/", items)
        assert cfg.data.paths[0].startswith(OLMO_DATA) and len(cfg.data.paths) == num_files
        exp = Experiment(cfg)
        assert all(exp.order.files.remote) and exp.plan.num_insertions > 0
        exp.run()
        heads = srv.count("HEAD")
        fetched = srv.bytes_served
    window_rows = np.arange(fx.STEP * fx.BATCH, last * fx.BATCH)
    window_bytes = window_rows.size * fx.SEQ_LEN * 2
    print(f"fetched {fetched} B for a {window_bytes} B window ({fetched / window_bytes:.3f}x), {heads} HEAD requests")
    assert heads == num_files  # the size index: one HEAD per file, once
    assert fetched <= 1.1 * window_bytes
    rows_local, rows_remote = trained_rows(local), trained_rows(remote)
    assert sorted(rows_remote) == [fx.STEP + 1, last] and rows_remote == rows_local
    a, b = weights(local, last), weights(remote, last)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
