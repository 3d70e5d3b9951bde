"""Subscriptions: which agents an event goes to (the configuration's routing plus
the changes agents made, each written with its run's success), and the
deliveries other programs' subscriptions are owed, queued in the outbox in the
transaction of what they report (an event's ingest, a run's state change).

A subscription's deliveries go to the destination `subscription:<id>`, which
starts paused (held until the subscriber answers the verification challenge)
and is paused again by the outbox's own rule after repeated failures
(suspended). Its outbox rows carry `subscription_id` and the run_id of the run
they report (an event's: its first run), so they are pruned with that run.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator, Sequence
from typing import Any

from agentbox.events import Envelope
from agentbox.store.errors import SubscriptionNotFound, TooManySubscriptions
from agentbox.store.records import Callback, Verification, iso, notification
from agentbox.store.writer import Batch, Db, named

HOLD_REASON = "pending_verification"
EXPIRED = "subscription_expired"


def destination_of(subscription_id: str) -> str:
    return f"subscription:{subscription_id}"


# -- agents -------------------------------------------------------------------------------


def routed(db: Db, state: Batch, event_type: str, configured: Sequence[str]) -> tuple[str, ...]:
    """The agents an event of `event_type` goes to now: those configured, less the
    ones that unsubscribed, plus the ones that subscribed (in that order)."""
    if state.agent_overrides is None:  # once per transaction: mostly there are none
        state.agent_overrides = bool(db.run("any_agent_subscriptions").fetchone()[0])
    if not state.agent_overrides:
        return tuple(configured)
    changes = {agent: bool(subscribed) for agent, subscribed in
               db.run("agent_subscription_changes", {"event_type": event_type})}
    kept = [agent for agent in configured if changes.get(agent, True)]
    added = sorted(agent for agent, subscribed in changes.items()
                   if subscribed and agent not in kept)
    return (*kept, *added)


def change_agent_subscriptions(db: Db, state: Batch, *, agent: str, run_id: str,
                               changes: Sequence[tuple[str, bool]], now: float) -> None:
    """An agent's subscribe/unsubscribe calls, with its run's success (the last
    call for a type wins)."""
    for event_type, subscribed in changes:
        db.run("set_agent_subscription", {"event_type": event_type, "agent": agent,
                                          "subscribed": int(subscribed), "run_id": run_id,
                                          "now": now})
    if changes:
        state.agent_overrides = True


# -- deliveries owed ----------------------------------------------------------------------


def _subscribers(db: Db, state: Batch, topic: str, now: float) -> Iterator[tuple[str, str, str]]:
    if state.subscribers is None:  # once per transaction: mostly there are none
        state.subscribers = bool(db.run("any_subscriptions").fetchone()[0])
    if not state.subscribers:
        return iter(())
    return iter(db.run("subscribers_of", {"topic": topic, "now": now}).fetchall())


def queue_run_state(db: Db, state: Batch, callback: Callback) -> None:
    """The deliveries a run's state change owes subscribers of `run.<state>`."""
    found = list(_subscribers(db, state, f"run.{callback.status}", callback.now))
    if not found:
        return
    notification_id, body = notification(
        callback.run_id, callback.status, callback.attempt, callback.event_id, callback.result,
        callback.error_code, callback.now)
    document = {**json.loads(body), "type": f"run.{callback.status}"}
    _insert(db, state, found, document, [f"{sid}:{notification_id}" for sid, _, _ in found],
            run_id=callback.run_id, status=callback.status, due=callback.due,
            now=callback.now)


def queue_event(db: Db, state: Batch, *, env: Envelope, body: bytes, run_ids: Sequence[str],
                now: float, due: float) -> None:
    """The deliveries an event stored owes subscribers of its type. Keyed on its
    first run: they go when that run's rows are pruned."""
    found = list(_subscribers(db, state, env.event_type, now))
    if not found or not run_ids:
        return
    document = {"type": "event", "event_type": env.event_type, "event_id": env.event_id,
                "source": env.source, "run_ids": list(run_ids), "occurred_at": iso(now),
                "event": json.loads(body)}
    _insert(db, state, found, document, [f"{sid}:{run_ids[0]}:event" for sid, _, _ in found],
            run_id=run_ids[0], status="event", due=due, now=now)


def _insert(db: Db, state: Batch, found: Sequence[tuple[str, str, str]],
            document: dict[str, Any], notification_ids: Sequence[str], *, run_id: str,
            status: str, due: float, now: float) -> None:
    """One delivery per subscriber found (id, url, destination), in two statements
    whatever their number: their destinations locked, then their rows."""
    db.run("lock_destinations", {"destinations": db.array([dest for _, _, dest in found])})
    bodies = _bodies(document, [(nid, sid) for nid, (sid, _, _) in zip(notification_ids, found,
                                                                       strict=True)])
    db.run_many("insert_subscription_delivery", [
        {"id": nid, "run_id": run_id, "status": status, "destination": destination,
         "url": url, "now": now, "due": due, "subscription_id": sid, "body": body}
        for nid, body, (sid, url, destination) in zip(notification_ids, bodies, found,
                                                       strict=True)])
    state.outbox_ready = True


