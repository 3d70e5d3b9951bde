"""Subscriptions (every engine): agents' changes to the event types they receive,
written with their run's success and honoured by the next ingest; other
programs' subscriptions, whose deliveries are queued in the outbox with what
they report, held until verified, suspended, refreshed, expired and deleted."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from agentbox.runs import RunStatus
from agentbox.store import (
    DeliveryResult,
    NoSubscribedAgent,
    Outcome,
    Store,
    SubscriptionNotFound,
    TooManySubscriptions,
)
from agentbox.store.sqlite import SQL as SQLITE
from agentbox.store.sqlite import SqliteStore
from tests.store.support import (
    HOOK,
    SUCCEEDED,
    T0,
    async_test,
    claim_one,
    ingest,
    take,
)
from tests.store.test_emitted import emitted

SUB_URL = "http://127.0.0.1:9/hook"
SECRET = "whsec_" + "A" * 40
DAY = 86_400.0


def changes(*pairs: tuple[str, bool]) -> Outcome:
    return Outcome(RunStatus.SUCCEEDED, result={}, subscriptions=pairs)


async def agents_of(store: Store, event_id: str, configured: tuple[str, ...] = ("a", "b"),
                    now: float = T0) -> list[str]:
    result = await ingest(store, event_id, agents=configured, now=now)
    return [run.agent for run in result.runs]


async def subscribe(store: Store, sub_id: str = "sub_1", topics: tuple[str, ...] = (
        "session.exported",), ttl: float = DAY, now: float = T0) -> Any:
    return await store.create_subscription(
        subscription_id=sub_id, url=SUB_URL, topics=topics, secret=SECRET,
        secret_hint="sha256:0000", challenge=f"challenge-{sub_id}", ttl=ttl, now=now)


async def verify(store: Store, sub_id: str = "sub_1", now: float = T0,
                 error: str | None = None, suspend_after: int = 3) -> str:
    taken, _ = await store.claim_verifications(now, 10, 30.0)
    (verification,) = [v for v in taken if v.id == sub_id]
    return await store.record_verification(verification, error, now + 1, now, suspend_after)


# -- agents ------------------------------------------------------------------------------


@async_test
async def test_an_unsubscribe_takes_effect_with_the_success_and_from_the_next_event(
        store: Store, aio: Any) -> None:
    first = await ingest(store, "e1", agents=("a",))
    run = await claim_one(store)
    assert await agents_of(store, "e2") == ["a", "b"]  # not yet: the run has not finished
    await store.finish(run.run_id, "w1", 1, changes(("session.exported", False)), T0 + 1)
    assert await agents_of(store, "e3", now=T0 + 2) == ["b"]
    (change,) = await store.agent_subscriptions()
    assert (change.agent, change.event_type, change.subscribed, change.run_id) == (
        "a", "session.exported", False, first.runs[0].run_id)


@async_test
async def test_a_failed_or_retried_run_changes_no_subscription(store: Store, aio: Any) -> None:
    await ingest(store, "e1", agents=("a",))
    run = await claim_one(store)
    unsubscribing = Outcome(RunStatus.FAILED_RETRYABLE, error_code="timeout",
                            error_message="slow", next_attempt_at=T0 + 5,
                            subscriptions=(("session.exported", False),))
    await store.finish(run.run_id, "w1", 1, unsubscribing, T0 + 1)
    assert await store.agent_subscriptions() == []
    assert await agents_of(store, "e2", now=T0 + 2) == ["a", "b"]
    again = await claim_one(store, now=T0 + 5)
    failed = Outcome(RunStatus.FAILED_PERMANENT, error_code="x", error_message="no",
                     subscriptions=(("session.exported", False),))
    await store.finish(again.run_id, "w1", again.attempt, failed, T0 + 6)
    assert await store.agent_subscriptions() == []
    assert await agents_of(store, "e3", now=T0 + 7) == ["a", "b"]


@async_test
async def test_a_subscribe_adds_an_agent_the_configuration_does_not_route(
        store: Store, aio: Any) -> None:
    await ingest(store, "e1", agents=("a",))
    run = await claim_one(store)
    await store.finish(run.run_id, "w1", 1, changes(("session.exported", True),
                                                    ("mix.review_requested", True)), T0 + 1)
    assert await agents_of(store, "e2", configured=("b",), now=T0 + 2) == ["b", "a"]
    # the last call for a type wins
    second = await ingest(store, "e3", agents=("a",), now=T0 + 3)
    claimed = await claim_one(store, now=T0 + 3)
    while claimed.run_id != second.runs[0].run_id:
        await store.finish(claimed.run_id, "w1", claimed.attempt, SUCCEEDED, T0 + 3)
        claimed = await claim_one(store, now=T0 + 3)
    await store.finish(claimed.run_id, "w1", 1, changes(("session.exported", False),
                                                        ("session.exported", True),
                                                        ("session.exported", False)), T0 + 4)
    assert await agents_of(store, "e4", configured=("a", "b"), now=T0 + 5) == ["b"]


@async_test
async def test_an_event_no_agent_receives_any_more_is_refused_and_not_stored(
        store: Store, aio: Any) -> None:
    await ingest(store, "e1", agents=("a",))
    run = await claim_one(store)
    await store.finish(run.run_id, "w1", 1, changes(("session.exported", False)), T0 + 1)
    with pytest.raises(NoSubscribedAgent):
        await ingest(store, "e2", agents=("a",), now=T0 + 2)
    with pytest.raises(NoSubscribedAgent):
        await ingest(store, "e2", agents=(), now=T0 + 2)
    assert [run.run_id for run in await store.list_runs(None, 10)] == [run.run_id]
    # A duplicate of an event stored before is still a duplicate.
    again = await ingest(store, "e1", agents=("a",), now=T0 + 3)
    assert again.duplicate and again.runs[0].run_id == run.run_id


@async_test
async def test_an_agent_that_unsubscribes_before_it_emits_does_not_receive_its_event(
        store: Store, aio: Any) -> None:
    await ingest(store, "e1", agents=("a",))
    run = await claim_one(store)
    outcome = Outcome(RunStatus.SUCCEEDED, result={},
                      subscriptions=(("mix.review_requested", False),),
                      emitted=(emitted(run.run_id, 0, "mix.review_requested", agents=("a", "b")),
                               emitted(run.run_id, 1, "mix.review_requested", agents=("a",))))
    transition = await store.finish(run.run_id, "w1", 1, outcome, T0 + 1)
    assert transition is not None
    # The first goes to b only; the second, which only a received, is not stored.
    assert [(t.agent, t.event_id) for t in transition.spawned] == [("b", f"{run.run_id}.e0")]


@async_test
async def test_an_agent_that_unsubscribes_every_receiver_of_what_it_emits_still_succeeds(
        store: Store, aio: Any) -> None:
    await ingest(store, "e1", agents=("a",))
    run = await claim_one(store)
    # a, the only agent of mix.review_requested, leaves it and emits one: nobody
    # receives that event, so it is not stored, and the run's success is.
    outcome = Outcome(RunStatus.SUCCEEDED, result={},
                      subscriptions=(("mix.review_requested", False),),
                      emitted=(emitted(run.run_id, 0, "mix.review_requested", agents=("a",)),))
    transition = await store.finish(run.run_id, "w1", 1, outcome, T0 + 1)
    assert transition is not None and transition.status == RunStatus.SUCCEEDED
    assert transition.spawned == ()
    assert (await store.get_run(run.run_id)).status == "succeeded"  # type: ignore[union-attr]


@async_test
async def test_loop_detection_still_stops_what_a_subscription_lets_through(
        store: Store, aio: Any) -> None:
    await ingest(store, "e1", agents=("a",))
    run = await claim_one(store)
    # a subscribes to the type it is handling, and emits that type (configured: b).
    outcome = Outcome(RunStatus.SUCCEEDED, result={},
                      subscriptions=(("session.exported", True),),
                      emitted=(emitted(run.run_id, 0, "session.exported", agents=("b",)),))
    transition = await store.finish(run.run_id, "w1", 1, outcome, T0 + 1)
    assert transition is not None
    assert sorted((t.agent, t.status, t.error_code) for t in transition.spawned) == [
        ("a", "dead_lettered", "loop_detected"), ("b", "accepted", None)]


# -- other programs ----------------------------------------------------------------------


@async_test
async def test_deliveries_wait_for_verification_then_go_in_order(store: Store, aio: Any) -> None:
    view = await subscribe(store, topics=("session.exported", "run.succeeded"))
    assert view.state == "pending_verification" and view.pending == 0
    assert "whsec_" not in view.model_dump_json()
    result = await ingest(store, "e1", agents=("a",), now=T0 + 1, callback_url=HOOK)
    run = await claim_one(store, now=T0 + 1)
    await store.finish(run.run_id, "w1", 1, SUCCEEDED, T0 + 2)
    # Held: nothing for the subscriber; the run's own callbacks are not held behind it.
    sent = await take(store, now=T0 + 3)
    assert {n.subscription_id for n in sent} == {None}
    assert (await store.subscription("sub_1", T0 + 3)).pending == 2  # type: ignore[union-attr]
    assert await verify(store, now=T0 + 4) == "active"
    (event_delivery,) = await take(store, now=T0 + 4)
    assert event_delivery.subscription_id == "sub_1"
    assert event_delivery.run_id == result.runs[0].run_id  # pruned with its run
    body = json.loads(event_delivery.body)
    assert (body["type"], body["event_id"], body["subscription_id"]) == (
        "event", "e1", "sub_1")
    assert body["event"]["payload"]["project_id"] == "p"
    await store.record_delivery(event_delivery, "d1", DeliveryResult("delivered"), T0 + 5, 3)
    (state_delivery,) = await take(store, now=T0 + 5)
    assert json.loads(state_delivery.body)["type"] == "run.succeeded"
    assert json.loads(state_delivery.body)["run_id"] == run.run_id


@async_test
async def test_every_subscriber_gets_its_own_body_in_order(store: Store, aio: Any) -> None:
    """Subscribers' deliveries are queued together: each body is the whole document
    with that subscriber's ids, compact JSON with sorted keys, and each subscriber's
    run.succeeded waits behind its own event delivery, not behind the others'."""
    subscribers = [f"sub_{n}" for n in range(5)]
    for sub_id in subscribers:
        await subscribe(store, sub_id, topics=("session.exported", "run.succeeded"))
        assert await verify(store, sub_id, now=T0) == "active"
    mix = '/mixes/caf\u00e9 "final" \U0001f3b5.wav'  # escaped in JSON as json.dumps does
    result = await ingest(store, "e1", agents=("a",), now=T0 + 1, mix_url=mix)
    run = await claim_one(store, now=T0 + 1)
    await store.finish(run.run_id, "w1", 1, SUCCEEDED, T0 + 2)
    events = await take(store, now=T0 + 3, limit=50)
    assert sorted(n.subscription_id or "" for n in events) == subscribers  # one each, first
    for delivery in events:
        body = json.loads(delivery.body)
        assert delivery.body == json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        assert body["subscription_id"] == delivery.subscription_id
        assert body["notification_id"] == delivery.notification_id == (
            f"{delivery.subscription_id}:{result.runs[0].run_id}:event")
        assert body["event"]["payload"]["mix_url"] == mix
        await store.record_delivery(delivery, "d1", DeliveryResult("delivered"), T0 + 4, 3)
    states = await take(store, now=T0 + 5, limit=50)
    assert sorted(n.subscription_id or "" for n in states) == subscribers
    assert {json.loads(n.body)["type"] for n in states} == {"run.succeeded"}


