"""Every project within reach of the home page: it names how many projects there are,
finds one by name (`GET /?q=NAME`), and pages through them all in the order of their
latest export; `GET /exports` pages the same way (`limit`, `cursor`, `next_cursor`),
and a bad limit or cursor is answered 422 in words. The real app in process, on
SQLite and on PostgreSQL."""

from __future__ import annotations

import base64
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentbox.review.web.pages import HOME_PROJECTS
from tests.conftest import InProcess, in_process, make_event

pytestmark = pytest.mark.anyio
PROJECTS = [f"Song {n:02d}" for n in range(HOME_PROJECTS + 5)]
ROW = re.compile(r'<tr data-run-id="[^"]+" data-project="([^"]+)"')
NEXT = re.compile(r'<a href="([^"]+)" id="next-page"')


@pytest.fixture(params=["sqlite", "postgresql"])
async def box(request: pytest.FixtureRequest, tmp_path: Path,
              anyio_backend: str) -> AsyncIterator[InProcess]:
    environ = {}
    if request.param == "postgresql":
        environ["AGENTBOX_DATABASE_URL"] = request.getfixturevalue("postgres_url")
    async with in_process(tmp_path, **environ) as app:
        for project in [*PROJECTS, PROJECTS[0]]:  # Song 00 twice: its latest is the newest
            sent = await app.post(make_event(project_id=project))
            assert sent.status_code == 202, sent.text
        yield app


def newest_first() -> list[str]:
    return [PROJECTS[0], *PROJECTS[:0:-1]]


def projects_on(page: str) -> list[str]:
    return ROW.findall(page.split('id="projects"', 1)[1])


async def test_the_home_page_counts_finds_and_pages_through_every_project(
        box: InProcess) -> None:
    first = await box.client.get("/")
    assert first.status_code == 200
    assert f"{len(PROJECTS)} projects" in first.text
    seen, page = [], first.text
    while True:
        shown = projects_on(page)
        assert 0 < len(shown) <= HOME_PROJECTS
        seen += shown
        found = NEXT.search(page)
        if found is None:
            break
        page = (await box.client.get(found[1].replace("&amp;", "&"))).text
        assert 'id="first-page"' in page  # the way back to the newest
    assert seen == newest_first()  # each project once, none missed, newest first

    for project in PROJECTS:  # any project is found by its name, and only it
        answer = await box.client.get("/", params={"q": project})
        assert projects_on(answer.text) == [project]
        assert f"1 of {len(PROJECTS)} projects" in answer.text
    some = await box.client.get("/", params={"q": "  song 1"})  # any case, ends trimmed
    assert projects_on(some.text) == [f"Song 1{n}" for n in range(9, -1, -1)]
    none = await box.client.get("/", params={"q": "Nocturne"})
    assert projects_on(none.text) == [] and "No project's name holds" in none.text
    odd = await box.client.get("/", params={"q": "a\x00b"})
    assert odd.status_code == 200 and f"{len(PROJECTS)} projects" in odd.text


async def test_get_exports_pages_through_every_project_by_cursor(box: InProcess) -> None:
    seen: list[str] = []
    params: dict[str, Any] = {"limit": 7}
    while True:
        answer = await box.client.get("/exports", params=params)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        seen += [export["project"] for export in body["exports"]]
        if body["next_cursor"] is None:
            break
        assert len(body["exports"]) == 7
        params["cursor"] = body["next_cursor"]
    assert seen == newest_first()
    whole = (await box.client.get("/exports", params={"limit": 500})).json()
    assert [e["project"] for e in whole["exports"]] == seen and whole["next_cursor"] is None


BAD = [
    {"limit": "0"}, {"limit": "501"}, {"limit": "ten"}, {"limit": "-1"},
    {"cursor": "not a cursor"}, {"cursor": "!!!!"}, {"cursor": "abc"},
    {"cursor": base64.urlsafe_b64encode(b"nan run_1").decode().rstrip("=")},
    {"cursor": base64.urlsafe_b64encode(b"1.5").decode().rstrip("=")},
    {"cursor": base64.urlsafe_b64encode(b"\xff\xfe 1").decode().rstrip("=")},
    {"cursor": "x" * 401}, {"project": "Song 01", "cursor": "MS41IHJ1bl8x"}]


async def test_a_bad_limit_or_cursor_is_answered_422_in_words(box: InProcess) -> None:
    for query in BAD:
        answer = await box.client.get("/exports", params=query)
        assert answer.status_code == 422, (query, answer.text)
        body = answer.json()
        assert body["error_code"] == "invalid_query"
        assert ("limit" in body["message"]) == ("limit" in query), body
        if set(query) == {"cursor"}:
            home = await box.client.get("/", params={"cursor": query["cursor"]})
            assert home.status_code == 422 and "Start again from the home page" in home.text
