"""The ``olmo2`` framework: an OLMo-2-layout checkpoint is checked against the run's config, converted once, and
continued on OLMo-core at its step and in its data order; end to end on the CLI with the tiny preset (real dolma2
tokens of the Shakespeare corpus), and under a 2-process torchrun."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from pretrain_exp.core.errors import ConfigError
from pretrain_exp.frameworks.olmo2.framework import Olmo2Framework
from tests.conftest import make_config
from tests.unit.frameworks.olmo2 import olmo2_checkpoint as fx
from tests.unit.frameworks.olmo_core.test_framework import (
    assert_two_ranks_train_what_one_trains,
    cli,
    kill_after_first_checkpoint_and_rerun,
    trained_rows,
    weights,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def olmo2_ckpt(tmp_path_factory):
    """The test checkpoint of :mod:`tests.unit.frameworks.olmo2.olmo2_checkpoint` (step 37, L=16, B=4, OLMo-2 seed
    6198) and its two token files (ids below the 300-token vocabulary)."""
    root = tmp_path_factory.mktemp("olmo2")
    paths = []
    for f, n in enumerate((1700, 1100)):
        values = (np.arange(n) * 7 + f * 11) % fx.VOCAB
        paths.append(root / f"part-{f}.npy")
        paths[-1].parent.mkdir(parents=True, exist_ok=True)
        from pretrain_exp.data.token_files import write_token_file

        write_token_file(paths[-1], [values[:-1].tolist()], np.uint16, int(values[-1]))
    return fx.write_olmo2_checkpoint(root / "ckpt", paths), paths


def olmo2_run(ckpt, paths, run_dir, *extra):
    # the tiny_llama tokenizer only names EOS here (vocabulary 49,152 -> uint16 token files, like the checkpoint)
    return make_config(
        "framework=olmo2", f"model.path={ckpt}", "model.asset=null", f"model.checkpoint_step={fx.STEP}",
        "model.tokenizer=tiny_llama", "data=token_files", f"data.paths=[{paths[0]},{paths[1]}]",
        f"data.seed={fx.SEED - 1}", "data.held_out_rows=0", "insertion=none", "eval=[]", "training=tiny",
        f"training.sequence_length={fx.SEQ_LEN}", f"training.global_batch_size={fx.BATCH}",
        "training.micro_batch_size=2", "training.num_steps=2", "training.checkpoint_interval=2",
        "training.num_threads=1", "training.log_rows=true", "wandb=disabled", *extra, run_dir=run_dir)


@pytest.mark.parametrize("override, key, needed", [
    ("data.seed=6198", "data.seed", "data.seed=6197 data.first_epoch=1"),
    ("training.sequence_length=32", "training.sequence_length", f"training.sequence_length={fx.SEQ_LEN}"),
    ("training.global_batch_size=8", "training.global_batch_size", f"training.global_batch_size={fx.BATCH}"),
    ("model.checkpoint_step=36", "model.checkpoint_step", f"model.checkpoint_step={fx.STEP}"),
])
def test_a_run_that_would_not_continue_the_checkpoint_is_refused(olmo2_ckpt, tmp_path, override, key, needed):
    ckpt, paths = olmo2_ckpt
    cfg = olmo2_run(ckpt, paths, tmp_path / "run", override, "training.micro_batch_size=4")
    with pytest.raises(ConfigError) as e:
        Olmo2Framework.resolve_model(cfg)
    assert e.value.key == key and needed in str(e.value)


def test_the_converted_checkpoint_records_the_real_path_of_its_source(olmo2_ckpt, tmp_path):
    """The OLMo-core checkpoint converted from an OLMo-2 one is shared through the model cache; the source it
    records (what the run's OLMo-2 settings are read from) is the source's real path, not the link it was given by
    (a test process's cache reaches the models through a link that goes away with the process)."""
    from pretrain_exp.core.cachedir import CacheDir
    from pretrain_exp.frameworks.olmo2.framework import convert_to_olmo_core
    from tests.conftest import CACHE_DIR

    ckpt, paths = olmo2_ckpt
    cache = tmp_path / "cache"  # models of its own, the rest shared
    cache.mkdir()
    for sub in ("assets", "tokenizers", "tokens"):
        (CACHE_DIR / sub).mkdir(parents=True, exist_ok=True)
        (cache / sub).symlink_to(CACHE_DIR / sub)
    link = tmp_path / "link"
    link.symlink_to(Path(ckpt).resolve(), target_is_directory=True)
    converted = convert_to_olmo_core(olmo2_run(link, paths, tmp_path / "run", f"cache_dir={cache}"), link)
    assert converted.parent == CacheDir(cache).model("olmo2-converted")
    assert json.loads((converted / "config.json").read_text())["olmo2"]["source"] == str(Path(ckpt).resolve())


@pytest.mark.slow
def test_a_converted_checkpoint_continues_at_its_step_in_olmo2s_order(olmo2_ckpt, tmp_path):
    """Training starts at step 38: OLMo-core's loader (seed S-1, positioned at batch 37) hands over rows
    [37*B, 39*B) of OLMo-2's order, which our callback checks row by row before training on them."""
    from pretrain_exp.app.experiment import Experiment

    ckpt, paths = olmo2_ckpt
    cfg = olmo2_run(ckpt, paths, tmp_path / "run")
    exp = Experiment(cfg)
    converted = exp.model_dir
    assert json.loads((converted / "config.json").read_text())["olmo2"]["global_step"] == fx.STEP
    exp.run()
    assert exp.framework.latest_checkpoint().step == fx.STEP + 2
    rows = trained_rows(tmp_path / "run")
    assert sorted(rows) == [fx.STEP + 1, fx.STEP + 2]
    # the checkpoint's own schedule continues (config.yaml: cosine with warmup over tokens, peak fx.LR): at step k
    # OLMo-2 sets lr(tokens seen after batch k), the formula of allenai/OLMo olmo/optim.py CosWithWarmup
    sch = fx.olmo2_config(paths)["scheduler"]
    lrs = {m["step"]: m["train/learning_rate"] for m in map(json.loads, (tmp_path / "run" / "metrics.jsonl")
                                                            .read_text().splitlines()) if "train/learning_rate" in m}
    for k in (fx.STEP + 1, fx.STEP + 2):
        t = k * fx.BATCH * fx.SEQ_LEN - sch["t_warmup"]
        eta_min = fx.LR * sch["alpha_f"]
        want = eta_min + (fx.LR - eta_min) * (1 + math.cos(math.pi * t / (sch["t_max"] - sch["t_warmup"]))) / 2
        assert lrs[k] == pytest.approx(want, rel=1e-6), (k, lrs)
    assert sorted(rows[fx.STEP + 1]) == list(range(fx.STEP * fx.BATCH, (fx.STEP + 1) * fx.BATCH))
    # converted once: a second run with the same optimizer settings reuses it
    assert Olmo2Framework.resolve_model(olmo2_run(ckpt, paths, tmp_path / "again")) == converted


@pytest.mark.slow
def test_cli_with_the_tiny_preset_and_two_torchrun_ranks(tmp_path):
    """``python -m pretrain_exp framework=olmo2 insertion=texts`` end to end (conversion, training, evals), and the
    same run on 2 torchrun ranks trains the same rows with the same insertions, and a run killed mid-segment ends
    with the same weights once re-run."""
    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps({"text": f"Quentin Marlowe-Abara{i} keeps {i * 7} blue herons on the "
                                                 f"island of Vell{i}."}) + "\n" for i in range(8)))
    run = ["framework=olmo2", "insertion=texts", f"insertion.experiments.texts.file={items}",
           "insertion.experiments.texts.repetitions=[0,4]", "training=tiny", "training.num_steps=4",
           "training.checkpoint_interval=2", "training.num_threads=1", "data.held_out_rows=8",
           "eval=[insertion_loss]", "wandb=disabled", "training.log_rows=true"]
    one, two = tmp_path / "one", tmp_path / "two"
    cli(*run, f"hydra.run.dir={one}", runs=tmp_path)
    res = json.loads((one / "results.json").read_text())
    assert res["step"] == 4 and [r["dup_count"] for r in res["per_dup"]] == [0, 4]
    assert res["plan"]["num_insertions"] == 4 * 4
    # the kept HF export (training.export_hf=final by default): the last segment's only, loaded by stock
    # transformers with its tokenizer, computing the OLMo-core checkpoint's logits
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pretrain_exp.frameworks.olmo_core.checkpoint import load_model

    assert [p.name for p in (one / "hf").iterdir()] == ["step4"]
    hf = AutoModelForCausalLM.from_pretrained(str(one / "hf" / "step4"), dtype=torch.float32).eval()
    ids = torch.tensor([AutoTokenizer.from_pretrained(str(one / "hf" / "step4"))(
        "Quentin Marlowe-Abara3 keeps 21 blue herons on the island of Vell3.").input_ids])
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, load_model(one / "checkpoints" / "step4")(ids),
                                   rtol=1e-5, atol=1e-5)
    cli(*run, "eval=[]", "training.nproc_per_node=2", f"hydra.run.dir={two}", runs=tmp_path)
    assert_two_ranks_train_what_one_trains(one, two, steps=4, B=8)
    # killed mid-segment and re-run: the same final weights as the uninterrupted run
    killed = tmp_path / "killed"
    kill_after_first_checkpoint_and_rerun([*run, "eval=[]"], killed, tmp_path, last_step=4)
    final = weights(one / "checkpoints" / "step4")
    for k, v in weights(killed / "checkpoints" / "step4").items():
        torch.testing.assert_close(v, final[k], rtol=0, atol=0, msg=k)


def test_framework_conf_defaults_to_the_tiny_preset(tmp_path):
    cfg = make_config("framework=olmo2", run_dir=tmp_path)
    assert (cfg.model.name, cfg.model.asset, cfg.model.tokenizer) == ("olmo2_tiny", "olmo2_tiny", "dolma2")
    converted = Olmo2Framework.resolve_model(cfg)
    assert (converted / ".metadata").is_file()
    assert json.loads((converted / "config.json").read_text())["optimizer_state"]
