"""Subscriptions: other programs asking to be told (MCP Events' webhook mode),
the verification challenge, and the signing of their deliveries. Their routes
are agentbox.http.subscriptions_api.

A topic is an event type (`session.exported`) or a run state (`run.succeeded`,
`run.dead_lettered`, ...: `run.` and a state of the run state machine). The
store queues each delivery in the outbox with what it reports; the callback
deliverer sends it (the same SSRF checks, no redirects, retries, pause after
failures), signed here with the subscriber's own secret (Standard Webhooks,
a fresh timestamp per attempt) and `X-Subscription-Id`. Nothing goes out until
the subscriber has answered the verification challenge; deliveries queued
meanwhile wait for it.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from agentbox.addresses import is_public, parse_address
from agentbox.config import Settings, is_loopback_host
from agentbox.engine.agents import AgentRegistry
from agentbox.engine.callbacks import (
    LEASE_GRACE_SECONDS,
    SUBSCRIPTION_DESTINATION,
    Attempt,
    CallbackDeliverer,
    DestinationPolicy,
    how_to_resume,
)
from agentbox.engine.loop import Loop
from agentbox.events import PAYLOAD_MODELS
from agentbox.logs import get_logger
from agentbox.runs import RunStatus
from agentbox.signing import (
    SW_ID_HEADER,
    SW_SIGNATURE_HEADER,
    SW_TIMESTAMP_HEADER,
    secret_keys,
    standard_signature,
)
from agentbox.store import (
    Notification,
    Store,
    Verification,
)

log = get_logger("subscriptions")

SUBSCRIPTION_ID_HEADER = "X-Subscription-Id"
VERIFICATION_TYPE = "subscription.verification"
RUN_TOPIC_PREFIX = "run."
MIN_SECRET_BYTES, MAX_SECRET_BYTES = 24, 64  # Standard Webhooks' bounds for a key
MAX_URL_CHARS = 2048
MAX_TOPICS = 50
# Expired subscriptions are shown as expired this long, then removed.
REMOVE_EXPIRED_AFTER_SECONDS = 3600.0
PRUNE_BATCH = 100
VERIFY_CONCURRENCY = 4
MAX_IDLE_WAIT_SECONDS = 60.0
FIELDS = frozenset({"url", "event_types", "secret", "ttl_ms"})
# What each route says it takes, to a body that is not a JSON object.
CREATE_BODY = ('Send a JSON object of at most 4096 bytes: {"url": ..., "event_types": [...], '
               '"secret": "whsec_...", "ttl_ms": ...}.')
REFRESH_BODY = ('A refresh takes an empty body or a JSON object of at most 4096 bytes: '
                '{"ttl_ms": ...} (optional).')


class Invalid(Exception):
    """A request field that cannot be used: 422 with its code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


# -- the rules ------------------------------------------------------------------------------


class SubscriptionPolicy(DestinationPolicy):
    """Where a subscriber may be: any https origin whose every address is public;
    plain http (or a loopback https origin) only for a loopback origin listed in
    AGENTBOX_SUBSCRIPTION_ALLOWED, which may then reach loopback addresses only.
    The address checks are the callbacks' (`DestinationPolicy.permits`)."""

    fragments = False  # a subscriber's URL is its identity: nothing left unsent in it

    def __init__(self, allowed: tuple[str, ...]) -> None:
        super().__init__(allowed, ())

    def refusal(self, url: str) -> str | None:
        origin = self.origin(url)
        if origin is None:
            return "destination_not_allowed"
        if origin in self.allowed:
            return None
        parts = urlsplit(url)
        host = parts.hostname or ""
        literal = parse_address(host)  # an address written out is checked now, a name
        if literal is not None and not is_public(literal):  # when it is resolved
            return "destination_not_allowed"
        if parts.scheme == "https" and not is_loopback_host(host):
            return None
        return "destination_not_allowed"


