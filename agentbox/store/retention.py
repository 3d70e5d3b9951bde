"""Retention's operations: one bounded step each, run by the writer like any
other write (on its thread, never on the event loop: `Background`).

A step looks at a bounded number of candidates from a cursor, oldest first,
and removes the ones that may go (the statements say which: `prune_runs.due`,
`remove_bodies.update`). Children go before their parents, in the order the
statements are listed, which is the order every other writer takes its locks
in (runs, then what hangs off them, then claims and events). No step waits for
a lock another transaction holds: what is held is skipped (SKIP LOCKED) and
left to the next pass, so a step can never be one side of a deadlock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from agentbox.store.records import PruneStep
from agentbox.store.writer import Batch, Db

# The tables a step removes rows from, children before parents.
RUN_TABLES = ("attempts", "run_history", "outbox", "discarded_runs", "runs",
              "idempotency_keys", "events")
START = (-1.0, "")  # before any cursor: every time stored is positive


class Background:
    """An operation the engine runs on its writer's thread, off the event loop
    (it may take milliseconds, where an ingest takes microseconds)."""

    background = True

    def __init__(self, op: Callable[[Db, Batch], Any]) -> None:
        self.op = op

    def __call__(self, db: Db, state: Batch) -> Any:
        return self.op(db, state)


def prune_finished(db: Db, state: Batch, *, now: float, before: float,
                   after: tuple[float, Any] | None, scan: int,
                   keep: Sequence[tuple[str | None, str]] = ()) -> PruneStep:
    """Remove up to `scan` finished runs due; first, each app's statement in `keep`
    ((counted as, SQL): Schema.before_prune, and its `forget`, counted as nothing) keeps
    what it needs of them (`:ids`)."""
    started = time.perf_counter()
    after_at, after_id = after or START
    examined = db.run("prune_scan", {"before": before, "after_at": after_at,
                                     "after_id": after_id, "scan": scan}).fetchall()
    if not examined:
        return PruneStep(removed={}, examined=0, cursor=None,
                         seconds=time.perf_counter() - started)
    ids = db.array([row[0] for row in examined])
    due = db.run("prune_runs.due", {"ids": ids, "before": before, "now": now}).fetchall()
    removed: dict[str, int] = {}
    if due:
        ids = db.array([row[0] for row in due])
        pks = db.array(sorted({row[1] for row in due}))
        for kept_in, statement in keep:
            rows = max(db.run_text(statement, {"ids": ids}).rowcount, 0)
            if kept_in is not None:
                removed[kept_in] = rows
        for table in RUN_TABLES:
            params = {"pks": pks, "now": now} if table in ("idempotency_keys", "events") \
                else {"ids": ids}
            removed[table] = max(db.run(f"prune_runs.{table}", params).rowcount, 0)
    last = examined[-1]
    return PruneStep(removed=removed, examined=len(examined), cursor=(last[1], last[0]),
                     seconds=time.perf_counter() - started)


def remove_bodies(db: Db, state: Batch, *, now: float, before: float,
                  after: tuple[float, Any] | None, scan: int) -> PruneStep:
    started = time.perf_counter()
    after_at, after_pk = after or (-1.0, -1)
    examined = db.run("body_scan", {"before": before, "after_at": after_at,
                                    "after_pk": after_pk, "scan": scan}).fetchall()
    if not examined:
        return PruneStep(removed={}, examined=0, cursor=None,
                         seconds=time.perf_counter() - started)
    pks = db.array([row[0] for row in examined])
    held: dict[Any, int] = {}
    for _, event_pk in db.run("remove_bodies.lock", {"pks": pks}):
        held[event_pk] = held.get(event_pk, 0) + 1
    # Only events whose every run is held: one skipped (someone else holds it) waits
    # for the next pass, rather than this step waiting for it.
    whole = [pk for pk, runs in db.run("remove_bodies.count", {"pks": pks})
             if held.get(pk) == runs]
    blanked = 0
    if whole:
        blanked = max(db.run("remove_bodies.update", {
            "pks": db.array(sorted(whole)), "before": before, "now": now}).rowcount, 0)
    last = examined[-1]
    return PruneStep(removed={"bodies": blanked}, examined=len(examined),
                     cursor=(last[1], last[0]), seconds=time.perf_counter() - started)


def reclaim_space(db: Db, state: Batch, *, pages: int) -> int:
    """Give up to `pages` free pages back, one a statement (each step of SQLite's
    incremental_vacuum frees one page, and the driver steps a PRAGMA once); the
    free pages left. Nothing free (PostgreSQL's answer): nothing to do."""
    free = _free_pages(db)
    for _ in range(min(pages, free)):
        db.run("reclaim_space")
    return _free_pages(db) if free else 0


def _free_pages(db: Db) -> int:
    row = db.run("free_pages").fetchone()
    return int(row[0]) if row else 0
