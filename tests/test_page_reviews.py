"""The page for musicians, in a real browser: Playwright driving Debian's Chromium
against a real agentbox whose mix review listened to real WAV files made here.
Every request goes to 127.0.0.1."""

from __future__ import annotations

import os
import re
import time
import unicodedata
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote
from zoneinfo import ZoneInfo

import httpx
import numpy as np
import pytest
import soundfile
from playwright.sync_api import Browser, Page, expect

from agentbox.review.view import Review, signed
from tests import test_page
from tests.conftest import Server, make_event
from tests.support.browser import as_the_user

browser = test_page.browser  # the same fixtures: Debian's Chromium, a page per test
page = test_page.page

RATE = 48_000
# A name that must survive URLs: spaces, a slash, a percent sign, a hash, accents.
PROJECT = "Nacht / Fahrt #2 \N{EN DASH} é 50%"
LOUD = "loud-and-clipped"
EMPTY = "a render that failed"
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 900}
# What the page must run under: its script and style from its own files, nothing
# inline (the test adds it where the server does not send one of its own).
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "media-src 'self'; connect-src 'self'; object-src 'none'; base-uri 'none'")


def song(seconds: float, peak: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(RATE * seconds)) / RATE
    envelope = np.where((t % 8) < 4, 0.5, 1.0)
    left = envelope * (np.sin(2 * np.pi * 110 * t) + 0.4 * np.sin(2 * np.pi * 660 * t))
    right = envelope * (np.sin(2 * np.pi * 110 * t + 0.3) + 0.05 * rng.standard_normal(t.size))
    stereo = np.stack([left, right], 1)
    return np.asarray(peak * stereo / np.abs(stereo).max())


def write(folder: Path, name: str, audio: np.ndarray) -> Path:
    path = folder / name
    soundfile.write(path, np.clip(audio, -1, 1), RATE, subtype="PCM_24")
    settled = time.time() - 60  # the review waits for a file still being written
    os.utime(path, (settled, settled))
    return path


class Studio:
    """One server, the exports it reviewed, and their runs as the API shows them."""

    def __init__(self, server: Server, folder: Path) -> None:
        self.server, self.folder = server, folder
        self.runs: dict[str, dict[str, Any]] = {}

    def export(self, project: str, name: str, audio: np.ndarray) -> dict[str, Any]:
        path = write(self.folder, name, audio)
        response = self.server.post(make_event(payload={"project_id": project,
                                                        "mix_url": str(path)}))
        assert response.status_code == 202, response.text
        run = self.server.wait_terminal(response.json()["run_id"], timeout=120)
        assert run["status"] == "succeeded", run
        self.runs[name] = run
        return run

    def export_empty(self, project: str, name: str) -> dict[str, Any]:
        """A render that wrote nothing: the review cannot be made."""
        path = self.folder / name
        path.write_bytes(b"")
        settled = time.time() - 60
        os.utime(path, (settled, settled))
        response = self.server.post(make_event(payload={"project_id": project,
                                                        "mix_url": str(path)}))
        run = self.server.wait_terminal(response.json()["run_id"], timeout=120)
        assert run["status"] == "failed_permanent", run
        self.runs[name] = run
        return run


@pytest.fixture(scope="module")
def studio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Studio]:
    home = tmp_path_factory.mktemp("studio")
    # session.exported goes to the built-in mix review; mix.review_requested to the
    # test agents (one of them answers a document shaped almost like a review).
    server = Server(home, {"AGENTBOX_AGENTS": "mix.review_requested=tests.support.agents:"
                                              "scripted"}).start()
    try:
        found = Studio(server, home)
        found.export(PROJECT, "take 1.wav", song(12, 0.2, 1))  # quiet
        found.export(PROJECT, "take 2.wav", song(12, 0.9, 2))
        found.export(PROJECT, "take 3.wav", song(12, 0.6, 3))  # the latest
        found.export(LOUD, "slammed.wav", np.clip(song(12, 1.8, 4), -1, 1))
        found.export_empty(EMPTY, "nothing.wav")
        yield found
    finally:
        server.close()


def review_of(run: dict[str, Any]) -> Review:
    found = Review.of(run["result"])
    assert found is not None
    return found