def topics_of(value: Any) -> list[str]:
    """The topics asked for: event types agentbox knows, or `run.<state>`."""
    if (not isinstance(value, list) or not value or len(value) > MAX_TOPICS
            or not all(isinstance(item, str) for item in value)):
        raise Invalid("invalid_event_types", f"event_types must be a list of 1 to {MAX_TOPICS} "
                      "event types or run states (run.succeeded, run.dead_lettered, ...).")
    # Every state a run changes to (accepted is its event's ingest: subscribe to the type).
    states = {f"{RUN_TOPIC_PREFIX}{status.value}" for status in RunStatus
              if status is not RunStatus.ACCEPTED}
    unknown = [item for item in value if item not in PAYLOAD_MODELS and item not in states]
    if unknown:
        shown = ", ".join(repr(item[:60]) for item in unknown[:5])
        raise Invalid("invalid_event_types", f"unknown event types or run states: {shown}; "
                      f"use event types ({', '.join(sorted(PAYLOAD_MODELS))}) or "
                      f"{', '.join(sorted(states))}.")
    return sorted(set(value))


def secret_of(value: Any) -> str:
    """A Standard Webhooks secret: `whsec_` and base64 of 24 to 64 bytes. The
    message never repeats it."""
    problem = Invalid("invalid_secret", "secret must be whsec_ followed by the base64 of "
                      f"{MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} random bytes (a Standard "
                      "Webhooks secret).")
    if not isinstance(value, str) or not value.startswith("whsec_"):
        raise problem
    keys = secret_keys(value)
    if len(keys) != 2 or not MIN_SECRET_BYTES <= len(keys[0]) <= MAX_SECRET_BYTES:
        raise problem  # not base64: secret_keys fell back to the raw text alone
    return value


def secret_hint(secret: str) -> str:
    """What may be shown of a secret: a fingerprint to tell two apart."""
    return "sha256:" + hashlib.sha256(secret.encode()).hexdigest()[:12]


def signed_headers(secret: str, msg_id: str, subscription_id: str, body: bytes,
                   timestamp: int) -> dict[str, str]:
    """A delivery's Standard Webhooks headers, signed with the subscriber's secret."""
    ts = str(timestamp)
    return {SW_ID_HEADER: msg_id, SW_TIMESTAMP_HEADER: ts,
            SW_SIGNATURE_HEADER: standard_signature(secret_keys(secret)[0], msg_id, ts, body),
            SUBSCRIPTION_ID_HEADER: subscription_id}


# -- deliveries and verification ------------------------------------------------------------


