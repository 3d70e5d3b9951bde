"""Who may ask what (agentbox.http.access): the origin of a form, and logins beyond
loopback against the real app in process (no socket)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from agentbox.http import access
from agentbox.http.access import SESSION_COOKIE, from_this_site
from tests.conftest import ADMIN_TOKEN, InProcess, in_process, wait_until_async

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


# -- logins beyond loopback: sessions, logout, the throttle --------------------------------

BEYOND = {"AGENTBOX_HOST": "0.0.0.0"}
PAGE = {"Accept": "text/html"}


def client(box: InProcess, address: str, base_url: str = "http://localhost"
           ) -> httpx.AsyncClient:
    """Another browser, from `address`, at the same app."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=box.app, client=(address, 5000)),
                             base_url=base_url, timeout=30)


async def logged_in(browser: httpx.AsyncClient) -> httpx.Response:
    answer = await browser.post("/ui/login", data={"token": ADMIN_TOKEN})
    assert answer.status_code == 303, answer.text
    return answer


async def test_the_cookie_is_a_random_session_not_the_token(tmp_path: Path,
                                                            anyio_backend: str) -> None:
    async with in_process(tmp_path, **BEYOND) as box:
        async with client(box, "10.0.0.2") as one, client(box, "10.0.0.3") as two:
            first, second = await logged_in(one), await logged_in(two)
        cookies = [first.headers["set-cookie"], second.headers["set-cookie"]]
        values = [c.split(";")[0].split("=", 1) for c in cookies]
        assert {name for name, _ in values} == {SESSION_COOKIE}
        assert values[0][1] != values[1][1] and ADMIN_TOKEN not in "".join(cookies)
        assert len(values[0][1]) >= 40  # 32 random bytes
        for cookie in cookies:
            attributes = {a.strip().lower() for a in cookie.split(";")[1:]}
            assert {"httponly", "samesite=strict", "path=/"} <= attributes
            assert "secure" not in attributes  # plain http: a Secure cookie would not come back
        async with client(box, "10.0.0.4", "https://studio.example") as tls:
            secure = (await logged_in(tls)).headers["set-cookie"].lower()
        assert "; secure" in secure
        async with client(box, "10.0.0.5") as forger:
            forger.cookies.set(SESSION_COOKIE, ADMIN_TOKEN)  # the old cookie held the token
            assert (await forger.get("/", headers=PAGE)).status_code == 401


async def test_a_session_expires(tmp_path: Path, anyio_backend: str) -> None:
    async with (in_process(tmp_path, AGENTBOX_SESSION_SECONDS="0.5", **BEYOND) as box,
                client(box, "10.0.0.2") as browser):
        await logged_in(browser)
        assert (await browser.get("/", headers=PAGE)).status_code == 200

        async def expired() -> bool:
            return (await browser.get("/", headers=PAGE)).status_code == 401
        await wait_until_async(expired, 10, "the session to expire")


async def test_logout_ends_the_session_and_needs_the_csrf_token(tmp_path: Path,
                                                                anyio_backend: str) -> None:
    async with in_process(tmp_path, **BEYOND) as box, client(box, "10.0.0.2") as browser:
        await logged_in(browser)
        page = (await browser.get("/", headers=PAGE)).text
        assert 'action="/ui/logout"' in page
        csrf = page.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        forged = await browser.post("/ui/logout", data={"csrf": "guess"})
        assert forged.status_code == 403
        assert (await browser.get("/", headers=PAGE)).status_code == 200
        session = browser.cookies[SESSION_COOKIE]
        out = await browser.post("/ui/logout", data={"csrf": csrf})
        assert out.status_code == 303 and SESSION_COOKIE in out.headers["set-cookie"]
        browser.cookies.set(SESSION_COOKIE, session)  # the old id, kept by someone
        assert (await browser.get("/", headers=PAGE)).status_code == 401


async def test_failed_logins_slow_down_that_client_alone_and_are_counted(
        tmp_path: Path, anyio_backend: str) -> None:
    async with in_process(tmp_path, **BEYOND, AGENTBOX_LOGIN_DELAY_SECONDS="0.3") as box:
        async with client(box, "10.0.0.66") as guesser, client(box, "10.0.0.7") as owner:
            took = []
            for _ in range(3):
                started = time.monotonic()
                wrong = await guesser.post("/ui/login", data={"token": "guess"})
                took.append(time.monotonic() - started)
                assert wrong.status_code == 401
            assert took[1] > 0.25 and took[2] > 0.55, took  # 0.3 s, then 0.6 s: growing

            async def owner_meanwhile() -> float:
                started = time.monotonic()
                await logged_in(owner)
                return time.monotonic() - started
            guessed, owner_took = await asyncio.gather(
                guesser.post("/ui/login", data={"token": "guess"}), owner_meanwhile())
            assert guessed.status_code == 401
            assert owner_took < 0.3  # another client, not held up (nor the event loop)
        metrics = await box.client.get("/metrics",
                                       headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert "agentbox_login_failures_total 4.0" in metrics.text


async def test_a_client_with_a_minute_of_attempts_queued_gets_429(
        tmp_path: Path, anyio_backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(access, "LOGIN_QUEUE_SECONDS", 5.0)
    async with in_process(tmp_path, **BEYOND, AGENTBOX_LOGIN_DELAY_SECONDS="10") as box, \
            client(box, "10.0.0.66") as guesser:
        assert (await guesser.post("/ui/login", data={"token": "x"})).status_code == 401
        refused = await guesser.post("/ui/login", data={"token": "y"})
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 5
        # The right token is checked before any wait: it never waits for wrong ones.
        right = await guesser.post("/ui/login", data={"token": ADMIN_TOKEN})
        assert right.status_code == 303
