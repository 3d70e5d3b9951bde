"""The page's private name (agentbox.http.access): on loopback a session is made and
taken only on `agentbox-<random>.localhost`, so the cookie a browser holds is never
sent to 127.0.0.1 or localhost, whatever their port. The real app in process over
httpx's ASGI transport; tests/test_page.py follows a real Chromium through it."""

from __future__ import annotations

import html
import re
import stat
from pathlib import Path

import httpx
import pytest

from agentbox.config import PAGE_NAME, PAGE_NAME_FILE, ConfigError, page_name
from agentbox.http.access import SESSION_COOKIE
from tests.conftest import ADMIN_TOKEN, InProcess, in_process, in_process_settings

pytestmark = pytest.mark.anyio
PAGE = {"Accept": "text/html"}


def browser(box: InProcess, base_url: str) -> httpx.AsyncClient:
    """A browser without the admin token, at `base_url` (its Host)."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=box.app,
                                                           client=("127.0.0.1", 5000)),
                             base_url=base_url, timeout=30)


def attributes(set_cookie: str) -> set[str]:
    return {a.strip().lower() for a in set_cookie.split(";")[1:]}


async def test_the_name_is_random_per_install_and_kept_private(tmp_path: Path,
                                                               anyio_backend: str) -> None:
    one = in_process_settings(tmp_path / "one")
    two = in_process_settings(tmp_path / "two")
    first = page_name(one)
    assert PAGE_NAME.fullmatch(first) and first != page_name(two)
    assert page_name(one) == first  # kept: made at the first start only
    kept = one.config_dir / PAGE_NAME_FILE
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    kept.write_text("evil.example\n")
    with pytest.raises(ConfigError, match="page name"):
        page_name(one)


async def test_a_login_link_is_on_the_private_name(box: InProcess) -> None:
    name = page_name(box.settings)
    made = await box.client.post("/login-links", headers={"Host": "127.0.0.1:8000"})
    assert made.status_code == 201
    assert made.json()["url"].startswith(f"http://{name}:8000/ui/login?code=")


async def test_a_link_used_at_127_0_0_1_moves_first_then_logs_in_there_alone(
        box: InProcess) -> None:
    name = page_name(box.settings)
    link = (await box.client.post("/login-links")).json()["url"]
    query = link.split("?", 1)[1]
    async with browser(box, "http://127.0.0.1:8000") as elsewhere:
        moved = await elsewhere.get(f"/ui/login?{query}&next=/ui/runs")
    assert moved.status_code == 303 and "set-cookie" not in moved.headers
    assert moved.headers["location"] == f"http://{name}:8000/ui/login?{query}&next=/ui/runs"
    async with browser(box, f"http://{name}:8000") as there:
        used = await there.get(moved.headers["location"])  # not used up by the move
        assert used.status_code == 303 and used.headers["location"] == "/ui/runs"
        cookie = used.headers["set-cookie"]
        assert cookie.startswith(f"{SESSION_COOKIE}=")
        assert {"httponly", "samesite=strict", "path=/"} <= attributes(cookie)
        assert not any(a.startswith("domain") for a in attributes(cookie))  # host-only
        assert (await there.get("/ui/runs", headers=PAGE)).status_code == 200
        again = await there.get(moved.headers["location"], headers=PAGE)
        assert again.status_code == 401  # once only


async def test_a_session_on_another_name_is_refused(box: InProcess) -> None:
    name = page_name(box.settings)
    async with browser(box, f"http://{name}:8000") as there:
        assert (await there.post("/ui/login", data={"token": ADMIN_TOKEN})).status_code == 303
        session = there.cookies[SESSION_COOKIE]
        assert (await there.get("/runs")).status_code == 200
    replayed = {"Cookie": f"{SESSION_COOKIE}={session}"}
    for host in ("127.0.0.1:8000", "localhost:8000", "[::1]:8000", "127.0.0.1:9999"):
        async with browser(box, f"http://{host}") as other:
            api = await other.get("/runs", headers=replayed)
            assert api.status_code == 401, host
            assert api.json()["error_code"] == "admin_token_required"
            page = await other.get("/", headers={**replayed, **PAGE})
            assert page.status_code == 401 and 'name="token"' in page.text  # the form
            assert not told_the_name(page, name)
    # the admin token keeps working on every loopback name, as the CLI sends it
    for host in ("127.0.0.1:8000", "localhost:8000", "[::1]:8000"):
        assert (await box.client.get("/runs", headers={"Host": host})).status_code == 200


def went_on_to(answer: httpx.Response) -> str:
    """Where a page that goes on at once (a refresh) sends the browser."""
    found = re.search(r'http-equiv="refresh" content="0;url=([^"]+)"', answer.text)
    assert found is not None, answer.text
    return html.unescape(found[1])


def told_the_name(answer: httpx.Response, name: str) -> bool:
    return name in answer.text or any(name in value for value in answer.headers.values())


async def test_the_name_is_told_only_to_whoever_shows_the_token_or_a_link(
        box: InProcess) -> None:
    """Any program can ask 127.0.0.1: the page's name goes to none that merely asks
    (a page, the form with a wrong token, a used link), else it could send the browser
    there on a port of its own."""
    name = page_name(box.settings)
    used = (await box.client.post("/login-links")).json()["url"].split("?", 1)[1]
    async with browser(box, f"http://{name}:8000") as there:
        assert (await there.get(f"/ui/login?{used}")).status_code == 303
    async with browser(box, "http://127.0.0.1:8000") as elsewhere:
        for path in ("/", "/ui/runs", "/ui/login", f"/ui/login?{used}", "/ui/login?code=x",
                     "/runs", "/healthz", "/openapi.json"):
            asked = await elsewhere.get(path, headers=PAGE)
            assert asked.status_code in (200, 401), path
            assert not told_the_name(asked, name), path
        wrong = await elsewhere.post("/ui/login", data={"token": "guess-guess-guess"})
        assert wrong.status_code == 401 and not told_the_name(wrong, name)
        # the right token: on to the page's name by a new one-time link, no cookie here
        posted = await elsewhere.post("/ui/login", data={"token": ADMIN_TOKEN})
        assert posted.status_code == 200 and "set-cookie" not in posted.headers
        link = went_on_to(posted)
        assert link.startswith(f"http://{name}:8000/ui/login?code=")
    async with browser(box, f"http://{name}:8000") as there:
        landed = await there.get(link)
        assert landed.status_code == 303 and SESSION_COOKIE in landed.headers["set-cookie"]
        form = await there.get("/ui/login", headers=PAGE)
        assert form.status_code == 401 and 'name="token"' in form.text
        assert "used already" not in form.text


async def test_beyond_loopback_sessions_stay_on_the_served_name(tmp_path: Path,
                                                                anyio_backend: str) -> None:
    async with in_process(tmp_path, AGENTBOX_HOST="0.0.0.0") as box:
        made = await box.client.post("/login-links", headers={"Host": "studio.example"})
        assert made.json()["url"].startswith("http://studio.example/ui/login?code=")
        async with browser(box, "http://studio.example") as there:
            logged = await there.post("/ui/login", data={"token": ADMIN_TOKEN})
            assert logged.status_code == 303 and SESSION_COOKIE in logged.headers["set-cookie"]
            assert (await there.get("/runs")).status_code == 200


@pytest.mark.parametrize("host", ["127.0.0.1:99999", "localhost:x", "[::1]:0"])
async def test_a_host_header_with_a_bad_port_is_moved_not_a_500(box: InProcess,
                                                                host: str) -> None:
    name = page_name(box.settings)
    async with browser(box, "http://127.0.0.1:8000") as elsewhere:
        moved = await elsewhere.post("/ui/login", data={"token": ADMIN_TOKEN},
                                     headers={"Host": host})
    assert moved.status_code == 200
    assert went_on_to(moved).startswith(f"http://{name}:8000/ui/login?code=")
    made = await box.client.post("/login-links", headers={"Host": host})
    assert made.status_code == 201 and made.json()["url"].startswith(f"http://{name}")
