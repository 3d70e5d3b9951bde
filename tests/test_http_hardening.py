"""What a client cannot make agentbox's HTTP side believe or hold, through a real
server: proxy headers from anyone but a trusted proxy, oversized heads in one read,
unsigned bodies, and answers another site could misread."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import Server, wait_until

SPOOFED = "203.0.113.7"  # a documentation address: a client that names itself anew


def failed_logins(server: Server) -> list[dict[str, Any]]:
    lines = server.log_path.read_text().splitlines()
    found = [json.loads(line) for line in lines if line.startswith("{")]
    return [line for line in found if line.get("msg") == "a login to the page failed"]


def test_forwarded_for_is_believed_only_from_a_trusted_proxy(
        server_factory: Callable[..., Server]) -> None:
    """uvicorn believes X-Forwarded-For from loopback by default: every guess could
    come from a new client, and the login throttle would never slow one down."""
    plain = server_factory().start()
    with plain.browser() as browser:  # on the page's name, where the form is
        wrong = browser.post("/ui/login", data={"token": "guess"},
                             headers={"X-Forwarded-For": SPOOFED})
    assert wrong.status_code == 401
    said = wait_until(lambda: failed_logins(plain), 10, "the failed login's line")
    assert said[0]["client"] == "127.0.0.1"
    plain.stop()
    proxied = server_factory({"AGENTBOX_TRUSTED_PROXIES": "127.0.0.1,::1"}).start()
    with proxied.browser() as browser:
        browser.post("/ui/login", data={"token": "guess"},
                     headers={"X-Forwarded-For": SPOOFED})
    said = wait_until(lambda: failed_logins(proxied)[1:], 10, "the second failed login")
    assert said[0]["client"] == SPOOFED


def _answer_of(server: Server, request: bytes) -> bytes:
    """What the server sends back to `request`, sent whole (one write) on a new
    connection, until it closes or 10 s pass."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as connection:
        connection.sendall(request)
        received = b""
        with contextlib.suppress(TimeoutError, ConnectionResetError):
            while not received.endswith(b"}") and (chunk := connection.recv(65536)):
                received += chunk
        return received


def test_a_large_head_in_one_read_is_refused_before_it_is_parsed(server: Server) -> None:
    """40-100 KB heads that arrived whole in one read were parsed and served: the head
    limit (32 KiB) was checked only after the parser had taken them."""
    for size in (40_000, 100_000):
        head = (b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"v" * size
                + b"\r\n\r\n")
        answer = _answer_of(server, head)
        assert answer.startswith(b"HTTP/1.1 431") and b"head_too_large" in answer, answer[:200]
    small = _answer_of(server, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                               b"Connection: close\r\n\r\n")
    assert small.startswith(b"HTTP/1.1 200")


def test_the_servers_own_error_answer_carries_the_security_headers(server: Server) -> None:
    answer = _answer_of(server, b"NOT HTTP AT ALL\r\n\r\n")
    head = answer.split(b"\r\n\r\n", 1)[0].lower()
    assert head.startswith(b"http/1.1 400"), answer[:200]
    for name in (b"content-security-policy", b"x-frame-options", b"x-content-type-options",
                 b"referrer-policy"):
        assert name + b":" in head, (name, answer[:400])
    assert b"invalid_http_request" in answer


@pytest.mark.parametrize("headers", [
    b"",  # unsigned
    b"X-Webhook-Timestamp: 1000000000\r\nX-Webhook-Signature: 00\r\n",  # stale
], ids=["unsigned", "stale"])
def test_an_unsigned_or_stale_request_is_refused_before_its_body(
        server: Server, headers: bytes) -> None:
    """It declares a 1 MB body and sends none: the 401 comes from its headers, at once,
    not after the body's timeout (1,100 such sockets once made /healthz 503)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as connection:
        connection.sendall(b"POST /webhooks/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                           b"Content-Type: application/json\r\nContent-Length: 1000000\r\n"
                           + headers + b"\r\n")
        connection.settimeout(5)  # far below the body's timeout (10 s)
        answer = b""
        with contextlib.suppress(TimeoutError, ConnectionResetError):
            while not answer.endswith(b"}") and (chunk := connection.recv(65536)):
                answer += chunk
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    assert b"signature_missing" in answer or b"signature_expired" in answer