def test_home_shows_each_project_with_its_latest_figures_and_verdict(
        studio: Studio, page: Page) -> None:
    page.goto(studio.server.url + "/")
    expect(page.locator("h1")).to_have_text("Your projects")
    row = page.locator(f'tr[data-project="{PROJECT}"]')
    latest = review_of(studio.runs["take 3.wav"])
    expect(row.locator(".file")).to_have_text("take 3.wav")
    for css, key in (("lufs", "integrated_lufs"), ("true-peak", "true_peak_dbtp"),
                     ("lra", "loudness_range_lu")):
        value = latest.figure(key)
        assert value is not None
        shown = f"{value:+.1f}" if key == "true_peak_dbtp" else f"{value:.1f}"  # +0.3 over
        expect(row.locator(f".{css}")).to_have_text(shown.replace("-", "\N{MINUS SIGN}"))
    expect(page.locator(f'tr[data-project="{LOUD}"] .true-peak')).to_have_text(
        re.compile(r"^\+\d"))  # over the ceiling, and says so with its sign
    verdict = studio.runs["take 3.wav"]["result"].get("verdict", latest.verdict)
    expect(row.locator(".verdict")).to_have_text(verdict)
    # a slammed, clipped mix over the ceiling fails whatever else it does
    expect(page.locator(f'tr[data-project="{LOUD}"] .verdict')).to_have_text("fail")
    expect(page.locator(f'tr[data-project="{LOUD}"] .verdict')).to_have_class(
        re.compile(r"\bfail\b"))
    # one row per project: the older takes are on the project's page
    expect(page.locator(f'tr[data-project="{PROJECT}"]')).to_have_count(1)
    # the operator's view is one click away, and complete
    page.click("text=Operations: every run, retries and dead letters")
    expect(page.locator("h1")).to_have_text("Runs")
    expect(page.locator('[data-stat="succeeded"]')).to_have_count(1)
    expect(page.locator('form.filters select[name="status"]')).to_have_count(1)
    for run in studio.runs.values():
        expect(page.locator(f'tr[data-run-id="{run["run_id"]}"]')).to_have_count(1)


def test_times_are_shown_in_the_browsers_own_time_zone(studio: Studio,
                                                       browser: Browser) -> None:
    context = browser.new_context(**as_the_user(timezone_id="Asia/Kolkata", locale="en-GB"))
    try:
        page = context.new_page()
        page.goto(studio.server.url + "/")
        run = studio.runs["take 3.wav"]
        shown = page.locator(f'tr[data-project="{PROJECT}"] time')
        expect(shown).to_have_attribute("datetime", run["accepted_at"])
        expect(shown).to_have_attribute("data-local", "1")
        local = datetime.fromisoformat(run["accepted_at"]).astimezone(ZoneInfo("Asia/Kolkata"))
        text = shown.text_content() or ""
        assert f"{local:%H:%M}" in text and "UTC" not in text, text  # +05:30
        assert "UTC" in (shown.get_attribute("title") or "")
    finally:
        context.close()


def test_a_project_page_shows_trends_and_compares_any_two_exports(
        studio: Studio, page: Page) -> None:
    page.goto(studio.server.url + "/")
    page.click(f'tr[data-project="{PROJECT}"] a >> nth=0')
    expect(page.locator("h1")).to_contain_text(PROJECT)
    assert page.url.endswith("/projects/" + quote(PROJECT, safe=""))
    for chart in ("trend-integrated", "trend-true-peak", "trend-lra"):
        expect(page.locator(f"#{chart} circle.point")).to_have_count(3)
        expect(page.locator(f"#{chart} title").first).not_to_be_empty()
    expect(page.locator("#exports tbody tr")).to_have_count(3)
    takes = [review_of(studio.runs[f"take {n}.wav"]) for n in (1, 2, 3)]

    def change(before: Review, after: Review, key: str) -> str:
        b, a = before.figure(key), after.figure(key)
        assert a is not None and b is not None
        return signed(a - b)

    # by default the latest two, older first
    row = page.locator('#comparison tr[data-figure="integrated_lufs"]')
    expect(row.locator("td").nth(2)).to_contain_text(change(takes[1], takes[2],
                                                            "integrated_lufs"))
    page.select_option('select[name="a"]', studio.runs["take 1.wav"]["run_id"])
    page.select_option('select[name="b"]', studio.runs["take 3.wav"]["run_id"])
    page.click("#compare-form button")
    for key, unit in (("integrated_lufs", "LU"), ("true_peak_dbtp", "dB"),
                      ("loudness_range_lu", "LU")):  # a change of a level is in LU or dB
        cells = page.locator(f'#comparison tr[data-figure="{key}"] td')
        expect(cells.nth(2)).to_have_text(f"{change(takes[0], takes[2], key)} {unit}")
    expect(page.locator("#comparison thead")).to_contain_text("take 1.wav")


