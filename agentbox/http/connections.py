"""Connections: uvicorn's HTTP protocol (httptools) with limits on what a client
may hold without sending a request.

uvicorn alone lets a connection wait for its request head for ever, lets that
head grow without bound (httptools keeps a header value until its line ends),
reads a body for as long as it trickles, and answers 503 to every request once
`limit_concurrency` connections are open, idle ones included: a thousand
sockets that never send a byte stopped every request, the receiver's too.

Here a connection's life has two states. *Waiting* (new, or kept alive between
requests): its request head must arrive whole within `head_timeout_seconds`
(else 408 if it sent part of one, or closed if it sent nothing) and within
`max_head_bytes` (else 431); at most `max_idle_connections` connections wait at
once, and beyond that the one waiting longest is closed. *Busy* (a complete
head, until its answer ends): at most `max_connections` requests are handled at
once (beyond it, 503), and a body must arrive whole within
`body_timeout_seconds` (else 408). Waiting connections never take a busy slot,
so a flood of idle sockets cannot starve the requests that have arrived.

The usual request comes whole in one read and arms no timer: a deadline is
set only when a read leaves a head or a body unfinished.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from agentbox.config import Settings, env_name
from agentbox.http.errors import error_body
from agentbox.http.headers import SECURITY_HEADERS
from agentbox.http.receiver import ADMISSION_RETRY_AFTER_SECONDS


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int
    max_idle_connections: int
    head_timeout_seconds: float
    max_head_bytes: int
    body_timeout_seconds: float

    @classmethod
    def of(cls, settings: Settings) -> ConnectionLimits:
        return cls(settings.max_connections, settings.max_idle_connections,
                   settings.head_timeout_seconds, settings.max_head_bytes,
                   settings.body_timeout_seconds)


def protocol_for(limits: ConnectionLimits) -> type[LimitedProtocol]:
    """A protocol class for one server: its limits and its own waiting connections."""
    return type("LimitedProtocol", (LimitedProtocol,), {"limits": limits, "waiting": {}})


def answer(status: int, code: str, message: str, *extra: tuple[str, str]) -> bytes:
    """A whole HTTP/1.1 answer that closes the connection, in agentbox's error form."""
    body = json.dumps(error_body(code, message)).encode()
    reason = {400: "Bad Request", 408: "Request Timeout", 431: "Request Header Fields Too Large",
              503: "Service Unavailable"}[status]
    head = [f"HTTP/1.1 {status} {reason}", "content-type: application/json",
            f"content-length: {len(body)}", "connection: close",
            *(f"{name}: {value}" for name, value in extra),
            *(f"{name.decode()}: {value.decode()}" for name, value in SECURITY_HEADERS)]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class LimitedProtocol(HttpToolsProtocol):
    limits: ClassVar[ConnectionLimits]
    # The connections waiting for a request head, the longest waiting first (a dict
    # keeps insertion order: the oldest is the first key).
    waiting: ClassVar[dict[LimitedProtocol, None]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limit_concurrency = None  # busy requests are counted here instead
        self._in_head = True  # reading a request head (or waiting for one)
        self._head_bytes = 0
        self._head_tail = b""  # the last bytes of the head read so far (its end may span)
        self._deadline: asyncio.TimerHandle | None = None

    # -- the connection -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._wait_for_head()
        self._arm(self.limits.head_timeout_seconds, self._head_too_slow)

    def connection_lost(self, exc: Exception | None) -> None:
        self.waiting.pop(self, None)
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # The head's size is checked before the parser sees it: a large head that
        # arrives whole in one read would otherwise be parsed, and served, at once.
        if self._in_head:
            self._head_bytes += self._head_part(data)
            if self._head_bytes > self.limits.max_head_bytes:
                self._refuse(answer(431, "head_too_large", (
                    f"The request head (line and headers) is larger than "
                    f"{self.limits.max_head_bytes} bytes ({env_name('max_head_bytes')}).")))
                return
        super().data_received(data)
        if self.transport.is_closing():
            return
        if self._deadline is None and self._in_head and self._head_bytes:
            self._arm(self.limits.head_timeout_seconds, self._head_too_slow)
        elif self._deadline is None and not self._in_head and self.cycle.more_body:
            self._arm(self.limits.body_timeout_seconds, self._body_too_slow)

    def _head_part(self, data: bytes) -> int:
        """How many bytes of `data` belong to the request head being read: up to the
        blank line that ends it (found across reads: the last bytes of the previous
        are kept), else all of them."""
        carried = self._head_tail
        joined = carried + data
        self._head_tail = joined[-3:]
        ends = [at + len(mark) for mark in (b"\r\n\r\n", b"\n\n")
                if (at := joined.find(mark)) >= 0]
        return max(0, min(ends) - len(carried)) if ends else len(data)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request it cannot parse, in agentbox's words and with
        the headers every answer carries."""
        self._refuse(answer(400, "invalid_http_request", (
            "The request is not valid HTTP/1.1 (its line, a header or the framing).")))

    # -- the parser's events ------------------------------------------------------------

    def on_headers_complete(self) -> None:
        self._in_head, self._head_bytes, self._head_tail = False, 0, b""
        self.waiting.pop(self, None)
        self._disarm()
        if len(self.tasks) < self.limits.max_connections:
            super().on_headers_complete()
            return
        app, self.app = self.app, _busy  # uvicorn's own refusal, in agentbox's words
        try:
            super().on_headers_complete()
        finally:
            self.app = app

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head, self._head_tail = True, b""  # what comes next is the next head
        self._disarm()

    def on_response_complete(self) -> None:
        pipelined = bool(self.pipeline)
        super().on_response_complete()
        if not pipelined and not self.transport.is_closing():
            self._wait_for_head()  # kept alive: uvicorn's keep-alive timer runs now

    # -- limits -------------------------------------------------------------------------

    def _wait_for_head(self) -> None:
        self.waiting[self] = None
        if len(self.waiting) > self.limits.max_idle_connections:
            oldest = next(iter(self.waiting))
            self.waiting.pop(oldest)
            oldest.transport.close()

    def _head_too_slow(self) -> None:
        self._deadline = None
        if not self._in_head or self.transport.is_closing():
            return
        if self._head_bytes == 0:
            self.transport.close()  # it never asked anything: nothing to answer
            return
        self._refuse(answer(408, "head_timeout", (
            f"The request head did not arrive within {self.limits.head_timeout_seconds:g} s "
            f"({env_name('head_timeout_seconds')}).")))

    def _body_too_slow(self) -> None:
        self._deadline = None
        cycle = self.cycle
        if self.transport.is_closing() or cycle is None or not cycle.more_body:
            return
        if not cycle.response_started:
            self.transport.write(answer(408, "body_timeout", (
                f"The body did not arrive within {self.limits.body_timeout_seconds:g} s "
                f"({env_name('body_timeout_seconds')}).")))
        cycle.disconnected = True  # the app's reads end, its answer is dropped
        cycle.message_event.set()
        self.transport.close()

    def _refuse(self, response: bytes) -> None:
        self.transport.write(response)
        self.transport.close()

    def _arm(self, seconds: float, then: Any) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, then)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None


async def _busy(scope: Any, receive: Any, send: Any) -> None:
    """The answer past AGENTBOX_MAX_CONNECTIONS requests in progress."""
    body = json.dumps(error_body("too_many_connections", (
        f"agentbox is handling as many requests as it takes at once "
        f"({env_name('max_connections')}); retry shortly."))).encode()
    await send({"type": "http.response.start", "status": 503, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(ADMISSION_RETRY_AFTER_SECONDS).encode()),
        (b"connection", b"close"), *SECURITY_HEADERS]})
    await send({"type": "http.response.body", "body": body})
