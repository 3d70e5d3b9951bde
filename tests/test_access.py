"""Who may ask what (agentbox.http.access), without a server."""

from __future__ import annotations

import pytest

from agentbox.http.access import from_this_site

HOST = "127.0.0.1:8000"


@pytest.mark.parametrize(("headers", "allowed"), [
    ({}, True),  # a program (curl): the CSRF token is its check
    ({"origin": "http://127.0.0.1:8000"}, True),
    ({"origin": "null", "sec-fetch-site": "same-origin"}, True),  # a page under no-referrer
    ({"origin": "null"}, True),  # plain http beyond loopback: no Sec-Fetch headers
    ({"origin": "http://evil.example"}, False),
    ({"origin": "http://127.0.0.1:9000"}, False),  # another port is another site
    ({"origin": "null", "sec-fetch-site": "cross-site"}, False),  # a sandboxed frame
    ({"sec-fetch-site": "same-site"}, False),
])
def test_a_state_change_must_come_from_this_site(headers: dict[str, str],
                                                 allowed: bool) -> None:
    assert from_this_site({"host": HOST, **headers}) is allowed