def test_a_project_is_found_by_its_name_however_it_is_spelled(studio: Studio) -> None:
    client = studio.server.client
    decomposed = unicodedata.normalize("NFD", PROJECT)
    for name in (PROJECT, decomposed):
        answer = client.get("/projects/" + quote(name, safe=""))
        assert answer.status_code == 200 and "take 3.wav" in answer.text
    unknown = client.get("/projects/" + quote("no such / project", safe=""))
    assert unknown.status_code == 404
    assert "No export of a project named &#39;no such / project&#39;" in unknown.text
    assert unknown.headers["content-type"].startswith("text/html")


def test_the_review_page_draws_loudness_with_labelled_axes(studio: Studio, page: Page) -> None:
    run = studio.runs["slammed.wav"]
    page.goto(studio.server.url + f"/ui/runs/{run['run_id']}")
    expect(page.locator("h1")).to_contain_text("slammed.wav")
    plot = page.locator("#loudness-plot")
    expect(plot.locator("title").first).to_have_text("Loudness over time")
    ticks = plot.locator(".x-tick").all_text_contents()
    assert ticks[0] == "0:00" and len(ticks) >= 3, ticks
    assert all(re.fullmatch(r"\d+:\d\d", tick) for tick in ticks), ticks
    levels = [int(t) for t in plot.locator(".y-tick").all_text_contents()]
    assert len(levels) >= 3 and levels == sorted(levels), levels
    target = review_of(run).model.profile.target_lufs
    assert min(levels) <= target <= max(levels)
    expect(plot.locator(".axis-title")).to_have_text(["time (mm:ss)", "loudness (LUFS)"])
    expect(plot.locator(".target-band")).to_have_count(1)
    expect(plot.locator("polyline.short-term").first).to_be_visible()
    clipping = review_of(run).clipping
    expect(plot.locator(".clip-marker")).to_have_count(len(clipping))
    expect(page.locator("#notes li").first).not_to_be_empty()
    expect(page.locator(".verdict.big")).to_have_text("fail")


def test_the_review_page_compares_with_the_previous_export(studio: Studio,
                                                           page: Page) -> None:
    run = studio.runs["take 3.wav"]
    page.goto(studio.server.url + f"/ui/runs/{run['run_id']}")
    previous = studio.runs["take 2.wav"]
    expect(page.locator(f'#previous a[href="/ui/runs/{previous["run_id"]}"]')).to_have_count(1)
    this, before = review_of(run), review_of(previous)
    given = (run["result"].get("comparison") or {}).get("deltas") or {}
    a, b = this.figure("integrated_lufs"), before.figure("integrated_lufs")
    assert a is not None and b is not None
    expected = signed(given.get("integrated_lufs", a - b))
    expect(page.locator('#previous tr[data-figure="integrated_lufs"] td').nth(2)
           ).to_contain_text(expected)
    first = studio.runs["take 1.wav"]
    page.goto(studio.server.url + f"/ui/runs/{first['run_id']}")
    expect(page.locator("#previous")).to_contain_text("first export")


def test_the_mix_plays_in_the_page(studio: Studio, page: Page) -> None:
    run = studio.runs["take 3.wav"]
    page.goto(studio.server.url + f"/ui/runs/{run['run_id']}")
    audio = page.locator("audio#mix-audio")
    expect(audio).to_have_attribute("src", f"/runs/{run['run_id']}/audio")
    page.wait_for_function("document.getElementById('mix-audio').readyState >= 1",
                           timeout=15_000)
    duration = page.evaluate("document.getElementById('mix-audio').duration")
    assert abs(duration - 12) < 0.1, duration
    # seeking: the browser asks for byte ranges
    answer = studio.server.client.get(f"/runs/{run['run_id']}/audio",
                                      headers={"Range": "bytes=100-199"})
    assert answer.status_code == 206
    assert answer.headers["content-type"] == "audio/wav"
    assert answer.content == (studio.folder / "take 3.wav").read_bytes()[100:200]


