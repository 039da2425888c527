"""`bastion prepare`: build now what a first start would build, so that a container image
carries it: the native decode step (for the CPU it runs on) and the embedded model's
prepared int8 weights (engine/prepared_weights.py)."""

from __future__ import annotations

import argparse
import sys

from engine import load_native_library
from gateway.settings import Settings


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    prepare = commands.add_parser(
        "prepare",
        help="build the native decode step and prepare the model's weights into their cache "
        "(for container images)",
    )
    prepare.set_defaults(run=run)


def run(settings: Settings, args: argparse.Namespace) -> int:
    if not settings.native_decode:
        print("native decode step: off (BASTION_NATIVE_DECODE=false), nothing to build")
    else:
        library = load_native_library(cache_dir=settings.native_cache_dir)
        if library is None:
            print("native decode step: could not be built (see the log above)", file=sys.stderr)
            return 1
        print(f"native decode step: {library._name}")
    print(f"model weights: {_prepare_weights(settings)}")
    return 0


def _prepare_weights(settings: Settings) -> str:
    from gateway.services import load_engine_model

    prepared = load_engine_model(settings)
    if prepared is None:
        return "nothing to prepare (only a GGUF's int8 weights on a CPU are kept)"
    return f"{prepared.path} ({'already prepared' if prepared.read else 'prepared now'})"
