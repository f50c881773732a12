"""Shared fixtures: the conf dir, a Hydra ``compose`` helper, the asset cache, the tiny model."""

from __future__ import annotations

import atexit
import fcntl
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from hydra import compose as hydra_compose
from hydra import initialize_config_dir

from pretrain_exp import conf_dir
from pretrain_exp.app.config import ExperimentConfig, register_configs
from pretrain_exp.app.validate import to_config
from pretrain_exp.core.cachedir import CacheDir
from pretrain_exp.insertion.plan import Plan

ROOT = Path(__file__).resolve().parents[1]
#: ``PYTHONPATH`` for a subprocess: the checkout, then the caller's own entries (where the libraries live when
#: ``make gpu-test PY=python`` runs an interpreter whose packages are on ``PYTHONPATH``)
CHECKOUT_PYTHONPATH = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
CONF_DIR = conf_dir()  # conf/ of this checkout (pretrain_exp/conf when the package is installed)
#: the user's cache (``$PRETRAIN_EXP_CACHE`` or ``~/.cache/pretrain_exp``): the assets the tests share
SHARED_CACHE = Path(os.environ.get("PRETRAIN_EXP_TESTS_SHARED_CACHE") or os.environ.get("PRETRAIN_EXP_CACHE")
                    or Path.home() / ".cache" / "pretrain_exp")
#: cache subdirs shared with :data:`SHARED_CACHE`: content-addressed assets (registry downloads, the models and
#: tokenizers built from them, tokenized corpora, benchmark data), the same whatever ran before
SHARED_SUBDIRS = CacheDir.SHARED

# One intra-op thread per process unless the caller set OMP_NUM_THREADS: `make test` runs one pytest-xdist worker
# more than there are cores, and every run, torchrun rank and eval process that a test starts would otherwise take
# all cores (torch's default) and spend CPU handing work between threads that have no core free.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def session_cache(shared: Path) -> Path:
    """A cache dir of this test process (removed at its exit): :data:`SHARED_SUBDIRS` are symlinks into ``shared``;
    everything a run derives (audits, permutations, size indexes, item tokens, windows) starts empty, so that no
    result depends on what earlier runs left in the user's cache."""
    d = Path(tempfile.mkdtemp(prefix="pretrain_exp-cache-"))
    atexit.register(shutil.rmtree, d, True)
    for name in SHARED_SUBDIRS:
        (shared / name).mkdir(parents=True, exist_ok=True)
        (d / name).symlink_to(shared / name, target_is_directory=True)
    return d


CACHE_DIR = session_cache(SHARED_CACHE)
os.environ["PRETRAIN_EXP_CACHE"] = str(CACHE_DIR)  # runs in this process and in subprocesses use it
os.environ["PRETRAIN_EXP_TESTS_SHARED_CACHE"] = str(SHARED_CACHE)  # pytest-xdist workers and nested sessions

register_configs()

# Hypothesis example counts: small by default (the fast tier), more with HYPOTHESIS_PROFILE=ci (.ci/run sets it);
# both derandomized (the examples are a function of the test, the same on every run) and without an example database
try:
    from hypothesis import HealthCheck, settings
except ImportError:  # the dev extra is not installed: the property tests skip themselves
    pass
else:
    _slow_ok = [HealthCheck.too_slow, HealthCheck.data_too_large]
    settings.register_profile("fast", max_examples=25, deadline=None, derandomize=True, database=None,
                              suppress_health_check=_slow_ok)
    settings.register_profile("ci", max_examples=150, deadline=None, derandomize=True, database=None,
                              print_blob=True, suppress_health_check=_slow_ok)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fast"))