@async_test
async def test_a_subscription_past_the_limit_is_refused_and_stores_nothing(
        store: Store, aio: Any) -> None:
    for n in range(3):
        await store.create_subscription(
            subscription_id=f"sub_{n}", url=SUB_URL, topics=("session.exported",),
            secret=SECRET, secret_hint="h", challenge="c", ttl=10.0, now=T0, limit=3)
    with pytest.raises(TooManySubscriptions) as refused:
        await store.create_subscription(
            subscription_id="sub_3", url=SUB_URL, topics=("session.exported",),
            secret=SECRET, secret_hint="h", challenge="c", ttl=DAY, now=T0 + 1, limit=3)
    assert refused.value.limit == 3
    assert await store.subscription("sub_3", T0 + 1) is None
    assert [d.destination for d in await store.destinations()] == [
        f"subscription:sub_{n}" for n in range(3)]  # nothing of sub_3
    # One that expired no longer counts (before it is even removed).
    await store.create_subscription(
        subscription_id="sub_3", url=SUB_URL, topics=("session.exported",), secret=SECRET,
        secret_hint="h", challenge="c", ttl=DAY, now=T0 + 11, limit=3)


@async_test
async def test_subscriptions_are_listed_by_pages_in_the_order_of_their_ids(
        store: Store, aio: Any) -> None:
    made = [f"sub_{n:03d}" for n in range(7)]
    for sub_id in reversed(made):  # the order of their ids, whatever the order of making
        await subscribe(store, sub_id)
    pages, after = [], None
    while page := await store.subscriptions(T0, limit=3, after=after):
        pages.append([view.id for view in page])
        after = page[-1].id
        await store.delete_subscription(after, T0)  # gone meanwhile: the next page holds
    assert pages == [made[0:3], made[3:6], made[6:7]]
    assert await store.subscriptions(T0, after="sub_\x00") == []


