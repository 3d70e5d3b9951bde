"""The store's plain records: what the interface takes and answers (frozen
dataclasses built by keyword), the callback's wire format, and the records the
write operations hand an engine (`writer.Db`), which the engine writes its own
way. Records only: nothing here reads or writes the database, so every module of
the store can import them without importing another.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from agentbox.events import Envelope, Event
from agentbox.runs import RunStatus

# -- runs: ingest, claims, outcomes -------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RunRef:
    run_id: str
    agent: str
    status: str


@dataclass(frozen=True)
class Lease:
    """Who holds a run, and until when (renewed while its agent runs)."""

    owner: str
    until: float


@dataclass(frozen=True, kw_only=True)
class ClaimedRun:
    run_id: str
    agent: str
    attempt: int  # counts every attempt of the run, across replays
    round_attempt: int  # counts attempts since the last replay: the retry budget's measure
    event_body: bytes
    accepted_at: float
    event_id: str = ""
    event_type: str = ""
    source: str = ""


@dataclass(frozen=True, kw_only=True)
class Transition:
    """A state change that happened, for the log line and for waiters."""

    run_id: str
    status: str
    attempt: int
    event_id: str
    event_type: str
    source: str
    agent: str
    error_code: str | None = None
    note: str | None = None  # what the change was when its status does not say (replayed)
    notify: bool = False  # a callback was queued in the outbox with this change
    # runs created with this change for the events the agent emitted (agent chains)
    spawned: tuple[Transition, ...] = ()
    emitted: tuple[tuple[Event, tuple[str, ...]], ...] = ()  # (event, its new run ids)


@dataclass(frozen=True, kw_only=True)
class IngestParams:
    """What `Store.ingest` stores, by name."""

    event: Event
    body: bytes  # as received, byte for byte
    agents: Sequence[str]  # one run each
    now: float
    ttl: float  # how long the idempotency key stays claimed
    max_pending: int  # admission: refused while this many runs are not terminal
    max_hops: int | None = None  # past it, every run is stopped (loop_detected)
    lease: Lease | None = None  # claim the runs as they are accepted
    webhook_id: str | None = None  # the sender's own id of the request (webhook-id)


@dataclass(frozen=True, kw_only=True)
class IngestResult:
    runs: Sequence[RunRef]  # as accepted: the 202 reports them so
    duplicate: bool
    # Runs that went straight to processing under the caller's lease (`IngestParams.lease`),
    # and those changes, for the caller to start and announce.
    claimed: Sequence[ClaimedRun] = ()
    transitions: Sequence[Transition] = ()


@dataclass(kw_only=True)
class ClaimResult:
    claimed: list[ClaimedRun] = field(default_factory=list)
    transitions: list[Transition] = field(default_factory=list)
    # When fewer runs than asked for were due: the earliest time one will be.
    next_due_at: float | None = None


@dataclass(frozen=True)
class Emitted:
    """A follow-up event an agent emitted, stored with its run's success."""

    event: Event
    body: bytes
    agents: tuple[str, ...]  # the agents subscribed to its type: one run each
    key_expires_at: float  # its idempotency claim's end
    max_hops: int  # a longer chain is stopped (loop_detected)


@dataclass(frozen=True)
class Outcome:
    """What an attempt ended with; `status` is the target state the dispatcher chose."""

    status: str
    result: Any = None
    error_code: str | None = None
    error_message: str | None = None
    next_attempt_at: float | None = None
    emitted: tuple[Emitted, ...] = ()  # stored only when the run succeeds
    # (event_type, subscribed) changes the agent made (ctx.subscribe/unsubscribe), in
    # order: stored only when the run succeeds, before its emitted events are routed.
    subscriptions: tuple[tuple[str, bool], ...] = ()


@dataclass(frozen=True, kw_only=True)
class RemoteChange:
    """What another instance committed: runs to claim, callbacks to send, changes to show."""

    runs_ready: bool
    outbox_ready: bool
    transitions: tuple[Transition, ...]


# -- the callback outbox, and the callback's wire format ----------------------------------


@dataclass(frozen=True, kw_only=True)
class Notification:
    """One outbox row leased for delivery."""

    pk: int
    notification_id: str
    run_id: str
    destination: str  # the callback URL's origin
    url: str
    body: bytes
    attempts: int  # deliveries tried before this one
    lease_until: float  # with the owner, what makes this lease this lease
    subscription_id: str | None = None  # a delivery to a subscriber, not a callback


