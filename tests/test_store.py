"""The storage conformance suite: every `Store` engine must pass these tests.

Each engine is a small harness class in `ENGINES` (a way to make a store on a
fresh database, and a raw look at the lease columns for the invariants). The
`engine` fixture is parametrized by its keys, so adding PostgreSQL is one class
and one entry. Stores always run on a real database; time is a fake `now`
that the tests move by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import random
import re
import shutil
import sqlite3
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from agentbox.events import parse_event
from agentbox.runs import TERMINAL, InvalidTransition, RunStatus
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
    RunNotFound,
    SchemaTooNew,
    StorageUnavailable,
    Store,
    notification,
)
from agentbox.store.sql import SQL_STATUS_COUNTS
from agentbox.store.sqlite import MIGRATIONS, SqliteStore, migrate
from tests import postgres

T = TypeVar("T")

T0 = 1_785_000_000.0  # the fake clock's start (2026-07-25); tests add seconds to it
TTL = 100.0
LEASE = 10.0
MAX_ATTEMPTS = 3
MAX_PENDING = 1000
STATUSES = {s.value for s in RunStatus}


# -- engines ---------------------------------------------------------------------------


class Engine(Protocol):
    """What the suite needs from an engine besides the `Store` itself."""

    single_process: bool  # True: a second store on the same database must be refused

    def new_store(self) -> Store:
        """A new, unopened store on this engine's database (the same one every call)."""

    def leases(self) -> dict[str, tuple[str, str | None, float | None]]:
        """run_id -> (status, lease owner, lease end), read straight from the database."""

    def dispose(self) -> None:
        """Drop the database (after every store is closed)."""

    def set_schema_version(self, version: int) -> None:
        """Mark the database as migrated to `version` (as a newer agentbox would)."""

    def schema(self) -> tuple[int, set[str]]:
        """The schema version recorded, and the names of the runs table's indexes."""

    def drop_index(self, name: str) -> None:
        """Drop an index (to make the database an older version's)."""


class SqliteEngine:
    """A SQLite file in a fresh directory."""

    single_process = True  # the data directory is locked by the process that serves it

    def __init__(self, directory: Path) -> None:
        self.path = directory / "agentbox.db"

    def new_store(self) -> Store:
        return SqliteStore(self.path)

    def leases(self) -> dict[str, tuple[str, str | None, float | None]]:
        uri = f"file:{self.path}?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
            rows = conn.execute(
                "SELECT run_id, status, lease_owner, lease_expires_at FROM runs").fetchall()
        return {run_id: (status, owner, until) for run_id, status, owner, until in rows}

    def dispose(self) -> None:
        pass

    def set_schema_version(self, version: int) -> None:
        with contextlib.closing(sqlite3.connect(self.path)) as conn:
            conn.execute(f"PRAGMA user_version = {version}")

    def schema(self) -> tuple[int, set[str]]:
        with contextlib.closing(sqlite3.connect(self.path)) as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            names = conn.execute("SELECT name FROM sqlite_master WHERE type = 'index' "
                                 "AND tbl_name = 'runs'").fetchall()
        return version, {name for (name,) in names}

    def drop_index(self, name: str) -> None:
        with contextlib.closing(sqlite3.connect(self.path)) as conn:
            conn.execute(f"DROP INDEX {name}")


class PostgresEngine:
    """A fresh database on the test session's PostgreSQL server."""

    single_process = False  # instances share the database by design
    admin_url = ""  # set by the `engine` fixture from postgres_admin_url

    def __init__(self, directory: Path) -> None:
        self.url = postgres.fresh_database(self.admin_url)
        self._conn: Any = None  # for leases(), opened on first use

    def new_store(self) -> Store:
        from agentbox.store.postgres import PostgresStore

        return PostgresStore(self.url, instance_id=f"test-{uuid.uuid4().hex[:8]}")

    def leases(self) -> dict[str, tuple[str, str | None, float | None]]:
        import psycopg

        if self._conn is None:
            self._conn = psycopg.connect(self.url, autocommit=True)
        rows = self._conn.execute(
            "SELECT run_id, status, lease_owner, lease_expires_at FROM runs").fetchall()
        return {run_id: (status, owner, until) for run_id, status, owner, until in rows}

    def dispose(self) -> None:
        if self._conn is not None:
            self._conn.close()
        postgres.drop_database(self.admin_url, self.url)

    def set_schema_version(self, version: int) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("DELETE FROM agentbox_schema")
            conn.execute("INSERT INTO agentbox_schema (version, applied_at) VALUES (%s, 0)",
                         (version,))

    def schema(self) -> tuple[int, set[str]]:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            version = conn.execute("SELECT max(version) FROM agentbox_schema").fetchone()
            names = conn.execute(
                "SELECT indexname FROM pg_indexes WHERE tablename = 'runs'").fetchall()
        assert version is not None
        return version[0], {name for (name,) in names}

    def drop_index(self, name: str) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"DROP INDEX {name}")


ENGINES: dict[str, Callable[[Path], Engine]] = {"sqlite": SqliteEngine,
                                               "postgresql": PostgresEngine}


def prepare_engine(request: pytest.FixtureRequest, name: str) -> None:
    """PostgreSQL needs the session's server (started on first use, or skipped)."""
    if name == "postgresql":
        PostgresEngine.admin_url = request.getfixturevalue("postgres_admin_url")


@pytest.fixture(params=sorted(ENGINES))
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    prepare_engine(request, request.param)
    harness = ENGINES[request.param](tmp_path)
    yield harness
    harness.dispose()


@pytest.fixture
def aio() -> Iterator[Callable[[Awaitable[T]], T]]:
    """Run a coroutine on the test's one event loop (the store's writer lives on it)."""
    with asyncio.Runner() as runner:
        yield runner.run  # type: ignore[misc]


@pytest.fixture
def make_store(engine: Engine, aio: Callable[..., Any]) -> Iterator[Callable[[], Store]]:
    """Open a new store on the test's database; every store is closed at teardown."""
    opened: list[Store] = []

    def make() -> Store:
        store = engine.new_store()
        aio(store.open())
        opened.append(store)
        return store

    yield make
    for store in reversed(opened):
        aio(store.close())


@pytest.fixture
def store(make_store: Callable[[], Store]) -> Store:
    return make_store()


