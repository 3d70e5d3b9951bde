"""Take the manual's screenshots of the page (Debian's Chromium, Playwright), at a
desktop's width (1280 px) and a phone's (390 px).

    .venv/bin/python scripts/screenshot.py [NAME ...]

Starts a real agentbox on 127.0.0.1 with a fresh data directory, has the mix
review listen to a few generated mixes (three exports of one project, getting
better, another project, and an export that came out empty), adds runs that fail
and are dead-lettered, watches two folders (one of them not there), and saves
into scripts/screenshots/: the home page
(home.png), a project's page (project.png), a review (review.png), a review that
could not be made (failed.png) and the operations area's runs view
(overview.png), the review's platform table and the sentence its rows share
(targets.png), the project page's A/B player with a reference track, switched
to B while it plays (listen.png); and at a phone's width home-phone.png,
project-phone.png, review-phone.png, targets-phone.png, failed-phone.png and
overview-phone.png. At both widths, the top of the home page with its box for
reviewing a file (home-drop.png, home-drop-phone.png), and the A/B player of an
export beside a shorter reference track, heard past the reference's end
(listen-lengths.png, listen-lengths-phone.png), a project's tidy-up actions
opened (tidy.png, tidy-phone.png) and the top of a review with its re-judge
button (rejudge.png, rejudge-phone.png). Given NAMEs (home-drop
listen-lengths ...), only those.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import soundfile

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests.conftest import Server, make_event  # noqa: E402
from tests.support.browser import as_the_user, chromium  # noqa: E402

OUT = HERE / "screenshots"
FLAGS = ("--disable-quic", "--autoplay-policy=no-user-gesture-required")
RATE = 48_000


def song(seconds: float, level: float, seed: int) -> np.ndarray:
    """Something with a verse, a louder chorus, a bass, a beat and some air."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(RATE * seconds)) / RATE
    chorus = ((t % 32) >= 16).astype(float)
    envelope = (0.45 + 0.55 * chorus) * (1 + 0.15 * np.sin(2 * np.pi * 0.25 * t))
    beat = np.exp(-((t % 0.5) * 18)) * np.sin(2 * np.pi * 55 * t)
    chords = sum(np.sin(2 * np.pi * f * t) for f in (220, 277.2, 329.6)) / 3
    air = np.convolve(rng.standard_normal(t.size), np.ones(4) / 4, "same") * 0.05
    left = envelope * (0.6 * beat + 0.5 * chords) + air
    right = envelope * (0.6 * beat + 0.45 * np.roll(chords, 40)) + air
    # a fade in and the last chord ringing out, as a finished render has (a render
    # that stops in the music is a cut tail, which the review fails)
    fade = np.clip(np.minimum(t / 0.5, (seconds - t) / 3.0), 0, 1)
    stereo = np.stack([left, right], 1) * fade[:, None]
    return np.asarray(level * stereo / np.abs(stereo).max())


def write(home: Path, name: str, audio: np.ndarray) -> Path:
    path = home / name
    soundfile.write(path, np.clip(audio, -1, 1), RATE, subtype="PCM_24")
    old = time.time() - 60
    os.utime(path, (old, old))
    return path


def write_empty(home: Path, name: str) -> Path:
    """A render that wrote nothing (the DAW's export failed)."""
    path = home / name
    path.write_bytes(b"")
    old = time.time() - 60
    os.utime(path, (old, old))
    return path


def review(server: Server, project: str, path: Path) -> str:
    run_id: str = server.post(make_event(payload={"project_id": project,
                                                  "mix_url": str(path)})).json()["run_id"]
    server.wait_terminal(run_id, timeout=180)
    return run_id


def lengths_shot(server: Server, browser: Any, width: int, target: Path) -> None:
    """The A/B player, an export beside a shorter reference, B heard past its end."""
    page = browser.new_page(**as_the_user(viewport={"width": width, "height": 900}))
    page.goto(server.url + "/projects/" + quote("Sommerlied (Demo)", safe=""))
    page.wait_for_selector('#ab[data-state="ready"]', timeout=60_000)
    page.select_option("#ab-b", "reference")
    page.wait_for_selector('#ab[data-state="ready"]', timeout=60_000)
    page.locator("#ab-seek").evaluate(
        "(seek) => { seek.value = 34; seek.dispatchEvent(new Event('change')); }")
    page.click("#ab-switch")  # hearing B, the reference, which ended at 0:30.0
    page.wait_for_selector("#ab[data-heard-ended]")
    page.locator("#ab").screenshot(path=str(target))
    page.close()


def drop_shot(server: Server, browser: Any, width: int, target: Path) -> None:
    """The top of the home page: the box a render is dropped on."""
    page = browser.new_page(**as_the_user(viewport={"width": width, "height": 900}))
    page.goto(server.url + "/")
    page.wait_for_selector("#live.on")
    page.screenshot(path=str(target), clip={"x": 0, "y": 0, "width": width,
                                            "height": 560 if width > 600 else 760})
    page.close()


def tidy_shot(server: Server, browser: Any, width: int, target: Path) -> None:
    """A project's tidy-up actions (rename, merge, remove), opened."""
    page = browser.new_page(**as_the_user(viewport={"width": width, "height": 900}))
    page.goto(server.url + "/projects/" + quote("night-drive", safe=""))
    page.wait_for_selector("#live.on")
    page.click("#tidy summary")
    page.locator("#tidy").screenshot(path=str(target))
    page.close()