@dataclass(frozen=True)
class DeliveryResult:
    """What one delivery attempt ended with, as the deliverer decided it."""

    state: str  # delivered, pending (another attempt at next_attempt_at), dead
    error: str | None = None  # a category such as timeout or http_503, never a body
    status_code: int | None = None
    next_attempt_at: float | None = None
    pause_reason: str | None = None  # pause the destination now (e.g. it answered 410)


def iso(timestamp: float | None) -> str | None:
    """A Unix time as the API shows times: UTC, milliseconds, `Z`."""
    if timestamp is None:
        return None
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


def notification(
    run_id: str, status: str, attempt: int, event_id: str, result: Any, error_code: str | None,
    now: float,
) -> tuple[str, bytes]:
    """The notification id and body for one state change: compact JSON, sorted keys.

    The id `run_id:status:retry_count` is the same whenever the same change is
    reported again, so receivers can drop duplicates by it.
    """
    retry_count = max(attempt - 1, 0)
    notification_id = f"{run_id}:{status}:{retry_count}"
    body = {
        "notification_id": notification_id, "run_id": run_id, "event_id": event_id,
        "status": status, "retry_count": retry_count, "result": result,
        "error_code": error_code,
        "occurred_at": iso(now),
    }
    return notification_id, json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


# -- subscriptions ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SubscriptionTarget:
    """What a delivery to a subscriber needs: where, and the secret to sign with."""

    id: str
    url: str
    state: str  # pending_verification, active, suspended
    expires_at: float
    secret: str = field(repr=False)


@dataclass(frozen=True, kw_only=True)
class Verification:
    """A subscription's verification challenge, leased for one attempt."""

    id: str
    url: str
    challenge: str
    failures: int  # failed attempts before this one
    secret: str = field(repr=False)


# -- retention ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PruneStep:
    """One bounded step of retention: what it removed, and where the next step starts."""

    removed: dict[str, int]  # rows per table (bodies: events whose body was blanked)
    examined: int  # candidates looked at; fewer than asked for: the pass is over
    cursor: tuple[float, Any] | None  # the last one looked at (its time, its key)
    seconds: float  # how long the step held the writer


# -- what the write operations hand an engine (`writer.Db`): inside the store only --------


@dataclass(slots=True, kw_only=True)  # built per write: no frozen __setattr__
class NewRun:
    """A run as `Db.store_events` writes it."""

    run_id: str
    ordinal: int
    agent: str
    status: str  # accepted; processing (claimed as accepted, `owner`); dead_lettered
    owner: str | None = None
    lease_until: float | None = None
    error_code: str | None = None
    error_message: str | None = None


@dataclass(slots=True, kw_only=True)  # built per write: no frozen __setattr__
class NewEvent:
    """An event as `Db.store_events` writes it, with its runs."""

    env: Envelope
    body: bytes
    expires_at: float  # its idempotency claim's end
    runs: tuple[NewRun, ...]
    webhook_id: str | None = None  # the sender's own id of the request


@dataclass(slots=True, kw_only=True)  # built per write: no frozen __setattr__
class Finish:
    """One attempt's outcome as `Db.finish_runs` writes it (the operation that
    queues it is `outcomes.FinishRun`)."""

    run_id: str
    owner: str
    attempt: int
    target: RunStatus
    next_attempt_at: float | None
    result_json: str | None  # the result as stored
    outcome: Outcome
    now: float
    notify_due: float

    @property
    def completed_at(self) -> float | None:
        return self.now if self.target.terminal else None


@dataclass(slots=True, kw_only=True)  # built per write: no frozen __setattr__
class Landed:
    """What an outcome landed on: its run's event, for the transition and callback."""

    event_pk: int
    agent: str
    event_id: str
    event_type: str
    source: str
    callback_url: str | None


@dataclass(slots=True, kw_only=True)  # built per write: no frozen __setattr__
class Callback:
    """The notification one state change owes (when its event gave a callback URL)."""

    url: str | None
    run_id: str
    status: str
    attempt: int
    event_id: str
    now: float
    due: float  # when it may first be sent
    result: Any = None
    error_code: str | None = None
