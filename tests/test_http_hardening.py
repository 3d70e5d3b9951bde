"""What a client cannot make agentbox's HTTP side believe or hold, through a real
server: proxy headers from anyone but a trusted proxy, oversized heads in one read,
unsigned bodies, and answers another site could misread."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

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
    wrong = plain.anonymous.post("/ui/login", data={"token": "guess"},
                                 headers={"X-Forwarded-For": SPOOFED})
    assert wrong.status_code == 401
    said = wait_until(lambda: failed_logins(plain), 10, "the failed login's line")
    assert said[0]["client"] == "127.0.0.1"
    plain.stop()
    proxied = server_factory({"AGENTBOX_TRUSTED_PROXIES": "127.0.0.1,::1"}).start()
    proxied.anonymous.post("/ui/login", data={"token": "guess"},
                           headers={"X-Forwarded-For": SPOOFED})
    said = wait_until(lambda: failed_logins(proxied)[1:], 10, "the second failed login")
    assert said[0]["client"] == SPOOFED
