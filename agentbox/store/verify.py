"""Integrity checks (`agentbox verify`): the store's invariants, read-only.

Event, claim and runs are written in one transaction, so none of these can
happen in normal operation; a finding means damage or a bug worth a report.
Each check is a named statement (check_*) that returns the offending rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

CHECKS = (
    ("events without any run", "check_events_without_runs"),
    ("runs whose event is missing", "check_runs_without_event"),
    ("idempotency keys pointing to no event", "check_keys_without_event"),
    ("runs in an unknown state", "check_unknown_run_states"),
    ("processing runs without a lease", "check_processing_without_lease"),
    ("waiting runs without a next attempt time", "check_waiting_without_time"),
    ("terminal runs without a completion time", "check_terminal_without_time"),
    ("callback notifications whose run is missing", "check_notifications_without_run"),
    ("callback notifications in an unknown delivery state", "check_unknown_delivery_states"),
    ("attempts numbered beyond their run's attempt count", "check_attempts_beyond_run"),
    ("runs by state kept apart from the runs stored", "check_run_counts"),
)


def integrity_problems(sql: dict[str, str], rows: Callable[[str], Iterable[Sequence[Any]]],
                       skip: Callable[[str], bool] = lambda sql: False) -> list[str]:
    """Run the checks (but those whose SQL `skip` names) with `rows`, an engine's
    way to read a statement's rows: one line per broken invariant."""
    problems = []
    for what, name in CHECKS:
        if skip(sql[name]):
            continue
        found = [str(row[0]) for row in rows(sql[name])]
        if found:
            problems.append(f"{what}: {', '.join(found)}")
    return problems
