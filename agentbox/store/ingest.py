"""Ingest: an event, its idempotency claim and its runs, written in one
transaction; the same path for an event received (with admission control, a
hop limit, optionally claimed at once) and for one an agent emitted (with loop
detection), on each engine.

The engine's `Db.store_events` writes what this module planned: SQLite row by
row, PostgreSQL a whole batch's events in one statement.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentbox.events import Envelope, Event
from agentbox.runs import RunStatus, check_transition
from agentbox.store.errors import AdmissionRefused, NoSubscribedAgent
from agentbox.store.outbox import queue_callback
from agentbox.store.records import (
    Callback,
    ClaimedRun,
    Emitted,
    IngestParams,
    IngestResult,
    Lease,
    NewEvent,
    NewRun,
    RunRef,
    Transition,
)
from agentbox.store.subscriptions import queue_event, routed
from agentbox.store.writer import Batch, Db, Kept, answer

LOOP_DETECTED = "loop_detected"


def new_run_id() -> str:
    """Time-ordered (like UUIDv7): 48 bits of milliseconds, then 80 random bits.

    New runs land at the end of the primary key's B-tree, so an insert dirties
    few pages however many runs the store holds, and newest-first listing
    needs no index of its own.
    """
    return f"run_{time.time_ns() // 1_000_000:012x}{secrets.token_hex(10)}"




@dataclass(slots=True, kw_only=True)  # built per write: no frozen __setattr__
class Ingest:
    """The operation: store one event. A batch's ingests run together (`ingest_batch`)."""

    event: Event
    body: bytes
    agents: tuple[str, ...]
    stop_reasons: tuple[str | None, ...]  # per agent: why its run is stopped (a loop)
    now: float
    expires_at: float
    max_pending: int | None  # None: not counted against admission (an emitted event)
    lease: Lease | None  # claim the runs as they are accepted
    notify_due: float  # a callback's first attempt
    # Subscriptions: `agents` is the configuration's routing until the transaction
    # routes it by the agents' current subscriptions (an emitted event's is routed
    # before its stop reasons are found). `stop_all`: a received event's stop reason.
    routed: bool = False
    stop_all: str | None = None
    webhook_id: str | None = None  # the sender's own id of the request (received events)

    def __call__(self, db: Db, state: Batch) -> IngestResult:
        result: IngestResult = answer(ingest_batch(db, state, [self])[0])
        return result

    def plan(self) -> NewEvent:
        runs = []
        for ordinal, (agent, reason) in enumerate(zip(self.agents, self.stop_reasons,
                                                      strict=True)):
            run_id = new_run_id()
            if reason is not None:
                check_transition(run_id, RunStatus.ACCEPTED, RunStatus.DEAD_LETTERED)
                runs.append(NewRun(run_id=run_id, ordinal=ordinal, agent=agent,
                                   status=RunStatus.DEAD_LETTERED, error_code=LOOP_DETECTED,
                                   error_message=reason))
            elif self.lease is not None:
                runs.append(NewRun(run_id=run_id, ordinal=ordinal, agent=agent,
                                   status=RunStatus.PROCESSING, owner=self.lease.owner,
                                   lease_until=self.lease.until))
            else:
                runs.append(NewRun(run_id=run_id, ordinal=ordinal, agent=agent,
                                   status=RunStatus.ACCEPTED))
        return NewEvent(env=self.event.envelope, body=self.body, expires_at=self.expires_at,
                        runs=tuple(runs), webhook_id=self.webhook_id)