def async_test(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an `async def` test on the `aio` loop, which the test must request."""

    @functools.wraps(test)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        kwargs["aio"](test(*args, **kwargs))

    return wrapper


# -- helpers ---------------------------------------------------------------------------


def event_body(event_id: str, mix_url: str = "/tmp/m.wav",
               callback_url: str | None = None) -> bytes:
    event: dict[str, Any] = {
        "schema_version": "v1",
        "event_id": event_id,
        "idempotency_key": f"studio:session.exported:{event_id}",
        "event_type": "session.exported",
        "source": "studio",
        "timestamp": "2026-07-27T15:42:00Z",
        "payload": {"project_id": "p", "mix_url": mix_url},
    }
    if callback_url is not None:
        event["callback_url"] = callback_url
    return json.dumps(event).encode()


async def ingest(
    store: Store, event_id: str, *, agents: Sequence[str] = ("mix_review",), now: float = T0,
    ttl: float = TTL, max_pending: int = MAX_PENDING, mix_url: str = "/tmp/m.wav",
    callback_url: str | None = None, lease: Lease | None = None,
) -> IngestResult:
    body = event_body(event_id, mix_url, callback_url)
    return await store.ingest(parse_event(body), body, list(agents), now, ttl, max_pending,
                              lease=lease)


async def claim(
    store: Store, owner: str = "w1", *, now: float = T0, limit: int = 10,
    max_attempts: int = MAX_ATTEMPTS,
) -> ClaimResult:
    return await store.claim(owner, limit, now, LEASE, max_attempts)


async def claim_one(store: Store, owner: str = "w1", *, now: float = T0,
                    max_attempts: int = MAX_ATTEMPTS) -> ClaimedRun:
    result = await claim(store, owner, now=now, limit=1, max_attempts=max_attempts)
    assert len(result.claimed) == 1, result
    return result.claimed[0]


async def ingest_and_claim(store: Store, event_id: str, owner: str = "w1",
                           now: float = T0) -> ClaimedRun:
    run_id = (await ingest(store, event_id, now=now)).runs[0].run_id
    claimed = await claim_one(store, owner, now=now)
    assert claimed.run_id == run_id
    return claimed


async def status_of(store: Store, run_id: str) -> str:
    view = await store.get_run(run_id)
    assert view is not None
    return str(view["status"])


def at(text: str | None) -> float | None:
    """An API timestamp back to seconds, so engines may format it their own way."""
    return None if text is None else datetime.fromisoformat(text).timestamp()


def ms(seconds: float) -> Any:
    return pytest.approx(seconds, abs=1e-3)


SUCCEEDED = Outcome(RunStatus.SUCCEEDED, result={"ok": True})
PERMANENT = Outcome(RunStatus.FAILED_PERMANENT, error_code="invalid_event", error_message="no")
DEAD = Outcome(RunStatus.DEAD_LETTERED, error_code="timeout", error_message="budget spent")


def retryable(next_attempt_at: float) -> Outcome:
    return Outcome(RunStatus.FAILED_RETRYABLE, error_code="timeout", error_message="slow",
                   next_attempt_at=next_attempt_at)


# -- ingest and idempotency ----------------------------------------------------------------


@async_test
async def test_ingest_writes_event_and_run(store: Store, aio: Any) -> None:
    result = await ingest(store, "e1")
    assert not result.duplicate
    [ref] = result.runs
    assert (ref.agent, ref.status) == ("mix_review", "accepted")
    view = await store.get_run(ref.run_id)
    assert view is not None
    assert (view["run_id"], view["status"], view["agent"]) == (ref.run_id, "accepted", "mix_review")
    assert (view["event_id"], view["event_type"], view["source"]) == (
        "e1", "session.exported", "studio")
    assert at(view["accepted_at"]) == ms(T0)
    assert at(view["updated_at"]) == ms(T0)
    assert (view["started_at"], view["completed_at"], view["result"], view["error_code"]) == (
        None, None, None, None)
    assert view["retry_count"] == 0
    assert [v["run_id"] for v in await store.list_runs(None, 10)] == [ref.run_id]
    claimed = await claim_one(store, now=T0)
    assert claimed.event_body == event_body("e1")  # the raw body, byte for byte
    assert claimed.accepted_at == ms(T0)


@async_test
async def test_duplicate_within_ttl_returns_first_runs_and_writes_nothing(
    store: Store, aio: Any
) -> None:
    first = await ingest(store, "e1")
    stats_before = await store.stats()
    again = await ingest(store, "e1", now=T0 + TTL - 1, mix_url="/tmp/other.wav")
    assert again.duplicate
    assert [r.run_id for r in again.runs] == [r.run_id for r in first.runs]
    assert await store.stats() == stats_before
    assert len(await store.list_runs(None, 10)) == 1
    claimed = await claim_one(store, now=T0 + TTL - 1)
    assert claimed.event_body == event_body("e1")  # the first body, not the duplicate's
    # A duplicate reports the first run's current status.
    third = await ingest(store, "e1", now=T0 + TTL - 0.5)
    assert third.duplicate
    assert [(r.run_id, r.status) for r in third.runs] == [(claimed.run_id, "processing")]


@async_test
async def test_same_key_after_ttl_makes_a_new_run(store: Store, aio: Any) -> None:
    first = await ingest(store, "e1")
    # A duplicate does not extend the key's life: the TTL counts from the first acceptance.
    assert (await ingest(store, "e1", now=T0 + TTL - 1)).duplicate
    later = await ingest(store, "e1", now=T0 + TTL + 1)
    assert not later.duplicate
    assert later.runs[0].run_id != first.runs[0].run_id
    assert {v["run_id"] for v in await store.list_runs(None, 10)} == {
        first.runs[0].run_id, later.runs[0].run_id}
    # The new claim has its own TTL and answers duplicates with the new run.
    again = await ingest(store, "e1", now=T0 + TTL + 50)
    assert again.duplicate and again.runs[0].run_id == later.runs[0].run_id


@async_test
async def test_prune_removes_only_expired_keys(store: Store, aio: Any) -> None:
    await ingest(store, "old", now=T0)
    young = await ingest(store, "young", now=T0 + 1.5)  # expires 0.5 s after the prune
    now = T0 + TTL + 1
    assert await store.prune_idempotency_keys(now, 100) == 1
    assert await store.prune_idempotency_keys(now, 100) == 0
    kept = await ingest(store, "young", now=now)
    assert kept.duplicate and kept.runs[0].run_id == young.runs[0].run_id
    assert not (await ingest(store, "old", now=now)).duplicate
    assert len(await store.list_runs(None, 10)) == 3  # pruning keys never deletes runs


@async_test
async def test_prune_respects_its_limit(store: Store, aio: Any) -> None:
    for i in range(5):
        await ingest(store, f"e{i}", now=T0)
    assert await store.prune_idempotency_keys(T0 + TTL + 1, 2) == 2
    assert await store.prune_idempotency_keys(T0 + TTL + 1, 2) == 2
    assert await store.prune_idempotency_keys(T0 + TTL + 1, 2) == 1


@pytest.mark.parametrize("offset", [-0.5, 0.0, 0.5])
@async_test
async def test_prune_and_ingest_agree_on_expiry(store: Store, aio: Any, offset: float) -> None:
    await ingest(store, "pruned")
    await ingest(store, "kept")
    now = T0 + TTL + offset
    pruned = await store.prune_idempotency_keys(now, 100)
    assert pruned in (0, 2)
    # Pruned exactly when a new delivery of the key would be a new run.
    assert (await ingest(store, "pruned", now=now)).duplicate is (pruned == 0)
    assert (await ingest(store, "kept", now=now)).duplicate is (pruned == 0)


@async_test
async def test_several_agents_get_one_run_each_in_order(store: Store, aio: Any) -> None:
    agents = ["mix_review", "loudness", "archive"]
    result = await ingest(store, "e1", agents=agents)
    assert [r.agent for r in result.runs] == agents
    assert len({r.run_id for r in result.runs}) == 3
    again = await ingest(store, "e1", agents=["other"], now=T0 + 1)
    assert again.duplicate
    assert [(r.run_id, r.agent) for r in again.runs] == [(r.run_id, r.agent) for r in result.runs]
    for ref in result.runs:
        view = await store.get_run(ref.run_id)
        assert view is not None and view["agent"] == ref.agent and view["event_id"] == "e1"
    claimed = (await claim(store, now=T0 + 1)).claimed
    assert sorted(c.agent for c in claimed) == sorted(agents)
    assert (await store.stats())["runs"]["processing"] == 3


@async_test
async def test_concurrent_ingests_give_one_run_per_key(store: Store, aio: Any) -> None:
    keys = [f"k{i}" for i in range(20)]
    deliveries = keys * 10
    random.Random(7).shuffle(deliveries)
    results = await asyncio.gather(*(ingest(store, key) for key in deliveries))
    by_key: dict[str, set[str]] = {}
    firsts: dict[str, int] = {}
    for key, result in zip(deliveries, results, strict=True):
        by_key.setdefault(key, set()).update(r.run_id for r in result.runs)
        firsts[key] = firsts.get(key, 0) + (not result.duplicate)
    assert all(len(ids) == 1 for ids in by_key.values())
    assert firsts == dict.fromkeys(keys, 1)
    all_ids = set().union(*by_key.values())
    assert {v["run_id"] for v in await store.list_runs(None, 1000)} == all_ids
    for run_id in all_ids:
        assert await status_of(store, run_id) == "accepted"
    stats = await store.stats()
    assert stats["runs"]["accepted"] == 20 and stats["active"] == 20


@async_test
async def test_concurrent_ingests_respect_admission(store: Store, aio: Any) -> None:
    deliveries = [f"k{i}" for i in range(20)] * 10
    random.Random(3).shuffle(deliveries)
    results = await asyncio.gather(
        *(ingest(store, key, max_pending=10) for key in deliveries), return_exceptions=True)
    admitted = {key for key, r in zip(deliveries, results, strict=True)
                if isinstance(r, IngestResult)}
    refused = {key for key, r in zip(deliveries, results, strict=True)
               if isinstance(r, AdmissionRefused)}
    assert all(isinstance(r, IngestResult | AdmissionRefused) for r in results)
    assert len(admitted) == 10 and admitted.isdisjoint(refused)
    assert len(await store.list_runs(None, 1000)) == 10


# -- admission -----------------------------------------------------------------------------


@async_test
async def test_admission_refuses_when_full_and_writes_nothing(store: Store, aio: Any) -> None:
    first = await ingest(store, "e1", max_pending=2)
    await ingest(store, "e2", max_pending=2)
    with pytest.raises(AdmissionRefused) as refused:
        await ingest(store, "e3", max_pending=2)
    assert (refused.value.pending, refused.value.limit) == (2, 2)
    assert len(await store.list_runs(None, 10)) == 2
    # A known duplicate is still answered while full.
    again = await ingest(store, "e1", max_pending=2)
    assert again.duplicate and again.runs[0].run_id == first.runs[0].run_id
    # The refused key was not claimed: once there is room it is a new run.
    with pytest.raises(AdmissionRefused):
        await ingest(store, "e3", max_pending=2)
    assert not (await ingest(store, "e3", max_pending=3)).duplicate


@async_test
async def test_admission_counts_every_agent_of_the_event(store: Store, aio: Any) -> None:
    await ingest(store, "e1", max_pending=2)
    with pytest.raises(AdmissionRefused):
        await ingest(store, "e2", agents=["a", "b"], max_pending=2)
    assert len(await store.list_runs(None, 10)) == 1
    assert len((await ingest(store, "e3", agents=["a"], max_pending=2)).runs) == 1


@async_test
async def test_terminal_runs_free_capacity(store: Store, aio: Any) -> None:
    a = await ingest_and_claim(store, "a")
    b = await ingest_and_claim(store, "b")
    c = await ingest_and_claim(store, "c")
    with pytest.raises(AdmissionRefused):
        await ingest(store, "d", max_pending=3, now=T0 + 1)
    # failed_retryable is still pending: no room.
    await store.finish(a.run_id, "w1", 1, retryable(T0 + 60), T0 + 1)
    with pytest.raises(AdmissionRefused):
        await ingest(store, "d", max_pending=3, now=T0 + 1)
    await store.finish(b.run_id, "w1", 1, SUCCEEDED, T0 + 1)
    assert not (await ingest(store, "d", max_pending=3, now=T0 + 1)).duplicate
    with pytest.raises(AdmissionRefused):
        await ingest(store, "e", max_pending=3, now=T0 + 1)
    # A lease that expires with its budget spent dead-letters the run and frees its place.
    await claim(store, now=T0 + LEASE, max_attempts=1)
    assert await status_of(store, c.run_id) == "dead_lettered"
    assert not (await ingest(store, "e", max_pending=3, now=T0 + LEASE)).duplicate


def test_admission_count_survives_reopen(make_store: Callable[[], Store], aio: Any) -> None:
    store = make_store()
    first = aio(ingest_and_claim(store, "e1"))
    aio(ingest(store, "e2", max_pending=2))
    aio(store.close())
    reopened = make_store()
    with pytest.raises(AdmissionRefused):
        aio(ingest(reopened, "e3", max_pending=2))
    aio(reopened.finish(first.run_id, "w1", 1, SUCCEEDED, T0 + 1))
    assert not aio(ingest(reopened, "e3", max_pending=2, now=T0 + 1)).duplicate


@async_test
async def test_replay_takes_capacity_again(store: Store, aio: Any) -> None:
    run = await ingest_and_claim(store, "e1")
    await store.finish(run.run_id, "w1", 1, PERMANENT, T0 + 1)
    await ingest(store, "e2", max_pending=2, now=T0 + 1)
    await store.replay(run.run_id, T0 + 2)
    with pytest.raises(AdmissionRefused):
        await ingest(store, "e3", max_pending=2, now=T0 + 2)


# -- claim -------------------------------------------------------------------------------


@async_test
async def test_claim_takes_accepted_runs_up_to_limit(store: Store, aio: Any) -> None:
    ids = set()
    for i in range(3):
        ids.add((await ingest(store, f"e{i}")).runs[0].run_id)
    result = await claim(store, "w1", now=T0 + 1, limit=2)
    assert len(result.claimed) == 2
    for c in result.claimed:
        assert (c.attempt, c.round_attempt, c.agent) == (1, 1, "mix_review")
        view = await store.get_run(c.run_id)
        assert view is not None and view["status"] == "processing"
        assert at(view["started_at"]) == ms(T0 + 1)
        assert view["retry_count"] == 0
    assert [t.status for t in result.transitions] == ["processing", "processing"]
    [rest] = ids - {c.run_id for c in result.claimed}
    assert await status_of(store, rest) == "accepted"
    third = await claim(store, "w2", now=T0 + 1)
    assert [c.run_id for c in third.claimed] == [rest]
    assert (await claim(store, "w3", now=T0 + 2)).claimed == []


@async_test
async def test_claim_before_acceptance_time_takes_nothing(store: Store, aio: Any) -> None:
    assert (await claim(store, now=T0)).next_due_at is None  # nothing at all to do
    await ingest(store, "e1", now=T0)
    assert (await claim(store, now=T0 - 1)).claimed == []
    assert await store.next_due_at() == ms(T0)


@async_test
async def test_retryable_run_waits_for_its_next_attempt_time(store: Store, aio: Any) -> None:
    run = await ingest_and_claim(store, "e1")
    await store.finish(run.run_id, "w1", 1, retryable(T0 + 30), T0 + 1)
    early = await claim(store, now=T0 + 29.9)
    assert early.claimed == [] and early.next_due_at == ms(T0 + 30)
    assert await store.next_due_at() == ms(T0 + 30)
    again = await claim_one(store, "w2", now=T0 + 30)
    assert (again.run_id, again.attempt, again.round_attempt) == (run.run_id, 2, 2)
    view = await store.get_run(run.run_id)
    assert view is not None
    assert view["retry_count"] == 1 and at(view["started_at"]) == ms(T0)


@async_test
async def test_expired_lease_is_reclaimed_with_next_attempt(store: Store, aio: Any) -> None:
    run = await ingest_and_claim(store, "e1", "w1")
    assert await store.next_due_at() == ms(T0 + LEASE)
    assert (await claim(store, "w2", now=T0 + LEASE - 0.1)).claimed == []
    again = await claim_one(store, "w2", now=T0 + LEASE)
    assert (again.run_id, again.attempt, again.round_attempt) == (run.run_id, 2, 2)
    attempts = await store.attempts(run.run_id)
    assert [(a["attempt"], a["worker"], a["outcome"]) for a in attempts] == [
        (1, "w1", "lease_expired"), (2, "w2", None)]
    assert at(attempts[0]["finished_at"]) == ms(T0 + LEASE)


@async_test
async def test_expired_lease_with_spent_budget_is_dead_lettered(
    engine: Engine, store: Store, aio: Any
) -> None:
    run = await ingest_and_claim(store, "e1")
    await claim_one(store, "w2", now=T0 + LEASE, max_attempts=2)
    result = await claim(store, "w3", now=T0 + 2 * LEASE, max_attempts=2)
    assert result.claimed == []
    [transition] = result.transitions
    assert (transition.run_id, transition.status, transition.error_code, transition.attempt) == (
        run.run_id, "dead_lettered", "lease_expired", 2)
    view = await store.get_run(run.run_id)
    assert view is not None
    assert (view["status"], view["error_code"]) == ("dead_lettered", "lease_expired")
    assert at(view["completed_at"]) == ms(T0 + 2 * LEASE)
    assert engine.leases()[run.run_id] == ("dead_lettered", None, None)  # the lease is gone
    assert (await store.stats())["active"] == 0
    assert (await claim(store, now=T0 + 100 * LEASE)).transitions == []


@async_test
async def test_terminal_runs_are_never_claimed(store: Store, aio: Any) -> None:
    for event_id, outcome in (("s", SUCCEEDED), ("p", PERMANENT), ("d", DEAD)):
        run = await ingest_and_claim(store, event_id)
        await store.finish(run.run_id, "w1", 1, outcome, T0 + 1)
    assert await store.next_due_at() is None
    result = await claim(store, now=T0 + 10_000)
    assert (result.claimed, result.transitions) == ([], [])


# -- claimed as accepted (ingest with a lease) ----------------------------------------------


@async_test
async def test_ingest_with_a_lease_stores_the_runs_claimed(
        engine: Engine, store: Store, aio: Any) -> None:
    agents = ["mix_review", "loudness"]
    result = await ingest(store, "e1", agents=agents, lease=Lease("w1", T0 + LEASE))
    assert not result.duplicate
    # The answer reports them as accepted (what the 202 says); they are processing.
    assert [(r.agent, r.status) for r in result.runs] == [(a, "accepted") for a in agents]
    assert [(c.run_id, c.agent, c.attempt, c.round_attempt) for c in result.claimed] == [
        (r.run_id, r.agent, 1, 1) for r in result.runs]
    for claimed in result.claimed:
        assert claimed.event_body == event_body("e1")
        assert (claimed.event_id, claimed.accepted_at) == ("e1", ms(T0))
    assert [(t.run_id, t.status, t.attempt, t.notify) for t in result.transitions] == [
        (r.run_id, "processing", 1, False) for r in result.runs]
    for ref in result.runs:
        assert engine.leases()[ref.run_id] == ("processing", "w1", ms(T0 + LEASE))
        view = await store.get_run(ref.run_id)
        assert view is not None
        assert (view["status"], view["attempt"], view["retry_count"]) == ("processing", 1, 0)
        assert at(view["started_at"]) == ms(T0) and at(view["accepted_at"]) == ms(T0)
    stats = await store.stats()
    assert (stats["runs"]["processing"], stats["active"]) == (2, 2)
    # Nobody else claims them while the lease holds; the holder's outcome lands.
    assert (await claim(store, "w2", now=T0 + LEASE - 0.1)).claimed == []
    first = result.claimed[0]
    done = await store.finish(first.run_id, "w1", 1, SUCCEEDED, T0 + 1)
    assert done is not None and done.status == "succeeded"
    assert [(a["attempt"], a["worker"], a["outcome"]) for a in
            await store.attempts(first.run_id)] == [(1, "w1", "succeeded")]
    # A holder that died: the other run is taken over after the lease, attempt 2.
    again = await claim_one(store, "w2", now=T0 + LEASE)
    assert (again.run_id, again.attempt) == (result.claimed[1].run_id, 2)


@async_test
async def test_an_attempt_given_back_unstarted_is_neither_lost_nor_counted(
        engine: Engine, store: Store, aio: Any) -> None:
    result = await ingest(store, "e1", lease=Lease("w1", T0 + LEASE))
    [claimed] = result.claimed
    await ingest(store, "e2", lease=Lease("w1", T0 + LEASE))
    # Shutting down: e1's agent never started, e2's did (its attempt is lost).
    assert await store.release_leases("w1", T0 + 1, [(claimed.run_id, 1)]) == 2
    again = await claim(store, "w2", now=T0 + 1, max_attempts=1)
    by_run = {c.run_id: c for c in again.claimed}
    assert (by_run[claimed.run_id].attempt, by_run[claimed.run_id].round_attempt) == (1, 1)
    assert [(a["attempt"], a["outcome"]) for a in await store.attempts(claimed.run_id)] == [
        (1, None)]
    # e2's lost attempt used its only one: dead-lettered, as after a crash.
    assert [(t.status, t.error_code) for t in again.transitions
            if t.run_id != claimed.run_id] == [("dead_lettered", "lease_expired")]
    # Given back only by its holder, and only for that attempt.
    assert await store.release_leases("w9", T0 + 2, [(claimed.run_id, 1)]) == 0
    assert engine.leases()[claimed.run_id] == ("processing", "w2", ms(T0 + 1 + LEASE))


@async_test
async def test_a_duplicate_with_a_lease_claims_nothing(store: Store, aio: Any) -> None:
    first = await ingest(store, "e1")
    again = await ingest(store, "e1", now=T0 + 1, lease=Lease("w1", T0 + LEASE))
    assert again.duplicate and (again.claimed, again.transitions) == ((), ())
    assert [r.run_id for r in again.runs] == [r.run_id for r in first.runs]
    assert await status_of(store, first.runs[0].run_id) == "accepted"


@async_test
async def test_a_run_claimed_as_accepted_owes_its_processing_callback(
        store: Store, aio: Any) -> None:
    result = await ingest(store, "e1", callback_url=HOOK, lease=Lease("w1", T0 + LEASE))
    [claimed] = result.claimed
    assert result.transitions[0].notify
    [sending] = await take(store)
    assert sending.notification_id == f"{claimed.run_id}:processing:0"
    assert sending.body == notification(claimed.run_id, "processing", 1, "e1", None, None, T0)[1]


@async_test
async def test_runs_claimed_as_accepted_count_for_admission(store: Store, aio: Any) -> None:
    await ingest(store, "e1", max_pending=2, lease=Lease("w1", T0 + LEASE))
    await ingest(store, "e2", max_pending=2)
    with pytest.raises(AdmissionRefused):
        await ingest(store, "e3", max_pending=2, lease=Lease("w1", T0 + LEASE))


# -- finish ------------------------------------------------------------------------------


@async_test
async def test_finish_succeeded_stores_the_result(store: Store, aio: Any) -> None:
    run = await ingest_and_claim(store, "e1")
    result = {"lufs": -14.2, "notes": ["ok", "übersteuert"], "nested": {"peak": None, "n": 3}}
    transition = await store.finish(
        run.run_id, "w1", 1, Outcome(RunStatus.SUCCEEDED, result=result), T0 + 2)
    assert transition is not None
    assert (transition.run_id, transition.status, transition.attempt, transition.agent) == (
        run.run_id, "succeeded", 1, "mix_review")
    assert (transition.event_id, transition.event_type, transition.source) == (
        "e1", "session.exported", "studio")
    view = await store.get_run(run.run_id)
    assert view is not None
    assert (view["status"], view["result"], view["error_code"]) == ("succeeded", result, None)
    assert at(view["completed_at"]) == ms(T0 + 2) and at(view["updated_at"]) == ms(T0 + 2)


@async_test
async def test_finish_by_a_lost_lease_changes_nothing(store: Store, aio: Any) -> None:
    run = await ingest_and_claim(store, "e1", "w1")
    await claim_one(store, "w2", now=T0 + LEASE)  # w1's lease expired; w2 took attempt 2
    before = await store.get_run(run.run_id)
    assert await store.finish(run.run_id, "w1", 1, SUCCEEDED, T0 + LEASE + 1) is None
    assert await store.finish(run.run_id, "w1", 2, SUCCEEDED, T0 + LEASE + 1) is None
    assert await store.finish(run.run_id, "w2", 1, SUCCEEDED, T0 + LEASE + 1) is None
    assert await store.get_run(run.run_id) == before
    landed = await store.finish(run.run_id, "w2", 2, SUCCEEDED, T0 + LEASE + 1)
    assert landed is not None and landed.attempt == 2
    # A terminal run takes no second outcome either.
    assert await store.finish(run.run_id, "w2", 2, PERMANENT, T0 + LEASE + 2) is None
    assert await status_of(store, run.run_id) == "succeeded"


@async_test
async def test_finish_of_an_unclaimed_run_changes_nothing(store: Store, aio: Any) -> None:
    run_id = (await ingest(store, "e1")).runs[0].run_id
    assert await store.finish(run_id, "w1", 0, DEAD, T0 + 1) is None
    assert await store.finish("run_missing", "w1", 1, SUCCEEDED, T0 + 1) is None
    assert await status_of(store, run_id) == "accepted"


@async_test
async def test_finish_failed_retryable_keeps_next_attempt_time(store: Store, aio: Any) -> None:
    run = await ingest_and_claim(store, "e1")
    transition = await store.finish(run.run_id, "w1", 1, retryable(T0 + 45), T0 + 5)
    assert transition is not None and transition.error_code == "timeout"
    view = await store.get_run(run.run_id)
    assert view is not None
    assert (view["status"], view["error_code"], view["completed_at"]) == (
        "failed_retryable", "timeout", None)
    assert at(view["next_attempt_at"]) == ms(T0 + 45)
    stats = await store.stats()
    assert stats["runs"]["failed_retryable"] == 1 and stats["active"] == 1


@pytest.mark.parametrize("target", [RunStatus.ACCEPTED])
@async_test
async def test_finish_with_a_forbidden_target_raises(
    store: Store, aio: Any, target: RunStatus
) -> None:
    run = await ingest_and_claim(store, "e1")
    before = await store.get_run(run.run_id)
    with pytest.raises(InvalidTransition):
        await store.finish(run.run_id, "w1", 1, Outcome(target), T0 + 1)
    assert await store.get_run(run.run_id) == before


@async_test
async def test_finish_cannot_leave_a_run_processing(store: Store, aio: Any) -> None:
    run = await ingest_and_claim(store, "e1")
    with pytest.raises(InvalidTransition):
        await store.finish(run.run_id, "w1", 1, Outcome(RunStatus.PROCESSING), T0 + 1)
    assert (await claim(store, now=T0 + 10 * LEASE)).claimed != []


@async_test
async def test_retryable_without_next_attempt_time_is_not_stranded(
    store: Store, aio: Any
) -> None:
    run = await ingest_and_claim(store, "e1")
    try:
        await store.finish(run.run_id, "w1", 1, Outcome(RunStatus.FAILED_RETRYABLE), T0 + 1)
    except ValueError:
        return  # refusing the outcome is a fine answer too
    assert await store.next_due_at() is not None
    assert [c.run_id for c in (await claim(store, now=T0 + 1000)).claimed] == [run.run_id]


@async_test
async def test_finish_dead_lettered_and_permanent(store: Store, aio: Any) -> None:
    dead = await ingest_and_claim(store, "d")
    perm = await ingest_and_claim(store, "p")
    await store.finish(dead.run_id, "w1", 1, DEAD, T0 + 1)
    await store.finish(perm.run_id, "w1", 1, PERMANENT, T0 + 1)
    dead_view, perm_view = await store.get_run(dead.run_id), await store.get_run(perm.run_id)
    assert dead_view is not None and perm_view is not None
    assert (dead_view["status"], dead_view["error_code"]) == ("dead_lettered", "timeout")
    assert (perm_view["status"], perm_view["error_code"]) == ("failed_permanent", "invalid_event")
    assert at(dead_view["completed_at"]) == ms(T0 + 1)
    assert [v["run_id"] for v in await store.list_runs("dead_lettered", 10)] == [dead.run_id]


# -- leases ------------------------------------------------------------------------------


@async_test
async def test_extend_leases_keeps_runs_leased(store: Store, aio: Any) -> None:
    run = await ingest_and_claim(store, "e1", "w1")
    assert await store.extend_leases("w1", [(run.run_id, 1)], T0 + 100) == [run.run_id]
    # Not its lease, or not the attempt it holds: no effect, and said so.
    assert await store.extend_leases("intruder", [(run.run_id, 1)], T0 + 1000) == []
    assert await store.extend_leases("w1", [(run.run_id, 2)], T0 + 1000) == []
    assert await store.next_due_at() == ms(T0 + 100)
    assert (await claim(store, "w2", now=T0 + 99)).claimed == []
    assert (await claim_one(store, "w2", now=T0 + 100)).attempt == 2


@async_test
async def test_release_all_leases(store: Store, aio: Any) -> None:
    a = await ingest_and_claim(store, "a", "w1")
    b = await ingest_and_claim(store, "b", "w2")
    done = await ingest_and_claim(store, "c", "w2")
    await store.finish(done.run_id, "w2", 1, SUCCEEDED, T0 + 1)
    assert await store.release_leases("*", T0 + 2) == 2
    reclaimed = await claim(store, "w3", now=T0 + 2)
    assert {(c.run_id, c.attempt) for c in reclaimed.claimed} == {(a.run_id, 2), (b.run_id, 2)}


@async_test
async def test_release_one_owners_leases(store: Store, aio: Any) -> None:
    mine = await ingest_and_claim(store, "a", "w1")
    theirs = await ingest_and_claim(store, "b", "w2")
    assert await store.release_leases("w1", T0 + 2) == 1
    assert await store.release_leases("nobody", T0 + 2) == 0
    reclaimed = await claim(store, "w3", now=T0 + 2)
    assert [c.run_id for c in reclaimed.claimed] == [mine.run_id]
    assert await store.finish(theirs.run_id, "w2", 1, SUCCEEDED, T0 + 3) is not None


# -- replay ------------------------------------------------------------------------------


@pytest.mark.parametrize("outcome", [DEAD, PERMANENT], ids=["dead_lettered", "failed_permanent"])
@async_test
async def test_replay_sends_the_same_run_back_to_accepted(
    store: Store, aio: Any, outcome: Outcome
) -> None:
    run = await ingest_and_claim(store, "e1")
    await store.finish(run.run_id, "w1", 1, outcome, T0 + 1)
    transition = await store.replay(run.run_id, T0 + 5)
    assert (transition.run_id, transition.status) == (run.run_id, "accepted")
    view = await store.get_run(run.run_id)
    assert view is not None
    assert (view["status"], view["error_code"], view["completed_at"], view["result"]) == (
        "accepted", None, None, None)
    again = await claim_one(store, "w2", now=T0 + 5)
    assert (again.run_id, again.attempt, again.round_attempt) == (run.run_id, 2, 1)
    assert [a["attempt"] for a in await store.attempts(run.run_id)] == [1, 2]


@async_test
async def test_replay_refuses_runs_that_are_not_failed(store: Store, aio: Any) -> None:
    processing = await ingest_and_claim(store, "p")
    retry = await ingest_and_claim(store, "r", now=T0 + 1)
    await store.finish(retry.run_id, "w1", 1, retryable(T0 + 100), T0 + 2)
    ok = await ingest_and_claim(store, "s", now=T0 + 2)
    await store.finish(ok.run_id, "w1", 1, SUCCEEDED, T0 + 3)
    accepted = (await ingest(store, "a", now=T0 + 3)).runs[0].run_id
    for run_id in (accepted, processing.run_id, retry.run_id, ok.run_id):
        before = await store.get_run(run_id)
        assert before is not None
        with pytest.raises(NotReplayable) as refused:
            await store.replay(run_id, T0 + 4)
        assert refused.value.status == before["status"]
        assert await store.get_run(run_id) == before
    with pytest.raises(RunNotFound):
        await store.replay("run_missing", T0 + 4)


@async_test
async def test_replay_restarts_the_retry_budget(store: Store, aio: Any) -> None:
    run = await ingest_and_claim(store, "e1")
    await claim_one(store, now=T0 + LEASE, max_attempts=2)  # attempt 2
    await claim(store, now=T0 + 2 * LEASE, max_attempts=2)  # budget spent: dead-lettered
    assert await status_of(store, run.run_id) == "dead_lettered"
    await store.replay(run.run_id, T0 + 3 * LEASE)
    third = await claim_one(store, now=T0 + 3 * LEASE, max_attempts=2)
    assert (third.attempt, third.round_attempt) == (3, 1)
    fourth = await claim_one(store, now=T0 + 4 * LEASE, max_attempts=2)  # not dead yet
    assert (fourth.run_id, fourth.attempt, fourth.round_attempt) == (run.run_id, 4, 2)
    result = await claim(store, now=T0 + 5 * LEASE, max_attempts=2)
    assert [t.status for t in result.transitions] == ["dead_lettered"]
    view = await store.get_run(run.run_id)
    assert view is not None and view["retry_count"] == 3


# -- the callback outbox ------------------------------------------------------------------

HOOK = "https://studio.example/hooks/agentbox"
HOOK_ORIGIN = "https://studio.example:443"
OTHER_HOOK = "https://other.example:8443/cb"
SEND_LEASE = 30.0


async def with_callback(store: Store, event_id: str, url: str = HOOK, now: float = T0
                        ) -> ClaimedRun:
    await ingest(store, event_id, now=now, callback_url=url)
    return await claim_one(store, now=now)


async def take(store: Store, owner: str = "d1", now: float = T0, limit: int = 10
               ) -> list[Notification]:
    claimed, _ = await store.claim_notifications(owner, limit, now, SEND_LEASE)
    return claimed


def sent() -> DeliveryResult:
    return DeliveryResult("delivered", status_code=204)


def failed(next_at: float, error: str = "http_500", pause: str | None = None) -> DeliveryResult:
    return DeliveryResult("pending", error, 500, next_at, pause)


@async_test
async def test_transitions_of_a_run_with_a_callback_write_its_notifications(
        store: Store, aio: Any) -> None:
    run = await with_callback(store, "e1")
    transition = await store.finish(run.run_id, "w1", 1, SUCCEEDED, T0 + 2)
    assert transition is not None and transition.notify
    shown = await store.notifications(run.run_id)
    assert [(n["notification_id"], n["state"], n["attempts"], n["destination"]) for n in shown] \
        == [(f"{run.run_id}:processing:0", "pending", 0, HOOK_ORIGIN),
            (f"{run.run_id}:succeeded:0", "pending", 0, HOOK_ORIGIN)]
    first = await take(store)
    assert [n.notification_id for n in first] == [f"{run.run_id}:processing:0"]
    assert first[0].url == HOOK and first[0].attempts == 0
    assert first[0].body == notification(run.run_id, "processing", 1, "e1", None, None, T0)[1]
    await store.record_delivery(first[0], "d1", sent(), T0 + 3, 20)
    (second,) = await take(store, now=T0 + 3)
    body = json.loads(second.body)
    assert body == {"notification_id": f"{run.run_id}:succeeded:0", "run_id": run.run_id,
                    "event_id": "e1", "status": "succeeded", "retry_count": 0,
                    "result": {"ok": True}, "error_code": None,
                    "occurred_at": body["occurred_at"]}
    assert at(body["occurred_at"]) == ms(T0 + 2)


@async_test
async def test_runs_without_a_callback_write_no_notification(store: Store, aio: Any) -> None:
    run = await ingest_and_claim(store, "e1")
    transition = await store.finish(run.run_id, "w1", 1, SUCCEEDED, T0 + 1)
    assert transition is not None and not transition.notify
    assert await store.notifications(run.run_id) == []
    assert await take(store, now=T0 + 1) == []


@async_test
async def test_a_later_notification_waits_while_an_earlier_one_is_pending(
        store: Store, aio: Any) -> None:
    run = await with_callback(store, "e1")
    other = await with_callback(store, "e2", OTHER_HOOK)
    await store.finish(run.run_id, "w1", 1, retryable(T0 + 50), T0 + 1)
    (first, other_first) = await take(store, now=T0 + 1)
    assert first.notification_id.endswith(":processing:0") and other_first.run_id == other.run_id
    # in flight: neither it nor the run's next one is handed out
    assert await take(store, "d2", now=T0 + 2) == []
    await store.record_delivery(other_first, "d1", sent(), T0 + 3, 20)
    await store.record_delivery(first, "d1", failed(T0 + 100), T0 + 3, 20)
    assert await take(store, "d2", now=T0 + 99) == []  # the first waits for its retry time
    (again,) = await take(store, "d2", now=T0 + 100)
    assert again.pk == first.pk and again.attempts == 1
    await store.record_delivery(again, "d2", sent(), T0 + 101, 20)
    (later,) = await take(store, "d2", now=T0 + 101)
    assert later.notification_id == f"{run.run_id}:failed_retryable:0"


@async_test
async def test_claim_notifications_says_when_the_next_one_is_due(store: Store, aio: Any) -> None:
    run = await with_callback(store, "e1")
    (first,) = await take(store)
    await store.record_delivery(first, "d1", failed(T0 + 40), T0 + 1, 20)
    await store.finish(run.run_id, "w1", 1, SUCCEEDED, T0 + 2)
    claimed, due = await store.claim_notifications("d1", 10, T0 + 2, SEND_LEASE)
    assert claimed == [] and due == ms(T0 + 40)  # the later one is blocked, not due


@async_test
async def test_notification_leases_expire_and_can_be_released(store: Store, aio: Any) -> None:
    await with_callback(store, "e1")
    (first,) = await take(store, "d1")
    assert await take(store, "d2", now=T0 + SEND_LEASE - 1) == []
    (again,) = await take(store, "d2", now=T0 + SEND_LEASE)  # the sender died
    assert again.pk == first.pk
    # the first sender's result is dropped: the lease is gone
    assert await store.record_delivery(first, "d1", sent(), T0 + SEND_LEASE + 1, 20) is None
    assert [n["state"] for n in await store.notifications(first.run_id)] == ["pending"]
    assert await store.release_notification_leases("*", T0 + SEND_LEASE + 2) == 1
    (third,) = await take(store, "d3", now=T0 + SEND_LEASE + 2)
    assert third.pk == first.pk


@async_test
async def test_a_dead_notification_is_kept_and_lets_the_next_one_go(
        store: Store, aio: Any) -> None:
    run = await with_callback(store, "e1")
    await store.finish(run.run_id, "w1", 1, SUCCEEDED, T0 + 1)
    (first,) = await take(store, now=T0 + 1)
    await store.record_delivery(first, "d1", DeliveryResult("dead", "timeout"), T0 + 2, 20)
    (later,) = await take(store, now=T0 + 2)
    assert later.notification_id.endswith(":succeeded:0")
    dead = await store.list_notifications("dead", 10)
    assert [(n["notification_id"], n["attempts"], n["last_error"], n["next_attempt_at"])
            for n in dead] == [(first.notification_id, 1, "timeout", None)]
    assert [n["notification_id"] for n in await store.list_notifications(None, 10)] == [
        later.notification_id, first.notification_id]


@async_test
async def test_consecutive_failures_pause_a_destination_until_resumed(
        store: Store, aio: Any) -> None:
    run = await with_callback(store, "e1")
    now = T0
    for number in range(1, 4):
        (n,) = await take(store, now=now)
        paused = await store.record_delivery(n, "d1", failed(now), now, 3)
        assert (paused is not None) == (number == 3)
    (dest,) = [d for d in await store.destinations() if d["destination"] == HOOK_ORIGIN]
    assert (dest["state"], dest["consecutive_failures"], dest["pending"]) == ("paused", 3, 1)
    # paused: its notification waits; another destination is not held up
    other = await with_callback(store, "e2", OTHER_HOOK, now=now)
    waiting = await take(store, now=now + 1)
    assert [x.run_id for x in waiting] == [other.run_id]
    with pytest.raises(DestinationNotFound):
        await store.resume_destination("https://nowhere.example:443", now)
    await store.resume_destination(HOOK_ORIGIN, now + 2)
    (n,) = await take(store, now=now + 2)
    assert n.run_id == run.run_id and n.attempts == 3
    await store.record_delivery(n, "d1", sent(), now + 3, 3)
    (dest,) = [d for d in await store.destinations() if d["destination"] == HOOK_ORIGIN]
    assert (dest["state"], dest["consecutive_failures"], dest["pending"]) == ("active", 0, 0)


@async_test
async def test_a_result_from_an_expired_lease_of_the_same_owner_is_dropped(
        store: Store, aio: Any) -> None:
    await with_callback(store, "e1")
    (stale,) = await take(store, "d1")
    (fresh,) = await take(store, "d1", now=T0 + SEND_LEASE)  # the same sender, again
    assert await store.record_delivery(stale, "d1", failed(T0 + 99), T0 + 31, 20) is None
    await store.record_delivery(fresh, "d1", sent(), T0 + 32, 20)
    (shown,) = await store.notifications(stale.run_id)
    assert (shown["state"], shown["attempts"]) == ("delivered", 1)


@async_test
async def test_resuming_sends_waiting_retries_at_once(store: Store, aio: Any) -> None:
    run = await with_callback(store, "e1")
    await store.finish(run.run_id, "w1", 1, SUCCEEDED, T0 + 1)
    (n,) = await take(store, now=T0 + 1)
    # a failure that schedules a retry far away, and pauses the destination
    await store.record_delivery(n, "d1", failed(T0 + 36_000, pause="gone"), T0 + 2, 20)
    other = await with_callback(store, "e2", now=T0 + 3)  # queued while paused
    assert await take(store, now=T0 + 36_000) == []
    await store.resume_destination(HOOK_ORIGIN, T0 + 4)
    resumed = await take(store, now=T0 + 4)
    assert sorted(x.notification_id for x in resumed) == sorted(
        [n.notification_id, f"{other.run_id}:processing:0"])
    for x in resumed:
        await store.record_delivery(x, "d1", sent(), T0 + 5, 20)
    (last,) = await take(store, now=T0 + 5)  # the run's later one follows in order
    assert last.notification_id == f"{run.run_id}:succeeded:0"


@async_test
async def test_many_waiting_notifications_do_not_hold_up_others(store: Store, aio: Any) -> None:
    runs = [await with_callback(store, f"p{i}") for i in range(50)]
    for run in runs:  # each run's second notification waits for its first
        await store.finish(run.run_id, "w1", 1, SUCCEEDED, T0 + 1)
    first = await take(store, now=T0 + 1, limit=100)
    assert len(first) == 50 and all(":processing:" in n.notification_id for n in first)
    for n in first[:25]:
        await store.record_delivery(n, "d1", sent(), T0 + 2, 20)
    following = await take(store, now=T0 + 2, limit=100)
    assert sorted(n.run_id for n in following) == sorted(n.run_id for n in first[:25])
    assert all(":succeeded:" in n.notification_id for n in following)


@async_test
async def test_a_pause_reason_pauses_at_once(store: Store, aio: Any) -> None:
    await with_callback(store, "e1")
    (n,) = await take(store)
    reason = await store.record_delivery(n, "d1", failed(T0, "http_410", "gone"), T0, 20)
    assert reason == "gone"
    assert await take(store, now=T0 + 1) == []
    (dest,) = await store.destinations()
    assert dest["paused_reason"] == "gone"


@async_test
async def test_lease_expiry_dead_letter_is_notified(store: Store, aio: Any) -> None:
    run = await with_callback(store, "e1")
    result = await claim(store, now=T0 + LEASE, max_attempts=1)
    assert [(t.status, t.notify) for t in result.transitions] == [("dead_lettered", True)]
    ids = [n["notification_id"] for n in await store.notifications(run.run_id)]
    assert ids == [f"{run.run_id}:processing:0", f"{run.run_id}:dead_lettered:0"]


@async_test
async def test_a_reclaimed_run_notifies_its_new_attempt(store: Store, aio: Any) -> None:
    run = await with_callback(store, "e1")
    await claim_one(store, "w2", now=T0 + LEASE)
    # the first holder's late outcome is dropped, and so is its notification
    assert await store.finish(run.run_id, "w1", 1, SUCCEEDED, T0 + LEASE + 1) is None
    ids = [n["notification_id"] for n in await store.notifications(run.run_id)]
    assert ids == [f"{run.run_id}:processing:0", f"{run.run_id}:processing:1"]


# -- agent chains ------------------------------------------------------------------------


def emitted(parent: str, index: int, event_type: str = "session.exported", hop: int = 1,
            agents: Sequence[str] = ("b",), max_hops: int = 8, chain: str = "e1") -> Emitted:
    event_id = f"{parent}.e{index}"
    body = json.dumps({
        "schema_version": "v1", "event_id": event_id,
        "idempotency_key": f"agentbox:{event_type}:{event_id}", "event_type": event_type,
        "source": "agentbox", "timestamp": "2026-07-27T15:42:00Z", "correlation_id": chain,
        "causation_id": "e1", "hop": hop, "payload": {
            "project_id": "p", "mix_url": "/m.wav",
            **({"requested_by": "t"} if event_type == "mix.review_requested" else {})},
    }).encode()
    return Emitted(parse_event(body), body, tuple(agents), T0 + TTL, max_hops)


@async_test
async def test_emitted_events_are_stored_with_the_success_and_run(store: Store, aio: Any) -> None:
    run = await ingest_and_claim(store, "e1")
    outcome = Outcome(RunStatus.SUCCEEDED, result={}, emitted=(
        emitted(run.run_id, 0, agents=("b", "c")), emitted(run.run_id, 0)))  # the same twice
    transition = await store.finish(run.run_id, "w1", 1, outcome, T0 + 1)
    assert transition is not None
    assert [(t.agent, t.status, t.event_id) for t in transition.spawned] == [
        ("b", "accepted", f"{run.run_id}.e0"), ("c", "accepted", f"{run.run_id}.e0")]
    ((event, run_ids),) = [e for e in transition.emitted if e[1]]
    assert event.envelope.hop == 1 and len(run_ids) == 2
    claimed = await claim(store, "w2", now=T0 + 1)
    assert sorted(c.agent for c in claimed.claimed) == ["b", "c"]
    view = await store.get_run(run_ids[0])
    assert view is not None
    assert (view["correlation_id"], view["causation_id"], view["hop"]) == ("e1", "e1", 1)


@async_test
async def test_emitted_events_are_dropped_when_the_run_does_not_succeed(
        store: Store, aio: Any) -> None:
    run = await ingest_and_claim(store, "e1")
    outcome = Outcome(RunStatus.FAILED_PERMANENT, error_code="x",
                      emitted=(emitted(run.run_id, 0),))
    transition = await store.finish(run.run_id, "w1", 1, outcome, T0 + 1)
    assert transition is not None and transition.spawned == ()
    assert (await claim(store, now=T0 + 1)).claimed == []


@async_test
async def test_a_loop_or_a_long_chain_is_recorded_dead_lettered(store: Store, aio: Any) -> None:
    run = await ingest_and_claim(store, "e1")  # agent mix_review handled session.exported
    outcome = Outcome(RunStatus.SUCCEEDED, result={}, emitted=(
        emitted(run.run_id, 0, agents=("mix_review", "other")),
        emitted(run.run_id, 1, hop=3, agents=("third",), max_hops=2)))
    transition = await store.finish(run.run_id, "w1", 1, outcome, T0 + 1)
    assert transition is not None
    assert [(t.agent, t.status, t.error_code) for t in transition.spawned] == [
        ("mix_review", "dead_lettered", "loop_detected"), ("other", "accepted", None),
        ("third", "dead_lettered", "loop_detected")]
    stopped = await store.get_run(transition.spawned[0].run_id)
    assert stopped is not None and stopped["terminal"] and stopped["attempt"] == 0
    assert "already handled session.exported" in stopped["error_message"]
    claimed = await claim(store, now=T0 + 1)
    assert [c.agent for c in claimed.claimed] == ["other"]


@async_test
async def test_only_ancestors_count_as_a_loop(store: Store, aio: Any) -> None:
    """Two emits of one type, fan-out siblings and another render sharing the
    correlation id are not loops; coming back along the causal path is."""
    first = await ingest_and_claim(store, "e1")
    outcome = Outcome(RunStatus.SUCCEEDED, result={}, emitted=(
        emitted(first.run_id, 0, "mix.review_requested", agents=("z",)),
        emitted(first.run_id, 1, "mix.review_requested", agents=("z",))))
    done = await store.finish(first.run_id, "w1", 1, outcome, T0 + 1)
    assert done is not None
    assert [t.status for t in done.spawned] == ["accepted", "accepted"]
    # another render with the same correlation id: z may handle its follow-up too
    body = event_body("e2").replace(b'"source"', b'"correlation_id": "e1", "source"')
    await store.ingest(parse_event(body), body, ["mix_review"], T0 + 2, TTL, MAX_PENDING)
    second = await claim(store, "w2", now=T0 + 2, limit=10)
    render = next(c for c in second.claimed if c.agent == "mix_review")
    outcome = Outcome(RunStatus.SUCCEEDED, result={}, emitted=(
        emitted(render.run_id, 0, "mix.review_requested", agents=("z",)),))
    again = await store.finish(render.run_id, "w2", render.attempt, outcome, T0 + 3)
    assert again is not None and [t.status for t in again.spawned] == ["accepted"]
    # z's run, emitting session.exported back to mix_review: its ancestor handled that
    z_run = next(c for c in second.claimed if c.agent == "z")
    back = Outcome(RunStatus.SUCCEEDED, result={}, emitted=(
        emitted(z_run.run_id, 0, hop=2, agents=("mix_review",)),))
    looped = await store.finish(z_run.run_id, "w2", z_run.attempt, back, T0 + 4)
    assert looped is not None
    assert [(t.status, t.error_code) for t in looped.spawned] == [
        ("dead_lettered", "loop_detected")]


@async_test
async def test_an_incoming_event_past_the_hop_limit_is_stored_stopped(
        store: Store, aio: Any) -> None:
    event = emitted("outside", 0, hop=9).event
    body = event.envelope.model_dump_json().encode()
    result = await store.ingest(event, body, ["a"], T0, TTL, MAX_PENDING, max_hops=8)
    (ref,) = result.runs
    assert ref.status == "dead_lettered"
    view = await store.get_run(ref.run_id)
    assert view is not None and view["error_code"] == "loop_detected"
    assert "AGENTBOX_MAX_HOPS is 8" in view["error_message"]
    assert (await claim(store)).claimed == []
    assert (await store.stats())["active"] == 0


# -- reads -------------------------------------------------------------------------------


@async_test
async def test_get_run_follows_the_run(store: Store, aio: Any) -> None:
    assert await store.get_run("run_missing") is None
    run = await ingest_and_claim(store, "e1")
    await store.finish(run.run_id, "w1", 1, retryable(T0 + 20), T0 + 5)
    second = await claim_one(store, "w2", now=T0 + 20)
    await store.finish(run.run_id, "w2", second.attempt, Outcome(RunStatus.SUCCEEDED,
                                                                 result=[1, 2]), T0 + 21)
    view = await store.get_run(run.run_id)
    assert view is not None
    expected = {
        "run_id": run.run_id, "status": "succeeded", "event_id": "e1",
        "event_type": "session.exported", "source": "studio", "agent": "mix_review",
        "retry_count": 1, "result": [1, 2], "error_code": None,
    }
    assert {k: view[k] for k in expected} == expected
    times = {k: at(view[k]) for k in ("accepted_at", "started_at", "updated_at", "completed_at")}
    assert times == {"accepted_at": ms(T0), "started_at": ms(T0), "updated_at": ms(T0 + 21),
                     "completed_at": ms(T0 + 21)}


@async_test
async def test_attempts_record_the_history(store: Store, aio: Any) -> None:
    assert await store.attempts("run_missing") == []
    run = await ingest_and_claim(store, "e1", "w1")
    assert [a["finished_at"] for a in await store.attempts(run.run_id)] == [None]
    await store.finish(run.run_id, "w1", 1, retryable(T0 + 10), T0 + 1.5)
    await claim_one(store, "w2", now=T0 + 10)
    await store.finish(run.run_id, "w2", 2, SUCCEEDED, T0 + 12)
    attempts = await store.attempts(run.run_id)
    assert [(a["attempt"], a["worker"], a["outcome"], a["error_code"]) for a in attempts] == [
        (1, "w1", "failed_retryable", "timeout"), (2, "w2", "succeeded", None)]
    assert [(at(a["started_at"]), at(a["finished_at"])) for a in attempts] == [
        (ms(T0), ms(T0 + 1.5)), (ms(T0 + 10), ms(T0 + 12))]
    assert [a["duration_ms"] for a in attempts] == [ms(1500), ms(2000)]


def test_runs_are_counted_from_the_status_index_alone(tmp_path: Path) -> None:
    """/healthz, the status page and the metrics count runs by state: on SQLite from the
    status index, not by reading every row (a million runs: 70 ms against 490 ms here),
    and find the oldest waiting run in one step of the waiting runs' index."""
    conn = sqlite3.connect(tmp_path / "plan.sqlite3")
    migrate(conn, tmp_path / "plan.sqlite3")
    plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + SQL_STATUS_COUNTS)]
    conn.close()
    assert any("COVERING INDEX runs_status" in step for step in plan), plan
    assert any("SEARCH runs USING INDEX runs_waiting" in step for step in plan), plan


