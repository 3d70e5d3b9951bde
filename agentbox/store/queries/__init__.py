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

A rule several statements of a file share is written once, as a part:
`-- part: <name>(<argument>, ...)` starts it, and a statement (or another part)
of the same file says `{<name>(<value>, ...)}` where it belongs; the part's
`{<argument>}` stand for the values given (`{may_go(:before)}`). A part goes in
parenthesised, without its head comments.

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

_BLOCK = re.compile(r"^-- (name|part): (\S+?)(?:\((.*)\))?\s*$", re.MULTILINE)
_TRAILING_COMMENTS = re.compile(r"(\s*\n--[^\n]*)+\s*$")
_LEADING_COMMENTS = re.compile(r"^(--[^\n]*\n)+")
_USE = re.compile(r"\{(\w+)\((.*?)\)\}")


def parse(text: str) -> dict[str, str]:
    """`{name: statement}` from a file's text, in file order, its parts put in."""
    blocks = _BLOCK.split(text)
    statements: dict[str, str] = {}
    parts: dict[str, tuple[list[str], str]] = {}
    for kind, name, arguments, body in zip(*(blocks[i::4] for i in range(1, 5)), strict=True):
        body = _TRAILING_COMMENTS.sub("", body).strip()
        if kind == "part":
            names = [word.strip() for word in (arguments or "").split(",") if word.strip()]
            parts[name] = (names, _LEADING_COMMENTS.sub("", body).strip())
        else:
            statements[name] = body
    return {name: _put_parts(body, parts) for name, body in statements.items()}


def _put_parts(text: str, parts: dict[str, tuple[list[str], str]]) -> str:
    def put(use: re.Match[str]) -> str:
        name, given = use[1], [value.strip() for value in use[2].split(",") if value.strip()]
        if name not in parts:
            raise ValueError(f"no part named {name} in this file")
        arguments, body = parts[name]
        if len(given) != len(arguments):
            raise ValueError(f"the part {name} takes {arguments}, given {given}")
        for argument, value in zip(arguments, given, strict=True):
            body = body.replace(f"{{{argument}}}", value)
        return f"({_put_parts(body, parts)})"
    return _USE.sub(put, text)


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