@async_test
async def test_failures_suspend_and_a_refresh_verifies_again(store: Store, aio: Any) -> None:
    await subscribe(store)
    assert await verify(store, now=T0, error="timeout") == "pending_verification"
    assert await verify(store, now=T0 + 2, error="challenge_mismatch") == "pending_verification"
    assert await verify(store, now=T0 + 4, error="http_500") == "suspended"
    view = await store.subscription("sub_1", T0 + 5)
    assert view is not None and (view.state, view.last_error) == ("suspended", "http_500")
    assert (await store.claim_verifications(T0 + 100, 10, 30.0))[0] == []
    refreshed = await store.refresh_subscription("sub_1", DAY, "again", T0 + 10)
    assert refreshed.state == "pending_verification"
    assert await verify(store, now=T0 + 11) == "active"
    # An active one whose deliveries fail in a row is suspended by the outbox's pause.
    await ingest(store, "e1", agents=("a",), now=T0 + 12)
    (delivery,) = await take(store, now=T0 + 12)
    failed = DeliveryResult("pending", "http_503", 503, T0 + 13)
    await store.record_delivery(delivery, "d1", failed, T0 + 12, 1)
    assert (await store.subscription("sub_1", T0 + 13)).state == "suspended"  # type: ignore[union-attr]
    assert await take(store, now=T0 + 20) == []
    await store.refresh_subscription("sub_1", DAY, "third", T0 + 21)
    assert await verify(store, now=T0 + 21) == "active"
    (again,) = await take(store, now=T0 + 21)
    assert again.pk == delivery.pk and again.attempts == 1


