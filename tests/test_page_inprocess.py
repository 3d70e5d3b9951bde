"""The status page in process: its main views, the CSRF check and the origin check
on state-changing forms, the admin token off loopback, and the host guard
against DNS rebinding. The real app and store (a temporary SQLite file) over
httpx's ASGI transport; tests/test_page.py drives the same page in Chromium."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentbox.config import page_name
from tests.conftest import ADMIN_TOKEN, InProcess, in_process, make_event

pytestmark = pytest.mark.anyio


async def finished(box: InProcess, project_id: str) -> str:
    response = await box.post(make_event(project_id=project_id))
    assert response.status_code == 202, response.text
    run_id: str = response.json()["run_id"]
    await box.wait_status(run_id)
    return run_id


async def test_the_runs_view_lists_runs_and_filters_them(box: InProcess) -> None:
    ok = await finished(box, "ok")
    bad = await finished(box, "permanent")
    page = await box.client.get("/ui/runs")  # the operator's view, one click from home
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert f'data-run-id="{ok}"' in page.text and f'data-run-id="{bad}"' in page.text
    only_failed = await box.client.get("/ui/runs", params={"status": "failed_permanent"})
    assert f'data-run-id="{bad}"' in only_failed.text
    assert f'data-run-id="{ok}"' not in only_failed.text
    # an old link to a filtered home page still finds the runs view
    old = await box.client.get("/", params={"status": "failed_permanent"})
    assert old.status_code == 307 and old.headers["location"].startswith("/ui/runs?")


async def test_a_runs_page_tells_its_story(box: InProcess) -> None:
    run_id = await finished(box, "fail-1")
    page = await box.client.get(f"/ui/runs/{run_id}")
    assert page.status_code == 200
    assert run_id in page.text and "failed_retryable" in page.text and "succeeded" in page.text
    missing = await box.client.get("/ui/runs/no-such-run")
    assert missing.status_code == 404


async def test_dead_letters_and_callbacks_views(box: InProcess) -> None:
    dead = await finished(box, "always-fail")
    page = await box.client.get("/ui/dead-letters")
    assert page.status_code == 200 and f'data-run-id="{dead}"' in page.text
    assert 'name="csrf"' in page.text
    callbacks = await box.client.get("/ui/callbacks")
    assert callbacks.status_code == 200 and "Callback destinations" in callbacks.text


async def test_a_replay_without_the_csrf_token_is_refused(box: InProcess) -> None:
    dead = await finished(box, "always-fail")
    forged = await box.client.post("/ui/replay", data={"run_id": dead})
    assert forged.status_code == 403
    stale = await box.client.post("/ui/replay", data={"run_id": dead, "csrf": "old"})
    assert stale.status_code == 403
    assert (await box.run(dead))["replays"] == 0


async def test_a_replay_from_another_origin_is_refused(box: InProcess) -> None:
    dead = await finished(box, "always-fail")
    cross = await box.client.post("/ui/replay", data={"run_id": dead, "csrf": await box.csrf()},
                                  headers={"Origin": "http://evil.example"})
    assert cross.status_code == 403
    assert (await box.run(dead))["replays"] == 0


async def test_a_replay_from_the_page_runs_the_dead_letter_again(box: InProcess) -> None:
    dead = await finished(box, "always-fail")
    response = await box.client.post("/ui/replay", data={"run_id": dead, "csrf": await box.csrf()},
                                     headers={"Origin": "http://localhost"})
    assert response.status_code == 303
    assert response.headers["location"] == f"/ui/runs/{dead}"
    assert (await box.run(dead))["replays"] == 1
    nothing = await box.client.post("/ui/replay", data={"csrf": await box.csrf()})
    assert nothing.status_code == 422


async def test_a_dead_letter_is_discarded_only_with_a_reason(box: InProcess) -> None:
    dead = await finished(box, "always-fail")
    csrf = await box.csrf()
    silent = await box.client.post("/ui/discard", data={"run_id": dead, "csrf": csrf})
    assert silent.status_code == 422
    done = await box.client.post("/ui/discard", data={"run_id": dead, "csrf": csrf,
                                                      "reason": "a test render"})
    assert done.status_code == 303
    left = (await box.client.get("/runs", params={"discarded": "false"})).json()["runs"]
    assert dead not in [run["run_id"] for run in left]
    page = await box.client.get("/ui/dead-letters")
    assert f'data-run-id="{dead}"' not in page.text


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "127.0.0.1.nip.io"])
async def test_a_request_naming_another_host_is_refused(box: InProcess, host: str) -> None:
    for path in ("/", "/runs", "/ui/dead-letters"):
        response = await box.client.get(path, headers={"Host": host})
        assert response.status_code == 400, (path, response.status_code)
        assert response.json()["error_code"] == "host_not_allowed"


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1:8000", "[::1]:8000", "PAGE",
                                  "PAGE.:8000"])
async def test_loopback_names_are_served(box: InProcess, host: str) -> None:
    name = page_name(box.settings)
    response = await box.client.get("/", headers={"Host": host.replace("PAGE", name)})
    assert response.status_code == 200


@pytest.mark.parametrize("host", ["agentbox.localhost", "localhost.localhost:8000",
                                  "agentbox-0123456789abcdef0123456789abcdef.localhost"])
async def test_another_name_under_localhost_is_refused(box: InProcess, host: str) -> None:
    """Only the page's own name under .localhost is agentbox's (a guessed one is not)."""
    response = await box.client.get("/", headers={"Host": host})
    assert response.status_code == 400 and response.json()["error_code"] == \
        "host_not_allowed"


async def test_off_loopback_every_page_needs_the_token(tmp_path: Path,
                                                       anyio_backend: str) -> None:
    async with in_process(tmp_path, AGENTBOX_HOST="0.0.0.0") as box, \
            box.anonymous() as client:
        login = await client.get("/", headers={"Accept": "text/html"})
        assert login.status_code == 401 and "Admin token needed" in login.text
        api = await client.get("/runs")
        assert api.status_code == 401 and api.json()["error_code"] == "admin_token_required"
        bearer = await client.get("/runs", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert bearer.status_code == 200
        assert (await client.get("/healthz")).status_code == 200  # open to balancers
        assert (await box.post(make_event())).status_code == 202  # senders sign instead
        wrong = await client.post("/ui/login", data={"token": "guess"})
        assert wrong.status_code == 401
        signed_in = await client.post("/ui/login", data={"token": ADMIN_TOKEN})
        assert signed_in.status_code == 303
        assert (await client.get("/", headers={"Accept": "text/html"})).status_code == 200


async def test_home_names_an_export_that_was_not_reviewed_by_its_file(box: InProcess) -> None:
    """A musician reads the file and why it was not reviewed, not a run id or a run
    state."""
    bad = await finished(box, "permanent")
    home = await box.client.get("/")
    assert home.status_code == 200
    row = home.text[home.text.index(f'data-run-id="{bad}"'):]
    # (a project whose only export failed is listed apart, under "Couldn't review")
    row = row[:min(i for i in (row.find("</tr>"), row.find("</li>")) if i >= 0)]
    assert "mix.wav" in row and "review: scripted permanent failure" in row
    assert f">{bad}<" not in row and ">failed_permanent<" not in row


async def test_the_page_takes_its_style_and_script_from_its_own_files(box: InProcess) -> None:
    """Nothing inline (a Content-Security-Policy without 'unsafe-inline' allows the
    page), and each file named by a digest of it, so that a browser keeps it until
    agentbox changes it."""
    home = (await box.client.get("/")).text
    assert "<style" not in home and " style=" not in home
    assert "<script>" not in home and '<script src="/ui/static/page.js?v=' in home
    for name, kind in (("page.css", "text/css"), ("page.js", "text/javascript")):
        url = home[home.index(f"/ui/static/{name}?v="):].split('"')[0]
        kept = await box.client.get(url)
        assert kept.status_code == 200 and kept.headers["content-type"].startswith(kind)
        assert "immutable" in kept.headers["cache-control"]
        asked = await box.client.get(f"/ui/static/{name}")  # no digest: asked again each time
        assert asked.headers["cache-control"] == "no-cache" and asked.content == kept.content
    for name in ("nope.css", "..%2Fpages.py", "%2E%2E%2Ftemplates%2Fbase.html"):
        assert (await box.client.get(f"/ui/static/{name}")).status_code == 404


async def test_an_apps_files_are_served_under_its_name(box: InProcess) -> None:
    """The review's stylesheet and scripts are its own (/static/review/...), named with
    a digest as the engine's are; the engine's files hold its pages' alone."""
    await finished(box, "ok")  # a project, whose page has the A/B player
    home = (await box.client.get("/")).text
    for name, kind in (("review.css", "text/css"), ("drop.js", "text/javascript")):
        url = home[home.index(f"/static/review/{name}?v="):].split('"')[0]
        kept = await box.client.get(url)
        assert kept.status_code == 200 and kept.headers["content-type"].startswith(kind)
        assert "immutable" in kept.headers["cache-control"]
    project = (await box.client.get(home[home.index('href="/projects/') + 6:]
                                    .split('"')[0])).text
    assert "/static/review/ab.js?v=" in project
    engine = (await box.client.get("/ui/static/page.js")).text
    assert "dropZone" not in engine and "drop-form" not in engine
    assert ".ab-pick" not in (await box.client.get("/ui/static/page.css")).text
    for path in ("/ui/static/ab.js", "/static/review/page.css", "/static/review/nope.js",
                 "/static/review/..%2Fapp.py", "/static/review/%2E%2E%2Fpages.py",
                 "/static/nobody/page.css", "/static/review/.hidden.css"):
        assert (await box.client.get(path)).status_code == 404, path
    async with box.anonymous() as anonymous:  # the page's files, as its pages, need a login
        assert (await anonymous.get("/static/review/review.css")).status_code == 401
        assert (await anonymous.get("/ui/static/page.css")).status_code == 200  # the login's


