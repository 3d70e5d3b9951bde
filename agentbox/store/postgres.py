"""PostgreSQL engine: several agentbox instances share one database.

The operations are the SQLite engine's (the modules by topic); the statements
are this engine's own (`queries/postgres/`). What differs:

- Ingests and outcomes of a batch are written set-wise: one statement stores
  all its events (keys, events, runs), one records all its outcomes.
- The writer is a thread with its own connection. It runs every queued
  operation in one transaction and commits once (group commit): one WAL flush
  for many requests, with `synchronous_commit` on. A batch of only
  non-durable operations (claims, leases, delivery bookkeeping) commits with
  `synchronous_commit` off, as SQLite's does without an fsync.
- Idempotency keys are claimed with `INSERT ... ON CONFLICT`: a key another
  instance is inserting makes this one wait for that commit, then see a
  duplicate. A batch's keys are taken in sorted order, so two writers never
  wait on each other in a cycle; a deadlock or serialization failure (from
  anything else) makes the writer run the batch again.
- An operation that raises (a refusal or a bug: writer.py says the rule) is
  undone by running the batch again without it: PostgreSQL takes back one
  operation's writes only with a savepoint around each, a round trip apiece.
- Claims take rows `FOR UPDATE SKIP LOCKED`: instances never claim the same run
  or notification, and never wait for each other to claim.
- Every commit that made runs claimable, queued callbacks or changed runs
  is followed by one `NOTIFY agentbox`; each instance LISTENs, so an idle one
  starts a run another instance accepted at once, and status pages on every
  instance see every change. The NOTIFY goes in a transaction of its own right
  after the durable commit, not inside it: PostgreSQL holds one lock for every
  notifying commit of the server until it is durable, so notifying inside made
  all instances' commits wait for each other's WAL flushes. One lost between
  the two (the connection died) only delays: idle dispatchers look every few
  seconds. An instance reads the run changes of another's notification only
  while a status page is open on it (they are most of its payload).
- The database is `shared`: an instance releases no leases at start-up (any
  other instance may be alive and holding them, and its own previous life had
  another owner id). A dead instance's runs are taken over when their leases
  expire (the holder renews them while an agent runs).
- Every writer connection pins READ COMMITTED and `synchronous_commit`, whatever
  the server's defaults. A run's row is the lock that orders its writers: state
  changes update it, and recording a callback's delivery locks it first, so the
  next notification of the run is never left waiting for one already sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import queue
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

import psycopg
import psycopg_pool
from psycopg import errors, sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

from agentbox.store.errors import StorageUnavailable
from agentbox.store.ingest import Ingest, ingest_batch
from agentbox.store.outcomes import FinishRun, finish_batch
from agentbox.store.queries import load
from agentbox.store.records import (
    ClaimResult,
    Finish,
    IngestResult,
    Landed,
    NewEvent,
    RemoteChange,
    Transition,
)
from agentbox.store.schema import (
    MIGRATION_LOCK,
    migrate_line_postgres,
    migrate_postgres,
    migrations,
)
from agentbox.store.sqlstore import SqlStore
from agentbox.store.tables import Schema
from agentbox.store.verify import integrity_problems
from agentbox.store.writer import Batch, Db, Kept, Queued, log, on_thread

SQL = load("postgres")

CHANNEL = "agentbox"
NOTIFY_PAYLOAD_BYTES = 7000  # PostgreSQL's limit is 8000
ACTIVE_RECOUNT_SECONDS = 1.0  # other instances change the count of unfinished runs
BATCH_TRIES = 5
# A real write (a new row version, WAL to flush) that changes nothing.
SQL_PROBE = "UPDATE agentbox_schema SET applied_at = applied_at WHERE version = 1"
WRITERS = 2
LISTEN_POLL_SECONDS = 0.1  # how soon the listener notices the store closing
READERS = 4
CONNECT_TIMEOUT_SECONDS = 10
# A read waits this long for a connection; a database that refuses them answers 503.
READ_WAIT_SECONDS = 3


# Schema versions, oldest first: version N is MIGRATIONS[N - 1], recorded in agentbox_schema.
MIGRATIONS: tuple[str, ...] = tuple(migrations("postgres"))


class PgDb:
    """A writer connection as the operations see it (`writer.Db`)."""

    __slots__ = ("conn",)

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def run(self, name: str, params: Mapping[str, Any] | None = None, /) -> psycopg.Cursor[Any]:
        return self.conn.execute(SQL[name], params or None)

    def run_many(self, name: str, params: Iterable[Mapping[str, Any]], /) -> None:
        with self.conn.cursor() as cursor:
            cursor.executemany(SQL[name], params)

    def run_text(self, sql: str, params: Mapping[str, Any] | None = None, /
                 ) -> psycopg.Cursor[Any]:
        return self.conn.execute(sql, params or None)

    def array(self, values: Sequence[Any], /) -> list[Any]:
        return list(values)

    def keep_runs(self, statements: Sequence[str], rows: Sequence[Kept], /) -> None:
        """Each statement once for all the runs, set-wise: `%(rows)s`, one JSON array
        of [run_id, value, source, accepted_at]."""
        params = {"rows": json.dumps(rows, separators=(",", ":"))}
        for statement in statements:
            self.conn.execute(statement, params)

    def store_events(self, items: Sequence[NewEvent], now: float) -> list[bool]:
        """One statement for the batch's events: `store_events` (queries/postgres/ingest.sql)."""
        claimed = {row[0] for row in self.run("store_events", _store_parameters(items, now))}
        return [item.env.idempotency_key in claimed for item in items]

    def runs_of_keys(self, keys: Sequence[str], now: float) -> dict[str, list[Any]]:
        found: dict[str, list[Any]] = {}
        for key, run_id, agent, status in self.run("runs_of_key", {"keys": list(keys),
                                                                   "now": now}):
            found.setdefault(key, []).append((run_id, agent, status))
        return found

    def finish_runs(self, items: Sequence[Finish]) -> list[Landed | None]:
        """One statement for the batch's outcomes: `finish_runs` (queries/postgres/outcomes.sql)."""
        columns: dict[str, list[Any]] = {name: [] for name in (
            "run_ids", "statuses", "next_attempt_ats", "nows", "completed_ats", "results",
            "error_codes", "error_messages", "owners", "attempts")}
        for item in items:
            for name, value in (
                    ("run_ids", item.run_id), ("statuses", item.target.value),
                    ("next_attempt_ats", item.next_attempt_at), ("nows", item.now),
                    ("completed_ats", item.completed_at), ("results", item.result_json),
                    ("error_codes", item.outcome.error_code),
                    ("error_messages", item.outcome.error_message), ("owners", item.owner),
                    ("attempts", item.attempt)):
                columns[name].append(value)
        landed = {row[0]: Landed(event_pk=row[1], agent=row[2], event_id=row[3],
                                 event_type=row[4], source=row[5], callback_url=row[6])
                  for row in self.run("finish_runs", columns)}
        return [landed.get(item.run_id) for item in items]


