"""``pretrain-exp-prefetch <the run's Hydra overrides>``: fetch a run's token-file window ahead of time.

The same command is ``python -m pretrain_exp.app.prefetch``. Composes the same config a run composes (``conf/``,
Hydra's compose API, validated by :func:`~pretrain_exp.app.validate.to_config`), then fetches the instances of the
rows the run will train, ``[model.checkpoint_step * B, (model.checkpoint_step + training.num_steps) * B)``, from the
remote token files into the window cache under ``cache_dir`` (:func:`pretrain_exp.data.prefetch.prefetch`), e.g. on
a login node before the job starts; the run then finds them cached. Prints the bytes needed, the disk free and a
progress bar; the last line is ``window cache: <dir>``. Errors of the user's making (and Hydra's override errors)
print one ``error:`` line and exit 2.

A prefix map on the command line needs Hydra's force-add (``++``; the dict is in struct mode) and an escaped
colon in the key, e.g.::

    pretrain-exp-prefetch framework=olmo2 data=token_files 'data.paths=[http://olmo-data.org/...]' \
        '++data.path_prefixes={http\\://olmo-data.org/:"http://mirror.internal/"}' training.num_steps=2000

(in a YAML config it is a plain mapping).
"""

from __future__ import annotations

import logging
import sys
from typing import Optional, Sequence

from pretrain_exp import conf_dir
from pretrain_exp.app.config import ExperimentConfig, register_configs
from pretrain_exp.app.validate import to_config
from pretrain_exp.core.cachedir import CacheDir
from pretrain_exp.core.commands import prog
from pretrain_exp.core.errors import ConfigError, PretrainExpError
from pretrain_exp.core.secrets import install_log_redaction, redact
from pretrain_exp.data.prefetch import PREFETCH_MODES, PrefetchStats, prefetch
from pretrain_exp.data.token_files import dtype_for_vocab

log = logging.getLogger("pretrain_exp")
CONF_DIR = conf_dir()


def compose_run_config(overrides: Sequence[str]) -> ExperimentConfig:
    """The validated config of a run with these Hydra overrides (``run_dir`` defaults to ``./prefetch-run``,
    as no Hydra job runs here).

    :raises ConfigError: naming the key, as for a run.
    """
    from hydra import compose, initialize_config_dir

    register_configs()
    extra = [] if any(o.split("=", 1)[0].lstrip("+~") == "run_dir" for o in overrides) else ["run_dir=prefetch-run"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return to_config(compose("config", overrides=[*extra, *overrides]))


def token_dtype(cfg: ExperimentConfig) -> str:
    """``data.dtype``, else the dtype of the run's vocabulary (as the run picks it: the framework's model and
    tokenizer, which may fetch them)."""
    if cfg.data.dtype:
        return cfg.data.dtype
    from pretrain_exp.data.tokenize import load_tokenizer
    from pretrain_exp.frameworks.registry import get_framework_class

    framework_class = get_framework_class(cfg.framework.name)
    framework = framework_class(cfg, framework_class.resolve_model(cfg))
    tokenizer = load_tokenizer(framework.tokenizer_path, cfg.cache_dir)
    return str(dtype_for_vocab(max(framework.vocab_size or len(tokenizer), len(tokenizer))))


def prefetch_run(cfg: ExperimentConfig, progress: bool = True) -> Optional[PrefetchStats]:
    """Prefetch the window of the run ``cfg``; ``None`` when it reads a text source (local tokens only).

    :raises DataError: see :func:`pretrain_exp.data.prefetch.prefetch`.
    """
    if cfg.data.prefetch not in PREFETCH_MODES:  # checked as a run checks it; this command always fetches
        raise ConfigError("data.prefetch", f"unknown mode {cfg.data.prefetch!r}; allowed: {', '.join(PREFETCH_MODES)}")
    if not cfg.data.paths:
        log.info("data.paths is empty (the run tokenizes %s locally): nothing to prefetch",
                 cfg.data.text or cfg.data.dataset)
        return None
    t, B = cfg.training, cfg.training.global_batch_size
    _, _, stats = prefetch(cfg.data.paths, token_dtype(cfg), t.sequence_length, B, cfg.data.seed,
                           cfg.data.first_epoch, cfg.model.checkpoint_step * B, t.num_steps * B, cfg.cache_dir,
                           cfg.data.path_prefixes, progress=progress,
                           chunk=(cfg.data.max_target_sequence_length or t.sequence_length) // t.sequence_length)
    return stats


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point (module docstring); returns the exit status."""
    install_log_redaction()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(f"usage: {prog('pretrain-exp-prefetch', 'pretrain_exp.app.prefetch')} <the run's Hydra overrides>\n\n"
              + __doc__.split("\n", 1)[1].strip())
        return 0
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        cfg = compose_run_config(argv)
        stats = prefetch_run(cfg)
    except (PretrainExpError, HydraException, OmegaConfBaseException) as e:
        print("error: " + redact(" | ".join(line.strip() for line in str(e).splitlines() if line.strip())),
              file=sys.stderr)
        return 2
    if stats is not None:
        print(f"window: {stats.needed_bytes} B ({stats.cached_bytes} B were cached, {stats.fetched_bytes} B "
              f"fetched in {stats.requests} requests, {stats.seconds:.1f} s)")
    print(f"window cache: {CacheDir(cfg.cache_dir).window}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
