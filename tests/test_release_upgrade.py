"""A database the release before apps owned their data wrote (main at RELEASE: the
review's tables made by the store's versions 4 and 7, each event's project in a
column of the engine's events table) opens with this code through a real server,
on SQLite and PostgreSQL, and answers every export, review, reference and project
as the release's own server did.

The release's server is the release's code itself (`git archive` of RELEASE into the
test's folder), run by the same Python on the same data: it takes real exports
(`agentbox send --wait`), removes the first one's run by retention (so the
project's history keeps it), renames a project and adds a reference track."""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
import tarfile
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, Server, wait_until
from tests.support.corpus import Song, song_audio, write

pytestmark = pytest.mark.slow  # two servers in turn, their analysis, the CLI in processes

RELEASE = "a779c2f"  # main before apps owned their data
RELEASE_ENV = {
    "AGENTBOX_AGENTS": "",  # the built-in review
    # Retention may remove a finished run within a second (the history keeps it).
    "AGENTBOX_IDEMPOTENCY_TTL_SECONDS": "1",
    "AGENTBOX_RETENTION_DAYS": "0.00002",
    "AGENTBOX_BODY_RETENTION_DAYS": "0.00002",
    "AGENTBOX_MAINTENANCE_INTERVAL_SECONDS": "3600",  # only when asked (POST /prune)
}


def release_code(into: Path) -> Path:
    """The release's package, as `git archive` gives it; skipped where the checkout
    lacks that commit (a shallow clone)."""
    found = subprocess.run(["git", "-C", str(ROOT), "archive", RELEASE, "agentbox"],
                           capture_output=True, timeout=120)
    if found.returncode != 0:
        pytest.skip(f"this checkout has no commit {RELEASE} (a shallow clone?): "
                    f"{found.stderr.decode(errors='replace').strip()}")
    with tarfile.open(fileobj=BytesIO(found.stdout)) as archive:
        archive.extractall(into, filter="data")
    return into


def agentbox(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentbox", *args, "--url", server.url],
                          env=server.env, capture_output=True, text=True, timeout=180,
                          cwd=server.home)


def pruned(server: Server) -> bool:
    answer = server.client.post("/prune", json={"dry_run": False})
    assert answer.status_code == 200, answer.text
    return bool(answer.json()["removed"].get("runs"))


def moved(database_url: str | None, home: Path) -> list[tuple[str, str]]:
    """The review's run_projects, once the events' `project` column is gone."""
    if database_url is None:
        with contextlib.closing(sqlite3.connect(home / "data" / "agentbox.sqlite3")) as conn:
            assert "project" not in {row[1] for row in conn.execute(
                "PRAGMA table_info(events)")}
            return sorted(conn.execute("SELECT run_id, project FROM run_projects"))
    import psycopg

    with psycopg.connect(database_url) as pg:
        assert pg.execute("SELECT count(*) FROM information_schema.columns WHERE "
                          "table_name = 'events' AND column_name = 'project'"
                          ).fetchone() == (0,)
        return sorted(pg.execute("SELECT run_id, project FROM run_projects").fetchall())


def what_it_shows(server: Server, run_ids: list[str]) -> dict[str, Any]:
    """Every export, review, reference and project, as the API answers them."""
    client = server.client
    # GET /exports's exports (its next_cursor, null with so few projects, came later)
    shown: dict[str, Any] = {"home": client.get("/exports").json()["exports"]}
    for project in ("Heroes Rite", "Heros Rite", "Other"):
        shown[f"exports {project}"] = client.get("/exports", params={"project": project}).json()
    shown["references"] = client.get("/references").json()
    shown["reference"] = client.get("/projects/Heroes%20Rite/reference").json()
    for run_id in run_ids:
        run = client.get(f"/runs/{run_id}")
        shown[f"run {run_id}"] = run.json() if run.status_code == 200 else run.status_code
        shown[f"audio {run_id}"] = client.get(f"/runs/{run_id}/audio").status_code
    shown["search"] = [r["run_id"] for r in client.get("/runs").json()["runs"]]
    return shown


