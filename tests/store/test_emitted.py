"""Agent chains: events emitted with a success, loops and hop limits (every engine)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from agentbox.events import parse_event
from agentbox.runs import RunStatus
from agentbox.store import (
    Emitted,
    IngestParams,
    Outcome,
    Store,
)
from tests.store.support import (
    MAX_PENDING,
    T0,
    TTL,
    async_test,
    claim,
    event_body,
    ingest_and_claim,
)

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
    await store.ingest(IngestParams(event=parse_event(body), body=body, agents=["mix_review"],
                                    now=T0 + 2, ttl=TTL, max_pending=MAX_PENDING))
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
    result = await store.ingest(IngestParams(event=event, body=body, agents=["a"], now=T0,
                                             ttl=TTL, max_pending=MAX_PENDING, max_hops=8))
    (ref,) = result.runs
    assert ref.status == "dead_lettered"
    view = await store.get_run(ref.run_id)
    assert view is not None and view["error_code"] == "loop_detected"
    assert "AGENTBOX_MAX_HOPS is 8" in view["error_message"]
    assert (await claim(store)).claimed == []
    assert (await store.stats())["active"] == 0


