"""The HTTP server: uvicorn, but asleep while nobody is connected.

uvicorn's main loop wakes ten times a second, to refresh the `Date` header
and to see whether a signal asked it to stop. Beside a DAW that was most of an
idle agentbox's wakeups. `QuietServer` refreshes the header once a second
while connections are open, and at each new connection; with none open it
sleeps until a signal or a connection wakes it. `stopping()` tells streams that
would run on (the page's live updates) when a signal asks the server to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable
from email.utils import formatdate
from types import FrameType
from typing import Any

import uvicorn

from agentbox import portable
from agentbox.config import Settings
from agentbox.http.connections import ConnectionLimits, protocol_for

STARTUP_FAILURE = 3  # uvicorn's exit status when the server could not start
DATE_EVERY_SECONDS = 1.0  # how stale the Date header may get while connections are open

_stopping: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None


def stopping() -> asyncio.Event:
    """Set once the server on this event loop has been asked to stop (SIGINT, SIGTERM).

    Waiting on it costs nothing: unlike a poll of a flag, nothing wakes until then."""
    global _stopping
    loop = asyncio.get_running_loop()
    if _stopping is None or _stopping[0] is not loop:
        _stopping = (loop, asyncio.Event())
    return _stopping[1]


class _Connections(set[Any]):
    """uvicorn's set of open connections, which tells when one is added."""

    def __init__(self, on_add: Callable[[], None]) -> None:
        super().__init__()
        self._on_add = on_add

    def add(self, connection: Any) -> None:
        super().add(connection)
        self._on_add()


class QuietServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._exit = asyncio.Event()
        self._connected = asyncio.Event()
        self._dated_at = 0.0
        self.server_state.connections = _Connections(self._on_connection)

    async def main_loop(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._refresh_date()
        while not self.should_exit and not await self._limit_reached():
            if self.server_state.connections:
                await self._wait(self._exit, DATE_EVERY_SECONDS)
                self._refresh_date()
            else:
                self._connected.clear()
                await self._wait_any(self._exit, self._connected)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if self._loop is not None:
            # Signal handlers run between bytecodes: hand the wake-up to the loop.
            self._loop.call_soon_threadsafe(self._stop_soon)

    def _stop_soon(self) -> None:
        self._exit.set()
        stopping().set()

    def _on_connection(self) -> None:
        if time.time() - self._dated_at >= DATE_EVERY_SECONDS:
            self._refresh_date()
        self._connected.set()

    def _refresh_date(self) -> None:
        self._dated_at = time.time()
        date = [(b"date", formatdate(self._dated_at, usegmt=True).encode())]
        self.server_state.default_headers = (
            (date if self.config.date_header else []) + self.config.encoded_headers)

    async def _limit_reached(self) -> bool:
        """uvicorn's other reason to stop (unused by agentbox; kept for its meaning)."""
        return await self.on_tick(1)  # not a multiple of 10: only the exit checks

    @staticmethod
    async def _wait(event: asyncio.Event, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)

    @staticmethod
    async def _wait_any(*events: asyncio.Event) -> None:
        waiters = [asyncio.ensure_future(event.wait()) for event in events]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()


def run(app: Any, settings: Settings, **options: Any) -> None:
    """`uvicorn.run(app, **options)` with the quiet main loop and the connections'
    limits of `settings` (agentbox.http.connections)."""
    portable.raise_open_files_limit()  # the connections' limits, not the OS's, apply
    protocol = protocol_for(ConnectionLimits.of(settings))
    server = QuietServer(uvicorn.Config(app, http=protocol, **options))
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    if not server.started:
        sys.exit(STARTUP_FAILURE)
