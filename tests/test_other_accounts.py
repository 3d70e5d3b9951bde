"""The page and API are their user's, not every account's on the machine: on loopback
too they need the admin token or a session (agentbox.http.access). Another account
is played for real: curl run as another uid (`setpriv`) against a real server."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentbox.http.access import SESSION_COOKIE
from tests.conftest import Server, make_event

NOBODY = "65534"  # another account: not the server's user, no group of its


def as_another_account(*curl: str) -> str:
    """curl's `%{http_code}` and body, run as another uid than the server's."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("playing another account needs root and setpriv")
    done = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "curl",
         "--silent", "--max-time", "20", "--write-out", "\n%{http_code}", *curl],
        capture_output=True, text=True, timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_another_account_gets_no_run_no_audio_and_no_use_of_a_scraped_form(
        server: Server) -> None:
    run_id = server.post(make_event(project_id="fail-4")).json()["run_id"]
    assert server.wait_terminal(run_id, timeout=30)["status"] == "dead_lettered"
    for path in (f"/runs/{run_id}", f"/runs/{run_id}/audio", "/runs", "/metrics"):
        answer = as_another_account(server.url + path)
        assert answer.endswith("\n401"), (path, answer)
        assert run_id not in answer and "admin_token_required" in answer
    page = as_another_account("--header", "Accept: text/html", "--include",
                              server.url + "/ui/runs")
    assert page.endswith("\n401") and "Admin token needed" in page and run_id not in page
    assert server.page_name() not in page  # nor the page's private name
    csrf = server.csrf()  # scraped somehow: it is still no use without the user's session
    replay = as_another_account("--data", f"csrf={csrf}&run_id={run_id}",
                                server.url + "/ui/replay")
    assert replay.endswith("\n401"), replay
    assert server.run(run_id)["replays"] == 0
    assert as_another_account(server.url + "/healthz").endswith("\n200")  # still open
    assert server.post(make_event()).status_code == 202  # the signed receiver too


def test_a_one_time_link_opens_a_session_that_outlives_a_restart(server: Server) -> None:
    link = server.login_link()
    assert link.startswith(f"http://{server.page_name()}:{server.port}/ui/login?code=")
    browser = server.browser()
    opened = browser.get(server.on_page(link))
    assert opened.status_code == 303 and opened.headers["location"] == "/"
    session = opened.cookies[SESSION_COOKIE]
    cookie = {"Cookie": f"{SESSION_COOKIE}={session}"}
    assert browser.get("/ui/runs", headers=cookie).status_code == 200
    again = browser.get(server.on_page(link), headers={"Accept": "text/html"})
    assert again.status_code == 401 and SESSION_COOKIE not in again.headers.get(
        "set-cookie", "")  # once only
    server.stop()
    server.start()
    assert browser.get("/ui/runs", headers=cookie).status_code == 200
    forged = session[:-4] + ("0000" if not session.endswith("0000") else "1111")
    assert browser.get("/runs", headers={
        "Cookie": f"{SESSION_COOKIE}={forged}"}).status_code == 401
    browser.close()


def test_agentbox_open_prints_a_link_that_logs_in(server: Server) -> None:
    opened = subprocess.run(
        [sys.executable, "-m", "agentbox", "open", "--print", "--url", server.url],
        env=server.env, capture_output=True, text=True, timeout=60, cwd=server.home)
    assert opened.returncode == 0, opened.stderr
    link = opened.stdout.strip()  # on the page's private name, where a session is made
    assert link.startswith(f"http://{server.page_name()}:{server.port}/ui/login?code=")
    with server.browser() as browser:
        used = browser.get(server.on_page(link))
    assert used.status_code == 303 and SESSION_COOKIE in used.headers["set-cookie"]
    said = Path(server.log_path).read_text()
    assert "/ui/login?code=" in said  # the start-up line's own link
