"""`python -m bench_floor serve ...`: agentbox with parts of its pipeline taken out,
for scripts/floors only. What is left is measured as the real server is, so the
difference is what the parts cost. Never a way to run agentbox.

BENCH_FLOOR, comma-separated:
- no-sql: the event's and the outcome's statements are not run (SQLite). The
  transactions still begin and commit, empty, so the hand-offs stay.
- no-runs: runs are stored accepted and never claimed: no agent runs, no outcome.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from agentbox.cli import main
from agentbox.engine import dispatcher
from agentbox.store import sqlite
from agentbox.store.records import Landed

FLOORS = {name for name in os.environ.get("BENCH_FLOOR", "").split(",") if name}
KNOWN = {"no-sql", "no-runs"}


def _stored_without_sql(self: Any, items: Sequence[Any], now: float) -> list[bool]:
    return [True] * len(items)


def _finished_without_sql(self: Any, items: Sequence[Any]) -> list[Landed | None]:
    return [Landed(event_pk=0, agent="noop", event_id="", event_type="session.exported",
                   source="bench", callback_url=None) for _ in items]


async def _never_claim(self: Any) -> None:
    return None  # the claim loop's round, idle whenever woken


def take_out(floors: set[str]) -> None:
    if floors - KNOWN:
        raise SystemExit(f"BENCH_FLOOR: unknown {sorted(floors - KNOWN)}; known {sorted(KNOWN)}")
    if "no-sql" in floors:
        sqlite.SqliteDb.store_events = _stored_without_sql  # type: ignore[method-assign]
        sqlite.SqliteDb.finish_runs = _finished_without_sql  # type: ignore[method-assign]
    if "no-runs" in floors:
        dispatcher.Dispatcher.lease_for = lambda self, runs: None  # type: ignore[method-assign]
        dispatcher.Dispatcher._claim_round = _never_claim  # type: ignore[method-assign]


if __name__ == "__main__":
    take_out(FLOORS)
    main()
