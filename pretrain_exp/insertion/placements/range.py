"""``placement.kind: range``: copies drawn uniformly over the complete rows inside ``[start, end)`` of the training
window, in fractions of the window (``unit: fraction``) or global token positions (``unit: position``)."""

from __future__ import annotations

import math
from fractions import Fraction

from pretrain_exp.core.errors import ConfigError
from pretrain_exp.insertion.placements.base import PlacementSpec
from pretrain_exp.insertion.schema import RangeUnit


class Range(PlacementSpec):
    """Uniform over ``[placement.start, placement.end)`` of the window."""

    name = "range"
    takes = frozenset({"start", "end", "unit", "steps", "every_n_steps", "max_per_batch"})

    def check(self, key, exp):
        """``start`` and ``end`` set, ``start < end``; fractions in ``[0, 1]``, positions integers.

        :raises ConfigError: naming ``<key>.placement``.
        """
        pl = exp.placement
        if pl.start is None or pl.end is None:
            raise ConfigError(f"{key}.placement", "range placement needs placement.start and placement.end")
        if not pl.start < pl.end:
            raise ConfigError(f"{key}.placement", f"start ({pl.start}) must be < end ({pl.end})")
        if pl.unit == RangeUnit.fraction and not (0.0 <= pl.start and pl.end <= 1.0):
            raise ConfigError(f"{key}.placement", f"fractions must lie in [0, 1], got [{pl.start}, {pl.end})")
        if pl.unit == RangeUnit.position and (pl.start != int(pl.start) or pl.end != int(pl.end)):
            raise ConfigError(f"{key}.placement", "token positions must be integers")

    def row_range(self, key, placement, window, sequence_length):
        """The complete rows inside the range. For fractions ``[start, end)`` of the window's ``n`` rows,
        ``lo = first + ceil(start*n)`` and ``hi = first + floor(end*n)``, the fractions taken exactly as the
        decimals they print as (0.29 of 100 rows ends at row 29, not at ``floor(28.999...)``).

        :raises ConfigError: for a range outside the window, not aligned to L, or holding no complete row.
        """
        L, pl = sequence_length, placement
        first, last = window[0] // L, window[1] // L
        if pl.unit == RangeUnit.fraction:
            n = last - first
            lo = first + math.ceil(Fraction(str(pl.start)) * n)
            hi = first + math.floor(Fraction(str(pl.end)) * n)
        else:
            start, end = int(pl.start), int(pl.end)
            if start % L or end % L:
                raise ConfigError(f"{key}.placement", f"range [{start}, {end}) is not aligned to the sequence "
                                  f"length {L}")
            if start < window[0] or end > window[1]:
                raise ConfigError(f"{key}.placement", f"range [{start}, {end}) lies outside the training window "
                                  f"[{window[0]}, {window[1]})")
            lo, hi = start // L, end // L
        if hi <= lo:
            raise ConfigError(f"{key}.placement", f"range [{pl.start}, {pl.end}) holds no complete row of the window")
        return lo, hi


KIND = Range()