def _store_parameters(items: Sequence[NewEvent], now: float) -> dict[str, Any]:
    """The `store_events` statement's arrays: one element per event, and per run."""
    columns: dict[str, list[Any]] = {name: [] for name in (
        "keys", "expires", "event_ids", "types", "sources", "correlations", "causations",
        "hops", "callbacks", "bodies", "webhook_ids", "run_keys", "run_ids",
        "ordinals", "agents", "statuses", "owners", "lease_untils", "error_codes",
        "error_messages")}
    for item in items:
        env = item.env
        for name, value in (
                ("keys", env.idempotency_key), ("expires", item.expires_at),
                ("event_ids", env.event_id), ("types", env.event_type),
                ("sources", env.source), ("correlations", env.correlation_id),
                ("causations", env.causation_id), ("hops", env.hop),
                ("callbacks", env.callback_url), ("bodies", item.body),
                ("webhook_ids", item.webhook_id)):
            columns[name].append(value)
        for run in item.runs:
            for name, value in (
                    ("run_keys", env.idempotency_key), ("run_ids", run.run_id),
                    ("ordinals", run.ordinal), ("agents", run.agent), ("statuses", run.status),
                    ("owners", run.owner), ("lease_untils", run.lease_until),
                    ("error_codes", run.error_code), ("error_messages", run.error_message)):
                columns[name].append(value)
    return {**columns, "now": now}


