"""The grammar compiler on SmolLM2's tokenizer, as the engine builds it."""

from __future__ import annotations

from typing import Any

import pytest

from engine.grammar import Grammars


@pytest.fixture(scope="module")
def grammars(smollm2: tuple[Any, Any]) -> Grammars:
    # A cache of one: each schema here is compiled once, cold.
    return Grammars(smollm2[1], 49152, [2], cache_size=1)