@async_test
async def test_stats_and_list_runs(store: Store, aio: Any) -> None:
    empty = await store.stats()
    assert empty["runs"] == dict.fromkeys(STATUSES, 0) and empty["active"] == 0
    assert empty["oldest_waiting_accepted_at"] is None
    assert await store.next_due_at() is None
    ok = await ingest_and_claim(store, "ok", now=T0)
    await store.finish(ok.run_id, "w1", 1, SUCCEEDED, T0 + 1)
    busy = await ingest_and_claim(store, "busy", now=T0 + 2)
    waiting = [(await ingest(store, f"w{i}", now=T0 + 3 + i)).runs[0].run_id for i in range(3)]
    stats = await store.stats()
    assert stats["runs"] == {**dict.fromkeys(STATUSES, 0), "succeeded": 1, "processing": 1,
                             "accepted": 3}
    assert stats["active"] == 4
    assert at(stats["oldest_waiting_accepted_at"]) == ms(T0 + 3)
    # Only membership and limits: "newest" may be judged by the engine's own clock.
    assert sorted(v["run_id"] for v in await store.list_runs("accepted", 10)) == sorted(waiting)
    two = await store.list_runs("accepted", 2)
    assert len(two) == 2 and {v["run_id"] for v in two} <= set(waiting)
    assert [v["run_id"] for v in await store.list_runs("processing", 10)] == [busy.run_id]
    everything = await store.list_runs(None, 10)
    assert sorted(v["run_id"] for v in everything) == sorted([*waiting, busy.run_id, ok.run_id])
    assert all(v["status"] in STATUSES for v in everything)
    assert await store.next_due_at() == ms(T0 + 3)


