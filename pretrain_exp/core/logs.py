"""What a run prints and what it keeps: the console, and the run dir's log file ``pretrain_exp.log``.

- **The log file** (the run dir's ``pretrain_exp.log``, :attr:`RunDir.log_file
  <pretrain_exp.core.rundir.RunDir.log_file>`) gets every record: the project's own from DEBUG, the engines' from
  INFO (OLMo-core's model repr, parameter groups, callback order and per-step metric blocks; the HF Trainer's and
  transformers' records, which transformers would drop below WARNING unless ``TRANSFORMERS_VERBOSITY`` says
  otherwise; lm-eval's; datasets' and huggingface_hub's from their own level, WARNING) and Python warnings, captured
  as records of the ``py.warnings`` logger.
- **The console** (stdout) shows the lines that matter: the project's own INFO records (plan, audit, verification,
  one line per logged training step, evals, the HF export, errors) and Hydra's, and the engines' warnings and errors
  except the known-harmless ones in :data:`HARMLESS` (those go to the file only). With ``verbose`` (``-v``,
  ``verbose=true``) the console shows everything the file gets, and the engines' own progress bars.

Libraries that print through a handler of their own (:data:`OWN_HANDLERS`: transformers, datasets,
huggingface_hub, lm-eval) are routed to the root logger, so their records reach the file and pass the same filter.
The file's format is Hydra's (``[time][logger][LEVEL] - message``), and so is the console's when it is not a
terminal (a pipe, a SLURM job's output file) or with ``verbose``; on a terminal the console shows the bare message
(:class:`PlainFormatter`: ``step 5/12: loss ...``; ``warning: ...`` / ``error: ...`` for warnings and errors, naming
the library they come from). A phase (training a segment, evaluating a step) shows one transient rich progress bar
on a terminal (:func:`phase_progress`); log lines print above it. What the engines write straight to the process's
stderr (lm-eval's and datasets' tqdm bars, the ``git`` lm-eval runs for its results' commit hash) is kept off the
console unless ``verbose`` while :func:`engine_output_to_log` is active: it goes to the log file.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

from pretrain_exp.core.interrupt import received, signals_deferred

#: Hydra's job log format
FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"
#: loggers whose INFO records reach the console (with their children); every other logger's from WARNING
CONSOLE_INFO = ("pretrain_exp", "hydra", "__main__")
#: libraries that print through a handler of their own instead of the root logger's
OWN_HANDLERS = ("transformers", "datasets", "huggingface_hub", "lm_eval")
#: ``logging`` ``extra`` of a record kept off the console (the log file only)
FILE_ONLY = {"console": False}
#: environment variable handing the console's form to child processes (torchrun ranks): ``plain`` or ``full``
CONSOLE_ENV = "PRETRAIN_EXP_CONSOLE"
#: shortest time (seconds) a rate is computed over: the resolution of the ``%.1f s`` the lines print
MEASURABLE_S = 0.1


def rate(amount: float, seconds: float, unit: str, fmt: str = "{:,.0f}") -> str:
    """`` (<amount/seconds> <unit>/s)`` for a log line, or ``""`` when ``seconds`` is below :data:`MEASURABLE_S`
    (a rate over a time the line prints as ``0.0 s`` means nothing)."""
    if not seconds >= MEASURABLE_S:
        return ""
    return f" ({fmt.format(amount / seconds)} {unit}/s)"


def console_is_plain(verbose: bool = False) -> bool:
    """Whether the console shows bare messages (:class:`PlainFormatter`): not with ``verbose``; else as
    :data:`CONSOLE_ENV` says (set by a parent process for its children), else when stdout is a terminal."""
    if verbose:
        return False
    env = os.environ.get(CONSOLE_ENV)
    if env in ("plain", "full"):
        return env == "plain"
    return sys.stdout.isatty()


def child_logging(fmt: str = FORMAT, quiet: bool = False) -> None:
    """The logging of a helper process a run starts (the audit beside training, the window stream), whose stderr is
    the run's console: INFO records in ``fmt``; warnings and errors only with ``quiet`` (the run logs what the
    helper did) and on a terminal (:func:`console_is_plain`), where they show as :class:`PlainFormatter` has them."""
    plain = console_is_plain()
    logging.basicConfig(level=logging.WARNING if plain or quiet else logging.INFO, format=fmt)
    if plain:
        for h in logging.getLogger().handlers:
            h.setFormatter(PlainFormatter())


class PlainFormatter(logging.Formatter):
    """The console's format on a terminal: the message alone; a warning or error starts with ``warning:`` /
    ``error:`` (once), followed by ``(<library>)`` for a record from outside the project, and shows the last line
    of its exception (the traceback is in the log file)."""

    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        if record.levelno >= logging.WARNING:
            tag = "error" if record.levelno >= logging.ERROR else "warning"
            if not _under(record.name, CONSOLE_INFO):
                tag += f" ({record.name.split('.')[0]})"
            if not msg.lower().startswith(("warning:", "error:")):
                msg = f"{tag}: {msg}"
        if record.exc_info and record.exc_info[1] is not None:
            e = record.exc_info[1]
            msg += f" ({type(e).__name__}: {' '.join(str(e).split())})" if str(e) else f" ({type(e).__name__})"
        return msg


@dataclass(frozen=True)
class Harmless:
    """An engine warning that says nothing about the run: logged to the file, kept off the console.

    :param logger: logger name (or a parent's: ``torch`` covers ``torch.distributed``); ``py.warnings`` for Python
        warnings.
    :param pattern: regular expression searched in the formatted message.
    :param why: why it is harmless here.
    """

    logger: str
    pattern: str
    why: str

    def matches(self, record: logging.LogRecord) -> bool:
        return _under(record.name, (self.logger,)) and re.search(self.pattern, record.getMessage()) is not None


#: the engines' known-harmless warnings (file only)
HARMLESS = (
    Harmless("py.warnings", r"torch\.distributed is disabled, unavailable or uninitialized, assuming the intent is "
             r"to (load|save) in a single process",
             "a one-process OLMo-core run reads and writes its checkpoints with torch.distributed.checkpoint without "
             "a process group, as intended"),
    Harmless("olmo_core", r"transformer_engine unavailable",
             "the project never selects OLMo-core's Transformer Engine attention backend"),
    Harmless("transformers", r"tokenizer has new PAD/BOS/EOS tokens that differ from the model config",
             "the Trainer copies the tokenizer's pad id into the model config; the run's rows are never padded"),
    Harmless("lm_eval", r"`pretrained` model kwarg is not of type `str`|Passed an already-initialized model through "
             r"`pretrained`",
             "evals/shard.py hands lm-eval the run's loaded model on purpose (and shards it itself)"),
    Harmless("lm_eval", r"Overwriting default num_fewshot of .* to 0",
             "the project's lm-eval evals are 0-shot by design (eval=lm_eval, eval=benchmark)"),
)

_project = logging.getLogger("pretrain_exp")


def _under(name: str, roots: tuple) -> bool:
    return any(name == r or name.startswith(r + ".") for r in roots)


def is_harmless(record: logging.LogRecord) -> bool:
    """Whether ``record`` is one of :data:`HARMLESS`."""
    return any(h.matches(record) for h in HARMLESS)


class ConsoleFilter(logging.Filter):
    """The console's filter (module docstring): the INFO records of :data:`CONSOLE_INFO`, every other logger's from
    WARNING unless :func:`is_harmless`; everything when ``verbose``; none marked :data:`FILE_ONLY`, and none once
    the run is interrupted (:func:`~pretrain_exp.core.interrupt.received`: it prints one line)."""

    def __init__(self, verbose: bool = False):
        super().__init__()
        self.verbose = bool(verbose)

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "console", True) is False or received() is not None:  # interrupted: the run's line only
            return False
        if self.verbose:
            return True
        if _under(record.name, CONSOLE_INFO):
            return record.levelno >= logging.INFO
        return record.levelno >= logging.WARNING and not is_harmless(record)


class ConsoleHandler(logging.StreamHandler):
    """A stream handler on whatever ``sys.stdout`` is when a record is emitted: rich's live progress display swaps
    it for a proxy that prints above the bar (and pytest's capture for its own)."""

    def __init__(self) -> None:
        super().__init__(sys.stdout)

    @property
    def stream(self):  # type: ignore[override]
        return sys.stdout

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ / setStream assign it; the live sys.stdout wins
        pass

    def emit(self, record: logging.LogRecord) -> None:
        """Write the record whole: a Ctrl-C arriving meanwhile takes effect after it
        (:func:`~pretrain_exp.core.interrupt.signals_deferred`)."""
        with signals_deferred():
            super().emit(record)


class RunLogFile(logging.FileHandler):
    """The run dir's log file: a ``logging.FileHandler`` appending UTF-8 records to ``path``. When the file cannot
    be written (``OSError``: no space left on device, a vanished mount) it says so once on stderr and keeps no
    further records, where ``logging`` would print a traceback per record and ``close`` would raise over the run's
    own error (and its exit status); the console still shows its records. Other errors are reported as
    ``logging`` reports them."""

    def __init__(self, path: str | Path):
        super().__init__(path, encoding="utf-8")
        self.failed: Optional[OSError] = None  #: the first write error; no record is written after it

    def emit(self, record: logging.LogRecord) -> None:
        if self.failed is None:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:
        err = sys.exc_info()[1]
        if isinstance(err, OSError):
            self._give_up(err)
        else:
            super().handleError(record)

    def close(self) -> None:
        try:
            super().close()  # flushes what a failed write left buffered, which fails again; the file is closed
        except OSError as e:
            self._give_up(e)

    def _give_up(self, err: OSError) -> None:
        """Keep no further records; the first time, say so on stderr."""
        if self.failed is None:
            self.failed = err
            print(f"warning: the run's log {self.baseFilename} cannot be written ({type(err).__name__}: {err}); "
                  "no further records are kept in it", file=sys.stderr, flush=True)


def route_library_logs() -> None:
    """Send the records of :data:`OWN_HANDLERS` to the root logger's handlers (the log file, the filtered console)
    instead of their own stderr handlers. Imports the installed ones' logging modules first (they add their handler
    when first imported; transformers and datasets are imported by every run anyway)."""
    for name in OWN_HANDLERS:
        if name not in sys.modules and importlib.util.find_spec(name) is None:
            continue
        if name == "transformers":
            from transformers.utils import logging as hf_logging

            hf_logging.disable_default_handler()
            hf_logging.enable_propagation()
        elif name in ("datasets", "huggingface_hub"):
            importlib.import_module(f"{name}.utils.logging")
        lib = logging.getLogger(name)
        for h in lib.handlers[:]:
            lib.removeHandler(h)
        lib.propagate = True


def library_progress_bars(enabled: bool) -> None:
    """Turn the progress bars transformers draws for every model it loads or saves (``Loading weights``, ``Writing
    model shards``) on or off. huggingface_hub's download bars and datasets' (the ``tokenizing`` map of
    ``data=hf_dataset``) stay as they are: each is the one bar of its phase."""
    if importlib.util.find_spec("transformers") is None:
        return
    import huggingface_hub.utils as hub
    from transformers.utils import logging as hf_logging

    hub_off = hub.are_progress_bars_disabled()
    (hf_logging.enable_progress_bar if enabled else hf_logging.disable_progress_bar)()
    (hub.disable_progress_bars if hub_off else hub.enable_progress_bars)()  # transformers switches both


@contextlib.contextmanager
def run_logging(log_file: Optional[Path], verbose: bool = False, console_level: int = logging.INFO,
                fmt: str = FORMAT) -> Iterator[None]:
    """Log as the module docstring says while the block runs: a :class:`ConsoleHandler` with :class:`ConsoleFilter`
    and, with ``log_file``, a file handler appending to it; Python warnings captured. The root logger's previous
    handlers come back afterwards (a sweep runs its jobs one after another in one process, each with its own log
    file).

    :param log_file: the run dir's log file (created with its folder), or ``None`` (console only).
    :param verbose: the console shows everything the file gets, and the engines' progress bars.
    :param console_level: records below it stay off the console unless ``verbose`` (``WARNING`` for the ranks
        other than 0 of a torchrun job).
    :param fmt: the records' format (:data:`FORMAT`; a torchrun worker's names its rank).
    """
    root, hf = logging.getLogger(), logging.getLogger("transformers")
    saved, root_level, project_level = root.handlers[:], root.level, _project.level
    route_library_logs()
    hf_level = hf.level
    if "TRANSFORMERS_VERBOSITY" not in os.environ and hf.level > logging.INFO:  # the Trainer's INFO records
        hf.setLevel(logging.INFO)
    library_progress_bars(verbose)
    formatter = logging.Formatter(fmt)
    console = ConsoleHandler()
    console.setLevel(min(console_level, logging.DEBUG) if verbose else console_level)
    console.addFilter(ConsoleFilter(verbose))
    console.setFormatter(PlainFormatter() if console_is_plain(verbose) else formatter)
    saved_engine = dict(_ENGINE_OUTPUT)
    _ENGINE_OUTPUT.update(log_file=log_file, verbose=verbose)
    ours: list = [console]
    if log_file is not None:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        fh = RunLogFile(log_file)
        fh.setFormatter(formatter)
        ours.append(fh)
    for h in saved:
        root.removeHandler(h)
    for h in ours:
        root.addHandler(h)
    if root.level == logging.NOTSET or root.level > logging.INFO:  # hydra.verbose=true leaves it at DEBUG
        root.setLevel(logging.INFO)
    if _project.level == logging.NOTSET or _project.level > logging.DEBUG:
        _project.setLevel(logging.DEBUG)
    logging.captureWarnings(True)
    try:
        yield
    finally:
        logging.captureWarnings(False)
        for h in ours:
            root.removeHandler(h)
            h.close()
        for h in saved:
            root.addHandler(h)
        root.setLevel(root_level)
        _project.setLevel(project_level)
        hf.setLevel(hf_level)
        _ENGINE_OUTPUT.clear()
        _ENGINE_OUTPUT.update(saved_engine)


#: where :func:`engine_output_to_log` sends the engines' stderr: the active :func:`run_logging`'s log file and
#: verbosity
_ENGINE_OUTPUT: dict = {}


@contextlib.contextmanager
def engine_output_to_log() -> Iterator[None]:
    """While the block runs, the process's stderr (file descriptor 2 and ``sys.stderr``: what engines print
    themselves, tqdm bars, the output of the programs they run) is appended to the active :func:`run_logging`'s log
    file (``os.devnull`` without one), unless that is ``verbose``. Outside :func:`run_logging` it changes nothing."""
    if not _ENGINE_OUTPUT or _ENGINE_OUTPUT.get("verbose"):
        yield
        return
    target = _ENGINE_OUTPUT.get("log_file") or os.devnull
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError:
        os.close(saved)
        yield
        return
    python_stderr = sys.stderr
    try:
        os.dup2(fd, 2)
        os.close(fd)
        sys.stderr = open(2, "w", encoding="utf-8", errors="replace", closefd=False)  # whatever sys.stderr was
        yield
    finally:
        sys.stderr.flush()
        sys.stderr = python_stderr
        os.dup2(saved, 2)
        os.close(saved)


@contextlib.contextmanager
def phase_progress(description: str, total: int, enabled: Optional[bool] = None) -> Iterator[Callable[[int], None]]:
    """One progress bar for a phase (training a segment, evaluating a step): a transient rich bar on the console
    while the block runs, when stdout is a terminal (``enabled=None``) or ``enabled``; nothing otherwise. Log lines
    print above it (:class:`ConsoleHandler`).

    :param total: units of the phase (steps, evals).
    :returns: (yields) ``update(completed)``, the units done so far.
    """
    if enabled is None:
        enabled = sys.stdout.isatty()
    if not enabled or total <= 0:
        yield lambda completed: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    # soft_wrap: a log line printed above the bar stays one line, however wide
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=Console(file=sys.stdout, soft_wrap=True), transient=True,
                  redirect_stderr=False) as bar:
        task = bar.add_task(description, total=total)
        yield lambda completed: bar.update(task, completed=min(int(completed), total))
