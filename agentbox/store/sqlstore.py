"""The `Store` both SQL engines share: each write queues an operation (from the
modules named by topic: ingest, claims, outcomes, maintenance, outbox) for the
engine's writer; each read is in `reads`. An engine is a subclass that brings
its connections and life cycle (`open`, `close`, `description`), its `dialect`
and statements (`sql`), the `writer.Db` its operations run on, `_commit` and `_abandon` (the
writer's: one transaction per batch, an operation that raises answered by the
rule in writer.py), `_rows`/`_slow_rows` (`reads`) and `_probe_write`."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from agentbox.store import claims, maintenance, outbox, retention, subscriptions
from agentbox.store.errors import RunNotFound, StorageUnavailable, SubscriptionNotFound
from agentbox.store.ingest import received
from agentbox.store.interface import Store
from agentbox.store.outcomes import finish
from agentbox.store.reads import AppParts, Reads, unaskable
from agentbox.store.records import (
    ClaimResult,
    DeliveryResult,
    IngestParams,
    IngestResult,
    Notification,
    Outcome,
    PruneStep,
    Transition,
    Verification,
)
from agentbox.store.tables import Schema, Tables
from agentbox.store.views import SubscriptionView
from agentbox.store.writer import Batch, Db, GroupCommit, Keeps, log

T = TypeVar("T")
PROBE_INTERVAL_SECONDS = 1.0
# A full disk still takes a small write now and then (into room a failed one left):
# the store has taken writes again once none failed for this long.
SETTLED_SECONDS = 2.0


class SqlStore(Reads, GroupCommit, Store):
    """Every `Store` method, as operations and reads; the engine runs them."""

    engine = "sql"
    dialect = "sql"  # the folder of its statements and apps' tables: sqlite, postgres

    def __init__(self, notification_delay: float = 0.0) -> None:
        Store.__init__(self)
        GroupCommit.__init__(self)
        self.notification_delay = notification_delay  # before a callback's first attempt
        self._active = 0  # runs not yet terminal, as of the last commit
        self._stats_future = None
        self._probed_at = 0.0
        self._refusing_since: float | None = None  # when writes began to fail (monotonic)
        self._refused_at = 0.0  # the last failure
        self._refusals = 0  # write batches refused since
        self.parts = AppParts()  # what apps add to the reads (add_tables)
        self.keeps: list[Keeps] = []  # what apps keep of each event stored

    @property
    def description(self) -> str:
        return self.engine

    # -- health: whether the storage takes writes --------------------------------------

    def _refused(self, reason: str) -> StorageUnavailable:
        """A write failed for the storage's sake (disk full, database gone): unhealthy
        until a durable write commits again. Said in the log once, as it starts, not
        for every request refused meanwhile."""
        now = time.monotonic()
        if self._refusing_since is None:
            log.warning("the store cannot take writes; events are refused (503) until it "
                        "can again", extra={"reason": reason, "database": self.description})
            self._refusing_since, self._refusals = now, 0
        self._refused_at = now
        self._refusals += 1
        self.healthy, self.last_error = False, reason
        return StorageUnavailable(reason)

    def _took_writes(self) -> None:
        """A durable write committed: healthy. Said in the log once writes have stopped
        failing (SETTLED_SECONDS), not at each write that fits between failures."""
        self.healthy, self.last_error = True, None
        since = self._refusing_since
        if since is not None and time.monotonic() - self._refused_at >= SETTLED_SECONDS:
            log.warning("the store takes writes again", extra={
                "database": self.description, "refused_batches": self._refusals,
                "seconds": round(self._refused_at - since, 1)})
            self._refusing_since = None

    async def probe(self) -> None:
        """When unhealthy: try a small durable write, at most once a second. An idle
        instance (a balancer sends it nothing while /healthz says 503) thus finds
        out by itself that the database takes writes again."""
        self.look_around()
        if self.healthy or time.monotonic() - self._probed_at < PROBE_INTERVAL_SECONDS:
            return
        self._probed_at = time.monotonic()
        with contextlib.suppress(StorageUnavailable):
            await self._write(self._probe_write)

    def _probe_write(self, db: Db, state: Batch) -> None:
        """The smallest write that needs room on the disk and is flushed to it."""
        raise NotImplementedError

    # -- apps' tables ---------------------------------------------------------------------

    def add_tables(self, schema: Schema) -> Tables:
        known = next((s for s in self.schemas if s.line == schema.line), None)
        if known is None:
            self.schemas.append(schema)
            self._add_parts(schema)
        elif known != schema:
            raise ValueError(f"two apps' tables on the line {schema.line!r}")
        return Tables(schema, self.dialect, self._app_rows, self._app_write)

    def _add_parts(self, schema: Schema) -> None:
        """What an app's schema adds to ingest, the reads and a dry prune."""
        statements = schema.statements(self.dialect)
        taken = {*self.parts.field_names, *self.parts.filters}
        clash = taken & {*schema.run_fields, *schema.filters}
        if clash:
            raise ValueError(f"{schema.line}: a run field or filter another app brings "
                             f"({', '.join(sorted(clash))})")
        if schema.keeps is not None:
            self.keeps.append((schema.keeps, tuple(
                text for name, text in statements.items()
                if name == "keep_runs" or name.startswith("keep_runs."))))
        for name in schema.run_fields:
            self.parts.field_names.append(name)
            self.parts.fields += f", ({statements[f'run_field.{name}']}) AS {name}"
        for name in schema.filters:
            condition = statements[f"search_runs.{name}"]
            if name == "text":
                self.parts.text += f" UNION ALL {condition}"
            else:
                self.parts.filters[name] = f"({condition})"
        preview = statements.get(f"{schema.before_prune}.preview")
        if preview is not None:
            self.parts.kept += f", ({preview}) AS {schema.kept_in or schema.line}"

    async def _app_rows(self, sql: str, params: Mapping[str, Any], slow: bool
                        ) -> list[Mapping[str, Any]]:
        rows = await (self._slow_rows if slow else self._rows)(sql, params)
        return [row if isinstance(row, dict) else dict(zip(row.keys(), row, strict=True))
                for row in rows]

    async def _app_write(self, op: Callable[[Db, Batch], T], durable: bool) -> T:
        return await self._write(op, durable=durable)

    def _before_prune(self) -> list[tuple[str | None, str]]:
        """(what it keeps, statement) each app runs before retention removes runs; its
        `forget` after, counted as nothing (None)."""
        found: list[tuple[str | None, str]] = []
        for schema in self.schemas:
            statements = schema.statements(self.dialect)
            if schema.before_prune:
                found.append((schema.kept_in or schema.line, statements[schema.before_prune]))
            if schema.forget:
                found.append((None, statements[schema.forget]))
        return found

    # -- ingest, claims, outcomes -------------------------------------------------------

    async def ingest(self, params: IngestParams) -> IngestResult:
        op = received(params, notify_due=params.now + self.notification_delay)
        return await self._write(op, order=params.event.envelope.idempotency_key, event=True)

    async def claim(
        self, owner: str, limit: int, now: float, lease_seconds: float, max_attempts: int
    ) -> ClaimResult:
        return await self._write(functools.partial(
            claims.claim, owner=owner, limit=limit, now=now, lease_seconds=lease_seconds,
            max_attempts=max_attempts, notify_due=now + self.notification_delay),
            durable=False)

    async def finish(
        self, run_id: str, owner: str, attempt: int, outcome: Outcome, now: float
    ) -> Transition | None:
        op = finish(run_id, owner, attempt, outcome, now=now,
                    notify_due=now + self.notification_delay)
        return await self._write(op, order=run_id, patient=True)

    async def extend_leases(self, owner: str, attempts: Sequence[tuple[str, int]],
                            until: float) -> list[str]:
        return await self._write(functools.partial(
            claims.extend_leases, owner=owner, attempts=attempts, until=until), durable=False)

    async def renew_lease(self, owner: str, run_id: str, attempt: int, until: float) -> bool:
        return await self._write(functools.partial(
            claims.renew_lease, owner=owner, run_id=run_id, attempt=attempt, until=until),
            order=run_id, durable=False)

    async def release_leases(self, owner: str, now: float,
                             unstarted: Sequence[tuple[str, int]] = ()) -> int:
        return await self._write(functools.partial(
            claims.release_leases, owner=owner, now=now, unstarted=unstarted), durable=False)

    # -- maintenance --------------------------------------------------------------------

    async def replay(self, run_id: str, now: float) -> Transition:
        if unaskable(run_id):
            raise RunNotFound(run_id)
        return await self._write(functools.partial(maintenance.replay, run_id=run_id, now=now))

    async def discard(self, run_id: str, reason: str, now: float) -> None:
        await self._write(functools.partial(maintenance.discard, run_id=run_id, reason=reason,
                                            now=now))

    async def prune_idempotency_keys(self, now: float, limit: int) -> int:
        return await self._write(functools.partial(maintenance.prune_idempotency_keys,
                                                   now=now, limit=limit))

    # -- the callback outbox ------------------------------------------------------------

    async def queue_alert(self, notification_id: str, run_id: str, url: str, body: bytes,
                          now: float) -> bool:
        return await self._write(functools.partial(
            outbox.queue_alert, notification_id=notification_id, run_id=run_id, url=url,
            body=body, now=now))

    async def claim_notifications(
        self, owner: str, limit: int, now: float, lease_seconds: float
    ) -> tuple[list[Notification], float | None]:
        return await self._write(functools.partial(
            outbox.claim_notifications, owner=owner, limit=limit, now=now,
            lease_seconds=lease_seconds), durable=False)

    async def record_delivery(
        self, notification: Notification, owner: str, result: DeliveryResult, now: float,
        pause_after_failures: int,
    ) -> str | None:
        return await self._write(functools.partial(
            outbox.record_delivery, notification=notification, owner=owner, result=result,
            now=now, pause_after_failures=pause_after_failures), durable=False)

    async def release_notification_leases(self, owner: str, now: float) -> int:
        return await self._write(functools.partial(
            outbox.release_notification_leases, owner=owner, now=now), durable=False)

    async def resume_destination(self, destination: str, now: float) -> None:
        await self._write(functools.partial(outbox.resume_destination,
                                            destination=destination, now=now))

    # -- retention ------------------------------------------------------------------------

    async def prune_finished(self, *, now: float, before: float,
                             after: tuple[float, Any] | None, scan: int) -> PruneStep:
        return await self._write(retention.Background(functools.partial(
            retention.prune_finished, now=now, before=before, after=after, scan=scan,
            keep=self._before_prune())),
            durable=False)

    async def remove_bodies(self, *, now: float, before: float,
                            after: tuple[float, Any] | None, scan: int) -> PruneStep:
        return await self._write(retention.Background(functools.partial(
            retention.remove_bodies, now=now, before=before, after=after, scan=scan)),
            durable=False)

    async def reclaim_space(self, pages: int) -> int:
        return await self._write(retention.Background(functools.partial(
            retention.reclaim_space, pages=pages)), durable=False)
    # -- subscriptions ------------------------------------------------------------------

    async def create_subscription(self, *, subscription_id: str, url: str,
                                  topics: Sequence[str], secret: str, secret_hint: str,
                                  challenge: str, ttl: float, now: float,
                                  limit: int | None = None) -> SubscriptionView:
        await self._write(functools.partial(
            subscriptions.create, subscription_id=subscription_id, url=url, topics=topics,
            secret=secret, secret_hint=secret_hint, challenge=challenge, ttl=ttl, now=now,
            limit=limit))
        return await self._subscription_written(subscription_id, now)

    async def refresh_subscription(self, subscription_id: str, ttl: float, challenge: str,
                                   now: float) -> SubscriptionView:
        if unaskable(subscription_id):
            raise SubscriptionNotFound(subscription_id)
        await self._write(functools.partial(
            subscriptions.refresh, subscription_id=subscription_id, ttl=ttl,
            challenge=challenge, now=now))
        return await self._subscription_written(subscription_id, now)

    async def _subscription_written(self, subscription_id: str, now: float) -> SubscriptionView:
        found = await self.subscription(subscription_id, now)
        if found is None:  # deleted between the write and this read
            raise SubscriptionNotFound(subscription_id)
        return found

    async def delete_subscription(self, subscription_id: str, now: float,
                                  reason: str = "subscription_deleted") -> None:
        if unaskable(subscription_id):
            raise SubscriptionNotFound(subscription_id)
        await self._write(functools.partial(
            subscriptions.delete, subscription_id=subscription_id, now=now, reason=reason))

    async def claim_verifications(self, now: float, limit: int, lease_seconds: float
                                  ) -> tuple[list[Verification], float | None]:
        return await self._write(functools.partial(
            subscriptions.claim_verifications, now=now, limit=limit,
            lease_seconds=lease_seconds), durable=False)

    async def record_verification(self, verification: Verification, error: str | None,
                                  next_at: float, now: float, suspend_after: int) -> str:
        return await self._write(functools.partial(
            subscriptions.record_verification, verification=verification, error=error,
            next_at=next_at, now=now, suspend_after=suspend_after))

    async def prune_subscriptions(self, before: float, limit: int) -> int:
        return await self._write(functools.partial(subscriptions.prune, before=before,
                                                   limit=limit))