def test_the_audio_route_serves_only_the_file_a_review_listened_to(
        studio: Studio) -> None:
    client = studio.server.client
    run = studio.runs["take 2.wav"]
    whole = (studio.folder / "take 2.wav").read_bytes()
    # whatever the request names, the answer is the run's own file
    for tail in ("", "?path=/etc/passwd", "?mix_url=/etc/passwd"):
        answer = client.get(f"/runs/{run['run_id']}/audio{tail}")
        assert answer.status_code == 200 and answer.content == whole
    # not a run, not a review, a review that failed: nothing to play
    lookalike = studio.server.post(make_event(event_type="mix.review_requested", payload={
        "project_id": "review-lookalike", "mix_url": str(studio.folder / "take 2.wav"),
        "requested_by": "a test"})).json()["run_id"]
    assert studio.server.wait_terminal(lookalike)["status"] == "succeeded"
    broken = studio.folder / "not-audio.wav"  # there, so taken; not audio, so failed
    broken.write_text("not audio")
    failed = studio.server.post(make_event(payload={
        "project_id": "gone", "mix_url": str(broken)}))
    failed_id = failed.json()["run_id"]
    assert studio.server.wait_terminal(failed_id, timeout=60)["status"] == "failed_permanent"
    for run_id in ("run_nope", lookalike, failed_id, "..%2F..%2Fetc%2Fpasswd",
                   quote("/etc/passwd", safe="")):
        refused = client.get(f"/runs/{run_id}/audio")
        assert refused.status_code == 404, run_id
        if refused.headers["content-type"] == "application/json":
            assert refused.json()["error_code"] in ("audio_not_found", "not_found")
    # a reviewed file that has since been deleted plays from the archive
    doomed = studio.export("doomed", "doomed.wav", song(2, 0.5, 9))
    heard = (studio.folder / "doomed.wav").read_bytes()
    (studio.folder / "doomed.wav").unlink()
    kept = client.get(f"/runs/{doomed['run_id']}/audio")
    assert kept.status_code == 200 and kept.content == heard


def test_a_new_export_appears_on_the_home_page_without_a_reload(
        studio: Studio, page: Page) -> None:
    page.goto(studio.server.url + "/")
    expect(page.locator("#live")).to_have_text("live", timeout=10_000)
    page.evaluate("window.__notReloaded = true")
    run = studio.export("fresh <b>idea</b>", "fresh idea.wav", song(3, 0.5, 5))
    row = page.locator('tr[data-project="fresh <b>idea</b>"]')
    expect(row.locator(".file")).to_have_text("fresh idea.wav", timeout=15_000)
    expect(row.locator("td").first).to_have_text("fresh <b>idea</b>")  # text, not markup
    assert page.evaluate("window.__notReloaded") is True
    expect(row.locator("time")).to_have_attribute("data-local", "1")
    assert run["run_id"] in (row.get_attribute("data-run-id") or "")


def test_a_review_page_opened_while_reviewing_shows_the_verdict_when_it_comes(
        studio: Studio, page: Page) -> None:
    path = write(studio.folder, "while you wait.wav", song(30, 0.5, 6))
    os.utime(path)  # just written: the review gives it two seconds to settle first
    answer = studio.server.post(make_event(payload={"project_id": "while you wait",
                                                    "mix_url": str(path)}))
    run_id = answer.json()["run_id"]
    page.goto(studio.server.url + f"/ui/runs/{run_id}")
    expect(page).to_have_title("while you wait.wav · agentbox")
    expect(page.locator("#live")).to_have_text("live", timeout=10_000)
    page.evaluate("window.__notReloaded = true")
    if studio.server.run(run_id)["status"] != "succeeded":  # else it finished already
        expect(page.locator("#outcome")).to_have_text(re.compile("reviewing"))
    expect(page.locator(".headline .verdict")).to_be_visible(timeout=60_000)
    assert page.evaluate("window.__notReloaded") is True
    expect(page.locator("h1")).to_have_text("while you wait.wav")


