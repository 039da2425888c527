"""The trained injection classifier: a linear model over word and character n-gram
TF-IDF of a text and a MiniLM sentence embedding of its head (`embedding_head`, what the
topic check embeds too), plus a small attention head over the head's MiniLM token vectors
(`injection_head.py`), and the nearest training texts' similarity stacked on both
(`injection_neighbours.py`), behind an n-gram-only screen.

The embedding carries what a text is about; the n-grams carry how it is said ("how do
attackers ..." against "you will now ..."), which the embedding blurs: hard negatives that
discuss attacks sit next to the attacks in embedding space. Character n-grams read what
words miss: obfuscations that survive the normaliser ("prev1ous instrctns" still shares
"prev", "nstr"), and inflected words of languages the English embedding reads poorly.
The screen costs about a millisecond and clears most ordinary text, which then needs no
embedding at all (MiniLM is most of the input checks' latency). Weights come from
`guardrails/train_injection.py` and ship as a JSON file of a few MB, with the neighbours'
bank beside it (NEIGHBOURS_FILE).
"""

from __future__ import annotations

import functools
import itertools
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from guardrails.embedding import TokenEmbedder, embedding_head
from guardrails.injection_head import TokenHead
from guardrails.injection_neighbours import Neighbours

DEFAULT_WEIGHTS = Path(__file__).parent / "data" / "injection_classifier.json"
# The neighbours' bank, in the weights file's folder.
NEIGHBOURS_FILE = "injection_neighbours.npz"

# scikit-learn's TfidfVectorizer defaults, which the training script uses.
_TOKEN = re.compile(r"(?u)\b\w\w+\b")
NGRAM_RANGE = (1, 2)
# Character n-grams within words padded by a space, as TfidfVectorizer(analyzer="char_wb").
CHAR_NGRAM_RANGE = (3, 6)
# Character n-grams share the vocabulary with word n-grams under this mark, which no word
# n-gram starts with (those are word characters only).
CHAR_MARK = "#"


class ClassifierWeightsError(ValueError):
    """The weights file is missing or malformed; retrain with guardrails/train_injection.py."""


def ngrams(text: str) -> list[str]:
    """Lower-cased word 1- and 2-grams, as scikit-learn's TfidfVectorizer makes them."""
    tokens = _TOKEN.findall(text.lower())
    low, high = NGRAM_RANGE
    return [
        " ".join(tokens[i : i + n])
        for n in range(low, high + 1)
        for i in range(len(tokens) - n + 1)
    ]


def char_ngrams(text: str) -> list[str]:
    """Lower-cased character n-grams of each space-padded word, as scikit-learn's
    `char_wb` analyzer makes them (a word shorter than n gives one n-gram, itself), each
    with CHAR_MARK in front."""
    grams: list[str] = []
    for word in text.lower().split():
        grams += _word_char_ngrams(word)
    return grams


@functools.lru_cache(maxsize=1 << 16)
def _word_char_ngrams(word: str) -> tuple[str, ...]:
    """One word's marked n-grams, cached: a text's sentences (`text_units`) are scored
    after the text itself, so every word is seen at least twice."""
    padded = f" {word} "
    grams: list[str] = []
    low, high = CHAR_NGRAM_RANGE
    for n in range(low, high + 1):
        if len(padded) <= n:
            grams.append(CHAR_MARK + padded)
            break
        grams += [CHAR_MARK + padded[i : i + n] for i in range(len(padded) - n + 1)]
    return tuple(grams)