@async_test
async def test_a_refresh_extends_and_repeating_it_changes_nothing_more(
        store: Store, aio: Any) -> None:
    await subscribe(store, ttl=60.0)
    once = await store.refresh_subscription("sub_1", 120.0, "x", T0 + 30)
    twice = await store.refresh_subscription("sub_1", 120.0, "y", T0 + 30)
    assert once == twice and once.expires_at == twice.expires_at
    assert once.ttl_ms == 120_000 and once.state == "pending_verification"


@async_test
async def test_an_expired_subscription_gets_nothing_and_is_removed(store: Store, aio: Any) -> None:
    await subscribe(store, ttl=10.0)
    assert await verify(store, now=T0 + 1) == "active"
    await ingest(store, "e1", agents=("a",), now=T0 + 11)
    assert await take(store, now=T0 + 11) == []
    view = await store.subscription("sub_1", T0 + 11)
    assert view is not None and view.state == "expired"
    with pytest.raises(SubscriptionNotFound):
        await store.refresh_subscription("sub_1", 10.0, "x", T0 + 11)
    assert await store.prune_subscriptions(T0 + 5, 10) == 0
    assert await store.prune_subscriptions(T0 + 11, 10) == 1
    assert await store.subscriptions(T0 + 12) == []


@async_test
async def test_a_deleted_subscription_is_gone_and_its_queue_dead(store: Store, aio: Any) -> None:
    await subscribe(store)
    await ingest(store, "e1", agents=("a",), now=T0 + 1)
    await store.delete_subscription("sub_1", T0 + 2)
    assert await store.subscription("sub_1", T0 + 2) is None
    assert await store.subscription_target("sub_1") is None
    dead = await store.list_notifications("dead", 10)
    assert [(n.destination, n.last_error) for n in dead] == [
        ("subscription:sub_1", "subscription_deleted")]
    with pytest.raises(SubscriptionNotFound):
        await store.delete_subscription("sub_1", T0 + 3)
    assert [d.destination for d in await store.destinations()] == []


