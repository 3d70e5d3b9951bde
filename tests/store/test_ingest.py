"""Ingest and idempotency, and admission control (every engine: see conftest.py)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import pytest

from agentbox.store import (
    AdmissionRefused,
    IngestResult,
    StorageUnavailable,
    Store,
)
from tests.store.support import (
    LEASE,
    PERMANENT,
    SUCCEEDED,
    T0,
    TTL,
    async_test,
    at,
    claim,
    claim_one,
    event_body,
    ingest,
    ingest_and_claim,
    ms,
    retryable,
    status_of,
)

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
    assert view["webhook_id"] is None  # the sender sent no id of its own


@async_test
async def test_the_senders_webhook_id_is_kept_with_the_event(store: Store, aio: Any) -> None:
    result = await ingest(store, "e1", webhook_id="msg_2KWPBgLlAfxdpx2AI54pPJ85f4W")
    view = await store.get_run(result.runs[0].run_id)
    assert view is not None and view["webhook_id"] == "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"
    [listed] = await store.list_runs(None, 10)
    assert listed["webhook_id"] == "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"


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


@async_test
async def test_an_operation_failing_after_it_wrote_is_undone_alone(store: Store,
                                                                    aio: Any) -> None:
    """One batch: an ingest, an operation that writes and then fails, an ingest, and
    an operation that writes and succeeds. The failure is answered with its error and
    its write undone; its neighbours' writes are all kept (SQLite runs a batch without
    a savepoint per operation and sends it round again when this happens)."""
    run_id = (await ingest(store, "e0")).runs[0].run_id
    batches: dict[str, list[Any]] = {"bad": [], "good": []}

    def noted(note: str) -> Callable[[Any, Any], str]:
        def op(db: Any, state: Any) -> str:
            batches[note].append(state)
            db.run("insert_history", {"run_id": run_id, "at": T0 + 1, "status": "accepted",
                                      "attempt": 0, "note": note})
            if note == "bad":
                raise ValueError("failed after writing")
            return note
        return op

    write = store._write  # type: ignore[attr-defined]  # the writer's queue, as a store op
    writes = [asyncio.ensure_future(ingest(store, "e1")),
              asyncio.ensure_future(write(noted("bad"))),
              asyncio.ensure_future(ingest(store, "e2")),
              asyncio.ensure_future(write(noted("good")))]
    first, bad, second, good = await asyncio.gather(*writes, return_exceptions=True)
    if store.writers == 1:  # type: ignore[attr-defined]  # (PostgreSQL commits two at a time)
        assert batches["bad"][-1] is batches["good"][-1]  # they did share one batch
    # A failure that is no refusal is a bug: SQLite answers it as raised, PostgreSQL
    # as storage unavailable.
    assert isinstance(bad, ValueError | StorageUnavailable) and good == "good"
    for result in (first, second):
        assert isinstance(result, IngestResult) and not result.duplicate
        assert await status_of(store, result.runs[0].run_id) == "accepted"
    assert [entry.note for entry in await store.history(run_id)
            if entry.note in ("bad", "good")] == ["good"]
    assert (await store.stats())["active"] == 3



@async_test
async def test_a_state_change_undone_with_its_operation_is_not_counted(
        store: Store, aio: Any) -> None:
    """The runs by state follow what commits: an operation that moves a run to another
    state and then fails (its batch sent round again, a savepoint each) leaves the
    counts as they were, its neighbours' runs counted."""
    held = (await ingest_and_claim(store, "held")).run_id

    def moves_then_fails(db: Any, state: Any) -> None:
        db.run("replay", {"run_id": held, "now": T0 + 1})  # processing -> accepted
        raise ValueError("failed after writing")

    write = store._write  # type: ignore[attr-defined]  # the writer's queue, as a store op
    first, bad, second = await asyncio.gather(
        ingest(store, "e1"), write(moves_then_fails), ingest(store, "e2"),
        return_exceptions=True)
    assert isinstance(bad, ValueError | StorageUnavailable)
    assert isinstance(first, IngestResult) and isinstance(second, IngestResult)
    assert await status_of(store, held) == "processing"
    runs = (await store.stats())["runs"]
    assert {state: n for state, n in runs.items() if n} == {"processing": 1, "accepted": 2}


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


