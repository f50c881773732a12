"""A run's training data from one plain spec: :func:`open_corpus` ``(CorpusSpec) -> Corpus``.

In one trip down the data layer: the tokenizer (a registry asset or a dir,
:func:`~pretrain_exp.data.tokenize.load_tokenizer`), the corpus tokenized once into the cache if it is text or a
``datasets`` corpus (in the run's token-file dtype), the token files' size index
(:class:`~pretrain_exp.data.token_files.TokenFiles`), the data order (:class:`~pretrain_exp.data.order.DataOrder`)
with the permutations of the training window built, the held-out rows (a null ``data.held_out_rows`` resolved:
:func:`fit_held_out`, :func:`held_out_collision`; a collision is refused before anything is fetched), and the
window's remote rows fetched now (``data.prefetch=window``) or a :class:`~pretrain_exp.data.stream.WindowStream` made
ready to fetch them beside training (``stream``; not started). Nothing here starts a process or a thread.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Optional, Tuple

from pretrain_exp.core.config import DEFAULT_HELD_OUT_ROWS, DataConf
from pretrain_exp.core.errors import ConfigError
from pretrain_exp.core.phases import PHASES
from pretrain_exp.data.hf_dataset import tokenize_dataset
from pretrain_exp.data.order import DataOrder, step_window
from pretrain_exp.data.prefetch import prefetch_window, resolve_prefetch
from pretrain_exp.data.stream import WindowStream
from pretrain_exp.data.token_files import TokenFiles, token_dtypes
from pretrain_exp.data.tokenize import cached_token_files, load_tokenizer, read_tokenizer, tokenize_sources

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class CorpusSpec:
    """What a run's data is made of, as plain values.

    :param data: the ``data`` node (corpus, order, prefetch, held-out rows).
    :param tokenizer: the tokenizer's name (a registry asset) or dir; ``cache_dir``: the project cache.
    :param sequence_length: L (tokens per row); ``global_batch_size``: B (rows per step).
    :param start_step: the step the run starts from (the window's first row is ``start_step * B``); ``num_steps``:
        the steps it trains.
    :param model_vocab_size: the model's vocabulary size (``None`` or 0: the tokenizer's length).
    :param reserved_rows: rows just before the held-out ones that the run reserves (``corpus_chunks`` items).
    :param checkpoint_trained_order: whether the checkpoint trained the rows before the window of this order (an
        OLMo checkpoint whose data order the run continues).
    """

    data: DataConf
    tokenizer: str
    cache_dir: str
    sequence_length: int
    global_batch_size: int
    start_step: int = 0
    num_steps: int = 0
    model_vocab_size: Optional[int] = None
    reserved_rows: int = 0
    checkpoint_trained_order: bool = False

    @property
    def rows(self) -> Tuple[int, int]:
        """The window's training-order rows: ``(first row, number of rows)``."""
        B = self.global_batch_size
        return self.start_step * B, self.num_steps * B


@dataclasses.dataclass
class Corpus:
    """A run's opened data (:func:`open_corpus`).

    :param tokenizer: the tokenizer; ``vocab_size``: the model's, else the tokenizer's length.
    :param order: the data order; ``window``: the training window ``(first, end)`` in global token positions.
    :param window_fetched: whether the window's token files are local, prefetched or streamed.
    :param stream: ``data.prefetch=stream``: the window stream, not started (``None`` otherwise).
    :param held_out_rows: the held-out (perplexity) rows, ``data.held_out_rows`` resolved.
    """

    tokenizer: Any
    vocab_size: int
    order: DataOrder
    window: Tuple[int, int] = (0, 0)
    window_fetched: bool = True
    stream: Optional[WindowStream] = None
    held_out_rows: int = 0