@async_test
async def test_the_secret_is_kept_for_signing_only(store: Store, aio: Any) -> None:
    await subscribe(store)
    target = await store.subscription_target("sub_1")
    assert target is not None and target.secret == SECRET and SECRET not in repr(target)
    listed = await store.subscriptions(T0)
    assert SECRET not in json.dumps([v.model_dump(mode="json") for v in listed])


# -- the subscription state machine (a property) ---------------------------------------------

STEPS = ("verify_ok", "verify_fail", "event", "deliver_fail", "deliver_ok", "refresh",
         "expire", "delete")
VERIFY_LIMIT, PAUSE_AFTER, MACHINE_TTL = 3, 2, 1000.0


class Model:
    """What a subscription must be after each step: pending_verification → active →
    suspended (verification or delivery failures) → refreshed → pending again;
    expired once its time is up; deleted; and how many deliveries it has queued."""

    def __init__(self, now: float) -> None:
        self.state, self.paused, self.deleted = "pending_verification", False, False
        self.verify_failures = self.delivery_failures = self.queued = 0
        self.expires_at = now + MACHINE_TTL

    def expired(self, now: float) -> bool:
        return now >= self.expires_at

    def shown(self, now: float) -> str:
        if self.expired(now):
            return "expired"
        return "suspended" if self.state == "active" and self.paused else self.state


