"""What the SQL engines share: the schema, the statements, and every operation.

SQLite and PostgreSQL run the same operations (plain functions of a connection
and the batch they commit in) with the same SQL, written once in the form both
dialects accept. The few words that differ are marked in the statements and
rewritten by the PostgreSQL engine: `INDEXED BY` hints (SQLite only), and
row locks in comments that PostgreSQL makes real: `/*FOR UPDATE SKIP LOCKED*/`
(concurrent instances skip the rows another one is claiming), `/*FOR UPDATE*/`
and `/*FOR SHARE*/` (SQLite's writer is alone: it needs none). Each engine brings
its connection, its writer (group commit) and its reads; `SqlStore` does the rest.
"""

from __future__ import annotations

import abc
import asyncio
import json
import secrets
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from agentbox.config import origin_of
from agentbox.events import Envelope, Event
from agentbox.logs import get_logger
from agentbox.runs import TERMINAL, InvalidTransition, RunStatus, check_transition
from agentbox.store import (
    AdmissionRefused,
    ClaimedRun,
    ClaimResult,
    DeliveryResult,
    DestinationNotFound,
    Emitted,
    IngestResult,
    Lease,
    Notification,
    NotReplayable,
    Outcome,
    ProjectExport,
    RunNotFound,
    RunRef,
    StorageUnavailable,
    Store,
    Transition,
    iso,
    notification,
)

T = TypeVar("T")
log = get_logger("store")

# The schema's first version, in SQLite's words; the PostgreSQL engine derives its own.
SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    pk              INTEGER PRIMARY KEY,
    event_id        TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    event_type      TEXT NOT NULL,
    source          TEXT NOT NULL,
    correlation_id  TEXT,
    causation_id    TEXT,
    hop             INTEGER NOT NULL DEFAULT 0,
    callback_url    TEXT,
    received_at     REAL NOT NULL,
    body            BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS events_event_id ON events (event_id);
