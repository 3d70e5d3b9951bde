"""SQLite engine: one WAL file, one writer with group commit, separate readers.

Every write is an operation queued to the writer. The writer takes everything
queued, runs it in one `BEGIN IMMEDIATE ... COMMIT` and answers all of them
after the commit's fsync (`synchronous=FULL`). Many requests thus share one
fsync, and a 202 is only ever sent for data that is on disk. One failing
operation never undoes its neighbours (the rule: writer.py): one that fails
before it wrote anything is simply answered with its error; one that fails
after writing sends the batch round again with each operation inside its own
savepoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import re
import shutil
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentbox import portable
from agentbox.logs import get_logger
from agentbox.store.errors import SchemaTooNew, StorageUnavailable, StoreInUse
from agentbox.store.ingest import write_kept
from agentbox.store.queries import load
from agentbox.store.records import Finish, Landed, NewEvent
from agentbox.store.schema import migrate_line_sqlite, migrate_sqlite, migrations
from agentbox.store.sqlstore import SqlStore
from agentbox.store.tables import Schema
from agentbox.store.verify import integrity_problems
from agentbox.store.writer import Batch, Db, Kept, Operation, Queued, on_thread

# A None or bytes parameter (the ingest alone binds a dozen an event) has no adapter,
# so sqlite3 looks for one each time the slow way: a failed attribute lookup on its
# PrepareProtocol type, which formats an AttributeError (some 3,000 instructions a
# parameter: 2 % of an event's cost end to end, scripts/serve_cost.py). An adapter
# that answers the value as it is (C callables: no Python frame) binds the same NULL
# or BLOB. Only where the process registered none of its own (an agent's), so theirs
# stays theirs; the registry is sqlite3's, for the whole process.
_AS_IT_IS: dict[type, Callable[[Any], Any]] = {type(None): {}.get, bytes: bytes}
for _type, _as_it_is in _AS_IT_IS.items():
    if (_type, sqlite3.PrepareProtocol) not in sqlite3.adapters:
        sqlite3.register_adapter(_type, _as_it_is)

CHECKPOINT_INTERVAL_SECONDS = 1.0
# A WAL that grew past this size without starting over (under load it starts over
# every second, at some 25 MB at most): something holds it, said in the log. After a
# start-over SQLite also cuts the file back to this size (journal_size_limit).
WAL_WARN_BYTES = 64 * 1024 * 1024
WAL_HELD_CHECKS = 3  # ... and could not be copied back at this many checkpoints in a row
AUTO_VACUUM_INCREMENTAL = 2  # PRAGMA auto_vacuum's value for INCREMENTAL
WRITER_CACHE_KIB = 32 * 1024
# Each reader's page cache (SQLite's default is 2 MiB). A run's row holds its result
# document (a review's: some 10 KB), and the runs table is keyed by run id (WITHOUT
# ROWID), whose tree's inner pages hold whole rows: a few per page, so a lookup by run
# id steps through many pages. The run list's search for a project reads runs spread
# over the whole table: at 30,300 runs, 50 of them took 2.8 ms in SQLite with the
# default cache (the pages of one lookup pushing out another's), 0.7 ms with 16 MiB.
# Pages are cached only as they are read: a small store uses what it has.
READER_CACHE_KIB = 16 * 1024
# After the disk was full, the store takes writes again once this much is free.
PROBE_ROOM_BYTES = 1024 * 1024

SQL = load("sqlite")
log = get_logger("store")
# Schema versions, oldest first: version N is MIGRATIONS[N - 1], kept in PRAGMA
# user_version. A database made before versions existed (user_version 0) holds
# version 1's tables already; its statements only add what is missing.
MIGRATIONS: tuple[str, ...] = tuple(migrations("sqlite"))

# A named parameter (group 1), or what holds text that is none: a string literal, a
# quoted name, a comment (matched whole, so that a `:word` inside them is skipped).
_PARAMETER = re.compile(r"""'(?:[^']|'')*'|"(?:[^"]|"")*"|--[^\n]*|/\*.*?\*/"""
                        r"|(?<![:\w]):([A-Za-z_]\w*)", re.DOTALL)


def _parameters(sql: str) -> list[str]:
    """The named parameters of `sql` as they come, none from a literal or a comment."""
    return [found[1] for found in _PARAMETER.finditer(sql) if found[1]]


