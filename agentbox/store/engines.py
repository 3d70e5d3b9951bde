"""Choosing the storage engine: SQLite, or PostgreSQL when a database URL is given
(AGENTBOX_DATABASE_URL, `--database-url`).

The store reads no configuration: whoever opens it says where it is, with any
object that has the two fields of `Location` (agentbox.config.Settings has them).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from agentbox.store.errors import EngineMissing
from agentbox.store.interface import Store
from agentbox.store.tables import Schema

if TYPE_CHECKING:
    from types import ModuleType


class Location(Protocol):
    """Where the store is: a PostgreSQL URL, or else a SQLite file."""

    @property
    def database_url(self) -> str | None: ...

    @property
    def database_path(self) -> Path: ...


def _postgres() -> ModuleType:
    try:
        from agentbox.store import postgres
    except ImportError:
        raise EngineMissing("the PostgreSQL engine needs psycopg: install it with "
                            "pip install 'agentbox[postgres]'") from None
    return postgres


def create_store(where: Location, first_callback_delay: float, instance_id: str = "") -> Store:
    """The store at `where`; a callback's first attempt waits `first_callback_delay` s."""
    if where.database_url:
        store: Store = _postgres().PostgresStore(where.database_url, first_callback_delay,
                                                 instance_id)
        return store
    from agentbox.store.sqlite import SqliteStore

    return SqliteStore(where.database_path, first_callback_delay)


def describe(where: Location) -> str:
    """Which database, for people: the PostgreSQL URL without its password."""
    if where.database_url:
        return str(_postgres().redact(where.database_url))
    return str(where.database_path)


def migrate(where: Location, schemas: Sequence[Schema] = ()) -> tuple[int, int]:
    """Bring the schema up to date (what `agentbox migrate` and start-up do), the
    apps' lines (`schemas`) after the store's own: (from, to) of the store's own."""
    if where.database_url:
        result: tuple[int, int] = _postgres().migrate_url(where.database_url, schemas)
        return result
    from agentbox.store.sqlite import migrate_file

    return migrate_file(where.database_path, schemas)


def verify(where: Location) -> list[str]:
    """The store's invariants, checked read-only: one line per problem."""
    if where.database_url:
        problems: list[str] = _postgres().verify_url(where.database_url)
        return problems
    from agentbox.store.sqlite import verify_database

    return verify_database(where.database_path)
