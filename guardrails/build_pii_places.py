"""Writes `guardrails/data/pii_places.txt`, the gazetteer `pii_places.py` reads, from the
installed phonenumbers package (libphonenumber's country names and geocoder data).

Usage: `.venv/bin/python -m guardrails.build_pii_places` (rerun after upgrading phonenumbers).
"""

from __future__ import annotations

import re
from pathlib import Path

from guardrails.pii_places import DATA_FILE

# Latin letters with their diacritics, and the spaces, hyphens and apostrophes inside names:
# the check reads English text, where names in other scripts rarely appear.
_LETTERS = "[A-Za-z\u00c0-\u024f\u1e00-\u1eff]+"
_LATIN_NAME = re.compile(rf"^{_LETTERS}(?:[ '\u2019.-]+{_LETTERS})*$")
# "Williston, FL", "Criciúma - SC", "Ալապարս/Վարդանավանք": a town, then its region.
_PARTS = re.compile(r",\s*|\s+-\s+|/")


def _names(description: str) -> list[str]:
    """The Latin-script names in one libphonenumber description; abbreviations ("FL",
    "SC") and single letters are left out."""
    return [
        part.strip()
        for part in _PARTS.split(description)
        if _LATIN_NAME.match(part.strip()) and len(part.strip()) > 2 and not part.isupper()
    ]


def build_names() -> tuple[set[str], set[str]]:
    """(countries, places) from the installed phonenumbers package."""
    from phonenumbers.geodata import GEOCODE_DATA
    from phonenumbers.geodata.locale import LOCALE_DATA

    countries = {
        name
        for by_language in LOCALE_DATA.values()
        for text in by_language.values()
        if not text.startswith("*")  # "*en": the same as another language's entry
        for name in _names(text)
    }
    places = {
        name
        for by_language in GEOCODE_DATA.values()
        for text in by_language.values()
        for name in _names(text)
    }
    return countries, places - countries


def write_data(path: Path) -> tuple[int, int]:
    """Write the gazetteer file (`C\\tname` for countries, `P\\tname` for places)."""
    countries, places = build_names()
    lines = [f"C\t{n}" for n in sorted(countries)] + [f"P\t{n}" for n in sorted(places)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(countries), len(places)


if __name__ == "__main__":
    target = Path(__file__).resolve().parent / "data" / DATA_FILE
    n_countries, n_places = write_data(target)
    print(f"{target}: {n_countries} country names, {n_places} other places")