async def test_the_operations_area_is_one_click_from_every_page(box: InProcess) -> None:
    dead = await finished(box, "always-fail")
    home = (await box.client.get("/")).text
    assert 'id="nav-operations"' in home and 'href="/ui/dead-letters"' not in home
    assert 'id="attention"' in home and "dead-lettered" not in home  # why: over there
    runs = (await box.client.get("/ui/runs")).text
    assert "dead-lettered" in runs  # the banner
    for tab in ("/ui/runs", "/ui/dead-letters", "/ui/callbacks"):
        page = (await box.client.get(tab)).text
        assert f'href="{tab}"' in page and 'aria-current="page"' in page
    assert f'data-run-id="{dead}"' in (await box.client.get("/ui/dead-letters")).text


async def test_off_loopback_the_login_page_has_its_style(tmp_path: Path,
                                                         anyio_backend: str) -> None:
    async with in_process(tmp_path, AGENTBOX_HOST="0.0.0.0") as box, \
            box.anonymous() as client:
        login = await client.get("/", headers={"Accept": "text/html"})
        assert login.status_code == 401
        url = login.text[login.text.index("/ui/static/page.css"):].split('"')[0]
        assert (await client.get(url)).status_code == 200


async def test_the_runs_view_shows_the_apps_run_fields(box: InProcess, tmp_path: Path) -> None:
    """The run list's project column, its filter and its link are the review's
    (its tables' run_fields and filters, Host.add_run_field_link); with no app loaded
    the list has no such column, and the API document no such field."""
    ok = await finished(box, "ok")
    page = (await box.client.get("/ui/runs")).text
    assert "<th>Project</th>" in page and '<a href="/projects/ok">ok</a>' in page
    assert 'name="project" aria-label="Project"' in page
    assert 'placeholder="run_id, event_id or project"' in page
    assert f'data-run-id="{ok}"' in (await box.client.get("/ui/runs?project=ok")).text
    assert f'data-run-id="{ok}"' not in (await box.client.get("/ui/runs?project=Other")).text
    assert (await box.run(ok))["project"] == "ok"
    document = (await box.client.get("/openapi.json")).json()
    assert "project" in document["components"]["schemas"]["RunView"]["properties"]
    example = document["paths"]["/webhooks/events"]["post"]["requestBody"]["content"]
    assert example["application/json"]["example"]["event_type"] == "session.exported"

    async with in_process(tmp_path / "alone", AGENTBOX_APPS="", AGENTBOX_AGENTS="") as alone:
        page = (await alone.client.get("/ui/runs")).text
        assert "<th>Event type</th><th>Agent</th>" in page and "Project" not in page
        assert 'name="project"' not in page and 'placeholder="run_id or event_id"' in page
        document = (await alone.client.get("/openapi.json")).json()
        assert "project" not in document["components"]["schemas"]["RunView"]["properties"]
        example = document["paths"]["/webhooks/events"]["post"]["requestBody"]["content"]
        assert example["application/json"]["example"]["event_type"] == "ping"