def rejudge_shot(server: Server, browser: Any, width: int, path: str, target: Path) -> None:
    """The top of a review: its verdict and the one click that judges it at the other
    stage."""
    page = browser.new_page(**as_the_user(viewport={"width": width, "height": 900}))
    page.goto(server.url + path)
    page.wait_for_selector("#rejudge")
    page.wait_for_selector("#live.on")
    box = page.locator("#rejudge").bounding_box()
    page.screenshot(path=str(target), clip={"x": 0, "y": 0, "width": width,
                                            "height": box["y"] + box["height"] + 24})
    page.close()


def platforms(page: Any, target: Path) -> Path:
    """The review's platform table and the sentence below it that its rows share."""
    boxes = [page.locator(part).bounding_box() for part in ("#targets", "#targets-note")]
    top = min(box["y"] for box in boxes) - 40  # the table's heading
    bottom = max(box["y"] + box["height"] for box in boxes) + 8
    page.screenshot(path=str(target), full_page=True, clip={
        "x": 0, "y": top, "width": page.viewport_size["width"], "height": bottom - top})
    return target


def main(only: set[str]) -> None:
    home = Path(tempfile.mkdtemp(prefix="agentbox-shot-"))
    saved: list[Path] = []
    exports = [
        ("night-drive", "night-drive v1.wav", song(64, 0.25, 1)),  # quiet
        ("night-drive", "night-drive v2.wav", song(64, 1.6, 2)),  # slammed and clipped
        ("night-drive", "night-drive v3.wav", song(64, 0.8, 3)),  # about right
        ("Sommerlied (Demo)", "sommerlied demo.wav", song(48, 0.6, 4)),
    ]
    (home / "Exports").mkdir()  # watched; the drive of the second is not plugged in
    folders = os.pathsep.join([str(home / "Exports"), f"{home / 'Drive' / 'Masters'}=master"])
    server = Server(home, {"AGENTBOX_AGENTS": "mix.review_requested=tests.support.agents:"
                                              "scripted", "AGENTBOX_WATCH": folders}).start()
    try:
        for project in ("fail-1", "always-fail"):  # runs that retry, and a dead letter
            server.post(make_event(event_type="mix.review_requested", payload={
                "project_id": project, "mix_url": "/tmp/mix.wav", "requested_by": "me"}))
        runs = [review(server, project, write(home, name, audio))
                for project, name, audio in exports]
        empty = review(server, "b-side", write_empty(home, "b-side.wav"))
        reference = write(home, "Their Record (master).wav", song(64, 1.0, 9))
        token = (home / "config" / "agentbox" / "admin_token").read_text().strip()
        server.client.put("/projects/night-drive/reference", content=reference.read_bytes(),
                          params={"name": reference.name},
                          headers={"Authorization": f"Bearer {token}"}).raise_for_status()
        edit = write(home, "Their Record (radio edit).wav", song(30, 0.9, 10))
        server.client.put("/projects/" + quote("Sommerlied (Demo)", safe="") + "/reference",
                          content=edit.read_bytes(), params={"name": edit.name},
                          headers={"Authorization": f"Bearer {token}"}).raise_for_status()
        project = "/projects/" + quote("night-drive", safe="")
        with chromium(*FLAGS) as browser:
            for width, suffix, shots in (
                    (1280, "", [("/", "home", "#projects", False),
                                (project, "project", "#trend-integrated", False),
                                (f"/ui/runs/{runs[1]}", "review", "#loudness-plot", True),
                                (f"/ui/runs/{empty}", "failed", "#outcome", False),
                                ("/ui/runs", "overview", "#runs-live", False)]),
                    (390, "-phone", [("/", "home", "#projects", True),
                                     (project, "project", "#exports", True),
                                     (f"/ui/runs/{runs[1]}", "review",
                                      "#loudness-plot-phone", True),
                                     (f"/ui/runs/{empty}", "failed", "#outcome", False),
                                     ("/ui/runs", "overview", "#runs-live", True)])):
                page = browser.new_page(**as_the_user(viewport={"width": width, "height": 900}))
                for path, name, ready, whole in shots:
                    if only and name not in only:
                        continue
                    page.goto(server.url + path)
                    page.wait_for_selector(ready)
                    page.wait_for_selector("#live.on")
                    target = OUT / f"{name}{suffix}.png"
                    page.screenshot(path=str(target), full_page=whole)
                    saved.append(target)
                    if name == "review":
                        saved.append(platforms(page, OUT / f"targets{suffix}.png"))
                page.close()
                for name, take in (("home-drop", drop_shot), ("listen-lengths", lengths_shot),
                                   ("tidy", tidy_shot)):
                    if not only or name in only:
                        take(server, browser, width, OUT / f"{name}{suffix}.png")
                        saved.append(OUT / f"{name}{suffix}.png")
                if not only or "rejudge" in only:
                    rejudge_shot(server, browser, width, f"/ui/runs/{runs[1]}",
                                 OUT / f"rejudge{suffix}.png")
                    saved.append(OUT / f"rejudge{suffix}.png")
            if not only or "listen" in only:
                page = browser.new_page(**as_the_user(viewport={"width": 1280, "height": 900}))
                page.goto(server.url + project)
                page.wait_for_selector('#ab[data-state="ready"]', timeout=60_000)
                page.click("#ab-play")
                page.wait_for_timeout(1500)
                page.click("#ab-switch")  # hearing B, turned down to A's loudness
                page.wait_for_timeout(1200)
                target = OUT / "listen.png"
                page.screenshot(path=str(target), clip={"x": 0, "y": 0, "width": 1280,
                                                        "height": 640})
                saved.append(target)
                page.close()
    finally:
        server.close()
    print("saved", ", ".join(str(path) for path in saved))


if __name__ == "__main__":
    main(set(sys.argv[1:]))
