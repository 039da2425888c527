"""What an upstream server says about itself: its context window, and whether it is
llama.cpp's server (whose `/tokenize` and chat template endpoints differ from vLLM's)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.upstream.http_client import Answer, HTTPClient


@dataclass(frozen=True, slots=True)
class ServerInfo:
    context_window: int | None
    is_llama_cpp: bool


def server_root(base_url: str) -> str:
    """`http://host:8000/v1` → `http://host:8000`: where `/tokenize` and `/props` live."""
    return base_url.rstrip("/").removesuffix("/v1")


async def read_server_info(
    client: HTTPClient, base_url: str, upstream_model: str, headers: dict[str, str]
) -> ServerInfo:
    """The context window from `/v1/models` (vLLM's `max_model_len`, llama.cpp's
    `meta.n_ctx`) or llama.cpp's `/props` (`default_generation_settings.n_ctx`, the
    context of one slot); raises `HTTPError` when the server cannot be asked."""
    models = await client.request("GET", f"{base_url}/models", headers)
    models.raise_for_status()
    window = _window_from_models(models.json(), upstream_model)
    props = await client.request("GET", f"{server_root(base_url)}/props", headers)
    settings = _json_dict(props).get("default_generation_settings") if props.is_success else None
    is_llama_cpp = isinstance(settings, dict)
    if is_llama_cpp and isinstance(settings, dict) and isinstance(settings.get("n_ctx"), int):
        window = settings["n_ctx"]  # per slot: what one request may use
    return ServerInfo(window, is_llama_cpp)


def _window_from_models(listing: Any, upstream_model: str) -> int | None:
    entries = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(entries, list):
        return None
    chosen = [e for e in entries if isinstance(e, dict) and e.get("id") == upstream_model]
    for entry in chosen or entries[:1]:
        for value in (entry.get("max_model_len"), (entry.get("meta") or {}).get("n_ctx")):
            if isinstance(value, int) and value > 0:
                return value
    return None


def _json_dict(response: Answer) -> dict[str, Any]:
    try:
        parsed = response.json()
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}
