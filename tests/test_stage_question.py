"""When the evidence of a file's stage is split, its review asks instead of
accusing: the page puts the question first (the first fix under each reading, and
"Judge it as a master" / "Judge it as a mix"), the project's row and the home
page's too, and `agentbox show` says it with the command that settles it; a clear
master does not ask. Through a real server, real Chromium and the real CLI."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from playwright.sync_api import Browser, Page, expect

from tests import test_page
from tests.conftest import Server, make_event
from tests.support.browser import as_the_user
from tests.support.corpus import Song, limited, mp3, song_audio, write

pytestmark = pytest.mark.slow  # a server, its analysis process, Chromium, the CLI

browser = test_page.browser  # Debian's Chromium, a page per test
page = test_page.page

# SPLIT's review is judged again by the tests; LISTED's is left as sent, for the rows.
SPLIT, LISTED, CLEAR = "Split Decision", "Split Listed", "Clear Master"
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 900}


class Exports:
    def __init__(self, server: Server, folder: Path) -> None:
        self.server, self.folder = server, folder
        self.runs: dict[str, dict[str, Any]] = {}

    def send(self, project: str, path: Path) -> dict[str, Any]:
        response = self.server.post(make_event(payload={"project_id": project,
                                                        "mix_url": str(path)}))
        assert response.status_code == 202, response.text
        run = self.server.wait_terminal(response.json()["run_id"], timeout=120)
        assert run["status"] == "succeeded", run
        self.runs[project] = run
        return run


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Exports]:
    home = tmp_path_factory.mktemp("question")
    server = Server(home, {"AGENTBOX_AGENTS": ""}).start()
    try:
        found = Exports(server, home)
        # Lossy as a release is, named and peaking as a mix is: split evidence.
        split = mp3(home / "mix.mp3", song_audio(Song(lufs=-20.0)))
        found.send(SPLIT, split)
        found.send(LISTED, split)
        # Limited close to full scale at -9.5 LUFS: a master, clearly.
        found.send(CLEAR, write(home / "frantic.wav",
                                limited(song_audio(Song(lufs=-14.0)), -9.5, -0.5)))
        yield found
    finally:
        server.close()


def test_the_result_carries_the_question_only_when_the_evidence_is_split(
        exports: Exports) -> None:
    split = exports.runs[SPLIT]["result"]
    assert (split["stage_source"], split["stage_split"]) == ("auto", True), split
    readings = split["stage_readings"]
    assert readings["mix"] and readings["master"], readings
    assert readings["mix"] in split["stage_reason"] and readings["master"] in split[
        "stage_reason"]
    clear = exports.runs[CLEAR]["result"]
    assert (clear["stage"], clear["stage_source"], clear["stage_split"]) == (
        "master", "auto", False), clear["stage_reason"]
    assert clear["stage_readings"] is None


def test_split_evidence_asks_first_and_one_click_judges_it(exports: Exports,
                                                           page: Page) -> None:
    run = exports.runs[SPLIT]
    readings = run["result"]["stage_readings"]
    page.goto(f"{exports.server.url}/ui/runs/{run['run_id']}")
    ask = page.locator("#review .ask")
    expect(ask).to_be_visible()
    expect(ask).to_contain_text("Is it a master or a mix?")
    for stage in ("master", "mix"):
        expect(ask.locator(f'li[data-reading="{stage}"]')).to_contain_text(readings[stage])
    stage_line = page.locator("#stage")  # the evidence, said once: the fixes are above
    expect(stage_line).to_contain_text("the evidence is split")
    expect(stage_line).not_to_contain_text("The first fix as a mix")
    buttons = ask.locator("button")
    expect(buttons).to_have_text(["Judge it as a master", "Judge it as a mix"])
    expect(page.locator("#rejudge")).to_have_count(0)  # the question replaces it
    asked, notes = ask.bounding_box(), page.locator("#notes").bounding_box()
    assert asked is not None and notes is not None and asked["y"] < notes["y"]

    other = "master" if run["result"]["stage"] == "mix" else "mix"
    ask.locator(f'button[data-stage="{other}"]').click()
    page.wait_for_url(lambda url: run["run_id"] not in url, timeout=30_000)
    rejudged_id = page.url.rsplit("/", 1)[1]
    rejudged = exports.server.wait_terminal(rejudged_id, timeout=120)["result"]
    assert (rejudged["stage"], rejudged["stage_source"], rejudged["rejudge_of"]) == (
        other, "rejudge", run["run_id"])
    assert rejudged["stage_split"] is False
    expect(page.locator("#rejudged")).to_be_visible(timeout=30_000)
    expect(page.locator("#review .ask")).to_have_count(0)  # settled: no question


def test_the_project_row_and_the_home_card_ask_too(exports: Exports, page: Page) -> None:
    run_id = exports.runs[LISTED]["run_id"]
    both = ["Judge it as a master", "Judge it as a mix"]
    page.goto(f"{exports.server.url}/projects/{quote(LISTED, safe='')}")
    expect(page.locator(f'#exports tr[data-run-id="{run_id}"] .ask button')).to_have_text(both)
    page.goto(exports.server.url + "/")
    expect(page.locator(f'tr[data-project="{LISTED}"] .ask button')).to_have_text(both)
    expect(page.locator(f'tr[data-project="{CLEAR}"] .verdict')).to_be_visible()
    expect(page.locator(f'tr[data-project="{CLEAR}"] .ask')).to_have_count(0)
    clear = exports.runs[CLEAR]["run_id"]
    page.goto(f"{exports.server.url}/projects/{quote(CLEAR, safe='')}")
    expect(page.locator(f'#exports tr[data-run-id="{clear}"] .verdict')).to_be_visible()
    expect(page.locator("#exports .ask")).to_have_count(0)


def test_a_clear_master_does_not_ask(exports: Exports, page: Page) -> None:
    run_id = exports.runs[CLEAR]["run_id"]
    page.goto(f"{exports.server.url}/ui/runs/{run_id}")
    expect(page.locator("#notes")).to_be_visible()
    expect(page.locator(".ask")).to_have_count(0)
    expect(page.locator("#rejudge button")).to_have_text("Judge it as a mix")
    same = exports.server.client.post(f"/runs/{run_id}/rejudge",
                                      data={"stage": "master", "csrf": exports.server.csrf()},
                                      follow_redirects=False)
    assert same.status_code == 409, same.text  # nothing to settle


def test_either_button_settles_a_split_review(exports: Exports) -> None:
    """The stage it leaned to is a choice too: confirming it is a new review that
    no longer asks."""
    run = exports.runs[SPLIT]
    leaned = run["result"]["stage"]
    clicked = exports.server.client.post(f"/runs/{run['run_id']}/rejudge",
                                         data={"stage": leaned, "csrf": exports.server.csrf()},
                                         follow_redirects=False)
    assert clicked.status_code == 303, clicked.text
    settled = exports.server.wait_terminal(clicked.headers["location"].rsplit("/", 1)[1],
                                           timeout=120)["result"]
    assert (settled["stage"], settled["stage_source"], settled["stage_split"]) == (
        leaned, "rejudge", False)


def test_show_asks_in_words_with_the_command(exports: Exports) -> None:
    server = exports.server
    run = exports.runs[SPLIT]
    shown = subprocess.run([sys.executable, "-m", "agentbox", "show", run["run_id"],
                            "--url", server.url], env=server.env, capture_output=True,
                           text=True, timeout=180, cwd=server.home)
    assert shown.returncode == 0, shown.stderr
    said = " ".join(shown.stdout.split())  # as read, whatever the terminal's width
    asked = said.index("Is it a master or a mix?")
    assert asked < said.index("Notes, what to fix first"), shown.stdout
    assert f"agentbox rejudge {run['run_id']} --stage master (or --stage mix)" in said
    readings = run["result"]["stage_readings"]
    assert f"As a mix, the first fix: {' '.join(readings['mix'].split())}." in said, said
    clear = subprocess.run([sys.executable, "-m", "agentbox", "show",
                            exports.runs[CLEAR]["run_id"], "--url", server.url],
                           env=server.env, capture_output=True, text=True, timeout=180,
                           cwd=server.home)
    assert clear.returncode == 0 and "master or a mix?" not in clear.stdout, clear.stdout


@pytest.mark.parametrize("viewport", [PHONE, DESKTOP], ids=["phone", "desktop"])
def test_the_question_fits_a_phone_and_a_desktop(exports: Exports, browser: Browser,
                                                 viewport: dict[str, int],
                                                 tmp_path: Path) -> None:
    context = browser.new_context(**as_the_user(viewport=viewport))
    try:
        page = context.new_page()
        run_id = exports.runs[LISTED]["run_id"]
        for path, name in ((f"/ui/runs/{run_id}", "review"),
                           ("/projects/" + quote(LISTED, safe=""), "project"), ("/", "home")):
            page.goto(exports.server.url + path)
            button = page.locator(".ask button").first
            expect(button).to_be_visible()
            box = button.bounding_box()
            assert box is not None and box["x"] + box["width"] <= viewport["width"], box
            wide = page.evaluate("document.documentElement.scrollWidth")
            assert wide <= viewport["width"], f"{path} scrolls sideways: {wide} px"
            page.screenshot(path=str(tmp_path / f"{name}-{viewport['width']}.png"),
                            full_page=True)
    finally:
        context.close()