def open_order(spec: CorpusSpec, progress: bool = True, tokenizer: Any = None, paths: Any = None) -> Corpus:
    """The tokenizer and the data order of ``spec``, nothing of its window: what a reader of a run's rows needs
    (``window``, ``stream`` and ``held_out_rows`` left at their defaults). A text or ``datasets`` corpus is
    tokenized once into the cache, in the run's token-file dtype
    (:func:`~pretrain_exp.data.token_files.token_dtypes`).

    :param tokenizer: the tokenizer, if read already (else loaded here); ``paths``: the corpus's token files, if
        known already (:func:`read_order`).
    """
    d = spec.data
    if tokenizer is None:
        with PHASES.phase("tokenizer"):
            tokenizer = load_tokenizer(spec.tokenizer, spec.cache_dir)
    vocab_size = spec.model_vocab_size or len(tokenizer)
    dtype, tokenized = token_dtypes(d.dtype, vocab_size, len(tokenizer))
    if paths is None:
        with PHASES.phase("corpus"):
            paths = d.paths or (tokenize_dataset(d.dataset, tokenizer, d.token_dir, d.split, d.subset, d.text_key,
                                                 d.num_proc, progress=progress, dtype=tokenized) if d.dataset else
                                tokenize_sources(d.text, tokenizer, d.token_dir, spec.cache_dir, d.text_key,
                                                 dtype=tokenized))
    with PHASES.phase("size index") as rec:
        files = TokenFiles(paths, dtype, cache_dir=spec.cache_dir, prefixes=d.path_prefixes, progress=progress)
        rec.update(files=len(files.paths), remote=int(sum(files.remote)))
    L = spec.sequence_length
    order = DataOrder(files, L, spec.global_batch_size, d.seed, d.first_epoch, cache_dir=spec.cache_dir,
                      chunk=(d.max_target_sequence_length or L) // L)
    return Corpus(tokenizer, vocab_size, order)


def read_order(spec: CorpusSpec, progress: bool = True) -> Corpus:
    """:func:`open_order` for a reader of rows tokenized before (the inspector): the tokenizer is a
    :class:`~pretrain_exp.data.tokenize.TokenizerFile` where one can be read and the corpus is in the cache under
    its key (no ``transformers`` import); a ``datasets`` corpus, or a text source not in the cache under that key,
    is opened as for a run."""
    d = spec.data
    reader = None if d.dataset else read_tokenizer(spec.tokenizer, spec.cache_dir)
    if reader is not None:
        _, tokenized = token_dtypes(d.dtype, spec.model_vocab_size or len(reader), len(reader))
        paths = d.paths or cached_token_files(d.text, reader, d.token_dir, d.text_key, tokenized)
        if paths:
            return open_order(spec, progress, reader, paths)
    return open_order(spec, progress)


def open_corpus(spec: CorpusSpec, main: bool = True) -> Corpus:
    """Open the data of ``spec`` and make its training window ready (module docstring); ``main``: this process is
    rank 0 (progress bars, the held-out warning).

    :raises ConfigError: (``data.held_out_rows``) for held-out rows the run or the checkpoint may train;
        (``data.prefetch``) for an unknown mode.
    :raises DataError: for token files that cannot be read or fetched.
    """
    corpus = open_order(spec, progress=main)
    order, (first, count) = corpus.order, spec.rows
    corpus.window = step_window(spec.start_step, spec.num_steps, spec.sequence_length, spec.global_batch_size)
    with PHASES.phase("permutation") as rec:
        rec.update(instances=order.num_instances, cached=order.prepare(first, count))
    corpus.held_out_rows = resolve_held_out(spec, order, main)  # refused before anything is fetched
    corpus.window_fetched, corpus.stream = _fetch_window(spec, order, main)
    return corpus


def _fetch_window(spec: CorpusSpec, order: DataOrder, main: bool) -> Tuple[bool, Optional[WindowStream]]:
    """``data.prefetch``: fetch the window's remote rows now (``window``), or make the stream that fetches them
    beside training (``stream``, not started). Returns ``(whether the window is local or fetched, the stream)``."""
    first, count = spec.rows
    prefetch = resolve_prefetch(spec.data.prefetch, order.files)
    fetched = prefetch in ("window", "stream") or not any(order.files.remote)
    if prefetch == "window":  # remote rows of the run, fetched once
        with PHASES.phase("prefetch", mode="window") as rec:
            rec["fetched_bytes"] = prefetch_window(order, first, count, progress=main).fetched_bytes
    elif prefetch == "stream" and spec.num_steps:
        return fetched, WindowStream(order, first, count, ahead_steps=spec.data.prefetch_ahead_steps)
    return fetched, None


def resolve_held_out(spec: CorpusSpec, order: DataOrder, main: bool = True) -> int:
    """``data.held_out_rows``, a null one resolved (:func:`fit_held_out`, logged when fewer than the default fit);
    held-out rows that the run or the checkpoint may train are refused.

    :raises ConfigError: (``data.held_out_rows``) for a set value, or ``corpus_chunks`` rows, that collide.
    """
    first, count = spec.rows
    span = (first, first + count, order.rows_per_epoch, spec.checkpoint_trained_order)
    n, reserved = spec.data.held_out_rows, spec.reserved_rows
    if n is None:
        n = fit_held_out(DEFAULT_HELD_OUT_ROWS, reserved, *span)
        if n < DEFAULT_HELD_OUT_ROWS and main:
            log.warning("data.held_out_rows: %d held-out row(s) at the end of the first epoch (not %d): the run%s "
                        "trains the rows before them%s; set data.held_out_rows to choose", n,
                        DEFAULT_HELD_OUT_ROWS, " and the checkpoint" if span[3] else "",
                        " (no held-out perplexity)" if n == 0 else "")
    why = held_out_collision(n + reserved, *span)
    if why:
        raise ConfigError("data.held_out_rows", f"{why} (perplexity rows and corpus_chunks items); lower "
                          "data.held_out_rows or the corpus_chunks num_items, or train fewer steps")
    return n


def fit_held_out(default: int, reserved: int, first_row: int, end_row: int, rows_per_epoch: int,
                 checkpoint_trained_order: bool) -> int:
    """The most held-out rows, at most ``default``, that together with ``reserved`` rows before them
    (``corpus_chunks`` items) provably stay untrained (:func:`held_out_collision`); 0 when none do."""
    for n in range(default, 0, -1):
        if held_out_collision(n + reserved, first_row, end_row, rows_per_epoch, checkpoint_trained_order) is None:
            return n
    return 0


def held_out_collision(n: int, first_row: int, end_row: int, rows_per_epoch: int,
                       checkpoint_trained_order: bool) -> Optional[str]:
    """Why the ``n`` held-out rows ``[rows_per_epoch - n, rows_per_epoch)`` (the first epoch's last rows,
    :meth:`DataOrder.held_out_rows <pretrain_exp.data.order.DataOrder.held_out_rows>`) may have been trained, or
    ``None`` when they provably were not. The run trains rows ``[first_row, end_row)``; with
    ``checkpoint_trained_order`` (an OLMo checkpoint whose data order the run continues) the checkpoint trained
    ``[0, first_row)`` too, so every row before ``end_row`` counts (past the first epoch, all of it)."""
    if not n:
        return None
    start = rows_per_epoch - n
    if checkpoint_trained_order and end_row > start:
        return (f"the checkpoint and the run train rows [0, {end_row}) of their data order, which reach the {n} "
                f"held-out rows [{start}, {rows_per_epoch}) of the first epoch")
    if first_row < rows_per_epoch and end_row > start:
        return (f"the run trains rows [{first_row}, {end_row}), which reach the {n} held-out rows "
                f"[{start}, {rows_per_epoch}) of the first epoch")
    return None
