"""Reads and views: what the API, the page and the CLI show, built by name from
rows the engine reads on its own connections (never the writer's)."""

from __future__ import annotations

import abc
import asyncio
import json
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentbox.runs import TERMINAL, RunStatus
from agentbox.store.records import SubscriptionTarget, iso
from agentbox.store.views import (
    AgentSubscriptionView,
    AttemptView,
    DestinationView,
    HistoryEntry,
    NotificationView,
    RunView,
    SubscriptionView,
)

ACTIVE = ("accepted", "processing", "failed_retryable")
Row = Mapping[str, Any]

# search_runs' filters, each a statement fragment of the same name (search_runs.<filter>).
SEARCH_FILTERS = ("status", "event_type", "agent", "chain", "text", "since", "until",
                  "before")


@dataclass
class AppParts:
    """What apps add to the store's reads (tables.Schema): the fields of a run's view
    (`fields`: `, (expression) AS name` each), the search's text (`text`: `UNION ALL
    <query of run ids>` each) and filters (name -> condition), and what a dry prune
    counts (`kept`)."""

    field_names: list[str] = field(default_factory=list)
    fields: str = ""
    text: str = ""
    filters: dict[str, str] = field(default_factory=dict)
    kept: str = ""


def unaskable(*values: str | None) -> bool:
    """A value holds a NUL: nothing stored does (ids, names and states refuse it), and
    PostgreSQL cannot even be asked for one (it would fail the query, a 503)."""
    return any("\x00" in value for value in values if value)


def run_view(row: Row, extra: list[str] | None = None) -> RunView:
    """A run's view from its row; `extra`: the fields apps added (AppParts)."""
    attempt = row["attempt"]
    return RunView(**{name: row[name] for name in extra or ()},
        run_id=row["run_id"], status=row["status"], event_id=row["event_id"],
        event_type=row["event_type"], source=row["source"], agent=row["agent"],
        idempotency_key=row["idempotency_key"], webhook_id=row["webhook_id"],
        accepted_at=iso(row["accepted_at"]) or "", started_at=iso(row["started_at"]),
        updated_at=iso(row["updated_at"]) or "", completed_at=iso(row["completed_at"]),
        attempt=attempt, retry_count=max(attempt - 1, 0),
        next_attempt_at=iso(row["next_attempt_at"]), result=_json(row["result"]),
        error_code=row["error_code"], error_message=row["error_message"],
        replays=row["replays"], correlation_id=row["correlation_id"],
        causation_id=row["causation_id"], hop=row["hop"],
        terminal=RunStatus(row["status"]) in TERMINAL)


def notification_view(row: Row) -> NotificationView:
    return NotificationView(
        notification_id=row["notification_id"], run_id=row["run_id"], status=row["status"],
        destination=row["destination"], state=row["state"], attempts=row["attempts"],
        created_at=iso(row["created_at"]),
        next_attempt_at=iso(row["next_attempt_at"]) if row["state"] == "pending" else None,
        sending=row["lease_owner"] is not None, last_attempt_at=iso(row["last_attempt_at"]),
        delivered_at=iso(row["delivered_at"]), last_error=row["last_error"],
        last_status_code=row["last_status_code"])


def _json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def nfc(text: str | None) -> str | None:
    return None if text is None else unicodedata.normalize("NFC", text)


