"""The review's data on a database an earlier release wrote (every engine): the store's
versions 1 to 8 made the review's tables and the events' `project` column, and the
review's line was at version 2. Whether the review is loaded at the first open of
this code or only later, nothing is lost: the store's version 9 drops only what holds
nothing, and the review's version 3 takes the rest over (the column's values into its
run_projects). A database made with no app has no app table or column."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agentbox.archive.history import SCHEMA, History
from agentbox.store import Store
from agentbox.store.schema import (
    migrate_line_postgres,
    migrate_line_sqlite,
    migrate_postgres,
    migrate_sqlite,
    migrations,
)
from tests.store.conftest import Engine

RELEASE_VERSION = 8  # the store's schema version of the release before apps' data
RELEASE_LINE = 2  # the review's line in that release
REVIEW = "agentbox.review.agent:mix_review"
APP_TABLES = {"project_exports", "kept_audio", "project_references", "project_aliases",
              "removed_projects", "run_projects"}
Sql = Callable[[str, tuple[Any, ...]], list[Any]]


@contextlib.contextmanager
def raw(engine: Engine) -> Iterator[tuple[str, Any]]:
    """The engine's name and a connection straight to its database."""
    path = getattr(engine, "path", None)
    if path is not None:
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
            yield "sqlite", conn
        return
    import psycopg

    with psycopg.connect(engine.url, autocommit=True) as conn:  # type: ignore[attr-defined]
        yield "postgres", conn


def run(engine: Engine, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
    with raw(engine) as (name, conn):
        cursor = conn.execute(sql if name == "sqlite" else sql.replace("?", "%s"), params)
        return [tuple(row) for row in cursor.fetchall()] if cursor.description else []


def columns(engine: Engine, table: str) -> set[str]:
    with raw(engine) as (name, conn):
        if name == "sqlite":
            return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
        return {row[0] for row in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
            "AND table_schema = current_schema()", (table,))}


def tables(engine: Engine) -> set[str]:
    with raw(engine) as (name, conn):
        if name == "sqlite":
            rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        else:
            rows = conn.execute("SELECT tablename FROM pg_tables "
                                "WHERE schemaname = current_schema()")
        return {row[0] for row in rows}


def release_schema(engine: Engine) -> None:
    """The schema the release made: the store's versions 1 to 8 (the same files this
    code holds: a released version is never edited), the review's line 1 and 2."""
    with raw(engine) as (name, conn):
        core = migrations(name)[:RELEASE_VERSION]
        line = SCHEMA.migrations(name)[:RELEASE_LINE]
        if name == "sqlite":
            migrate_sqlite(conn, "release", core)
            migrate_line_sqlite(conn, "release", SCHEMA.line, line)
        else:
            migrate_postgres(conn, "release", core)
            migrate_line_postgres(conn, "release", SCHEMA.line, line)


def release_rows(engine: Engine) -> None:
    """What the release wrote: three events (two naming a project, in the events'
    `project` column; one naming none), their runs, a kept export's audio, a
    reference track, an export whose run retention removed, and a renamed project."""
    events = ((1, "e1", "night-drive"), (2, "e2", "Old Name"), (3, "e3", None))
    for pk, event_id, project in events:
        run(engine, "INSERT INTO events (pk, event_id, idempotency_key, event_type, source, "
            "received_at, body, project) VALUES (?, ?, ?, 'session.exported', 'studio', "
            "?, ?, ?)", (pk, event_id, f"studio:session.exported:{event_id}", 100.0 + pk,
                         json.dumps({"event_id": event_id}).encode(), project))
        run(engine, "INSERT INTO runs (run_id, event_pk, ordinal, agent, status, "
            "accepted_at, updated_at, completed_at, result) VALUES (?, ?, 0, ?, "
            "'succeeded', ?, ?, ?, ?)", (f"run_{pk}", pk, REVIEW, 100.0 + pk, 101.0 + pk,
                                         101.0 + pk, json.dumps({"verdict": pk})))
    run(engine, "INSERT INTO kept_audio (run_id, project, sha256, size, file_name, keeper, "
        "kept_at) VALUES ('run_1', 'night-drive', 'ab12', 10, 'a.wav', 'k1', 102.0)")
    run(engine, "INSERT INTO project_references (project, name, sha256, size, keeper, "
        "measurements, added_at) VALUES ('night-drive', 'ref.wav', 'cd34', 20, 'k1', "
        "'{\"integrated_lufs\": -14.0}', 6.0)")
    run(engine, "INSERT INTO project_exports (run_id, project, agent, status, accepted_at, "
        "completed_at, result) VALUES ('run_gone', 'night-drive', ?, 'succeeded', 1.0, 2.0, "
        "'{}')", (REVIEW,))
    run(engine, "INSERT INTO project_aliases (name, project) VALUES ('Old Name', 'Renamed')")