def ingest_batch(db: Db, state: Batch, items: Sequence[Ingest]) -> list[tuple[bool, Any]]:
    """Admit, claim the keys and store the events whose key was free, then look
    up the runs of the duplicates: per item (True, IngestResult) or (False,
    AdmissionRefused). The same key twice in one batch is answered like the first."""
    if not items:  # e.g. a run's emitted events that no agent receives any more
        return []
    answers: list[tuple[bool, Any] | None] = [None] * len(items)
    first: dict[str, int] = {}
    admitted: list[int] = []
    refused: list[int] = []
    unrouted: list[int] = []  # no agent subscribed (unless a duplicate)
    for index, item in enumerate(items):
        key = item.event.envelope.idempotency_key
        if key in first:
            continue
        first[key] = index
        if not item.routed:
            _route(db, state, item)
        if not item.agents:
            unrouted.append(index)
            continue
        if item.max_pending is not None and state.active + len(item.agents) > item.max_pending:
            refused.append(index)  # unless it turns out to be a duplicate
            continue
        state.active += len(item.agents)
        admitted.append(index)
    now = min([item.now for item in items])
    if admitted:
        kept: list[tuple[Event, NewEvent]] = []
        planned = [items[i].plan() for i in admitted]
        stored = db.store_events(planned, now)
        for i, plan, was_stored in zip(admitted, planned, stored, strict=True):
            if not was_stored:
                state.active -= len(items[i].agents)  # a duplicate after all
                continue
            answers[i] = (True, _stored(db, state, items[i], plan))
            kept.append((items[i].event, plan))
        _kept_by_apps(db, state, kept, now)
    unanswered = [i for i in admitted + refused + unrouted if answers[i] is None]
    if unanswered:
        found = db.runs_of_keys([items[i].event.envelope.idempotency_key for i in unanswered],
                                now)
        for i in unanswered:
            key = items[i].event.envelope.idempotency_key
            if key in found or i not in refused + unrouted:
                runs = [RunRef(run_id=r, agent=a, status=s) for r, a, s in found.get(key, [])]
                answers[i] = (True, IngestResult(runs=runs, duplicate=True))
            elif i in unrouted:
                answers[i] = (False, NoSubscribedAgent(items[i].event.envelope.event_type))
            else:
                answers[i] = (False, AdmissionRefused(state.active, items[i].max_pending or 0))
    if len(first) == len(items):  # no key twice in the batch: every item is answered
        return answers  # type: ignore[return-value]
    settled: list[tuple[bool, Any]] = []
    for index, item in enumerate(items):
        settled_answer = answers[index]
        if settled_answer is None:  # a repeat within the batch
            ok, value = answers[first[item.event.envelope.idempotency_key]]  # type: ignore[misc]
            settled_answer = (ok, IngestResult(runs=value.runs, duplicate=True) if ok else value)
        settled.append(settled_answer)
    return settled


def _kept_by_apps(db: Db, state: Batch, stored: Sequence[tuple[Event, NewEvent]],
                  now: float) -> None:
    """What each app keeps of the events just stored (tables.Schema.keeps), in their
    transaction: each run as [run_id, value, its event's source, when it was
    accepted], for the apps' statements, written now or, when the transaction
    gathers them (`Batch.kept`), once for all its events (`write_kept`)."""
    for index, (keeps, _) in enumerate(state.keeps):
        rows: list[Kept] = []
        for event, planned in stored:
            value = keeps(event)
            if value is not None:
                source = event.envelope.source
                rows += [(run.run_id, value, source, now) for run in planned.runs]
        if not rows:
            continue
        if state.kept is not None:
            state.kept[index] += rows
        else:
            db.keep_runs(state.keeps[index][1], rows)


def write_kept(db: Db, state: Batch) -> None:
    """What the transaction's events gave the apps to keep (`Batch.kept`), written
    before it commits: one round of statements for the batch, not one per event (on
    SQLite each event is an operation of its own, and an app's statement costs more
    to start than to run for one row)."""
    if state.kept is None:
        return
    for (_, statements), rows in zip(state.keeps, state.kept, strict=True):
        if rows:
            db.keep_runs(statements, rows)
    state.kept = [[] for _ in state.keeps]


def _route(db: Db, state: Batch, item: Ingest) -> None:
    """Route a received event by the agents' current subscriptions. Runs that change
    from what the caller leased for are stored accepted, not claimed."""
    agents = routed(db, state, item.event.envelope.event_type, item.agents)
    if agents != item.agents:
        item.agents, item.lease = agents, None
    item.stop_reasons = (item.stop_all,) * len(agents)
    item.routed = True


def _stored(db: Db, state: Batch, item: Ingest, planned: NewEvent) -> IngestResult:
    """What a stored event's runs owe: the counts, the callbacks, the deliveries to
    subscribers of its type, the answer."""
    env = planned.env
    queue_event(db, state, env=env, body=item.body, run_ids=[run.run_id for run in planned.runs],
                now=item.now, due=item.notify_due)
    refs = []
    for run in planned.runs:
        if run.status == RunStatus.DEAD_LETTERED:
            state.active -= 1
            queue_callback(db, state, Callback(
                url=env.callback_url, run_id=run.run_id, status=run.status, attempt=0,
                event_id=env.event_id, now=item.now, due=item.notify_due,
                error_code=LOOP_DETECTED))
        elif run.status == RunStatus.PROCESSING:
            queue_callback(db, state, Callback(
                url=env.callback_url, run_id=run.run_id, status=run.status, attempt=1,
                event_id=env.event_id, now=item.now, due=item.notify_due))
        else:
            state.runs_ready = True
        # The 202 reports a run claimed as it was accepted as accepted.
        shown = RunStatus.DEAD_LETTERED if run.status == RunStatus.DEAD_LETTERED else (
            RunStatus.ACCEPTED)
        refs.append(RunRef(run_id=run.run_id, agent=run.agent, status=shown.value))
    if item.lease is None or any(item.stop_reasons):
        return IngestResult(runs=refs, duplicate=False)
    return _claimed_at_acceptance(env, item, refs)


