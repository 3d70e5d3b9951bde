"""Not audio, not a project: a file that could not be reviewed as audio, sent into a
project that has exports, by the CLI and by a signed event, is no export of that
project (not its latest, not numbered, not on its page or in GET /exports); it is
listed once on the home page as "couldn't review", and its Dismiss (a form with the
page's CSRF token, in real Chromium) takes it off the list for good. The page's drop
box refuses such a file before anything is sent."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.conftest import make_event, wait_until
from tests.support.browser import chromium, fresh_page
from tests.support.corpus import Song, song_audio
from tests.test_renders import agentbox, render
from tests.test_watched import reviewed, runs_of, watching_server

pytestmark = pytest.mark.slow  # a server and its analysis process, Chromium
PROJECT = "Heroes Rite"


def an_export_and_a_text_file(server: Any, tmp_path: Path
                              ) -> tuple[str, subprocess.CompletedProcess[str]]:
    """A project's first export, reviewed, then a text file named as a render sent
    into it by the CLI: the export's run and the send's outcome."""
    mix = tmp_path / "Heroes Rite.wav"
    render(mix, song_audio(Song(lufs=-20.0)), time.time() - 60)
    sent = agentbox(server, "send", str(mix), "--wait", "--json")
    assert sent.returncode == 0, sent.stderr
    export = json.loads(sent.stdout.split("\n", 1)[1])["run_id"]
    notes = tmp_path / "notes.wav"
    notes.write_text("a text file, named as a render\n")
    by_cli = agentbox(server, "send", str(notes), "--project", PROJECT, "--json")
    assert by_cli.returncode == 0, by_cli.stderr
    return export, by_cli


def test_a_file_that_is_not_audio_is_no_export_of_its_project_and_is_dismissed(
        server_factory: Any, tmp_path: Path) -> None:
    server = server_factory({"AGENTBOX_AGENTS": ""}).start()
    export, by_cli = an_export_and_a_text_file(server, tmp_path)
    notes = tmp_path / "notes.wav"
    empty = tmp_path / "empty.wav"
    empty.write_bytes(b"")
    by_event = server.post(make_event(payload={"project_id": PROJECT,
                                               "mix_url": str(empty)}))
    assert by_event.status_code == 202, by_event.text
    failed = [json.loads(by_cli.stdout)["run_id"], by_event.json()["run_id"]]
    for run_id in failed:
        run = server.wait_terminal(run_id, timeout=120)
        assert (run["status"], run["error_code"]) == ("failed_permanent", "mix_unreadable")

    def listed() -> list[dict[str, Any]]:
        answer = server.client.get("/exports", params={"project": PROJECT})
        assert answer.status_code == 200, answer.text
        found: list[dict[str, Any]] = answer.json()["exports"]
        return found
    wait_until(lambda: [e["run_id"] for e in listed()] == [export], 30,
               "the files that are not audio to leave the project's exports")
    assert [e["number"] for e in listed()] == [1]
    latest = server.client.get("/exports").json()["exports"]
    assert [(e["project"], e["run_id"]) for e in latest] == [(PROJECT, export)]
    page = server.client.get("/projects/" + quote(PROJECT)).text
    assert export in page and not any(run_id in page for run_id in failed)
    dropped = server.client.post("/exports", data={"project": PROJECT},
                                 files={"file": ("notes.wav", notes.read_bytes())},
                                 headers={"Accept": "application/json"})
    assert (dropped.status_code, dropped.json()["error_code"]) == (422, "not_audio")

    forged = server.client.post(f"/runs/{failed[0]}/dismiss", data={"csrf": "forged"})
    assert forged.status_code == 403
    with chromium() as browser, fresh_page(browser) as tab:
        tab.goto(server.url + "/")
        items = tab.locator("#unreviewable li")
        assert sorted(items.evaluate_all("all => all.map(li => li.dataset.runId)")) == \
            sorted(failed)  # each once
        assert "couldn't review" in items.first.inner_text()
        assert tab.locator(f'#projects [data-run-id="{export}"]').count() == 1
        for run_id in failed:  # no project's row
            assert tab.locator(f'#projects [data-run-id="{run_id}"]').count() == 0
        tab.locator(f'#unreviewable li[data-run-id="{failed[0]}"] button',
                    has_text="Dismiss").click()
        tab.wait_for_url(server.url + "/")
        tab.wait_for_selector(f'#unreviewable li[data-run-id="{failed[0]}"]', state="detached")
        tab.reload()
        assert items.evaluate_all("all => all.map(li => li.dataset.runId)") == [failed[1]]
    again = server.client.post(f"/runs/{failed[0]}/dismiss")  # the admin token, JSON
    assert again.status_code == 404, again.text
    done = server.client.post(f"/runs/{failed[1]}/dismiss")
    assert done.json() == {"run_id": failed[1], "dismissed": True}
    assert "Couldn't review" not in server.client.get("/").text
    assert [e["run_id"] for e in listed()] == [export]  # dismissed: still no export


def test_show_names_a_project_whose_only_file_was_not_audio_by_that_file(
        server_factory: Any, tmp_path: Path) -> None:
    """`agentbox runs` lists such a file under its project; `agentbox show PROJECT`
    finds it there (its latest run: the project has no export), and a name no run
    carries is still not found."""
    server = server_factory({"AGENTBOX_AGENTS": ""}).start()
    notes = tmp_path / "notes.wav"
    notes.write_text("a text file, named as a render\n")
    sent = agentbox(server, "send", str(notes), "--project", "Junk", "--wait")
    assert sent.returncode == 4, sent.stderr  # the run failed: not audio
    listed = agentbox(server, "runs")
    assert any("Junk" in line and "couldn't review" in line
               for line in listed.stdout.splitlines()), listed.stdout
    shown = agentbox(server, "show", "Junk")
    assert shown.returncode == 0, shown.stderr
    assert "notes.wav: couldn't review" in shown.stdout and "mix_unreadable" in shown.stdout
    missing = agentbox(server, "show", "No Such Project")
    assert missing.returncode == 1 and "no project has that name" in missing.stderr


def test_a_render_in_a_watched_folder_that_holds_no_audio_leaves_the_latest_as_it_was(
        server_factory: Any, tmp_path: Path) -> None:
    """The server's watched folder: a render written again as nothing a DAW could play
    (a text file under its name) is no export of its project."""
    folder = tmp_path / "Exports"
    folder.mkdir()
    server = watching_server(server_factory, tmp_path / "home", [str(folder)]).start()
    take = folder / "take.wav"
    render(take, song_audio(Song(lufs=-19.0, seed=2)), time.time() - 5)
    first = reviewed(server, "take")
    take.write_text("not audio: a render written again as text\n")

    def failed() -> list[str]:
        return [run["run_id"] for run in server.client.get(
            "/runs", params={"status": "failed_permanent"}).json()["runs"]]
    [broken] = wait_until(failed, 120, "the text file's review to fail")
    wait_until(lambda: f'data-run-id="{broken}"' in server.client.get("/").text, 30,
               "the text file to be listed as couldn't review")
    assert [e["run_id"] for e in runs_of(server, "take")] == [first["run_id"]]
    latest = server.client.get("/exports").json()["exports"]
    assert [(e["project"], e["run_id"]) for e in latest] == [("take", first["run_id"])]
    below = server.client.get("/").text.partition("Couldn't review")[2]
    assert below.count(f'data-run-id="{broken}"') == 1


def test_a_stop_before_the_note_loses_no_note(server_factory: Any, tmp_path: Path) -> None:
    """The noting follows the failure's commit: a server stopped in between (here: the
    note taken back while it is stopped, the summary as it was before the note) notes
    it at its next start, so the file is still no export of its project."""
    import sqlite3

    server = server_factory({"AGENTBOX_AGENTS": ""}).start()
    export, by_cli = an_export_and_a_text_file(server, tmp_path)
    failed = json.loads(by_cli.stdout)["run_id"]
    assert server.wait_terminal(failed, timeout=120)["error_code"] == "mix_unreadable"

    def latest() -> list[str]:
        found = server.client.get("/exports", params={"project": PROJECT}).json()["exports"]
        return [e["run_id"] for e in found]
    wait_until(lambda: latest() == [export], 30, "the failure to be noted")
    server.stop()
    with sqlite3.connect(Path(server.env["AGENTBOX_DATA_DIR"]) / "agentbox.sqlite3") as db:
        db.execute("DELETE FROM not_audio")  # as if the server died before the note
        db.execute("DELETE FROM project_summary")
        db.execute("INSERT INTO project_summary SELECT project, run_id, accepted_at, exports "
                   "FROM project_latest")
        assert db.execute("SELECT run_id FROM project_summary").fetchall() == [(failed,)]
    server.start()
    assert latest() == [export]  # noted again as the review started, before it answered
    assert [e["run_id"] for e in server.client.get("/exports").json()["exports"]] == [export]
    assert failed in server.client.get("/").text  # listed as couldn't review
