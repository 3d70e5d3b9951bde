"""Every render is an export, through a real server and watcher: going back to an
earlier bounce under the same name is a new numbered export, said to be the same
audio as the earlier one and compared with the latest; only the same file sent
again unchanged is the same export."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile

from tests.conftest import Server
from tests.support.corpus import RATE, Song, song_audio

pytestmark = pytest.mark.slow  # a server, its analysis process, the watcher in a process


def render(path: Path, audio: np.ndarray, written: float) -> None:
    """A DAW's render of `audio` into `path`, finished `written` (a time) ago."""
    soundfile.write(path, audio, RATE, subtype="PCM_24")
    os.utime(path, (written, written))


def watch_once(server: Server, folder: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "agentbox", "watch", str(folder), "--url",
                           server.url, "--existing", "--once", "--settle", "0.2"],
                          env=server.env, capture_output=True, text=True, timeout=180,
                          cwd=server.home)
    assert done.returncode == 0, done.stderr
    return done


def exports(server: Server) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = server.client.get(
        "/exports", params={"project": "Heroes Rite"}).json()["exports"]
    for export in found:
        server.wait_terminal(export["run_id"], timeout=120)
    return server.client.get("/exports", params={"project": "Heroes Rite"}).json()["exports"]


def test_an_earlier_bounce_rendered_again_is_a_new_export_of_the_same_audio(
        server_factory: Any, tmp_path: Path) -> None:
    server = server_factory({"AGENTBOX_AGENTS": ""}).start()
    folder = tmp_path / "exports"
    folder.mkdir()
    mix = folder / "Heroes Rite.wav"
    first, clipped = song_audio(Song(lufs=-21.0)), np.clip(song_audio(Song(lufs=-9.0)), -.5, .5)
    now = time.time()
    render(mix, first, now - 300)
    watch_once(server, folder)
    render(mix, clipped, now - 200)
    watch_once(server, folder)
    render(mix, first, now - 100)  # back to the first bounce, rendered again
    watch_once(server, folder)
    found = exports(server)
    assert [e["number"] for e in found] == [3, 2, 1]
    assert [e["same_audio_as"] for e in found] == [1, None, None]
    latest = found[0]["result"]
    assert latest["comparison"]["previous_run_id"] == found[1]["run_id"]  # with #2, as usual
    assert latest["metrics"]["integrated_lufs"] == pytest.approx(-21.0, abs=0.5)

    again = watch_once(server, folder)  # the same file, unchanged: the same export
    assert "accepted" not in again.stdout
    assert len(exports(server)) == 3
    page = server.client.get("/projects/Heroes%20Rite").text
    assert "the same audio as #1" in page
