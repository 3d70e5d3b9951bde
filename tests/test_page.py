"""The status page in a real browser: Playwright driving Debian's Chromium
(/usr/bin/chromium; scripts/test installs it) against a real agentbox server.
Every request goes to 127.0.0.1."""

from __future__ import annotations

import http.server
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import soundfile
from playwright.sync_api import Browser, Page, expect

from agentbox import manual
from tests.conftest import Server, make_event, wait_until
from tests.support.browser import as_the_user, chromium, fresh_page

# The resolver rule plays a DNS rebinding: that name answers 127.0.0.1, as an
# attacker's would after the page loaded (nothing leaves this machine).
REBOUND = "rebound.example"
FLAGS = ("--disable-quic", f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium(*FLAGS) as found:
        yield found


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    with fresh_page(browser) as opened:
        yield opened


def test_a_run_goes_to_succeeded_live_without_a_reload(server: Server, page: Page) -> None:
    page.goto(server.url + "/ui/runs")
    expect(page.locator("#live")).to_have_text("live", timeout=10_000)
    page.evaluate("window.__notReloaded = true")
    run_id = server.post(make_event(project_id="sleep-0.5")).json()["run_id"]
    status = page.locator(f'tr[data-run-id="{run_id}"] .status')
    expect(status).to_have_text("succeeded", timeout=15_000)
    assert page.evaluate("window.__notReloaded") is True
    expect(page.locator('[data-stat="succeeded"]')).to_have_text("1", timeout=10_000)
    page.click(f'tr[data-run-id="{run_id}"] a')
    expect(page.locator("h1 .status")).to_have_text("succeeded")
    expect(page.get_by_text("processing").first).to_be_visible()


def test_a_dead_letter_is_replayed_by_clicking(server: Server, page: Page) -> None:
    run_id = server.post(make_event(project_id="fail-4")).json()["run_id"]
    assert server.wait_terminal(run_id, timeout=30)["status"] == "dead_lettered"
    page.goto(server.url + "/")
    # a musician's page says only that operations need a look; the operations area why
    expect(page.get_by_role("alert")).to_have_count(0)
    expect(page.locator("#nav-operations #attention")).to_be_visible()
    page.click("#nav-operations")
    expect(page.get_by_role("alert")).to_contain_text("dead-lettered")
    page.click("#tab-dead-letters")
    page.check(f'input[value="{run_id}"]')
    page.click("#replay-selected")
    page.wait_for_url(f"**/ui/runs/{run_id}")
    expect(page.locator("h1 .status")).to_have_text("succeeded", timeout=20_000)
    page.reload()
    expect(page.locator("#timeline").get_by_text("replayed")).to_be_visible()
    expect(page.locator("#run-facts")).to_contain_text("replayed 1 time")
    run = server.run(run_id)
    assert run["status"] == "succeeded" and run["replays"] == 1


def test_a_dead_letter_can_be_discarded_with_a_reason(server: Server, page: Page) -> None:
    run_id = server.post(make_event(project_id="permanent")).json()["run_id"]
    server.wait_terminal(run_id)
    dead = server.post(make_event(project_id="always-fail")).json()["run_id"]
    server.wait_terminal(dead, timeout=30)
    page.goto(server.url + "/ui/dead-letters")
    page.select_option('select[name="run_id"]', dead)
    page.fill('input[name="reason"]', "the export was a test")
    page.click("button:has-text(\"Discard\")")
    expect(page.locator(f'tr[data-run-id="{dead}"]')).to_have_count(0)
    page.goto(server.url + f"/ui/runs/{dead}")
    expect(page.get_by_role("status")).to_contain_text("the export was a test")


def test_forged_state_changes_are_refused(server: Server, page: Page) -> None:
    run_id = server.post(make_event(project_id="always-fail")).json()["run_id"]
    server.wait_terminal(run_id, timeout=30)
    # no CSRF token (sent with the user's credentials: what a forged form rides on)
    forged = server.client.post("/ui/replay", data={"run_id": run_id})
    assert forged.status_code == 403
    # the right token, but posted by another site's page
    page.goto(server.url + "/ui/dead-letters")
    csrf = page.locator('input[name="csrf"]').first.get_attribute("value")
    cross = server.client.post("/ui/replay", data={"run_id": run_id, "csrf": csrf},
                               headers={"Origin": "http://evil.example"})
    assert cross.status_code == 403
    assert server.run(run_id)["replays"] == 0
    # a page on another origin cannot make the browser do it either
    page.set_content(f"""<form method="post" action="{server.url}/ui/replay">
        <input name="run_id" value="{run_id}"></form>""")
    page.evaluate("document.forms[0].submit()")
    page.wait_for_load_state()
    assert server.run(run_id)["replays"] == 0


def test_a_rebound_host_name_gets_nothing(server: Server) -> None:
    """DNS rebinding: a site whose name now points at 127.0.0.1 would read the pages
    (CSRF token included) as its own, and post with its own origin."""
    run_id = server.post(make_event(project_id="always-fail")).json()["run_id"]
    server.wait_terminal(run_id, timeout=30)
    port = server.url.rsplit(":", 1)[1]
    rebound = f"attacker.example:{port}"
    browser = {"User-Agent": "Mozilla/5.0 (X11; Linux x86_64) Chrome/131.0",
               "Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors"}
    for path in ("/", "/ui/runs", "/projects/always-fail", "/ui/dead-letters",
                 f"/runs/{run_id}", f"/runs/{run_id}/audio", "/healthz", "/metrics"):
        refused = httpx.get(server.url + path, headers={**browser, "Host": rebound},
                            timeout=10)
        assert refused.status_code == 400, path
        assert refused.json()["error_code"] == "host_not_allowed"
    forged = httpx.post(server.url + "/ui/discard", timeout=10,
                        data={"csrf": server.csrf(), "run_id": run_id, "reason": "rebound"},
                        headers={"Host": rebound, "Origin": f"http://{rebound}"})
    assert forged.status_code == 400
    assert server.client.get(f"/runs/{run_id}?history=1").json()["history"][-1]["note"] != \
        "rebound"
    for name in (f"localhost:{port}", f"LOCALHOST:{port}", f"127.0.0.1:{port}",
                 f"127.1.2.3:{port}", f"[::1]:{port}", "localhost", f"localhost.:{port}",
                 f"{server.page_name()}:{port}"):
        assert server.client.get("/", headers={**browser, "Host": name},
                                 timeout=10).status_code == 200, name
    for name in (f"agentbox.localhost:{port}", f"x.{server.page_name()}:{port}"):
        # under .localhost only the page's own name is agentbox's
        assert server.client.get("/", headers={**browser, "Host": name},
                                 timeout=10).status_code == 400, name
    # a program is held to it as well: a browser cannot always be told from one
    assert httpx.get(server.url + "/", headers={"Host": rebound}).status_code == 400
    # the receiver stays open to any name: a signature, not a host, is what it checks
    assert server.post(make_event(), headers={**browser, "Host": rebound}).status_code == 202


def test_the_page_finds_a_project_by_its_whole_name(server: Server) -> None:
    longest = "x" * 256
    run_id = server.post(make_event(project_id=longest)).json()["run_id"]
    assert run_id in server.client.get("/ui/runs", params={"project": longest}).text
    assert run_id in server.client.get("/ui/runs", params={"q": longest}).text
    for longer in (longest + "x", longest + "y" * 2000):  # not cut down to the name
        assert run_id not in server.client.get("/ui/runs", params={"project": longer}).text
    # a link to the runs view from when it was the home page still finds it
    moved = server.client.get("/", params={"project": longest}, follow_redirects=True)
    assert moved.url.path == "/ui/runs" and run_id in moved.text


def test_a_real_browser_on_a_rebound_name_reads_nothing(server: Server, page: Page) -> None:
    port = server.url.rsplit(":", 1)[1]
    answer = page.goto(f"http://{REBOUND}:{port}/ui/dead-letters")
    assert answer is not None and answer.status == 400
    assert "host_not_allowed" in page.content() and 'name="csrf"' not in page.content()
    # the attacker's script, same origin as far as the browser knows: the refusal, a
    # document that is not a page, is sandboxed (no script may fetch from it at all)
    status = page.evaluate("fetch('/runs').then(r => r.status, () => 'refused')")
    assert status in (400, "refused")
    own = page.goto(f"http://localhost:{port}/")
    assert own is not None and own.status == 200


def test_a_one_time_link_logs_a_browser_in_once(server: Server, browser: Browser) -> None:
    """On loopback too the page is its user's: a browser without a session gets the
    login form; `agentbox open`'s one-time link logs it in, and the session lasts."""
    with fresh_page(browser, logged_in=False) as page:
        page.goto(server.url + "/ui/runs")
        expect(page.get_by_text("Admin token needed")).to_be_visible()
        link = server.login_link()
        page.goto(link)
        expect(page.locator("h1")).to_have_text("Your projects")
        page.goto(f"http://{server.page_name()}:{server.port}/ui/runs")  # the session's
        expect(page.locator("#live")).to_have_text("live", timeout=10_000)  # the stream too
        with fresh_page(browser, logged_in=False) as other:  # the link works once
            other.goto(link)
            expect(other.get_by_text("Admin token needed")).to_be_visible()
            expect(other.locator("#login-why")).to_contain_text("used already or has expired")
            expect(other.locator("#live")).to_have_count(0)  # no stream, no "reconnecting…"


class Listener:
    """Another program on another loopback port: it records every request's Host and
    Cookie, and answers each with a page that sends the browser on to `then` (a
    hostile page's links and fetches)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []  # (Host, Cookie) of each request
        self.then: list[str] = []
        seen, then = self.seen, self.then

        class Record(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append((self.headers.get("Host", ""), self.headers.get("Cookie", "")))
                calls = "".join(f"fetch({json.dumps(url)}, {{credentials: 'include', "
                                "mode: 'no-cors'}).catch(() => 0);" for url in then)
                body = f"<!doctype html><title>elsewhere</title><script>{calls}</script>"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Record)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_the_session_cookie_never_reaches_another_loopback_port(
        server: Server, browser: Browser, tmp_path: Path) -> None:
    """Logged in by `agentbox open`'s path (a file that forwards to the one-time link),
    Chromium holds the session on the page's private name alone: sent by a page to
    another program on another loopback port, by 127.0.0.1 or localhost, it never
    sends the cookie there; only a program that knew the name would get it. A cookie
    replayed to agentbox by 127.0.0.1 is refused."""
    from agentbox.browser import write_handoff
    from agentbox.http.access import SESSION_COOKIE

    name = server.page_name()
    listener = Listener()
    try:
        with fresh_page(browser, logged_in=False) as page:
            page.goto(write_handoff(tmp_path, server.login_link()).as_uri())
            expect(page.locator("h1")).to_have_text("Your projects")
            assert page.url == f"http://{name}:{server.port}/"
            held = [c for c in page.context.cookies() if c["name"] == SESSION_COOKIE]
            assert [(c["domain"], c["httpOnly"], c["sameSite"]) for c in held] == [
                (name, True, "Strict")]
            elsewhere = [f"http://127.0.0.1:{listener.port}/fetched",
                         f"http://localhost:{listener.port}/fetched",
                         f"http://127.0.0.1:{server.port}/runs"]
            listener.then.extend(elsewhere)
            for url in (f"http://127.0.0.1:{listener.port}/",
                        f"http://localhost:{listener.port}/"):
                page.goto(url)  # a link the hostile page followed, then its fetches
            wait_until(lambda: len(listener.seen) >= 6, 30, "the page's requests to arrive")
            assert all(SESSION_COOKIE not in cookie for _, cookie in listener.seen), \
                listener.seen
            # the listener would see the cookie had it known the name: it is the secret
            page.goto(f"http://{name}:{listener.port}/")
            known = wait_until(lambda: [c for h, c in listener.seen
                                        if h == f"{name}:{listener.port}"], 30, "the visit")
            assert SESSION_COOKIE in known[0]
    finally:
        listener.close()
    cookie = {"Cookie": f"{SESSION_COOKIE}={held[0]['value']}"}
    for host in (f"127.0.0.1:{server.port}", f"localhost:{server.port}"):
        replayed = httpx.get(server.url + "/runs", headers={**cookie, "Host": host})
        assert replayed.status_code == 401, host
    assert httpx.get(server.url + "/runs", headers={
        **cookie, "Host": f"{name}:{server.port}"}).status_code == 200


def test_on_loopback_the_form_logs_in_on_the_private_name(
        server: Server, browser: Browser) -> None:
    token = (server.home / "config" / "agentbox" / "admin_token").read_text().strip()
    with fresh_page(browser, logged_in=False) as page:
        _log_in_with_the_form(server, page, token)  # asked at 127.0.0.1
        assert page.url.startswith(f"http://{server.page_name()}:{server.port}/")


def test_beyond_loopback_every_page_needs_the_token(
        server_factory: Callable[..., Server], browser: Browser) -> None:
    server = server_factory({"AGENTBOX_HOST": "0.0.0.0"}).start()  # traffic stays on 127.0.0.1
    token = (server.home / "config" / "agentbox" / "admin_token").read_text().strip()
    with fresh_page(browser, logged_in=False) as page:
        _log_in_with_the_form(server, page, token)


def _log_in_with_the_form(server: Server, page: Page, token: str) -> None:
    for path in ("/", "/ui/runs", "/projects/ok", "/runs/run_x/audio", "/runs", "/metrics",
                 "/ui/dead-letters", "/ui/stream"):
        assert httpx.get(server.url + path, timeout=10).status_code == 401, path
    assert httpx.get(server.url + "/runs", timeout=10,
                     headers={"Authorization": f"Bearer {token}"}).status_code == 200
    assert server.post(make_event()).status_code == 202  # the receiver: signatures, not tokens
    page.goto(server.url + "/")
    expect(page.get_by_text("Admin token needed")).to_be_visible()
    page.fill('input[name="token"]', "wrong")
    page.click("button:has-text(\"Open\")")
    expect(page.get_by_text("Admin token needed")).to_be_visible()
    expect(page.locator("#login-why")).to_have_text("That is not the admin token.")
    page.fill('input[name="token"]', token)
    page.click("button:has-text(\"Open\")")
    expect(page.locator("h1")).to_have_text("Your projects")
    page.click("#nav-operations")
    expect(page.locator("h1")).to_have_text("Runs")
    expect(page.locator("#live")).to_have_text("live", timeout=10_000)
    html = page.content()
    assert token not in html


def test_the_run_page_shows_the_event_without_secrets(server: Server, page: Page) -> None:
    event: dict[str, Any] = make_event(project_id="ok")
    event["payload"]["session_name"] = "take 3"
    run_id = server.post(event).json()["run_id"]
    server.wait_terminal(run_id)
    page.goto(server.url + f"/ui/runs/{run_id}")
    expect(page.get_by_text('"session_name": "take 3"')).to_be_visible()
    assert "integration-test-secret" not in page.content()
    assert page.goto(server.url + "/ui/runs/run_nope").status == 404


def test_the_page_keeps_following_after_a_server_restart(server: Server, page: Page) -> None:
    page.goto(server.url + "/ui/runs")
    expect(page.locator("#live")).to_have_text("live", timeout=10_000)
    page.evaluate("window.__notReloaded = true")
    server.stop()
    expect(page.locator("#live")).to_have_text("reconnecting…", timeout=10_000)
    server.start()  # the same port
    expect(page.locator("#live")).to_have_text("live", timeout=20_000)
    run_id = server.post(make_event(project_id="ok")).json()["run_id"]
    expect(page.locator(f'tr[data-run-id="{run_id}"] .status')).to_have_text(
        "succeeded", timeout=15_000)
    assert page.evaluate("window.__notReloaded") is True


def test_hostile_event_fields_cannot_run_script_or_forge_log_lines(
        server: Server, page: Page) -> None:
    hostile = '<script>window.__owned = 1</script><img src=x onerror="window.__owned=2">' \
              '\n{"level": "error", "msg": "forged"}\x1b[31m'
    event: dict[str, Any] = make_event(project_id="ok")
    event["payload"]["session_name"] = hostile[:256]
    run_id = server.post(event).json()["run_id"]
    server.wait_terminal(run_id)
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.goto(server.url + f"/ui/runs/{run_id}")
    page.goto(server.url + "/ui/runs?q=" + run_id)
    page.goto(server.url + "/")
    page.goto(server.url + f"/ui/runs/{run_id}")
    assert page.evaluate("window.__owned") is None and dialogs == []
    expect(page.get_by_text("<script>window.__owned = 1</script>", exact=False)).to_be_visible()
    for line in server.log_path.read_text().splitlines():
        if line.startswith("{"):
            assert json.loads(line)["msg"] != "forged"
    assert "\x1b[31m" not in server.log_path.read_text()


def test_no_secret_appears_in_any_output(server_factory: Callable[..., Server],
                                        page: Page, tmp_path: Any) -> None:
    """Every secret of a full run (webhook, callback, admin token, LLM key) is
    looked for in the log, the pages, /metrics, /healthz, the API and errors."""
    from tests.support.callback_receiver import CallbackReceiver
    from tests.test_callbacks import CALLBACK_SECRET

    receiver = CallbackReceiver(CALLBACK_SECRET)
    try:
        server = server_factory({
            "AGENTBOX_CALLBACK_ALLOWED": receiver.origin,
            "AGENTBOX_CALLBACK_SECRET": CALLBACK_SECRET,
            "AGENTBOX_LLM_API_KEY": "llm-key-that-must-not-leak",
            "AGENTBOX_ADMIN_TOKEN": "admin-token-that-must-not-leak",
        }).start()
        secrets = ["integration-test-secret", CALLBACK_SECRET, "llm-key-that-must-not-leak",
                   "admin-token-that-must-not-leak"]
        outputs = []
        run_id = server.post(make_event(project_id="ok", callback_url=receiver.url("/ok"))
                             ).json()["run_id"]
        dead = server.post(make_event(project_id="always-fail")).json()["run_id"]
        server.wait_terminal(dead, timeout=30)
        outputs.append(server.post(make_event(), secret="wrong").text)
        outputs.append(server.post(b"{not json").text)
        for path in ("/", "/ui/runs", "/projects/ok", f"/ui/runs/{run_id}", "/ui/dead-letters",
                     "/ui/callbacks",
                     "/metrics", "/healthz", f"/runs/{run_id}?history=1", "/runs",
                     "/callbacks", "/callbacks/destinations", "/nope"):
            outputs.append(server.client.get(path).text)
        outputs.append(server.client.post(f"/runs/{dead}/replay",
                                          headers={"Authorization": "Bearer wrong"}).text)
        page.goto(server.url + f"/ui/runs/{run_id}")
        outputs.append(page.content())
        server.stop()
        outputs.append(server.log_path.read_text())
        everything = "\n".join(outputs)
        for secret in secrets:
            assert secret not in everything, secret
    finally:
        receiver.close()


def test_every_topic_of_the_manual_fits_a_phone(server: Server, browser: Browser) -> None:
    """At 390 px a topic's long code lines scroll in their block and its tables in
    their box: the page itself is never wider than the phone."""
    context = browser.new_context(**as_the_user(viewport={"width": 390, "height": 844}))
    try:
        page = context.new_page()
        for topic in ["index", *(t.name for t in manual.topics())]:
            page.goto(server.url + ("/docs" if topic == "index" else f"/docs/{topic}"))
            expect(page.locator("#doc h1")).to_be_visible()
            wide = page.evaluate("document.documentElement.scrollWidth")
            assert wide <= 390, f"/docs/{topic} is {wide} px wide at 390"
    finally:
        context.close()


@pytest.mark.slow
def test_exports_of_one_file_in_one_minute_are_told_apart_everywhere(
        server_factory: Callable[..., Server], browser: Browser, tmp_path: Path) -> None:
    """Two renders of one file name, reviewed in the same minute: every place the
    project page names an export (the A/B and compare pickers, the compare headings,
    every export's row, the trend charts' labels) names each differently, and with
    the date as the page's tables say it."""
    server = server_factory({"AGENTBOX_AGENTS": ""}).start()  # the built-in mix review
    mix = tmp_path / "Night Drive.wav"
    runs = []
    if datetime.now().second > 45:  # both must arrive in the same minute
        time.sleep(61 - datetime.now().second)
    for level in (0.2, 0.5):
        t = np.arange(48_000 * 3) / 48_000
        soundfile.write(mix, np.stack([level * np.sin(2 * np.pi * 110 * t)] * 2, 1),
                        48_000, subtype="PCM_24")
        settled = time.time() - 60
        os.utime(mix, (settled, settled))
        answer = server.post(make_event(payload={"project_id": "Night Drive",
                                                 "mix_url": str(mix)}))
        runs.append(server.wait_terminal(answer.json()["run_id"], timeout=120))
    assert [run["status"] for run in runs] == ["succeeded"] * 2
    assert len({run["accepted_at"][:16] for run in runs}) == 1, "not in one minute"
    page = browser.new_page(**as_the_user(viewport={"width": 390, "height": 844}))
    try:
        page.goto(server.url + "/projects/Night%20Drive")
        expect(page.locator("#live")).to_have_text("live", timeout=10_000)
        older, newer = (run["run_id"] for run in runs)
        rows = {run_id: page.locator(f'#exports tr[data-run-id="{run_id}"]')
                for run_id in (older, newer)}
        named = {run_id: row.locator("td.lead a").inner_text() for run_id, row in rows.items()}
        assert named == {older: "#1 Night Drive.wav", newer: "#2 Night Drive.wav"}
        when = {run_id: row.locator("time").inner_text() for run_id, row in rows.items()}
        assert not when[older].endswith("UTC"), "the page's script left a time unread"
        for picker in ("#ab-a", "#ab-b", 'select[name="a"]', 'select[name="b"]'):
            said = dict(zip(page.locator(f"{picker} option").evaluate_all(
                "options => options.map(o => o.value)"),
                page.locator(f"{picker} option").all_inner_texts(), strict=True))
            for run_id in (older, newer):  # the row's name and the row's time
                assert said[run_id] == f"{named[run_id]} · {when[run_id]}", (picker, said)
        headings = page.locator("#comparison thead th.export").all_inner_texts()
        assert [h.split("\n") for h in headings] == [[named[older], when[older]],
                                                     [named[newer], when[newer]]]
        for chart in ("trend-integrated", "trend-true-peak", "trend-lra"):
            ticks = page.locator(f"#{chart} .x-tick").all_text_contents()
            assert ticks == ["#1", "#2"], (chart, ticks)
            tips = page.locator(f"#{chart} circle.point title").all_text_contents()
            assert [re.sub(r":.*", "", tip) for tip in tips] == [named[older], named[newer]]
        wide = page.evaluate("document.documentElement.scrollWidth")
        assert wide <= 390, f"the project page is {wide} px wide at 390"
    finally:
        page.close()