@async_test
async def test_runs_are_found_by_project_however_the_sender_spelled_it(
        store: Store, aio: Any) -> None:
    names = ["night_drive", "Night_Drive", "nightXdrive", "50% done", "50X done", "Über Nacht",
             'say "hi"', "back\\slash", "night-drive", "a/b & c"]

    def php_like(text: str) -> str:  # upper-case hex escapes, "/" escaped
        return re.sub(r"\\u([0-9a-f]{4})", lambda m: "\\u" + m.group(1).upper(),
                      text).replace("/", "\\/")

    spellings: list[Callable[[dict[str, Any]], str]] = [
        lambda event: json.dumps(event, separators=(",", ":")),
        lambda event: json.dumps(event, ensure_ascii=False, separators=(", ", ": ")),
        lambda event: php_like(json.dumps(event)),
    ]
    runs: dict[str, set[str]] = {name: set() for name in names}
    for n, name in enumerate(names):
        for k, spell in enumerate(spellings):
            event_id = f"p{n}s{k}"
            body = spell({
                "schema_version": "v1", "event_id": event_id,
                "idempotency_key": f"studio:session.exported:{event_id}",
                "event_type": "session.exported", "source": "studio",
                "timestamp": "2026-07-27T15:42:00Z",
                "payload": {"project_id": name, "mix_url": "/m.wav",
                            "session_name": "a NUL \u0000 elsewhere"}}).encode()
            result = await store.ingest(parse_event(body), body, ["mix_review"], T0, TTL,
                                        MAX_PENDING)
            runs[name].add(result.runs[0].run_id)
    # A plugin's free-text project may hold a NUL, which PostgreSQL's JSON refuses:
    # no search fails for it (what "nul" finds differs: SQLite ends the text at the
    # NUL, PostgreSQL matches nothing), and no other name finds it.
    event_id = "nul-project"
    valid = event_body(event_id)
    stored = valid.replace(b'"project_id": "p"', b'"project_id": "nul\\u0000"')
    assert stored != valid
    await store.ingest(parse_event(valid), stored, ["mix_review"], T0, TTL, MAX_PENDING)
    assert len(await store.search_runs(project="nul")) <= 1
    assert await store.search_runs(text="nul\u0000") == []  # asked with a NUL: nothing
    assert await store.get_run("run_\u0000") is None
    with pytest.raises(RunNotFound):
        await store.replay("run_\u0000", T0)
    for name in names:
        found = {run["run_id"] for run in await store.search_runs(project=name)}
        assert found == runs[name], name  # exact: no wildcards, case counts, any spelling
        assert {run["run_id"] for run in await store.search_runs(text=name)} == runs[name]


