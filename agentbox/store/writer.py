"""The writer: every write is an operation queued for the next transaction, and
many share one commit (group commit: one fsync, or one WAL flush, for all).

An operation is a plain function of a `Db` (the engine's connection, which runs
named statements) and the `Batch` it commits in. The engine brings `_commit`:
how it runs a batch in one transaction and commits it.

When an operation raises, every engine answers the same way (the conformance
test: tests/store/test_failures.py):

- a refusal (`StoreError` and its subclasses, `InvalidTransition`): its caller
  gets it, whatever the operation wrote is undone, the batch's other
  operations commit;
- the storage failing (the engine's driver says the database cannot be reached
  or written: disk full, I/O error, connection lost): every operation of the
  batch gets `StorageUnavailable`, and the store is unhealthy until a durable
  write commits again;
- anything else is a bug: it is logged with its traceback, its caller gets the
  exception as raised, whatever the operation wrote is undone, and the batch's
  other operations commit. A bug is never answered as storage unavailable.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from agentbox.events import Event
from agentbox.logs import get_logger
from agentbox.runs import InvalidTransition
from agentbox.store.errors import StorageUnavailable, StoreError
from agentbox.store.records import Finish, Landed, NewEvent

T = TypeVar("T")
log = get_logger("store")
# An app's keeping of each event stored: its function and its statements' texts
# (`keep_runs`, then each `keep_runs.<name>`, in the order its queries.sql gives them).
Keeps = tuple[Callable[[Event], Any], tuple[str, ...]]
# What an operation raises to refuse (its caller is told); anything else it raises,
# but for the storage failing, is a bug (the rule: this module's docstring).
REFUSALS = (StoreError, InvalidTransition)


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    def __iter__(self) -> Iterator[Any]: ...


# A run an app keeps a value of: run_id, the value (what JSON holds), its event's
# source, its acceptance.
Kept = tuple[str, Any, str, float]


class Db(Protocol):
    """An engine's connection as the operations see it: named statements with
    keyword parameters, and the two writes of the hot path, which each engine
    writes its own way (SQLite row by row, PostgreSQL set-wise)."""

    def run(self, name: str, params: Mapping[str, Any] | None = None, /) -> Cursor: ...

    def run_many(self, name: str, params: Iterable[Mapping[str, Any]], /) -> None: ...

    def run_text(self, sql: str, params: Mapping[str, Any] | None = None, /) -> Cursor:
        """An app's own statement (store/tables.py), given as text."""
        ...

    def array(self, values: Sequence[Any], /) -> Any:
        """A list as this engine's statements take one as a parameter."""
        ...

    def keep_runs(self, statements: Sequence[str], rows: Sequence[Kept], /) -> None:
        """An app's `keep_runs` statements (store/tables.py's Schema.keeps) for these
        runs, each engine its way: SQLite runs each once per run, PostgreSQL once for
        them all (docs/apps.md)."""
        ...

    def store_events(self, items: Sequence[NewEvent], now: float) -> list[bool]:
        """Store each event whose key is free (or expired) with its runs; per event,
        whether it was stored (False: its key is claimed, nothing was written)."""
        ...

    def runs_of_keys(self, keys: Sequence[str], now: float) -> dict[str, list[Any]]:
        """The runs (run_id, agent, status) of the events holding these keys' claims."""
        ...

    def finish_runs(self, items: Sequence[Finish]) -> list[Landed | None]:
        """Record outcomes where the lease is still the caller's; per item what it
        landed on, or None (the lease was lost)."""
        ...


class Batch:
    """What the operations of one transaction share."""

    def __init__(self, active: int, keeps: Sequence[Keeps] = (), gather: bool = False) -> None:
        self.keeps = keeps  # what apps keep of each event stored (ingest._kept_by_apps)
        # `gather`: what they keep is gathered, per app, and written once before the
        # transaction commits (ingest.write_kept); otherwise by each ingest
        self.kept: list[list[Any]] | None = [[] for _ in keeps] if gather else None
        self.active = active  # runs not yet terminal, for admission control
        self.base = active  # what `active` was at the start
        self.recounted = False  # `base` was counted in this transaction
        self.runs_ready = False  # a run became claimable: wake the dispatchers
        self.outbox_ready = False  # a callback was queued: wake the deliverers
        # Subscriptions (None: not looked at yet in this transaction): whether any
        # agent changed its event types, and whether any program subscribed.
        self.agent_overrides: bool | None = None
        self.subscribers: bool | None = None


Operation = Callable[[Db, Batch], T]


@dataclass
class Queued:
    op: Operation[Any]
    future: asyncio.Future[Any]
    durable: bool
    order: str
    patient: bool
    event: bool


