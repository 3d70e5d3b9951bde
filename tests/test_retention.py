"""Retention's settings, `agentbox prune [--dry-run]` on a stopped store (SQLite and
PostgreSQL) and beside a running server (which holds the SQLite file, so the
command asks it), and what the API says of a run whose body is gone."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agentbox.archive.history import SCHEMA as HISTORY
from agentbox.config import (
    DEFAULT_BODY_RETENTION_DAYS,
    DEFAULT_RETENTION_DAYS,
    ConfigError,
    load_settings,
)
from agentbox.events import parse_event
from agentbox.review.view import Review
from agentbox.runs import RunStatus
from agentbox.store import IngestParams, Outcome, Store
from agentbox.store.sqlite import SqliteStore
from tests.conftest import ROOT, Server, make_event, wait_until
from tests.test_client import tone

T0 = 1_785_000_000.0  # 2026-07-25: months before any day these tests run


# -- settings ---------------------------------------------------------------------------


def test_retention_defaults_and_fractions(tmp_path: Path) -> None:
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    settings = load_settings(empty, environ={})
    assert (settings.retention_days, settings.body_retention_days) == (
        DEFAULT_RETENTION_DAYS, DEFAULT_BODY_RETENTION_DAYS) == (30.0, 7.0)
    toml = tmp_path / "agentbox.toml"
    toml.write_text("retention_days = 7.5\nbody_retention_days = 0.25\n")
    settings = load_settings(toml, environ={})
    assert (settings.retention_days, settings.body_retention_days) == (7.5, 0.25)
    settings = load_settings(environ={"AGENTBOX_RETENTION_DAYS": "8",
                                      "AGENTBOX_BODY_RETENTION_DAYS": "0.5"})
    assert (settings.retention_days, settings.body_retention_days) == (8.0, 0.5)


@pytest.mark.parametrize(("environ", "said"), [
    ({"AGENTBOX_RETENTION_DAYS": "0"}, "AGENTBOX_RETENTION_DAYS must be a positive number"),
    ({"AGENTBOX_RETENTION_DAYS": "-1"}, "AGENTBOX_RETENTION_DAYS must be a positive number"),
    ({"AGENTBOX_RETENTION_DAYS": "nan"}, "AGENTBOX_RETENTION_DAYS must be a positive number"),
    ({"AGENTBOX_RETENTION_DAYS": "a month"}, "AGENTBOX_RETENTION_DAYS: 'a month' is not a valid"),
    ({"AGENTBOX_BODY_RETENTION_DAYS": "inf"},
     "AGENTBOX_BODY_RETENTION_DAYS must be a positive number"),
    # shorter than the 7-day idempotency window: a duplicate must still find its run
    ({"AGENTBOX_RETENTION_DAYS": "6.5"}, "is shorter than the idempotency window "
                                         "AGENTBOX_IDEMPOTENCY_TTL_SECONDS (7 days)"),
    ({"AGENTBOX_RETENTION_DAYS": "1", "AGENTBOX_IDEMPOTENCY_TTL_SECONDS": "90000"},
     "AGENTBOX_RETENTION_DAYS (1 days) is shorter than the idempotency window"),
    ({"AGENTBOX_BODY_RETENTION_DAYS": "31"},
     "AGENTBOX_BODY_RETENTION_DAYS (31) is longer than AGENTBOX_RETENTION_DAYS (30)"),
])
def test_retention_settings_refused_name_the_setting(environ: dict[str, str], said: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings(environ=environ)
    assert said in str(refused.value)


def test_retention_refused_in_the_config_file_names_its_key(tmp_path: Path) -> None:
    """A value from agentbox.toml is named as its key in that file (as every other
    refused setting is); one from the environment by its variable."""
    toml = tmp_path / "agentbox.toml"
    toml.write_text("retention_days = 0.5\n")
    with pytest.raises(ConfigError) as refused:
        load_settings(toml, environ={})
    assert str(refused.value).startswith(
        f"retention_days in {toml} (0.5 days) is shorter than the idempotency window "
        "AGENTBOX_IDEMPOTENCY_TTL_SECONDS (7 days)")
    assert "AGENTBOX_RETENTION_DAYS" not in str(refused.value)
    toml.write_text("body_retention_days = 12\nidempotency_ttl_seconds = 3600\n")
    with pytest.raises(ConfigError) as refused:
        load_settings(toml, environ={"AGENTBOX_RETENTION_DAYS": "10"})
    assert str(refused.value).startswith(
        f"body_retention_days in {toml} (12) is longer than AGENTBOX_RETENTION_DAYS (10)")
    toml.write_text("retention_days = 1\n")
    with pytest.raises(ConfigError) as refused:
        load_settings(toml, environ={"AGENTBOX_IDEMPOTENCY_TTL_SECONDS": "90000"},
                      overrides={"retention_days": 0.5})
    assert str(refused.value).startswith("--retention-days (0.5 days) is shorter than the "
                                         "idempotency window AGENTBOX_IDEMPOTENCY_TTL_SECONDS")


def test_a_window_shortened_with_retention_is_accepted() -> None:
    settings = load_settings(environ={"AGENTBOX_RETENTION_DAYS": "0.5",
                                      "AGENTBOX_BODY_RETENTION_DAYS": "0.1",
                                      "AGENTBOX_IDEMPOTENCY_TTL_SECONDS": "3600"})
    assert settings.retention_days == 0.5


# -- agentbox prune on a stopped store ----------------------------------------------------


def agentbox(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentbox", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("AGENTBOX_")},
            "PYTHONPATH": str(ROOT), "XDG_CONFIG_HOME": str(tmp_path / "config"),
            "AGENTBOX_DATA_DIR": str(tmp_path / "data"), **extra}


async def old_history(store: Store) -> list[str]:
    """Three old exports: one succeeded, one failed for good, one dead letter nobody
    decided on (it stays); stored with the review's tables, which keep their project."""
    store.add_tables(HISTORY)
    await store.open()
    outcomes = [Outcome(RunStatus.SUCCEEDED, result={"ok": True}),
                Outcome(RunStatus.FAILED_PERMANENT, error_code="bad", error_message="no"),
                Outcome(RunStatus.DEAD_LETTERED, error_code="timeout", error_message="slow")]
    run_ids = []
    try:
        for n, outcome in enumerate(outcomes):
            body = json.dumps(make_event(f"old{n}", project_id="Night Drive")).encode()
            result = await store.ingest(IngestParams(
                event=parse_event(body), body=body, agents=["mix_review"], now=T0 + n, ttl=60,
                max_pending=100))
            run_id = result.runs[0].run_id
            claimed = await store.claim("w", 1, T0 + n, 60, 3)
            assert [c.run_id for c in claimed.claimed] == [run_id]
            assert await store.finish(run_id, "w", 1, outcome, T0 + n + 1)
            run_ids.append(run_id)
        return run_ids
    finally:
        await store.close()


