"""An app's own tables, in the same database as the engine's, beside them.

An app (the review, say) brings a `Schema`: its migration line and its named
statements, each engine's in its own words, in its own package:

    <package>/tables/<engine>/NNN_<what>.sql    version N of the app's line
    <package>/tables/<engine>/queries.sql       `-- name:` blocks, as the store's own

The store applies each line's versions after its own (one transaction per
version, recorded in `agentbox_lines`), and gives the app a `Tables` handle: its
writes share the engine's group commit (`write`), its reads use the engine's
readers (`rows`). An app's statements may read the core tables `runs` and
`events` by the columns docs/apps.md lists; they write only the app's own.
Before retention removes finished runs, each schema's `before_prune` statement
runs in the same transaction with `:ids` (their run ids), so an app keeps what
it needs of them, and then its `forget` statement (its rows of those runs).

An app may also keep something of each event the engine stores, in the ingest's own
transaction (`keeps`: no write of its own, nothing stored without it), add fields
to a run's view (`run_fields`) and filters to the run search (`filters`): the
review's project of a run is all three.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from importlib.resources import files
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from agentbox.store.queries import parse

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

    from agentbox.events import Event
    from agentbox.store.writer import Cursor, Db

T = TypeVar("T")
_VERSION = re.compile(r"(\d{3})_\w+\.sql")
_LINE = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
CORE_LINE = "agentbox"  # the store's own versions (PRAGMA user_version, agentbox_schema)


@dataclass(frozen=True)
class Schema:
    """An app's tables: `line` names its migration line (a lowercase word, unique
    among the apps), `package` the Python package whose `tables/` folder holds its
    files; `before_prune` the statement retention runs before removing runs, and
    `kept_in` the table it writes, under whose name retention's report counts the
    rows it kept (default: the line); `<before_prune>.preview`, if the app has
    it, counts what it would keep of the runs a dry run finds `due` (a CTE of
    run_id, event_pk). `forget` runs after `before_prune`, with the same `:ids`.

    `keeps(event)`: a value the app keeps of each event stored (what JSON holds), or
    None; its statements `keep_runs` and `keep_runs.<name>` run in the ingest's
    transaction for the runs of the events that gave one (Db.keep_runs: on SQLite
    once per run, with :run_id, :source, :accepted_at and :value or the object's
    fields by name, or, taking :runs, once per set of its other values, bound to the
    latest run; on PostgreSQL once, with %(rows)s, a JSON array of [run_id,
    value, source, accepted_at]). `run_fields`:
    fields the app adds to a run's view, each the statement `run_field.<name>` (an
    expression over the run `r`). `filters`: the run search's
    filters the app brings, each the statement `search_runs.<name>` (a condition on
    the run `r` and its event `e`, with the parameter `:<name>`); a filter named
    `text` widens the search's text instead: a query of the run ids the text names
    (`SELECT run_id FROM ... WHERE ... = :text`), found by an index, not a condition
    checked on every run."""

    line: str
    package: str
    before_prune: str | None = None
    kept_in: str | None = None
    folder: str = "tables"
    forget: str | None = None
    keeps: Callable[[Event], Any] | None = None
    run_fields: tuple[str, ...] = ()
    filters: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not _LINE.fullmatch(self.line) or self.line == CORE_LINE:
            raise ValueError(f"a schema's line is a lowercase word other than {CORE_LINE!r} "
                             f"(letters, digits, _), not {self.line!r}")

    def migrations(self, engine: str) -> list[str]:
        """The line's versions for `engine` (`sqlite`, `postgres`), version 1 first."""
        folder = self._files(engine)
        numbered = sorted((int(found[1]), entry) for entry in folder.iterdir()
                          if (found := _VERSION.fullmatch(entry.name)))
        numbers = [number for number, _ in numbered]
        if numbers != list(range(1, len(numbers) + 1)):
            raise ValueError(f"{self.line} migrations for {engine}: versions {numbers}, "
                             "not 1, 2, 3...")
        return [entry.read_text(encoding="utf-8").strip() for _, entry in numbered]

    def statements(self, engine: str) -> dict[str, str]:
        """The line's named statements for `engine` (its queries.sql)."""
        entry = self._files(engine).joinpath("queries.sql")
        return parse(entry.read_text(encoding="utf-8")) if entry.is_file() else {}

    def _files(self, engine: str) -> Traversable:
        """The line's folder for `engine`, in its package. One name a step: a namespace
        package's path (no __init__.py) takes one."""
        return files(self.package).joinpath(self.folder).joinpath(engine)


class Reader(Protocol):
    """How an engine reads for a `Tables`: statement text and keyword parameters in,
    rows by column name out."""

    async def __call__(self, sql: str, params: Mapping[str, Any], slow: bool
                      ) -> list[Mapping[str, Any]]: ...


class Writer(Protocol):
    """How an engine writes for a `Tables`: the operation joins the next group commit."""

    async def __call__(self, op: Callable[[Db, Any], T], durable: bool) -> T: ...


class AppDb:
    """The writer's connection as an app's operation sees it: the app's statements
    by name, keyword parameters, lists as the engine takes them (`array`)."""

    __slots__ = ("_db", "_statements")

    def __init__(self, db: Db, statements: Mapping[str, str]) -> None:
        self._db, self._statements = db, statements

    def run(self, name: str, params: Mapping[str, Any] | None = None, /) -> Cursor:
        return self._db.run_text(self._statement(name), params)

    def run_many(self, name: str, params: Iterable[Mapping[str, Any]], /) -> None:
        for one in params:
            self._db.run_text(self._statement(name), one)

    def array(self, values: Sequence[Any], /) -> Any:
        return self._db.array(values)

    def _statement(self, name: str) -> str:
        try:
            return self._statements[name]
        except KeyError:
            raise KeyError(f"no statement named {name!r} in this app's queries.sql") from None


@dataclass
class Tables:
    """An app's handle on its tables (`Store.tables`)."""

    schema: Schema
    engine: str
    _read: Reader
    _write: Writer
    _statements: dict[str, str] = field(default_factory=dict)

    @cached_property
    def statements(self) -> dict[str, str]:
        return self._statements or self.schema.statements(self.engine)

    async def write(self, op: Callable[[AppDb], T], durable: bool = True) -> T:
        """Run `op` in the writer's next transaction (shared with other writes: one
        commit for all); its answer once that transaction committed. `op` must
        only run statements (no waiting, no I/O): the writer is shared."""
        statements = self.statements
        return await self._write(lambda db, batch: op(AppDb(db, statements)), durable)

    async def rows(self, name: str, /, **params: Any) -> list[Mapping[str, Any]]:
        """The rows of the app's statement `name`, each by column name."""
        return await self._read(self.statements[name], params, False)

    async def slow_rows(self, name: str, /, **params: Any) -> list[Mapping[str, Any]]:
        """As `rows`, for a read that may take long (a scan): off the event loop."""
        return await self._read(self.statements[name], params, True)
