"""`bastion prepare`: build now what a first start would build, so that a container image
carries it (the native decode step, for the CPU it runs on)."""

from __future__ import annotations

import argparse
import sys

from engine import load_native_library
from gateway.settings import Settings


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    prepare = commands.add_parser(
        "prepare", help="build the native decode step into its cache (for container images)"
    )
    prepare.set_defaults(run=run)


def run(settings: Settings, args: argparse.Namespace) -> int:
    if not settings.native_decode:
        print("native decode step: off (BASTION_NATIVE_DECODE=false), nothing to build")
        return 0
    library = load_native_library(cache_dir=settings.native_cache_dir)
    if library is None:
        print("native decode step: could not be built (see the log above)", file=sys.stderr)
        return 1
    print(f"native decode step: {library._name}")
    return 0
