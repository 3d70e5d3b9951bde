"""Every page for every hand: axe-core (the engine of the browsers' own accessibility
checkers, as the axe-playwright-python package ships it) in real Chromium finds no
critical or serious violation on any page, in the light and the dark colour scheme; a
keyboard's focus shows on every control; the A/B player's line says what the keys do
where focus is."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import quote

import numpy as np
import pytest
from axe_playwright_python.sync_playwright import Axe
from playwright.sync_api import Browser, Page, expect

from agentbox import manual
from tests.conftest import Server
from tests.support.browser import as_the_user, chromium
from tests.test_page_reviews import Studio, song

PROJECT = "Night Drive"
SCHEMES = ("light", "dark")
BLOCKING = ("critical", "serious")


@pytest.fixture(scope="module")
def studio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Studio]:
    home = tmp_path_factory.mktemp("a11y")
    # session.exported to the review (the tests' default sends it to a test agent)
    server = Server(home, {"AGENTBOX_AGENTS": "mix.review_requested=tests.support.agents:"
                                              "scripted"}).start()
    try:
        found = Studio(server, home)
        for take in (1, 2, 3):  # three exports: the project page draws its trends
            found.export(PROJECT, f"take {take}.wav", song(8, 0.3 * take, take))
        found.export("Loud", "slammed.wav", np.clip(song(8, 1.8, 4), -1, 1))
        found.export_empty("Empty", "nothing.wav")
        yield found
    finally:
        server.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium("--autoplay-policy=no-user-gesture-required") as found:
        yield found


def pages(studio: Studio) -> list[str]:
    review = studio.runs["take 3.wav"]["run_id"]
    failed = studio.runs["nothing.wav"]["run_id"]
    return ["/", "/?q=night", f"/projects/{quote(PROJECT)}", f"/ui/runs/{review}",
            f"/ui/runs/{failed}", "/ui/runs", "/ui/callbacks", "/ui/dead-letters", "/docs",
            *(f"/docs/{topic.name}" for topic in manual.topics())]


def blocking(page: Page) -> list[str]:
    """axe-core's critical and serious violations on the page, in words."""
    found = Axe().run(page).response["violations"]
    return [f"{v['id']} ({v['impact']}): {node['html'][:160]}"
            for v in found if v["impact"] in BLOCKING for node in v["nodes"]]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_no_page_has_a_critical_or_serious_violation(studio: Studio, browser: Browser,
                                                     scheme: str) -> None:
    context = browser.new_context(**as_the_user(color_scheme=scheme))
    try:
        page = context.new_page()
        problems = {}
        for path in pages(studio):
            page.goto(studio.server.url + path)
            page.wait_for_load_state("load")
            if found := blocking(page):
                problems[path] = found
        assert problems == {}
    finally:
        context.close()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_login_page_has_no_critical_or_serious_violation(studio: Studio, browser: Browser,
                                                             scheme: str) -> None:
    context = browser.new_context(color_scheme=scheme)  # no token: the login form
    try:
        page = context.new_page()
        page.goto(studio.server.url + "/ui/runs")
        expect(page.locator("input[type=password], input[name=token]").first).to_be_visible()
        assert blocking(page) == []
    finally:
        context.close()


FOCUS_RING = """() => {
  const style = getComputedStyle(document.activeElement);
  return {tag: document.activeElement.tagName, outline: style.outlineStyle,
          width: parseFloat(style.outlineWidth), offset: parseFloat(style.outlineOffset),
          colour: style.outlineColor, background: style.backgroundColor};
}"""


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_keyboards_focus_shows_on_every_control(studio: Studio, browser: Browser,
                                                  scheme: str) -> None:
    """Tab through the home, project and review pages: every control focused draws a
    ring at least 2 px wide, set off from it, in a colour that is not its own
    background (the dark Play button's focus was the browser's thin default on navy)."""
    context = browser.new_context(**as_the_user(color_scheme=scheme))
    try:
        page = context.new_page()
        review = studio.runs["take 3.wav"]["run_id"]
        seen = 0
        for path in ("/", f"/projects/{quote(PROJECT)}", f"/ui/runs/{review}"):
            page.goto(studio.server.url + path)
            for _ in range(40):
                page.keyboard.press("Tab")
                ring = page.evaluate(FOCUS_RING)
                if ring["tag"] == "BODY":
                    break
                seen += 1
                assert ring["outline"] != "none" and ring["width"] >= 2, (path, ring)
                assert ring["offset"] >= 1 and ring["colour"] != ring["background"], (path, ring)
        assert seen >= 10  # the walk reached the pages' controls
    finally:
        context.close()


def test_the_players_line_says_what_space_does_where_focus_is(studio: Studio,
                                                             browser: Browser) -> None:
    context = browser.new_context(**as_the_user())
    try:
        page = context.new_page()
        page.goto(studio.server.url + f"/projects/{quote(PROJECT)}")
        status = page.locator("#ab-status")
        switch = page.locator("#ab-switch")
        expect(switch).to_be_enabled(timeout=60_000)  # the pair is loaded
        expect(status).to_contain_text("Ready: Space plays and pauses")
        switch.focus()
        expect(status).to_contain_text("Ready: Space presses Switch to B,")
        page.keyboard.press("Space")  # presses it, as the line said
        expect(switch).to_contain_text("Switch to A")
        page.evaluate("document.activeElement.blur()")
        expect(status).to_contain_text("Ready: Space plays and pauses")
    finally:
        context.close()


def test_the_manual_is_free_of_skipped_headings() -> None:
    """A heading one level under its section, never two (axe-core's heading-order)."""
    for topic in manual.topics():
        level = 1
        for found, words in manual.heading_texts(manual.text(topic.name)):
            assert found <= level + 1, (topic.name, words)
            level = found


def test_the_manuals_tables_have_no_empty_header_and_wide_blocks_take_focus() -> None:
    for topic in manual.topics():
        html = manual.render(topic.name).html
        assert "<th></th>" not in html and "<pre><code" not in html, topic.name