def positional(name: str, order: str) -> str:
    """Statement `name` with its named parameters bound by position, in `order` (a
    dict costs sqlite3 a look-up per name, on the hot path's every row). The file
    keeps the names; this checks that `order` names each of them once."""
    names = order.split()
    sql = SQL[name]
    if sorted(set(_parameters(sql))) != sorted(names) or len(set(names)) != len(names):
        raise AssertionError(f"{name} takes {sorted(set(_parameters(sql)))}, not {names}")
    return _numbered(sql, names)


def _numbered(sql: str, names: Sequence[str]) -> str:
    """`sql` with each named parameter `:name` as `?N`, N its place in `names` (a
    literal or a comment left as it is)."""
    return _PARAMETER.sub(
        lambda found: f"?{names.index(found[1]) + 1}" if found[1] else found[0], sql)


# The parameters the engine gives every `keep_runs` statement: their place in a Kept.
_KEPT_PLACES = {"run_id": 0, "value": 1, "source": 2, "accepted_at": 3}


@dataclass(frozen=True)
class _Keeping:
    """An app's `keep_runs` statement as the writer runs it: its text with the named
    parameters bound by position, `bind` (a run's values, in that order), and, for a
    statement that takes `:runs`, that parameter's place and those of `:run_id` and
    `:accepted_at` (which pick the latest run of a group: `_kept_rows`)."""

    sql: str
    bind: Callable[[Kept], list[Any]]
    runs: int = -1
    latest: tuple[int, ...] = ()


def _text(value: Any) -> Any:
    return json.dumps(value) if isinstance(value, dict | list) else value


@functools.lru_cache(maxsize=64)
def _keeping(sql: str) -> _Keeping:
    """An app's statement, made ready once (its text is the cache's key: an app's
    statements are few). Its values for a run: the engine's four, a field of the
    kept object by name (None where it has none), a list or an object as JSON text;
    `:runs` 1. `bind` is written for the statement's parameters (as
    collections.namedtuple writes its class): a run's values are one call, where a
    loop over the parameters cost more than SQLite's insert."""
    names = list(dict.fromkeys(_parameters(sql)))  # each once, in order
    places = [_KEPT_PLACES.get(name) for name in names]
    values = ["1" if name == "runs" else
              f"row[{place}]" if place in (0, 2, 3) else
              "_text(row[1])" if place == 1 else f"_text(fields.get({name!r}))"
              for name, place in zip(names, places, strict=True)]
    source = ("def bind(row):\n"
              "    fields = row[1] if isinstance(row[1], dict) else _NOTHING\n"
              f"    return [{', '.join(values)}]\n")
    scope: dict[str, Any] = {"_text": _text, "_NOTHING": {}}
    exec(source, scope)  # the names are the regex's identifiers, each quoted by repr
    runs = names.index("runs") if "runs" in names else -1
    latest = tuple(i for i, place in enumerate(places) if place in (0, 3)) if runs >= 0 else ()
    return _Keeping(_numbered(sql, names), scope["bind"], runs, latest)


def _kept_rows(rows: Sequence[Kept], keeping: _Keeping) -> list[list[Any]]:
    """A `keep_runs` statement's rows: one per run; or, when it takes `:runs`, one
    per distinct set of its other values (all but `:run_id` and `:accepted_at`),
    that of the latest of those runs (by `accepted_at`, then `run_id`) with `:runs`
    their number: a statement that counts (the review's summary of a project) then
    runs once per project a transaction names, not once per export."""
    bind = keeping.bind
    if keeping.runs < 0:
        return [bind(row) for row in rows]
    runs, skip = keeping.runs, {keeping.runs, *keeping.latest}
    groups: dict[tuple[Any, ...], tuple[tuple[float, str], list[Any]]] = {}
    for row in rows:
        values = bind(row)
        key = tuple(value for i, value in enumerate(values) if i not in skip)
        held = groups.get(key)
        if held is not None:
            values[runs] = held[1][runs] + 1
            if (row[3], row[0]) < held[0]:
                held[1][runs] = values[runs]
                continue
        groups[key] = ((row[3], row[0]), values)
    return [values for _, values in groups.values()]


# The hot path's statements, bound by position.
_EVENT = positional("store_events.event", "event_id key event_type source correlation_id "
                    "causation_id hop callback_url now body webhook_id")