def test_the_new_pages_refuse_another_host_name(
        studio: Studio) -> None:
    run_id = studio.runs["take 3.wav"]["run_id"]
    port = studio.server.url.rsplit(":", 1)[1]
    for path in ("/", "/projects/" + quote(PROJECT, safe=""), f"/runs/{run_id}/audio"):
        refused = httpx.get(studio.server.url + path, timeout=10,
                            headers={"Host": f"attacker.example:{port}"})
        assert refused.status_code == 400, path


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
def test_projects_and_their_exports_on_either_engine(
        engine: str, server_factory: Callable[..., Server], request: pytest.FixtureRequest
        ) -> None:
    env = {}
    if engine == "postgres":
        env["AGENTBOX_DATABASE_URL"] = request.getfixturevalue("postgres_url")
    server = server_factory(env).start()
    runs = [server.post(make_event(project_id=name)).json()["run_id"]
            for name in ("ok", "permanent", "ok", "ok")]
    for run_id in runs:
        server.wait_terminal(run_id)
    home = server.client.get("/").text
    assert home.count('data-project="ok"') == 1 and 'data-project="permanent"' in home
    assert home.index('data-project="ok"') < home.index('data-project="permanent"')  # newest
    assert f'data-run-id="{runs[3]}" data-project="ok"' in home  # its latest export
    page = server.client.get("/projects/ok").text
    listed = re.findall(r'<tr data-run-id="(run_\w+)"', page[page.index('id="exports"'):])
    assert listed == [runs[3], runs[2], runs[0]]


def test_an_export_that_could_not_be_reviewed_says_why_in_a_musicians_words(
        studio: Studio, page: Page) -> None:
    run = studio.runs["nothing.wav"]
    said = "couldn't review: the file is empty \N{EM DASH} export it again"
    page.goto(studio.server.url + "/")
    # a project whose only export could not be reviewed: listed apart, with a dismiss
    row = page.locator(f'#unreviewable [data-project="{EMPTY}"]')
    expect(page.locator(f'#projects [data-project="{EMPTY}"]')).to_have_count(0)
    expect(row.locator(".outcome")).to_have_text(said)
    expect(row.locator(".file")).to_have_text("nothing.wav")
    row.locator(".outcome").click()
    expect(page).to_have_title("nothing.wav · agentbox")  # its file, never its run id
    expect(page.locator("h1")).to_have_text("nothing.wav")
    expect(page.locator("#outcome")).to_have_text(said)
    expect(page.locator("#replay")).to_have_text("Review again")
    # the engine's account is there, folded: nothing of it shows until opened
    main = page.locator("#run-main").inner_text()
    for word in ("failed_permanent", "succeeded", "mix_unreadable", run["run_id"], "attempt"):
        assert word not in main, word
    expect(page.locator("#run-facts")).not_to_be_visible()
    page.locator("#details summary").click()
    expect(page.locator("#run-facts")).to_contain_text("failed_permanent")
    expect(page.locator("#run-facts")).to_contain_text(run["run_id"])
    expect(page.locator("#timeline")).to_be_visible()
    expect(page.locator("#event")).to_contain_text("nothing.wav")


def test_a_review_page_is_headed_by_its_verdict_not_its_machinery(studio: Studio,
                                                                  page: Page) -> None:
    run = studio.runs["take 3.wav"]
    page.goto(studio.server.url + f"/ui/runs/{run['run_id']}")
    expect(page).to_have_title("take 3.wav · agentbox")
    expect(page.locator("h1")).to_have_text("take 3.wav")
    expect(page.locator(".headline .card").first).to_contain_text("verdict")
    main = page.locator("#run-main").inner_text()
    for word in ("succeeded", "mix_review", "attempt", run["run_id"]):
        assert word not in main, word
    expect(page.locator("#details")).not_to_have_attribute("open", "")
    # the menu: the projects, and the operations one click away
    expect(page.locator("header a")).to_have_text(["agentbox", "Projects", "Operations",
                                                   "Manual"])


