"""uvicorn, with a drain in front of its own graceful shutdown.

On SIGTERM uvicorn by itself closes its listening socket at once, then waits for open
connections (up to `timeout_graceful_shutdown`). A replica behind a load balancer should
rather keep answering for a while: `/readyz` says 503 so that it is taken out of rotation,
requests that still arrive get 503 `shutting_down` (a balancer retries them on another
replica, where a closed port would be a connection error), and the answers in flight
finish. So the first SIGTERM or SIGINT only begins the drain; uvicorn's own shutdown runs
once no request is left or the grace period is over, and the process then exits 0. A
second signal is uvicorn's again: it stops at once (a second Ctrl+C forces it).
"""

from __future__ import annotations

import signal
from types import FrameType

import structlog
import uvicorn

from gateway.http.drain import Drain

log = structlog.get_logger(__name__)

# How long answers the grace period cut short have to end (and write their audit records)
# before uvicorn's own shutdown, which waits as long again.
CUT_OFF_SECONDS = 2


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, drain: Drain, grace_seconds: float) -> None:
        config.timeout_graceful_shutdown = config.timeout_graceful_shutdown or CUT_OFF_SECONDS
        super().__init__(config)
        self.drain = drain
        self.grace_seconds = grace_seconds
        self._drain_logged = False
        self._cut = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain.draining or sig not in (signal.SIGTERM, signal.SIGINT):
            super().handle_exit(sig, frame)
            return
        # Not recorded as uvicorn's captured signal: a finished drain is a clean exit (0),
        # where uvicorn would re-raise the signal once shut down.
        self.drain.begin()

    async def on_tick(self, counter: int) -> bool:
        """uvicorn's main loop asks this every 0.1 s whether to shut down."""
        if self.drain.draining and not self.should_exit:
            if not self._drain_logged:  # here, not in the signal handler
                self._drain_logged = True
                log.info("drain.started", in_flight=self.drain.in_flight, grace=self.grace_seconds)
            elapsed = self.drain.seconds()
            if self.drain.idle or elapsed >= self.grace_seconds + CUT_OFF_SECONDS:
                log.info("drain.finished", seconds=round(elapsed, 2), left=self.drain.in_flight)
                self.should_exit = True
            elif elapsed >= self.grace_seconds and not self._cut:
                # Cut here, not in uvicorn's shutdown, which cancels what is left without
                # waiting for it: a cut answer still writes its audit record.
                self._cut = True
                log.info("drain.cutting_short", in_flight=self.drain.in_flight)
                self.drain.cut_short()
        return await super().on_tick(counter)
