"""The storage conformance suite: every `Store` engine must pass the tests in this
folder (one file per topic).

Each engine is a small harness class in `ENGINES` (a way to make a store on a
fresh database, and a raw look at the lease columns for the invariants). The
`engine` fixture is parametrized by its keys (PostgreSQL's marked `postgres`),
so a new engine is one class and one entry. Stores always run on a real
database; time is a fake `now` that the tests move by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest

from agentbox.archive.history import SCHEMA as HISTORY
from agentbox.store import (
    Store,
)
from agentbox.store.sqlite import SqliteStore
from tests import postgres

T = TypeVar("T")

# -- engines ---------------------------------------------------------------------------


class Engine(Protocol):
    """What the suite needs from an engine besides the `Store` itself."""

    single_process: bool  # True: a second store on the same database must be refused

    def new_store(self) -> Store:
        """A new, unopened store on this engine's database (the same one every call)."""

    def leases(self) -> dict[str, tuple[str, str | None, float | None]]:
        """run_id -> (status, lease owner, lease end), read straight from the database."""

    def dispose(self) -> None:
        """Drop the database (after every store is closed)."""

    def set_schema_version(self, version: int) -> None:
        """Mark the database as migrated to `version` (as a newer agentbox would)."""

    def schema(self) -> tuple[int, set[str]]:
        """The schema version recorded, and the names of the runs table's indexes."""

    def drop_index(self, name: str) -> None:
        """Drop an index (to make the database an older version's)."""

    def drop_column(self, table: str, column: str) -> None:
        """Drop a column (to make the database an older version's)."""

    def drop_table(self, table: str) -> None:
        """Drop a table (to make the database an older version's)."""


class SqliteEngine:
    """A SQLite file in a fresh directory."""

    single_process = True  # the data directory is locked by the process that serves it

    def __init__(self, directory: Path) -> None:
        self.path = directory / "agentbox.db"

    def new_store(self) -> Store:
        return SqliteStore(self.path)

    def leases(self) -> dict[str, tuple[str, str | None, float | None]]:
        uri = f"file:{self.path}?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
            rows = conn.execute(
                "SELECT run_id, status, lease_owner, lease_expires_at FROM runs").fetchall()
        return {run_id: (status, owner, until) for run_id, status, owner, until in rows}

    def dispose(self) -> None:
        pass

    def set_schema_version(self, version: int) -> None:
        with contextlib.closing(sqlite3.connect(self.path)) as conn:
            conn.execute(f"PRAGMA user_version = {version}")

    def schema(self) -> tuple[int, set[str]]:
        with contextlib.closing(sqlite3.connect(self.path)) as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            names = conn.execute("SELECT name FROM sqlite_master WHERE type = 'index' "
                                 "AND tbl_name = 'runs'").fetchall()
        return version, {name for (name,) in names}

    def drop_index(self, name: str) -> None:
        with contextlib.closing(sqlite3.connect(self.path)) as conn:
            conn.execute(f"DROP INDEX {name}")

    def drop_column(self, table: str, column: str) -> None:
        with contextlib.closing(sqlite3.connect(self.path)) as conn:
            conn.execute(f"ALTER TABLE {table} DROP COLUMN {column}")

    def drop_table(self, table: str) -> None:
        with contextlib.closing(sqlite3.connect(self.path)) as conn:
            conn.execute(f"DROP TABLE {table}")


class PostgresEngine:
    """A fresh database on the test session's PostgreSQL server."""

    single_process = False  # instances share the database by design
    admin_url = ""  # set by the `engine` fixture from postgres_admin_url

    def __init__(self, directory: Path) -> None:
        self.url = postgres.fresh_database(self.admin_url)
        self._conn: Any = None  # for leases(), opened on first use

    def new_store(self) -> Store:
        from agentbox.store.postgres import PostgresStore

        return PostgresStore(self.url, instance_id=f"test-{uuid.uuid4().hex[:8]}")

    def leases(self) -> dict[str, tuple[str, str | None, float | None]]:
        import psycopg

        if self._conn is None:
            self._conn = psycopg.connect(self.url, autocommit=True)
        rows = self._conn.execute(
            "SELECT run_id, status, lease_owner, lease_expires_at FROM runs").fetchall()
        return {run_id: (status, owner, until) for run_id, status, owner, until in rows}

    def dispose(self) -> None:
        if self._conn is not None:
            self._conn.close()
        postgres.drop_database(self.admin_url, self.url)

    def set_schema_version(self, version: int) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("DELETE FROM agentbox_schema")
            conn.execute("INSERT INTO agentbox_schema (version, applied_at) VALUES (%s, 0)",
                         (version,))

    def schema(self) -> tuple[int, set[str]]:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            version = conn.execute("SELECT max(version) FROM agentbox_schema").fetchone()
            names = conn.execute(
                "SELECT indexname FROM pg_indexes WHERE tablename = 'runs'").fetchall()
        assert version is not None
        return version[0], {name for (name,) in names}

    def drop_index(self, name: str) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"DROP INDEX {name}")

    def drop_column(self, table: str, column: str) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE {table} DROP COLUMN {column}")

    def drop_table(self, table: str) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"DROP TABLE {table}")


ENGINES: dict[str, Callable[[Path], Engine]] = {"sqlite": SqliteEngine,
                                               "postgresql": PostgresEngine}


def prepare_engine(request: pytest.FixtureRequest, name: str) -> None:
    """PostgreSQL needs the session's server (started on first use, or skipped)."""
    if name == "postgresql":
        PostgresEngine.admin_url = request.getfixturevalue("postgres_admin_url")


def engine_params() -> list[Any]:
    """Every engine, PostgreSQL's tests marked `postgres`."""
    return [pytest.param(name, marks=[pytest.mark.postgres] if name == "postgresql" else [])
            for name in sorted(ENGINES)]


@pytest.fixture(params=engine_params())
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    prepare_engine(request, request.param)
    harness = ENGINES[request.param](tmp_path)
    yield harness
    harness.dispose()


@pytest.fixture
def aio() -> Iterator[Callable[[Awaitable[T]], T]]:
    """Run a coroutine on the test's one event loop (the store's writer lives on it)."""
    with asyncio.Runner() as runner:
        yield runner.run  # type: ignore[misc]


@pytest.fixture
def make_store(engine: Engine, aio: Callable[..., Any]) -> Iterator[Callable[[], Store]]:
    """Open a new store on the test's database; every store is closed at teardown."""
    opened: list[Store] = []

    def make() -> Store:
        store = engine.new_store()
        # The suite runs with the first app's tables (the review's history): an app's
        # line is migrated, read and written on every engine as the store's own are.
        store.add_tables(HISTORY)
        aio(store.open())
        opened.append(store)
        return store

    yield make
    for store in reversed(opened):
        aio(store.close())


@pytest.fixture
def store(make_store: Callable[[], Store]) -> Store:
    return make_store()


