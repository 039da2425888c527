"""PERSON and LOCATION from the words around a capitalised name.

The small English spaCy model misses many names, above all names that are not English
("Tobiasz Kunc", "Ostrowiec Świętokrzyski"), and often calls a person a place or an
organisation. The phrase before a name usually says which it is: "spoke with X", "ask X",
"Dr. X" introduce a person; "moved to X", "office in X", "ship to X" a place; "X will
join" after a two-word name a person. This recognizer emits such spans with a score above
spaCy's (0.85), so the context decides the type where the two overlap. A bare "in",
"from" or "near" before a name is a weaker cue ("in Excel" is no place): scored under
spaCy, so its labels win. Names of teams, environments and acronyms are left alone.
"""

from __future__ import annotations

import re

from presidio_analyzer import EntityRecognizer, RecognizerResult
from presidio_analyzer.nlp_engine import NlpArtifacts

CONTEXT_SCORE = 0.9

# Every upper-case letter of the Basic Multilingual Plane, so names in any Latin, Greek or
# Cyrillic script count as capitalised (`re` has no \p{Lu}).
_UPPER = "[" + "".join(re.escape(chr(c)) for c in range(0x10000) if chr(c).isupper()) + "]"
_WORD = _UPPER + r"[^\W\d_]*(?:['\u2019-][^\W\d_]+)*"
# Particles inside names and places: "Charlotte van Vliet", "Vila Nova de Famalicão".
_PARTICLE = (
    r"(?:de|da|do|dos|das|del|della|di|du|des|la|le|van|von|der|den|ten|ter|y|e|al|el|bin|"
    r"ibn|of|am|an|im|sur|&)"
)
_NAME = re.compile(rf"{_WORD}(?:\s+(?:{_PARTICLE}\s+)*{_WORD}){{0,5}}")

_PERSON_BEFORE = re.compile(
    r"(?:\b(?:spoke|speak(?:s|ing)?|talk(?:s|ed|ing)?|chat(?:s|ted|ting)?|met|meet(?:s|ing)?|"
    r"meetings?|call(?:s|ed)?|sync(?:ed)?|lunch|dinner|interview(?:s|ed)?|work(?:s|ed|ing)?)"
    r"\s+with"
    r"|\b(?:ask(?:s|ed)?|tell|told|thank(?:s|ed)?|cc|bcc|e-?mail(?:s|ed)?|contact(?:s|ed)?|"
    r"invite[sd]?|remind(?:s|ed)?|dear|hi|hello|hey|regards,?|attn:?)"
    r"|\b(?:forward(?:s|ed)?|talk(?:s|ed)?|speak|write|wrote|introduce[sd]?|"
    r"reach(?:ed)?\s+out|escalate[sd]?|assign(?:s|ed)?)\s+(?:it\s+|this\s+|them\s+)?to"
    r"|\b(?:mr|mrs|ms|miss|dr|prof|sir|madam|herr|frau|mme|mlle|sr|sra|srta|sig|dott|pan|pani|"
    r"bay|bayan|dhr|mevr)\.?)\s+$",
    re.IGNORECASE,
)
_LOCATION_BEFORE = re.compile(
    r"(?:\b(?:move[sd]?|moving|relocat(?:e[sd]?|ing)|travel(?:l?ed|l?ing|s)?|fl(?:y|ies|ew|ying)|"
    r"flights?|trips?|ship(?:s|ped|ping)?|deliver(?:s|ed|ing|y)?|emigrat(?:e[sd]?|ing)|"
    r"expand(?:s|ed|ing)?|commut(?:e[sd]?|ing))\s+(?:\w+\s+){0,2}to"
    r"|\b(?:offices?|branch(?:es)?|based|located|headquartered|headquarters(?:\s+(?:is|are))?|"
    r"lives?|lived|living|born|residing|resident|stores?|warehouses?|plants?|factory|factories|"
    r"campus|studios?|customers|clients|operations|takes?\s+place|airport|hotels?)\s+in"
    r"|\b(?:train|flights?|bus|drive|shipments?|deliver(?:y|ies)|road|route|way)\s+(?:from|to)"
    r"|\b(?:moved|relocated|flying|flew|came|coming|travell?ing)\s+from"
    r"|\b(?:city|town|village|country|region|province|state)\s+of)\s+$",
    re.IGNORECASE,
)
# Weaker: a place as often as not ("in Excel", "from Jenkins"), so scored under spaCy.
_LOCATION_WEAK_BEFORE = re.compile(r"\b(?:in|from|near|across|throughout)\s+$", re.IGNORECASE)
WEAK_SCORE = 0.5
# A name of two words or more before one of these is a person ("Crystal White will join").
_PERSON_AFTER = re.compile(
    r"\s+(?:will|would|said|says|wrote|writes|asked|asks|joined|joins|agreed|agrees|approved|"
    r"called|emailed|mentioned|confirmed|replied|thinks|thought)\b"
)
_BEFORE_WINDOW = 48


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Capitalised words that open a sentence or name a day, not a person or a place.
_NOT_NAMES = _words(
    """i a an the this that these those he she we they it you my our your his her their its
    monday tuesday wednesday thursday friday saturday sunday january february march april may
    june july august september october november december today tomorrow yesterday please
    thanks hi hello dear all everyone team"""
)
# Words that make a capitalised run a team, an organisation or a product: "ask Legal",
# "forward it to Accounts Payable" name a function, not a person.
_NOT_PERSON_WORDS = _words(
    """team project group department dept inc ltd llc gmbh corp co company bank university
    office services service systems system support sales marketing finance legal board
    committee council server cluster api app platform release version plan security
    facilities engineering procurement purchasing operations ops devops it hr qa admin
    design product success management payable receivable accounts accounting compliance
    research development infrastructure helpdesk desk customer vendor vendors partners
    treasury payroll people talent recruiting world"""
)
# Words that make a capitalised run a deployment, a tier or a product, not a place.
_NOT_PLACE_WORDS = _words(
    """production staging development dev test testing cloud tier plan edition cluster server
    servers database environment sandbox suite app platform version release"""
)