_KEY = positional("store_events.key", "key event_pk expires_at now")
_RUN = positional("store_events.run", "run_id event_pk ordinal agent now")
_CLAIMED_RUN = positional("store_events.claimed_run",
                          "run_id event_pk ordinal agent owner lease_until now")
_FINISH = positional("finish_runs.run", "status next_attempt_at now completed_at result "
                     "error_code error_message run_id owner attempt")
_ATTEMPT = positional("record_attempt", "run_id attempt owner started_at finished_at outcome "
                      "error_code error_message")
_FINISHED_EVENT = positional("finish_runs.event", "event_pk")


class SqliteDb:
    """The writer's connection as the operations see it (`writer.Db`). `counting`:
    the transaction's changes of runs' states (SqliteStore._counting), which the runs
    it stores add to themselves (a trigger per row cost more than the insert)."""

    __slots__ = ("conn", "counting")

    def __init__(self, conn: sqlite3.Connection, counting: dict[str, int]) -> None:
        self.conn = conn
        self.counting = counting

    def run(self, name: str, params: Mapping[str, Any] | None = None, /) -> sqlite3.Cursor:
        return self.conn.execute(SQL[name], params or {})

    def run_many(self, name: str, params: Iterable[Mapping[str, Any]], /) -> None:
        self.conn.executemany(SQL[name], params)

    def run_text(self, sql: str, params: Mapping[str, Any] | None = None, /) -> sqlite3.Cursor:
        return self.conn.execute(sql, params or {})

    def array(self, values: Sequence[Any], /) -> str:
        return json.dumps(list(values))  # read back by json_each()

    def keep_runs(self, statements: Sequence[str], rows: Sequence[Kept], /) -> None:
        """Each statement once per run (executemany): `:run_id`, `:source`,
        `:accepted_at`, and what the app kept, `:value`, or each field of an object by
        its name (`:project`; a field the object lacks is NULL), bound by position;
        a statement that takes `:runs` once per set of its other values (`_kept_rows`).
        Row by row costs SQLite less than one pass over a JSON array of the runs: no
        text to parse, no table-valued function to start."""
        for statement in statements:
            keeping = _keeping(statement)
            self.conn.executemany(keeping.sql, _kept_rows(rows, keeping))

    def store_events(self, items: Sequence[NewEvent], now: float) -> list[bool]:
        """Row by row: the event, its key (nothing kept when the key is taken), its runs."""
        return [self._store_event(item, now) for item in items]

    def _store_event(self, item: NewEvent, now: float) -> bool:
        env = item.env
        conn = self.conn
        (event_pk,) = conn.execute(_EVENT, (
            env.event_id, env.idempotency_key, env.event_type, env.source, env.correlation_id,
            env.causation_id, env.hop, env.callback_url, now, item.body, item.webhook_id)
        ).fetchone()
        claimed = conn.execute(_KEY, (env.idempotency_key, event_pk, item.expires_at, now)
                               ).fetchone()
        if claimed is None:
            self.run("store_events.undo", {"event_pk": event_pk})
            return False
        counting = self.counting
        for run in item.runs:  # mostly one: execute() costs less than executemany() here
            counting[run.status] = counting.get(run.status, 0) + 1
            if run.status == "accepted":  # the hot path's statement binds the fewest values
                conn.execute(_RUN, (run.run_id, event_pk, run.ordinal, run.agent, now))
            elif run.status == "processing":
                conn.execute(_CLAIMED_RUN, (run.run_id, event_pk, run.ordinal, run.agent,
                                            run.owner, run.lease_until, now))
            else:
                self.run("store_events.stopped_run", {
                    "run_id": run.run_id, "event_pk": event_pk, "ordinal": run.ordinal,
                    "agent": run.agent, "now": now, "error_code": run.error_code,
                    "error_message": run.error_message})
        return True

    def runs_of_keys(self, keys: Sequence[str], now: float) -> dict[str, list[Any]]:
        found: dict[str, list[Any]] = {}
        for key in keys:
            rows = self.run("runs_of_key", {"key": key, "now": now}).fetchall()
            if rows:
                found[key] = rows
        return found

    def finish_runs(self, items: Sequence[Finish]) -> list[Landed | None]:
        return [self._finish_run(item) for item in items]

    def _finish_run(self, item: Finish) -> Landed | None:
        conn = self.conn
        outcome = item.outcome
        status = item.target.value
        landed = conn.execute(_FINISH, (
            status, item.next_attempt_at, item.now, item.completed_at, item.result_json,
            outcome.error_code, outcome.error_message, item.run_id, item.owner, item.attempt)
        ).fetchone()
        if landed is None:
            return None  # lease lost: another holder owns this run now
        event_pk, attempt_started_at, agent = landed
        conn.execute(_ATTEMPT, (item.run_id, item.attempt, item.owner, attempt_started_at,
                                item.now, status, outcome.error_code, outcome.error_message))
        event_id, event_type, source, callback_url = conn.execute(
            _FINISHED_EVENT, (event_pk,)).fetchone()
        return Landed(event_pk=event_pk, agent=agent, event_id=event_id, event_type=event_type,
                      source=source, callback_url=callback_url)