@async_test
async def test_the_subscription_state_machine_holds_for_any_sequence_of_steps(
        store: Store, aio: Any) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    clock = [T0]
    examples: list[list[str]] = []

    # Steps that build up state drawn more often, so that deep states are reached.
    weighted = (*STEPS, "verify_ok", "event", "event", "deliver_fail", "deliver_fail")

    @given(st.lists(st.sampled_from(weighted), min_size=4, max_size=20))
    @settings(max_examples=100, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def collect(steps: list[str]) -> None:
        examples.append(steps)

    collect()
    for number, steps in enumerate(examples):
        sub_id = f"sub_m{number}"
        clock[0] += 10
        await subscribe(store, sub_id, ttl=MACHINE_TTL, now=clock[0])
        model = Model(clock[0])
        for index, step in enumerate(steps):
            clock[0] += 2
            if step == "expire":  # time passes until its end
                clock[0] = max(clock[0], model.expires_at)
            now = clock[0]
            await _step(store, model, sub_id, f"{number}-{index}", step, now)
            view = await store.subscription(sub_id, now)
            if model.deleted:
                assert view is None, (steps, index)
                continue
            assert view is not None
            assert (view.state, view.pending) == (model.shown(now), model.queued), (steps, index)
        if not model.deleted:
            await store.delete_subscription(sub_id, clock[0])


async def _step(store: Store, model: Model, sub_id: str, event_id: str, step: str,
                now: float) -> None:
    if step in ("verify_ok", "verify_fail"):
        taken, _ = await store.claim_verifications(now, 50, 1.0)
        mine = [v for v in taken if v.id == sub_id]
        due = (model.state == "pending_verification" and not model.deleted
               and not model.expired(now))
        assert len(mine) == int(due)
        if mine:
            error = None if step == "verify_ok" else "challenge_mismatch"
            await store.record_verification(mine[0], error, now + 1, now, VERIFY_LIMIT)
            if error is None:
                model.state, model.paused, model.delivery_failures = "active", False, 0
            else:
                model.verify_failures += 1
                if model.verify_failures >= VERIFY_LIMIT:
                    model.state = "suspended"
    elif step == "event":
        await ingest(store, f"m{event_id}", agents=("a",), now=now)
        if not model.deleted and not model.expired(now):
            model.queued += 1
    elif step in ("deliver_fail", "deliver_ok"):
        mine = [n for n in await take(store, now=now, limit=100) if n.subscription_id == sub_id]
        sendable = model.state == "active" and not model.paused and not model.deleted
        assert len(mine) == (model.queued if sendable else 0)
        for delivery in mine:
            if step == "deliver_ok":
                await store.record_delivery(delivery, "d1", DeliveryResult("delivered"), now,
                                            PAUSE_AFTER)
                model.queued -= 1
                model.delivery_failures = 0
            else:
                failed = DeliveryResult("pending", "http_500", 500, now + 1)
                await store.record_delivery(delivery, "d1", failed, now, PAUSE_AFTER)
                model.delivery_failures += 1
                model.paused = model.paused or model.delivery_failures >= PAUSE_AFTER
    elif step == "refresh":
        if model.deleted or model.expired(now):
            with pytest.raises(SubscriptionNotFound):
                await store.refresh_subscription(sub_id, MACHINE_TTL, "c", now)
            return
        await store.refresh_subscription(sub_id, MACHINE_TTL, f"c{event_id}", now)
        model.expires_at = now + MACHINE_TTL
        if model.state == "suspended" or (model.state == "active" and model.paused):
            model.state, model.verify_failures = "pending_verification", 0
    elif step == "expire":
        assert model.deleted or model.expired(now)
    elif step == "delete":
        if model.deleted:
            with pytest.raises(SubscriptionNotFound):
                await store.delete_subscription(sub_id, now)
            return
        await store.delete_subscription(sub_id, now)
        model.deleted, model.queued = True, 0


def test_a_deliverys_place_in_its_runs_queue_is_one_index_step(tmp_path: Path) -> None:
    """Queuing a delivery (or sending the next one) asks whether one of the same run
    and subscriber (callbacks: subscriber NULL) is pending before it. That walked the
    run's pending rows of every subscriber: with 1,000 subscribers, a million row
    reads for one event. SQLite's plan says it is one step of outbox_pending_run."""
    async def make() -> None:
        store = SqliteStore(tmp_path / "plans.sqlite3")
        await store.open()
        await store.close()

    asyncio.run(make())
    conn = sqlite3.connect(tmp_path / "plans.sqlite3")
    try:
        for name in ("insert_subscription_delivery", "insert_notification", "ready_next_of_run",
                     "release_destination"):
            sql = SQLITE[name]
            params = {found: "x" for found in re.findall(r"(?<![:\w]):(\w+)", sql)}
            plan = " | ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params))
            assert "outbox_pending_run (run_id=? AND subscription_id=?" in plan, (name, plan)
    finally:
        conn.close()
