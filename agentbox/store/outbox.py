"""The callback outbox: the notification a state change owes is written in the
state change's transaction; the deliverer leases them, records each attempt,
and pauses a destination that keeps failing.

Delivery bookkeeping commits without waiting for the disk (the store queues
these operations with durable=False): losing it in a power cut only means a
notification is sent again, which its id lets the receiver drop.
"""

from __future__ import annotations

from agentbox.addresses import origin_of
from agentbox.store.errors import DestinationNotFound
from agentbox.store.records import Callback, DeliveryResult, Notification, notification
from agentbox.store.subscriptions import queue_run_state
from agentbox.store.writer import Batch, Db


def queue_callback(db: Db, state: Batch, callback: Callback) -> bool:
    """Write the outbox row a state change owes, in the state change's
    transaction; False if its event gave no callback URL. Subscribers of the
    change's state (run.<state>) get theirs in the same transaction."""
    queue_run_state(db, state, callback)
    if callback.url is None:
        return False
    state.outbox_ready = True
    notification_id, body = notification(
        callback.run_id, callback.status, callback.attempt, callback.event_id, callback.result,
        callback.error_code, callback.now)
    destination = origin_of(callback.url)
    db.run("lock_destination", {"destination": destination})
    db.run("insert_notification", {
        "id": notification_id, "run_id": callback.run_id, "status": callback.status,
        "destination": destination, "url": callback.url, "body": body, "now": callback.now,
        "due": callback.due})
    return True


def queue_alert(db: Db, state: Batch, *, notification_id: str, run_id: str, url: str,
                body: bytes, now: float) -> bool:
    state.outbox_ready = True
    return bool(db.run("insert_notification", {
        "id": notification_id, "run_id": run_id, "status": "alert",
        "destination": origin_of(url), "url": url, "body": body, "now": now,
        "due": now}).rowcount)


def claim_notifications(db: Db, state: Batch, *, owner: str, limit: int, now: float,
                        lease_seconds: float) -> tuple[list[Notification], float | None]:
    rows = db.run("claim_notifications", {
        "owner": owner, "lease_until": now + lease_seconds, "now": now, "limit": limit,
    }).fetchall()
    claimed = sorted((Notification(
        pk=pk, notification_id=notification_id, run_id=run_id, destination=destination,
        url=url, body=bytes(body), attempts=attempts, lease_until=lease_until,
        subscription_id=subscription_id)
        for pk, notification_id, run_id, destination, url, body, attempts, lease_until,
        subscription_id in rows),
        key=lambda n: n.pk)
    following = db.run("next_notification").fetchone()
    return claimed, None if following is None else following[0]


def record_delivery(db: Db, state: Batch, *, notification: Notification, owner: str,
                    result: DeliveryResult, now: float, pause_after_failures: int) -> str | None:
    delivered = result.state == "delivered"
    # The run's row first (as its state changes take it): a notification the run
    # queues meanwhile sees this one still pending, or after its commit.
    db.run("lock_run", {"run_id": notification.run_id})
    landed = db.run("record_delivery", {
        "state": result.state, "now": now, "delivered_at": now if delivered else None,
        "next_attempt_at": result.next_attempt_at if result.state == "pending" else None,
        "error": result.error, "status_code": result.status_code, "pk": notification.pk,
        "owner": owner, "lease_until": notification.lease_until,
    }).rowcount
    if not landed:
        return None  # the lease ran out and someone else has it now
    destination = notification.destination
    known = db.run("destination_state", {"destination": destination}).fetchone()
    if delivered and known is not None and known[1] == 0 and result.pause_reason is None:
        # Nothing to count: no write, so no lock on the destination's row, which
        # every writer queueing a callback to it reads (no waits, no deadlocks).
        dest_state, failures = known
    else:
        dest_state, failures = db.run("count_destination_attempt", {
            "destination": destination, "failures": 0 if delivered else 1,
            "error": result.error, "now": now,
        }).fetchone()
    reason = result.pause_reason
    if reason is None and not delivered and failures >= pause_after_failures:
        reason = f"{failures} failures in a row"
    paused = reason is not None and dest_state != "paused"
    if paused:
        db.run("pause_destination", {"reason": reason, "now": now, "destination": destination})
        db.run("hold_destination", {"destination": destination})
    if result.state != "pending":
        db.run("ready_next_of_run", {"run_id": notification.run_id,
                                     "subscription_id": notification.subscription_id})
        state.outbox_ready = True
    return reason if paused else None


def release_notification_leases(db: Db, state: Batch, *, owner: str, now: float) -> int:
    state.outbox_ready = True
    return int(db.run("release_notifications", {"now": now, "owner": owner}).rowcount)


def resume_destination(db: Db, state: Batch, *, destination: str, now: float) -> None:
    if not db.run("resume_destination", {"now": now, "destination": destination}).rowcount:
        raise DestinationNotFound(destination)
    db.run("release_destination", {"destination": destination, "now": now})
    state.outbox_ready = True

