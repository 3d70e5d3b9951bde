"""The A/B player in a real browser: Playwright driving Debian's Chromium against a
real agentbox that reviewed three renders a DAW wrote to one file name. Every
request goes to 127.0.0.1.

What is read from the page is what the player shows: its state, the side heard,
the position (as its clock shows it) and the gain each side gets, read back from
the audio graph (data attributes of #ab and #ab-gain).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import pytest
import soundfile
from playwright.sync_api import Browser, Page, Response, expect

from tests.conftest import Server, make_event
from tests.support.browser import chromium, fresh_page

pytestmark = pytest.mark.slow
RATE = 48_000
# AGENTBOX_TEST_AB_MINUTES=5: the same test on 5-minute mixes (the cost figures).
SECONDS = float(os.environ.get("AGENTBOX_TEST_AB_MINUTES", "0.5")) * 60
PROJECT = "Night Drive / B-side"
LEVELS = (0.2, 0.5, 0.35)  # three renders, each louder or quieter than the last


def render(path: Path, level: float, seed: int, kind: str = "WAV",
           seconds: float = SECONDS) -> bytes:
    """A DAW's render: the same file truncated and written again, in blocks."""
    rng = np.random.default_rng(seed)
    with open(path, "r+b" if path.exists() else "wb") as out:
        out.truncate(0)
        with soundfile.SoundFile(out, "w", RATE, 2, "PCM_24", format=kind) as sound:
            for start in range(0, int(seconds * RATE), RATE * 10):
                n = min(RATE * 10, int(seconds * RATE) - start)
                t = (start + np.arange(n)) / RATE
                beat = np.sin(2 * np.pi * 55 * t) * np.exp(-(t % 0.5) * 10)
                sound.write(level * np.tanh(0.4 * rng.standard_normal((n, 2)) + beat[:, None]))
    settled = time.time() - 60
    os.utime(path, (settled, settled))
    return path.read_bytes()


@pytest.fixture(scope="module")
def studio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    home = tmp_path_factory.mktemp("ab")
    server = Server(home, {"AGENTBOX_AGENTS": ""}).start()  # the built-in mix review
    mix = home / "Night Drive.wav"
    try:
        runs = []
        for seed, level in enumerate(LEVELS):
            heard = render(mix, level, seed)
            answer = server.post(make_event(payload={"project_id": PROJECT,
                                                     "mix_url": str(mix)}))
            run = server.wait_terminal(answer.json()["run_id"], timeout=300)
            assert run["status"] == "succeeded", run
            runs.append((run, hashlib.sha256(heard).hexdigest()))
        mix.write_bytes(b"the DAW has moved on")  # what the path holds now is not played
        yield {"server": server, "runs": runs, "home": home}
    finally:
        server.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium("--autoplay-policy=no-user-gesture-required") as found:
        yield found


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    with fresh_page(browser) as opened:
        yield opened


def project_page(studio: dict[str, Any], page: Page) -> dict[str, str]:
    """Open the project's page and wait for the player to be ready; the SHA-256 of
    each audio answer's body, by path."""
    bodies: dict[str, str] = {}

    def heard(response: Response) -> None:
        if response.status >= 400:
            problems.append(f"{response.status} {response.url}")
        # (Playwright hands a body over as base64 through its driver: for long mixes
        # that, not the page, would be what is timed; their bytes are checked short.)
        if response.url.endswith("/audio") and response.status == 200 and SECONDS <= 60:
            bodies[response.url.split("127.0.0.1", 1)[1].split("/", 1)[1]] = (
                hashlib.sha256(response.body()).hexdigest())

    problems: list[str] = []
    page.on("response", heard)
    page.on("console", lambda m: problems.append(f"{m.text} {m.location.get('url')}")
            if m.type == "error" and not m.location.get("url", "").endswith("/favicon.ico")
            else None)  # (the page has no icon; the browser asks anyway)
    page.on("pageerror", lambda error: problems.append(str(error)))
    began = time.monotonic()
    page.goto(studio["server"].url + "/projects/" + quote(PROJECT, safe=""))
    expect(page.locator("#ab")).to_have_attribute("data-state", "ready",
                                                  timeout=60_000)
    print(f"A/B ready {time.monotonic() - began:.2f} s after the page was asked for "
          f"({SECONDS:g} s mixes)")
    assert problems == []
    return bodies


def until(page: Page, condition: str, timeout: float = 10.0) -> None:
    """Wait for a condition on the page (asked with evaluate: under the page's
    Content-Security-Policy, Playwright's wait_for_function may not run)."""
    deadline = time.monotonic() + timeout
    while not page.evaluate(condition):
        assert time.monotonic() < deadline, f"not within {timeout} s: {condition}"
        page.wait_for_timeout(20)


