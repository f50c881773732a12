"""``placement.kind: explicit``: global token positions read from each item's ``placement.position_key`` (one per
copy; the dup count of an item is the number of positions it gives), placed before every drawn copy."""

from __future__ import annotations

from pretrain_exp.core.errors import ConfigError
from pretrain_exp.insertion.placements.base import PlacementSpec


class Explicit(PlacementSpec):
    """Positions given by the items; a span may cross a row boundary only with ``allow_row_crossing``."""

    name = "explicit"
    takes = frozenset({"position_key", "allow_row_crossing"})
    from_items = True

    def check(self, key, exp):
        """The positions come from a file: ``file`` is set (``repetitions``, a type's default, is not used).

        :raises ConfigError: naming ``<key>.placement``.
        """
        if exp.file is None:
            raise ConfigError(f"{key}.placement", "explicit placement reads positions from a file; set file")


KIND = Explicit()
