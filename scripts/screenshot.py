"""Take the screenshots of the status page in scripts/screenshots/ (Debian's Chromium, Playwright).

    .venv/bin/python scripts/screenshot.py

Starts a real agentbox on 127.0.0.1 with a fresh data directory, has the mix
review listen to a few generated mixes (three exports of one project, getting
better, and another project), adds runs that fail and are dead-lettered, and
saves into scripts/screenshots/: the home page (home.png), a project's page
(project.png), a review (review.png) and the operator's runs view
(overview.png).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import numpy as np
import soundfile
from playwright.sync_api import sync_playwright

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests.conftest import Server, make_event  # noqa: E402

OUT = HERE / "screenshots"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
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
    stereo = np.stack([left, right], 1)
    return np.asarray(level * stereo / np.abs(stereo).max())


def write(home: Path, name: str, audio: np.ndarray) -> Path:
    path = home / name
    soundfile.write(path, np.clip(audio, -1, 1), RATE, subtype="PCM_24")
    old = time.time() - 60
    os.utime(path, (old, old))
    return path


def review(server: Server, project: str, path: Path) -> str:
    run_id: str = server.post(make_event(payload={"project_id": project,
                                                  "mix_url": str(path)})).json()["run_id"]
    server.wait_terminal(run_id, timeout=180)
    return run_id


def main() -> None:
    home = Path(tempfile.mkdtemp(prefix="agentbox-shot-"))
    exports = [
        ("night-drive", "night-drive v1.wav", song(64, 0.25, 1)),  # quiet
        ("night-drive", "night-drive v2.wav", song(64, 1.6, 2)),  # slammed and clipped
        ("night-drive", "night-drive v3.wav", song(64, 0.8, 3)),  # about right
        ("Sommerlied (Demo)", "sommerlied demo.wav", song(48, 0.6, 4)),
    ]
    server = Server(home, {"AGENTBOX_AGENTS": "mix.review_requested=tests.support.agents:"
                                              "scripted"}).start()
    try:
        for project in ("fail-1", "always-fail"):  # runs that retry, and a dead letter
            server.post(make_event(event_type="mix.review_requested", payload={
                "project_id": project, "mix_url": "/tmp/mix.wav", "requested_by": "me"}))
        runs = [review(server, project, write(home, name, audio))
                for project, name, audio in exports]
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path="/usr/bin/chromium",
                                                 args=FLAGS)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            shots = [("/", "home.png", "#projects"),
                     ("/projects/" + quote("night-drive", safe=""), "project.png",
                      "#trend-integrated"),
                     (f"/ui/runs/{runs[1]}", "review.png", "#loudness-plot"),
                     ("/ui/runs", "overview.png", "#runs-live")]
            for path, name, ready in shots:
                page.goto(server.url + path)
                page.wait_for_selector(ready)
                page.wait_for_selector("#live.on")
                page.screenshot(path=str(OUT / name), full_page=name == "review.png")
            browser.close()
    finally:
        server.close()
    print("saved", ", ".join(str(OUT / n) for n in ("home.png", "project.png", "review.png",
                                                    "overview.png")))


if __name__ == "__main__":
    main()
