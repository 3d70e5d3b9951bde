"""The pages' security headers in a real browser (Debian's Chromium, Playwright)
against a real agentbox: no other site may frame a page (the run page's Replay form
was usable from an invisible cross-origin frame), and under the
Content-Security-Policy the pages still work, live updates, charts and the mix's
player included, without one violation. Every request goes to loopback: agentbox
on 127.0.0.1, the other site on localhost (another origin)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from playwright.sync_api import ConsoleMessage, Page, expect

from tests import test_page
from tests.conftest import Server, make_event, wait_until
from tests.test_page_reviews import song, write

browser = test_page.browser  # the same fixtures: Debian's Chromium, a page per test
page = test_page.page
HEADERS = {"x-frame-options": "DENY", "x-content-type-options": "nosniff",
           "referrer-policy": "no-referrer"}


class Site:
    """Another origin's page (http://localhost:PORT/) that puts agentbox's page for
    `target` in an invisible frame over a button of its own."""

    def __init__(self) -> None:
        self.target = ""
        self.page: str | None = None  # another page of the site's, instead of the frame
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = (site.page or (
                    "<!doctype html><title>win a prize</title>"
                    "<button style='position:absolute;top:0;left:0'>Click to win</button>"
                    f"<iframe src='{site.target}' style='position:absolute;top:0;left:0;"
                    "width:1200px;height:900px;border:0;opacity:0.01'></iframe>")).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://localhost:{self._server.server_address[1]}/"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def site() -> Iterator[Site]:
    found = Site()
    yield found
    found.close()


@pytest.fixture(scope="module")
def reviewed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str, str]]:
    """A server with one reviewed mix (charts, the player) and one dead letter."""
    home = tmp_path_factory.mktemp("secured")
    server = Server(home, {"AGENTBOX_AGENTS": "mix.review_requested=tests.support.agents:"
                                              "scripted"}).start()
    try:
        mix = write(home, "take.wav", song(6, 0.5, 1))
        review = server.post(make_event(payload={"project_id": "secured",
                                                  "mix_url": str(mix)})).json()["run_id"]
        assert server.wait_terminal(review, timeout=120)["status"] == "succeeded"
        dead = server.post(make_event(event_type="mix.review_requested", payload={
            "project_id": "always-fail", "mix_url": str(mix),
            "requested_by": "a test"})).json()["run_id"]
        assert server.wait_terminal(dead, timeout=60)["status"] == "dead_lettered"
        yield server, review, dead
    finally:
        server.close()


def violations(page: Page) -> list[str]:
    """The page's console messages that report a Content-Security-Policy refusal."""
    found: list[str] = []

    def seen(message: ConsoleMessage) -> None:
        if "Content Security Policy" in message.text or "Refused to" in message.text:
            found.append(message.text)
    page.on("console", seen)
    return found


def test_every_answer_forbids_framing_and_foreign_code(
        reviewed: tuple[Server, str, str]) -> None:
    server, review, _ = reviewed
    pages = ("/", "/ui/runs", f"/ui/runs/{review}", "/docs")
    for path in (*pages, "/ui/static/page.js", "/healthz", f"/runs/{review}", "/nope",
                 f"/runs/{review}/audio"):
        answer = server.client.get(path)
        for name, value in HEADERS.items():
            assert answer.headers.get(name) == value, (path, name)
        # No other site may use any answer (an <audio src=...> learned what exists).
        assert answer.headers["cross-origin-resource-policy"] == "same-origin", path
        policy = answer.headers["content-security-policy"]
        # A page runs only agentbox's own code; anything else, opened, runs nothing.
        directives = (("script-src 'self'", "style-src 'self'", "connect-src 'self'")
                      if path in pages else ("default-src 'none'", "sandbox"))
        for directive in ("frame-ancestors 'none'", *directives):
            assert directive in policy, (path, directive)
    sent = server.post(make_event()).headers
    assert "nosniff" in sent["x-content-type-options"] and "sandbox" in sent[
        "content-security-policy"] and sent["cross-origin-resource-policy"] == "same-origin"


def test_another_site_cannot_play_or_measure_the_archived_audio(
        reviewed: tuple[Server, str, str], site: Site, page: Page) -> None:
    """An <audio src=...> on another site's page learned whether a project existed and
    its reference's duration; Cross-Origin-Resource-Policy: same-origin stops the
    browser from handing it the bytes (even one that sends the user's credentials)."""
    server, review, _ = reviewed
    audio = f"{server.url}/runs/{review}/audio"
    assert server.client.get(audio).status_code == 200  # there, and the user's to play
    site.page = f"<!doctype html><audio id='probe' preload='auto' src='{audio}'></audio>"
    page.goto(site.url)
    told = page.wait_for_function(
        "() => { const a = document.getElementById('probe');"
        " return a.error ? 'refused' : (a.readyState >= 1 ? 'duration ' + a.duration : null) }",
        timeout=15_000)
    assert told.json_value() == "refused"


def test_the_replay_form_cannot_be_used_from_another_sites_frame(
        reviewed: tuple[Server, str, str], site: Site, page: Page) -> None:
    server, _, dead = reviewed
    site.target = f"{server.url}/ui/runs/{dead}"
    page.goto(site.url)
    frame = wait_until(lambda: next((f for f in page.frames if f != page.main_frame), None),
                       10, "the frame")
    frame.wait_for_load_state()
    if frame.locator("#replay").count():  # agentbox's page rendered inside the frame
        box = frame.locator("#replay").bounding_box()
        assert box is not None
        page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        wait_until(lambda: server.run(dead)["replays"] == 1, 10, "the hidden click")
        pytest.fail("a click on another site's page replayed the run through a frame")
    assert server.run(dead)["replays"] == 0


def test_the_pages_work_under_the_policy(reviewed: tuple[Server, str, str],
                                         page: Page) -> None:
    server, review, _ = reviewed
    refused = violations(page)
    page.goto(server.url + "/ui/runs")
    expect(page.locator("#live")).to_have_text("live", timeout=10_000)  # the script, SSE
    header = page.evaluate("getComputedStyle(document.querySelector('header'))"
                           ".backgroundColor")
    assert header == "rgb(17, 24, 39)"  # the style sheet
    run_id = server.post(make_event(event_type="mix.review_requested", payload={
        "project_id": "sleep-0.5", "mix_url": "/nowhere.wav", "requested_by": "a test"}
                                    )).json()["run_id"]
    expect(page.locator(f'tr[data-run-id="{run_id}"] .status')).to_have_text(
        "succeeded", timeout=15_000)  # a live update
    page.goto(server.url + f"/ui/runs/{review}")
    expect(page.locator("svg.chart").first).to_be_visible()
    page.wait_for_function("document.getElementById('mix-audio').readyState >= 1",
                           timeout=15_000)
    assert abs(page.evaluate("document.getElementById('mix-audio').duration") - 6) < 0.1
    expect(page.locator("time[data-local='1']").first).to_be_attached()  # local times
    for path in ("/", "/projects/secured", "/ui/dead-letters", "/ui/callbacks", "/docs"):
        page.goto(server.url + path)
        expect(page.locator("#live")).to_have_text("live", timeout=10_000)
    assert refused == []

