"""How a write batch answers operations that raise (every engine: see conftest.py).

The rule is writer.py's: a refusal reaches its caller, a bug is logged with its
traceback and reaches its caller as raised, each has its own writes undone, and
the batch's other operations commit; neither is answered as storage unavailable.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from agentbox.events import parse_event
from agentbox.store import IngestParams, IngestResult, RunNotFound, Store, StoreError
from agentbox.store.ingest import Ingest, received
from agentbox.store.writer import Batch, Db, log
from tests.store.support import (
    MAX_PENDING,
    SUCCEEDED,
    T0,
    TTL,
    async_test,
    event_body,
    ingest,
    ingest_and_claim,
    status_of,
)


class Bug(Exception):
    """An operation's own mistake."""


@dataclass(slots=True, kw_only=True)
class Unplannable(Ingest):
    """An ingest that fails where a batch's ingests run together (PostgreSQL: in one
    statement), so that which of them is at fault only shows when each runs alone."""

    def plan(self) -> Any:
        raise Bug("cannot plan this event")


def ingest_op(event_id: str) -> Ingest:
    """The operation `Store.ingest` queues, for a new event."""
    body = event_body(event_id)
    return received(IngestParams(event=parse_event(body), body=body, agents=["mix_review"],
                                 now=T0, ttl=TTL, max_pending=MAX_PENDING), notify_due=T0)


class Logged(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def logged() -> Iterator[Logged]:
    """What the store says at ERROR (the log's own set-up may stop it propagating)."""
    handler = Logged()
    log.addHandler(handler)
    yield handler
    log.removeHandler(handler)


@async_test
async def test_a_refusal_and_bugs_fail_alone_and_the_batch_commits(
        store: Store, aio: Any, logged: Logged) -> None:
    taken = (await ingest(store, "e0")).runs[0].run_id
    ran_in: dict[str, list[Batch]] = {}  # per operation: the transactions it ran in

    def writes(name: str, db: Db, state: Batch) -> None:
        ran_in.setdefault(name, []).append(state)
        ingest_op(name)(db, state)

    def healthy(db: Db, state: Batch) -> str:
        writes("h1", db, state)
        return "kept"

    def refuses(db: Db, state: Batch) -> None:
        writes("r1", db, state)
        raise RunNotFound("run_0")

    def raises(db: Db, state: Batch) -> None:
        writes("b1", db, state)
        raise Bug("a mistake in the operation")

    def breaks_a_constraint(db: Db, state: Batch) -> None:
        ran_in.setdefault("m1", []).append(state)
        planned = ingest_op("m1").plan()  # its event, with the run id of e0's run
        planned.runs = tuple(dataclasses.replace(run, run_id=taken) for run in planned.runs)
        db.store_events([planned], T0)

    def names_no_table(db: Any, state: Batch) -> None:
        writes("n1", db, state)
        db.conn.execute("SELECT missing FROM no_such_table")  # either engine's connection

    unplannable = Unplannable(**{field.name: getattr(ingest_op("u1"), field.name)
                                 for field in dataclasses.fields(Ingest)})
    write: Any = store._write  # type: ignore[attr-defined]
    answers = await asyncio.gather(  # queued at once: one batch
        write(healthy), write(refuses), write(raises), write(breaks_a_constraint),
        write(names_no_table), ingest(store, "e1"),
        write(unplannable, order=unplannable.event.envelope.idempotency_key, event=True),
        ingest(store, "e2"), return_exceptions=True)
    kept, refused, bug, mistake, no_table, first, unplanned, second = answers

    # Each failing operation ran beside the healthy one (not in a batch of its own).
    for name in ("r1", "b1", "m1", "n1"):
        assert {id(s) for s in ran_in[name]} & {id(s) for s in ran_in["h1"]}, name
    # What each caller sees: its answer, the refusal, or the bug as it was raised.
    assert kept == "kept"
    assert isinstance(first, IngestResult) and not first.duplicate
    assert isinstance(second, IngestResult) and not second.duplicate
    assert isinstance(refused, RunNotFound)
    assert isinstance(bug, Bug) and isinstance(unplanned, Bug)
    assert not isinstance(mistake, StoreError) and not isinstance(no_table, StoreError)
    assert "IntegrityError" in {kind.__name__ for kind in type(mistake).__mro__}
    assert "no_such_table" in str(no_table)
    # The healthy operations committed; every failing one's writes were undone.
    for event_id in ("h1", "e1", "e2"):
        assert (await ingest(store, event_id)).duplicate, event_id
    for event_id in ("r1", "b1", "m1", "n1", "u1"):
        assert not (await ingest(store, event_id)).duplicate, event_id
    view = await store.get_run(taken)
    assert view is not None and view["event_id"] == "e0"
    # No bug is taken for the storage failing; each is logged with its traceback.
    assert store.healthy and store.last_error is None
    traced = [record.exc_info[1] for record in logged.records if record.exc_info]
    assert [traced.count(failure) for failure in (bug, mistake, no_table, unplanned, refused)
            ] == [1, 1, 1, 1, 0]


@async_test
async def test_an_outcome_its_statement_refuses_fails_alone_beside_events(
        store: Store, aio: Any, logged: Logged) -> None:
    """A batch's events and outcomes are written set-wise (PostgreSQL sends the two
    statements in one round trip): an outcome whose values the database refuses
    fails alone, and the events and the other outcome of its batch commit."""
    good = await ingest_and_claim(store, "g1")
    bad = await ingest_and_claim(store, "g2")
    answers = await asyncio.gather(  # queued at once: one batch
        ingest(store, "e1"), store.finish(good.run_id, "w1", good.attempt, SUCCEEDED, T0 + 1),
        store.finish(bad.run_id, "w1", 2**70, SUCCEEDED, T0 + 1),  # no attempt's number
        ingest(store, "e2"), return_exceptions=True)
    first, finished, refused, second = answers

    assert isinstance(first, IngestResult) and not first.duplicate
    assert isinstance(second, IngestResult) and not second.duplicate
    assert finished is not None and not isinstance(finished, BaseException)
    assert isinstance(refused, Exception) and not isinstance(refused, StoreError)
    assert await status_of(store, good.run_id) == "succeeded"
    assert await status_of(store, bad.run_id) == "processing"
    for event_id in ("e1", "e2"):
        assert (await ingest(store, event_id)).duplicate, event_id
    assert store.healthy and store.last_error is None
    assert [record.exc_info[1] for record in logged.records if record.exc_info] == [refused]