def open_store(engine: Engine, aio: Callable[..., Any], app: bool) -> tuple[Store, History]:
    store = engine.new_store()
    history = History(store.add_tables(SCHEMA)) if app else None
    aio(store.open())
    return store, history  # type: ignore[return-value]


@pytest.mark.parametrize("first_alone", [True, False], ids=["review-later", "review-at-once"])
def test_a_release_database_keeps_every_export_reference_and_project(
        engine: Engine, aio: Callable[..., Any], first_alone: bool) -> None:
    release_schema(engine)
    release_rows(engine)
    if first_alone:  # AGENTBOX_APPS="": the store's version 9 keeps what holds data
        store, _ = open_store(engine, aio, app=False)
        aio(store.close())
        assert "project" in columns(engine, "events")
        assert {"project_exports", "kept_audio", "project_references"} <= tables(engine)
        assert "run_projects" not in tables(engine)
    store, history = open_store(engine, aio, app=True)
    try:
        assert "project" not in columns(engine, "events")
        assert sorted(run(engine, "SELECT run_id, project FROM run_projects")) == [
            ("run_1", "night-drive"), ("run_2", "Old Name")]
        assert [aio(store.get_run(f"run_{n}")).project for n in (1, 2, 3)] == [
            "night-drive", "Old Name", None]
        assert [r.run_id for r in aio(store.search_runs(filters={"project": "night-drive"}))
                ] == ["run_1"]
        assert [r.run_id for r in aio(store.search_runs(text="Old Name"))] == ["run_2"]
        assert [(p.project, p.run_id) for p in aio(history.projects())] == [
            ("Renamed", "run_2"), ("night-drive", "run_1")]
        # version 4's summary, filled from what the release kept (run_gone: retention's)
        assert [(p.latest.project, p.exports) for p in aio(history.latest(limit=5))] == [
            ("Renamed", 1), ("night-drive", 2)]
        exports = aio(history.project_exports("night-drive"))
        assert [(e.run_id, e.archived, e.result) for e in exports] == [
            ("run_1", False, {"verdict": 1}), ("run_gone", True, {})]
        assert [e.run_id for e in aio(history.project_exports("Renamed"))] == ["run_2"]
        assert [k.run_id for k in aio(history.kept_audio("night-drive"))] == ["run_1"]
        found = aio(history.reference("night-drive"))
        assert found is not None and found.measurements == {"integrated_lufs": -14.0}
    finally:
        aio(store.close())
    assert sorted(run(engine, "SELECT line, version FROM agentbox_lines")) == [
        ("review", 1), ("review", 2), ("review", 3), ("review", 4), ("review", 5),
        ("review", 6), ("review", 7)]


def test_a_database_made_with_no_app_has_no_app_table_or_column(
        engine: Engine, aio: Callable[..., Any]) -> None:
    store, _ = open_store(engine, aio, app=False)
    aio(store.close())
    assert tables(engine) & APP_TABLES == set()
    assert "project" not in columns(engine, "events")
    store, history = open_store(engine, aio, app=True)  # the review, loaded later
    try:
        assert tables(engine) >= APP_TABLES
        assert aio(history.projects()) == []
    finally:
        aio(store.close())
    assert "project" not in columns(engine, "events")


def test_a_release_database_with_nothing_of_the_review_loses_its_tables(
        engine: Engine, aio: Callable[..., Any]) -> None:
    release_schema(engine)
    run(engine, "INSERT INTO kept_audio (run_id, project, sha256, size, file_name, keeper, "
        "kept_at) VALUES ('run_1', 'P', 'ab12', 10, 'a.wav', 'k1', 102.0)")
    store, _ = open_store(engine, aio, app=False)
    aio(store.close())
    # Only what held nothing went: the kept audio waits for the review.
    assert tables(engine) & APP_TABLES == {"kept_audio", "project_aliases",
                                           "removed_projects"}
    assert "project" not in columns(engine, "events")
