"""The one redaction point: URLs lose userinfo, query string and fragment; values of secret environment variables
and known token shapes are replaced; every log record of the process is redacted, tracebacks included."""

from __future__ import annotations

import ast
import logging
import stat

import pytest

from pretrain_exp.app.run_record import (
    RunRecord,
    check_same_run,
    holds_credentials,
    record_run,
    recorded_form,
    save_resolved_config,
    write_private_config,
)
from pretrain_exp.core.secrets import install_log_redaction, redact, redact_obj, redact_url
from tests.conftest import make_config
from tests.unit.core.test_layers import modules

ENV = {"WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567",
       "HF_TOKEN": "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
       "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
       "R2_SECRET_ACCESS_KEY": "r2-s3cr3t-value-42"}


@pytest.fixture
def secret_env(monkeypatch):
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")  # a name with TOKEN, a short value: no credential


def test_urls_lose_userinfo_query_and_fragment():
    assert redact_url("https://user:s3cret@host:8443/p/f.npy?X-Amz-Signature=abc#x") == "https://host:8443/p/f.npy"
    assert redact_url("s3://bucket/key.npy") == "s3://bucket/key.npy" and redact_url("/a/b.npy") == "/a/b.npy"
    text = ("fetching https://u:tok3n@h.org/a.npy?X-Amz-Credential=AKIAIOSFODNN7EXAMPLE&X-Amz-Signature=f00d, "
            "then (gs://b/c.npy?sig=123).")
    assert redact(text) == "fetching https://h.org/a.npy, then (gs://b/c.npy)."


def test_environment_secrets_and_token_shapes(secret_env):
    text = " ".join(f"{k}={v}" for k, v in ENV.items()) + " key id AKIAIOSFODNN7EXAMPLE, TOKENIZERS false"
    clean = redact(text)
    assert not any(v in clean for v in ENV.values()) and "AKIAIOSFODNN7EXAMPLE" not in clean
    assert "<redacted:HF_TOKEN>" in clean and "<redacted:aws-access-key-id>" in clean and "false" in clean
    nested = {"data": {"paths": ["https://x:y@h/a.npy?sig=1", "/local/b.npy"]}, ENV["HF_TOKEN"]: (1, ENV["HF_TOKEN"])}
    assert redact_obj(nested) == {"data": {"paths": ["https://h/a.npy", "/local/b.npy"]},
                                  "<redacted:HF_TOKEN>": (1, "<redacted:HF_TOKEN>")}


def test_every_log_record_is_redacted(secret_env, caplog):
    install_log_redaction()
    install_log_redaction()  # idempotent
    log = logging.getLogger("some.third.party")
    with caplog.at_level(logging.INFO):
        log.info("GET %s with key %s", "https://user:pw123456@h/x.npy?token=abc", ENV["WANDB_API_KEY"])
        try:
            raise RuntimeError(f"auth failed for {ENV['AWS_SECRET_ACCESS_KEY']}")
        except RuntimeError:
            log.exception("boto said")
    text = caplog.text
    assert "GET https://h/x.npy with key <redacted:WANDB_API_KEY>" in text
    assert "auth failed for <redacted:AWS_SECRET_ACCESS_KEY>" in text
    assert not any(v in text for v in ENV.values()) and "pw123456" not in text


def test_resolved_config_is_redacted_and_a_rerun_still_matches(tmp_path, secret_env):
    url = "https://reader:t0ken-xyz@data.example.org/tokens/part-0.npy?X-Amz-Signature=5ig"
    cfg = make_config("experiment=tiny", f"data.paths=['{url}']", "data.dtype=uint16", run_dir=tmp_path)
    assert holds_credentials(cfg)
    text = save_resolved_config(cfg, tmp_path).read_text()
    assert "https://data.example.org/tokens/part-0.npy" in text and "t0ken" not in text and "5ig" not in text
    check_same_run(tmp_path, recorded_form(cfg))  # with its credentials, it matches its redacted record
    from pretrain_exp.app.run_record import worker_config

    record = record_run(cfg, tmp_path)  # what the launcher writes and hands its workers
    assert record == RunRecord(tmp_path / "config.resolved.yaml", True) and record.config.read_text() == text
    with worker_config(cfg, record) as private:  # what torchrun workers read
        assert tmp_path not in private.parents and stat.S_IMODE(private.stat().st_mode) == 0o600
        assert url in private.read_text()
    assert not private.exists()
    plain = make_config("experiment=tiny", run_dir=tmp_path / "plain")
    with worker_config(plain, record_run(plain, tmp_path / "plain")) as path:
        assert path == tmp_path / "plain" / "config.resolved.yaml"
    in_run_dir = write_private_config(cfg, tmp_path, prefix=".config-")  # what background evals read
    assert in_run_dir.parent == tmp_path and in_run_dir.name.startswith(".config-")
    assert stat.S_IMODE(in_run_dir.stat().st_mode) == 0o600 and url in in_run_dir.read_text()


def test_the_unredacted_config_is_written_in_one_place():
    """Only :func:`~pretrain_exp.app.run_record.write_private_config` turns the unredacted config into a file (every
    other ``OmegaConf.create`` of the config dict goes through ``redact_obj``), read from the source with ``ast``."""
    sites = sorted(m for m, p in modules().items() for node in ast.walk(ast.parse(p.read_text()))
                   if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("OmegaConf.create") and node.args
                   and isinstance(node.args[0], ast.Call) and ast.unparse(node.args[0].func).endswith("config_dict"))
    assert sites == ["pretrain_exp.app.run_record"]
