"""Choosing the storage engine from the settings: SQLite, or PostgreSQL when
AGENTBOX_DATABASE_URL (`--database-url`) is set."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentbox.config import ConfigError, Settings
from agentbox.store.interface import Store

if TYPE_CHECKING:
    from types import ModuleType

POSTGRES_EXTRA = ("the PostgreSQL engine needs psycopg: install it with "
                  "pip install 'agentbox[postgres]'")


def _postgres() -> ModuleType:
    try:
        from agentbox.store import postgres
    except ImportError:
        raise ConfigError(POSTGRES_EXTRA) from None
    return postgres


def create_store(settings: Settings, instance_id: str = "") -> Store:
    delay = settings.callback_retry_schedule[0]  # before a callback's first attempt
    if settings.database_url:
        store: Store = _postgres().PostgresStore(settings.database_url, delay, instance_id)
        return store
    from agentbox.store.sqlite import SqliteStore

    return SqliteStore(settings.database_path, delay)


def describe(settings: Settings) -> str:
    """Which database, for people: the PostgreSQL URL without its password."""
    if settings.database_url:
        return str(_postgres().redact(settings.database_url))
    return str(settings.database_path)


def migrate(settings: Settings) -> tuple[int, int]:
    """Bring the schema up to date (what `agentbox migrate` and start-up do): (from, to)."""
    if settings.database_url:
        result: tuple[int, int] = _postgres().migrate_url(settings.database_url)
        return result
    from agentbox.store.sqlite import migrate_file

    return migrate_file(settings.database_path)


def verify(settings: Settings) -> list[str]:
    """The store's invariants, checked read-only: one line per problem."""
    if settings.database_url:
        problems: list[str] = _postgres().verify_url(settings.database_url)
        return problems
    from agentbox.store.sqlite import verify_database

    return verify_database(settings.database_path)
