"""``python -m pretrain_exp.app.prefetch <overrides>``: the run's window fetched ahead of time from a local server
(tests/remote_server.py) named by official URLs and a prefix map given on the command line."""

from __future__ import annotations

import numpy as np
import pytest

from pretrain_exp.app.prefetch import main
from tests.remote_server import OLMO_DATA, RangeServer, build_mix

L, B, STEPS, START = 64, 8, 5, 3


pytestmark = pytest.mark.usefixtures("no_proxy")


@pytest.mark.slow  # the first Hydra compose of a process imports every plugin (seconds)
def test_prefetch_cli_fetches_the_run_window_once(tmp_path, capsys):
    urls = build_mix(tmp_path / "srv", 2000)
    cache = tmp_path / "cache"
    with RangeServer(tmp_path / "srv") as srv:
        args = ["experiment=tiny", f"cache_dir={cache}", f"run_dir={tmp_path / 'run'}", "data.dtype=uint32",
                "data.paths=[" + ",".join(urls) + "]",
                "++data.path_prefixes={" + OLMO_DATA.replace(":", "\\:") + ":'" + srv.base + "/'}",
                f"training.sequence_length={L}", f"training.global_batch_size={B}", f"training.num_steps={STEPS}",
                f"model.checkpoint_step={START}"]
        assert main(args) == 0
        assert srv.bytes_served == STEPS * B * L * 4 and srv.count("HEAD") == len(urls)
        out = capsys.readouterr().out
        assert f"window: {STEPS * B * L * 4} B (0 B were cached" in out and f"window cache: {cache / 'window'}" in out
        cached = sorted((cache / "window").rglob("*.npy"))
        assert cached and all(p.stat().st_size == 2000 * 4 for p in cached)
        srv.reset_counts()
        assert main(args) == 0 and srv.count() == 0  # sizes indexed, window cached: no request
        assert main(args + ["data.prefetch=sometimes"]) == 2
    err = capsys.readouterr().err
    assert "error: data.prefetch: unknown mode 'sometimes'; allowed: auto, stream, window, none" in err
    tokens = np.fromfile(cached[0], dtype="<u4")
    assert tokens.size == 2000
