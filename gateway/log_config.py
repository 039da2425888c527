"""Structured logs on stderr: one JSON object a line for a log collector, readable
key-value lines for a person at a terminal.

`BASTION_LOG_JSON` chooses; unset, the logs are JSON unless stdout and stderr are both a
terminal: a container, a service manager or a redirect gets records a machine can read.

One format for everything: our structlog events and the standard-library loggers of the
libraries underneath (uvicorn, alembic, Litestar, presidio, ...), whose records pass
through the same renderer. Libraries' chatter (alembic's migration context, faiss's
search for an AVX-512 build, sentence-transformers' "loading" line, transformers' notices)
is held below the level shown, so a healthy start prints no warning.

stdout stays for what a command prints (a new key, an export).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TextIO

import structlog

# Loggers whose records below these levels are routine chatter, not news to an operator.
QUIET_LOGGERS: dict[str, int] = {
    "alembic": logging.WARNING,
    "faiss": logging.WARNING,  # faiss.loader: "could not load library with AVX512 support"
    "sentence_transformers": logging.WARNING,
    "presidio-analyzer": logging.WARNING,  # it logs the text around findings at DEBUG
    "httpx": logging.WARNING,
}
# Loggers that come with handlers of their own (uvicorn's when it is not given a
# config): theirs are removed so that the root's single handler writes every record.
_ROUTED_TO_ROOT = ("uvicorn", "uvicorn.error", "uvicorn.access", "litestar")


class _StderrHandler(logging.StreamHandler[TextIO]):
    """Writes to whatever `sys.stderr` is at the time (tests and daemons swap it)."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _: TextIO) -> None:
        """The stream is always the current stderr."""


def logs_as_json(choice: bool | None) -> bool:
    """The operator's choice, or JSON unless a person is watching a terminal."""
    if choice is not None:
        return choice
    return not (sys.stdout.isatty() and sys.stderr.isatty())


def configure_logging(json_logs: bool | None) -> None:
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if logs_as_json(json_logs)
        else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        # Look stderr up at each use: tests and daemons may swap it after configuration.
        logger_factory=lambda *_: structlog.PrintLogger(sys.stderr),
    )
    route_standard_logging(renderer)
    # transformers writes through a handler of its own; below errors it has nothing an
    # operator acts on (the tokenizer's "legacy behaviour" notice among them).
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def route_standard_logging(renderer: structlog.typing.Processor) -> None:
    """Send every standard-library record through `renderer`, from one root handler."""
    handler = _StderrHandler()
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.contextvars.merge_contextvars,
                structlog.stdlib.add_log_level,
                structlog.stdlib.add_logger_name,
                structlog.processors.TimeStamper(fmt="iso"),
            ],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(logging.INFO)
    for name in _ROUTED_TO_ROOT:
        logger = logging.getLogger(name)
        logger.handlers = []
        logger.propagate = True
    for name, level in QUIET_LOGGERS.items():
        logging.getLogger(name).setLevel(level)
