"""A bounded, thread-safe store of results per text, keyed by the text's digest.

Requests repeat texts: a client sends the same long system message with every request,
and each request's checks would read it again (an 800-token message cost the injection
and PII checks about 60 ms a request). The key is a digest, so the store holds no text
that may carry personal data.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Generic, TypeVar

T = TypeVar("T")


class TextCache(Generic[T]):
    """The last `entries` texts' results (which must be immutable)."""

    def __init__(self, entries: int = 256) -> None:
        self._entries = entries
        self._results: OrderedDict[bytes, T] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, text: str) -> T | None:
        key = _digest(text)
        with self._lock:
            if key not in self._results:
                return None
            self._results.move_to_end(key)
            return self._results[key]

    def put(self, text: str, result: T) -> None:
        with self._lock:
            self._results[_digest(text)] = result
            while len(self._results) > self._entries:
                self._results.popitem(last=False)

    def clear(self) -> None:
        """Forget everything (a benchmark timing texts as if new)."""
        with self._lock:
            self._results.clear()


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=20).digest()