def _bodies(document: dict[str, Any], ids: Sequence[tuple[str, str]]) -> list[bytes]:
    """Each subscriber's body: `document` with its (notification_id, subscription_id),
    compact JSON with sorted keys. Serialised once, the two ids then put in their
    places (an event's body a thousand times over was most of its ingest)."""
    mark = secrets.token_hex(8)  # a string no document holds
    text = json.dumps({**document, "notification_id": f"{mark}n", "subscription_id": f"{mark}s"},
                      sort_keys=True, separators=(",", ":"))
    head, _, rest = text.partition(f'"{mark}n"')
    middle, _, tail = rest.partition(f'"{mark}s"')
    return [f"{head}{json.dumps(nid)}{middle}{json.dumps(sid)}{tail}".encode()
            for nid, sid in ids]


# -- other programs' subscriptions ----------------------------------------------------------


def create(db: Db, state: Batch, *, subscription_id: str, url: str, topics: Sequence[str],
           secret: str, secret_hint: str, challenge: str, ttl: float, now: float,
           limit: int | None) -> None:
    if limit is not None:
        db.run("lock_subscriptions")  # instances creating at once count one after another
        if db.run("count_subscriptions", {"now": now}).fetchone()[0] >= limit:
            raise TooManySubscriptions(limit)
    destination = destination_of(subscription_id)
    db.run("insert_subscription", {
        "id": subscription_id, "url": url, "destination": destination,
        "topics": json.dumps(sorted(set(topics))), "secret": secret, "secret_hint": secret_hint,
        "challenge": challenge, "ttl": ttl, "now": now, "expires_at": now + ttl})
    db.run_many("insert_subscription_topic", [{"topic": topic, "id": subscription_id}
                                              for topic in sorted(set(topics))])
    db.run("hold_subscription", {"destination": destination, "reason": HOLD_REASON,
                                 "now": now})
    state.subscribers = True


def refresh(db: Db, state: Batch, *, subscription_id: str, ttl: float, challenge: str,
            now: float) -> None:
    row = named(db.run("subscription_row", {"id": subscription_id}))
    if row is None or row["expires_at"] <= now:  # an expired one has stopped
        raise SubscriptionNotFound(subscription_id)
    db.run("refresh_subscription", {"id": subscription_id, "ttl": ttl, "now": now,
                                    "expires_at": now + ttl})
    verified_state, destination_state = row["state"], row["destination_state"]
    if verified_state == "suspended" or (verified_state == "active"
                                         and destination_state == "paused"):
        db.run("reverify_subscription", {"id": subscription_id, "challenge": challenge,
                                         "now": now})
        db.run("hold_subscription", {"destination": destination_of(subscription_id),
                                     "reason": HOLD_REASON, "now": now})
        state.outbox_ready = True


def delete(db: Db, state: Batch, *, subscription_id: str, now: float, reason: str) -> None:
    if not db.run("delete_subscription", {"id": subscription_id}).rowcount:
        raise SubscriptionNotFound(subscription_id)
    db.run("delete_subscription_topics", {"id": subscription_id})
    db.run("drop_subscription_deliveries", {"id": subscription_id, "error": reason})
    db.run("delete_subscription_destination", {"destination": destination_of(subscription_id)})


def prune(db: Db, state: Batch, *, before: float, limit: int) -> int:
    expired = db.run("expired_subscriptions", {"before": before, "limit": limit}).fetchall()
    for subscription_id, _destination in expired:
        delete(db, state, subscription_id=subscription_id, now=before, reason=EXPIRED)
    return len(expired)


def claim_verifications(db: Db, state: Batch, *, now: float, limit: int, lease_seconds: float
                        ) -> tuple[list[Verification], float | None]:
    rows = db.run("due_verifications", {"now": now, "limit": limit}).fetchall()
    taken = []
    for subscription_id, url, secret, challenge, failures in rows:
        if db.run("take_verification", {"id": subscription_id, "now": now,
                                        "lease_until": now + lease_seconds}).rowcount:
            taken.append(Verification(id=subscription_id, url=url, challenge=challenge,
                                      failures=failures, secret=secret))
    following = db.run("next_verification", {"now": now}).fetchone()
    return taken, None if following is None else following[0]


def record_verification(db: Db, state: Batch, *, verification: Verification,
                        error: str | None, next_at: float, now: float,
                        suspend_after: int) -> str:
    params = {"id": verification.id, "challenge": verification.challenge, "now": now}
    if error is None:
        if db.run("subscription_verified", params).rowcount:
            destination = destination_of(verification.id)
            db.run("resume_destination", {"now": now, "destination": destination})
            db.run("release_destination", {"destination": destination, "now": now})
            state.outbox_ready = True
            return "active"
    else:
        row = db.run("verification_failed", {**params, "error": error, "next_at": next_at,
                                             "limit": suspend_after}).fetchone()
        if row is not None:
            return str(row[0])
    found = named(db.run("subscription_row", {"id": verification.id}))
    return "deleted" if found is None else str(found["state"])
