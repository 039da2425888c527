"""A gazetteer of countries and places for the LOCATION check, from libphonenumber's data.

The small English spaCy model knows few places outside the English-speaking world, and reads
many ("Salamanca", "Dąbrowa Górnicza") as people. libphonenumber, which ships with the
`phonenumbers` dependency (Apache 2.0), names every country in some 60 languages
("Moldavie", "Mołdawia") and the towns and regions of the area codes of most countries.
Loading its geocoder data takes ~90 MB, so `guardrails/build_pii_places.py` writes the
Latin-script names once to `data/pii_places.txt` (0.5 MB), which the check reads.
"""

from __future__ import annotations

import functools
import importlib.resources
import unicodedata
from dataclasses import dataclass

DATA_FILE = "pii_places.txt"


# Letters that Unicode does not decompose into a base letter and a mark.
_UNDECOMPOSED = str.maketrans(
    {"\u0131": "i", "ł": "l", "Ł": "L", "ø": "o", "Ø": "O", "đ": "d", "Đ": "D"}  # U+0131: dotless i
)


def fold(name: str) -> str:
    """The name without diacritics: libphonenumber writes many towns in ASCII
    ("Eskisehir"), people write them either way ("Eskişehir")."""
    decomposed = unicodedata.normalize("NFKD", name.translate(_UNDECOMPOSED))
    return "".join(c for c in decomposed if not unicodedata.combining(c))


@dataclass(frozen=True, slots=True)
class Gazetteer:
    """Country names (in many languages) and other place names, folded (`fold`)."""

    countries: frozenset[str]
    places: frozenset[str]

    def is_country(self, name: str) -> bool:
        return fold(name) in self.countries

    def is_place(self, name: str) -> bool:
        folded = fold(name)
        return folded in self.places or folded in self.countries


@functools.lru_cache(maxsize=1)
def gazetteer() -> Gazetteer:
    """The shipped gazetteer, read once (a few milliseconds)."""
    text = importlib.resources.files("guardrails").joinpath("data", DATA_FILE).read_text("utf-8")
    countries: set[str] = set()
    places: set[str] = set()
    for line in text.splitlines():
        kind, _, name = line.partition("\t")
        (countries if kind == "C" else places).add(fold(name))
    return Gazetteer(frozenset(countries), frozenset(places))