# -- durability --------------------------------------------------------------------------


def test_data_survives_close_and_reopen(make_store: Callable[[], Store], aio: Any) -> None:
    store = make_store()
    run = aio(ingest_and_claim(store, "e1"))
    aio(store.finish(run.run_id, "w1", 1, Outcome(RunStatus.SUCCEEDED, result={"a": 1}), T0 + 1))
    waiting = aio(ingest(store, "e2", agents=["a", "b"], now=T0 + 2))
    view, attempts, stats = (aio(store.get_run(run.run_id)), aio(store.attempts(run.run_id)),
                             aio(store.stats()))
    aio(store.close())
    reopened = make_store()
    assert aio(reopened.get_run(run.run_id)) == view
    assert aio(reopened.attempts(run.run_id)) == attempts
    assert aio(reopened.stats()) == stats
    again = aio(ingest(reopened, "e2", now=T0 + 3))  # the idempotency claim is durable too
    assert again.duplicate and again.runs == waiting.runs
    claimed = aio(claim(reopened, now=T0 + 3)).claimed
    assert {c.agent for c in claimed} == {"a", "b"}
    assert {c.event_body for c in claimed} == {event_body("e2")}


def test_a_second_store_is_refused_unless_the_engine_is_shared(
    engine: Engine, make_store: Callable[[], Store], aio: Any
) -> None:
    first = make_store()
    if not engine.single_process:  # shared by several instances by design: both work
        second = make_store()
        aio(ingest(first, "e1"))
        assert aio(ingest(second, "e1")).duplicate
        assert aio(second.stats())["active"] == 1
        return
    with pytest.raises(StorageUnavailable):
        make_store()
    aio(ingest(first, "e1"))  # the refused second store did not disturb the first
    aio(first.close())
    assert aio(make_store().stats())["active"] == 1