def redact(text: str, url: str | None = None) -> str:
    """`text` (by default the database URL itself) without the URL's password, for
    logs, errors and pages. The password is the one libpq reads (in the user
    part, whatever characters it holds, or as a `password=` parameter)."""
    url = text if url is None else url
    try:
        password = str(conninfo_to_dict(url).get("password") or "")
    except psycopg.ProgrammingError:  # not a URL libpq can read: show nothing of it
        return "***" if url == text else text.replace(url, "***")
    if not password:
        return text
    for form in {password, quote(password, safe=""), quote(password)}:
        text = text.replace(form, "***")
    return text


class PostgresStore(SqlStore):
    engine = "postgresql"
    dialect = "postgres"
    sql = SQL
    shared = True
    # Each batch waits for network round trips more than for the CPU: several run at
    # once, as several instances' would (same locks, same SKIP LOCKED claims).
    writers = WRITERS
    # An outcome never waits for company: a second writer commits it beside the next
    # event's batch, where one SQLite writer made that event wait for it.
    linger_seconds = 0.0

    def __init__(self, url: str, notification_delay: float = 0.0,
                 instance_id: str = "") -> None:
        super().__init__(notification_delay)
        self.url = url
        self.instance_id = instance_id
        self._executor = ThreadPoolExecutor(max_workers=self.writers,
                                            thread_name_prefix="agentbox-writer")
        # The writers' connections, each used by one batch at a time; None: reconnect.
        self._idle: queue.SimpleQueue[psycopg.Connection[Any] | None] = queue.SimpleQueue()
        self._pool: psycopg_pool.ConnectionPool[Any] | None = None
        self._readers = ThreadPoolExecutor(max_workers=READERS,
                                           thread_name_prefix="agentbox-reader")
        self._listener: threading.Thread | None = None
        self._stop_listening = threading.Event()
        self._counted_at = 0.0

    @property
    def description(self) -> str:
        return redact(self.url)

    # -- life cycle -----------------------------------------------------------------

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._open_writer)
            self._pool = psycopg_pool.ConnectionPool(
                self.url, min_size=1, max_size=READERS, open=False,
                kwargs={"autocommit": True, "row_factory": dict_row}, name="agentbox-readers",
                # a database that refused connections for a while is tried again soon
                # after (the pool's backoff would otherwise reach minutes)
                reconnect_timeout=READ_WAIT_SECONDS,
                # after a restart of the server, readers find out before a page does
                check=psycopg_pool.ConnectionPool.check_connection)
            await loop.run_in_executor(self._readers, self._open_pool)
        except psycopg.Error as exc:
            await self._abandon_open()
            raise StorageUnavailable(f"cannot open {redact(self.url)}: "
                                     f"{self._reason(exc)}") from None
        except BaseException:
            await self._abandon_open()
            raise
        self._stop_listening.clear()
        self._listener = threading.Thread(target=self._listen, args=(loop,),
                                          name="agentbox-listener", daemon=True)
        self._listener.start()
        self._start_writer()

    async def _abandon_open(self) -> None:
        await self._close_connections()
        self._executor.shutdown(wait=False)
        self._readers.shutdown(wait=False)

    def _open_writer(self) -> None:
        conn = self._connect()
        self._idle.put(conn)
        migrate_url_lines(conn, redact(self.url), self.schemas)
        with conn.transaction():  # one instance folds at a time: no two wait in a cycle
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            conn.execute(SQL["fold_run_counts"])
        self._active = conn.execute(SQL["count_active"]).fetchone()[0]  # type: ignore[index]
        self._counted_at = time.monotonic()
        for _ in range(self.writers - 1):
            self._idle.put(None)  # connected on first use

    def _open_pool(self) -> None:
        assert self._pool is not None
        self._pool.open(wait=True, timeout=CONNECT_TIMEOUT_SECONDS)

    def _connect(self) -> psycopg.Connection[Any]:
        conn = psycopg.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS,
                               application_name=f"agentbox {self.instance_id}"[:63],
                               # a connection whose peer vanished (the listener's, above
                               # all) is found dead within a minute, not hours
                               keepalives=1, keepalives_idle=30, keepalives_interval=10,
                               keepalives_count=3)
        # Whatever the server's defaults: the migration (conn.transaction() at open)
        # reads the schema version after waiting for the advisory lock and must see
        # what committed meanwhile. Write batches say so in their own BEGIN.
        conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
        return conn

    async def close(self) -> None:
        await self._stop_writer()
        self._stop_listening.set()
        if self._listener is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._listener.join, 5)
            self._listener = None
        await self._close_connections()
        self._executor.shutdown(wait=True)
        self._readers.shutdown(wait=True)

    async def _close_connections(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._idle.empty():
            conn = self._idle.get()
            if conn is not None:
                await loop.run_in_executor(self._executor, conn.close)
        if self._pool is not None:
            await loop.run_in_executor(self._readers, self._pool.close)
            self._pool = None

    # -- the writer -----------------------------------------------------------------

    async def _commit(self, loop: asyncio.AbstractEventLoop,
                      batch: list[Queued]) -> list[tuple[bool, Any]]:
        # Keys first, in order: writers on other instances lock them in the same order.
        order = sorted(range(len(batch)), key=lambda i: (batch[i].order == "", batch[i].order))
        ordered = [batch[i] for i in order]
        try:
            results, state = await on_thread(loop, self._executor, self._commit_sync, ordered)
        except psycopg.Error as exc:
            error = self._refused(f"storage unavailable: {self._reason(exc)}")
            return [(False, error)] * len(batch)
        if any(queued.durable for queued in batch):  # as in SQLite: these vouch for health
            self._took_writes()
        if state.outbox_ready:
            for listener in self.outbox_listeners:
                listener()
        # Batches commit side by side: add this one's change, or take its fresh count.
        self._active = state.active if state.recounted else self._active + (
            state.active - state.base)
        answers: list[tuple[bool, Any]] = [(False, None)] * len(batch)
        for position, index in enumerate(order):
            answers[index] = results[position]
        return answers

    def _commit_sync(self, batch: list[Queued]) -> tuple[list[tuple[bool, Any]], Batch]:
        """One transaction for the batch; run again after a deadlock, or without an
        operation that failed for a reason other than a refusal (a bug)."""
        conn = self._idle.get()
        try:
            if conn is None or conn.closed:
                conn = None
                conn = self._connect()
            return self._commit_on(conn, batch)
        except psycopg.Error:
            if conn is not None:
                with contextlib.suppress(psycopg.Error):
                    conn.close()
            conn = None  # broken or in doubt: the next batch connects again
            raise
        finally:
            self._idle.put(conn)

    def _commit_on(self, conn: psycopg.Connection[Any], batch: list[Queued]
                   ) -> tuple[list[tuple[bool, Any]], Batch]:
        answered: dict[int, tuple[bool, Exception]] = {}  # left out of the next round
        alone: set[int] = set()  # run one by one, not with the rest of their kind
        durable = any(queued.durable for queued in batch)
        db = PgDb(conn)
        # The transaction's edges share round trips with their neighbours (several
        # statements in one simple query): a writer thread that waits on the server
        # less often also waits less for the GIL.
        # Whatever the server's defaults: the claims and duplicate checks rely on each
        # statement seeing what committed before it, and a 202 waits for the WAL flush.
        begin = ("BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL synchronous_commit TO "
                 + ("ON" if durable else "OFF"))
        deadlocks = 0
        while True:  # each round that fails an operation leaves more of them out
            try:
                try:
                    conn.execute(begin)
                    state = self._batch_state(conn)
                    results = self._run_ops(db, state, batch, answered, alone)
                    if results is None:
                        raise _RunAgain
                    announcement = self._announcement(conn, state, results)
                    conn.execute("COMMIT")
                    if announcement:
                        self._announce(conn, announcement)
                except BaseException:
                    if not conn.closed:
                        with contextlib.suppress(psycopg.Error):
                            conn.execute("ROLLBACK")
                    raise
                return results, state
            except _RunAgain:
                continue
            except (errors.DeadlockDetected, errors.SerializationFailure):
                deadlocks += 1
                if deadlocks >= BATCH_TRIES:
                    raise
                log.info("a write batch met another's; running it again",
                         extra={"operations": len(batch), "attempt": deadlocks})

    def _announce(self, conn: psycopg.Connection[Any], announcement: str) -> None:
        """Send the announcement after the commit; the batch committed whatever
        happens here (a wake-up lost is a wake-up late)."""
        try:
            conn.execute(announcement)
        except psycopg.Error as exc:
            log.warning("could not notify the other instances",
                        extra={"reason": self._reason(exc)})

    def _batch_state(self, conn: psycopg.Connection[Any]) -> Batch:
        state = Batch(self._active, self.keeps)
        if time.monotonic() - self._counted_at >= ACTIVE_RECOUNT_SECONDS:
            # Other instances start and finish runs too: count them all now and then.
            self._counted_at = time.monotonic()
            state.active = state.base = conn.execute(SQL["count_active"]).fetchone()[0]  # type: ignore[index]
            state.recounted = True
        return state

    @staticmethod
    def _run_ops(db: PgDb, state: Batch, batch: list[Queued],
                 answered: dict[int, tuple[bool, Exception]],
                 alone: set[int]) -> list[tuple[bool, Any]] | None:
        """Each operation's answer; None when one raised (a refusal or a bug): it
        is `answered` and the batch runs again without it. Ingests and plain
        outcomes go first, each kind in a few set-wise statements for the whole
        batch (the hot path); the rest one by one, and so do those of a kind
        that raised together (which of them is at fault, only alone they say).
        """
        done: dict[int, tuple[bool, Any]] = {}
        for kind, run_together in ((Ingest, ingest_batch), (FinishRun, finish_batch)):
            indexes = [i for i, queued in enumerate(batch) if isinstance(queued.op, kind)
                       and i not in answered and i not in alone]
            if not indexes:
                continue
            try:
                answers = run_together(db, state, [batch[i].op for i in indexes])  # type: ignore[misc]
            except Exception as exc:
                if _storage_failed(exc):
                    raise
                if len(indexes) == 1:
                    answered[indexes[0]] = (False, exc)
                else:
                    alone.update(indexes)
                return None
            done.update(zip(indexes, answers, strict=True))
        results: list[tuple[bool, Any]] = []
        for index, queued in enumerate(batch):
            if index in answered:
                results.append(answered[index])
                continue
            if index in done:
                results.append(done[index])
                continue
            try:
                results.append((True, queued.op(db, state)))
            except Exception as exc:
                if _storage_failed(exc):
                    raise
                answered[index] = (False, exc)
                return None
        return results

    def _announcement(self, conn: psycopg.Connection[Any], state: Batch,
                      results: list[tuple[bool, Any]]) -> str:
        """The statement that NOTIFYs the other instances, to run once the batch has
        committed, in a transaction of its own that does not wait for a WAL flush
        (the lock NOTIFY takes at commit is then held for microseconds); or nothing
        to say."""
        transitions = [t for ok, value in results if ok for t in _transitions(value)]
        if not (state.runs_ready or state.outbox_ready or transitions):
            return ""
        payloads = _payloads({"from": self.instance_id, "runs": state.runs_ready,
                              "outbox": state.outbox_ready}, transitions)
        return "SELECT set_config('synchronous_commit', 'off', true), " + ", ".join(
            f"pg_notify('{CHANNEL}', {sql.Literal(payload).as_string(conn)})"
            for payload in payloads)

    async def _abandon(self) -> None:
        pass  # a batch that failed put its connection back rolled back, or dropped it

    def _reason(self, exc: BaseException) -> str:
        return _reason(exc, self.url)

    def _probe_write(self, db: Db, state: Batch) -> None:
        assert isinstance(db, PgDb)
        db.conn.execute(SQL_PROBE)

    # -- LISTEN ---------------------------------------------------------------------

    def _listen(self, loop: asyncio.AbstractEventLoop) -> None:
        """Hand other instances' notifications to the event loop; reconnect when cut."""
        backoff = 0.5
        own = json.dumps({"from": self.instance_id})[:-1] + ","  # how our payloads start
        while not self._stop_listening.is_set():
            try:
                with self._connect() as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    backoff = 0.5
                    # Whatever was sent while we were not listening: look again now.
                    loop.call_soon_threadsafe(self._remote, None)
                    while not self._stop_listening.is_set():
                        for note in conn.notifies(timeout=LISTEN_POLL_SECONDS):
                            if not note.payload.startswith(own):  # ours: announced here
                                loop.call_soon_threadsafe(self._remote, note.payload)
            except psycopg.Error as exc:
                if self._stop_listening.is_set():
                    return
                log.warning("listening for other instances failed; trying again",
                            extra={"reason": self._reason(exc)})
                self._stop_listening.wait(backoff)
                backoff = min(backoff * 2, 10.0)
            except RuntimeError:  # the event loop closed under us: shutting down
                return

    def _remote(self, payload: str | None) -> None:
        if payload is None:
            change = RemoteChange(runs_ready=True, outbox_ready=True, transitions=())
        else:
            try:
                message = _read_announcement(payload, self.remote_transitions_wanted())
            except ValueError:
                return
            change = RemoteChange(
                runs_ready=bool(message.get("runs")), outbox_ready=bool(message.get("outbox")),
                transitions=_announced_changes(message.get("changes", ())))
        for listener in list(self.remote_listeners):
            try:
                listener(change)
            except Exception:
                log.exception("a listener failed on another instance's change")

    # -- reads ----------------------------------------------------------------------

    async def _rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[Any]:
        if self._pool is None:
            raise StorageUnavailable("the store is closed")
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._readers, self._read, sql, params)
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            raise StorageUnavailable(f"storage unavailable: {self._reason(exc)}") from None

    _slow_rows = _rows

    def _read(self, sql: str, params: Mapping[str, Any] | None) -> list[Any]:
        assert self._pool is not None
        with self._pool.connection(timeout=READ_WAIT_SECONDS) as conn:
            rows: list[Any] = conn.execute(sql, params or None).fetchall()
            return rows