class ContextNameRecognizer(EntityRecognizer):
    """PERSON and LOCATION spans that a cue phrase next to a capitalised name types."""

    def __init__(self) -> None:
        super().__init__(
            supported_entities=["PERSON", "LOCATION"], name="context_names", supported_language="en"
        )

    def load(self) -> None:
        """Nothing to load: the cues are compiled at import."""

    def analyze(
        self, text: str, entities: list[str], nlp_artifacts: NlpArtifacts | None = None
    ) -> list[RecognizerResult]:
        wanted = set(entities) & {"PERSON", "LOCATION"}
        results = []
        for entity, start, end, score in context_names(text):
            if entity in wanted:
                results.append(RecognizerResult(entity, start, end, score))
        return results


def context_names(text: str) -> list[tuple[str, int, int, float]]:
    """(entity, start, end, score) for each capitalised name that a cue phrase types."""
    found: list[tuple[str, int, int, float]] = []
    for match in _NAME.finditer(text):
        typed = _typed(text, match.start(), match.end())
        if typed is not None:
            found.append(typed)
    return found


def _typed(text: str, start: int, end: int) -> tuple[str, int, int, float] | None:
    """The run's type from the cue before it, or before one of its words: a cue at the
    start of a sentence is capitalised too ("Ask Fabio Cocci", "Ship to Teruel")."""
    words = [(start + w.start(), w.group()) for w in re.finditer(r"\S+", text[start:end])]
    for i, (word_start, _) in enumerate(words):
        name = [w for _, w in words[i:]]
        if name[0].lower() in _NOT_NAMES:
            continue
        before = text[max(0, word_start - _BEFORE_WINDOW) : word_start]
        if _LOCATION_BEFORE.search(before) and _looks_like_place(name):
            return "LOCATION", word_start, end, CONTEXT_SCORE
        if _PERSON_BEFORE.search(before) and _looks_like_person(name):
            return "PERSON", word_start, end, CONTEXT_SCORE
    for i, (word_start, _) in enumerate(words):
        name = [w for _, w in words[i:]]
        if name[0].lower() in _NOT_NAMES:
            continue
        if len(name) >= 2 and _PERSON_AFTER.match(text, end) and _looks_like_person(name):
            return "PERSON", word_start, end, CONTEXT_SCORE
        before = text[max(0, word_start - _BEFORE_WINDOW) : word_start]
        if _LOCATION_WEAK_BEFORE.search(before) and _looks_like_place(name):
            return "LOCATION", word_start, end, WEAK_SCORE
        return None
    return None


def _looks_like_person(words: list[str]) -> bool:
    return not _acronyms(words) and not any(_bare(w) in _NOT_PERSON_WORDS for w in words)


def _looks_like_place(words: list[str]) -> bool:
    return not _acronyms(words) and not any(_bare(w) in _NOT_PLACE_WORDS for w in words)


def _acronyms(words: list[str]) -> bool:
    """All words upper case ("SAP", "AWS"): a product or an organisation far more often
    than a person or a place; spaCy's NER still types the well-known places ("UK")."""
    return all(w.isupper() for w in words)


def _bare(word: str) -> str:
    return word.lower().strip(".,")