def check_prune_cli(env: dict[str, str]) -> None:
    dry = agentbox(env, "prune", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    assert lines[0].startswith("would remove: runs finished before ")
    counts = {line.split()[0]: int(line.split()[1]) for line in lines[1:]
              if len(line.split()) == 2}
    assert counts["runs"] == 2 and counts["attempts"] == 2 and counts["events"] == 2
    assert counts["idempotency_keys"] == 2 and counts["bodies"] == 0
    assert "(2 finished exports would be kept for their projects' history)" in dry.stdout
    done = agentbox(env, "prune", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["dry_run"] is False
    assert report["removed"] | {"project_exports": 0} == {
        "runs": 2, "attempts": 2, "run_history": 0, "outbox": 0, "discarded_runs": 0,
        "events": 2, "idempotency_keys": 2, "bodies": 0, "project_exports": 0}
    again = json.loads(agentbox(env, "prune", "--dry-run", "--json").stdout)
    assert not any(again["removed"].values())
    verified = agentbox(env, "verify")
    assert verified.returncode == 0 and verified.stdout.strip().endswith(": ok"), \
        verified.stdout + verified.stderr


def test_prune_a_stopped_sqlite_store(tmp_path: Path) -> None:
    env = clean_env(tmp_path)
    asyncio.run(old_history(SqliteStore(tmp_path / "data" / "agentbox.sqlite3")))
    check_prune_cli(env)


def test_prune_where_there_is_no_store_makes_none(tmp_path: Path) -> None:
    mistyped = tmp_path / "dtaa"
    told = agentbox(clean_env(tmp_path), "prune", "--data-dir", str(mistyped))
    assert told.returncode == 1
    assert f"there is no agentbox database at {mistyped / 'agentbox.sqlite3'}" in told.stderr
    assert not mistyped.exists()


@pytest.mark.postgres
def test_prune_a_postgres_store(tmp_path: Path, postgres_url: str) -> None:
    from agentbox.store.postgres import PostgresStore

    env = clean_env(tmp_path, AGENTBOX_DATABASE_URL=postgres_url)
    asyncio.run(old_history(PostgresStore(postgres_url)))
    check_prune_cli(env)


# -- beside a running server ----------------------------------------------------------------


def test_prune_through_a_running_server_and_a_run_whose_body_is_gone(
        server_factory: Any) -> None:
    server: Server = server_factory({
        "AGENTBOX_IDEMPOTENCY_TTL_SECONDS": "1",
        "AGENTBOX_RETENTION_DAYS": "0.0001",  # 8.6 s
        "AGENTBOX_BODY_RETENTION_DAYS": "0.00001",  # 0.9 s
        "AGENTBOX_MAINTENANCE_INTERVAL_SECONDS": "3600",  # only the commands prune
    }).start()
    env = {**server.env, "AGENTBOX_URL": server.url}  # it listens on a port of its own
    ok = server.post(make_event(project_id="Night Drive")).json()["run_id"]
    failed = server.post(make_event(project_id="permanent")).json()["run_id"]
    assert server.wait_terminal(failed)["status"] == "failed_permanent"
    server.wait_terminal(ok)
    projects_before = server.client.get("/").status_code

    def preview() -> dict[str, Any] | None:
        shown = agentbox(env, "prune", "--dry-run", "--json")
        assert shown.returncode == 0, shown.stderr  # the server holds the file: it answers
        report: dict[str, Any] = json.loads(shown.stdout)
        return report if report["removed"]["bodies"] == 2 else None

    wait_until(preview, 30, "both bodies to be due")
    pruned = agentbox(env, "prune")
    assert pruned.returncode == 0, pruned.stderr
    assert pruned.stdout.startswith("removed: ") and "bodies" in pruned.stdout
    # The run and its result stay; a replay has nothing to run and says so (410).
    assert server.run(failed)["status"] == "failed_permanent"
    token = agentbox(env, "token").stdout.strip()
    refused = server.client.post(f"/runs/{failed}/replay",
                                 headers={"Authorization": f"Bearer {token}"})
    assert refused.status_code == 410 and refused.json()["error_code"] == "body_removed"
    shown = agentbox(env, "show", failed)
    assert shown.returncode == 0, shown.stderr
    # The API and `show` say the body is gone, before a replay has to find out.
    assert server.run(failed)["body_removed_at"].endswith("Z")
    assert server.run(ok)["body_removed_at"] is not None
    assert "event body removed by retention at " in shown.stdout

    def runs_due() -> bool:
        report = json.loads(agentbox(env, "prune", "--dry-run", "--json").stdout)
        return bool(report["removed"]["runs"] == 2)

    wait_until(runs_due, 40, "both runs to be due")
    done = json.loads(agentbox(env, "prune", "--json").stdout)
    assert done["removed"]["runs"] == 2 and done["removed"]["project_exports"] == 2
    assert server.client.get(f"/runs/{ok}").status_code == 404
    assert server.client.get("/").status_code == projects_before == 200
    verified = agentbox(env, "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    bad = server.client.post("/prune", headers={"Authorization": f"Bearer {token}"},
                             content=b'{"dry_run": "yes"}')
    assert bad.status_code == 422 and bad.json()["error_code"] == "invalid_request"
    assert server.anonymous.post("/prune").status_code == 401


# -- what the pages and the API say of a run retention removed ---------------------------


def figure_as_shown(review: Review, key: str) -> str:
    """A figure as the page prints it (macros.html): one decimal, a real minus sign."""
    value = review.figure(key)
    assert value is not None
    return f"{value:.1f}".replace("-", "\N{MINUS SIGN}")


async def prune_everything(database: Path) -> None:
    """Retention a year from now, on the real file (the server stopped): every
    finished run goes, its export kept for the project's history (the review's
    tables, as the server's review app adds them)."""
    store = SqliteStore(database)
    store.add_tables(HISTORY)
    await store.open()
    try:
        later = T0 + 10 * 365 * 86_400.0
        step = await store.prune_finished(now=later, before=later, after=None, scan=100)
        assert step.removed["runs"] == 2 and step.removed["project_exports"] == 2
    finally:
        await store.close()


def test_an_export_whose_run_retention_removed_keeps_its_review_without_a_dead_link(
        server_factory: Any, tmp_path: Path) -> None:
    server: Server = server_factory({"AGENTBOX_AGENTS": ""}).start()  # the mix review
    project, page = "Archive Song", "/projects/Archive%20Song"

    def export(mix: Path) -> dict[str, Any]:
        answer = server.post(make_event(payload={"project_id": project,
                                                 "mix_url": str(mix)}))
        assert answer.status_code == 202, answer.text
        return server.wait_terminal(answer.json()["run_id"], timeout=90)

    reviewed = export(tone(tmp_path / "first.wav", seconds=2.0))
    # a render cut short, written an hour ago: a failed export (a file that is not
    # audio at all is no export: docs/review.md, "Not audio, not a project")
    broken = tone(tmp_path / "cut-short.wav", seconds=2.0)
    broken.write_bytes(broken.read_bytes()[:20_000])
    an_hour_ago = time.time() - 3600
    os.utime(broken, (an_hour_ago, an_hour_ago))
    failed = export(broken)
    assert (reviewed["status"], failed["status"]) == ("succeeded", "failed_permanent")
    review = Review.of(reviewed["result"])
    assert review is not None
    server.stop()
    asyncio.run(prune_everything(server.home / "data" / "agentbox.sqlite3"))
    server.start()

    # The API: 404 run_not_found as before, saying where the export went.
    gone = server.client.get(f"/runs/{reviewed['run_id']}")
    assert (gone.status_code, gone.json()["error_code"]) == (404, "run_not_found")
    assert "retention removed it" in gone.json()["message"]
    assert "GET /exports?project=Archive%20Song" in gone.json()["message"]
    never = server.client.get("/runs/run_never_was")
    assert never.json()["message"] == "No run has the id 'run_never_was'."
    exports = server.client.get("/exports", params={"project": project}).json()["exports"]
    assert [(e["run_id"], e["archived"]) for e in exports] == [
        (failed["run_id"], True), (reviewed["run_id"], True)]
    assert exports[1]["result"] == reviewed["result"]

    # The project page and the home page: the verdict and readings, no dead link.
    shown = server.client.get(page).text
    for run in (reviewed, failed):
        assert f'href="/ui/runs/{run["run_id"]}"' not in shown
    row = shown[shown.index(f'data-run-id="{reviewed["run_id"]}"'):]
    row = row[:row.index("</tr>")]
    assert "first.wav" in row and "run removed by retention" in row
    assert f'class="verdict {review.verdict}' in row
    for key in ("integrated_lufs", "true_peak_dbtp"):
        assert figure_as_shown(review, key) in row
    home = server.client.get("/").text
    assert f'href="/ui/runs/{failed["run_id"]}"' not in home and "data-archived" in home

    # The run's own page says what happened and where the review is kept.
    removed = server.client.get(f"/ui/runs/{reviewed['run_id']}")
    assert removed.status_code == 404
    assert "Retention removed run" in removed.text and f'href="{page}"' in removed.text
    # and its mix still plays: the project shows it, so the archive keeps its bytes
    audio = server.client.get(f"/runs/{reviewed['run_id']}/audio")
    assert audio.status_code == 200
    assert audio.content == (tmp_path / "first.wav").read_bytes()

    # A new export is compared with the archived one, which is not linked either.
    later = export(tone(tmp_path / "second.wav", seconds=2.0, level=0.5))
    assert later["status"] == "succeeded"
    assert later["result"]["comparison"]["previous_run_id"] == reviewed["run_id"]
    told = server.client.get(f"/ui/runs/{later['run_id']}").text
    previous = told[told.index('id="previous"'):]
    assert "previous" in previous and f'/ui/runs/{reviewed["run_id"]}' not in previous
