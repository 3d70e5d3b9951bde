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
import logging
import socket
import sys
import time
from collections.abc import Callable, Iterator
from email.utils import formatdate
from types import FrameType
from typing import Any

import uvicorn

from agentbox import portable
from agentbox.config import Settings
from agentbox.http.connections import ConnectionLimits, protocol_for
from agentbox.logs import get_logger

log = get_logger("server")

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


class PortInUse(Exception):
    """Another program (another agentbox?) listens on the port."""

    def __init__(self, port: int) -> None:
        super().__init__(f"port {port} is in use (by another agentbox? then it is already "
                         "running); choose another with --port")


class StartupFailed(Exception):
    """The app could not start, for a reason it put in a sentence (app.state.startup_error:
    the data directory served by another agentbox, the database unreachable, ...)."""


def listen(host: str, port: int) -> socket.socket | None:
    """The server's socket, bound now: PortInUse when another program holds the port.
    None for another bind failure (a port that needs privileges): then uvicorn binds,
    after the app's start-up, and says why it cannot, as before."""
    try:
        return portable.listening_socket(host, port)
    except OSError as exc:
        if portable.address_in_use(exc):
            raise PortInUse(port) from None
        return None


class QuietServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, on_ready: Callable[[], None] = lambda: None,
                 on_stop: Callable[[], None] = lambda: None) -> None:
        super().__init__(config)
        self.on_ready, self.on_stop = on_ready, on_stop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._exit = asyncio.Event()
        self._connected = asyncio.Event()
        self._dated_at = 0.0
        self.server_state.connections = _Connections(self._on_connection)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:  # the port is bound and the app started: now, not before
            state = getattr(self.config.app, "state", None)
            url = url_of(self.config.host, self.config.port)
            access = getattr(state, "access", None)
            # The page is the user's alone: a one-time link opens it, logged in (and
            # `agentbox open` makes another).
            opened = {"open": access.login_link(url)} if access is not None else {}
            self.on_ready()
            log.info("agentbox is ready", extra={
                "url": url, **opened, **getattr(state, "ready", {})})

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's, which raises a caught SIGTERM again once the server has stopped
        (the process ends there, before any `finally` of its caller): `on_stop` runs
        before that."""
        with super().capture_signals():
            try:
                yield
            finally:
                self.on_stop()

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


def proxies(settings: Settings) -> dict[str, Any]:
    """uvicorn's options for proxy headers: believed from AGENTBOX_TRUSTED_PROXIES alone.

    uvicorn's default believes X-Forwarded-For from loopback, so any local program
    could name itself a new client at each request, and the login throttle, which
    counts failures per client, would never slow it down."""
    trusted = list(settings.trusted_proxies)
    return {"proxy_headers": bool(trusted), "forwarded_allow_ips": trusted or ""}


def url_of(host: str, port: int) -> str:
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


class _StartupErrorsSaid(logging.Filter):
    """uvicorn's lines of a failed start-up (the traceback, "Application startup
    failed"), left out once the app has said why in a sentence of its own."""

    def __init__(self, app: Any) -> None:
        super().__init__()
        self.app = app

    @property
    def why(self) -> str | None:
        found = getattr(getattr(self.app, "state", None), "startup_error", None)
        return found if isinstance(found, str) else None

    def filter(self, record: logging.LogRecord) -> bool:
        return self.why is None


def run(app: Any, settings: Settings, sockets: list[socket.socket] | None = None,
        on_ready: Callable[[], None] = lambda: None,
        on_stop: Callable[[], None] = lambda: None, **options: Any) -> None:
    """`uvicorn.run(app, **options)` with the quiet main loop and the connections'
    limits of `settings` (agentbox.http.connections), serving on `sockets` when
    given (bound already: see `listen`). `on_ready` runs once the app has started
    and listens, `on_stop` as it stops, whatever stops it (a signal too).
    StartupFailed with the app's sentence when it could not start for a reason it
    knows; exit status 3 for another."""
    portable.raise_open_files_limit()  # the connections' limits, not the OS's, apply
    protocol = protocol_for(ConnectionLimits.of(settings))
    server = QuietServer(uvicorn.Config(app, http=protocol, **proxies(settings), **options),
                         on_ready, on_stop)
    said = _StartupErrorsSaid(app)
    uvicorn_log = logging.getLogger("uvicorn.error")
    uvicorn_log.addFilter(said)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            server.run(sockets=sockets)
    except SystemExit:  # uvicorn's own, when the start-up failed
        if server.started or said.why is None:
            raise
    finally:
        uvicorn_log.removeFilter(said)
    if not server.started and said.why is not None:
        raise StartupFailed(said.why)
    if not server.started:
        sys.exit(STARTUP_FAILURE)
