"""Apps' tables on every engine (store/tables.py): a line is migrated once and
recorded by name, a newer line refuses to start, and the review's line adopts the
tables the store's own versions made before the review had a line of its own."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agentbox.archive.history import SCHEMA, History
from agentbox.store import SchemaTooNew
from tests.store.conftest import Engine

RELEASE_ROWS = (  # as the release before apps wrote them, into the tables it made
    "INSERT INTO kept_audio (run_id, project, sha256, size, file_name, keeper, kept_at) "
    "VALUES ('run_a', 'P', 'ab12', 10, 'a.wav', 'k1', 5.0)",
    "INSERT INTO project_references (project, name, sha256, size, keeper, measurements, "
    "added_at) VALUES ('P', 'ref.wav', 'cd34', 20, 'k1', '{\"integrated_lufs\": -14.0}', 6.0)",
    "INSERT INTO project_exports (run_id, project, agent, status, accepted_at, completed_at, "
    "result) VALUES ('run_gone', 'P', 'agentbox.review.agent:mix_review', 'succeeded', "
    "1.0, 2.0, '{}')",
)


@contextlib.contextmanager
def raw(engine: Engine) -> Iterator[Callable[[str], list[Any]]]:
    """SQL straight to the engine's database (what an older agentbox left there)."""
    path = getattr(engine, "path", None)
    if path is not None:
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
            yield lambda sql: conn.execute(sql).fetchall() if sql.startswith("SELECT") \
                else conn.execute(sql) and []
        return
    import psycopg

    with psycopg.connect(engine.url, autocommit=True) as conn:  # type: ignore[attr-defined]
        yield lambda sql: (conn.execute(sql).fetchall() if sql.startswith("SELECT")
                           else conn.execute(sql) and [])


def test_the_review_line_adopts_the_release_tables_with_their_rows(
        engine: Engine, aio: Callable[..., Any]) -> None:
    plain = engine.new_store()  # the store's own versions only: the release's schema
    aio(plain.open())
    aio(plain.close())
    with raw(engine) as sql:
        for statement in RELEASE_ROWS:
            sql(statement)
    store = engine.new_store()
    history = History(store.add_tables(SCHEMA))
    aio(store.open())
    try:
        assert [k.run_id for k in aio(history.kept_audio("P"))] == ["run_a"]
        found = aio(history.reference("P"))
        assert found is not None and found.measurements == {"integrated_lufs": -14.0}
        [kept] = aio(history.project_exports("P"))
        assert kept.run_id == "run_gone" and kept.archived and kept.result == {}
    finally:
        aio(store.close())
    with raw(engine) as sql:
        assert [tuple(row) for row in sql("SELECT line, version FROM agentbox_lines")] == [
            ("review", 1), ("review", 2)]


def test_a_line_newer_than_the_code_refuses_to_open(engine: Engine,
                                                    aio: Callable[..., Any]) -> None:
    store = engine.new_store()
    store.add_tables(SCHEMA)
    aio(store.open())
    aio(store.close())
    with raw(engine) as sql:
        sql("INSERT INTO agentbox_lines (line, version, applied_at) VALUES ('review', 9, 0)")
    again = engine.new_store()
    again.add_tables(SCHEMA)
    with pytest.raises(SchemaTooNew, match=r"\(review\) has schema version 9"):
        aio(again.open())