def _reason(exc: BaseException, url: str) -> str:
    """An error's kind and first line, never the password."""
    lines = str(exc).strip().splitlines()
    return redact(f"{type(exc).__name__}: {lines[0] if lines else ''}", url)


class _RunAgain(Exception):
    pass


# What psycopg raises for a mistake in the statement or its values (a constraint
# broken, a type that does not fit, a parameter missing): a bug of the operation
# that ran it; the batch runs again without it. The rest (connection lost, disk
# full, the server shutting down, a read-only database) is the storage's.
_MISTAKES = (psycopg.IntegrityError, psycopg.ProgrammingError, psycopg.DataError,
             psycopg.NotSupportedError)


def _storage_failed(exc: Exception) -> bool:
    """Did an operation fail because the storage did (the whole batch fails)?"""
    return isinstance(exc, psycopg.Error) and not isinstance(exc, _MISTAKES)


def _announced(transition: Transition) -> dict[str, Any]:
    """A change as other instances are told of it: its fields by name, without the
    runs and events it carries (those are announced on their own)."""
    return {field.name: getattr(transition, field.name)
            for field in dataclasses.fields(transition)
            if field.name not in ("spawned", "emitted")}


CHANGES_KEY = ', "changes": ['  # where an announcement's head ends (_payloads)


