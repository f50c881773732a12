"""``type: tokens``: token-id lists read from a jsonl file (each line a list, or a list under ``key``), inserted as
given (after the EOS policy)."""

from __future__ import annotations

from dataclasses import dataclass

from pretrain_exp.core.errors import ConfigError, DataError
from pretrain_exp.data.token_files import dtype_for_vocab
from pretrain_exp.insertion.items import (
    ItemSet,
    LoadContext,
    assign_dup_counts,
    experiment_rng,
    first_items,
    is_int,
    read_item_file,
    tokenized_items,
)
from pretrain_exp.insertion.placements import kind_of
from pretrain_exp.insertion.schema import InsertionExperimentConf
from pretrain_exp.insertion.token_jsonl import LineSources, read_token_items
from pretrain_exp.insertion.types.base import LOSS_GAP, TypeSpec


@dataclass
class TokensConf(InsertionExperimentConf):
    """A ``type: tokens`` experiment: ``file`` of token-id lists (the line itself, or under ``key``)."""

    type: str = "tokens"

    def validate(self, key: str) -> None:
        """Static checks (no files read).

        :raises ConfigError: naming the offending key.
        """
        if self.file is None:
            raise ConfigError(f"{key}.file", f"missing: set {key}.file=<items.jsonl>")
        super().validate(key)


def _check_tokens(where: str, payload) -> None:
    if not (isinstance(payload, list) and all(is_int(t) for t in payload)):
        raise DataError(f"{where}: expected a list of integer token ids")


def load_items(name: str, exp: TokensConf, ctx: LoadContext) -> ItemSet:
    """The token lists of ``exp.file`` (sources ``file:line``), checked against ``ctx.vocab_size``, EOS policy
    applied, dup counts assigned. Files of bare lists take the vectorized reader
    (:mod:`~pretrain_exp.insertion.token_jsonl`; tokens in the smallest dtype holding the vocabulary); anything it
    does not accept, errors included, takes the exact per-item path (``int64`` tokens).

    :raises DataError: for file problems (naming file and line).
    :raises InsertionError: for an empty or too long item or a token id out of range, naming it.
    """
    key = f"insertion.experiments.{name}"
    if exp.key is None and not kind_of(exp, key).from_items:
        eos = int(ctx.tokenizer.eos_token_id) if ctx.tokenizer is not None else None
        fast = read_token_items(exp.file, vocab_size=ctx.vocab_size, sequence_length=ctx.sequence_length, eos=eos,
                                policy=exp.eos, dtype=dtype_for_vocab(ctx.vocab_size), num_items=exp.num_items)
        if fast is not None:
            n = fast.lines.size
            dups = assign_dup_counts(n, exp.repetitions, experiment_rng(ctx.seed, name), f"{key}.repetitions")
            return ItemSet(name, fast.tokens, fast.offsets, dups, sources=LineSources(exp.file, fast.lines))
    raw = list(read_item_file(key, exp, exp.key, _check_tokens))
    return tokenized_items(name, exp, first_items(key, exp, raw), ctx, text=False)


TYPE = TypeSpec(TokensConf, load_items, effect=LOSS_GAP)
