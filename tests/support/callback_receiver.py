"""A real callback receiver for the tests: an HTTP server on 127.0.0.1 that checks
agentbox's signatures with its own code (hashlib, not agentbox.signing) and
records what arrived. The URL's path says how it answers:

    /ok               200
    /fail-N           500 to the first N deliveries of each notification, then 200
    /flaky-N          500 to the first N requests on this path, then 200
    /status-C         always status C (e.g. /status-500, /status-410)
    /gone-once        410 to the first request on this path, then 200
    /retry-after-S    429 with Retry-After: S to the first delivery of each
                      notification, then 200
    /redirect         302 to /ok (which must never be followed)
    /hang-S           wait S seconds before answering 200
    /big              200 with a 1 MiB body

`outage` makes every path answer 503 until it is cleared.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import ssl
import threading
import time
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    answered: int
    at: float

    @property
    def notification(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.body)
        return value

    @property
    def notification_id(self) -> str:
        return str(self.notification["notification_id"])


def hex_valid(secret: str, headers: dict[str, str], body: bytes) -> bool:
    ts = headers.get("x-agent-timestamp", "")
    expected = hmac.new(secret.encode(), ts.encode() + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, headers.get("x-agent-signature", ""))


def standard_valid(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """Standard Webhooks, as its specification describes it."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{headers.get('webhook-id')}.{headers.get('webhook-timestamp')}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    given = [s.partition(",")[2] for s in headers.get("webhook-signature", "").split()]
    return any(hmac.compare_digest(expected, g) for g in given)


class LoopbackServer:
    """An HTTP server on 127.0.0.1 serving from a thread of its own; a subclass answers
    each POST in `_handle` (set what it reads before calling this __init__: the
    server serves from here on)."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self._seen: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                server._handle(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        self.port = self._server.server_address[1]
        self.origin = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def url(self, path: str) -> str:
        return self.origin + path

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handle(self, request: BaseHTTPRequestHandler) -> None:
        raise NotImplementedError


class CallbackReceiver(LoopbackServer):
    def __init__(self, secret: str, tls: ssl.SSLContext | None = None) -> None:
        self.secret = secret
        self.received: list[Received] = []
        self.outage = False
        super().__init__(tls)

    # -- what arrived -------------------------------------------------------------------

    def requests(self, path: str | None = None) -> list[Received]:
        with self._lock:
            return [r for r in self.received if path is None or r.path == path]

    def delivered(self, path: str | None = None) -> list[Received]:
        """Requests answered 2xx, in arrival order."""
        return [r for r in self.requests(path) if 200 <= r.answered < 300]

    def delivered_ids(self, path: str | None = None) -> list[str]:
        return [r.notification_id for r in self.delivered(path)]

    # -- answering ----------------------------------------------------------------------

    def _handle(self, request: BaseHTTPRequestHandler) -> None:
        body = request.rfile.read(int(request.headers.get("Content-Length", "0")))
        headers = {name.lower(): value for name, value in request.headers.items()}
        path = request.path
        try:
            notification_id = json.loads(body)["notification_id"]
        except (ValueError, KeyError, TypeError):
            notification_id = ""
        with self._lock:
            self._seen[(path, notification_id)] += 1
            self._seen[(path, "")] += 1
            count = self._seen[(path, notification_id)]
            on_path = self._seen[(path, "")]
        status, extra, payload = self._answer(path, count, on_path)
        if not (hex_valid(self.secret, headers, body)
                and standard_valid(self.secret, headers, body)):
            status, extra, payload = 401, {}, b"bad signature"
        with self._lock:
            self.received.append(Received(path, headers, body, status, time.time()))
        request.send_response(status)
        for name, value in extra.items():
            request.send_header(name, value)
        request.send_header("Content-Length", str(len(payload)))
        request.end_headers()
        # agentbox may stop reading (the body cap) or give up (its timeout)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            request.wfile.write(payload)

    def _answer(self, path: str, count: int, on_path: int
                ) -> tuple[int, dict[str, str], bytes]:
        if self.outage:
            return 503, {}, b"down"
        name, _, arg = path.strip("/").partition("-")
        if name == "fail" and count <= int(arg):
            return 500, {}, b"scripted failure"
        if name == "flaky" and on_path <= int(arg):
            return 500, {}, b"scripted failure"
        if name == "status":
            return int(arg), {}, b"scripted status"
        if name == "gone" and on_path == 1:
            return 410, {}, b"gone"
        if name == "retry" and count == 1:
            return 429, {"Retry-After": arg.removeprefix("after-")}, b"slow down"
        if name == "redirect":
            return 302, {"Location": self.url("/ok")}, b""
        if name == "hang":
            time.sleep(float(arg))
        if name == "big":
            return 200, {}, b"x" * (1024 * 1024)
        return 200, {}, b'{"ok":true}'
