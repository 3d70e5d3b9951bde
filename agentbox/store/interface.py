"""The storage interface: `Store` is everything the receiver, dispatcher,
callback deliverer, API, page and CLI may ask of the database. Nothing outside
this package sees an engine class, a connection or a line of SQL.

It is the union of small protocols, one per consumer, so that a caller can say
(and a test can check) which part of the store it uses: `IngestStore` (the
receiver and the dispatcher's claims), `OutcomeStore` (what becomes of a run),
`OutboxStore` (the callback deliverer), `ReadStore` (the API, pages and CLI),
`RetentionStore` (the retention service) and `SubscriptionStore`. Each has its
conformance tests in tests/store/ (tests/store/test_interface.py says which
files), run against every engine.

Every engine (SQLite now, PostgreSQL for several instances) implements `Store`
with the same guarantees, checked by one conformance suite:

- `ingest` writes the event, its idempotency claim and its run(s) in one
  transaction and returns only once that transaction is durable.
- A run changes state only along `runs.TRANSITIONS`; a terminal run is never
  claimed again.
- `finish` only lands for the current lease holder and attempt, so an outcome
  reported after the lease was lost (and the run reclaimed) is dropped.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from agentbox.store.records import (
    ClaimResult,
    DeliveryResult,
    IngestParams,
    IngestResult,
    Notification,
    Outcome,
    PruneStep,
    RemoteChange,
    SubscriptionTarget,
    Transition,
    Verification,
)
from agentbox.store.tables import Schema, Tables
from agentbox.store.views import (
    AgentSubscriptionView,
    AttemptView,
    DestinationView,
    HistoryEntry,
    NotificationView,
    RunView,
    SubscriptionView,
)


@runtime_checkable
class IngestStore(Protocol):
    """Ingest and claims: what the receiver and the dispatcher ask to take an event in
    and to hand its runs out, leased."""

    @abc.abstractmethod
    async def ingest(self, params: IngestParams) -> IngestResult:
        """Claim the idempotency key and store event + runs atomically and durably.

        A key already claimed and not expired returns the first runs with
        `duplicate=True` and writes nothing. Raises AdmissionRefused when
        `max_pending` runs are not yet terminal. An event whose `hop` is past
        `max_hops` is stored with its runs dead_lettered (loop_detected).

        With a `lease`, the runs are claimed in the same transaction (attempt 1,
        processing, leased to its owner): the caller has slots free to start
        them at once, which spares each run a claim. They come back in `claimed`.
        """

    @abc.abstractmethod
    async def claim(
        self, owner: str, limit: int, now: float, lease_seconds: float, max_attempts: int
    ) -> ClaimResult:
        """Take up to `limit` runs that are due, leasing them to `owner`.

        Due: accepted, failed_retryable whose next attempt time has come, or
        processing whose lease expired. An expired run that already used
        `max_attempts` is dead-lettered (`lease_expired`) instead of claimed.
        """

    @abc.abstractmethod
    async def extend_leases(self, owner: str, attempts: Sequence[tuple[str, int]],
                            until: float) -> list[str]:
        """Keep attempts (run_id, attempt) leased; answer the run_ids whose attempt
        `owner` still holds (the others finished, or were claimed again after their
        lease ran out: by another owner, or by this one as a later attempt)."""

    @abc.abstractmethod
    async def renew_lease(self, owner: str, run_id: str, attempt: int, until: float) -> bool:
        """Renew one attempt's lease to `until`, even past its end, if `owner` still
        holds that attempt (nobody claimed the run since); whether it did. One
        conditional write: what a holder asks when its own deadline passed."""

    @abc.abstractmethod
    async def release_leases(self, owner: str, now: float,
                             unstarted: Sequence[tuple[str, int]] = ()) -> int:
        """Expire every lease `owner` ('*': anyone) holds (shutdown, or start-up of
        the same store).

        `unstarted` lists (run_id, attempt) claimed by `owner` whose agent never
        started: they give that attempt back (it is neither recorded as lost nor
        counted against the retry budget when the run is claimed again)."""

    @abc.abstractmethod
    async def next_due_at(self) -> float | None:
        """The earliest time some run becomes claimable (retry time or lease end)."""


@runtime_checkable
class OutcomeStore(Protocol):
    """Outcomes: what becomes of a claimed run (the dispatcher's `finish`) and what an
    operator does with a dead letter (replay, discard)."""

    @abc.abstractmethod
    async def finish(
        self, run_id: str, owner: str, attempt: int, outcome: Outcome, now: float
    ) -> Transition | None:
        """Record an attempt's outcome; None if `owner` no longer holds that attempt.
        A success stores the events the agent emitted (`outcome.emitted`) with
        their runs, in the same transaction."""

    @abc.abstractmethod
    async def replay(self, run_id: str, now: float) -> Transition:
        """Send a dead-lettered or permanently failed run back to accepted (same
        run_id, recorded in its history). RunNotFound, NotReplayable."""

    @abc.abstractmethod
    async def discard(self, run_id: str, reason: str, now: float) -> None:
        """Set a dead letter aside with a reason: it stays, out of the dead-letter
        list, until replayed. RunNotFound, NotReplayable (not dead_lettered)."""


@runtime_checkable
class OutboxStore(Protocol):
    """The callback outbox (its rows are written by the run transitions): what the
    deliverer leases, sends and records."""

    @abc.abstractmethod
    async def queue_alert(self, notification_id: str, run_id: str, url: str, body: bytes,
                          now: float) -> bool:
        """Put an operator alert in the outbox (once per id); False if already there."""

    @abc.abstractmethod
    async def claim_notifications(
        self, owner: str, limit: int, now: float, lease_seconds: float
    ) -> tuple[list[Notification], float | None]:
        """Lease up to `limit` due notifications, oldest due first.

        A notification waits while an earlier one of the same run is pending,
        and while its destination is paused. Also returns when the next one
        becomes due (None: nothing pending that could be sent).
        """

    @abc.abstractmethod
    async def record_delivery(
        self, notification: Notification, owner: str, result: DeliveryResult, now: float,
        pause_after_failures: int,
    ) -> str | None:
        """Store an attempt's result and the destination's failure count; pause the
        destination after `pause_after_failures` failures in a row. Returns the
        destination's pause reason if this attempt paused it."""

    @abc.abstractmethod
    async def release_notification_leases(self, owner: str, now: float) -> int:
        """Make notifications leased by `owner` ('*': anyone) due now."""

    @abc.abstractmethod
    async def resume_destination(self, destination: str, now: float) -> None:
        """Unpause a destination; its queued notifications go out again.
        DestinationNotFound."""


@runtime_checkable
class ReadStore(Protocol):
    """Reads: the views the API, the page and the CLI show (never the writer's
    connection)."""

    @abc.abstractmethod
    async def get_run(self, run_id: str) -> RunView | None:
        """The canonical state of one run, as the API shows it."""

    @abc.abstractmethod
    async def list_runs(self, status: str | None, limit: int) -> list[RunView]:
        """The newest runs, optionally of one status."""

    @abc.abstractmethod
    async def search_runs(
        self, *, status: str | None = None, event_type: str | None = None,
        agent: str | None = None, text: str | None = None,
        since: float | None = None, until: float | None = None, before: str | None = None,
        chain: str | None = None, include_discarded: bool = True, limit: int = 50,
        filters: Mapping[str, str | None] | None = None,
    ) -> list[RunView]:
        """Newest first, filtered (every filter exact). `filters`: the apps' filters
        by name (tables.Schema.filters; values compared in NFC, None or empty: not
        asked; a name no app brings matches no run); `text` is a run id, event id or
        correlation id, or what an app's `text` filter matches; `since`/`until`
        bound the acceptance time; `before` is the last
        run_id of the previous page (keyset pagination: every page costs the
        same, however many runs there are); `chain` a chain's correlation id:
        the runs of the events that carry it, and of the event whose id it is
        when that one carries none (the chain's first)."""

    @abc.abstractmethod
    async def attempts(self, run_id: str) -> list[AttemptView]:
        """The attempt history of one run, oldest first (a running one included)."""

    @abc.abstractmethod
    async def history(self, run_id: str) -> list[HistoryEntry]:
        """Every state change of one run, oldest first: derived from the run and
        its attempts, plus the replays and discards recorded on their own."""

    @abc.abstractmethod
    async def event_of(self, run_id: str) -> dict[str, Any] | None:
        """The stored event of a run, as received. Once retention removed its body
        (AGENTBOX_BODY_RETENTION_DAYS): `event_id`, `event_type`, `source`,
        `received_at` and `body_removed_at` (ISO 8601) instead."""

    @abc.abstractmethod
    async def discarded(self, run_id: str) -> dict[str, Any] | None:
        """Why and when a dead letter was set aside (`reason`, `at`), or None."""

    @abc.abstractmethod
    async def stats(self, *, finished: bool = True) -> dict[str, Any]:
        """`runs` (count by status), `active` (not yet terminal) and
        `oldest_waiting_accepted_at` (ISO 8601 or None). `finished=False`: `active` and
        `oldest_waiting_accepted_at` alone, read from the unfinished runs (a page that
        shows no more reads as much with many finished runs as with none)."""

    @abc.abstractmethod
    async def finished_counts(self, since: float, width: float, slices: int) -> list[int]:
        """Runs that reached a terminal state in each `width`-second slice from `since`."""

    @abc.abstractmethod
    async def notifications(self, run_id: str) -> list[NotificationView]:
        """The delivery state of every notification of one run, oldest first."""

    @abc.abstractmethod
    async def list_notifications(self, state: str | None,
                                 limit: int) -> list[NotificationView]:
        """The newest notifications, optionally of one delivery state."""

    @abc.abstractmethod
    async def destinations(self) -> list[DestinationView]:
        """Every callback destination with its state, failure count and backlog."""


@runtime_checkable
class RetentionStore(Protocol):
    """Retention (store/retention.py): bounded steps, oldest first, each one transaction
    of the writer (off the event loop); agentbox.engine.retention paces them. Before
    runs are removed, each app's `Schema.before_prune` keeps what it needs of them, in
    the same transaction."""

    @abc.abstractmethod
    async def prune_finished(self, *, now: float, before: float,
                             after: tuple[float, Any] | None, scan: int) -> PruneStep:
        """Look at up to `scan` finished runs that completed before `before`, from
        `after` (a previous step's cursor; None: the oldest), and remove those that
        may go with their attempts, history, delivered or dead callbacks and discard
        record; an event goes with its last run, its expired claim with it. A run
        stays while a callback of it is pending, while its event's idempotency claim
        holds, and while it is a dead letter nobody discarded before `before`."""

    @abc.abstractmethod
    async def remove_bodies(self, *, now: float, before: float,
                            after: tuple[float, Any] | None, scan: int) -> PruneStep:
        """Look at up to `scan` events received before `before` that still hold their
        raw body, from `after`, and blank the body of each whose runs could all be
        removed by `before` (its metadata stays, with `body_removed_at`)."""

    @abc.abstractmethod
    async def prune_preview(self, *, now: float, before: float,
                            bodies_before: float) -> dict[str, int]:
        """What pruning now would remove, per table, and `bodies` (bodies blanked),
        and what each app's `Schema.before_prune` would keep, by its `kept_in`. A read."""

    @abc.abstractmethod
    async def reclaim_space(self, pages: int) -> int:
        """Give up to `pages` free pages back to the file system; the free pages left
        (0 where the engine reclaims space by itself)."""

    @abc.abstractmethod
    async def prune_idempotency_keys(self, now: float, limit: int) -> int:
        """Delete claims whose TTL ended; a later delivery of that key is a new run."""


@runtime_checkable
class SubscriptionStore(Protocol):
    """Subscriptions. An agent's changes to the event types it receives ride in its
    run's outcome (`Outcome.subscriptions`); `ingest` routes each event by the current
    set. Other programs' subscriptions get their deliveries queued in the outbox with
    the ingest (event types) or the state change (run.<state>) they report."""

    @abc.abstractmethod
    async def agent_subscriptions(self) -> list[AgentSubscriptionView]:
        """Every change agents made to their event types (the configuration's
        routing is the rest of their current set), by agent then event type."""

    @abc.abstractmethod
    async def create_subscription(self, *, subscription_id: str, url: str,
                                  topics: Sequence[str], secret: str, secret_hint: str,
                                  challenge: str, ttl: float, now: float,
                                  limit: int | None = None) -> SubscriptionView:
        """Store a subscription pending verification: nothing is delivered to it
        (its deliveries queue, held) until `record_verification` says it answered.
        TooManySubscriptions when `limit` unexpired ones exist already (counted in
        the same transaction, across instances)."""

    @abc.abstractmethod
    async def refresh_subscription(self, subscription_id: str, ttl: float, challenge: str,
                                   now: float) -> SubscriptionView:
        """Extend a subscription to `now + ttl`; a suspended one is verified again
        (with `challenge`) before anything more goes out. SubscriptionNotFound
        (an expired one is not found: it has stopped)."""

    @abc.abstractmethod
    async def delete_subscription(self, subscription_id: str, now: float,
                                  reason: str = "subscription_deleted") -> None:
        """Remove a subscription; what was queued for it becomes dead with `reason`.
        SubscriptionNotFound."""

    @abc.abstractmethod
    async def subscriptions(self, now: float, limit: int = 500,
                            after: str | None = None) -> list[SubscriptionView]:
        """Subscriptions (expired ones until they are removed) by id, which is their
        order of creation (an id starts with its creation time); `after`: the last
        id of the previous page (keyset pagination, whatever was deleted since)."""

    @abc.abstractmethod
    async def subscription(self, subscription_id: str, now: float) -> SubscriptionView | None:
        """One subscription as the API shows it, or None."""

    @abc.abstractmethod
    async def subscription_target(self, subscription_id: str) -> SubscriptionTarget | None:
        """Where and with which secret to send a subscription's deliveries (None: gone)."""

    @abc.abstractmethod
    async def claim_verifications(self, now: float, limit: int, lease_seconds: float
                                  ) -> tuple[list[Verification], float | None]:
        """Lease due verification attempts; also when the next one falls due."""

    @abc.abstractmethod
    async def record_verification(self, verification: Verification, error: str | None,
                                  next_at: float, now: float, suspend_after: int) -> str:
        """The subscription's state after an attempt: `error` None makes it active
        and releases what queued meanwhile; else after `suspend_after` failed
        attempts it is suspended, before that tried again at `next_at`."""

    @abc.abstractmethod
    async def prune_subscriptions(self, before: float, limit: int) -> int:
        """Remove subscriptions that expired before `before` (as `delete_subscription`)."""


class Store(IngestStore, OutcomeStore, OutboxStore, ReadStore, RetentionStore,
            SubscriptionStore, abc.ABC):
    """Durable events, idempotency claims, runs, their attempt history and the
    callback outbox: every protocol above, with the store's life cycle and the
    apps' tables.

    This is what the rest of agentbox sees, not where an engine starts: both
    engines are `sqlstore.SqlStore` (every method here as write operations and
    reads), and a new SQL engine subclasses it too. It brings its `dialect` (the
    folder of its statements, its migrations and apps' tables), its statements
    (`sql`: the same names as the others'), a `writer.Db` for the operations,
    `_commit` and `_abandon` (a batch in one transaction, answered by the rule
    in writer.py), `_rows` and `_slow_rows` (reads), `_probe_write`, `open`,
    `close` and `description`; `engines.py` chooses it, and one harness class
    in tests/store/conftest.py runs the conformance suite against it."""

    engine = "store"  # its name, for /healthz and metrics
    # Several processes may use the database at once (PostgreSQL). If not, every
    # lease found at start-up was left by a previous life of this one.
    shared = False

    def __init__(self) -> None:
        # False after a write failed for the storage's sake (disk full, database
        # gone); True again after the next durable write that commits.
        self.healthy = True
        self.last_error: str | None = None  # why not healthy, for people: never a secret
        # Told about changes other instances committed (PostgreSQL's LISTEN/NOTIFY).
        self.remote_listeners: list[Callable[[RemoteChange], None]] = []
        # Whether anyone here shows other instances' run changes now (a live page):
        # when not, their notifications are read for the wake-ups alone.
        self.remote_transitions_wanted: Callable[[], bool] = lambda: True
        # Told when a commit of this instance queued outbox rows that no announced
        # change says so (a subscriber's delivery of an event just ingested).
        self.outbox_listeners: list[Callable[[], None]] = []
        # Apps' own tables (`add_tables`), migrated at `open` after the store's own.
        self.schemas: list[Schema] = []

    @property
    @abc.abstractmethod
    def description(self) -> str:
        """Where the data lives, for logs and pages: never a password."""

    # -- life cycle ---------------------------------------------------------------------

    @abc.abstractmethod
    async def open(self) -> None:
        """Create or migrate the schema and start the writer."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Finish queued writes and release the database."""

    async def probe(self) -> None:
        """Unhealthy: find out whether writes are taken again (an idle instance
        learns so by itself). Healthy: look for trouble no write has met yet."""
        self.look_around()

    def look_around(self) -> None:
        """What `probe` learns without writing or waiting (pages call it before
        they render): e.g. that the database file was removed. Nothing by default."""

    # -- apps' tables (store/tables.py) ------------------------------------------------

    @abc.abstractmethod
    def add_tables(self, schema: Schema) -> Tables:
        """Give an app its own tables in this database (before `open`, which migrates
        its line): the handle its reads and writes go through once the store is open.
        Again for the same schema: another handle on the same tables."""