@pytest.mark.parametrize("viewport", [PHONE, DESKTOP], ids=["phone", "desktop"])
def test_the_page_fits_a_phone_and_a_desktop(studio: Studio, browser: Browser,
                                             viewport: dict[str, int],
                                             tmp_path: Path) -> None:
    """At 390 px the verdict and the loudness are on screen without scrolling
    sideways; no page scrolls sideways at either width; the page runs under a
    strict Content-Security-Policy with no error in the console."""
    context = browser.new_context(**as_the_user(viewport=viewport))
    problems: list[str] = []
    context.route(lambda url: "/ui/stream" not in url, _with_csp)
    try:
        page = context.new_page()
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda error: problems.append(str(error)))
        review = studio.runs["take 3.wav"]["run_id"]
        failed = studio.runs["nothing.wav"]["run_id"]
        row = f'tr[data-project="{PROJECT}"]'
        drawn = "-phone" if viewport is PHONE else ""  # a review's charts, for this width
        for path, name, seen in (
                ("/", "home", [f"{row} .verdict", f"{row} .lufs"]),
                ("/projects/" + quote(PROJECT, safe=""), "project",
                 ["#exports tbody tr:first-child .verdict",
                  "#exports tbody tr:first-child .lufs", "#ab-a", "#ab-b",
                  'select[name="b"]', "#comparison thead th:last-child",
                  '#comparison tr[data-figure="integrated_lufs"] td:last-child',
                  "#trend-lra"]),
                (f"/ui/runs/{review}", "review",
                 [".headline .verdict", '.headline [data-figure="integrated_lufs"]',
                  f"#loudness-plot{drawn}", f"#tonal-balance{drawn}"]),
                (f"/ui/runs/{failed}", "failed", ["h1", "#outcome"]),
                ("/ui/runs", "operations", ["h1", "nav.tabs",
                                            "table.runs tbody tr:first-child .status",
                                            "table.runs tbody tr:first-child a"])):
            page.goto(studio.server.url + path)
            expect(page.locator("#live")).to_have_text("live", timeout=10_000)
            for selector in seen:
                _on_screen(page, selector, viewport["width"])
            wide = page.evaluate("document.documentElement.scrollWidth")
            assert wide <= viewport["width"], f"{path} scrolls sideways: {wide} px"
            inline = page.evaluate("document.querySelectorAll("
                                   "'script:not([src]), style, [style]').length")
            assert inline == 0, f"{path}: inline script or style"
            if name == "failed":  # the engine's account, opened, fits too
                page.locator("#details summary").click()
                expect(page.locator("#run-facts")).to_be_visible()
                wide = page.evaluate("document.documentElement.scrollWidth")
                assert wide <= viewport["width"], f"{path} Details scroll sideways: {wide} px"
            page.screenshot(path=str(tmp_path / f"{name}-{viewport['width']}.png"),
                            full_page=True)
        expect(page.locator("h1")).to_have_text("Runs")
        assert problems == [], problems
    finally:
        context.close()


def _with_csp(route: Any) -> None:
    response = route.fetch()
    headers = {"content-security-policy": CSP, **response.headers}
    route.fulfill(response=response, headers=headers)


def _on_screen(page: Page, selector: str, width: int) -> None:
    found = page.locator(selector).first
    expect(found).to_be_visible()
    box = found.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width, (
        selector, box)


def test_a_project_is_found_as_its_name_is_typed(studio: Studio, page: Page) -> None:
    page.goto(studio.server.url + "/")
    expect(page.locator("#project-count")).to_contain_text(re.compile(r"^\d+ projects"))
    page.evaluate("window.__notReloaded = true")
    page.fill("#find-q", LOUD[2:].upper())  # part of its name, in another case
    expect(page.locator("#projects tbody tr")).to_have_count(1, timeout=10_000)
    expect(page.locator(f'#projects tr[data-project="{LOUD}"]')).to_have_count(1)
    expect(page.locator("#project-count")).to_contain_text("1 of ")
    assert page.evaluate("window.__notReloaded") is True  # found in place
    assert "q=" in page.url  # the address is the search's page (GET /?q=)
    expect(page.locator(f'#projects tr[data-project="{LOUD}"] time')).to_have_attribute(
        "data-local", "1")
    page.fill("#find-q", "")
    expect(page.locator(f'#projects tr[data-project="{PROJECT}"]')).to_have_count(1,
                                                                                   timeout=10_000)
