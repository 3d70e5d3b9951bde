"""Durability, concurrency across instances, and schema migrations (every engine)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from agentbox.runs import RunStatus
from agentbox.store import (
    ClaimResult,
    IngestResult,
    Outcome,
    SchemaTooNew,
    StorageUnavailable,
    Store,
)
from agentbox.store.sqlite import MIGRATIONS
from tests.store.conftest import (
    Engine,
)
from tests.store.support import (
    T0,
    at,
    claim,
    event_body,
    ingest,
    ingest_and_claim,
    ms,
)

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
    assert version == len(MIGRATIONS) and "runs_waiting" in indexes
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


