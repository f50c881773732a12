"""A real run through the CLI whose token file is a credentialed URL (userinfo and a signed query string, served by
the local Range server of tests/remote_server.py) with credentials in the environment: no credential in any file of
the run dir, nor in its output; every file has the umask's mode; a refused re-run (a changed learning rate) leaves
the run dir exactly as it was, ``.hydra/`` included."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from pretrain_exp.data.tokenize import tokenize_source
from tests.conftest import CACHE_DIR, ROOT
from tests.remote_server import RangeServer

TOKEN, SIG = "t0kenInTheUrl-5ecret", "a1b2c3d4e5f6SignatureValue"
ENV = {"WANDB_API_KEY": "feedfacefeedfacefeedfacefeedfacefeedface",
       "HF_TOKEN": "hf_QwErTyUiOpAsDfGhJkLzXcVbNm123456",
       "AWS_ACCESS_KEY_ID": "AKIAQWERTYUIOPASDFGH", "AWS_SECRET_ACCESS_KEY": "Zx9/Secret+AccessKey/For/Tests0000"}
SECRETS = [TOKEN, SIG, *ENV.values()]
FAST = ["experiment=tiny", "training.num_threads=1", "training.num_steps=2", "training.checkpoint_interval=2",
        "eval=[insertion_loss]", "insertion.experiments.fictional_bios.repetitions=[0,1]", "data.dtype=uint16"]


def cli(runs, *args):
    env = os.environ | ENV | {"PRETRAIN_EXP_RUNS": str(runs), "PRETRAIN_EXP_CACHE": str(CACHE_DIR),
                              "WANDB_SILENT": "true", "no_proxy": "127.0.0.1,localhost",
                              "NO_PROXY": "127.0.0.1,localhost"}
    return subprocess.run([sys.executable, "-m", "pretrain_exp", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900, umask=0o002)


def snapshot(run_dir):
    return {str(p.relative_to(run_dir)): (p.read_bytes(), p.stat().st_mtime_ns) if p.is_file() else None
            for p in sorted(run_dir.rglob("*"))}


@pytest.mark.slow
def test_no_credential_in_the_run_dir_modes_follow_the_umask_and_a_refused_rerun_changes_nothing(tmp_path,
                                                                                                 tiny_model_dir):
    from transformers import AutoTokenizer

    parts = tokenize_source("shakespeare", AutoTokenizer.from_pretrained(tiny_model_dir), CACHE_DIR / "tokens",
                            CACHE_DIR, progress=False)
    (tmp_path / "srv").mkdir()
    shutil.copyfile(parts[0], tmp_path / "srv" / "part-00000.npy")
    runs = tmp_path / "runs"
    with RangeServer(tmp_path / "srv") as srv:
        url = srv.base.replace("http://", f"http://reader:{TOKEN}@") + f"/part-00000.npy?X-Amz-Signature={SIG}&x=1"
        proc = cli(runs, *FAST, f"data.paths=['{url}']")
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert srv.bytes_served > 0
        run_dir = Path(proc.stdout.strip().splitlines()[-1].removeprefix("run dir: "))

        leaks = [(str(p.relative_to(run_dir)), s) for p in run_dir.rglob("*") if p.is_file()
                 for s in SECRETS if s.encode() in p.read_bytes()]
        assert leaks == []
        assert not [s for s in SECRETS if s in proc.stdout + proc.stderr]
        assert f"{srv.base}/part-00000.npy" in (run_dir / "config.resolved.yaml").read_text()
        assert f"{srv.base}/part-00000.npy" in (run_dir / ".hydra" / "overrides.yaml").read_text()
        assert list((run_dir / "wandb").glob("offline-run-*"))

        modes = {str(p.relative_to(run_dir)): stat.S_IMODE(p.stat().st_mode) for p in run_dir.rglob("*")
                 if p.is_file() and not p.is_symlink()}
        wrong = {k: oct(m) for k, m in modes.items() if m != 0o664 and not k.startswith("wandb/")}
        assert wrong == {}, "files without the umask's mode 0664"
        assert all(m & 0o040 for m in modes.values())  # W&B's own files (output.log: 0644) are group-readable too
        for name in ("results.json", "plan.npz", "manifest.jsonl", "items.jsonl", "config.resolved.yaml",
                     "evals/step2/insertion_loss.json", "checkpoints/checkpoint-2/model.safetensors"):
            assert (run_dir / name).is_file(), name

        before = snapshot(run_dir)
        refused = cli(runs, *FAST, f"data.paths=['{url}']", "training.learning_rate=1e-3",
                      f"hydra.run.dir={run_dir}")  # by name it would get its own run dir
        assert refused.returncode == 2 and "started with different settings" in refused.stderr, refused.stderr[-3000:]
        assert "training.learning_rate changes (0.005 -> 0.001)" in refused.stderr
        after = snapshot(run_dir)
        log_before, log_after = before.pop("pretrain_exp.log")[0], after.pop("pretrain_exp.log")[0]
        assert after == before  # the run's files as they were ...
        assert log_after.startswith(log_before)  # ... and its log only appended to: the refusal, for the record
        assert b"started with different settings" in log_after[len(log_before):]
        assert not [x for x in SECRETS if x.encode() in log_after]
