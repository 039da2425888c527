"""Structured logs on stderr: key-value lines, or JSON when `BASTION_LOG_JSON` is true.

stdout stays for what a command prints (a new key, an export).
"""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(json_logs: bool) -> None:
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json_logs else structlog.dev.ConsoleRenderer()
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
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