def compose(*overrides: str, run_dir: str | Path = "/nonexistent-run-dir"):
    """The composed ``DictConfig`` for ``overrides`` (``run_dir`` replaces Hydra's runtime output dir)."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose("config", overrides=[f"run_dir={run_dir}", f"cache_dir={CACHE_DIR}", *overrides])


def make_config(*overrides: str, run_dir: str | Path) -> ExperimentConfig:
    """A validated :class:`ExperimentConfig` for ``overrides``."""
    return to_config(compose(*overrides, run_dir=run_dir))


@pytest.fixture(autouse=True)
def _one_slurm_test_at_a_time(request, tmp_path_factory):
    """Under pytest-xdist (``make test`` runs one worker more than the cores) the SLURM tests run one at a time:
    the local cluster has 8 CPUs, and a job of one test queued behind another test's job leaves its eval jobs
    pending (then cancelled and run in the run's allocation). An exclusive ``flock`` on a file in the directory all
    workers' base temp dirs share, held for the test; not ``xdist_group``: pytest 9.2's node ids ignore the group
    suffix that pytest-xdist 3.8 appends, so ``--dist loadgroup`` spreads a group over the workers. A test marked
    ``slurm(jobs=False)`` submits no job (SLURM refuses it) and runs beside the others."""
    marker = request.node.get_closest_marker("slurm")
    if marker is None or not marker.kwargs.get("jobs", True) or "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    with open(tmp_path_factory.getbasetemp().parent / "slurm-tests.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


#: every reason a test of the suite may skip for (a regex matched at the start of the skip message), and whether
#: CI allows it (hardware only). Any other skip fails the test; with ``PRETRAIN_EXP_STRICT_SKIPS=1`` (``.ci/run``
#: sets it) so does a skip CI does not allow.
SKIP_REASONS = {
    r"needs a CUDA device$": True,  # tests/gpu, the greedy decoder on CUDA
    r"needs a CUDA device of compute capability >= 8\.9$": True,  # fp8 (tests/gpu)
    r"training\.precision=fp8 needs torchao$": True,  # the fp8 extra, installed where such a GPU is (tests/gpu)
    r"the CPU path: no CUDA device$": True,  # the CPU refusal of fp8, where a CUDA device is present
    r"flash-attn is installed here$": True,  # the fallback without flash-attn, where a GPU setup installed it
    r"no SLURM controller answers `sinfo`": False,  # .ci/run starts one
    r"no SLURM partition with two nodes answers `sinfo`": False,  # .ci/run starts one
    r"the docs extra is not installed": False,  # make test installs it
    r"Python 3\.10 has no tomllib$": False,  # pyproject.toml read with the standard library's tomllib
    r"no /dev/full": False,  # every Linux has it
    r"mounting a size-limited tmpfs needs root$|mount -t tmpfs failed": False,  # CI runs as root
}


def skip_not_allowed(reason: str, strict: bool) -> str | None:
    """Why a skip with message ``reason`` fails the run (:data:`SKIP_REASONS`), or ``None`` where it may skip."""
    for pattern, in_ci in SKIP_REASONS.items():
        if re.match(pattern, reason):
            return None if in_ci or not strict else "CI allows skips only for missing hardware"
    return "not a skip reason the suite lists (SKIP_REASONS in tests/conftest.py)"


def _fail_unlisted_skip(report) -> None:
    """Turn a skip ``report`` whose reason :func:`skip_not_allowed` refuses into a failure saying so."""
    if not report.skipped or hasattr(report, "wasxfail") or not isinstance(report.longrepr, tuple):
        return
    reason = re.sub(r"^Skipped: ", "", str(report.longrepr[2]))
    why = skip_not_allowed(reason, os.environ.get("PRETRAIN_EXP_STRICT_SKIPS") == "1")
    if why is not None:
        report.outcome, report.longrepr = "failed", f"skipped ({reason}): {why}"


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    _fail_unlisted_skip(report)
    return report


def pytest_collection_modifyitems(config, items):
    """Run order, whole modules kept together: the modules with SLURM tests that submit jobs first, then the modules
    with slow tests, then the rest, each group in collection order. Under ``--dist worksteal`` the first worker
    takes the head of the list and others steal from the tail, so the SLURM tests (one at a time, mostly waiting
    for the cluster) run one after another from the start beside the CPU-bound tests, and the long tests do not
    gather at the end."""
    def rank(item) -> int:
        marker = item.get_closest_marker("slurm")
        if marker is not None and marker.kwargs.get("jobs", True):
            return 0
        return 1 if item.get_closest_marker("slow") is not None else 2

    group: dict = {}
    for item in items:
        group[item.path] = min(group.get(item.path, 2), rank(item))
    items.sort(key=lambda item: group[item.path])  # stable: collection order within a group


_FAILED_FILES: set = set()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    _fail_unlisted_skip(report)
    if report.failed:
        _FAILED_FILES.add(item.path)
    return report


@pytest.fixture(scope="module", autouse=True)
def _remove_module_tmp_dirs(request, tmp_path_factory):
    """Remove what a module's fixtures made with ``tmp_path_factory`` when the module ends, unless one of its
    tests failed. pytest itself removes a passing test's ``tmp_path`` at once (``tmp_path_retention_policy =
    failed`` in setup.cfg) but keeps module-scoped dirs until the session ends; some hold OLMo checkpoints
    (up to 1.3 GB), and the suite's peak disk use must stay near its largest single test's (~2.2 GB)."""
    base = tmp_path_factory.getbasetemp()
    before = set(base.iterdir())
    yield
    if request.path not in _FAILED_FILES:
        for path in set(base.iterdir()) - before:
            shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def _restore_root_logging():
    """Undo logging handlers a test installs (an in-process Hydra run binds them to pytest's captured streams)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    return CACHE_DIR


@pytest.fixture(scope="session")
def tiny_model_dir(cache_dir) -> Path:
    """HF dir of the ``tiny_llama`` asset (built once from the SmolLM2 asset's tokenizer)."""
    from pretrain_exp.data.assets import hf_model_dir

    return hf_model_dir("tiny_llama", cache_dir)


# --- a tiny in-memory model and plan for the eval tests --------------------------------------------------

EOS = 0
VOCAB = 128
TEXT_LEN = 20


def tiny_model(seed: int = 0) -> transformers.LlamaForCausalLM:
    """A random 2-layer Llama with a 128-token vocabulary (EOS = pad = 0), in eval mode."""
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                   max_position_embeddings=256, eos_token_id=EOS, pad_token_id=EOS)
    return transformers.LlamaForCausalLM(cfg).eval()