def read_now(page: Page) -> tuple[float, float]:
    """The player's position and the page's clock, read in one animation frame (after
    the player's own update in that frame)."""
    found: list[float] = page.evaluate("""() => new Promise((done) => requestAnimationFrame(
        () => done([Number(document.getElementById('ab').dataset.position),
                    performance.now() / 1000])))""")
    return found[0], found[1]


def gains(page: Page) -> tuple[float, float]:
    gain = page.locator("#ab-gain")
    return (float(gain.get_attribute("data-gain-a-db") or "nan"),
            float(gain.get_attribute("data-gain-b-db") or "nan"))


def test_two_exports_play_ab_loudness_matched_and_switch_at_the_same_place(
        studio: dict[str, Any], page: Page) -> None:
    (first, _), (second, second_sha), (third, third_sha) = studio["runs"]
    bodies = project_page(studio, page)
    # the latest and the one before, by default; both the archived bytes reviewed
    assert page.locator("#ab-a").input_value() == third["run_id"]
    assert page.locator("#ab-b").input_value() == second["run_id"]
    if SECONDS <= 60:
        assert bodies == {f"runs/{third['run_id']}/audio": third_sha,
                          f"runs/{second['run_id']}/audio": second_sha}
    # every export of the three renders can be chosen: the archive holds them all
    choices = page.locator("#ab-a option").evaluate_all("(os) => os.map((o) => o.value)")
    assert choices == [third["run_id"], second["run_id"], first["run_id"]]

    # loudness-matched: the louder (B) turned down by the measured difference
    loud_a = third["result"]["metrics"]["integrated_lufs"]
    loud_b = second["result"]["metrics"]["integrated_lufs"]
    assert loud_b > loud_a + 1
    gain_a, gain_b = gains(page)
    assert gain_a == 0 and abs(gain_b - (loud_a - loud_b)) < 0.1
    expect(page.locator("#ab-gain")).to_have_text(
        f"B turned down {loud_b - loud_a:.1f} dB to match")

    # it starts playing within a second of the click
    page.evaluate("""() => {
        const panel = document.getElementById('ab');
        const watch = () => {  // each frame, until the position moves
            if (Number(panel.dataset.position) > 0) window.playingAt = performance.now();
            else requestAnimationFrame(watch);
        };
        document.getElementById('ab-play').addEventListener('click', () => {
            window.clickedAt = performance.now(); requestAnimationFrame(watch);
        }, {capture: true});
    }""")
    page.click("#ab-play")
    until(page, "() => window.playingAt !== undefined")
    started = page.evaluate("() => (window.playingAt - window.clickedAt) / 1000")
    print(f"A/B playing {started * 1000:.0f} ms after the click")
    assert started < 1.0, started
    expect(page.locator("#ab")).to_have_attribute("data-state", "playing")

    # switching keeps the place: the position goes on as the clock does, within 50 ms
    until(page, "() => Number(document.getElementById('ab').dataset.position) > 1.0")
    began = page.locator("#ab").get_attribute("data-started-at")
    for side, how in (("b", "click"), ("a", "key")):
        before, then = read_now(page)
        if how == "click":
            page.click("#ab-switch")
        else:
            page.keyboard.press("s")
        after, now = read_now(page)
        expect(page.locator("#ab")).to_have_attribute("data-active", side)
        assert abs((after - before) - (now - then)) < 0.05, (before, after, now - then)
        assert page.locator("#ab").get_attribute("data-started-at") == began  # not restarted
    expect(page.locator("#ab-hearing")).to_have_text("Hearing A")

    # real levels: nothing turned down, and said so
    page.uncheck("#ab-matched")
    assert gains(page) == (0.0, 0.0)
    expect(page.locator("#ab-gain")).to_contain_text("Real levels: B is")
    page.check("#ab-matched")
    assert abs(gains(page)[1] - (loud_a - loud_b)) < 0.1

    # a loop of a chosen section: the position stays inside it
    page.fill("#ab-loop-start", "0:02.0")
    page.fill("#ab-loop-end", "0:03.0")
    page.check("#ab-loop")
    for _ in range(12):  # about 1.5 s, past the loop's end at least once
        position, _ = read_now(page)
        assert 1.99 <= position < 3.01, position
        page.wait_for_timeout(125)

    page.click("#ab-title")  # away from the loop's box, where Space ticks it
    page.keyboard.press(" ")
    expect(page.locator("#ab")).to_have_attribute("data-state", "paused")


