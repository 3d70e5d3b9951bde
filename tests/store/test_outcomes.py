"""Outcomes, and replays of failed runs (every engine)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from agentbox.runs import InvalidTransition, RunStatus
from agentbox.store import (
    NotReplayable,
    Outcome,
    RunNotFound,
    Store,
)
from tests.store.support import (
    DEAD,
    LEASE,
    PERMANENT,
    SUCCEEDED,
    T0,
    async_test,
    at,
    claim,
    claim_one,
    ingest,
    ingest_and_claim,
    ms,
    retryable,
    status_of,
)

# -- an outcome's commit -------------------------------------------------------------------
# An outcome queued alone just after an event was answered waits a moment
# (`linger_seconds`) for the next event, to share its commit: at one connection each
# 202 otherwise waited for the previous run's commit before its own. SQLite's store
# lingers, PostgreSQL's does not (a second writer commits the outcome beside the
# event); the mechanism is the writer's, tested here on both. The tests stretch the
# wait so that only what they check can end it, on a machine however busy.


def lingering(store: Store, seconds: float, window: float) -> None:
    """Set the writer's wait for company, and the window after an event it waits in."""
    store.linger_seconds = seconds  # type: ignore[attr-defined]
    store.linger_window_seconds = window  # type: ignore[attr-defined]


def batches_of(store: Store) -> list[int]:
    """Record the size of every batch the store commits from now on."""
    sizes: list[int] = []
    commit = store._commit  # type: ignore[attr-defined]

    async def counted(loop: Any, batch: list[Any]) -> Any:
        sizes.append(len(batch))
        return await commit(loop, batch)

    store._commit = counted  # type: ignore[attr-defined]
    return sizes


@async_test
async def test_an_outcome_shares_the_next_events_commit(store: Store, aio: Any) -> None:
    run = await ingest_and_claim(store, "e1")
    lingering(store, 60.0, 60.0)
    sizes = batches_of(store)
    finishing = asyncio.ensure_future(store.finish(run.run_id, "w1", 1, SUCCEEDED, T0 + 2))
    await asyncio.sleep(0.2)  # long enough for its own commit, had it not waited
    assert not finishing.done() and sizes == []
    second = await asyncio.wait_for(ingest(store, "e2"), 10)  # not the linger's 60 s
    transition = await asyncio.wait_for(finishing, 10)
    assert transition is not None and transition.status == "succeeded"
    assert not second.duplicate and sizes == [2]  # one commit for both
    assert await status_of(store, run.run_id) == "succeeded"


@pytest.mark.parametrize(("window", "pause"), [(0.0, 0.0), (0.05, 0.2)],
                         ids=["no_window", "event_answered_before_the_window"])
@async_test
async def test_an_outcome_waits_for_no_event_when_none_came_lately(
        store: Store, aio: Any, window: float, pause: float) -> None:
    run = await ingest_and_claim(store, "e1")
    lingering(store, 60.0, window)
    await asyncio.sleep(pause)  # the event's answer is older than the window now
    transition = await asyncio.wait_for(
        store.finish(run.run_id, "w1", 1, SUCCEEDED, T0 + 2), 10)
    assert transition is not None and await status_of(store, run.run_id) == "succeeded"


@async_test
async def test_an_outcome_alone_commits_after_the_linger(store: Store, aio: Any) -> None:
    run = await ingest_and_claim(store, "e1")
    lingering(store, 0.3, 60.0)
    started = time.monotonic()
    transition = await asyncio.wait_for(
        store.finish(run.run_id, "w1", 1, SUCCEEDED, T0 + 2), 10)
    assert transition is not None and time.monotonic() - started >= 0.3
    assert await status_of(store, run.run_id) == "succeeded"


@async_test
async def test_a_claim_ends_an_outcomes_wait(store: Store, aio: Any) -> None:
    """Only outcomes wait: a claim (a dispatcher with free slots) is committed at once,
    and takes the waiting outcome with it."""
    first = await ingest_and_claim(store, "e1")
    await ingest(store, "e2")
    lingering(store, 60.0, 60.0)
    sizes = batches_of(store)
    finishing = asyncio.ensure_future(store.finish(first.run_id, "w1", 1, SUCCEEDED, T0 + 2))
    await asyncio.sleep(0.2)
    assert not finishing.done()
    claimed = await asyncio.wait_for(claim(store, limit=1), 10)
    assert len(claimed.claimed) == 1 and await asyncio.wait_for(finishing, 10) is not None
    assert sizes == [2]  # one commit for both


@async_test
async def test_closing_commits_a_waiting_outcome_at_once(store: Store, aio: Any) -> None:
    run = await ingest_and_claim(store, "e1")
    lingering(store, 60.0, 60.0)
    finishing = asyncio.ensure_future(store.finish(run.run_id, "w1", 1, SUCCEEDED, T0 + 2))
    await asyncio.sleep(0.2)
    assert not finishing.done()
    await asyncio.wait_for(store.close(), 10)
    assert (await finishing) is not None


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
async def test_a_replay_is_reported_as_a_note_not_an_error_code(store: Store, aio: Any) -> None:
    run = await ingest_and_claim(store, "e1")
    await store.finish(run.run_id, "w1", 1, DEAD, T0 + 1)
    transition = await store.replay(run.run_id, T0 + 5)
    assert (transition.status, transition.error_code, transition.note) == (
        "accepted", None, "replayed")
    assert [(h.status, h.note) for h in await store.history(run.run_id)][-1] == (
        "accepted", "replayed")


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