def by_current_names(shown: dict[str, Any], renamed: dict[str, str]) -> dict[str, Any]:
    """What the release showed, each export under the name its project goes by now:
    the release named a renamed project's older exports by the name they were sent
    with; a rename is complete since (every export says the current name)."""
    def export(one: dict[str, Any]) -> dict[str, Any]:
        return {**one, "project": renamed.get(one["project"], one["project"])}

    found = dict(shown)
    found["home"] = [export(one) for one in shown["home"]]
    for key, value in shown.items():
        if key.startswith("exports ") and isinstance(value, dict) and "exports" in value:
            found[key] = {**value, "exports": [export(one) for one in value["exports"]]}
    return found


@pytest.mark.parametrize("database", ["sqlite", pytest.param("postgresql",
                                                             marks=pytest.mark.postgres)])
def test_a_release_database_opens_with_everything_intact(
        server_factory: Any, tmp_path: Path, request: pytest.FixtureRequest,
        database: str) -> None:
    code = release_code(tmp_path / "release")
    env = dict(RELEASE_ENV)
    if database == "postgresql":
        env["AGENTBOX_DATABASE_URL"] = request.getfixturevalue("postgres_url")
    home = tmp_path / "home"
    home.mkdir()
    old = server_factory(env, home=home)
    old.env["PYTHONPATH"] = str(code)
    old.start()
    mix = write(tmp_path / "mix.wav", song_audio(Song(lufs=-20.0)))
    other = write(tmp_path / "other.wav", song_audio(Song(lufs=-16.0, seed=3)))
    ref = write(tmp_path / "ref.wav", song_audio(Song(lufs=-14.0, seed=5)))
    sent = agentbox(old, "send", str(mix), "--project", "Heros Rite", "--wait")
    assert sent.returncode == 0, sent.stderr
    wait_until(lambda: pruned(old), 60, "retention to remove the first export's run")
    for path, project in ((other, "Heros Rite"), (mix, "Other")):
        sent = agentbox(old, "send", str(path), "--project", project, "--wait")
        assert sent.returncode == 0, sent.stderr
    renamed = agentbox(old, "project", "rename", "Heros Rite", "Heroes Rite")
    assert renamed.returncode == 0, renamed.stderr
    added = agentbox(old, "reference", "add", str(ref), "--project", "Heroes Rite")
    assert added.returncode == 0, added.stderr
    history = old.client.get("/exports", params={"project": "Heroes Rite"}).json()["exports"]
    other_runs = old.client.get("/exports", params={"project": "Other"}).json()["exports"]
    run_ids = [e["run_id"] for e in history + other_runs]
    assert len(run_ids) == 3 and [e["archived"] for e in history] == [False, True]
    before = what_it_shows(old, run_ids)
    assert before["reference"]["name"] == "ref.wav"
    old.stop()
    old.close()

    new = server_factory({**env, "AGENTBOX_RETENTION_DAYS": "30",
                          "AGENTBOX_BODY_RETENTION_DAYS": "30",
                          "AGENTBOX_IDEMPOTENCY_TTL_SECONDS": "86400"}, home=home).start()
    after = what_it_shows(new, run_ids)
    assert after == by_current_names(before, {"Heros Rite": "Heroes Rite"})
    assert moved(env.get("AGENTBOX_DATABASE_URL"), home) == [(run_ids[0], "Heros Rite"),
                                                            (run_ids[2], "Other")]
    stored = [run_ids[0], run_ids[2]]  # the first export's run (run_ids[1]) was removed
    assert [after[f"run {r}"]["project"] for r in stored] == ["Heros Rite", "Other"]
    # The run list's project filter (the page's ?project=) is the review's now.
    page = new.client.get("/ui/runs", params={"project": "Other"}).text
    assert run_ids[2] in page and run_ids[0] not in page
    # The next export joins its renamed project, compared with the one before.
    sent = agentbox(new, "send", str(mix), "--project", "Heroes Rite", "--wait")
    assert sent.returncode == 0, sent.stderr
    latest = new.client.get("/exports", params={"project": "Heroes Rite"}).json()["exports"]
    assert len(latest) == 3 and latest[0]["result"]["comparison"]["previous_run_id"] == (
        run_ids[0])
