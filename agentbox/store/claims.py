"""Claims and leases: runs due are leased to a worker (attempt + 1); a run
whose holder died is reclaimed when its lease ends, or dead-lettered with its
attempts spent; holders renew their leases and give them back at shutdown.

Claims and leases commit without waiting for the disk (durable=False): one lost
in a power cut only means the run is claimed again.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentbox.runs import RunStatus, check_transition
from agentbox.store.outbox import queue_callback
from agentbox.store.records import Callback, ClaimedRun, ClaimResult, Transition
from agentbox.store.writer import Batch, Db, named


def claim(db: Db, state: Batch, *, owner: str, limit: int, now: float, lease_seconds: float,
          max_attempts: int, notify_due: float) -> ClaimResult:
    result = ClaimResult()
    for (run_id,) in db.run("due_expired", {"now": now, "limit": limit}).fetchall():
        result.transitions.append(_reclaim_expired(
            db, state, run_id, owner=owner, now=now, lease_seconds=lease_seconds,
            max_attempts=max_attempts, claimed=result.claimed, notify_due=notify_due))
    free = limit - len(result.claimed)
    if free > 0:
        _claim_waiting(db, state, owner=owner, now=now, lease_seconds=lease_seconds,
                       limit=free, result=result, notify_due=notify_due)
    if len(result.claimed) < limit:
        result.next_due_at = next_due(db)
    return result


def _claim_waiting(db: Db, state: Batch, *, owner: str, now: float, lease_seconds: float,
                   limit: int, result: ClaimResult, notify_due: float) -> None:
    rows = db.run("claim_waiting", {"owner": owner, "lease_until": now + lease_seconds,
                                    "now": now, "limit": limit}).fetchall()
    if not rows:
        return
    pks = sorted({row[5] for row in rows})
    events = {pk: rest for pk, *rest in db.run("events_by_pk", {"pks": db.array(pks)})}
    for run_id, agent, attempt, attempt_base, accepted_at, event_pk in rows:
        body, event_id, event_type, source, callback_url = events[event_pk]
        result.claimed.append(ClaimedRun(
            run_id=run_id, agent=agent, attempt=attempt, round_attempt=attempt - attempt_base,
            event_body=bytes(body), accepted_at=accepted_at, event_id=event_id,
            event_type=event_type, source=source))
        notify = queue_callback(db, state, Callback(
            url=callback_url, run_id=run_id, status="processing", attempt=attempt,
            event_id=event_id, now=now, due=notify_due))
        result.transitions.append(Transition(
            run_id=run_id, status="processing", attempt=attempt, event_id=event_id,
            event_type=event_type, source=source, agent=agent, notify=notify))


def _reclaim_expired(db: Db, state: Batch, run_id: str, *, owner: str, now: float,
                     lease_seconds: float, max_attempts: int, claimed: list[ClaimedRun],
                     notify_due: float) -> Transition:
    """A run whose holder died: record the lost attempt, then claim it again or,
    with its attempts spent, dead-letter it."""
    row = named(db.run("run_for_claim", {"run_id": run_id}))
    assert row is not None
    attempt: int = row["attempt"]
    if row["attempt_started_at"] is not None:  # else the attempt was given back unstarted
        db.run("record_attempt", {
            "run_id": run_id, "attempt": attempt, "owner": row["lease_owner"] or "",
            "started_at": row["attempt_started_at"], "finished_at": now,
            "outcome": "lease_expired", "error_code": "lease_expired", "error_message": None})
    change = {"run_id": run_id, "attempt": attempt, "event_id": row["event_id"],
              "event_type": row["event_type"], "source": row["source"], "agent": row["agent"]}
    if attempt - row["attempt_base"] >= max_attempts:
        check_transition(run_id, row["status"], RunStatus.DEAD_LETTERED)
        message = f"the worker running attempt {attempt} stopped before finishing it"
        db.run("dead_letter_expired", {"now": now, "message": message, "run_id": run_id})
        state.active -= 1
        notify = queue_callback(db, state, Callback(
            url=row["callback_url"], run_id=run_id, status="dead_lettered", attempt=attempt,
            event_id=row["event_id"], now=now, due=notify_due, error_code="lease_expired"))
        return Transition(**change, status="dead_lettered", error_code="lease_expired",
                          notify=notify)
    check_transition(run_id, row["status"], RunStatus.PROCESSING)
    attempt += 1
    db.run("claim_expired", {"attempt": attempt, "owner": owner,
                             "lease_until": now + lease_seconds, "now": now, "run_id": run_id})
    claimed.append(ClaimedRun(
        run_id=run_id, agent=row["agent"], attempt=attempt,
        round_attempt=attempt - row["attempt_base"], event_body=bytes(row["body"]),
        accepted_at=row["accepted_at"], event_id=row["event_id"],
        event_type=row["event_type"], source=row["source"]))
    notify = queue_callback(db, state, Callback(
        url=row["callback_url"], run_id=run_id, status="processing", attempt=attempt,
        event_id=row["event_id"], now=now, due=notify_due))
    return Transition(**{**change, "attempt": attempt}, status="processing", notify=notify)


def next_due(db: Db) -> float | None:
    times = [row[0] for name in ("next_waiting", "next_lease_end") for row in db.run(name)]
    due = [t for t in times if t is not None]
    return min(due) if due else None


def extend_leases(db: Db, state: Batch, *, owner: str, attempts: Sequence[tuple[str, int]],
                  until: float) -> list[str]:
    # In run_id order, as the other writers take run rows: no deadlock.
    ordered = sorted(attempts)
    db.run_many("extend_lease", [{"until": until, "run_id": run_id, "owner": owner,
                                  "attempt": attempt} for run_id, attempt in ordered])
    # Two statements whatever the number of runs (round trips, on PostgreSQL).
    held = {(run_id, attempt) for run_id, attempt
            in db.run("held_leases", {"owner": owner}).fetchall()}
    return [run_id for run_id, attempt in ordered if (run_id, attempt) in held]


def renew_lease(db: Db, state: Batch, *, owner: str, run_id: str, attempt: int,
                until: float) -> bool:
    params = {"until": until, "run_id": run_id, "owner": owner, "attempt": attempt}
    return db.run("renew_lease", params).fetchone() is not None


def release_leases(db: Db, state: Batch, *, owner: str, now: float,
                   unstarted: Sequence[tuple[str, int]]) -> int:
    state.runs_ready = True
    db.run_many("give_back_attempt", [{"now": now, "run_id": run_id, "owner": owner,
                                       "attempt": attempt}
                                      for run_id, attempt in sorted(unstarted)])
    if owner == "*":
        return int(db.run("release_all_leases", {"now": now}).rowcount)
    return int(db.run("release_leases", {"now": now, "owner": owner}).rowcount)