class SqliteStore(SqlStore):
    engine = "sqlite"
    dialect = "sqlite"
    sql = SQL

    def __init__(self, path: Path, notification_delay: float = 0.0) -> None:
        super().__init__(notification_delay)
        self.path = path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentbox-writer")
        self._conn: sqlite3.Connection | None = None  # writer's; used only on its thread
        self._reader: sqlite3.Connection | None = None  # event loop's
        self._synchronous_full = True
        self._stats_executor = ThreadPoolExecutor(max_workers=1,
                                                  thread_name_prefix="agentbox-stats")
        self._stats_conn: sqlite3.Connection | None = None  # used on that thread only
        self._checkpointer = ThreadPoolExecutor(max_workers=1,
                                                thread_name_prefix="agentbox-checkpoint")
        self._checkpoint_task: asyncio.Task[None] | None = None
        self._written = asyncio.Event()  # a commit changed rows since the last checkpoint
        self._checkpoint_due = False
        self._wal_held = False  # said in the log: the WAL cannot start over
        self._wal_seen = (0, 0)  # frames in the WAL and copied back, at the last checkpoint
        self._wal_growing = 0  # checkpoints in a row that found it held
        self._page_size = 4096  # the database's, read at open
        self._lock_file: portable.HeldLock | None = None
        self._identity: tuple[int, int] | None = None  # the database file we opened
        # The runs by state (version 11): counted at open, then changed by what each
        # committed transaction changed (`_counting`: the runs the ingest stores, and
        # every other change as the writer's triggers tell it; undone with a
        # savepoint's or a transaction's rollback).
        self.run_counts: Counter[str] = Counter()
        self._counting: dict[str, int] = {}

    @property
    def description(self) -> str:
        return str(self.path)

    # -- life cycle -----------------------------------------------------------------

    async def open(self) -> None:
        _private(self.path)
        self._lock_file = _lock_exclusively(self.path.with_suffix(".lock"))
        loop = asyncio.get_running_loop()
        try:
            self._active = await loop.run_in_executor(self._executor, self._open_writer)
            self._reader = _connect(self.path, by_name=True)
            # Now, not at the first count: opened after the file was removed, it would
            # fail (a 500 on the page) and make a new, empty database in its place.
            self._stats_conn = await loop.run_in_executor(self._stats_executor, _connect,
                                                          self.path, True)
        except (sqlite3.Error, SchemaTooNew) as exc:
            await self._close_connections()
            self._lock_file.close()  # another process may serve the store now
            self._lock_file = None
            if isinstance(exc, SchemaTooNew):
                raise
            raise StorageUnavailable(f"cannot open {self.path}: {exc}") from exc
        self._start_writer()
        self._checkpoint_task = asyncio.create_task(self._checkpoint_loop(),
                                                    name="agentbox-checkpoint")
        self._written.set()  # what opening wrote (a migration, say)

    async def close(self) -> None:
        if self._checkpoint_task is not None:
            self._checkpoint_task.cancel()
            await asyncio.gather(self._checkpoint_task, return_exceptions=True)
            self._checkpoint_task = None
        await self._stop_writer()
        await self._close_connections()
        self._executor.shutdown(wait=True)
        self._checkpointer.shutdown(wait=True)
        self._stats_executor.shutdown(wait=True)
        if self._lock_file is not None:
            self._lock_file.close()  # closing the descriptor drops the lock
            self._lock_file = None

    async def _close_connections(self) -> None:
        """Each on the thread that uses it."""
        loop = asyncio.get_running_loop()
        if self._conn is not None:
            await loop.run_in_executor(self._executor, self._conn.close)
            self._conn = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._stats_conn is not None:
            await loop.run_in_executor(self._stats_executor, self._stats_conn.close)
            self._stats_conn = None

    def _open_writer(self) -> int:
        conn = _connect(self.path)
        try:
            migrate(conn, self.path, self.schemas)
            reclaimable(conn, self.path)
        except BaseException:
            conn.close()
            raise
        # Checkpoints run on their own thread and between batches (below), never
        # inside a commit that requests are waiting for.
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        # A WAL left by a crash is copied back now, before any request waits on the
        # writer, so that checkpoints between batches only ever copy a second's writes.
        with contextlib.suppress(sqlite3.Error):  # busy or failing: the next one
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute(f"PRAGMA cache_size = -{WRITER_CACHE_KIB}")
        conn.execute(f"PRAGMA journal_size_limit = {WAL_WARN_BYTES}")
        self._page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        self.run_counts = Counter(dict(conn.execute(SQL["fold_run_counts"]).fetchall()))
        conn.create_function("agentbox_run_counted", 2, self._counted)
        conn.executescript(SQL["fold_run_counts.triggers"])
        self._conn = conn
        self._identity = _file_identity(self.path)
        active: int = conn.execute(SQL["count_active"]).fetchone()[0]
        return active

    async def _checkpoint_loop(self) -> None:
        """Copy the WAL back into the database file a second after writes (and not
        at all while nothing is written: an idle process stays asleep).

        A checkpoint beside a writer that commits without pause never catches up:
        the frames committed while it copies are left over, and SQLite starts the
        WAL over only once every frame is copied. Under load the WAL then grew by
        every commit, and every commit's fsync, an append, had to write the file's
        size too. So the bulk is copied here, on this thread (PASSIVE: it blocks
        nobody), and what is left over by the writer between two batches
        (`_after_batch`), outside any transaction: the frames of the commits that
        landed meanwhile, or none, and no sync then. The writer's next commit
        starts the WAL over from its beginning.
        """
        loop = asyncio.get_running_loop()
        conn = await loop.run_in_executor(self._checkpointer, _connect, self.path)
        try:
            while True:
                await self._written.wait()
                await asyncio.sleep(CHECKPOINT_INTERVAL_SECONDS)  # one for a second's writes
                self._written.clear()
                self._watch_wal(await loop.run_in_executor(self._checkpointer, _checkpoint,
                                                           conn))
                self._checkpoint_due = True  # the rest, after the writer's next batch
        finally:
            await asyncio.shield(loop.run_in_executor(self._checkpointer, conn.close))

    def _watch_wal(self, checkpointed: tuple[int, int] | None) -> None:
        """Say so in the log when the WAL has not started over for a while, and when
        it did again.

        Without a reader in the way the WAL starts over every checkpoint interval.
        A reader that holds an old snapshot (another program with the database open
        in a transaction, a backup) keeps every later frame in it: the file then
        grows by every commit, and so does each reader's work, for as long as it
        holds on. `checkpointed`: the checkpoint's (frames in the WAL, frames
        copied back), None if it failed."""
        if checkpointed is None:
            return
        frames, copied = checkpointed
        (frames_before, copied_before), self._wal_seen = self._wal_seen, (frames, copied)
        # Held: it grew and not a frame more could be copied back (a reader's
        # snapshot ends where the copying stops). A load that only grows copies
        # more each time, and a WAL that started over holds fewer frames.
        if frames > frames_before and copied == copied_before:
            self._wal_growing += 1
        else:
            self._wal_growing = 0
            if self._wal_held and frames < frames_before:  # it started over
                self._wal_held = False
                log.info("the WAL starts over again", extra={"database": str(self.path)})
            return
        size = frames * self._page_size
        if (not self._wal_held and self._wal_growing >= WAL_HELD_CHECKS
                and size > WAL_WARN_BYTES):
            self._wal_held = True
            log.warning("the WAL cannot start over: a reader holds an old snapshot of "
                        "the database (another program with it open in a transaction, "
                        "a backup?); it grows by every write until the reader ends",
                        extra={"database": str(self.path), "wal_bytes": size})

    # -- the writer -----------------------------------------------------------------

    async def _commit(
        self, loop: asyncio.AbstractEventLoop,
        batch: list[Queued],
    ) -> list[tuple[bool, Any]]:
        """Run the batch's operations here, then COMMIT (the fsync) on the writer thread.

        The operations are short CPU work: run on the event loop they need no
        hand-over of the GIL per statement. Only the commit waits for the disk,
        and the loop goes on serving requests meanwhile; no other write starts
        until it is done.
        """
        conn = self._conn
        assert conn is not None
        changes = conn.total_changes
        self._counting.clear()  # what a failed batch before left is none of this one's
        state = Batch(self._active, self.keeps, gather=True)
        db = SqliteDb(conn, self._counting)
        durable = any(queued.durable for queued in batch)
        if not self._same_file():
            assert self.last_error is not None
            return [(False, StorageUnavailable(self.last_error))] * len(batch)
        try:
            if durable != self._synchronous_full:
                conn.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
                self._synchronous_full = durable
            conn.execute("BEGIN IMMEDIATE")
            if any(getattr(queued.op, "background", False) for queued in batch):
                # A step of retention takes milliseconds: on the writer's thread, the
                # event loop goes on serving meanwhile.
                results = await on_thread(loop, self._executor, self._run_ops, db, state,
                                          batch)
            else:
                results = self._run_ops(db, state, batch)
            if results is not None and not _wrote_kept(db, state):
                results = None  # an app's statement failed: each operation alone says whose
            if results is None:  # an operation failed after writing: undo it alone
                conn.execute("ROLLBACK")
                self._counting.clear()
                conn.execute("BEGIN IMMEDIATE")
                state = Batch(self._active, self.keeps)
                results = [self._run_op(db, state, queued.op) for queued in batch]
            if durable:
                await on_thread(loop, self._executor, conn.execute, "COMMIT")
            else:
                conn.execute("COMMIT")  # no fsync: a write to the page cache
        except sqlite3.Error as exc:
            _rollback(conn)
            error = self._refused(_storage_reason(exc))
            return [(False, error)] * len(batch)
        self.run_counts.update(self._counting)
        if durable:  # a claim fits where an event may not: only durable writes vouch
            self._took_writes()
        if conn.total_changes != changes:
            self._written.set()
        if state.outbox_ready:
            for listener in self.outbox_listeners:
                listener()
        self._active = state.active
        return results

    async def _after_batch(self, loop: asyncio.AbstractEventLoop) -> None:
        """The rest of a checkpoint, on the writer's thread: the frames committed
        while the checkpoint thread copied the bulk. The next batch waits for it
        (under load on the machine of the README, a few milliseconds once a
        second). One writer (`writers = 1`): no commit lands meanwhile."""
        if self._checkpoint_due and self._conn is not None:
            self._checkpoint_due = False
            await loop.run_in_executor(self._executor, _checkpoint, self._conn)

    async def _abandon(self) -> None:
        _rollback(self._conn)

    def _same_file(self) -> bool:
        """Is the database file still the one we opened? Deleted or replaced under us,
        SQLite would go on writing into a file nobody can open again, and a 202 would
        promise what a restart loses: unhealthy, for good."""
        if _file_identity(self.path) == self._identity:
            return True
        self._refused(f"storage unavailable: the database file {self.path} was removed or "
                      "replaced; restart agentbox")
        return False

    def _probe_write(self, db: Db, state: Batch) -> None:
        """Room for events again, and the schema version written again (one page to
        the WAL, and its fsync). A page fits where an event may not (the WAL's unused
        end, a database at its max_page_count): the room is looked at first."""
        assert isinstance(db, SqliteDb)
        conn = db.conn
        pages, most = (conn.execute(f"PRAGMA {name}").fetchone()[0]
                       for name in ("page_count", "max_page_count"))
        if (shutil.disk_usage(self.path.parent).free < PROBE_ROOM_BYTES
                or pages + PROBE_ROOM_BYTES // self._page_size > most):
            raise sqlite3.OperationalError("database or disk is full")
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        conn.execute(f"PRAGMA user_version = {int(version)}")

    def look_around(self) -> None:
        """/healthz and the page learn of a removed file before any write does."""
        if self.healthy and self._identity is not None:
            self._same_file()

    def _runs_by_state(self, rows: Sequence[Mapping[str, Any]]) -> Mapping[str, int]:
        """The writer's own counts (version 11): `status_counts` reads no table of them."""
        return self.run_counts

    def _counted(self, was: str | None, now: str | None) -> None:
        """A run's state changed in the writer's transaction (its TEMP triggers): kept
        in `_counting` until the transaction commits."""
        counting = self._counting  # a dict: a Counter reads a missing key in Python
        if was is not None:
            counting[was] = counting.get(was, 0) - 1
        if now is not None:
            counting[now] = counting.get(now, 0) + 1

    @staticmethod
    def _run_ops(db: SqliteDb, state: Batch,
                 batch: list[Queued]) -> list[tuple[bool, Any]] | None:
        """The batch's operations without a savepoint each (a savepoint copies every
        page an operation touches, most of an event's cost): per operation (True,
        its value) or (False, the exception it raised before writing anything).
        None if one raised after writing: only a savepoint round undoes it alone."""
        conn = db.conn
        results: list[tuple[bool, Any]] = []
        for queued in batch:
            active_before, changes_before = state.active, conn.total_changes
            try:
                value = queued.op(db, state)
            except Exception as exc:
                if _storage_failed(exc):
                    raise  # the whole transaction is suspect: fail the batch
                if conn.total_changes != changes_before:
                    return None
                state.active = active_before
                results.append((False, exc))
                continue
            results.append((True, value))
        return results

    def _run_op(self, db: SqliteDb, state: Batch, op: Operation[Any]) -> tuple[bool, Any]:
        conn = db.conn
        active_before, counted_before = state.active, self._counting.copy()
        conn.execute("SAVEPOINT op")
        try:
            value = op(db, state)
        except Exception as exc:
            if _storage_failed(exc):
                raise  # the whole transaction is suspect: fail the batch
            conn.execute("ROLLBACK TO op")  # a refusal or a bug: undo this operation only
            conn.execute("RELEASE op")
            state.active = active_before
            self._counting.clear()
            self._counting.update(counted_before)
            return False, exc
        conn.execute("RELEASE op")
        return True, value

    # -- reads (own connections; WAL readers never wait for the writer) ---------------

    async def _rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[Any]:
        if self._reader is None:
            raise StorageUnavailable("the store is closed")
        return self._reader.execute(sql, params or {}).fetchall()

    async def _slow_rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[Any]:
        if self._reader is None:
            raise StorageUnavailable("the store is closed")
        return await asyncio.get_running_loop().run_in_executor(
            self._stats_executor, self._stats_read, sql, params or {})

    def _stats_read(self, sql: str, params: Mapping[str, Any]) -> list[Any]:
        if self._stats_conn is None:
            raise StorageUnavailable("the store is closed")
        return self._stats_conn.execute(sql, params).fetchall()


def migrate(conn: sqlite3.Connection, path: Path,
            schemas: Sequence[Schema] = ()) -> tuple[int, int]:
    """Bring the schema to the newest version this code knows, then each app's line;
    (from, to) of the store's own."""
    versions = migrate_sqlite(conn, str(path), MIGRATIONS)
    for schema in schemas:
        migrate_line_sqlite(conn, str(path), schema.line, schema.migrations("sqlite"))
    return versions


def reclaimable(conn: sqlite3.Connection, path: Path) -> None:
    """Make the file one that retention can shrink (auto_vacuum = INCREMENTAL).

    A new database is made so by `_connect`. One made before retention existed
    has it off, and only a VACUUM turns it on: a one-time rewrite of the whole
    file (time and free disk space about the file's size), done here, at open,
    while nothing else uses the store.
    """
    if conn.execute("PRAGMA auto_vacuum").fetchone()[0] == AUTO_VACUUM_INCREMENTAL:
        return
    started = time.monotonic()
    size = path.stat().st_size if path.exists() else 0
    log.info("making the database file shrinkable by retention (once; a full rewrite)",
             extra={"database": str(path), "bytes": size})
    conn.execute(f"PRAGMA auto_vacuum = {AUTO_VACUUM_INCREMENTAL}")
    conn.execute("VACUUM")
    log.info("the database file is shrinkable by retention",
             extra={"database": str(path), "seconds": round(time.monotonic() - started, 3),
                    "bytes": path.stat().st_size})


def migrate_file(path: Path, schemas: Sequence[Schema] = ()) -> tuple[int, int]:
    """`agentbox migrate` for a SQLite store (safe beside a running server)."""
    _private(path)
    conn = _connect(path)
    try:
        return migrate(conn, path, schemas)
    except sqlite3.Error as exc:
        raise StorageUnavailable(f"cannot migrate {path}: {exc}") from exc
    finally:
        conn.close()


def _private(path: Path) -> None:
    """The database's folder and file, made its user's alone (POSIX 0700 and 0600): it
    holds event bodies, callback URLs and subscribers' secrets. SQLite gives its -wal
    and -shm files the database file's mode."""
    portable.private_directory(path.parent)
    portable.private_file(path)


def _lock_exclusively(path: Path) -> portable.HeldLock:
    """One process serves a SQLite store: a second one would break lease recovery,
    which treats every lease found at start-up as left by a dead process."""
    try:
        return portable.hold_lock(path)
    except portable.LockHeld:
        raise StoreInUse(
            f"another agentbox process is already serving {path.parent}; stop it or use "
            "another --data-dir") from None


def _file_identity(path: Path) -> tuple[int, int] | None:
    try:
        found = path.stat()
    except OSError:
        return None
    return found.st_dev, found.st_ino


def _connect(path: Path, by_name: bool = False) -> sqlite3.Connection:
    """A connection set up as every one of the store's is (readers: `by_name`, rows
    read by column name)."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10)
    if by_name:  # a reader's
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA cache_size = -{READER_CACHE_KIB}")
    # Takes only on a database with no tables yet (a new one): retention gives the
    # space of what it removes back to the file system, a step at a time.
    conn.execute(f"PRAGMA auto_vacuum = {AUTO_VACUUM_INCREMENTAL}")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")  # every commit before a 202 is fsynced
    portable.make_sqlite_durable(conn)
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


def _checkpoint(conn: sqlite3.Connection) -> tuple[int, int] | None:
    """Copy what it can of the WAL into the database file, waiting for nobody: (frames
    in the WAL, frames copied back), or None if it failed."""
    try:
        _, frames, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    except sqlite3.Error:  # busy or failing: the next one
        return None
    return frames, copied


def _rollback(conn: sqlite3.Connection | None) -> None:
    if conn is None:
        return
    with contextlib.suppress(sqlite3.Error):  # SQLite may have rolled back already
        conn.execute("ROLLBACK")


# What sqlite3 raises for a mistake in the statement or its values (a constraint
# broken, a parameter missing, and SQLITE_ERROR: a table or column that does not
# exist, a syntax error): a bug of the operation that ran it, which undoing that
# operation alone leaves the transaction sound after. The rest (disk full, I/O
# error, a database locked or damaged) is the storage's.
_MISTAKES = (sqlite3.IntegrityError, sqlite3.ProgrammingError, sqlite3.InterfaceError,
             sqlite3.DataError, sqlite3.NotSupportedError)


def _wrote_kept(db: SqliteDb, state: Batch) -> bool:
    """Write what the batch's events gave the apps to keep (ingest.write_kept); False
    when an app's statement refused (the batch then runs again, operation by
    operation, each writing its own). A failure of the storage itself is raised."""
    try:
        write_kept(db, state)
    except Exception as exc:
        if _storage_failed(exc):
            raise
        return False
    return True


def _storage_failed(exc: Exception) -> bool:
    """Did an operation fail because the storage did (the whole batch fails)?"""
    return isinstance(exc, sqlite3.Error) and not (
        isinstance(exc, _MISTAKES) or getattr(exc, "sqlite_errorname", "") == "SQLITE_ERROR")


def _storage_reason(exc: sqlite3.Error) -> str:
    # sqlite messages name the condition (disk full, readonly, I/O error), never data.
    return f"storage unavailable: {exc}"


def verify_database(path: Path) -> list[str]:
    """Check a store's invariants without writing (safe beside a running server).

    Event, claim and runs are written in one transaction, so none of these can
    happen in normal operation; a finding means damage or a bug worth a report.
    """
    if not path.exists():
        raise StorageUnavailable(f"no database at {path}")
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        problems = [f"sqlite integrity_check: {row[0]}"
                    for row in conn.execute("PRAGMA integrity_check") if row[0] != "ok"]
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        # A database written by a version before callbacks has no outbox to check, one
        # before version 10 no kept counts.
        return problems + integrity_problems(
            SQL, lambda sql: conn.execute(sql).fetchall(),
            skip=lambda sql: any(table in sql and table not in tables
                                 for table in ("outbox", "run_counts")))
    finally:
        conn.close()
