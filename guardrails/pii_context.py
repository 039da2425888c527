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

from guardrails.pii_places import gazetteer

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
    r"bay|bayan|dhr|mevr)\.?"
    # Italian titles with their endings: "Sig.ra", "Dott.ssa", "Ing.".
    r"|\b(?:sig\.?r[ao]|sig\.?na|dott\.?ssa|ing|avv|arch|geom)\.?"
    # "my manager is X", "our contact there is X", "the assignee: X": a role, then a name.
    r"|\b(?:my|our|your|his|her|their|the)\s+(?:new\s+|former\s+|main\s+|direct\s+)?"
    r"(?:manager|boss|supervisor|lead|contact|colleague|co-?worker|assistant|director|owner|"
    r"assignee|reviewer|approver|mentor|sponsor|recruiter|advisor|adviser|lawyer|attorney|"
    r"doctor|landlord|tenant|partner|wife|husband|son|daughter|mother|father|friend|"
    r"neighbou?r|ceo|cto|cfo|coo|founder|chair|president|accountant|tutor|teacher|coach)"
    r"(?:\s+(?:there|here|now|today))?\s+(?:is|was|will\s+be|:)"
    r"|\b(?:cc|bcc)(?:'?d)?|\bloop\s+in|\bpinged?)\s+$",
    re.IGNORECASE,
)
# Cues that a company or a product follows as often as a person ("acquired by Google",
# "Can Google Pay ..."), so they type only a name of two words or more.
_FULL_NAME_BEFORE = re.compile(
    # A passive's agent: "accepted by X", "signed off by X".
    r"(?:\b(?:\w+ed|written|signed|done|made|sent|given|taken|seen|led|run|held|owned|won)"
    r"(?:\s+off)?\s+by"
    # A question about what someone does: "Can X sign ...?", "Did X reply?".
    r"|(?:^|[.!?:]\s+)(?:can|could|will|would|should|did|does|do|has|have|may|might|shall|is|"
    r"was)|\b(?:when|why|where|how)\s+(?:will|did|does|can|could|would|has|is|was))\s+$",
    re.IGNORECASE,
)
_PASSIVE_AFTER = re.compile(r"\s+(?:be|been|being)\b", re.IGNORECASE)
_LOCATION_BEFORE = re.compile(
    r"(?:\b(?:move[sd]?|moving|relocat(?:e[sd]?|ing)|travel(?:l?ed|l?ing|s)?|fl(?:y|ies|ew|ying)|"
    r"flights?|trips?|ship(?:s|ped|ping)?|deliver(?:s|ed|ing|y)?|emigrat(?:e[sd]?|ing)|"
    r"expand(?:s|ed|ing)?|commut(?:e[sd]?|ing))\s+(?:\w+\s+){0,2}to"
    r"|\b(?:offices?|branch(?:es)?|based|located|headquartered|headquarters(?:\s+(?:is|are))?|"
    r"lives?|lived|living|born|residing|resident|stores?|warehouses?|plants?|factory|factories|"
    r"campus|studios?|customers|clients|operations|takes?\s+place|airport|hotels?|sites?|"
    r"facilit(?:y|ies)|depots?|hubs?|subsidiar(?:y|ies)|headcount|team\s+is)\s+in"
    r"|\bbased\s+(?:out\s+of|at|near)"
    r"|\b(?:train|flights?|bus|drive|shipments?|deliver(?:y|ies)|road|route|way)\s+(?:from|to)"
    r"|\b(?:moved|relocated|flying|flew|came|coming|travell?ing)\s+from"
    r"|\b(?:city|town|village|country|region|province|state)\s+of)\s+$",
    re.IGNORECASE,
)
# Weaker: a place as often as not ("in Excel", "from Jenkins"), so scored under spaCy.
_LOCATION_WEAK_BEFORE = re.compile(
    r"\b(?:in|from|near|across|throughout|around|outside|within|welcome\s+to|visit(?:s|ed|ing)?|"
    r"left|leaving|reached|arrived\s+(?:in|at))\s+$",
    re.IGNORECASE,
)
WEAK_SCORE = 0.5
# Of those, the ones a person seldom follows ("in Avigliano Scalo", "near Salamanca"): when
# spaCy reads the name as a person, the preposition wins (a possessive, "in Anna's team",
# is left to spaCy).
_PLACE_PREPOSITION = re.compile(
    r"\b(?:in|near|across|throughout|around|outside|within)\s+$", re.IGNORECASE
)
PREPOSITION_SCORE = 0.86
# After these a name in the gazetteer is a place, above spaCy's reading (it takes many
# places, "near Salamanca", for people); "to" and "at" only with the gazetteer.
_GAZETTEER_BEFORE = re.compile(r"\b(?:to|at|of)\s+$", re.IGNORECASE)
# A country named anywhere, without a cue: under spaCy's score, so its PERSON wins
# ("Jordan will join"), above the threshold.
COUNTRY_SCORE = 0.8
# A name of two words or more before one of these is a person ("Crystal White will join").
_PERSON_AFTER = re.compile(
    r"\s+(?:will|would|said|says|wrote|writes|asked|asks|joined|joins|agreed|agrees|approved|"
    r"called|emailed|mentioned|confirmed|replied|thinks|thought|has|had|left|signed|sent|"
    r"is\s+(?:out|off|away|on\s+leave|back)|was\s+(?:promoted|hired|fired))\b"
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
        if _cue(_LOCATION_BEFORE, text, word_start) and _looks_like_place(name):
            return "LOCATION", word_start, end, CONTEXT_SCORE
        if (
            _cue(_PERSON_BEFORE, text, word_start) or _full_name_cue(text, word_start, end, name)
        ) and _looks_like_person(name):
            return "PERSON", word_start, end, CONTEXT_SCORE
    for i, (word_start, _) in enumerate(words):
        name = [w for _, w in words[i:]]
        if name[0].lower() in _NOT_NAMES:
            continue
        if len(name) >= 2 and _PERSON_AFTER.match(text, end) and _looks_like_person(name):
            return "PERSON", word_start, end, CONTEXT_SCORE
        if not _looks_like_place(name):
            return None
        known = gazetteer()
        if _cue(_LOCATION_WEAK_BEFORE, text, word_start):
            if known.is_place(" ".join(name)):
                score = CONTEXT_SCORE
            elif _cue(_PLACE_PREPOSITION, text, word_start) and not _possessive(name[-1]):
                score = PREPOSITION_SCORE
            else:
                score = WEAK_SCORE
            return "LOCATION", word_start, end, score
        if _cue(_GAZETTEER_BEFORE, text, word_start) and known.is_place(" ".join(name)):
            return "LOCATION", word_start, end, CONTEXT_SCORE
        if known.is_country(" ".join(name)):
            return "LOCATION", word_start, end, COUNTRY_SCORE
        return None
    return None


def _full_name_cue(text: str, word_start: int, end: int, name: list[str]) -> bool:
    """A cue of `_FULL_NAME_BEFORE` before a name of two words or more, none an acronym
    ("Power BI"), not followed by a passive ("Can Google Pay be enabled"): things are
    enabled and generated, people sign and reply."""
    return (
        len(name) >= 2
        and not any(len(w) > 1 and w.isupper() for w in name)
        and _cue(_FULL_NAME_BEFORE, text, word_start)
        and not _PASSIVE_AFTER.match(text, end)
    )


def _cue(pattern: re.Pattern[str], text: str, word_start: int) -> bool:
    """Whether `pattern` ends right before the word; its `^` matches only at the start of
    the text, not of the window searched."""
    return pattern.search(text, max(0, word_start - _BEFORE_WINDOW), word_start) is not None


def _looks_like_person(words: list[str]) -> bool:
    return not _acronyms(words) and not any(_bare(w) in _NOT_PERSON_WORDS for w in words)


def _looks_like_place(words: list[str]) -> bool:
    return not _acronyms(words) and not any(_bare(w) in _NOT_PLACE_WORDS for w in words)


def _acronyms(words: list[str]) -> bool:
    """All words upper case ("SAP", "AWS"): a product or an organisation far more often
    than a person or a place; spaCy's NER still types the well-known places ("UK")."""
    return all(w.isupper() for w in words)


def _possessive(word: str) -> bool:
    return word.endswith(("'s", "\u2019s"))


def _bare(word: str) -> str:
    return word.lower().strip(".,")