def _payloads(head: dict[str, Any], transitions: Sequence[Transition]) -> list[str]:
    """The head (who, runs to claim, callbacks to send) and the run changes, each
    change encoded once, in payloads under PostgreSQL's size limit."""
    chunks: list[list[str]] = [[]]
    size = 0
    for t in transitions:
        row = json.dumps(_announced(t))
        if chunks[-1] and size + len(row) > NOTIFY_PAYLOAD_BYTES:
            chunks.append([])
            size = 0
        chunks[-1].append(row)
        size += len(row) + 1
    opening = json.dumps(head)[:-1] + CHANGES_KEY
    return [opening + ",".join(chunk) + "]}" for chunk in chunks]


def _read_announcement(payload: str, changes: bool) -> dict[str, Any]:
    """Another instance's announcement; without its changes unless asked for: every
    instance reads every other one's, and the changes are most of the payload."""
    head, found, _ = payload.partition(CHANGES_KEY)
    message: dict[str, Any] = json.loads(payload if changes or not found else head + "}")
    return message


def _announced_changes(changes: Any) -> tuple[Transition, ...]:
    """The changes another instance announced, read back by name. One in a form
    this version does not read (an older agentbox's, during an upgrade) is left
    out: the page then learns of it at its next refresh."""
    found = []
    for change in changes:
        try:
            found.append(Transition(**change))
        except TypeError:
            continue
    return tuple(found)


