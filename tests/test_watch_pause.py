"""Pausing the folders the server watches: `GET /watch`, `POST /watch/pause` and
`/watch/resume`, `agentbox watch pause|resume`, through a real server subprocess and
its real watcher, real WAV files written by the test."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from agentbox.desktop.watch import state_file
from tests.conftest import Server, wait_until
from tests.test_watched import folder_said, render, reviewed, runs_of, watching_server


def cli(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    """`agentbox ARGS` as the musician runs it: the server's config (its admin token)."""
    return subprocess.run([sys.executable, "-m", "agentbox", *args, "--url", server.url],
                          env=server.env, capture_output=True, text=True, timeout=60,
                          cwd=server.home)


def found(state: Path) -> list[str]:
    """The renders the watcher has found and not yet sent (its state file's)."""
    if not state.exists():
        return []
    names: list[str] = json.loads(state.read_text())["found"]
    return names


@pytest.mark.slow
def test_paused_folders_send_nothing_until_resumed_even_across_a_restart(
        server_factory: Callable[..., Server], tmp_path: Path) -> None:
    exports = tmp_path / "Exports"
    exports.mkdir()
    home = tmp_path / "home"
    server = watching_server(server_factory, home, [str(exports)]).start()
    wait_until(lambda: "watching" in folder_said(server, exports), 30, "the folder watched")
    state = server.client.get("/watch").json()
    assert state["paused"] is False
    assert [f["path"] for f in state["folders"]] == [str(exports)]
    assert state["folders"][0]["state"] == "watching"

    # Neither a page of another site nor a program without the token pauses them.
    assert server.anonymous.post("/watch/pause").status_code == 401
    assert server.anonymous.post("/watch/pause", headers={
        "X-CSRF-Token": "forged", "Origin": "http://127.0.0.1:1"}).status_code == 401

    paused = cli(server, "watch", "pause")
    assert paused.returncode == 0, paused.stderr
    assert "paused" in paused.stdout
    assert server.client.get("/watch").json()["paused"] is True

    older, newer = exports / "take one.wav", exports / "take two.wav"
    older.write_bytes(render(3, 1))
    newer.write_bytes(render(3, 2))
    os.utime(older, ns=(10**18, 10**18))  # written first
    os.utime(newer, ns=(10**18 + 10**9, 10**18 + 10**9))
    kept = state_file(home / "data", exports)
    wait_until(lambda: sorted(found(kept)) == ["take one.wav", "take two.wav"], 30,
               "both takes found while paused")

    # The pause outlives the server; what was found is still held after it.
    assert server.stop() in (0, -signal.SIGTERM)
    server.start()
    assert server.client.get("/watch").json()["paused"] is True
    wait_until(lambda: "watching" in folder_said(server, exports), 30, "watched again")
    assert sorted(found(kept)) == ["take one.wav", "take two.wav"]
    assert runs_of(server, "take one") == runs_of(server, "take two") == []

    # The page's own script resumes them with its CSRF token.
    resumed = server.client.post("/watch/resume", headers={"X-CSRF-Token": server.csrf()})
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["paused"] is False
    first, second = reviewed(server, "take one"), reviewed(server, "take two")
    assert first["status"] == second["status"] == "succeeded"
    assert first["accepted_at"] < second["accepted_at"]  # the newest render reviewed last
    assert found(kept) == []
    again = cli(server, "watch", "resume")
    assert again.returncode == 0, again.stderr
    assert [len(runs_of(server, p)) for p in ("take one", "take two")] == [1, 1]


def test_watch_answers_paused_without_folders_and_names_it_in_the_api(
        server: Server) -> None:
    assert server.client.get("/watch").json() == {"paused": False, "folders": []}
    paused = cli(server, "watch", "pause")
    assert paused.returncode == 0, paused.stderr
    assert server.client.get("/watch").json()["paused"] is True
    assert cli(server, "watch", "resume").returncode == 0
    assert server.client.get("/watch").json()["paused"] is False
    paths = server.client.get("/openapi.json").json()["paths"]
    assert {"/watch", "/watch/pause", "/watch/resume"} <= set(paths)