class Subscriptions:
    """Signs subscribers' deliveries (the deliverer's `Signer`), verifies new and
    refreshed subscriptions, and removes expired ones."""

    def __init__(self, store: Store, deliverer: CallbackDeliverer, settings: Settings,
                 clock: Callable[[], float] = time.time) -> None:
        self.store, self.deliverer, self.settings, self.clock = store, deliverer, settings, clock
        self.policy = SubscriptionPolicy(settings.subscription_allowed)
        self.pause_after_failures = settings.subscription_suspend_after_failures
        self.loop = Loop("agentbox-subscriptions", self._upkeep_round, clock=clock,
                         max_wait=MAX_IDLE_WAIT_SECONDS, failure="subscription upkeep failed")
        self._next_prune = 0.0
        deliverer.subscriptions = self

    async def prepare(self, notification: Notification, now: float
                      ) -> tuple[DestinationPolicy, dict[str, str]] | Attempt:
        assert notification.subscription_id is not None
        target = await self.store.subscription_target(notification.subscription_id)
        if target is None:
            return Attempt("subscription_deleted", final=True)
        if target.expires_at <= now:
            return Attempt("subscription_expired", final=True)
        return self.policy, signed_headers(target.secret, notification.notification_id,
                                           target.id, notification.body, int(now))

    # -- the loop ---------------------------------------------------------------------

    async def start(self) -> None:
        self.loop.start()

    async def stop(self) -> None:
        await self.loop.stop()

    def wake(self) -> None:
        self.loop.wake()

    async def _upkeep_round(self) -> float | None:
        """Verify the subscriptions due, and now and then remove expired ones."""
        due = await self._verify_due()
        if self.clock() >= self._next_prune:
            self._next_prune = self.clock() + self.settings.maintenance_interval_seconds
            await self.store.prune_subscriptions(
                self.clock() - REMOVE_EXPIRED_AFTER_SECONDS, PRUNE_BATCH)
        return due

    async def _verify_due(self) -> float | None:
        lease = self.settings.callback_timeout_seconds + LEASE_GRACE_SECONDS
        taken, due = await self.store.claim_verifications(self.clock(), VERIFY_CONCURRENCY,
                                                          lease)
        await asyncio.gather(*(self._verify(v) for v in taken))
        return self.clock() if taken else due

    async def _verify(self, verification: Verification) -> None:
        error = await self.challenge(verification)
        schedule = self.settings.callback_retry_schedule
        delay = schedule[min(verification.failures + 1, len(schedule) - 1)]
        state = await self.store.record_verification(
            verification, error, self.clock() + delay, self.clock(),
            self.settings.subscription_suspend_after_failures)
        log.info("subscription verification", extra={
            "subscription_id": verification.id, "error": error, "state": state,
            "attempt": verification.failures + 1})
        if state == "active":
            self.deliverer.wake()  # what queued meanwhile goes now
        elif state == "suspended" and error is not None:  # just now: the operator's alert
            destination = SUBSCRIPTION_DESTINATION + verification.id
            log.warning(f"ALERT: subscription {verification.id} suspended after failed "
                        "verifications; " + how_to_resume(destination),
                        extra={"subscription_id": verification.id, "reason": error})
            for listener in self.deliverer.pause_listeners:
                listener(destination, f"verification failed: {error}")

    async def challenge(self, verification: Verification) -> str | None:
        """POST the challenge, signed; None when the subscriber echoed it back, else
        the error category (never the answer's body)."""
        body = json.dumps({"type": VERIFICATION_TYPE, "challenge": verification.challenge,
                           "subscription_id": verification.id},
                          separators=(",", ":")).encode()
        msg_id = f"{verification.id}:verification:{verification.failures}"
        headers = {**signed_headers(verification.secret, msg_id, verification.id, body,
                                    int(self.clock())), "Accept-Encoding": "identity"}
        try:
            async with asyncio.timeout(self.settings.callback_timeout_seconds):
                attempt = await self.deliverer.send(verification.url, self.policy, headers,
                                                    body, keep_body=True)
        except TimeoutError:
            return "timeout"
        if attempt.error is not None:
            return attempt.error
        try:
            echoed = json.loads(attempt.body).get("challenge")
        except (ValueError, AttributeError, RecursionError):
            return "challenge_mismatch"
        if not isinstance(echoed, str) or not hmac.compare_digest(
                echoed.encode(), verification.challenge.encode()):
            return "challenge_mismatch"
        return None


async def agent_sets(store: Store, registry: AgentRegistry) -> list[dict[str, Any]]:
    """Each agent's current event types: the configuration's routing, changed by
    what the agent subscribed to and unsubscribed from (with the run that did)."""
    sets: dict[str, set[str]] = {name: set() for name in registry.agent_names()}
    for event_type in registry.event_types():
        for spec in registry.for_event_type(event_type):
            sets[spec.name].add(event_type)
    changed: dict[str, list[dict[str, Any]]] = {}
    for change in await store.agent_subscriptions():
        current = sets.setdefault(change.agent, set())
        if change.subscribed:
            current.add(change.event_type)
        else:
            current.discard(change.event_type)
        changed.setdefault(change.agent, []).append(change.model_dump(
            mode="json", include={"event_type", "subscribed", "run_id", "changed_at"}))
    return [{"agent": agent, "event_types": sorted(types), "changes": changed.get(agent, [])}
            for agent, types in sorted(sets.items())]
