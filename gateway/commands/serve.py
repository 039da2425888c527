"""`bastion serve`: run the gateway."""

from __future__ import annotations

import argparse

from gateway.commands._common import add_data_dir
from gateway.settings import Settings


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = commands.add_parser("serve", help="run the gateway")
    serve.add_argument("--host", help="address to bind (BASTION_HOST)")
    serve.add_argument("--port", type=int, help="port to bind (BASTION_PORT)")
    add_data_dir(serve)
    serve.set_defaults(run=run)


def run(settings: Settings, _: argparse.Namespace) -> int:
    import uvicorn

    from gateway.app import create_app
    from gateway.keys.bootstrap import ensure_default_key
    from gateway.services import open_database

    sessions = open_database(settings)
    key = ensure_default_key(settings, sessions)
    url = f"http://{settings.host}:{settings.port}"
    print(f"Bastion is starting on {url}  (OpenAI base URL: {url}/v1)", flush=True)
    print(f"API key for tenant '{settings.default_tenant}': {key}", flush=True)
    print(f"Readiness: {url}/readyz turns 200 once the models are loaded.", flush=True)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_config=None)
    return 0
