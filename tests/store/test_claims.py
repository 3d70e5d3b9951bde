"""Claims, runs claimed as they are accepted, and leases (every engine)."""

from __future__ import annotations

from typing import Any

import pytest

from agentbox.store import (
    AdmissionRefused,
    Lease,
    Store,
    notification,
)
from tests.store.conftest import (
    Engine,
)
from tests.store.support import (
    DEAD,
    HOOK,
    LEASE,
    PERMANENT,
    SUCCEEDED,
    T0,
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
    take,
)

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
async def test_renew_lease_past_its_end_only_while_nobody_claimed_the_run(
        engine: Engine, store: Store, aio: Any) -> None:
    run = await ingest_and_claim(store, "e1", "w1")
    # Past its end, not yet claimed by anyone: renewed (a holder back from a pause).
    assert await store.renew_lease("w1", run.run_id, 1, T0 + 3 * LEASE)
    assert engine.leases()[run.run_id] == ("processing", "w1", ms(T0 + 3 * LEASE))
    assert (await claim(store, "w2", now=T0 + 2 * LEASE)).claimed == []
    # Not its holder, or not the attempt held: nothing renewed.
    assert not await store.renew_lease("intruder", run.run_id, 1, T0 + 9 * LEASE)
    assert not await store.renew_lease("w1", run.run_id, 2, T0 + 9 * LEASE)
    # Claimed by another once the lease ran out: the old holder renews nothing.
    assert (await claim_one(store, "w2", now=T0 + 3 * LEASE)).attempt == 2
    assert not await store.renew_lease("w1", run.run_id, 1, T0 + 9 * LEASE)
    assert engine.leases()[run.run_id] == ("processing", "w2", ms(T0 + 4 * LEASE))
    # A finished attempt has no lease to renew.
    assert await store.finish(run.run_id, "w2", 2, SUCCEEDED, T0 + 3 * LEASE + 1) is not None
    assert not await store.renew_lease("w2", run.run_id, 2, T0 + 9 * LEASE)
    assert await status_of(store, run.run_id) == "succeeded"


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