def stores_on_one_database(engine: Engine, make_store: Callable[[], Store]) -> list[Store]:
    """Three stores on the database where the engine allows it (instances), else one."""
    return [make_store()] if engine.single_process else [make_store() for _ in range(3)]


def test_concurrent_deliveries_of_one_key_make_one_event(
    engine: Engine, make_store: Callable[[], Store], aio: Any
) -> None:
    stores = stores_on_one_database(engine, make_store)

    async def deliver() -> list[IngestResult]:
        return await asyncio.gather(*(ingest(stores[i % len(stores)], "same")
                                      for i in range(30)))

    results = aio(deliver())
    assert sum(not result.duplicate for result in results) == 1
    assert {result.runs[0].run_id for result in results} == {results[0].runs[0].run_id}
    assert aio(stores[0].stats())["runs"]["accepted"] == 1


def test_concurrent_claims_never_take_one_run_twice(
    engine: Engine, make_store: Callable[[], Store], aio: Any
) -> None:
    stores = stores_on_one_database(engine, make_store)
    for n in range(40):
        aio(ingest(stores[n % len(stores)], f"e{n}"))

    async def claim_all() -> list[ClaimResult]:
        return await asyncio.gather(*(claim(stores[i % len(stores)], f"w{i}", limit=7)
                                      for i in range(8)))

    claimed = [run.run_id for result in aio(claim_all()) for run in result.claimed]
    assert len(claimed) == len(set(claimed)) == 40
    leases = engine.leases()
    assert all(status == "processing" for status, _, _ in leases.values())


