"""``training.precision=fp8``: a config rule (olmo_core/olmo2 only, refused for hf when the config is validated)
and the machine's rules (a CUDA GPU of compute capability >= 8.9, an importable torchao), which the job checks
before anything starts; here, on a machine without CUDA, the job refuses fp8 with one error line."""

from __future__ import annotations

import pytest
import torch

from pretrain_exp.app.launch import check_allocation, check_machine
from pretrain_exp.app.validate import FP8_TORCHAO, fp8_refusal
from pretrain_exp.core.capabilities import TRAINS_FP8, has
from pretrain_exp.core.config import Precision
from pretrain_exp.core.errors import ConfigError
from pretrain_exp.frameworks.registry import get_framework_class
from tests.conftest import make_config, run_entry_point


def test_fp8_is_refused_for_the_hf_framework_when_the_config_is_validated(tmp_path):
    with pytest.raises(ConfigError) as e:
        make_config("experiment=tiny", "training.precision=fp8", run_dir=tmp_path)
    assert e.value.key == "training.precision"
    assert "framework=olmo_core or framework=olmo2" in str(e.value) and "'hf'" in str(e.value)
    assert "\n" not in str(e.value)


def test_fp8_validates_for_the_olmo_frameworks(tmp_path):
    cfg = make_config("experiment=scratch_olmo_core", "training.precision=fp8", run_dir=tmp_path)
    assert cfg.training.precision == Precision.fp8
    assert has(get_framework_class("olmo_core"), TRAINS_FP8) and has(get_framework_class("olmo2"), TRAINS_FP8)
    assert not has(get_framework_class("hf"), TRAINS_FP8)


def test_refusal_reasons_in_order_cuda_capability_torchao():
    assert "no CUDA device" in fp8_refusal(None, "ModuleNotFoundError: No module named 'torchao'")
    for ampere in [(8, 0), (8, 6)]:  # A100, A10/RTX 30xx: no float8 tensor cores
        why = fp8_refusal(ampere)
        assert "compute capability >= 8.9" in why and f"this one is {ampere[0]}.{ampere[1]}" in why
    why = fp8_refusal((9, 0), "ModuleNotFoundError: No module named 'torchao'", "2.11.0+cu130")
    assert "No module named 'torchao'" in why and FP8_TORCHAO in why and "torch here: 2.11.0+cu130" in why
    for fp8_gpu in [(8, 9), (9, 0), (10, 0)]:  # L4/L40S, H100/H200, B200
        assert fp8_refusal(fp8_gpu) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path: no CUDA device")
def test_the_job_refuses_fp8_without_cuda_before_anything_starts(tmp_path, monkeypatch, capsys):
    cfg = make_config("experiment=scratch_olmo_core", "training.precision=fp8", run_dir=tmp_path / "cfg")
    with pytest.raises(ConfigError, match=r"^training.precision: fp8 needs a CUDA GPU .* no CUDA device"):
        check_machine(cfg)
    with pytest.raises(ConfigError, match="training.precision"):
        check_allocation(cfg)
    cfg.training.precision = Precision.bf16
    check_machine(cfg)  # the other precisions ask nothing of the machine

    started = []
    run_dir = tmp_path / "runs" / "r"
    code = run_entry_point(monkeypatch, tmp_path, ["experiment=scratch_olmo_core", "training.precision=fp8",
                                                   f"hydra.run.dir={run_dir}"], started.append)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and not started
    assert err[-1].startswith("error: training.precision: fp8 needs a CUDA GPU"), err
    assert not run_dir.exists()  # a fresh run dir refused before anything started is removed
