"""Built-in item generators: novel texts, deterministic from a seed.

Each generator maps ``(num_items, seed)`` to a list of texts that are not in any corpus: names and places are
assembled from random syllables, so a model cannot have seen them in pretraining and every item is distinct.
"""

from __future__ import annotations

from typing import Callable, Dict, List

import numpy as np

_ONSETS = ["b", "br", "d", "dr", "f", "g", "gl", "k", "kr", "l", "m", "n", "p", "pl", "r", "s", "st", "t",
           "th", "v", "z", "qu", "sh", "ch", "w", "y"]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ei", "ou", "ia", "y"]
_CODAS = ["", "n", "r", "l", "s", "th", "x", "m", "nd", "rk", "sk", "v"]
_PROFESSIONS = ["cartographer", "glassblower", "beekeeper", "astronomer", "clockmaker", "botanist",
                "ferryman", "archivist", "lute maker", "salt merchant", "bridge engineer", "dyer",
                "falconer", "cooper", "lighthouse keeper", "mapmaker", "apothecary", "stonemason", "weaver",
                "shipwright"]
_OBJECTS = ["tidal clocks", "copper lanterns", "river maps", "winter bees", "blue glass", "star charts",
            "salt roads", "paper boats", "iron bells", "moss gardens", "silver looms", "storm kites"]
_TRAITS = ["kept a tame heron", "refused to travel by boat", "wrote only in green ink",
           "collected broken compasses", "spoke four forgotten dialects",
           "slept in a lighthouse every summer", "never ate bread", "carried a brass owl",
           "walked barefoot in snow", "counted every step of the harbour stairs"]


def _word(rng: np.random.Generator, syllables: int) -> str:
    parts = [rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables)]
    return "".join(parts).capitalize()


def fictional_bios(num_items: int, seed: int) -> List[str]:
    """Short biographies of fictional people (about 40 tokens each), unique names, deterministic in
    ``seed``."""
    rng = np.random.Generator(np.random.PCG64([int(seed), 0xB105]))
    names: set = set()
    out = []
    while len(out) < num_items:
        name = f"{_word(rng, 2)} {_word(rng, 3)}"
        if name in names:
            continue
        names.add(name)
        first = name.split()[0]
        out.append(
            f"{name} was born in {int(rng.integers(1610, 1890))} in the village of {_word(rng, 2)}. "
            f"A {rng.choice(_PROFESSIONS)} by trade, {first} built {int(rng.integers(3, 40))} "
            f"{rng.choice(_OBJECTS)} and {rng.choice(_TRAITS)}."
        )
    return out


GENERATORS: Dict[str, Callable[[int, int], List[str]]] = {"fictional_bios": fictional_bios}