def _transitions(value: Any) -> list[Transition]:
    """The run changes an operation's answer carries, spawned runs included."""
    if isinstance(value, Transition):
        return [value, *value.spawned]
    if isinstance(value, ClaimResult | IngestResult):
        return list(value.transitions)
    return []  # accepted runs show once claimed, as on the instance that accepted them


def migrate_url_lines(conn: psycopg.Connection[Any], where: str,
                      schemas: Sequence[Schema] = ()) -> tuple[int, int]:
    """The store's own versions, then each app's line; (from, to) of the store's own."""
    versions = migrate_postgres(conn, where, MIGRATIONS)
    for schema in schemas:
        migrate_line_postgres(conn, where, schema.line, schema.migrations("postgres"))
    return versions


def migrate_url(url: str, schemas: Sequence[Schema] = ()) -> tuple[int, int]:
    """`agentbox migrate` for a PostgreSQL store."""
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS) as conn:
            return migrate_url_lines(conn, redact(url), schemas)
    except psycopg.Error as exc:
        raise StorageUnavailable(f"cannot migrate {redact(url)}: {_reason(exc, url)}") from None


def verify_url(url: str) -> list[str]:
    """`agentbox verify` for a PostgreSQL store: the shared invariants, read-only."""
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS,
                             options="-c default_transaction_read_only=on") as conn:
            # A database before version 10 (not migrated yet) has no kept counts.
            counted = conn.execute("SELECT to_regclass('run_counts') IS NOT NULL").fetchone()
            return integrity_problems(
                SQL, lambda sql: conn.execute(sql).fetchall(),
                skip=lambda sql: "run_counts" in sql and not (counted and counted[0]))
    except psycopg.Error as exc:
        raise StorageUnavailable(f"cannot read {redact(url)}: {_reason(exc, url)}") from None