class GroupCommit(abc.ABC):
    """The queue and the loop that hands it to the engine, batch by batch."""

    writers = 1  # batches committed at the same time (each on its own connection)
    # A batch of only patient operations (outcomes: no request waits for them) waits
    # up to `linger_seconds` for company, if an event was answered in the last
    # `linger_window_seconds`. At one connection each event was held up by the
    # previous run's commit: the next event's ingest and that outcome now share one
    # commit and one fsync. With no events coming (a backlog drained, one export
    # reviewed) nothing waits; any operation that is not patient ends the wait.
    linger_seconds = 0.002
    linger_window_seconds = 0.01

    def __init__(self) -> None:
        self._queue: list[Queued] = []
        self._wake = asyncio.Event()
        self._impatient = asyncio.Event()  # an operation that is not patient is queued
        self._event_answered_at = float("-inf")  # the last event's answer (loop time)
        self._writer_task: asyncio.Task[None] | None = None
        self._closing = False

    async def _write(self, op: Operation[T], durable: bool = True, order: str = "",
                     patient: bool = False, event: bool = False) -> T:
        """Queue `op` for the writer's next transaction; answer once it committed.

        `durable=False` is for writes whose loss in a power cut is harmless (a
        claim or a lease: the run is simply claimed again); a batch of only
        those may commit without waiting for the disk. `order` sorts the
        operations of a batch (idempotency keys: concurrent writers then take
        their locks in one order and never deadlock). A `patient` operation (an
        outcome) may wait a moment to share its commit with the next `event`
        (an ingest: a request waits for its answer); see `linger_seconds`.
        """
        if self._closing:
            raise StorageUnavailable("the store is closing")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.append(Queued(op, future, durable, order, patient, event))
        if not patient:
            self._impatient.set()
        self._wake.set()
        return await future

    def _start_writer(self) -> None:
        self._writer_task = asyncio.create_task(self._write_loop(), name="agentbox-writer")

    async def _stop_writer(self) -> None:
        if self._writer_task is not None:
            self._closing = True  # the writer commits what is queued, then returns
            self._impatient.set()  # (at once: nothing more will come)
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
            if self._lingers(loop):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._impatient.wait(), self.linger_seconds)
            batch, self._queue = self._queue, []
            self._impatient.clear()
            if not batch:
                free.release()
                continue
            task = asyncio.create_task(self._settle(loop, batch))
            running.add(task)
            task.add_done_callback(done)
        await asyncio.gather(*running)

    def _lingers(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Should the queued batch wait for company? Only patient operations are
        queued, and an event was answered a moment ago (the next is likely on its
        way)."""
        return (self.linger_seconds > 0 and not self._closing
                and not self._impatient.is_set() and bool(self._queue)
                and loop.time() - self._event_answered_at < self.linger_window_seconds)

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
            if not ok and not isinstance(value, REFUSALS):  # its caller may not say what
                log.error("a write operation failed (a bug); only its own writes were "
                          "undone", exc_info=value)
            if queued.future.done():
                continue
            if ok:
                queued.future.set_result(value)
            else:
                queued.future.set_exception(value)
        if any(queued.event for queued in batch):
            self._event_answered_at = loop.time()
        try:
            await self._after_batch(loop)
        except Exception:  # a bug: say so, keep the writer alive
            log.exception("the writer's upkeep after a batch failed")

    async def _after_batch(self, loop: asyncio.AbstractEventLoop) -> None:
        """The engine's upkeep between two batches, once this one is answered; the
        next batch waits for it. None by default."""
        return

    @abc.abstractmethod
    async def _commit(self, loop: asyncio.AbstractEventLoop,
                      batch: list[Queued]) -> list[tuple[bool, Any]]:
        """Run the batch's operations in one transaction and commit it: per
        operation (True, its value) or (False, the exception to raise). An
        operation that raised has its writes undone, the others commit, unless
        the storage failed (`StorageUnavailable` for all); the module's rule."""

    @abc.abstractmethod
    async def _abandon(self) -> None:
        """Roll back whatever the failed batch left open."""


def named(cursor: Any) -> dict[str, Any] | None:
    """A cursor's first row by column name (None: no row)."""
    row = cursor.fetchone()
    if row is None:
        return None
    return dict(zip((column[0] for column in cursor.description), row, strict=True))


def on_thread(loop: asyncio.AbstractEventLoop, thread: Executor,
              call: Callable[..., T], *args: Any) -> asyncio.Future[T]:
    """`loop.run_in_executor(thread, call, *args)`, for the writer's calls of every
    batch (its COMMIT, its transaction): without the check uvloop makes first, that
    `call` is no coroutine function, which costs some 15,000 instructions a call
    (inspect's attribute lookups, each a formatted AttributeError on a C method)."""
    return asyncio.wrap_future(thread.submit(call, *args), loop=loop)


def answer(settled: tuple[bool, Any]) -> Any:
    """An operation's value out of its (ok, value) answer: raise a refusal."""
    ok, value = settled
    if not ok:
        raise value
    return value
