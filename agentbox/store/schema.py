"""Schema and migrations: version N of the schema is each engine's file
`migrations/<engine>/NNN_<what>.sql` (N = NNN), applied in order, one
transaction per version (a crash leaves the previous version whole). SQLite
records the version in PRAGMA user_version, PostgreSQL in the agentbox_schema
table. A file's head says what its version brings; a version once released is
never edited (databases out there have it applied): a change is a new file.

SQLite's files (the store's and apps' lines alike) may hold two directives, since
SQLite has no ADD COLUMN IF NOT EXISTS and no conditional statements:

    -- adds column: <table> <column> <type>   added before the version runs, if missing
    -- when: <query>                          the statements that follow, up to the next
                                              `-- when:`, run only if <query> answers
                                              true (it is asked before the version runs)
"""

from __future__ import annotations

import re
import sqlite3
import time
import unicodedata
from collections.abc import Sequence
from importlib.resources import files
from typing import TYPE_CHECKING, Any

from agentbox.logs import get_logger
from agentbox.store.errors import SchemaTooNew

if TYPE_CHECKING:
    import psycopg

log = get_logger("store")

MIGRATION_LOCK = 0x6167656E74626F78  # "agentbox": pg_advisory_xact_lock's key
_ADDS_COLUMN = re.compile(r"^-- adds column: (\w+) (\w+) (\w+)$", re.MULTILINE)
_WHEN = re.compile(r"^-- when: (.+)$", re.MULTILINE)
SQL_SCHEMA_TABLE = """
CREATE TABLE IF NOT EXISTS agentbox_schema (
    version    INTEGER PRIMARY KEY,
    applied_at DOUBLE PRECISION NOT NULL
)
"""


_MIGRATION = re.compile(r"(\d{3})_\w+\.sql")


def migrations(engine: str) -> list[str]:
    """An engine's migrations (`sqlite`, `postgres`), version 1 first."""
    folder = files("agentbox.store").joinpath("migrations", engine)
    numbered = sorted((int(found[1]), entry) for entry in folder.iterdir()
                      if (found := _MIGRATION.fullmatch(entry.name)))
    numbers = [number for number, _ in numbered]
    assert numbers == list(range(1, len(numbers) + 1)), f"{engine} migrations: {numbers}"
    return [entry.read_text(encoding="utf-8").strip() for _, entry in numbered]


def nfc(text: Any) -> Any:
    return unicodedata.normalize("NFC", text) if isinstance(text, str) else None


def migrate_sqlite(conn: sqlite3.Connection, where: str,
                   steps: Sequence[str]) -> tuple[int, int]:
    """Bring a SQLite database to the newest version this code knows; (from, to)."""
    version: int = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > len(steps):
        raise SchemaTooNew(where, version, len(steps))
    conn.create_function("nfc", 1, nfc, deterministic=True)
    for number in range(version + 1, len(steps) + 1):
        conn.executescript(f"BEGIN IMMEDIATE;\n{sqlite_step(conn, steps[number - 1])}\n;\n"
                           f"PRAGMA user_version = {number};\nCOMMIT;")
        log.info("database schema migrated", extra={"version": number, "database": where})
    return version, len(steps)


def sqlite_step(conn: sqlite3.Connection, text: str) -> str:
    """A SQLite version's statements as this database needs them: the columns it adds
    that are missing added first, its `-- when:` blocks whose query is false left out
    (the module's docstring). The store holds the database alone while it migrates,
    so what the queries found still holds when the version runs."""
    added = "".join(f"ALTER TABLE {table} ADD COLUMN {column} {kind};\n"
                    for table, column, kind in _ADDS_COLUMN.findall(text)
                    if column not in _columns(conn, table))
    head, *guarded = _WHEN.split(text)
    kept = [head]
    for query, block in zip(guarded[::2], guarded[1::2], strict=True):
        if conn.execute(query).fetchone()[0]:
            kept.append(block)
    return added + "\n".join(kept)


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


def migrate_postgres(conn: psycopg.Connection[Any], where: str,
                     steps: Sequence[str]) -> tuple[int, int]:
    """Bring a PostgreSQL database to the newest version; (from, to). Instances
    starting together wait for each other on an advisory lock, so one migrates."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        conn.execute(SQL_SCHEMA_TABLE)
        row = conn.execute("SELECT coalesce(max(version), 0) FROM agentbox_schema").fetchone()
        version: int = row[0] if row else 0
        if version > len(steps):
            raise SchemaTooNew(where, version, len(steps))
        for number in range(version + 1, len(steps) + 1):
            conn.execute(steps[number - 1])
            conn.execute("INSERT INTO agentbox_schema (version, applied_at) VALUES (%s, %s)",
                         (number, time.time()))
            log.info("database schema migrated", extra={"version": number, "database": where})
    return version, len(steps)


# -- apps' lines (store/tables.py): each app's versions, recorded by line ---------------

SQL_LINES_TABLE = """
CREATE TABLE IF NOT EXISTS agentbox_lines (
    line       TEXT NOT NULL,
    version    INTEGER NOT NULL,
    applied_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (line, version)
)
"""
SQL_LINE_VERSION = "SELECT coalesce(max(version), 0) FROM agentbox_lines WHERE line = {p}"


def migrate_line_sqlite(conn: sqlite3.Connection, where: str, line: str,
                        steps: Sequence[str]) -> tuple[int, int]:
    """Bring an app's line to its newest version, one transaction per version."""
    conn.execute(SQL_LINES_TABLE)
    version: int = conn.execute(SQL_LINE_VERSION.format(p="?"), (line,)).fetchone()[0]
    if version > len(steps):
        raise SchemaTooNew(f"{where} ({line})", version, len(steps))
    for number in range(version + 1, len(steps) + 1):
        # One script, as the store's own versions: executescript commits whatever is
        # open before it runs. `line` is a checked word (tables.Schema), the rest numbers.
        record = (f"INSERT INTO agentbox_lines (line, version, applied_at) "
                  f"VALUES ('{line}', {number}, {time.time()!r})")
        conn.executescript(f"BEGIN IMMEDIATE;\n{sqlite_step(conn, steps[number - 1])}\n;\n"
                           f"{record};\nCOMMIT;")
        log.info("database schema migrated", extra={"line": line, "version": number,
                                                   "database": where})
    return version, len(steps)


def migrate_line_postgres(conn: psycopg.Connection[Any], where: str, line: str,
                          steps: Sequence[str]) -> tuple[int, int]:
    """As `migrate_line_sqlite`, under the migrations' advisory lock."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        conn.execute(SQL_LINES_TABLE)
        row = conn.execute(SQL_LINE_VERSION.format(p="%s"), (line,)).fetchone()
        version: int = row[0] if row else 0
        if version > len(steps):
            raise SchemaTooNew(f"{where} ({line})", version, len(steps))
        for number in range(version + 1, len(steps) + 1):
            conn.execute(steps[number - 1])
            conn.execute("INSERT INTO agentbox_lines (line, version, applied_at) "
                         "VALUES (%s, %s, %s)", (line, number, time.time()))
            log.info("database schema migrated", extra={"line": line, "version": number,
                                                       "database": where})
    return version, len(steps)
