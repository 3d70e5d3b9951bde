"""Every render is an export, through a real server and watcher: going back to an
earlier bounce under the same name is a new numbered export, said to be the same
audio as the earlier one and compared with the latest; only the same file sent
again unchanged is the same export."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile

from agentbox.desktop.watch import state_file
from tests.conftest import Server, make_event, wait_until
from tests.support.corpus import RATE, Song, song_audio
from tests.test_watched import reviewed, runs_of, watching_server

pytestmark = pytest.mark.slow  # a server, its analysis process, the watcher in a process
AGENTS = "tests.support.agents"


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


# -- one rule for every door (agentbox.review.renders) --------------------------------------


def agentbox(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentbox", *args, "--url", server.url],
                          env=server.env, capture_output=True, text=True, timeout=180,
                          cwd=server.home)


def test_a_touch_is_no_export_and_the_latest_bytes_sent_again_are_that_export(
        server_factory: Any, tmp_path: Path) -> None:
    server = server_factory({"AGENTBOX_AGENTS": ""}).start()
    folder = tmp_path / "exports"
    folder.mkdir()
    mix = folder / "Heroes Rite.wav"
    now = time.time()
    render(mix, song_audio(Song(lufs=-20.0)), now - 300)
    watch_once(server, folder)
    [first] = exports(server)  # one write, one export

    os.utime(mix, (now - 100, now - 100))  # touched: the same bytes at a new time
    touched = watch_once(server, folder)
    assert f"sent before, its review is {first['run_id']}" in touched.stdout, touched.stdout
    sent = agentbox(server, "send", str(mix), "--json")  # the CLI: the same rule
    assert sent.returncode == 0, sent.stderr
    answer = json.loads(sent.stdout)
    assert (answer["duplicate"], answer["run_id"]) == (True, first["run_id"])
    asked = agentbox(server, "send", str(mix), "--project", "Heroes Rite", "--json")
    assert json.loads(asked.stdout)["run_id"] == first["run_id"]
    assert [e["run_id"] for e in exports(server)] == [first["run_id"]]


def test_renders_written_while_the_server_was_stopped_are_each_reviewed_once(
        server_factory: Any, tmp_path: Path) -> None:
    folder, home = tmp_path / "Exports", tmp_path / "home"
    folder.mkdir()
    before = folder / "before.wav"  # there before the folder was first watched: alone
    render(before, song_audio(Song(lufs=-20.0, seed=1)), time.time() - 3600)
    server = watching_server(server_factory, home, [str(folder)]).start()
    state = state_file(home / "data", folder)
    wait_until(lambda: state.exists() and json.loads(state.read_text())["since"], 30,
               "the folder's first watch to be kept")
    take = folder / "take.wav"
    render(take, song_audio(Song(lufs=-19.0, seed=2)), time.time() - 5)
    first = reviewed(server, "take")
    now = time.time()
    os.utime(take, (now, now))  # a touch: the latest export, not a new one
    wait_until(lambda: f"take.wav: sent before, its review is {first['run_id']}"
               in server.log_path.read_text(), 30, "the touched file to be answered")
    assert server.stop() in (0, -signal.SIGTERM)

    now = time.time()  # written while nothing runs, after the folder was first watched
    render(folder / "older.wav", song_audio(Song(lufs=-18.0, seed=3)), now - 2)
    render(folder / "newer.wav", song_audio(Song(lufs=-17.0, seed=4)), now - 1)
    server.start()
    older, newer = reviewed(server, "older"), reviewed(server, "newer")
    assert older["status"] == newer["status"] == "succeeded"
    assert older["accepted_at"] < newer["accepted_at"]  # oldest first: the newest last
    latest = server.client.get("/exports").json()["exports"]
    assert latest[0]["run_id"] == newer["run_id"]
    assert {e["project"] for e in latest} == {"take", "older", "newer"}  # not "before"
    assert [e["run_id"] for e in runs_of(server, "take")] == [first["run_id"]]
    assert [len(runs_of(server, p)) for p in ("older", "newer")] == [1, 1]


def test_a_rejudgment_a_rename_and_a_text_file_leave_the_latest_exports_right(
        server_factory: Any, tmp_path: Path) -> None:
    server = server_factory({"AGENTBOX_AGENTS": ""}).start()
    runs = []
    for seed, lufs in ((1, -20.0), (2, -16.0)):
        mix = tmp_path / f"v{seed}.wav"
        render(mix, song_audio(Song(lufs=lufs, seed=seed)), time.time() - 60)
        sent = agentbox(server, "send", str(mix), "--project", "Old Name", "--wait", "--json")
        assert sent.returncode == 0, sent.stderr
        runs.append(json.loads(sent.stdout.split("\n", 1)[1])["run_id"])
    judged = agentbox(server, "rejudge", runs[0], "--stage", "master", "--wait")
    assert judged.returncode == 0, judged.stderr
    told = agentbox(server, "rejudge", runs[1], "--stage", "master", "--no-wait")
    assert told.returncode == 0 and "run_" in told.stdout, told.stderr

    def latest_of(name: str) -> str:
        found = server.client.get("/exports").json()["exports"]
        return next(e["run_id"] for e in found if e["project"] == name)
    assert latest_of("Old Name") == runs[1]  # the newest render, not a re-judgment
    home = server.client.get("/").text
    assert f'data-run-id="{runs[1]}" data-project="Old Name"' in home
    listed = server.client.get("/exports", params={"project": "Old Name"}).json()["exports"]
    numbers = {e["run_id"]: e["number"] for e in listed}
    assert [numbers[r] for r in runs] == [1, 2]
    assert sorted(numbers.values()) == [1, 1, 2, 2]  # each re-judgment by its export's number

    renamed = agentbox(server, "project", "rename", "Old Name", "New Name")
    assert renamed.returncode == 0, renamed.stderr
    listed = server.client.get("/exports", params={"project": "New Name"}).json()["exports"]
    assert {e["project"] for e in listed} == {"New Name"} and len(listed) == 4
    assert latest_of("New Name") == runs[1]
    for run_id in runs:  # in words; the stored event and result, below, as they were sent
        page = server.client.get(f"/ui/runs/{run_id}").text.partition('id="details"')[0]
        assert "New Name" in page and "Old Name" not in page

    notes = tmp_path / "Scribbles.wav"
    notes.write_text("a text file, named as a render\n")
    agentbox(server, "send", str(notes), "--wait")
    assert "Scribbles" not in {e["project"] for e in
                               server.client.get("/exports").json()["exports"]}
    below = server.client.get("/").text.partition("Couldn't review")[2]
    assert below.count('data-project="Scribbles"') == 1


def test_the_latest_exports_bytes_sent_again_while_it_waits_are_that_export(
        server_factory: Any, tmp_path: Path) -> None:
    # One worker, held busy: the renders sent meanwhile wait, queued, unreviewed.
    server = server_factory({"AGENTBOX_AGENTS": f"chain.ping={AGENTS}:held",
                             "AGENTBOX_WORKER_CONCURRENCY": "1"}).start()
    release = tmp_path / "release"
    hold = server.post(make_event(event_type="chain.ping", payload={"label": str(release)}))
    assert hold.status_code == 202, hold.text
    wait_until(lambda: server.journal_lines(), 30, "the worker to be held")
    mix = tmp_path / "Heroes Rite.wav"
    render(mix, song_audio(Song(lufs=-20.0)), time.time() - 300)
    sent = agentbox(server, "send", str(mix), "--json")
    assert sent.returncode == 0, sent.stderr
    first = json.loads(sent.stdout)
    assert first["duplicate"] is False

    os.utime(mix, (time.time() - 100,) * 2)  # touched: the CLI sends it as a new file
    again = json.loads(agentbox(server, "send", str(mix), "--json").stdout)
    assert (again["duplicate"], again["run_id"]) == (True, first["run_id"])
    dropped = drop(server, mix.read_bytes())
    assert dropped.status_code == 200, dropped.text
    assert (dropped.json()["duplicate"], dropped.json()["run_id"]) == (True, first["run_id"])

    # A new render given twice at once (the page twice, the CLI): one export.
    second = tmp_path / "Heroes Rite (2).wav"
    render(second, song_audio(Song(lufs=-16.0, seed=2)), time.time() - 50)
    with ThreadPoolExecutor(3) as pool:
        drops = [pool.submit(drop, server, second.read_bytes()) for _ in range(2)]
        cli = pool.submit(agentbox, server, "send", str(second), "--project", "Heroes Rite",
                          "--json")
        told = json.loads(cli.result().stdout)
        said = [one.result().json() for one in drops] + [told]
    assert sorted(one["duplicate"] for one in said) == [False, True, True], said
    assert len({one["run_id"] for one in said}) == 1

    # All of the above while the worker was held: neither render had been reviewed.
    assert [line["kind"] for line in server.journal_lines()] == ["start"]
    waiting = [server.run(run_id)["status"] for run_id in (first["run_id"], told["run_id"])]
    assert set(waiting) <= {"accepted", "processing"}, waiting
    listed = server.client.get("/exports", params={"project": "Heroes Rite"}).json()
    assert [e["run_id"] for e in listed["exports"]] == [told["run_id"], first["run_id"]]
    release.touch()
    assert [e["number"] for e in exports(server)] == [2, 1]


def drop(server: Server, audio: bytes) -> Any:
    """`POST /exports` of a file into Heroes Rite, as a program sends one."""
    return server.client.post("/exports", data={"project": "Heroes Rite"},
                              files={"file": ("Heroes Rite.wav", audio)},
                              headers={"Accept": "application/json"})
