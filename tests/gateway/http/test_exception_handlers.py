"""A body nested too deeply for the parser is the client's 400; a recursion in a handler
is the server's 500. Both in OpenAI's error shape."""

from __future__ import annotations

from typing import Any

from litestar import Litestar, post
from litestar.params import JSONBody
from litestar.testing import TestClient
from pydantic import BaseModel

from gateway.http.exception_handlers import EXCEPTION_HANDLERS


class Body(BaseModel):
    value: Any = None


@post("/parse", status_code=200)
async def parse(data: JSONBody[Body]) -> dict[str, str]:
    return {"ok": "yes"}


@post("/recurse", status_code=200)
async def recurse() -> dict[str, str]:
    def down(n: int) -> int:
        return down(n + 1)

    down(0)
    return {"ok": "never"}


def client() -> TestClient[Litestar]:
    app = Litestar([parse, recurse], exception_handlers=EXCEPTION_HANDLERS)
    return TestClient(app)


def test_a_body_nested_past_the_parser_is_a_400() -> None:
    with client() as test_client:
        deep = b'{"value": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        response = test_client.post("/parse", content=deep)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_json"


def test_a_recursion_in_a_handler_is_a_500() -> None:
    with client() as test_client:
        response = test_client.post("/recurse")
    assert response.status_code == 500
    assert response.json()["error"]["type"] == "server_error"