def test_a_database_from_a_newer_agentbox_is_refused_untouched(
    engine: Engine, make_store: Callable[[], Store], aio: Any
) -> None:
    store = make_store()
    run_id = aio(ingest(store, "e1")).runs[0].run_id
    aio(store.close())
    engine.set_schema_version(99)
    newer = engine.new_store()
    with pytest.raises(SchemaTooNew, match="newer"):
        aio(newer.open())
    engine.set_schema_version(len(MIGRATIONS))  # as it was: the refusal changed nothing
    reopened = make_store()
    assert aio(reopened.get_run(run_id))["status"] == "accepted"


def test_a_database_from_before_schema_versions_is_migrated_in_place(
    engine: Engine, make_store: Callable[[], Store], aio: Any
) -> None:
    store = make_store()
    run_id = aio(ingest(store, "e1")).runs[0].run_id
    aio(store.close())
    engine.set_schema_version(0)  # tables there, no version recorded: the first releases
    reopened = make_store()  # applies version 1 again: it only adds what is missing
    assert aio(reopened.get_run(run_id))["status"] == "accepted"
    assert not aio(ingest(reopened, "e2")).duplicate
    assert engine.schema()[0] == len(MIGRATIONS)


def test_a_version_1_database_is_migrated_to_the_newest(
    engine: Engine, make_store: Callable[[], Store], aio: Any
) -> None:
    store = make_store()
    first = aio(ingest(store, "e1", now=T0)).runs[0].run_id
    aio(ingest(store, "e2", now=T0 + 5))
    aio(store.close())
    engine.drop_index("runs_waiting")  # what version 2 added
    engine.set_schema_version(1)
    version, indexes = engine.schema()
    assert version == 1 and "runs_waiting" not in indexes
    reopened = make_store()
    version, indexes = engine.schema()
    assert version == len(MIGRATIONS) == 2 and "runs_waiting" in indexes
    assert aio(reopened.get_run(first))["status"] == "accepted"
    stats = aio(reopened.stats())
    assert stats["runs"]["accepted"] == 2
    assert at(stats["oldest_waiting_accepted_at"]) == ms(T0)


def test_reads_after_close_raise_storage_unavailable(store: Store, aio: Any) -> None:
    aio(store.close())
    with pytest.raises(StorageUnavailable):
        aio(store.get_run("run_x"))


def test_write_after_close_raises_storage_unavailable(store: Store, aio: Any) -> None:
    aio(store.close())
    with pytest.raises(StorageUnavailable):
        aio(asyncio.wait_for(ingest(store, "late"), 1.0))


def test_close_answers_every_write_in_flight(make_store: Callable[[], Store], aio: Any) -> None:
    store = make_store()
    written: list[str] = []

    async def client(n: int) -> None:
        for round_ in range(50):
            key = f"c{n}r{round_}"
            try:
                await ingest(store, key)
            except StorageUnavailable:
                return
            written.append(key)

    async def scenario() -> set[asyncio.Task[None]]:
        clients = {asyncio.create_task(client(n)) for n in range(100)}
        await asyncio.sleep(0.005)
        await store.close()
        _, pending = await asyncio.wait(clients, timeout=1.0)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        return pending

    pending = aio(scenario())
    assert not pending, f"{len(pending)} writers were never answered"
    reopened = make_store()
    assert len(aio(reopened.list_runs(None, 10_000))) == len(written)


# -- the state machine -------------------------------------------------------------------

KEYS = ["k0", "k1", "k2"]
OWNERS = ["w1", "w2"]
MACHINE_PENDING = 4  # small, so that admission refusals happen
MACHINE_TTL = 40.0  # short, so that keys expire within an example
RETRY_DELAY = 1.5  # between two clock steps, so that an early retry shows
WAITS = st.sampled_from([0.0, 1.0, 5.0, LEASE, 30.0])  # the clock moves before most rules


@dataclass
class ModelRun:
    status: RunStatus = RunStatus.ACCEPTED
    attempt: int = 0
    base: int = 0  # attempt count at the last replay
    owner: str | None = None
    lease_until: float | None = None
    next_at: float | None = None


