"""Maintenance: replay and discard of failed runs (people decide these), and
the expiry of idempotency claims after their TTL. (Retention: store/retention.py.)"""

from __future__ import annotations

from agentbox.runs import RunStatus, check_transition
from agentbox.store.errors import BodyRemoved, NotReplayable, RunNotFound
from agentbox.store.records import Transition
from agentbox.store.writer import Batch, Db, named

REPLAYED = "replayed"


def replay(db: Db, state: Batch, *, run_id: str, now: float) -> Transition:
    db.run("lock_run", {"run_id": run_id})  # a concurrent replay or claim waits
    row = named(db.run("run_for_claim", {"run_id": run_id}))
    if row is None:
        raise RunNotFound(run_id)
    status = row["status"]
    if status not in (RunStatus.DEAD_LETTERED, RunStatus.FAILED_PERMANENT):
        raise NotReplayable(run_id, status)
    if not bytes(row["body"]):  # blanked by retention: nothing to run again
        raise BodyRemoved(run_id, status)
    check_transition(run_id, status, RunStatus.ACCEPTED)
    db.run("replay", {"now": now, "run_id": run_id})
    # Replayed, it is no longer set aside: should it fail again, it is listed again.
    db.run("undiscard", {"run_id": run_id})
    db.run("insert_history", {"run_id": run_id, "at": now, "status": "accepted",
                              "attempt": row["attempt"], "note": REPLAYED})
    state.active += 1
    state.runs_ready = True
    return Transition(run_id=run_id, status="accepted", attempt=row["attempt"],
                      event_id=row["event_id"], event_type=row["event_type"],
                      source=row["source"], agent=row["agent"], note=REPLAYED)


def discard(db: Db, state: Batch, *, run_id: str, reason: str, now: float) -> None:
    row = db.run("lock_run", {"run_id": run_id}).fetchone()
    if row is None:
        raise RunNotFound(run_id)
    if row[0] != RunStatus.DEAD_LETTERED:
        raise NotReplayable(run_id, row[0])
    db.run("insert_discard", {"run_id": run_id, "reason": reason, "at": now})
    db.run("insert_history", {"run_id": run_id, "at": now, "status": "dead_lettered",
                              "attempt": row[1], "note": f"discarded: {reason}"})


def prune_idempotency_keys(db: Db, state: Batch, *, now: float, limit: int) -> int:
    return int(db.run("prune_keys", {"now": now, "limit": limit}).rowcount)
