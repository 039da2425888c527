"""The `bastion` command line. Every sub-command reads the same `BASTION_*` settings."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import engine  # noqa: F401  (first: engine/process_settings.py settles Triton and oneDNN before torch loads)
from gateway.commands import audit, db, guardrails, ingest, keys, models, policy, prepare, serve
from gateway.log_config import configure_logging
from gateway.settings import Settings


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bastion", description=__doc__)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    for module in (serve, ingest, keys, db, audit, policy, models, guardrails, prepare):
        module.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = build_parser().parse_args(argv)
    overrides = {
        name: value
        for name in ("data_dir", "host", "port")
        if (value := getattr(args, name, None)) is not None
    }
    settings = Settings(**overrides)
    configure_logging(settings.log_json)
    try:
        return int(args.run(settings, args))
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