class Reads(abc.ABC):
    """Every read of `Store`, for an engine that brings `sql` (its statements) and
    two ways to read rows by name: `_rows` (short) and `_slow_rows` (a count or a
    search that may scan: kept off the event loop)."""

    sql: dict[str, str]
    _stats_future: asyncio.Future[dict[str, Any]] | None = None
    parts: AppParts = AppParts()  # the store's own, once apps added theirs (add_tables)

    @abc.abstractmethod
    async def _rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        """A short read."""

    @abc.abstractmethod
    async def _slow_rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        """A read that may scan many rows, off the event loop."""

    async def _named(self, name: str, **params: Any) -> list[Row]:
        return await self._rows(self.sql[name], params)

    def _runs_sql(self, name: str) -> str:
        """A statement that reads runs' views, with the fields apps add."""
        return self.sql[name].replace("{fields}", self.parts.fields)

    async def _run_views(self, name: str, **params: Any) -> list[RunView]:
        rows = await self._rows(self._runs_sql(name), params)
        return [run_view(row, self.parts.field_names) for row in rows]

    async def next_due_at(self) -> float | None:
        times = [row["due"] for name in ("next_waiting", "next_lease_end")
                 for row in await self._rows(self.sql[name])]
        due = [t for t in times if t is not None]
        return min(due) if due else None

    async def get_run(self, run_id: str) -> RunView | None:
        if unaskable(run_id):
            return None
        found = await self._run_views("get_run", run_id=run_id)
        return found[0] if found else None

    async def list_runs(self, status: str | None, limit: int) -> list[RunView]:
        if status is None:
            return await self._run_views("list_runs", limit=limit)
        return await self._run_views("list_runs_by_status", status=status, limit=limit)

    async def search_runs(
        self, *, status: str | None = None, event_type: str | None = None,
        agent: str | None = None, text: str | None = None,
        since: float | None = None, until: float | None = None, before: str | None = None,
        chain: str | None = None, include_discarded: bool = True, limit: int = 50,
        filters: Mapping[str, str | None] | None = None,
    ) -> list[RunView]:
        asked_of_apps = {name: value for name, value in (filters or {}).items() if value}
        if unaskable(status, event_type, agent, text, before, chain, *asked_of_apps.values()):
            return []
        if not set(asked_of_apps) <= set(self.parts.filters):
            return []  # a filter no app brings: no run has what it asks
        asked: dict[str, Any] = {
            "status": status or None, "event_type": event_type or None, "agent": agent or None,
            "chain": chain or None, "text": nfc(text) or None,
            "since": since, "until": until, "before": before or None}
        params = {name: value for name, value in asked.items() if value is not None}
        where = [self.sql[f"search_runs.{name}"] for name in SEARCH_FILTERS if name in params]
        where += [self.parts.filters[name] for name in sorted(asked_of_apps)]
        if not include_discarded:
            where.append(self.sql["search_runs.not_discarded"])
        sql = self._runs_sql("search_runs").replace("{where}", " AND ".join(where) or "TRUE")
        sql = sql.replace("{text}", self.parts.text)
        params |= {name: nfc(value) for name, value in asked_of_apps.items()}
        # A rare filter may scan many runs: off the event loop.
        rows = await self._slow_rows(sql, {**params, "limit": limit})
        return [run_view(row, self.parts.field_names) for row in rows]

    async def finished_counts(self, since: float, width: float, slices: int) -> list[int]:
        counts = [0] * slices
        for row in await self._named("finished_counts", since=since, width=width):
            if 0 <= row["slice"] < slices:
                counts[row["slice"]] = row["runs"]
        return counts

    async def event_of(self, run_id: str) -> dict[str, Any] | None:
        rows = await self._named("event_of", run_id=run_id)
        if not rows:
            return None
        row = rows[0]
        if row["body_removed_at"] is not None:  # retention blanked it: say so, and when
            return {"event_id": row["event_id"], "event_type": row["event_type"],
                    "source": row["source"], "received_at": iso(row["received_at"]),
                    "body_removed_at": iso(row["body_removed_at"])}
        found: dict[str, Any] = json.loads(bytes(row["body"]))
        return found

    async def prune_preview(self, *, now: float, before: float,
                            bodies_before: float) -> dict[str, int]:
        sql = self.sql["prune_preview"].replace("{kept}", self.parts.kept)
        rows = await self._slow_rows(sql, {
            "now": now, "before": before, "bodies_before": bodies_before})
        return {name: int(value or 0) for name, value in dict(rows[0]).items()}

    async def discarded(self, run_id: str) -> dict[str, Any] | None:
        rows = await self._named("discarded", run_id=run_id)
        return {"reason": rows[0]["reason"], "at": iso(rows[0]["at"])} if rows else None

    async def _attempt_rows(self, run_id: str) -> list[Row]:
        rows = list(await self._named("attempts", run_id=run_id))
        running = await self._named("running_attempt", run_id=run_id)
        if running and running[0]["attempt"] not in {row["attempt"] for row in rows}:
            rows.append({**dict(running[0]), "finished_at": None, "outcome": None,
                         "error_code": None, "error_message": None})
        return rows

    async def attempts(self, run_id: str) -> list[AttemptView]:
        return [AttemptView(
            attempt=row["attempt"], worker=row["owner"], started_at=iso(row["started_at"]),
            finished_at=iso(row["finished_at"]), outcome=row["outcome"],
            error_code=row["error_code"], error_message=row["error_message"],
            duration_ms=None if row["finished_at"] is None else round(
                (row["finished_at"] - row["started_at"]) * 1000, 3))
            for row in await self._attempt_rows(run_id)]

    async def history(self, run_id: str) -> list[HistoryEntry]:
        run = await self._named("run_accepted_at", run_id=run_id)
        if not run:
            return []
        changes: list[tuple[float, str, int, str | None]] = [
            (run[0]["accepted_at"], "accepted", 0, None)]
        for row in await self._attempt_rows(run_id):
            changes.append((row["started_at"], "processing", row["attempt"], None))
            if row["finished_at"] is not None:
                # A lost lease is no state of its own: the run stayed processing.
                outcome = row["outcome"]
                status = "processing" if outcome == "lease_expired" else outcome
                changes.append((row["finished_at"], status, row["attempt"], row["error_code"]))
        changes += [(row["at"], row["status"], row["attempt"], row["note"])
                    for row in await self._named("history", run_id=run_id)]
        changes.sort(key=lambda change: change[0])
        return [HistoryEntry(at=iso(at), status=status, attempt=attempt, note=note)
                for at, status, attempt, note in changes]

    async def stats(self, *, finished: bool = True) -> dict[str, Any]:
        """Runs by state, as the store keeps them with every write to runs (a row per
        state: as quick at a million runs as at none); callers that ask while a read
        is under way share its answer. Without the finished: the unfinished runs'
        entries of the status index alone."""
        if not finished:
            [row] = await self._rows(self.sql["active_counts"])
            return {"active": int(row["active"]),
                    "oldest_waiting_accepted_at": iso(row["oldest_waiting"])}
        if self._stats_future is None or self._stats_future.done():
            self._stats_future = asyncio.ensure_future(self._count_runs())
        return await asyncio.shield(self._stats_future)

    async def _count_runs(self) -> dict[str, Any]:
        counts = {s.value: 0 for s in RunStatus}
        rows = await self._rows(self.sql["status_counts"])
        counts.update(self._runs_by_state(rows))
        oldest = rows[0]["oldest_waiting"] if rows else None
        return {"runs": counts, "oldest_waiting_accepted_at": iso(oldest),
                "active": sum(counts[s] for s in ACTIVE)}

    def _runs_by_state(self, rows: Sequence[Mapping[str, Any]]) -> Mapping[str, int]:
        """The runs by state, from `status_counts`' rows (a row per state: PostgreSQL's
        run_counts); a store that keeps them itself (SQLite's writer) answers its own."""
        return {row["status"]: row["runs"] for row in rows}

    async def notifications(self, run_id: str) -> list[NotificationView]:
        return [notification_view(row)
                for row in await self._named("run_notifications", run_id=run_id)]

    async def list_notifications(self, state: str | None,
                                 limit: int) -> list[NotificationView]:
        if state is None:
            rows = await self._named("list_notifications", limit=limit)
        else:
            rows = await self._named("list_notifications_by_state", state=state, limit=limit)
        return [notification_view(row) for row in rows]

    async def destinations(self) -> list[DestinationView]:
        return [DestinationView(
            destination=row["destination"], state=row["state"],
            consecutive_failures=row["consecutive_failures"],
            paused_reason=row["paused_reason"], paused_at=iso(row["paused_at"]),
            last_error=row["last_error"], updated_at=iso(row["updated_at"]),
            pending=row["pending"]) for row in await self._named("destinations")]

    # -- subscriptions ------------------------------------------------------------------

    async def agent_subscriptions(self) -> list[AgentSubscriptionView]:
        return [AgentSubscriptionView(
            agent=row["agent"], event_type=row["event_type"],
            subscribed=bool(row["subscribed"]), run_id=row["run_id"],
            changed_at=iso(row["changed_at"]) or "")
            for row in await self._named("agent_subscriptions")]

    async def subscriptions(self, now: float, limit: int = 500,
                            after: str | None = None) -> list[SubscriptionView]:
        if unaskable(after):
            return []
        return [subscription_view(row, now)
                for row in await self._named("list_subscriptions", limit=limit, after=after)]

    async def subscription(self, subscription_id: str, now: float) -> SubscriptionView | None:
        if unaskable(subscription_id):
            return None
        rows = await self._named("subscription_row", id=subscription_id)
        return subscription_view(rows[0], now) if rows else None

    async def subscription_target(self, subscription_id: str) -> SubscriptionTarget | None:
        rows = await self._named("subscription_row", id=subscription_id)
        if not rows:
            return None
        row = rows[0]
        return SubscriptionTarget(id=row["id"], url=row["url"], state=row["state"],
                                  expires_at=row["expires_at"], secret=row["secret"])


REFRESH_SHARE = 0.8  # refresh before this share of the TTL has passed


def subscription_view(row: Row, now: float) -> SubscriptionView:
    """A subscription as shown: expired once its time is up; suspended when verified
    but its deliveries' destination is paused (failures in a row)."""
    state = row["state"]
    if row["expires_at"] <= now:
        state = "expired"
    elif state == "active" and row["destination_state"] == "paused":
        state = "suspended"
    last_error = row["last_error"] if row["state"] != "active" else row["delivery_error"]
    ttl = row["ttl"]
    return SubscriptionView(
        id=row["id"], url=row["url"], event_types=json.loads(row["topics"]), state=state,
        created_at=iso(row["created_at"]) or "", refreshed_at=iso(row["refreshed_at"]) or "",
        expires_at=iso(row["expires_at"]) or "",
        refresh_before=iso(row["refreshed_at"] + ttl * REFRESH_SHARE) or "",
        ttl_ms=round(ttl * 1000), verified_at=iso(row["verified_at"]),
        secret_hint=row["secret_hint"], last_error=last_error,
        consecutive_failures=(row["consecutive_failures"] or 0 if row["state"] == "active"
                              else row["verify_failures"]),
        pending=row["pending"])
