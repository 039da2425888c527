"""The errors of a client schema check."""

from __future__ import annotations


class SchemaProblem(ValueError):
    """Why a schema is refused, naming the keyword and its JSON path."""


class SchemaRefused(ValueError):
    """A client schema the gateway will not compile: a 400 with `param` naming where the
    request held it (`response_format.json_schema.schema`, `tools[0].function.parameters`)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
