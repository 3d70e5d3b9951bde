"""Retention: finished runs leave the store after AGENTBOX_RETENTION_DAYS, raw
event bodies after AGENTBOX_BODY_RETENTION_DAYS, and SQLite gives the space
back. Apps keep what they need of removed runs in their own tables (the store
runs their `Schema.before_prune` in the same transaction: the review's project
history), and hold their own bounds after each pass (`Retention.apps`: the
review's archive of audio), saying what they kept or let go in the report.

A pass is a series of small steps, each one short transaction of the store's
writer (a few milliseconds, sized by how long the last one took), oldest
first, with a rest after each as long as the step took: ingest and claims
never wait behind more than one step, and a backlog of a million runs is
worked off at whatever pace that leaves. The server runs a pass every
maintenance interval; `agentbox prune` runs one at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentbox.config import SECONDS_PER_DAY, Settings
from agentbox.engine.loop import Loop
from agentbox.logs import get_logger
from agentbox.store import PruneStep, RetentionStore, iso

log = get_logger("retention")
# An app's share of a pass (agentbox.apps.App.retain), given the report once the
# store's steps are done (dry too): it holds its own bounds and says what it kept.
AppShare = Callable[["PruneReport"], Awaitable[None]]

TARGET_STEP_SECONDS = 0.005  # how long one step may hold the writer
FIRST_SCAN = 200  # candidates the first step looks at; later ones scale by their time
MIN_SCAN, MAX_SCAN = 16, 5000
REST_RATIO = 1.0  # rest after a step as long as it took: at most half the writer's time
RECLAIM_PAGES = 64  # SQLite pages given back per step (256 KiB at 4 KiB a page)
# The order a report lists the tables in.
TABLES = ("runs", "attempts", "run_history", "outbox", "discarded_runs", "events",
          "idempotency_keys", "bodies")


@dataclass
class PruneReport:
    """What a pass removed (or, dry, would remove), per table."""

    dry_run: bool
    runs_before: str  # ISO 8601: runs finished before this go
    bodies_before: str  # bodies of events whose runs finished before this go
    removed: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    free_pages: int = 0  # SQLite: free pages left in the file after the pass
    # What apps add: counts by name (the review's audio_dropped), and sentences for
    # people ("2 finished exports were kept for their projects' history").
    counts: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"dry_run": self.dry_run, "runs_before": self.runs_before,
                "bodies_before": self.bodies_before,
                "removed": {**{t: 0 for t in TABLES}, **self.removed},
                "seconds": round(self.seconds, 3), "free_pages": self.free_pages,
                **self.counts, "notes": self.notes}


def report_lines(report: dict[str, Any]) -> list[str]:
    """A report (`PruneReport.as_json`, or POST /prune's answer) for people: per
    table, what went or would go."""
    dry, removed = report["dry_run"], report["removed"]
    head = (f"{'would remove' if dry else 'removed'}: runs finished before "
            f"{report['runs_before']}, raw bodies of events finished before "
            f"{report['bodies_before']}")
    rows = [f"  {table:<17} {removed.get(table, 0):>10}" for table in TABLES]
    tail = [f"  ({note})" for note in report.get("notes", ())]
    took = [] if dry else [f"  in {report['seconds']:.1f} s"]
    return [head, *rows, *tail, *took]


class Retention:
    """Runs passes over one store with one settings' periods."""

    def __init__(self, store: RetentionStore, settings: Settings, clock: Callable[[], float],
                 rest_ratio: float = REST_RATIO, apps: Sequence[AppShare] = ()) -> None:
        self.store = store
        self.apps = list(apps)  # each app's share of a pass, after the store's steps
        self.settings = settings
        self.clock = clock
        self.rest_ratio = rest_ratio
        self._lock = asyncio.Lock()  # one pass at a time
        self._loop: Loop | None = None
        self._stop = asyncio.Event()
        self._scan: dict[str, int] = {}  # per kind of step, the last size that fit

    def cutoffs(self, now: float) -> tuple[float, float]:
        return (now - self.settings.retention_days * SECONDS_PER_DAY,
                now - self.settings.body_retention_days * SECONDS_PER_DAY)

    # -- the server's background pass ---------------------------------------------------

    async def start(self) -> None:
        """A pass now and every maintenance interval after (engine/loop.py's shape; a
        pass that fails is tried again at the next interval)."""
        self._stop.clear()
        interval = self.settings.maintenance_interval_seconds
        self._loop = Loop("agentbox-retention", self._round, max_wait=interval,
                          clock=self.clock, failure="retention failed", retry=interval)
        self._loop.start()

    async def stop(self) -> None:
        self._stop.set()  # a pass in progress ends after its current step
        if self._loop is not None:
            await self._loop.stop()
            self._loop = None

    async def _round(self) -> float:
        report = await self.prune()
        if any(report.removed.get(t) for t in TABLES):
            log.info("retention removed old runs and bodies",
                     extra={**report.removed, "seconds": round(report.seconds, 3)})
        return self.clock() + self.settings.maintenance_interval_seconds

    # -- a pass -------------------------------------------------------------------------

    async def prune(self, dry_run: bool = False) -> PruneReport:
        async with self._lock:
            started = time.monotonic()
            now = self.clock()
            before, bodies_before = self.cutoffs(now)
            report = PruneReport(dry_run=dry_run, runs_before=iso(before) or "",
                                 bodies_before=iso(bodies_before) or "")
            if dry_run:
                report.removed = await self.store.prune_preview(
                    now=now, before=before, bodies_before=bodies_before)
            else:
                await self._steps("runs", report.removed, lambda after, scan:
                                  self.store.prune_finished(now=now, before=before,
                                                            after=after, scan=scan))
                await self._steps("bodies", report.removed, lambda after, scan:
                                  self.store.remove_bodies(now=now, before=bodies_before,
                                                           after=after, scan=scan))
                report.free_pages = await self._reclaim()
            for share in self.apps:
                await share(report)
            report.seconds = time.monotonic() - started
            return report

    async def _steps(self, kind: str, totals: dict[str, int], step: Callable[
            [tuple[float, Any] | None, int], Awaitable[PruneStep]]) -> None:
        cursor: tuple[float, Any] | None = None
        while not self._stop.is_set():
            scan = self._scan.get(kind, FIRST_SCAN)
            done = await step(cursor, scan)
            for table, rows in done.removed.items():
                totals[table] = totals.get(table, 0) + rows
            self._scan[kind] = _next_scan(scan, done.seconds)
            if done.examined < scan or done.cursor is None:
                return
            cursor = done.cursor
            await self._rest(done.seconds)

    async def _reclaim(self) -> int:
        free = 0
        while not self._stop.is_set():
            started = time.monotonic()
            left = await self.store.reclaim_space(RECLAIM_PAGES)
            if left == 0 or left >= free > 0:  # nothing (more) to give back
                return left
            free = left
            await self._rest(time.monotonic() - started)
        return free

    async def _rest(self, seconds: float) -> None:
        if self.rest_ratio > 0:
            await asyncio.sleep(seconds * self.rest_ratio)
        else:
            await asyncio.sleep(0)  # let the event loop serve what waits


def _next_scan(scan: int, seconds: float) -> int:
    """The next step's size: scaled toward TARGET_STEP_SECONDS, at most doubling."""
    if seconds <= 0:
        return min(scan * 2, MAX_SCAN)
    scaled = int(scan * min(TARGET_STEP_SECONDS / seconds, 2.0))
    return max(MIN_SCAN, min(scaled, MAX_SCAN))
