"""Stages that follow the work, through a real server, watcher and CLI: a master sent
once does not make the project's later mixes masters, a stage said for the project
is remembered, and a review is judged again at the other stage from the page's
button and from `agentbox rejudge`, from the same archived bytes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Server
from tests.support.corpus import Song, limited, song_audio, write

pytestmark = pytest.mark.slow  # a server, its analysis process, the CLI in processes


def agentbox(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentbox", *args, "--url", server.url],
                          env=server.env, capture_output=True, text=True, timeout=180,
                          cwd=server.home)


def latest_run(server: Server, project: str, before: set[str]) -> dict[str, Any]:
    exports = server.client.get("/exports", params={"project": project}).json()["exports"]
    new = [e for e in exports if e["run_id"] not in before]
    assert new, exports
    return server.wait_terminal(new[0]["run_id"], timeout=120)


def test_the_file_s_stage_beats_the_project_s_and_a_review_is_judged_again(
        server_factory: Any, tmp_path: Path) -> None:
    server = server_factory({"AGENTBOX_AGENTS": ""}).start()
    masters, mixes = tmp_path / "masters", tmp_path / "exports"
    masters.mkdir()
    mixes.mkdir()
    master = write(masters / "frantic.wav", limited(song_audio(Song(lufs=-14.0)), -9.5, -0.5))
    write(mixes / "Heroes Rite.wav", song_audio(Song(lufs=-20.0)) * 0.5)

    sent = agentbox(server, "send", str(master), "--project", "Heroes Rite", "--stage",
                    "master", "--wait", "--json")
    assert sent.returncode == 0, sent.stderr
    first = json.loads(sent.stdout.split("\n", 1)[1])
    assert (first["result"]["stage"], first["result"]["project_stage"]) == ("master", None)

    # The watch folder's --stage mix beats the master given once for the project.
    watched = agentbox(server, "watch", str(mixes), "--stage", "mix", "--existing", "--once")
    assert watched.returncode == 0, watched.stderr
    mix = latest_run(server, "Heroes Rite", {first["run_id"]})
    assert (mix["result"]["stage"], mix["result"]["stage_source"]) == ("mix", "watch")
    assert mix["result"]["verdict"] != "fail"

    # One click on the review's page: the same bytes, judged as a master, beside it.
    page = server.client.get(f"/ui/runs/{mix['run_id']}").text
    assert "Judge it as a master" in page and 'action="/runs/' in page
    forged = server.client.post(f"/runs/{mix['run_id']}/rejudge",
                                data={"stage": "master", "csrf": "forged"})
    assert forged.status_code == 403
    clicked = server.client.post(f"/runs/{mix['run_id']}/rejudge",
                                 data={"stage": "master", "csrf": server.csrf()},
                                 follow_redirects=False)
    assert clicked.status_code == 303, clicked.text
    rejudged_id = clicked.headers["location"].rsplit("/", 1)[1]
    rejudged = server.wait_terminal(rejudged_id, timeout=120)["result"]
    assert (rejudged["stage"], rejudged["stage_source"]) == ("master", "rejudge")
    assert rejudged["rejudge_of"] == mix["run_id"]
    assert rejudged["file"]["sha256"] == mix["result"]["file"]["sha256"]
    assert rejudged["file"]["name"] == "Heroes Rite.wav"
    assert "re-judged at your request" in rejudged["stage_reason"]
    shown = server.client.get(f"/ui/runs/{rejudged_id}").text
    assert "Re-judged" in shown and "Judge it as a mix" in shown
    again = server.client.post(f"/runs/{mix['run_id']}/rejudge",
                               data={"stage": "master", "csrf": server.csrf()},
                               follow_redirects=False)
    assert again.headers["location"].endswith(rejudged_id)  # asked twice: the same one

    # The CLI, with a review named as `show` takes it: the master judged as a mix.
    told = agentbox(server, "rejudge", first["run_id"][:14], "--stage", "mix")
    assert told.returncode == 0, told.stderr
    assert "Judged as a mix going to mastering: re-judged at your request" in told.stdout
    refused = agentbox(server, "rejudge", first["run_id"], "--stage", "final")
    assert refused.returncode == 2
    same = agentbox(server, "rejudge", first["run_id"], "--stage", "master")
    assert same.returncode != 0 and "already judges it as a master" in same.stderr


def test_a_stage_said_for_the_project_is_remembered(server_factory: Any,
                                                     tmp_path: Path) -> None:
    server = server_factory({"AGENTBOX_AGENTS": ""}).start()
    loud = write(tmp_path / "loud.wav", limited(song_audio(Song(lufs=-14.0)), -9.5, -0.5))
    told = agentbox(server, "send", str(loud), "--project", "Night", "--project-stage", "mix",
                    "--wait", "--json")
    assert told.returncode == 0, told.stderr
    run = json.loads(told.stdout.split("\n", 1)[1])
    assert (run["result"]["stage"], run["result"]["project_stage"]) == ("mix", "mix")
    louder = write(tmp_path / "louder.wav",  # a new render: the same bytes would be that one
                   limited(song_audio(Song(lufs=-13.0)), -9.0, -0.5))
    later = agentbox(server, "send", str(louder), "--project", "Night", "--event-id", "later",
                     "--wait", "--json")
    result = json.loads(later.stdout.split("\n", 1)[1])["result"]
    assert (result["stage"], result["stage_source"]) == ("mix", "project")
    assert "remembered for the project 'Night'" in result["stage_reason"]
