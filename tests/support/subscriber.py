"""A real subscriber for the subscription tests: an HTTP server on 127.0.0.1 that
records every request (headers, body, when) and answers by the URL's path:

    /echo        answers the verification challenge; 200 to deliveries
    /wrong       answers the verification with another challenge; 200 to deliveries
    /fail-N      answers the verification; 500 to the first N attempts of each
                 delivery (by webhook-id), then 200
    /redirect    302 to /echo for everything (never to be followed)

`failing` makes every delivery (not the verification) answer 500 until cleared.
Signatures are checked by the test, with agentbox.signing's verifier.
"""

from __future__ import annotations

import contextlib
import json
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.support.callback_receiver import LoopbackServer, Received


class Request(Received):
    @property
    def document(self) -> dict[str, Any]:
        return self.notification

    @property
    def is_verification(self) -> bool:
        return self.document.get("type") == "subscription.verification"


class Subscriber(LoopbackServer):
    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.failing = False
        super().__init__()

    def received(self, path: str, verification: bool | None = None) -> list[Request]:
        with self._lock:
            found = [r for r in self.requests if r.path == path]
        if verification is None:
            return found
        return [r for r in found if r.is_verification == verification]

    def _handle(self, request: BaseHTTPRequestHandler) -> None:
        body = request.rfile.read(int(request.headers.get("Content-Length", "0")))
        headers = {name.lower(): value for name, value in request.headers.items()}
        try:
            document = json.loads(body)
        except ValueError:
            document = {}
        with self._lock:
            self._seen[(request.path, headers.get("webhook-id", ""))] += 1
            count = self._seen[(request.path, headers.get("webhook-id", ""))]
        status, extra, payload = self._answer(request.path, document, count)
        with self._lock:
            self.requests.append(Request(request.path, headers, body, status, time.time()))
        request.send_response(status)
        for name, value in extra.items():
            request.send_header(name, value)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(payload)))
        request.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            request.wfile.write(payload)

    def _answer(self, path: str, document: dict[str, Any], count: int
                ) -> tuple[int, dict[str, str], bytes]:
        name, _, arg = path.strip("/").partition("-")
        if name == "redirect":
            return 302, {"Location": self.url("/echo")}, b""
        if document.get("type") == "subscription.verification":
            challenge = str(document.get("challenge"))
            echoed = challenge + "x" if name == "wrong" else challenge
            return 200, {}, json.dumps({"challenge": echoed}).encode()
        if self.failing or (name == "fail" and count <= int(arg)):
            return 500, {}, b'{"error":"scripted"}'
        return 200, {}, b"{}"