def _claimed_at_acceptance(env: Envelope, item: Ingest, refs: list[RunRef]) -> IngestResult:
    """An accepted event whose runs were claimed in its transaction (attempt 1)."""
    claimed = [ClaimedRun(run_id=ref.run_id, agent=ref.agent, attempt=1, round_attempt=1,
                          event_body=item.body, accepted_at=item.now, event_id=env.event_id,
                          event_type=env.event_type, source=env.source) for ref in refs]
    transitions = [Transition(run_id=ref.run_id, status=RunStatus.PROCESSING.value, attempt=1,
                              event_id=env.event_id, event_type=env.event_type,
                              source=env.source, agent=ref.agent,
                              notify=env.callback_url is not None) for ref in refs]
    return IngestResult(runs=refs, duplicate=False, claimed=claimed, transitions=transitions)


def received(params: IngestParams, *, notify_due: float) -> Ingest:
    """The ingest of an event received: past `max_hops`, every run is stopped."""
    hop, max_hops = params.event.envelope.hop, params.max_hops
    too_far = None
    if max_hops is not None and hop > max_hops:
        too_far = f"the event is {hop} hops down its chain; AGENTBOX_MAX_HOPS is {max_hops}"
    return Ingest(event=params.event, body=params.body, agents=tuple(params.agents),
                  stop_reasons=(too_far,) * len(params.agents), now=params.now,
                  expires_at=params.now + params.ttl, max_pending=params.max_pending,
                  lease=None if too_far else params.lease, notify_due=notify_due,
                  stop_all=too_far, webhook_id=params.webhook_id)


def store_emitted(db: Db, state: Batch, emitted: Sequence[Emitted], *, parent_pk: int,
                  now: float, notify_due: float
                  ) -> tuple[list[Transition], list[tuple[Event, tuple[str, ...]]]]:
    """Store an agent's follow-up events with their runs, in its success's transaction.

    Their ids derive from the parent run, so a run that succeeds again (after a
    replay) emits nothing twice. A run that would close a loop (its agent already
    handled this event type on the way here: in the emitting event or one of its
    causes) or go past the hop limit is recorded dead_lettered with
    loop_detected: visible, never dropped. Answers the new runs' changes, and per
    event the ids of its runs that were accepted.
    """
    # An event no agent receives any more (they unsubscribed) is not stored.
    items = [ingest for item in emitted
             if (ingest := _emitted(db, state, item, parent_pk, now, notify_due)).agents]
    spawned: list[Transition] = []
    events: list[tuple[Event, tuple[str, ...]]] = []
    for item, settled in zip(items, ingest_batch(db, state, items), strict=True):
        result: IngestResult = answer(settled)
        env = item.event.envelope
        started = [] if result.duplicate else [
            Transition(run_id=ref.run_id, status=ref.status, attempt=0, event_id=env.event_id,
                       event_type=env.event_type, source=env.source, agent=ref.agent,
                       error_code=None if ref.status == RunStatus.ACCEPTED else LOOP_DETECTED)
            for ref in result.runs]
        spawned += started
        events.append((item.event, tuple(t.run_id for t in started if t.status == "accepted")))
    return spawned, events


def _emitted(db: Db, state: Batch, item: Emitted, parent_pk: int, now: float,
             notify_due: float) -> Ingest:
    env = item.event.envelope
    agents = routed(db, state, env.event_type, item.agents)
    chain = env.correlation_id or env.event_id
    history = {tuple(row) for row in db.run("chain_history", {"chain": chain,
                                                              "parent": parent_pk})}

    def stop_reason(agent: str) -> str | None:
        if env.hop > item.max_hops:
            return (f"the chain {chain} is {env.hop} hops long; AGENTBOX_MAX_HOPS is "
                    f"{item.max_hops}")
        if (agent, env.event_type) in history:
            return f"{agent} already handled {env.event_type} in the chain {chain}"
        return None

    return Ingest(event=item.event, body=item.body, agents=agents,
                  stop_reasons=tuple(stop_reason(agent) for agent in agents), now=now,
                  expires_at=item.key_expires_at, max_pending=None, lease=None,
                  notify_due=notify_due, routed=True)