CREATE INDEX IF NOT EXISTS events_correlation ON events (correlation_id)
    WHERE correlation_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS idempotency_keys (
    key        TEXT PRIMARY KEY,
    event_pk   INTEGER NOT NULL,
    expires_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS idempotency_keys_expiry ON idempotency_keys (expires_at);
CREATE TABLE IF NOT EXISTS runs (
    run_id           TEXT PRIMARY KEY,
    event_pk         INTEGER NOT NULL REFERENCES events (pk),
    ordinal          INTEGER NOT NULL,
    agent            TEXT NOT NULL,
    status           TEXT NOT NULL,
    attempt          INTEGER NOT NULL DEFAULT 0,
    lease_owner      TEXT,
    lease_expires_at REAL,
    next_attempt_at  REAL,
    accepted_at      REAL NOT NULL,
    started_at       REAL,
    updated_at       REAL NOT NULL,
    completed_at     REAL,
    result           TEXT,
    error_code       TEXT,
    error_message    TEXT,
    replays          INTEGER NOT NULL DEFAULT 0,
    attempt_started_at REAL,
    attempt_base     INTEGER NOT NULL DEFAULT 0  -- attempt count at the last replay
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS runs_event ON runs (event_pk, ordinal);
CREATE INDEX IF NOT EXISTS runs_ready ON runs (next_attempt_at)
    WHERE status IN ('accepted', 'failed_retryable');
CREATE INDEX IF NOT EXISTS runs_leased ON runs (lease_expires_at)
    WHERE status = 'processing';
CREATE INDEX IF NOT EXISTS runs_status ON runs (status, run_id);
CREATE INDEX IF NOT EXISTS runs_completed ON runs (completed_at) WHERE completed_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS attempts (
    run_id        TEXT NOT NULL,
    attempt       INTEGER NOT NULL,
    owner         TEXT NOT NULL,
    started_at    REAL NOT NULL,
    finished_at   REAL,
    outcome       TEXT,
    error_code    TEXT,
    error_message TEXT,
    PRIMARY KEY (run_id, attempt)
) WITHOUT ROWID;
-- Notable changes that the runs and attempts rows do not show by themselves (replays).
CREATE TABLE IF NOT EXISTS run_history (
    run_id  TEXT NOT NULL,
    at      REAL NOT NULL,
    status  TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    note    TEXT
);
CREATE INDEX IF NOT EXISTS run_history_run ON run_history (run_id, at);
-- The transactional outbox: one row per callback owed, written with the state change.
CREATE TABLE IF NOT EXISTS outbox (
    pk               INTEGER PRIMARY KEY,
    notification_id  TEXT NOT NULL UNIQUE,
    run_id           TEXT NOT NULL,
    status           TEXT NOT NULL,  -- the run state it reports
    destination      TEXT NOT NULL,  -- the URL's origin
    url              TEXT NOT NULL,
    body             BLOB NOT NULL,
    state            TEXT NOT NULL DEFAULT 'pending',  -- pending, delivered, dead
    attempts         INTEGER NOT NULL DEFAULT 0,
    created_at       REAL NOT NULL,
    next_attempt_at  REAL,  -- by the schedule; while leased, the lease's end
    -- 1 when it may be sent: the earliest pending one of its run, destination not paused.
    -- Only those are in outbox_ready, so claiming never walks over rows that must wait.
    ready            INTEGER NOT NULL,
    lease_owner      TEXT,
    last_attempt_at  REAL,
    delivered_at     REAL,
    last_error       TEXT,  -- a category (timeout, http_503, ...), never a response body
    last_status_code INTEGER
);
CREATE INDEX IF NOT EXISTS outbox_ready ON outbox (next_attempt_at)
    WHERE state = 'pending' AND ready = 1;
CREATE INDEX IF NOT EXISTS outbox_pending_run ON outbox (run_id, pk) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS outbox_pending_destination ON outbox (destination)
    WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS outbox_run ON outbox (run_id, pk);
CREATE INDEX IF NOT EXISTS outbox_state ON outbox (state, pk);
-- Dead letters someone looked at and decided not to replay.
CREATE TABLE IF NOT EXISTS discarded_runs (
    run_id TEXT PRIMARY KEY,
    reason TEXT NOT NULL,
    at     REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS callback_destinations (
    destination          TEXT PRIMARY KEY,
    state                TEXT NOT NULL DEFAULT 'active',  -- active, paused
    consecutive_failures INTEGER NOT NULL DEFAULT 0,
    paused_reason        TEXT,
    paused_at            REAL,
    last_error           TEXT,
    updated_at           REAL NOT NULL
) WITHOUT ROWID;
"""
# Runs waiting for a claim, in the words of the runs_waiting index: a query names
# them so to the letter, or SQLite cannot use the index.
WAITING = "status IN ('accepted', 'failed_retryable')"
# What each later version adds to the one before, in words both engines take.
SCHEMA_CHANGES: tuple[str, ...] = (
    # 2: the oldest waiting run in one index step. Without it the run counts read
    # every waiting run's row for its accepted_at: 500 ms with half a million
    # waiting, on every /healthz.
    f"CREATE INDEX IF NOT EXISTS runs_waiting ON runs (accepted_at) WHERE {WAITING};",
)

ACTIVE = ("accepted", "processing", "failed_retryable")

SQL_FIND_KEY = "SELECT event_pk, expires_at FROM idempotency_keys WHERE key = ?"
SQL_RUNS_OF_EVENT = "SELECT run_id, agent, status FROM runs WHERE event_pk = ? ORDER BY ordinal"
SQL_INSERT_EVENT = """
INSERT INTO events (event_id, idempotency_key, event_type, source, correlation_id,
                    causation_id, hop, callback_url, received_at, body)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
RETURNING pk
"""
SQL_DELETE_EVENT = "DELETE FROM events WHERE pk = ?"
# Claims a key that is free or whose claim expired. A claim held by another
# transaction (another instance, on PostgreSQL) makes this wait for its commit,
# then return nothing: the event is a duplicate.
SQL_CLAIM_KEY = """
INSERT INTO idempotency_keys (key, event_pk, expires_at) VALUES (:key, :event_pk, :expires_at)
ON CONFLICT (key) DO UPDATE SET event_pk = excluded.event_pk, expires_at = excluded.expires_at
WHERE idempotency_keys.expires_at <= :now
RETURNING key
"""
SQL_INSERT_RUN = """
INSERT INTO runs (run_id, event_pk, ordinal, agent, status, next_attempt_at, accepted_at,
                  updated_at)
VALUES (?, ?, ?, ?, 'accepted', ?, ?, ?)
"""
# A run claimed as it is accepted (its instance had a slot free): attempt 1, leased.
SQL_INSERT_CLAIMED_RUN = """
INSERT INTO runs (run_id, event_pk, ordinal, agent, status, attempt, lease_owner,
                  lease_expires_at, accepted_at, started_at, attempt_started_at, updated_at)
VALUES (?, ?, ?, ?, 'processing', 1, ?, ?, ?, ?, ?, ?)
"""
# Which agent handled which event type on the way to an event: its ancestors,
# found by following causation ids back from the emitting run's event, within
# the chain (siblings and other renders that share a correlation id do not count).
SQL_CHAIN_HISTORY = """
WITH RECURSIVE ancestry (pk, causation_id, depth) AS (
    SELECT pk, causation_id, 0 FROM events WHERE pk = :parent
    UNION
    SELECT e.pk, e.causation_id, a.depth + 1 FROM ancestry a
    JOIN events e INDEXED BY events_event_id ON e.event_id = a.causation_id
    WHERE a.depth < 1000 AND (e.correlation_id = :chain OR e.event_id = :chain)
)
SELECT r.agent, e.event_type FROM ancestry a JOIN events e ON e.pk = a.pk
JOIN runs r ON r.event_pk = e.pk
"""
SQL_INSERT_STOPPED_RUN = """
INSERT INTO runs (run_id, event_pk, ordinal, agent, status, accepted_at, updated_at,
                  completed_at, error_code, error_message)
VALUES (?, ?, ?, ?, 'dead_lettered', ?, ?, ?, 'loop_detected', ?)
"""
SQL_INSERT_HISTORY = """
INSERT INTO run_history (run_id, at, status, attempt, note) VALUES (?, ?, ?, ?, ?)
"""
SQL_COUNT_ACTIVE = (
    "SELECT count(*) FROM runs WHERE status IN ('accepted', 'processing', 'failed_retryable')"
)
SQL_DUE_EXPIRED = """
SELECT run_id FROM runs INDEXED BY runs_leased
WHERE status = 'processing' AND lease_expires_at <= ?
ORDER BY lease_expires_at LIMIT ? /*FOR UPDATE SKIP LOCKED*/
"""
SQL_RUN_FOR_CLAIM = """
SELECT r.run_id, r.agent, r.status, r.attempt, r.accepted_at, r.attempt_base,
       e.body, e.event_id, e.event_type, e.source, r.lease_owner, r.attempt_started_at,
       e.callback_url
FROM runs r JOIN events e ON e.pk = r.event_pk WHERE r.run_id = ?
"""
SQL_CLAIM_EXPIRED = """
UPDATE runs SET status = 'processing', attempt = ?, lease_owner = ?, lease_expires_at = ?,
       attempt_started_at = ?, updated_at = ?
WHERE run_id = ?
"""
# One statement claims a whole batch of waiting runs (the hot path).
SQL_CLAIM_WAITING = """
UPDATE runs SET status = 'processing', attempt = attempt + 1, lease_owner = :owner,
       lease_expires_at = :lease_until, next_attempt_at = NULL,
       started_at = coalesce(started_at, :now), attempt_started_at = :now, updated_at = :now
WHERE run_id IN (
    SELECT run_id FROM runs INDEXED BY runs_ready
    WHERE status IN ('accepted', 'failed_retryable') AND next_attempt_at <= :now
    ORDER BY next_attempt_at LIMIT :limit /*FOR UPDATE SKIP LOCKED*/)
RETURNING run_id, agent, attempt, attempt_base, accepted_at, event_pk
"""
SQL_EVENTS_BY_PK = (
    "SELECT pk, body, event_id, event_type, source, callback_url FROM events WHERE pk IN ({})")
SQL_RECORD_ATTEMPT = """
INSERT INTO attempts
    (run_id, attempt, owner, started_at, finished_at, outcome, error_code, error_message)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (run_id, attempt) DO UPDATE SET owner = excluded.owner,
    started_at = excluded.started_at, finished_at = excluded.finished_at,
    outcome = excluded.outcome, error_code = excluded.error_code,
    error_message = excluded.error_message
"""
SQL_FINISH_RUN = """
UPDATE runs SET status = ?, lease_owner = NULL, lease_expires_at = NULL, next_attempt_at = ?,
       updated_at = ?, completed_at = ?, result = ?, error_code = ?, error_message = ?
WHERE run_id = ? AND status = 'processing' AND lease_owner = ? AND attempt = ?
RETURNING event_pk, attempt_started_at, agent
"""
SQL_EVENT_FIELDS = "SELECT event_id, event_type, source, callback_url FROM events WHERE pk = ?"
# What serialises the writers of a run's rows on PostgreSQL: whoever changes a run's
# state, or its callbacks' readiness, holds its row until commit.
SQL_LOCK_RUN = "SELECT status, attempt FROM runs WHERE run_id = ? /*FOR UPDATE*/"
# A callback queued while its destination is being paused or resumed waits for that.
SQL_LOCK_DESTINATION = (
    "SELECT state FROM callback_destinations WHERE destination = ? /*FOR SHARE*/")
SQL_EXTEND_LEASE = """
UPDATE runs SET lease_expires_at = ?
WHERE run_id = ? AND lease_owner = ? AND attempt = ? AND status = 'processing'
"""
SQL_HELD_LEASES = (
    "SELECT run_id, attempt FROM runs WHERE status = 'processing' AND lease_owner = ?")
SQL_RELEASE_LEASES = """
UPDATE runs SET lease_expires_at = ? WHERE lease_owner = ? AND status = 'processing'
"""
# A claimed attempt whose agent never started is given back (attempt_started_at NULL
# tells the next claim there is no lost attempt to record).
SQL_GIVE_BACK_ATTEMPT = """
UPDATE runs SET attempt = attempt - 1, attempt_started_at = NULL, lease_expires_at = ?,
       started_at = CASE WHEN attempt = 1 THEN NULL ELSE started_at END
WHERE run_id = ? AND lease_owner = ? AND attempt = ? AND status = 'processing'
"""
SQL_RELEASE_ALL_LEASES = "UPDATE runs SET lease_expires_at = ? WHERE status = 'processing'"
SQL_REPLAY = """
UPDATE runs SET status = 'accepted', next_attempt_at = ?, updated_at = ?, completed_at = NULL,
       error_code = NULL, error_message = NULL, result = NULL, replays = replays + 1,
       attempt_base = attempt
WHERE run_id = ?
"""
SQL_PRUNE_KEYS = """
DELETE FROM idempotency_keys WHERE key IN (
    SELECT key FROM idempotency_keys WHERE expires_at <= ? LIMIT ?)
"""
# ORDER BY ... LIMIT 1 walks the partial indexes; min() would not use them.
SQL_NEXT_WAITING = """
SELECT next_attempt_at FROM runs INDEXED BY runs_ready
WHERE status IN ('accepted', 'failed_retryable')
ORDER BY next_attempt_at LIMIT 1
"""
SQL_NEXT_LEASE_END = """
SELECT lease_expires_at FROM runs INDEXED BY runs_leased WHERE status = 'processing'
ORDER BY lease_expires_at LIMIT 1
"""
SQL_INSERT_NOTIFICATION = """
INSERT INTO outbox (notification_id, run_id, status, destination, url, body, created_at,
                    next_attempt_at, ready)
VALUES (:id, :run_id, :status, :destination, :url, :body, :now, :due,
        CASE WHEN NOT EXISTS (SELECT 1 FROM outbox INDEXED BY outbox_pending_run
                              WHERE run_id = :run_id AND state = 'pending')
             AND NOT EXISTS (SELECT 1 FROM callback_destinations
                             WHERE destination = :destination AND state = 'paused')
        THEN 1 ELSE 0 END)
ON CONFLICT (notification_id) DO NOTHING
"""
SQL_CLAIM_NOTIFICATIONS = """
UPDATE outbox SET lease_owner = :owner, next_attempt_at = :lease_until
WHERE pk IN (
    SELECT pk FROM outbox INDEXED BY outbox_ready
    WHERE state = 'pending' AND ready = 1 AND next_attempt_at <= :now
    ORDER BY next_attempt_at LIMIT :limit /*FOR UPDATE SKIP LOCKED*/)
RETURNING pk, notification_id, run_id, destination, url, body, attempts, next_attempt_at
"""
# A leased one counts too: its lease's end is when it may be sent again.
SQL_NEXT_NOTIFICATION = """
SELECT next_attempt_at FROM outbox INDEXED BY outbox_ready
WHERE state = 'pending' AND ready = 1 ORDER BY next_attempt_at LIMIT 1
"""
# The lease is the owner and the lease's end: a result reported after the lease
# ran out (and the row went out again) is dropped.
SQL_RECORD_DELIVERY = """
UPDATE outbox SET state = ?, attempts = attempts + 1, last_attempt_at = ?, delivered_at = ?,
       next_attempt_at = ?, last_error = coalesce(?, last_error), last_status_code = ?,
       lease_owner = NULL
WHERE pk = ? AND lease_owner = ? AND next_attempt_at = ? AND state = 'pending'
"""
# Once a notification is no longer pending, the next one of its run may go.
SQL_READY_NEXT_OF_RUN = """
UPDATE outbox SET ready = CASE WHEN EXISTS (
    SELECT 1 FROM callback_destinations WHERE destination = outbox.destination
    AND state = 'paused') THEN 0 ELSE 1 END
WHERE pk = (SELECT pk FROM outbox INDEXED BY outbox_pending_run
            WHERE run_id = ? AND state = 'pending' ORDER BY pk LIMIT 1)
"""
SQL_DESTINATION_STATE = (
    "SELECT state, consecutive_failures FROM callback_destinations WHERE destination = ?")
SQL_COUNT_DESTINATION_ATTEMPT = """
INSERT INTO callback_destinations (destination, consecutive_failures, last_error, updated_at)
VALUES (:destination, :failures, :error, :now)
ON CONFLICT (destination) DO UPDATE SET
    consecutive_failures = CASE WHEN :failures > 0
                           THEN callback_destinations.consecutive_failures + 1 ELSE 0 END,
    last_error = coalesce(:error, callback_destinations.last_error), updated_at = :now
RETURNING state, consecutive_failures
"""
SQL_PAUSE_DESTINATION = """
UPDATE callback_destinations SET state = 'paused', paused_reason = ?, paused_at = ?,
       updated_at = ?
WHERE destination = ? AND state = 'active'
"""
SQL_HOLD_DESTINATION = """
UPDATE outbox INDEXED BY outbox_pending_destination SET ready = 0
WHERE destination = ? AND state = 'pending' AND ready = 1
"""
SQL_RESUME_DESTINATION = """
UPDATE callback_destinations SET state = 'active', consecutive_failures = 0,
       paused_reason = NULL, paused_at = NULL, updated_at = ?
WHERE destination = ?
"""
# Resumed: the earliest pending notification of each run goes at once (a retry
# that waited out the pause does not wait longer); leased ones keep their lease.
SQL_RELEASE_DESTINATION = """
UPDATE outbox INDEXED BY outbox_pending_destination SET ready = 1,
       next_attempt_at = CASE WHEN lease_owner IS NULL AND next_attempt_at > :now THEN :now
                              ELSE next_attempt_at END
WHERE destination = :destination AND state = 'pending'
  AND NOT EXISTS (SELECT 1 FROM outbox p INDEXED BY outbox_pending_run
                  WHERE p.run_id = outbox.run_id AND p.state = 'pending' AND p.pk < outbox.pk)
"""
SQL_RELEASE_NOTIFICATIONS = """
UPDATE outbox SET next_attempt_at = ?, lease_owner = NULL
WHERE state = 'pending' AND lease_owner IS NOT NULL AND (lease_owner = ? OR ? = '*')
"""
NOTIFICATION_COLUMNS = """
notification_id, run_id, status, destination, state, attempts, created_at, next_attempt_at,
last_attempt_at, delivered_at, last_error, last_status_code, lease_owner
"""
SQL_RUN_NOTIFICATIONS = (
    f"SELECT {NOTIFICATION_COLUMNS} FROM outbox INDEXED BY outbox_run WHERE run_id = ? "
    "ORDER BY pk")
SQL_LIST_NOTIFICATIONS = f"SELECT {NOTIFICATION_COLUMNS} FROM outbox ORDER BY pk DESC LIMIT ?"
SQL_LIST_NOTIFICATIONS_BY_STATE = (
    f"SELECT {NOTIFICATION_COLUMNS} FROM outbox WHERE state = ? ORDER BY pk DESC LIMIT ?")
SQL_DESTINATIONS = """
SELECT destination, state, consecutive_failures, paused_reason, paused_at, last_error, updated_at
FROM callback_destinations ORDER BY destination
"""
SQL_PENDING_BY_DESTINATION = """
SELECT destination, count(*) FROM outbox INDEXED BY outbox_pending_destination
WHERE state = 'pending' GROUP BY destination
"""
RUN_COLUMNS = """
r.run_id, r.status, r.agent, r.attempt, r.accepted_at, r.started_at, r.updated_at,
r.completed_at, r.result, r.error_code, r.error_message, r.next_attempt_at, r.replays,
e.event_id, e.event_type, e.source, e.correlation_id, e.causation_id, e.hop,
e.idempotency_key
"""
SQL_GET_RUN = (
    f"SELECT {RUN_COLUMNS} FROM runs r JOIN events e ON e.pk = r.event_pk WHERE run_id = ?"
)
SQL_LIST_RUNS = (
    f"SELECT {RUN_COLUMNS} FROM runs r JOIN events e ON e.pk = r.event_pk "
    "ORDER BY r.run_id DESC LIMIT ?"
)
SQL_LIST_RUNS_BY_STATUS = (
    f"SELECT {RUN_COLUMNS} FROM runs r JOIN events e ON e.pk = r.event_pk "
    "WHERE r.status = ? ORDER BY r.run_id DESC LIMIT ?"
)
SQL_ATTEMPTS = """
SELECT attempt, owner, started_at, finished_at, outcome, error_code, error_message
FROM attempts WHERE run_id = ? ORDER BY attempt
"""
SQL_RUNNING_ATTEMPT = """
SELECT attempt, lease_owner, attempt_started_at FROM runs
WHERE run_id = ? AND status = 'processing'
"""
SQL_HISTORY = "SELECT at, status, attempt, note FROM run_history WHERE run_id = ? ORDER BY at"
# The project as the sender sent it, read as JSON (so however its encoder spelled
# it: escapes, spacing), compared exactly on both engines.
SQL_PROJECT = "json_extract(CAST(e.body AS TEXT), '$.payload.project_id')"
SQL_PROJECT_IS = f"{SQL_PROJECT} = ?"
EXPORT_COLUMNS = (f"r.run_id, {SQL_PROJECT} AS project, r.agent, r.status, "
                  "r.accepted_at, r.completed_at, r.result")
# Runs by state, counted on SQLite from the status index alone (a million runs: 70 ms
# here, against 490 ms when every row was read for its accepted_at), and the oldest
# waiting run's acceptance (its age), the first entry of the waiting runs' index.
SQL_STATUS_COUNTS = f"""
SELECT status, count(*), (SELECT min(accepted_at) FROM runs INDEXED BY runs_waiting
                          WHERE {WAITING})
FROM runs INDEXED BY runs_status GROUP BY status
"""



SQL_FINISHED_COUNTS = """
SELECT CAST((completed_at - ?) / ? AS INTEGER), count(*) FROM runs INDEXED BY runs_completed
WHERE completed_at >= ? GROUP BY 1
"""
SQL_INSERT_DISCARD = """
INSERT INTO discarded_runs (run_id, reason, at) VALUES (?, ?, ?)
ON CONFLICT (run_id) DO UPDATE SET reason = excluded.reason, at = excluded.at
"""


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    def __iter__(self) -> Iterator[Any]: ...


class Db(Protocol):
    """The part of a DB-API connection the operations use (sqlite3's, or the
    PostgreSQL engine's adapter over psycopg)."""

    def execute(self, sql: str, parameters: Any = ..., /) -> Any: ...
    def executemany(self, sql: str, parameters: Iterable[Any], /) -> Any: ...


def new_run_id() -> str:
    """Time-ordered (like UUIDv7): 48 bits of milliseconds, then 80 random bits.

    New runs land at the end of the primary key's B-tree, so an insert dirties
    few pages however many runs the store holds, and newest-first listing
    needs no index of its own.
    """
    return f"run_{time.time_ns() // 1_000_000:012x}{secrets.token_hex(10)}"


class Batch:
    """What the operations of one transaction share."""

    def __init__(self, active: int) -> None:
        self.active = active  # runs not yet terminal, for admission control
        self.base = active  # what `active` was at the start
        self.recounted = False  # `base` was counted in this transaction
        self.runs_ready = False  # a run became claimable: wake the dispatchers
        self.outbox_ready = False  # a callback was queued: wake the deliverers


Operation = Callable[[Db, Batch], T]


@dataclass
class Queued:
    op: Operation[Any]
    future: asyncio.Future[Any]
    durable: bool
    order: str


@dataclass(frozen=True)
class RemoteChange:
    """What another instance committed: runs to claim, callbacks to send, changes to show."""

    runs_ready: bool
    outbox_ready: bool
    transitions: tuple[Transition, ...]


class SqlStore(Store):
    """Every `Store` method, as operations and queries; the engine runs them.

    An engine implements `_write` (queue an operation for its writer, which
    commits many in one transaction: group commit), `_rows` (a short read) and
    `_slow_rows` (a count or a search that may scan: kept off the event loop).
    """

    engine = "sql"
    writers = 1  # batches committed at the same time (each on its own connection)

    def __init__(self, notification_delay: float = 0.0) -> None:
        self.notification_delay = notification_delay  # before a callback's first attempt
        self.healthy = True
        self.last_error: str | None = None
        self._active = 0  # runs not yet terminal, as of the last commit
        self._stats_future: asyncio.Future[dict[str, Any]] | None = None
        self._queue: list[Queued] = []
        self._wake = asyncio.Event()
        self._writer_task: asyncio.Task[None] | None = None
        self._closing = False
        # Told about changes other instances committed (PostgreSQL's LISTEN/NOTIFY).
        self.remote_listeners: list[Callable[[RemoteChange], None]] = []

    async def _write(self, op: Operation[T], durable: bool = True, order: str = "") -> T:
        """Queue `op` for the writer's next transaction; answer once it committed.

        `durable=False` is for writes whose loss in a power cut is harmless (a
        claim or a lease: the run is simply claimed again); a batch of only
        those may commit without waiting for the disk. `order` sorts the
        operations of a batch (idempotency keys: concurrent writers then take
        their locks in one order and never deadlock).
        """
        if self._closing:
            raise StorageUnavailable("the store is closing")
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue.append(Queued(op, future, durable, order))
        self._wake.set()
        return await future

    def _start_writer(self) -> None:
        self._writer_task = asyncio.create_task(self._write_loop(), name="agentbox-writer")

    async def _stop_writer(self) -> None:
        if self._writer_task is not None:
            self._closing = True  # the writer commits what is queued, then returns
            self._wake.set()
            await self._writer_task
            self._writer_task = None

    async def _write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        free = asyncio.Semaphore(self.writers)
        running: set[asyncio.Task[None]] = set()

        def done(task: asyncio.Task[None]) -> None:
            running.discard(task)
            free.release()

        while not (self._closing and not self._queue):
            await self._wake.wait()
            self._wake.clear()
            await free.acquire()  # what queues meanwhile joins this batch
            batch, self._queue = self._queue, []
            if not batch:
                free.release()
                continue
            task = asyncio.create_task(self._settle(loop, batch))
            running.add(task)
            task.add_done_callback(done)
        await asyncio.gather(*running)

    async def _settle(self, loop: asyncio.AbstractEventLoop, batch: list[Queued]) -> None:
        """Commit one batch and answer each of its operations."""
        try:
            results = await self._commit(loop, batch)
        except Exception as exc:  # a bug: fail this batch, keep the writer alive
            log.exception("the writer failed a batch")
            await self._abandon()
            results = [(False, StorageUnavailable(f"write failed: {type(exc).__name__}"))
                       ] * len(batch)
        for queued, (ok, value) in zip(batch, results, strict=True):
            if queued.future.done():
                continue
            if ok:
                queued.future.set_result(value)
            else:
                queued.future.set_exception(value)

    @abc.abstractmethod
    async def _commit(self, loop: asyncio.AbstractEventLoop,
                      batch: list[Queued]) -> list[tuple[bool, Any]]:
        """Run the batch's operations in one transaction and commit it: per
        operation (True, its value) or (False, the exception to raise)."""

    @abc.abstractmethod
    async def _abandon(self) -> None:
        """Roll back whatever the failed batch left open."""

    @abc.abstractmethod
    async def _rows(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[Any]:
        """A short read."""

    @abc.abstractmethod
    async def _slow_rows(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """A read that may scan many rows, off the event loop."""

    @property
    def description(self) -> str:
        """Where the data lives, for logs: never a password."""
        return self.engine

    # -- writes ---------------------------------------------------------------------

    async def ingest(
        self, event: Event, body: bytes, agents: Sequence[str], now: float, ttl: float,
        max_pending: int, max_hops: int | None = None, lease: Lease | None = None,
    ) -> IngestResult:
        env = event.envelope

        def op(conn: Db, state: Batch) -> IngestResult:
            found = _runs_of_claimed_key(conn, env.idempotency_key, now)
            if found is not None:
                return IngestResult(found, duplicate=True)
            if state.active + len(agents) > max_pending:
                raise AdmissionRefused(state.active, max_pending)
            too_far = None
            if max_hops is not None and env.hop > max_hops:
                too_far = (f"the event is {env.hop} hops down its chain; AGENTBOX_MAX_HOPS is "
                           f"{max_hops}")
            refs = _insert_event(conn, state, env, body, agents, now, now + ttl,
                                 lambda agent: too_far, now + self.notification_delay,
                                 lease)  # unused when too far: every run is stopped
            if refs is None:  # claimed meanwhile by another instance's transaction
                return IngestResult(_runs_of_claimed_key(conn, env.idempotency_key, now) or [],
                                    duplicate=True)
            if too_far or lease is None:
                return IngestResult(refs, duplicate=False)
            return claimed_at_acceptance(env, body, refs, now)

        return await self._write(op, order=env.idempotency_key)

    async def claim(
        self, owner: str, limit: int, now: float, lease_seconds: float, max_attempts: int
    ) -> ClaimResult:
        notify_due = now + self.notification_delay

        def op(conn: Db, state: Batch) -> ClaimResult:
            result = ClaimResult()
            for (run_id,) in conn.execute(SQL_DUE_EXPIRED, (now, limit)).fetchall():
                row = conn.execute(SQL_RUN_FOR_CLAIM, (run_id,)).fetchone()
                result.transitions.append(_reclaim_expired(
                    conn, state, row, owner, now, lease_seconds, max_attempts, result.claimed,
                    notify_due))
            free = limit - len(result.claimed)
            if free > 0:
                _claim_waiting(conn, state, owner, now, lease_seconds, free, result, notify_due)
            if len(result.claimed) < limit:
                result.next_due_at = _next_due(conn)
            return result

        return await self._write(op, durable=False)

    async def finish(
        self, run_id: str, owner: str, attempt: int, outcome: Outcome, now: float
    ) -> Transition | None:
        target, next_attempt_at, result_json = finish_values(run_id, outcome, now)

        def op(conn: Db, state: Batch) -> Transition | None:
            completed_at = now if target.terminal else None
            landed = conn.execute(
                SQL_FINISH_RUN,
                (target.value, next_attempt_at, now, completed_at, result_json,
                 outcome.error_code, outcome.error_message, run_id, owner, attempt),
            ).fetchone()
            if landed is None:
                return None  # lease lost: another holder owns this run now
            event_pk, attempt_started_at, agent = landed
            conn.execute(SQL_RECORD_ATTEMPT, (run_id, attempt, owner, attempt_started_at, now,
                                              target.value, outcome.error_code,
                                              outcome.error_message))
            if target.terminal:
                state.active -= 1
            else:
                state.runs_ready = True
            event_id, event_type, source, callback_url = conn.execute(
                SQL_EVENT_FIELDS, (event_pk,)).fetchone()
            notify = _queue_callback(conn, state, callback_url, run_id, target.value, attempt,
                                     event_id, now, now + self.notification_delay,
                                     outcome.result, outcome.error_code)
            spawned: list[Transition] = []
            emitted: list[tuple[Event, tuple[str, ...]]] = []
            if target is RunStatus.SUCCEEDED:
                for item in outcome.emitted:
                    started = _store_emitted(conn, state, item, now, event_pk)
                    spawned += started
                    emitted.append((item.event, tuple(
                        t.run_id for t in started if t.status == "accepted")))
            return Transition(run_id, target.value, attempt, event_id, event_type, source, agent,
                              outcome.error_code, notify, tuple(spawned), tuple(emitted))

        return await self._write(op)

    async def extend_leases(self, owner: str, attempts: Sequence[tuple[str, int]],
                            until: float) -> list[str]:
        def op(conn: Db, state: Batch) -> list[str]:
            # In run_id order, as the other writers take run rows: no deadlock.
            ordered = sorted(attempts)
            conn.executemany(SQL_EXTEND_LEASE, [(until, run_id, owner, attempt)
                                                for run_id, attempt in ordered])
            # Two statements whatever the number of runs (round trips, on PostgreSQL).
            held = {(run_id, attempt) for run_id, attempt
                    in conn.execute(SQL_HELD_LEASES, (owner,)).fetchall()}
            return [run_id for run_id, attempt in ordered if (run_id, attempt) in held]

        return await self._write(op, durable=False)

    async def release_leases(self, owner: str, now: float,
                             unstarted: Sequence[tuple[str, int]] = ()) -> int:
        def op(conn: Db, state: Batch) -> int:
            state.runs_ready = True
            conn.executemany(SQL_GIVE_BACK_ATTEMPT, [
                (now, run_id, owner, attempt) for run_id, attempt in sorted(unstarted)])
            if owner == "*":
                return int(conn.execute(SQL_RELEASE_ALL_LEASES, (now,)).rowcount)
            return int(conn.execute(SQL_RELEASE_LEASES, (now, owner)).rowcount)

        return await self._write(op, durable=False)

    async def replay(self, run_id: str, now: float) -> Transition:
        if _unaskable(run_id):
            raise RunNotFound(run_id)

        def op(conn: Db, state: Batch) -> Transition:
            conn.execute(SQL_LOCK_RUN, (run_id,))  # a concurrent replay or claim waits
            row = conn.execute(SQL_RUN_FOR_CLAIM, (run_id,)).fetchone()
            if row is None:
                raise RunNotFound(run_id)
            _, agent, status, attempt, _, _, _, event_id, event_type, source, _, _, _ = row
            if status not in (RunStatus.DEAD_LETTERED, RunStatus.FAILED_PERMANENT):
                raise NotReplayable(run_id, status)
            check_transition(run_id, status, RunStatus.ACCEPTED)
            conn.execute(SQL_REPLAY, (now, now, run_id))
            # Replayed, it is no longer set aside: should it fail again, it is listed again.
            conn.execute("DELETE FROM discarded_runs WHERE run_id = ?", (run_id,))
            conn.execute(SQL_INSERT_HISTORY, (run_id, now, "accepted", attempt, "replayed"))
            state.active += 1
            state.runs_ready = True
            return Transition(run_id, "accepted", attempt, event_id, event_type, source, agent,
                              "replayed")

        return await self._write(op)

    async def prune_idempotency_keys(self, now: float, limit: int) -> int:
        def op(conn: Db, state: Batch) -> int:
            return int(conn.execute(SQL_PRUNE_KEYS, (now, limit)).rowcount)

        return await self._write(op)

    async def discard(self, run_id: str, reason: str, now: float) -> None:
        """Set a dead letter aside with a reason (it stays, out of the dead-letter list)."""
        def op(conn: Db, state: Batch) -> None:
            row = conn.execute(SQL_LOCK_RUN, (run_id,)).fetchone()
            if row is None:
                raise RunNotFound(run_id)
            if row[0] != RunStatus.DEAD_LETTERED:
                raise NotReplayable(run_id, row[0])
            conn.execute(SQL_INSERT_DISCARD, (run_id, reason, now))
            conn.execute(SQL_INSERT_HISTORY, (run_id, now, "dead_lettered", row[1],
                                              f"discarded: {reason}"))

        await self._write(op)

    # -- the callback outbox ------------------------------------------------------------
    # Delivery bookkeeping commits without waiting for the disk: losing it in a power
    # cut only means a notification is sent again, which its id lets the receiver drop.

    async def claim_notifications(
        self, owner: str, limit: int, now: float, lease_seconds: float
    ) -> tuple[list[Notification], float | None]:
        def op(conn: Db, state: Batch) -> tuple[list[Notification], float | None]:
            rows = conn.execute(SQL_CLAIM_NOTIFICATIONS, {
                "owner": owner, "lease_until": now + lease_seconds, "now": now, "limit": limit,
            }).fetchall()
            claimed = sorted((Notification(*row) for row in rows), key=lambda n: n.pk)
            following = conn.execute(SQL_NEXT_NOTIFICATION).fetchone()
            return claimed, None if following is None else following[0]

        return await self._write(op, durable=False)

    async def record_delivery(
        self, notification: Notification, owner: str, result: DeliveryResult, now: float,
        pause_after_failures: int,
    ) -> str | None:
        delivered = result.state == "delivered"

        def op(conn: Db, state: Batch) -> str | None:
            # The run's row first (as its state changes take it): a notification the
            # run queues meanwhile sees this one still pending, or after its commit.
            conn.execute(SQL_LOCK_RUN, (notification.run_id,))
            landed = conn.execute(SQL_RECORD_DELIVERY, (
                result.state, now, now if delivered else None,
                result.next_attempt_at if result.state == "pending" else None,
                result.error, result.status_code, notification.pk, owner,
                notification.lease_until,
            )).rowcount
            if not landed:
                return None  # the lease ran out and someone else has it now
            known = conn.execute(SQL_DESTINATION_STATE, (notification.destination,)).fetchone()
            if delivered and known is not None and known[1] == 0 and result.pause_reason is None:
                # Nothing to count: no write, so no lock on the destination's row, which
                # every writer queueing a callback to it reads (no waits, no deadlocks).
                dest_state, failures = known
            else:
                dest_state, failures = conn.execute(SQL_COUNT_DESTINATION_ATTEMPT, {
                    "destination": notification.destination, "failures": 0 if delivered else 1,
                    "error": result.error, "now": now,
                }).fetchone()
            reason = result.pause_reason
            if reason is None and not delivered and failures >= pause_after_failures:
                reason = f"{failures} failures in a row"
            paused = reason is not None and dest_state != "paused"
            if paused:
                conn.execute(SQL_PAUSE_DESTINATION, (reason, now, now, notification.destination))
                conn.execute(SQL_HOLD_DESTINATION, (notification.destination,))
            if result.state != "pending":
                conn.execute(SQL_READY_NEXT_OF_RUN, (notification.run_id,))
                state.outbox_ready = True
            return reason if paused else None

        return await self._write(op, durable=False)

    async def release_notification_leases(self, owner: str, now: float) -> int:
        def op(conn: Db, state: Batch) -> int:
            state.outbox_ready = True
            return int(conn.execute(SQL_RELEASE_NOTIFICATIONS, (now, owner, owner)).rowcount)

        return await self._write(op, durable=False)

    async def queue_alert(self, notification_id: str, run_id: str, url: str, body: bytes,
                          now: float) -> bool:
        def op(conn: Db, state: Batch) -> bool:
            state.outbox_ready = True
            return bool(conn.execute(SQL_INSERT_NOTIFICATION, {
                "id": notification_id, "run_id": run_id, "status": "alert",
                "destination": origin_of(url), "url": url, "body": body, "now": now,
                "due": now}).rowcount)

        return await self._write(op)

    async def resume_destination(self, destination: str, now: float) -> None:
        def op(conn: Db, state: Batch) -> None:
            if not conn.execute(SQL_RESUME_DESTINATION, (now, destination)).rowcount:
                raise DestinationNotFound(destination)
            conn.execute(SQL_RELEASE_DESTINATION, {"destination": destination, "now": now})
            state.outbox_ready = True

        await self._write(op)

    # -- reads ----------------------------------------------------------------------

    async def next_due_at(self) -> float | None:
        times = [row[0] for sql in (SQL_NEXT_WAITING, SQL_NEXT_LEASE_END)
                 for row in await self._rows(sql)]
        due = [t for t in times if t is not None]
        return min(due) if due else None

    async def get_run(self, run_id: str) -> dict[str, Any] | None:
        if _unaskable(run_id):
            return None
        rows = await self._rows(SQL_GET_RUN, (run_id,))
        return _run_view(rows[0]) if rows else None

    async def search_runs(
        self, *, status: str | None = None, event_type: str | None = None,
        agent: str | None = None, project: str | None = None, text: str | None = None,
        since: float | None = None, until: float | None = None, before: str | None = None,
        chain: str | None = None, include_discarded: bool = True, limit: int = 50,
    ) -> list[dict[str, Any]]:
        """Newest first, filtered; `before` is the last run_id of the previous page
        (keyset pagination: every page costs the same, however many runs there are);
        `chain` a chain's correlation id: the runs of the events that carry it, and
        of the event whose id it is when that one carries none (the chain's first:
        its own correlation_id, or else its event_id, is what its followers carry)."""
        if _unaskable(status, event_type, agent, project, text, before, chain):
            return []
        where: list[str] = []
        args: list[Any] = []
        if status:
            where.append("r.status = ?")
            args.append(status)
        if event_type:
            where.append("e.event_type = ?")
            args.append(event_type)
        if agent:
            where.append("r.agent = ?")
            args.append(agent)
        if project:
            where.append(SQL_PROJECT_IS)
            args.append(project)
        if chain:
            where.append("(e.correlation_id = ? OR (e.event_id = ? AND e.correlation_id IS NULL))")
            args += [chain, chain]
        if text:
            where.append(f"(r.run_id = ? OR e.event_id = ? OR e.correlation_id = ? OR "
                         f"{SQL_PROJECT_IS})")
            args += [text, text, text, text]
        if since is not None:
            where.append("r.accepted_at >= ?")
            args.append(since)
        if until is not None:
            where.append("r.accepted_at < ?")
            args.append(until)
        if before:
            where.append("r.run_id < ?")
            args.append(before)
        if not include_discarded:
            where.append("NOT EXISTS (SELECT 1 FROM discarded_runs d WHERE d.run_id = r.run_id)")
        sql = (f"SELECT {RUN_COLUMNS} FROM runs r JOIN events e ON e.pk = r.event_pk "
               f"{'WHERE ' + ' AND '.join(where) if where else ''} "
               "ORDER BY r.run_id DESC LIMIT ?")
        # A rare filter may scan many runs: off the event loop.
        return [_run_view(row) for row in await self._slow_rows(sql, (*args, limit))]

    async def finished_counts(self, since: float, width: float, slices: int) -> list[int]:
        """Runs that reached a terminal state in each `width`-second slice from `since`."""
        counts = [0] * slices
        for index, count in await self._rows(SQL_FINISHED_COUNTS, (since, width, since)):
            if 0 <= index < slices:
                counts[index] = count
        return counts

    async def event_of(self, run_id: str) -> dict[str, Any] | None:
        """The stored event of a run, as received."""
        rows = await self._rows(
            "SELECT e.body FROM runs r JOIN events e ON e.pk = r.event_pk WHERE r.run_id = ?",
            (run_id,))
        if not rows:
            return None
        found: dict[str, Any] = json.loads(rows[0][0])
        return found

    async def discarded(self, run_id: str) -> dict[str, Any] | None:
        rows = await self._rows("SELECT reason, at FROM discarded_runs WHERE run_id = ?",
                                (run_id,))
        return {"reason": rows[0][0], "at": iso(rows[0][1])} if rows else None

    async def list_runs(self, status: str | None, limit: int) -> list[dict[str, Any]]:
        if status is None:
            rows = await self._rows(SQL_LIST_RUNS, (limit,))
        else:
            rows = await self._rows(SQL_LIST_RUNS_BY_STATUS, (status, limit))
        return [_run_view(row) for row in rows]

    async def _attempt_rows(self, run_id: str) -> list[tuple[Any, ...]]:
        rows = [tuple(row) for row in await self._rows(SQL_ATTEMPTS, (run_id,))]
        running = await self._rows(SQL_RUNNING_ATTEMPT, (run_id,))
        if running and running[0][0] not in {row[0] for row in rows}:
            rows.append((*running[0], None, None, None, None))
        return rows

    async def attempts(self, run_id: str) -> list[dict[str, Any]]:
        return [
            {"attempt": a, "worker": o, "started_at": iso(s), "finished_at": iso(f),
             "outcome": out, "error_code": code, "error_message": msg,
             "duration_ms": None if f is None else round((f - s) * 1000, 3)}
            for a, o, s, f, out, code, msg in await self._attempt_rows(run_id)
        ]

    async def history(self, run_id: str) -> list[dict[str, Any]]:
        """Every state change, oldest first: derived from the run and its attempts,
        plus the replays recorded on their own."""
        run = await self._rows("SELECT accepted_at FROM runs WHERE run_id = ?", (run_id,))
        if not run:
            return []
        changes: list[tuple[float, str, int, str | None]] = [(run[0][0], "accepted", 0, None)]
        for number, _, started, finished, outcome, code, _ in await self._attempt_rows(run_id):
            changes.append((started, "processing", number, None))
            if finished is not None:
                # A lost lease is no state of its own: the run stayed processing.
                status = "processing" if outcome == "lease_expired" else outcome
                changes.append((finished, status, number, code))
        changes += [tuple(row) for row in await self._rows(SQL_HISTORY, (run_id,))]
        changes.sort(key=lambda change: change[0])
        return [{"at": iso(at), "status": s, "attempt": a, "note": n} for at, s, a, n in changes]

    async def stats(self) -> dict[str, Any]:
        """Runs by state. Counting a million runs takes ~0.1 s, so it runs off the
        event loop, and callers that ask while a count is running share its answer."""
        if self._stats_future is None or self._stats_future.done():
            self._stats_future = asyncio.ensure_future(self._count_runs())
        return await asyncio.shield(self._stats_future)

    async def _count_runs(self) -> dict[str, Any]:
        counts = {s.value: 0 for s in RunStatus}
        rows = await self._slow_rows(SQL_STATUS_COUNTS)
        for status, count, _ in rows:
            counts[status] = count
        oldest = rows[0][2] if rows else None
        return {"runs": counts, "oldest_waiting_accepted_at": iso(oldest),
                "active": sum(counts[s] for s in ACTIVE)}

    async def notifications(self, run_id: str) -> list[dict[str, Any]]:
        return [_notification_view(row) for row in
                await self._rows(SQL_RUN_NOTIFICATIONS, (run_id,))]

    async def list_notifications(self, state: str | None, limit: int) -> list[dict[str, Any]]:
        if state is None:
            rows = await self._rows(SQL_LIST_NOTIFICATIONS, (limit,))
        else:
            rows = await self._rows(SQL_LIST_NOTIFICATIONS_BY_STATE, (state, limit))
        return [_notification_view(row) for row in rows]

    async def destinations(self) -> list[dict[str, Any]]:
        pending = {d: n for d, n in await self._rows(SQL_PENDING_BY_DESTINATION)}
        return [
            {"destination": d, "state": st, "consecutive_failures": f, "paused_reason": r,
             "paused_at": iso(p), "last_error": e, "updated_at": iso(u),
             "pending": pending.get(d, 0)}
            for d, st, f, r, p, e, u in await self._rows(SQL_DESTINATIONS)
        ]

    async def probe(self) -> None:
        """Unhealthy: find out whether writes are taken again (see PostgresStore).
        Healthy: look for trouble no write has met yet (see SqliteStore)."""
        self.look_around()

    def look_around(self) -> None:
        """What `probe` learns without writing (for pages, which must not wait on a
        write): nothing on this engine."""


    # -- projects (a stand-in: read from the event body, unindexed) ---------------------
    # The project column filled at ingest (normalised, indexed) replaces these two.

    async def projects(self, *, limit: int = 100,
                       agent: str | None = None) -> list[ProjectExport]:
        """The latest export of each project (one per project), newest first."""
        if _unaskable(agent):
            return []
        where, args = [f"{SQL_PROJECT} IS NOT NULL"], []
        if agent:
            where.append("r.agent = ?")
            args.append(agent)
        sql = (f"SELECT * FROM (SELECT {EXPORT_COLUMNS}, row_number() OVER (PARTITION BY "
               f"{SQL_PROJECT} ORDER BY r.accepted_at DESC, r.run_id DESC) AS n "
               f"FROM runs r JOIN events e ON e.pk = r.event_pk WHERE {' AND '.join(where)}"
               ") latest WHERE n = 1 ORDER BY accepted_at DESC, run_id DESC LIMIT ?")
        return [_export(row) for row in await self._slow_rows(sql, (*args, limit))]

    async def project_exports(self, project: str, *, agent: str | None = None,
                              status: str | None = None, before_run_id: str | None = None,
                              limit: int = 50) -> list[ProjectExport]:
        """A project's exports, newest first (accepted_at, then run_id).
        before_run_id: only runs accepted before that run (for "the previous export")."""
        if _unaskable(project, agent, status, before_run_id):
            return []
        where, args = [SQL_PROJECT_IS], [project]
        for column, value in (("r.agent", agent), ("r.status", status)):
            if value:
                where.append(f"{column} = ?")
                args.append(value)
        if before_run_id:
            where.append("(r.accepted_at, r.run_id) < "
                         "(SELECT accepted_at, run_id FROM runs WHERE run_id = ?)")
            args.append(before_run_id)
        sql = (f"SELECT {EXPORT_COLUMNS} FROM runs r JOIN events e ON e.pk = r.event_pk "
               f"WHERE {' AND '.join(where)} ORDER BY r.accepted_at DESC, r.run_id DESC "
               "LIMIT ?")
        return [_export(row) for row in await self._slow_rows(sql, (*args, limit))]

def _unaskable(*values: str | None) -> bool:
    """A value holds a NUL: nothing stored does (ids, names and states refuse it), and
    PostgreSQL cannot even be asked for one (it would fail the query, a 503)."""
    return any("\x00" in value for value in values if value)


def finish_values(run_id: str, outcome: Outcome, now: float
                  ) -> tuple[RunStatus, float | None, str | None]:
    """An outcome's target state (checked), next attempt time and result as stored."""
    target = RunStatus(outcome.status)
    if target is RunStatus.PROCESSING:  # only a lease reclaim stays processing
        raise InvalidTransition(run_id, RunStatus.PROCESSING, target)
    check_transition(run_id, RunStatus.PROCESSING, target)
    # A retry with no time given is due at once, never stranded without one.
    next_attempt_at = (outcome.next_attempt_at or now
                       if target is RunStatus.FAILED_RETRYABLE else None)
    result_json = None if outcome.result is None else json.dumps(
        outcome.result, separators=(",", ":"), sort_keys=True)
    return target, next_attempt_at, result_json


def _runs_of_claimed_key(conn: Db, key: str, now: float) -> list[RunRef] | None:
    """The runs of the event holding `key`'s unexpired claim; None if nobody holds it."""
    found = conn.execute(SQL_FIND_KEY, (key,)).fetchone()
    if found is None or found[1] <= now:
        return None
    return [RunRef(*row) for row in conn.execute(SQL_RUNS_OF_EVENT, (found[0],)).fetchall()]


def _notification_view(row: tuple[Any, ...]) -> dict[str, Any]:
    (notification_id, run_id, status, destination, state, attempts, created_at, next_attempt_at,
     last_attempt_at, delivered_at, last_error, last_status_code, lease_owner) = row
    return {
        "notification_id": notification_id, "run_id": run_id, "status": status,
        "destination": destination, "state": state, "attempts": attempts,
        "created_at": iso(created_at),
        "next_attempt_at": iso(next_attempt_at) if state == "pending" else None,
        "sending": lease_owner is not None,
        "last_attempt_at": iso(last_attempt_at), "delivered_at": iso(delivered_at),
        "last_error": last_error, "last_status_code": last_status_code,
    }



def _claim_waiting(conn: Db, state: Batch, owner: str, now: float, lease_seconds: float,
                   limit: int, result: ClaimResult, notify_due: float) -> None:
    rows = conn.execute(SQL_CLAIM_WAITING, {"owner": owner, "lease_until": now + lease_seconds,
                                            "now": now, "limit": limit}).fetchall()
    if not rows:
        return
    pks = sorted({row[5] for row in rows})
    events = {pk: rest for pk, *rest in conn.execute(
        SQL_EVENTS_BY_PK.format(",".join("?" * len(pks))), pks)}
    for run_id, agent, attempt, attempt_base, accepted_at, event_pk in rows:
        body, event_id, event_type, source, callback_url = events[event_pk]
        result.claimed.append(ClaimedRun(run_id, agent, attempt, attempt - attempt_base, body,
                                         accepted_at, event_id, event_type, source))
        notify = _queue_callback(conn, state, callback_url, run_id, "processing", attempt,
                                 event_id, now, notify_due)
        result.transitions.append(Transition(run_id, "processing", attempt, event_id, event_type,
                                             source, agent, notify=notify))


def _reclaim_expired(
    conn: Db, state: Batch, row: tuple[Any, ...], owner: str, now: float,
    lease_seconds: float, max_attempts: int, claimed: list[ClaimedRun], notify_due: float,
) -> Transition:
    """A run whose holder died: record the lost attempt, then claim it again or,
    with its attempts spent, dead-letter it."""
    (run_id, agent, status, attempt, accepted_at, attempt_base, body, event_id, event_type,
     source, old_owner, attempt_started_at, callback_url) = row
    if attempt_started_at is not None:  # else the attempt was given back unstarted
        conn.execute(SQL_RECORD_ATTEMPT, (run_id, attempt, old_owner or "", attempt_started_at,
                                          now, "lease_expired", "lease_expired", None))
    if attempt - attempt_base >= max_attempts:
        check_transition(run_id, status, RunStatus.DEAD_LETTERED)
        message = f"the worker running attempt {attempt} stopped before finishing it"
        conn.execute(
            "UPDATE runs SET status = 'dead_lettered', lease_owner = NULL,"
            " lease_expires_at = NULL, updated_at = ?, completed_at = ?,"
            " error_code = 'lease_expired', error_message = ? WHERE run_id = ?",
            (now, now, message, run_id),
        )
        state.active -= 1
        notify = _queue_callback(conn, state, callback_url, run_id, "dead_lettered", attempt,
                                 event_id, now, notify_due, error_code="lease_expired")
        return Transition(run_id, "dead_lettered", attempt, event_id, event_type, source, agent,
                          "lease_expired", notify)
    check_transition(run_id, status, RunStatus.PROCESSING)
    attempt += 1
    conn.execute(SQL_CLAIM_EXPIRED, (attempt, owner, now + lease_seconds, now, now, run_id))
    claimed.append(ClaimedRun(run_id, agent, attempt, attempt - attempt_base, body, accepted_at,
                              event_id, event_type, source))
    notify = _queue_callback(conn, state, callback_url, run_id, "processing", attempt, event_id,
                             now, notify_due)
    return Transition(run_id, "processing", attempt, event_id, event_type, source, agent,
                      notify=notify)


def _store_emitted(conn: Db, state: Batch, item: Emitted, now: float,
                   parent_pk: int) -> list[Transition]:
    """Store an agent's follow-up event with its runs, in its parent's transaction.

    Its id is derived from the parent run, so a run that succeeds again (after a
    replay) emits nothing twice. A run that would close a loop (its agent already
    handled this event type on the way here: in the emitting event or one of its
    causes) or go past the hop limit is recorded dead_lettered with
    loop_detected: visible, never dropped.
    """
    env = item.event.envelope
    if _runs_of_claimed_key(conn, env.idempotency_key, now) is not None:
        return []
    chain = env.correlation_id or env.event_id
    history = set(conn.execute(SQL_CHAIN_HISTORY, {"chain": chain, "parent": parent_pk}))

    def stop_reason(agent: str) -> str | None:
        if env.hop > item.max_hops:
            return (f"the chain {chain} is {env.hop} hops long; AGENTBOX_MAX_HOPS is "
                    f"{item.max_hops}")
        if (agent, env.event_type) in history:
            return f"{agent} already handled {env.event_type} in the chain {chain}"
        return None

    refs = _insert_event(conn, state, env, item.body, item.agents, now, item.key_expires_at,
                         stop_reason, now)
    if refs is None:
        return []
    return [Transition(ref.run_id, ref.status, 0, env.event_id, env.event_type, env.source,
                       ref.agent, None if ref.status == RunStatus.ACCEPTED else "loop_detected")
            for ref in refs]


def _insert_event(
    conn: Db, state: Batch, env: Envelope, body: bytes, agents: Sequence[str],
    now: float, key_expires_at: float, stop_reason: Callable[[str], str | None],
    notify_due: float, lease: Lease | None = None,
) -> list[RunRef] | None:
    """Write an event, its idempotency claim and one run per agent: accepted (with
    a `lease`: processing, claimed by its owner, with the callback that owes), or,
    when `stop_reason` gives one, recorded dead_lettered (loop_detected) and
    never run, with the callback that state owes.

    None, with nothing written, if the key turned out to be claimed already
    (by a transaction that committed while this one waited for the key).
    """
    (event_pk,) = conn.execute(
        SQL_INSERT_EVENT,
        (env.event_id, env.idempotency_key, env.event_type, env.source, env.correlation_id,
         env.causation_id, env.hop, env.callback_url, now, body),
    ).fetchone()
    claimed = conn.execute(SQL_CLAIM_KEY, {"key": env.idempotency_key, "event_pk": event_pk,
                                           "expires_at": key_expires_at, "now": now}).fetchone()
    if claimed is None:
        conn.execute(SQL_DELETE_EVENT, (event_pk,))
        return None
    refs = []
    for ordinal, agent in enumerate(agents):
        run_id = new_run_id()
        reason = stop_reason(agent)
        if reason is None:
            state.active += 1
            refs.append(RunRef(run_id, agent, RunStatus.ACCEPTED.value))
            if lease is None:
                conn.execute(SQL_INSERT_RUN, (run_id, event_pk, ordinal, agent, now, now, now))
                state.runs_ready = True
                continue
            conn.execute(SQL_INSERT_CLAIMED_RUN, (run_id, event_pk, ordinal, agent, lease.owner,
                                                  lease.until, now, now, now, now))
            _queue_callback(conn, state, env.callback_url, run_id, "processing", 1,
                            env.event_id, now, notify_due)
            continue
        check_transition(run_id, RunStatus.ACCEPTED, RunStatus.DEAD_LETTERED)
        conn.execute(SQL_INSERT_STOPPED_RUN,
                     (run_id, event_pk, ordinal, agent, now, now, now, reason))
        _queue_callback(conn, state, env.callback_url, run_id, "dead_lettered", 0, env.event_id,
                        now, notify_due, error_code="loop_detected")
        refs.append(RunRef(run_id, agent, RunStatus.DEAD_LETTERED.value))
    return refs


def claimed_at_acceptance(env: Envelope, body: bytes, refs: Sequence[RunRef],
                          now: float) -> IngestResult:
    """An accepted event whose runs were claimed in its transaction (attempt 1)."""
    claimed = [ClaimedRun(ref.run_id, ref.agent, 1, 1, body, now, env.event_id, env.event_type,
                          env.source) for ref in refs]
    transitions = [Transition(ref.run_id, RunStatus.PROCESSING.value, 1, env.event_id,
                              env.event_type, env.source, ref.agent,
                              notify=env.callback_url is not None) for ref in refs]
    return IngestResult(refs, duplicate=False, claimed=claimed, transitions=transitions)


def _queue_callback(
    conn: Db, state: Batch, callback_url: str | None, run_id: str, status: str, attempt: int,
    event_id: str, now: float, due: float, result: Any = None, error_code: str | None = None,
) -> bool:
    """Write the outbox row a state change owes, in the state change's transaction."""
    if callback_url is None:
        return False
    state.outbox_ready = True
    notification_id, body = notification(run_id, status, attempt, event_id, result, error_code,
                                         now)
    destination = origin_of(callback_url)
    conn.execute(SQL_LOCK_DESTINATION, (destination,))
    conn.execute(SQL_INSERT_NOTIFICATION, {
        "id": notification_id, "run_id": run_id, "status": status,
        "destination": destination, "url": callback_url, "body": body, "now": now,
        "due": due})
    return True


def _next_due(conn: Db) -> float | None:
    times = [row[0] for sql in (SQL_NEXT_WAITING, SQL_NEXT_LEASE_END)
             for row in conn.execute(sql)]
    due = [t for t in times if t is not None]
    return min(due) if due else None


def _export(row: Sequence[Any]) -> ProjectExport:
    run_id, project, agent, status, accepted_at, completed_at, result = row[:7]
    accepted = iso(accepted_at)
    assert accepted is not None
    return ProjectExport(run_id=run_id, project=str(project), agent=agent, status=status,
                         accepted_at=accepted, finished_at=iso(completed_at),
                         result=json.loads(result) if result is not None else None)


def _run_view(row: tuple[Any, ...]) -> dict[str, Any]:
    (run_id, status, agent, attempt, accepted_at, started_at, updated_at, completed_at, result,
     error_code, error_message, next_attempt_at, replays, event_id, event_type, source,
     correlation_id, causation_id, hop, idempotency_key) = row
    return {
        "run_id": run_id,
        "status": status,
        "event_id": event_id,
        "event_type": event_type,
        "source": source,
        "agent": agent,
        "idempotency_key": idempotency_key,
        "accepted_at": iso(accepted_at),
        "started_at": iso(started_at),
        "updated_at": iso(updated_at),
        "completed_at": iso(completed_at),
        "attempt": attempt,
        "retry_count": max(attempt - 1, 0),
        "next_attempt_at": iso(next_attempt_at),
        "result": None if result is None else json.loads(result),
        "error_code": error_code,
        "error_message": error_message,
        "replays": replays,
        "correlation_id": correlation_id,
        "causation_id": causation_id,
        "hop": hop,
        "terminal": RunStatus(status) in TERMINAL,
    }


# Integrity checks: each query returns offending rows; the text says what is wrong.
INTEGRITY_CHECKS = (
    ("events without any run",
     "SELECT e.event_id FROM events e WHERE NOT EXISTS "
     "(SELECT 1 FROM runs r WHERE r.event_pk = e.pk) LIMIT 20"),
    ("runs whose event is missing",
     "SELECT r.run_id FROM runs r WHERE NOT EXISTS "
     "(SELECT 1 FROM events e WHERE e.pk = r.event_pk) LIMIT 20"),
    ("idempotency keys pointing to no event",
     "SELECT k.key FROM idempotency_keys k WHERE NOT EXISTS "
     "(SELECT 1 FROM events e WHERE e.pk = k.event_pk) LIMIT 20"),
    ("runs in an unknown state",
     "SELECT run_id FROM runs WHERE status NOT IN ("
     + ", ".join(f"'{s.value}'" for s in RunStatus) + ") LIMIT 20"),
    ("processing runs without a lease",
     "SELECT run_id FROM runs WHERE status = 'processing' AND "
     "(lease_owner IS NULL OR lease_expires_at IS NULL) LIMIT 20"),
    ("waiting runs without a next attempt time",
     "SELECT run_id FROM runs WHERE status IN ('accepted', 'failed_retryable') AND "
     "next_attempt_at IS NULL LIMIT 20"),
    ("terminal runs without a completion time",
     "SELECT run_id FROM runs WHERE status IN ('succeeded', 'failed_permanent', "
     "'dead_lettered') AND completed_at IS NULL LIMIT 20"),
    ("callback notifications whose run is missing",
     "SELECT o.notification_id FROM outbox o WHERE NOT EXISTS "
     "(SELECT 1 FROM runs r WHERE r.run_id = o.run_id) LIMIT 20"),
    ("callback notifications in an unknown delivery state",
     "SELECT notification_id FROM outbox WHERE state NOT IN ('pending', 'delivered', 'dead') "
     "LIMIT 20"),
    ("attempts numbered beyond their run's attempt count",
     "SELECT a.run_id FROM attempts a JOIN runs r ON r.run_id = a.run_id "
     "WHERE a.attempt > r.attempt LIMIT 20"),
)


def integrity_problems(rows: Callable[[str], Iterable[Sequence[Any]]],
                       skip: Callable[[str], bool] = lambda sql: False) -> list[str]:
    """Run INTEGRITY_CHECKS (but those `skip` names) with `rows`, an engine's way
    to read a statement's rows: one line per broken invariant."""
    problems = []
    for what, sql in INTEGRITY_CHECKS:
        if skip(sql):
            continue
        found = [str(row[0]) for row in rows(sql)]
        if found:
            problems.append(f"{what}: {', '.join(found)}")
    return problems
