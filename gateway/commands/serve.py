"""`bastion serve`: run the gateway."""

from __future__ import annotations

import argparse
import contextlib
import sys

from gateway.commands._common import add_data_dir
from gateway.settings import Settings

STARTUP_FAILURE = 3  # what `uvicorn.run` exits with when the server cannot start
# The event loop shares the GIL with the audit writer, the engine and the worker threads.
# A thread that wants the GIL gets it only after the holder has run this long, so at
# Python's default of 5 ms a writer busy linking records stalls every stream on the loop
# for up to 5 ms at a time (docs/benchmarks.md, "Bastion in front of an upstream server").
GIL_SWITCH_INTERVAL_S = 0.001


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = commands.add_parser("serve", help="run the gateway")
    serve.add_argument("--host", help="address to bind (BASTION_HOST)")
    serve.add_argument("--port", type=int, help="port to bind (BASTION_PORT)")
    add_data_dir(serve)
    serve.set_defaults(run=run)


def run(settings: Settings, _: argparse.Namespace) -> int:
    import uvicorn

    from gateway.app import create_app
    from gateway.http.access_log import log_each_request
    from gateway.http.draining_server import DrainingServer
    from gateway.keys.bootstrap import ensure_default_key
    from gateway.log_config import configure_logging
    from gateway.services import open_database

    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    sessions = open_database(settings)
    key = ensure_default_key(settings, sessions)
    url = f"http://{settings.host}:{settings.port}"
    print(f"Bastion is starting on {url}  (OpenAI base URL: {url}/v1)", flush=True)
    print(f"API key for tenant '{settings.default_tenant}': {key}", flush=True)
    print(f"Readiness: {url}/readyz turns 200 once the models are loaded.", flush=True)
    app = create_app(settings)
    # Litestar's default logging config takes the root logger's handlers: one format again.
    configure_logging(settings.log_json)
    # Our access log, written as each response ends, stands in for uvicorn's.
    config = uvicorn.Config(
        log_each_request(app),
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
    )
    server = DrainingServer(config, app.state.drain, settings.drain_seconds)
    with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl+C, re-raised by uvicorn
        server.run()
    return 0 if server.started else STARTUP_FAILURE