def make_plan(items, experiments=("bios",)) -> Plan:
    """A plan with the given ``(tokens, dup_count, experiment_index)`` items and no insertions."""
    lengths = [len(t) for t, _, _ in items]
    return Plan(sequence_length=64, global_batch_size=1, window=(0, 64), experiments=list(experiments),
                token_offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
                tokens=np.concatenate([np.asarray(t) for t, _, _ in items]).astype(np.uint16),
                item_experiment=np.array([e for _, _, e in items], np.int32),
                item_dup_count=np.array([d for _, d, _ in items], np.int32),
                span_positions=np.empty(0, np.int64), span_item_ids=np.empty(0, np.int32),
                span_dup_index=np.empty(0, np.int32))


def random_item(rng, n: int = TEXT_LEN) -> list:
    """``[EOS] + n random tokens + [EOS]``."""
    return [EOS] + rng.integers(1, VOCAB, size=n).tolist() + [EOS]


def run_entry_point(monkeypatch, tmp_path: Path, argv, fake_run=None, exits: bool = True):
    """``python -m pretrain_exp *argv`` in this process (Hydra finds ``conf/`` as from the command line), with
    ``experiment.run`` replaced by ``fake_run`` and the runs dir ``tmp_path/runs``.

    :param exits: the entry point must exit (``SystemExit``: a failed run, ``--help``), else return (a run that
        succeeds); the test fails otherwise.
    :returns: the exit status where it exits, else ``None``.
    """
    import runpy
    import sys

    from hydra.core.global_hydra import GlobalHydra

    import pretrain_exp.app.experiment as experiment

    monkeypatch.setattr(experiment, "run", fake_run)
    monkeypatch.setenv("PRETRAIN_EXP_RUNS", str(tmp_path / "runs"))
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.setattr(sys, "argv", ["pretrain_exp", *argv])
    try:
        runpy.run_module("pretrain_exp", run_name="__main__")
    except SystemExit as e:
        assert exits, f"the entry point exited with status {e.code}"
        return e.code
    finally:
        GlobalHydra.instance().clear()
    assert not exits, "the entry point returned without exiting"
    return None


@pytest.fixture
def no_proxy(monkeypatch):
    """Requests to the test servers on 127.0.0.1 bypass any proxy set in the environment. A module of remote-data
    tests uses it with ``pytestmark = pytest.mark.usefixtures("no_proxy")``."""
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


@pytest.fixture(scope="module")
def one_torch_thread():
    """Run a module's tests with 1 torch thread (small models on a shared 2-core box), then restore."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def trained():
    """A tiny model trained (60 Adam steps) on the 4 dup-4 items of a plan that also has 4 dup-0 controls."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    items = [(random_item(rng), 4 if k % 2 else 0, 0) for k in range(8)]
    plan = make_plan(items)
    model = tiny_model().train()
    batch = torch.tensor([t for t, d, _ in items if d], dtype=torch.long)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(60):
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.set_num_threads(old)
    return model.eval(), plan
