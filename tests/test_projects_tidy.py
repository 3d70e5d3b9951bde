"""Projects a musician tidies, through a real server, its page and the CLI: rename,
merge and remove, with history, references and kept audio following."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Server, wait_until
from tests.support.corpus import Song, song_audio, write

pytestmark = pytest.mark.slow  # a server, its analysis process, the CLI in processes


def agentbox(server: Server, *args: str, stdin: str | None = None
             ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentbox", *args, "--url", server.url],
                          env=server.env, capture_output=True, text=True, timeout=180,
                          cwd=server.home, input=stdin)


def exports(server: Server, project: str) -> list[dict[str, Any]]:
    answer = server.client.get("/exports", params={"project": project})
    return answer.json()["exports"] if answer.status_code == 200 else []


def home_projects(server: Server) -> set[str]:
    return {e["project"] for e in server.client.get("/exports").json()["exports"]}


def test_rename_merge_and_remove_projects(server_factory: Any, tmp_path: Path) -> None:
    server = server_factory({"AGENTBOX_AGENTS": ""}).start()
    mix = write(tmp_path / "mix.wav", song_audio(Song(lufs=-20.0)))
    other = write(tmp_path / "other.wav", song_audio(Song(lufs=-18.0, seed=3)))
    for path, project in ((mix, "Heros Rite"), (other, "Heroes Rite (v2)"), (mix, "junk")):
        sent = agentbox(server, "send", str(path), "--project", project, "--wait")
        assert sent.returncode == 0, sent.stderr
    first = exports(server, "Heros Rite")[0]["run_id"]

    renamed = agentbox(server, "project", "rename", "Heros Rite", "Heroes Rite")
    assert renamed.returncode == 0, renamed.stderr
    assert "Heros Rite is now Heroes Rite" in renamed.stdout
    assert [e["run_id"] for e in exports(server, "Heroes Rite")] == [first]
    assert server.client.get(f"/runs/{first}/audio").status_code == 200  # kept audio follows
    review_page = server.client.get(f"/ui/runs/{first}").text
    assert 'href="/projects/Heroes%20Rite"' in review_page  # its project by its new name
    assert 'href="/projects/Heros%20Rite"' not in review_page
    old_page = server.client.get("/projects/Heros%20Rite", follow_redirects=False)
    assert old_page.status_code == 307 and old_page.headers["location"].endswith(
        "/projects/Heroes%20Rite")
    taken = agentbox(server, "project", "rename", "junk", "Heroes Rite")
    assert taken.returncode != 0 and "merge" in taken.stderr

    # The page's form, with its CSRF token: merge v2 into the renamed project.
    page = server.client.get("/projects/Heroes%20Rite%20%28v2%29").text
    assert 'id="merge-form"' in page and 'id="remove-form"' in page
    forged = server.client.post("/projects/Heroes%20Rite%20%28v2%29/merge",
                                data={"into": "Heroes Rite", "csrf": "nope"})
    assert forged.status_code == 403
    merged = server.client.post("/projects/Heroes%20Rite%20%28v2%29/merge",
                                data={"into": "Heroes Rite", "csrf": server.csrf()},
                                follow_redirects=False)
    assert merged.status_code == 303, merged.text
    assert len(exports(server, "Heroes Rite")) == 2
    assert home_projects(server) == {"Heroes Rite", "junk"}
    clash = server.client.post("/projects/junk/rename",
                               data={"to": "Heroes Rite", "csrf": server.csrf()})
    assert clash.status_code == 409 and clash.headers["content-type"].startswith("text/html")
    assert "exists: merge into it instead (the project page" in clash.text  # a page, in words

    # An export still sent under an old name joins the project, compared with its latest.
    late = write(tmp_path / "late.wav", song_audio(Song(lufs=-17.0, seed=5)))
    again = agentbox(server, "send", str(late), "--project", "Heros Rite", "--event-id",
                     "late", "--wait")
    assert again.returncode == 0, again.stderr
    found = exports(server, "Heroes Rite")
    assert len(found) == 3 and found[0]["result"]["comparison"]["previous_run_id"]

    asked = agentbox(server, "project", "remove", "junk", stdin="n\n")
    assert asked.returncode != 0 and "junk" in home_projects(server)  # asked, and refused
    removed = agentbox(server, "project", "remove", "junk", "--yes")
    assert removed.returncode == 0, removed.stderr
    assert "junk removed: 1 export," in removed.stdout
    assert home_projects(server) == {"Heroes Rite"}
    assert server.client.get("/exports", params={"project": "junk"}).status_code == 404


def test_a_file_that_is_not_audio_makes_no_project(server_factory: Any, tmp_path: Path
                                                   ) -> None:
    server = server_factory({"AGENTBOX_AGENTS": ""}).start()
    notes = tmp_path / "notes.wav"
    notes.write_text("a text file, named as a render\n")
    mix = write(tmp_path / "song.wav", song_audio(Song(lufs=-20.0)))
    for path in (notes, mix):
        agentbox(server, "send", str(path), "--wait")
    # Noted as no audio as its review fails: its Dismiss is the run's, not a project's.
    def noted() -> str | None:
        page = server.client.get("/").text
        return page if "/dismiss" in page else None
    home = wait_until(noted, 30, "the file to be noted as no audio")
    projects, _, below = home.partition("Couldn't review")
    assert 'data-project="song"' in projects and 'data-project="notes"' not in projects
    assert below.count('data-project="notes"') == 1 and "Dismiss" in below
    run_id = below.split('data-run-id="', 1)[1].split('"', 1)[0]
    dismissed = server.client.post(f"/runs/{run_id}/dismiss", data={"csrf": server.csrf()},
                                   follow_redirects=False)
    assert dismissed.status_code == 303
    assert 'data-project="notes"' not in server.client.get("/").text
    assert server.client.get("/exports", params={"project": "notes"}).status_code == 404