def test_an_export_beside_the_projects_reference(studio: dict[str, Any], page: Page) -> None:
    server: Server = studio["server"]
    track = studio["home"] / "Their Record.aif"  # Chromium cannot decode AIFF: the page does
    heard = render(track, 0.8, 11, "AIFF")
    token = server.client.get("/healthz")  # the server runs; the admin token is its file
    assert token.status_code == 200
    admin = (studio["home"] / "config" / "agentbox" / "admin_token").read_text().strip()
    added = server.client.put(f"/projects/{quote(PROJECT, safe='')}/reference",
                              params={"name": track.name}, content=heard,
                              headers={"Authorization": f"Bearer {admin}"})
    assert added.status_code == 201, added.text
    reference = added.json()
    bodies = project_page(studio, page)
    expect(page.locator("#reference-now")).to_contain_text("Their Record.aif")
    page.select_option("#ab-b", "reference")
    expect(page.locator("#ab")).to_have_attribute("data-state", "ready", timeout=60_000)
    path = f"projects/{quote(PROJECT, safe='')}/reference/audio"
    assert reference["sha256"] == hashlib.sha256(heard).hexdigest()
    if SECONDS <= 60:
        # The player is ready once the browser has the bytes; Playwright hands the
        # answer's event to this thread when it next waits: wait for it, within a deadline.
        for _ in range(100):
            if path in bodies:
                break
            page.wait_for_timeout(100)
        assert bodies[path] == reference["sha256"]
    latest = studio["runs"][-1][0]["result"]["metrics"]["integrated_lufs"]
    gain_a, gain_b = gains(page)
    assert gain_a == 0 and abs(gain_b - (latest - reference["integrated_lufs"])) < 0.1
    page.click("#ab-play")
    expect(page.locator("#ab")).to_have_attribute("data-state", "playing")


def mmss(seconds: float) -> str:
    """A time as the player's clock says it (0:18.0)."""
    return f"{int(seconds // 60)}:{seconds % 60:04.1f}"


def test_a_shorter_reference_the_clock_and_the_loop_agree(studio: dict[str, Any],
                                                          page: Page) -> None:
    """The reference is shorter than the mix: the clock counts the file heard, to its
    own end; a loop ends by the shorter one's end, and the page says so."""
    server: Server = studio["server"]
    short = SECONDS * 0.6
    track = studio["home"] / "Short Record.wav"
    heard = render(track, 0.5, 12, seconds=short)
    added = server.client.put(f"/projects/{quote(PROJECT, safe='')}/reference",
                              params={"name": track.name}, content=heard)
    assert added.status_code == 201, added.text
    project_page(studio, page)
    page.select_option("#ab-b", "reference")
    expect(page.locator("#ab")).to_have_attribute("data-state", "ready", timeout=60_000)
    long, brief = mmss(SECONDS), mmss(short)
    expect(page.locator("#ab-lengths")).to_contain_text(
        f"A is {long} long, B {brief}")
    expect(page.locator("#ab-lengths")).to_contain_text(f"a loop ends by {brief}")
    expect(page.locator("#ab-loop-end")).to_have_value(brief)  # not the longer's end
    expect(page.locator("#ab-clock")).to_have_text(f"0:00.0 / {long}")  # hearing A
    page.click("#ab-switch")
    expect(page.locator("#ab-clock")).to_have_text(f"0:00.0 / {brief}")  # hearing B

    # past the reference's end, B's clock stops at its end, and the page says why
    page.locator("#ab-seek").evaluate(
        "(seek, at) => { seek.value = at; seek.dispatchEvent(new Event('change')); }",
        short + 2)
    expect(page.locator("#ab-clock")).to_have_text(f"{brief} / {brief}")
    expect(page.locator("#ab-status")).to_contain_text(f"B ended at {brief}")
    page.click("#ab-switch")
    expect(page.locator("#ab-clock")).to_have_text(f"{mmss(short + 2)} / {long}")

    # a loop's end typed past the shorter file is its end: both play in a loop
    page.fill("#ab-loop-start", mmss(short - 2))
    page.fill("#ab-loop-end", mmss(short + 5))
    page.check("#ab-loop")
    expect(page.locator("#ab-loop-end")).to_have_value(brief)
    expect(page.locator("#ab-status")).to_contain_text(f"The loop ends at {brief}")
    page.click("#ab-play")
    expect(page.locator("#ab")).to_have_attribute("data-state", "playing")
    for _ in range(12):  # about 1.5 s: inside the loop, within both files
        position, _ = read_now(page)
        assert short - 2.01 <= position < short + 0.01, position
        page.wait_for_timeout(125)