class StoreMachine(RuleBasedStateMachine):
    """Random interleavings against a model of what the store must hold."""

    engine_name = "sqlite"  # set per engine by test_store_state_machine

    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="agentbox-store-"))
        self.engine = ENGINES[self.engine_name](self.directory)
        self.runner = asyncio.Runner()
        self.store = self.engine.new_store()
        self.aio(self.store.open())
        self.now = T0
        self.keys: dict[str, tuple[list[str], float]] = {}  # key -> (run ids, expires at)
        self.runs: dict[str, ModelRun] = {}
        self.stale: list[tuple[str, str, int]] = []  # (run, owner, attempt) no longer current

    def aio(self, awaitable: Awaitable[T]) -> T:
        return self.runner.run(awaitable)  # type: ignore[arg-type]

    def teardown(self) -> None:
        try:
            self.aio(self.store.close())
        finally:
            self.runner.close()
            self.engine.dispose()
            shutil.rmtree(self.directory, ignore_errors=True)

    def active(self) -> int:
        return sum(r.status not in TERMINAL for r in self.runs.values())

    def next_due(self) -> float | None:
        times = [r.next_at for r in self.runs.values()
                 if r.status in (RunStatus.ACCEPTED, RunStatus.FAILED_RETRYABLE)]
        times += [r.lease_until for r in self.runs.values() if r.status is RunStatus.PROCESSING]
        due = [t for t in times if t is not None]
        return min(due) if due else None

    def ids_with(self, *statuses: RunStatus) -> list[str]:
        return sorted(i for i, r in self.runs.items() if r.status in statuses)

    # -- rules ---------------------------------------------------------------------------

    @initialize()
    def some_work(self) -> None:
        for key in KEYS[:2]:  # so that every example has runs to claim from its first step
            self.ingest(0.0, key, 1)

    @rule(wait=WAITS, key=st.sampled_from(KEYS), agents=st.integers(1, 2))
    def ingest(self, wait: float, key: str, agents: int) -> None:
        self.now += wait
        names = [f"agent{i}" for i in range(agents)]
        known = self.keys.get(key)
        live = known is not None and known[1] > self.now
        active = self.active()
        try:
            result = self.aio(ingest(self.store, key, agents=names, now=self.now,
                                     ttl=MACHINE_TTL, max_pending=MACHINE_PENDING))
        except AdmissionRefused as refused:
            assert not live and active + agents > MACHINE_PENDING
            assert (refused.pending, refused.limit) == (active, MACHINE_PENDING)
            return
        if live:
            assert known is not None and result.duplicate
            assert [r.run_id for r in result.runs] == known[0]
            assert [r.status for r in result.runs] == [self.runs[i].status for i in known[0]]
            return
        assert not result.duplicate and active + agents <= MACHINE_PENDING
        assert [(r.agent, r.status) for r in result.runs] == [(n, "accepted") for n in names]
        ids = [r.run_id for r in result.runs]
        assert self.runs.keys().isdisjoint(ids)
        for run_id in ids:
            self.runs[run_id] = ModelRun(next_at=self.now)
        self.keys[key] = (ids, self.now + MACHINE_TTL)

    @rule(wait=WAITS, owner=st.sampled_from(OWNERS), limit=st.integers(1, 4),
          max_attempts=st.integers(1, MAX_ATTEMPTS))
    def claim(self, wait: float, owner: str, limit: int, max_attempts: int) -> None:
        self.now += wait
        expired = {i for i in self.ids_with(RunStatus.PROCESSING)
                   if self.runs[i].lease_until is not None
                   and self.runs[i].lease_until <= self.now}  # type: ignore[operator]
        waiting = {i for i in self.ids_with(RunStatus.ACCEPTED, RunStatus.FAILED_RETRYABLE)
                   if self.runs[i].next_at <= self.now}  # type: ignore[operator]
        result = self.aio(self.store.claim(owner, limit, self.now, LEASE, max_attempts))
        dead = [t for t in result.transitions if t.status == "dead_lettered"]
        handled = [c.run_id for c in result.claimed] + [t.run_id for t in dead]
        assert len(handled) == len(set(handled)) and len(result.claimed) <= limit
        # Progress: as many due runs as asked for are claimed or dead-lettered.
        assert len(handled) >= min(limit, len(expired) + len(waiting))
        for t in dead:
            run = self.runs[t.run_id]
            assert t.run_id in expired and run.attempt - run.base >= max_attempts
            assert t.error_code == "lease_expired"
            self.stale.append((t.run_id, run.owner or "", run.attempt))
            run.status, run.owner, run.lease_until = RunStatus.DEAD_LETTERED, None, None
        for c in result.claimed:
            run = self.runs[c.run_id]
            assert run.status not in TERMINAL, f"claimed a {run.status} run"
            assert c.run_id in expired | waiting
            if c.run_id in expired:
                assert run.attempt - run.base < max_attempts
                self.stale.append((c.run_id, run.owner or "", run.attempt))
            assert (c.attempt, c.round_attempt) == (run.attempt + 1, run.attempt + 1 - run.base)
            run.status, run.attempt = RunStatus.PROCESSING, c.attempt
            run.owner, run.lease_until, run.next_at = owner, self.now + LEASE, None
        if len(result.claimed) < limit:
            assert result.next_due_at == self.next_due()

    @precondition(lambda self: self.ids_with(RunStatus.PROCESSING))
    @rule(pick=st.integers(0, 1000), kind=st.sampled_from(
        ["succeeded", "failed_retryable", "failed_permanent", "dead_lettered"]))
    def finish(self, pick: int, kind: str) -> None:
        processing = self.ids_with(RunStatus.PROCESSING)
        run_id = processing[pick % len(processing)]
        run = self.runs[run_id]
        assert run.owner is not None
        outcome = {
            "succeeded": Outcome(RunStatus.SUCCEEDED, result={"pick": pick}),
            "failed_retryable": retryable(self.now + RETRY_DELAY),
            "failed_permanent": PERMANENT,
            "dead_lettered": DEAD,
        }[kind]
        transition = self.aio(self.store.finish(run_id, run.owner, run.attempt, outcome,
                                                self.now))
        assert transition is not None
        assert (transition.status, transition.attempt) == (kind, run.attempt)
        self.stale.append((run_id, run.owner, run.attempt))
        run.status, run.owner, run.lease_until = RunStatus(kind), None, None
        run.next_at = outcome.next_attempt_at

    @precondition(lambda self: self.stale or self.ids_with(RunStatus.PROCESSING))
    @rule(pick=st.integers(0, 1000))
    def finish_without_the_lease(self, pick: int) -> None:
        processing = self.ids_with(RunStatus.PROCESSING)
        candidates = [(i, "intruder", self.runs[i].attempt) for i in processing]
        # Old attempts of runs now running again are the ones a store could mistake.
        candidates += [s for s in self.stale if s[0] in processing] or self.stale
        run_id, owner, attempt = candidates[pick % len(candidates)]
        assert self.aio(self.store.finish(run_id, owner, attempt, SUCCEEDED, self.now)) is None


    @precondition(lambda self: self.ids_with(RunStatus.DEAD_LETTERED, RunStatus.FAILED_PERMANENT))
    @rule(pick=st.integers(0, 1000))
    def replay(self, pick: int) -> None:
        candidates = self.ids_with(RunStatus.DEAD_LETTERED, RunStatus.FAILED_PERMANENT)
        run_id = candidates[pick % len(candidates)]
        transition = self.aio(self.store.replay(run_id, self.now))
        assert (transition.run_id, transition.status) == (run_id, "accepted")
        run = self.runs[run_id]
        run.status, run.base, run.next_at = RunStatus.ACCEPTED, run.attempt, self.now

    @rule(pick=st.integers(0, 1000))
    def replay_refused(self, pick: int) -> None:
        candidates = [*self.ids_with(RunStatus.ACCEPTED, RunStatus.PROCESSING,
                                     RunStatus.FAILED_RETRYABLE, RunStatus.SUCCEEDED),
                      "run_missing"]
        run_id = candidates[pick % len(candidates)]
        expected = RunNotFound if run_id == "run_missing" else NotReplayable
        with pytest.raises(expected):
            self.aio(self.store.replay(run_id, self.now))

    @rule(wait=st.sampled_from([0.0, 1.0, 30.0, 60.0]))
    def prune(self, wait: float) -> None:
        self.now += wait
        expired = [k for k, (_, expires) in self.keys.items() if expires <= self.now]
        assert self.aio(self.store.prune_idempotency_keys(self.now, 1000)) == len(expired)
        for key in expired:
            del self.keys[key]

    @rule(wait=WAITS, owner=st.sampled_from([*OWNERS, "*"]))
    def release(self, wait: float, owner: str) -> None:
        self.now += wait
        held = [self.runs[i] for i in self.ids_with(RunStatus.PROCESSING)
                if owner == "*" or self.runs[i].owner == owner]
        assert self.aio(self.store.release_leases(owner, self.now)) == len(held)
        for run in held:
            run.lease_until = self.now

    @rule(owner=st.sampled_from(OWNERS), seconds=st.sampled_from([LEASE, 3 * LEASE]),
          stale=st.booleans())
    def extend(self, owner: str, seconds: float, stale: bool) -> None:
        processing = self.ids_with(RunStatus.PROCESSING)  # other owners' runs are ignored
        # `stale`: an earlier attempt's holder asks (its run was claimed again since).
        attempts = [(run_id, self.runs[run_id].attempt - stale) for run_id in processing]
        held = self.aio(self.store.extend_leases(owner, attempts, self.now + seconds))
        renewed = [] if stale else [run_id for run_id in processing
                                    if self.runs[run_id].owner == owner]
        assert held == sorted(renewed)
        for run_id in renewed:
            self.runs[run_id].lease_until = self.now + seconds

    @rule()
    def reopen(self) -> None:
        self.aio(self.store.close())
        self.store = self.engine.new_store()
        self.aio(self.store.open())

    # -- invariants ----------------------------------------------------------------------

    @invariant()
    def runs_match_the_model(self) -> None:
        views = self.aio(self.store.list_runs(None, 10_000))
        assert {v["run_id"] for v in views} == set(self.runs)
        for view in views:
            run = self.runs[view["run_id"]]
            assert view["status"] in STATUSES
            assert (view["status"], view["attempt"]) == (run.status.value, run.attempt)
            assert view["retry_count"] == max(run.attempt - 1, 0)

    @invariant()
    def only_processing_runs_hold_a_lease(self) -> None:
        for run_id, (status, owner, until) in self.engine.leases().items():
            assert (status == "processing") == (owner is not None), (run_id, status, owner)
            if status == "processing":
                assert (owner, until) == (self.runs[run_id].owner, self.runs[run_id].lease_until)

    @invariant()
    def stats_match_the_model(self) -> None:
        stats = self.aio(self.store.stats())
        expected = dict.fromkeys(STATUSES, 0)
        for run in self.runs.values():
            expected[run.status.value] += 1
        assert stats["runs"] == expected and stats["active"] == self.active()

    @invariant()
    def next_due_matches_the_model(self) -> None:
        assert self.aio(self.store.next_due_at()) == self.next_due()


@pytest.mark.parametrize("engine_name", sorted(ENGINES))
def test_store_state_machine(engine_name: str, request: pytest.FixtureRequest) -> None:
    prepare_engine(request, engine_name)
    machine = type(f"StoreMachine_{engine_name}", (StoreMachine,), {"engine_name": engine_name})
    run_state_machine_as_test(
        machine,
        # Every step commits: on PostgreSQL (a network round trip and a WAL flush
        # each) fewer examples keep the suite's time in bounds.
        settings=settings(max_examples=30 if engine_name == "sqlite" else 10,
                          stateful_step_count=30, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow]),
    )
