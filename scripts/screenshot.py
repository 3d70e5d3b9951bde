"""Take the README's screenshots of the status page (Debian's Chromium, Playwright).

    .venv/bin/python scripts/screenshot.py

Starts a real agentbox on 127.0.0.1 with a fresh data directory, sends a few
events (one mix review of a generated loud, clipped mix, a run that fails and is
dead-lettered), and saves the overview and a run's page into scripts/screenshots/.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile
from playwright.sync_api import sync_playwright

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests.conftest import Server, make_event  # noqa: E402

OUT = HERE / "screenshots"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def main() -> None:
    home = Path(tempfile.mkdtemp(prefix="agentbox-shot-"))
    rate = 48_000
    t = np.arange(rate * 40) / rate
    envelope = np.where(t < 12, 0.35, 0.95) * (1 + 0.2 * np.sin(2 * np.pi * 0.5 * t))
    music = envelope * (np.sin(2 * np.pi * 110 * t) + 0.3 * np.sin(2 * np.pi * 440 * t))
    mix = home / "night-drive.wav"
    soundfile.write(mix, np.clip(np.stack([music, 0.9 * music], 1), -1, 1), rate,
                    subtype="PCM_24")
    old = time.time() - 60
    os.utime(mix, (old, old))
    server = Server(home, {"AGENTBOX_AGENTS": "mix.review_requested=tests.support.agents:"
                                              "scripted"}).start()
    try:
        for project in ("ok", "fail-1", "always-fail"):
            server.post(make_event(event_type="mix.review_requested", payload={
                "project_id": project, "mix_url": "/tmp/mix.wav", "requested_by": "screenshot"}))
        review = server.post(make_event(payload={"project_id": "night-drive",
                                                 "mix_url": str(mix)})).json()["run_id"]
        server.wait_terminal(review, timeout=120)
        time.sleep(3)  # let the failing run reach its dead letter
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path="/usr/bin/chromium",
                                                 args=FLAGS)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(server.url + "/")
            page.wait_for_selector("#live.on")
            page.screenshot(path=str(OUT / "overview.png"))
            page.goto(server.url + f"/ui/runs/{review}")
            page.wait_for_selector("#loudness-plot")
            page.screenshot(path=str(OUT / "run.png"), full_page=False)
            browser.close()
    finally:
        server.close()
    print(f"saved {OUT / 'overview.png'} and {OUT / 'run.png'}")


if __name__ == "__main__":
    main()