def sigmoid(logits: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    return np.asarray(1.0 / (1.0 + np.exp(-logits)))


@dataclass(frozen=True, slots=True)
class LinearModel:
    """Logistic regression over n-gram TF-IDF features, plus embedding features when
    `embedding_coef` is set."""

    ngram_coef: dict[str, float]
    intercept: float
    embedding_coef: npt.NDArray[np.float32] | None = None


@dataclass(frozen=True, slots=True)
class NgramFeatures:
    """A text's sublinear TF-IDF vector over the classifier's vocabulary, sparse: word
    n-grams and character n-grams, each part L2-normalised on its own, as two
    TfidfVectorizers side by side."""

    columns: npt.NDArray[np.intp]
    values: npt.NDArray[np.float64]


_NO_COLUMNS = np.zeros(0, dtype=np.intp)


@dataclass(frozen=True, slots=True)
class _Columns:
    """The vocabulary as arrays: a column per n-gram, its idf and both models' weights
    (a text has a few hundred known n-grams; summing them in Python cost 5 ms a request)."""

    index: dict[str, int]
    idf: npt.NDArray[np.float64]
    screen: npt.NDArray[np.float64]
    full: npt.NDArray[np.float64]
    # word -> the columns of its character n-grams; bounded, since a server sees new words
    # for ever, and a text's sentences (`text_units`) repeat its words.
    char_columns: Callable[[str], npt.NDArray[np.intp]]

    @classmethod
    def of(cls, idf: dict[str, float], screen: LinearModel, full: LinearModel) -> _Columns:
        index = {g: i for i, g in enumerate(idf)}

        @functools.lru_cache(maxsize=1 << 16)
        def char_columns(word: str) -> npt.NDArray[np.intp]:
            known = [index[g] for g in _word_char_ngrams(word) if g in index]
            return np.array(known, dtype=np.intp)

        return cls(
            index,
            np.array(list(idf.values()), dtype=np.float64),
            np.array([screen.ngram_coef[g] for g in idf], dtype=np.float64),
            np.array([full.ngram_coef[g] for g in idf], dtype=np.float64),
            char_columns,
        )

    def tfidf(self, texts: Sequence[str]) -> list[NgramFeatures]:
        """Each text's features. A request's window, sentences and sentence pairs come
        together, so their columns are counted and normalised in one pass over all of them:
        per text, two `np.unique` calls cost more than the arithmetic."""
        index = self.index
        # Part 2i holds text i's word n-grams, part 2i + 1 its character n-grams.
        parts: list[npt.NDArray[np.intp]] = []
        for text in texts:
            parts.append(np.array([index[g] for g in ngrams(text) if g in index], dtype=np.intp))
            chars = [self.char_columns(w) for w in text.lower().split()]
            parts.append(np.concatenate([_NO_COLUMNS, *chars]))
        width = len(self.idf)
        owners = np.repeat(np.arange(len(parts), dtype=np.intp), [len(c) for c in parts])
        keys, counts = np.unique(
            owners * width + np.concatenate([_NO_COLUMNS, *parts]), return_counts=True
        )
        part_of, columns = np.divmod(keys, width)
        weights = (1.0 + np.log(counts)) * self.idf[columns]
        norms = np.sqrt(np.bincount(part_of, weights=weights * weights, minlength=len(parts)))
        weights /= np.where(norms > 0, norms, 1.0)[part_of]
        # Keys sort by part first, so each text's columns are one run: words, then chars.
        bounds = np.searchsorted(part_of, np.arange(0, len(parts) + 1, 2))
        return [
            NgramFeatures(columns[start:end], weights[start:end])
            for start, end in itertools.pairwise(bounds.tolist())
        ]


@dataclass(frozen=True, slots=True)
class InjectionClassifier:
    """Two models over a shared n-gram vocabulary: `screen`, a logistic regression, reads
    the n-grams only; `full` reads the n-grams and the MiniLM sentence embedding linearly,
    and its token `head` adds a logit from the token vectors; `neighbours`, when set, stack
    the nearest training texts' similarity on that logit. A text the screen scores
    below `screen_below` is benign without an embedding (training sets `screen_below` under
    every attack the full model caught in cross-validation); the rest go to `full`, whose
    probability is compared with `threshold`."""

    idf: dict[str, float]
    screen: LinearModel
    screen_below: float
    full: LinearModel
    threshold: float
    # The screen's cut for a longer text's sentences (`text_units`): a text has many, so
    # this one clears more and lets through most (not all) attacks the full model catches.
    unit_screen_below: float
    head: TokenHead
    neighbours: Neighbours | None = None
    _columns: _Columns = field(init=False, repr=False, compare=False)

    @classmethod
    def load(cls, path: Path = DEFAULT_WEIGHTS) -> InjectionClassifier:
        """The classifier in `path`, parsed once per version of the file: every policy's
        detector shares it (the shipped file is 3.4 MB of JSON, about 350 ms to parse)."""
        try:
            version = path.stat().st_mtime_ns
        except OSError as exc:
            raise ClassifierWeightsError(f"cannot load classifier weights {path}: {exc}") from exc
        return _parsed(path.resolve(), version)

    @classmethod
    def parse(cls, path: Path) -> InjectionClassifier:
        """Read and check the weights file (`load` caches this)."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            coef = np.asarray(data["embedding_coef"], dtype=np.float32)
            rows: dict[str, list[float]] = data["ngrams"]  # n-gram -> [idf, screen, full]
            idf = {g: float(row[0]) for g, row in rows.items()}
            screen = LinearModel(
                {g: float(r[1]) for g, r in rows.items()}, data["screen_intercept"]
            )
            full = LinearModel({g: float(r[2]) for g, r in rows.items()}, data["intercept"], coef)
            screen_below, threshold = float(data["screen_below"]), float(data["threshold"])
            unit_screen_below = float(data["unit_screen_below"])
            head = TokenHead.from_json(data["token_head"])
            stack = data.get("neighbours")
            neighbours = (
                None if stack is None else Neighbours.load(path.parent / str(stack["file"]), stack)
            )
        except (OSError, KeyError, TypeError, ValueError, IndexError) as exc:
            raise ClassifierWeightsError(f"cannot load classifier weights {path}: {exc}") from exc
        if coef.ndim != 1:
            raise ClassifierWeightsError(f"{path}: coef must be a vector, got shape {coef.shape}")
        if head.dimension != coef.shape[0]:
            raise ClassifierWeightsError(
                f"{path}: the token head reads {head.dimension} dimensions, the linear "
                f"model {coef.shape[0]}"
            )
        if neighbours is not None and neighbours.dimension != coef.shape[0]:
            raise ClassifierWeightsError(
                f"{path}: the neighbours' bank has {neighbours.dimension} dimensions, the "
                f"linear model {coef.shape[0]}"
            )
        return cls(idf, screen, screen_below, full, threshold, unit_screen_below, head, neighbours)

    @property
    def dimension(self) -> int:
        """The embedding size the full model was trained on."""
        return 0 if self.full.embedding_coef is None else int(self.full.embedding_coef.shape[0])

    def save(self, path: Path, metadata: dict[str, object]) -> None:
        """The weights to `path`, and the neighbours' bank to NEIGHBOURS_FILE beside it."""
        if self.full.embedding_coef is None:
            raise ValueError("the full model has no embedding coefficients")
        stack: dict[str, object] = {}
        if self.neighbours is not None:
            self.neighbours.save(path.with_name(NEIGHBOURS_FILE))
            stack = {"neighbours": {"file": NEIGHBOURS_FILE, **self.neighbours.stack_json()}}
        data = {
            **metadata,
            "threshold": self.threshold,
            "screen_below": self.screen_below,
            "unit_screen_below": self.unit_screen_below,
            "intercept": self.full.intercept,
            "screen_intercept": self.screen.intercept,
            "embedding_coef": [round(float(x), 6) for x in self.full.embedding_coef],
            "token_head": self.head.to_json(),
            **stack,
            "ngrams": {
                g: [
                    round(idf, 5),
                    round(self.screen.ngram_coef[g], 5),
                    round(self.full.ngram_coef[g], 5),
                ]
                for g, idf in sorted(self.idf.items())
            },
        }
        # One top-level key a line: readable metadata, and a diff that says what changed.
        lines = ",\n".join(f"{json.dumps(key)}: {json.dumps(value)}" for key, value in data.items())
        path.write_text("{\n" + lines + "\n}\n", encoding="utf-8")

    def __post_init__(self) -> None:
        object.__setattr__(self, "_columns", _Columns.of(self.idf, self.screen, self.full))

    def features(self, texts: Sequence[str]) -> list[NgramFeatures]:
        return self._columns.tfidf(texts)

    def screen_probabilities(self, features: Sequence[NgramFeatures]) -> npt.NDArray[np.float64]:
        """P(injection) from the n-grams alone (no embedding needed)."""
        return sigmoid(self._logits(features, self._columns.screen, self.screen.intercept))

    def _logits(
        self, features: Sequence[NgramFeatures], coef: npt.NDArray[np.float64], intercept: float
    ) -> npt.NDArray[np.float64]:
        return np.array(
            [intercept + float(f.values @ coef[f.columns]) for f in features], dtype=np.float64
        )

    def probabilities(
        self,
        vectors: npt.NDArray[np.float32],
        features: Sequence[NgramFeatures],
        tokens: Sequence[npt.NDArray[np.float32]],
    ) -> npt.NDArray[np.float64]:
        """P(injection) from the full model, given each text's embedding row, n-grams and
        token vectors."""
        coef = self.full.embedding_coef
        if coef is None or vectors.shape[-1] != coef.shape[0]:
            raise ValueError(
                f"embedding dimension {vectors.shape[-1]} does not match the classifier's "
                f"{self.dimension}: was it trained on another model?"
            )
        if not len(features) == len(vectors) == len(tokens):
            raise ValueError(
                f"{len(features)} texts for {len(vectors)} embedding rows and "
                f"{len(tokens)} token matrices"
            )
        logits = vectors.astype(np.float64) @ coef.astype(np.float64)
        logits += self.head.logits(tokens)
        logits += self._logits(features, self._columns.full, self.full.intercept)
        if self.neighbours is not None:
            logits = self.neighbours.logits(logits, vectors)
        return sigmoid(logits)

    def classify(
        self,
        texts: Sequence[str],
        embed: TokenEmbedder,
        threshold: float,
        embed_along: Sequence[str] = (),
    ) -> list[float]:
        """P(injection) per text: the highest of the text's and of its most suspect units'.

        The text's is the screen's when it is below `screen_below` (and the caller's
        `threshold` is not stricter than the trained one), else the full model's over the
        n-grams of the whole text and the embedding of its head (`embedding_head`). A text
        longer than a unit also has its sentences and sentence pairs (`text_units`)
        screened, and the SUSPECT_UNITS the screen finds most suspect, unless
        `unit_screen_below` clears them, scored by the full model: an attack padded with
        harmless text is diluted in the whole but not in its own sentence. Only what needs
        an embedding is embedded, in one batch, with `embed_along` (another check's texts,
        whose vectors a caching embedder keeps: one model pass costs about 8 ms however
        short its texts, mostly reading the weights).
        """
        units_of = [text_units(text) for text in texts]
        every_unit = [unit for units in units_of for unit in units]
        every_feature = self.features([*texts, *every_unit])
        every_score = self.screen_probabilities(every_feature)
        features = every_feature[: len(texts)]
        scores = [float(p) for p in every_score[: len(texts)]]
        screened = threshold >= self.threshold
        uncertain = [i for i, p in enumerate(scores) if not screened or p >= self.screen_below]
        suspects: list[tuple[int, str, NgramFeatures]] = []
        start = len(texts)
        for i, units in enumerate(units_of):
            unit_features = every_feature[start : start + len(units)]
            unit_scores = every_score[start : start + len(units)]
            start += len(units)
            for unit in np.argsort(-unit_scores, kind="stable")[:SUSPECT_UNITS]:
                if not screened or unit_scores[unit] >= self.unit_screen_below:
                    suspects.append((i, units[unit], unit_features[unit]))
        if not uncertain and not suspects:
            return scores
        embedded = [embedding_head(texts[i]) for i in uncertain] + [u for _, u, _ in suspects]
        vectors, tokens = embed.embed_with_tokens(embedded + list(embed_along))
        full = self.probabilities(
            np.asarray(vectors[: len(embedded)], dtype=np.float32),
            [features[i] for i in uncertain] + [f for _, _, f in suspects],
            tokens[: len(embedded)],
        )
        for i, p in zip(uncertain, full[: len(uncertain)], strict=True):
            scores[i] = float(p)
        for (i, _, _), p in zip(suspects, full[len(uncertain) :], strict=True):
            scores[i] = max(scores[i], float(p))
        return scores


# Units of a text that the full model scores. The screen's first choice is often the pair
# of the attack and a harmless neighbour, which the neighbour dilutes; the second is then
# the attack alone. On 600 training attacks padded like the benchmark's (validation, not
# the held-out split), padding hid 31 of those caught alone with one unit, 23 with two and
# 21 with three; two cost harmless long training texts 0.14 embeddings each, against 0.11.
SUSPECT_UNITS = 2


@functools.lru_cache(maxsize=4)
def _parsed(path: Path, version: int) -> InjectionClassifier:
    """`InjectionClassifier.parse(path)`, once per (path, modification time)."""
    return InjectionClassifier.parse(path)


# The pieces of a longer text that are scored on their own: sentences, and pairs of
# neighbouring sentences, of up to UNIT_CHARS (a sentence longer than that is cut at
# spaces).
UNIT_CHARS = 250
_SENTENCE_BREAK = re.compile(r"(?<=[.!?;:])\s+|\n+")


def text_units(text: str) -> list[str]:
    """`text`'s sentences and sentence pairs (each at most UNIT_CHARS); [] when `text` is
    no longer than one unit."""
    if len(text) <= UNIT_CHARS:
        return []
    sentences: list[str] = []
    for sentence in _SENTENCE_BREAK.split(text):
        rest = sentence.strip()
        while len(rest) > UNIT_CHARS:
            space = rest.rfind(" ", UNIT_CHARS // 2, UNIT_CHARS)
            cut = space if space > 0 else UNIT_CHARS
            sentences.append(rest[:cut])
            rest = rest[cut:].strip()
        if rest:
            sentences.append(rest)
    pairs = [f"{a} {b}" for a, b in itertools.pairwise(sentences) if len(a) + len(b) < UNIT_CHARS]
    return list(dict.fromkeys(sentences + pairs))


# Longer texts are scored window by window and the highest probability counts; the
# n-grams read a whole window, the embedding its head.
WINDOW_CHARS = 1000
WINDOW_OVERLAP = 200


def text_windows(text: str) -> list[str]:
    """Overlapping windows covering text, cut at spaces where possible."""
    if len(text) <= WINDOW_CHARS:
        return [text]
    windows: list[str] = []
    start = 0
    while start < len(text):
        end = min(start + WINDOW_CHARS, len(text))
        if end < len(text):
            space = text.rfind(" ", start + WINDOW_CHARS // 2, end)
            end = space if space > 0 else end
        windows.append(text[start:end])
        if end >= len(text):
            break
        start = max(end - WINDOW_OVERLAP, start + 1)
    return windows
