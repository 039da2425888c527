"""Reading a JSON request body into a pydantic model, with OpenAI-shaped errors."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from litestar import Request
from pydantic import BaseModel, ValidationError

from gateway.http.errors import ApiError, from_validation_error

M = TypeVar("M", bound=BaseModel)


def parse_body(raw: bytes, model: type[M]) -> M:
    try:
        data = json.loads(raw) if raw.strip() else {}
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(
            400,
            "We could not parse the JSON body of your request. (HINT: This likely means you "
            "aren't using your HTTP library correctly. The OpenAI API expects a JSON payload.)",
            code="invalid_json",
        ) from exc
    except RecursionError as exc:
        raise ApiError(400, "The JSON body is nested too deeply.", code="invalid_json") from exc
    if not isinstance(data, dict):
        raise ApiError(400, "The request body must be a JSON object.", code="invalid_json")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc) from exc


async def read_json(request: Request[Any, Any, Any], model: type[M]) -> M:
    """The request's JSON body as `model`; a body declared as anything but JSON is refused
    (415) rather than guessed at. A body without a content type is read as JSON."""
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type and media_type != "application/json" and not media_type.endswith("+json"):
        raise ApiError(
            415,
            f"Send the body as application/json, not {media_type!r}.",
            code="unsupported_media_type",
        )
    return parse_body(await request.body(), model)
