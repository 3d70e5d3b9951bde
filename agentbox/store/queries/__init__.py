"""Each engine's SQL, read at import from its files of named statements:
`queries/<engine>/<area>.sql`, one file per area of the store (ingest, claims,
outcomes, maintenance, outbox, subscriptions, reads, retention, verify), the
same names in each engine's own words.

A file holds blocks that start with `-- name: <name>`; a block's text up to the
next one is the statement (the comments at its head included, those that head
the next section not). A name with a dot (`store_events.key`) is one step of the
named operation, which that engine writes as several statements. Callers pass
keyword parameters and name the statement; nothing builds SQL from another
dialect's text.

- SQLite: parameters `:name`. `INDEXED BY` pins the partial index a query must
  use: SQLite only takes a partial index when the query names its condition to
  the letter.
- PostgreSQL: parameters `%(name)s` (psycopg); row locks where several instances
  meet (FOR UPDATE SKIP LOCKED claims, FOR UPDATE on a run's row, FOR SHARE on a
  destination's); the hot path's writes set-wise over arrays (`store_events`,
  `finish_runs`: one statement for a whole batch). Text is COLLATE "C": run ids
  sort by time, whatever the server's locale.
"""

from __future__ import annotations

import re
from importlib.resources import files
from importlib.resources.abc import Traversable

_NAME = re.compile(r"^-- name: (\S+)\s*$", re.MULTILINE)
_TRAILING_COMMENTS = re.compile(r"(\s*\n--[^\n]*)+\s*$")


def parse(text: str) -> dict[str, str]:
    """`{name: statement}` from a file's text, in file order."""
    parts = _NAME.split(text)
    return {name: _TRAILING_COMMENTS.sub("", body).strip()
            for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def load(engine: str) -> dict[str, str]:
    """Every statement of an engine (`sqlite`, `postgres`), from all its files."""
    statements: dict[str, str] = {}
    for path in sorted(area_files(engine), key=lambda entry: entry.name):
        found = parse(path.read_text(encoding="utf-8"))
        twice = statements.keys() & found.keys()
        if twice:
            raise ValueError(f"{engine}/{path.name} names {sorted(twice)} again")
        statements.update(found)
    return statements


def area_files(engine: str) -> list[Traversable]:
    """An engine's statement files, one per area."""
    folder = files(__name__).joinpath(engine)
    return [entry for entry in folder.iterdir() if entry.name.endswith(".sql")]


def operations(statements: dict[str, str]) -> set[str]:
    """The operations a file names: `store_events.key` is a step of `store_events`."""
    return {name.split(".", 1)[0] for name in statements}
