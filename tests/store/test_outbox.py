"""The callback outbox (every engine)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentbox.store import (
    DeliveryResult,
    DestinationNotFound,
    Store,
    notification,
)
from tests.store.support import (
    HOOK,
    HOOK_ORIGIN,
    LEASE,
    OTHER_HOOK,
    SEND_LEASE,
    SUCCEEDED,
    T0,
    async_test,
    at,
    claim,
    claim_one,
    failed,
    ingest_and_claim,
    ms,
    retryable,
    sent,
    take,
    with_callback,
)


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


