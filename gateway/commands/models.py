"""`bastion models check FILE`: validate a models file without the service."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from engine import ModelNotFound, default_model_source, model_source_from_path
from gateway.models import ModelsFileError, load_models_file
from gateway.settings import Settings


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    models = commands.add_parser("models", help="validate the models file")
    actions = models.add_subparsers(required=True, metavar="ACTION")
    check = actions.add_parser("check", help="validate a models file; exit 1 on any error")
    check.add_argument("file", type=Path, metavar="FILE")
    check.set_defaults(run=run_check)


def run_check(settings: Settings, args: argparse.Namespace) -> int:
    """The file's errors, each naming its line; the keys' variables need not be set here
    (they are checked where the server starts)."""
    try:
        loaded = load_models_file(args.file, embedded_id=_embedded_id(settings), check_env=False)
    except ModelsFileError as exc:
        print(exc, file=sys.stderr)
        return 1
    served = [config.model_id for config in loaded.upstreams]
    embedded = "served" if loaded.embedded else "off"
    print(
        f"{args.file}: ok ({len(served)} upstream models: {', '.join(served) or 'none'}; "
        f"embedded {embedded}; version {loaded.version[:12]})"
    )
    return 0


def _embedded_id(settings: Settings) -> str | None:
    """The id the embedded model will have (an upstream model may not take it)."""
    try:
        source = (
            model_source_from_path(settings.model_path)
            if settings.model_path
            else default_model_source()
        )
    except ModelNotFound:
        return None
    return source.model_id
