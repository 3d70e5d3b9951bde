"""scripts/prune_bench.py: retention of a store holding N finished runs (default
1,000,000, all older than the retention period) while ingest runs at half load.

1. Seed a SQLite store with N finished runs as a long-lived box holds them
   (event with its raw body, expired idempotency claim, run, attempt), 60 days old.
2. Baseline: a server with retention out of reach (36500 days) on that store;
   the maximum ingest rate (wrk, 64 connections, unpaced), then half of it,
   paced: ingest p50/p99 before pruning.
3. A server with the default retention (30 days of runs, 7 of bodies): its
   first maintenance pass prunes the N runs while wrk offers the same half load;
   ingest p50/p99 during, and the runs removed per second (from the oldest
   completion time left, read through the index once a second).
4. The space given back: the same half load goes on until the file has no free
   page left (the pass returns them with incremental vacuum steps after its
   deletions); file size and free pages before and after (the WAL is
   checkpointed at stop).

Reuses scripts/bench.py's servers, pre-signed events and wrk driver. All
traffic stays on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import bench  # noqa: E402  (scripts/bench.py: Server, write_events, run_wrk)

from agentbox.store.sqlite import migrate_file  # noqa: E402

DAY = 86_400.0
AGE_DAYS = 60.0  # every seeded run finished this long ago: all past 30 days
STEP = 1e-3  # seconds between two seeded runs' times
CONNECTIONS = 64


def seed(path: Path, count: int) -> float:
    """`count` finished runs, written with SQL into the store's own schema (made by
    its own migrations). Returns the first run's completion time."""
    migrate_file(path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = OFF")
    base = time.time() - AGE_DAYS * DAY
    batch = 50_000
    for start in range(0, count, batch):
        ids = range(start, min(start + batch, count))
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO events (pk, event_id, idempotency_key, event_type, source, "
            "received_at, body, project) VALUES (?, ?, ?, 'session.exported', 'seed', ?, ?, "
            "'bench')",
            ((i + 1, f"seed-{i}", f"seed:session.exported:seed-{i}", base + i * STEP,
              bench._seed_body(i)) for i in ids))
        conn.executemany(
            "INSERT INTO idempotency_keys (key, event_pk, expires_at) VALUES (?, ?, ?)",
            ((f"seed:session.exported:seed-{i}", i + 1, base + i * STEP + 7 * DAY)
             for i in ids))
        conn.executemany(
            "INSERT INTO runs (run_id, event_pk, ordinal, agent, status, attempt, accepted_at,"
            " started_at, updated_at, completed_at, result)"
            " VALUES (?, ?, 0, 'bench_apps:noop', 'succeeded', 1, ?, ?, ?, ?, '{\"ok\":true}')",
            ((_run_id(base, i), i + 1, base + i * STEP, base + i * STEP,
              base + i * STEP + STEP / 2, base + i * STEP + STEP / 2) for i in ids))
        conn.executemany(
            "INSERT INTO attempts (run_id, attempt, owner, started_at, finished_at, outcome)"
            " VALUES (?, 1, 'seed', ?, ?, 'succeeded')",
            ((_run_id(base, i), base + i * STEP, base + i * STEP + STEP / 2) for i in ids))
        conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return base + STEP / 2


def _run_id(base: float, i: int) -> str:
    return f"run_{int((base + i * STEP) * 1000):012x}{i:020x}"


def file_figures(path: Path) -> dict[str, Any]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        page_size, pages, free = (conn.execute(f"PRAGMA {name}").fetchone()[0]
                                  for name in ("page_size", "page_count", "freelist_count"))
        runs = conn.execute("SELECT count(*) FROM runs").fetchone()[0]
    wal = path.with_name(path.name + "-wal")
    return {"file_mb": round(path.stat().st_size / 2**20, 1),
            "wal_mb": round(wal.stat().st_size / 2**20, 1) if wal.exists() else 0.0,
            "pages": pages, "free_pages": free, "page_size": page_size, "runs": runs}


class Progress(threading.Thread):
    """Once a second: how many seeded runs are gone (their completion times are evenly
    spaced, so the oldest one left says), through the completion index alone."""

    def __init__(self, path: Path, first: float, count: int) -> None:
        super().__init__(daemon=True)
        self.path, self.first, self.count = path, first, count
        self.samples: list[tuple[float, int]] = []
        self.stop_event = threading.Event()

        self.free: list[tuple[float, int]] = []  # (when, free pages in the file)

    def removed(self) -> int:
        with contextlib.closing(sqlite3.connect(f"file:{self.path}?mode=ro", uri=True,
                                                timeout=10)) as conn:
            oldest = conn.execute(
                "SELECT completed_at FROM runs INDEXED BY runs_completed "
                "WHERE completed_at IS NOT NULL ORDER BY completed_at LIMIT 1").fetchone()
            self.free.append((time.monotonic(),
                              conn.execute("PRAGMA freelist_count").fetchone()[0]))
        if oldest is None or oldest[0] > self.first + self.count * STEP:
            return self.count
        return min(round((oldest[0] - self.first) / STEP), self.count)

    def done(self) -> bool:
        """Every seeded run gone, and the space given back (no free page left)."""
        return bool(self.samples and self.samples[-1][1] >= self.count
                    and self.free and self.free[-1][1] == 0)

    def run(self) -> None:
        while not self.stop_event.wait(1.0):
            with contextlib.suppress(sqlite3.Error):
                self.samples.append((time.monotonic(), self.removed()))

    def wait_done(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.done():
            time.sleep(0.5)
        self.stop_event.set()
        self.join()

    def rate(self, since: float, until: float) -> float:
        window = [(t, n) for t, n in self.samples if since <= t <= until]
        if len(window) < 2:
            return 0.0
        (t0, n0), (t1, n1) = window[0], window[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0


def half_load(server: bench.Server, work: Path, rate: float, seconds: float,
              name: str) -> dict[str, Any]:
    events = bench.write_events(work, name, int(rate * seconds * 1.5) + CONNECTIONS)
    pace_ms = max(round(CONNECTIONS / rate * 1000), 1)
    result = bench.run_wrk(server.url, events, CONNECTIONS, seconds, pace_ms)
    events.unlink()
    return {"offered_per_s": round(rate), "accepted_per_s": round(result["per_second"]),
            "p50_ms": result["p50_us"] / 1000, "p99_ms": result["p99_us"] / 1000,
            "statuses": result["statuses"]}


def with_retention(days: float, body_days: float) -> None:
    os.environ["AGENTBOX_RETENTION_DAYS"] = str(days)
    os.environ["AGENTBOX_BODY_RETENTION_DAYS"] = str(body_days)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="each load phase's length (the pruning one lasts until the "
                             "prune is done or --max-prune-seconds)")
    parser.add_argument("--max-prune-seconds", type=float, default=1500.0)
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="agentbox-prune-bench-"))
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    path = data / "agentbox.sqlite3"
    started = time.monotonic()
    first = seed(path, args.runs)
    report: dict[str, Any] = {"runs_seeded": args.runs,
                              "seed_seconds": round(time.monotonic() - started, 1),
                              "before": file_figures(path)}
    print(json.dumps({"seeded": report}), flush=True)

    with_retention(36500, 36500)  # baseline: nothing is due
    server = bench.Server("agentbox", data)
    events = bench.write_events(work, "max", 200_000)
    peak = bench.run_wrk(server.url, events, CONNECTIONS, 5)
    events.unlink()
    rate = peak["per_second"] / 2
    report["max_ingest_per_s"] = round(peak["per_second"])
    report["ingest_before"] = half_load(server, work, rate, args.seconds, "before")
    server.stop()
    print(json.dumps({"baseline": report["ingest_before"]}), flush=True)

    with_retention(30, 7)  # the defaults: every seeded run is due
    progress = Progress(path, first, args.runs)
    server = bench.Server("agentbox", data)  # its first maintenance pass starts now
    prune_started = time.monotonic()
    progress.start()
    during: list[dict[str, Any]] = []
    while time.monotonic() - prune_started < args.max_prune_seconds:
        phase_started = time.monotonic()
        during.append(half_load(server, work, rate, args.seconds, f"during{len(during)}"))
        during[-1]["removed_per_s"] = round(progress.rate(phase_started, time.monotonic()))
        during[-1]["free_pages"] = progress.free[-1][1] if progress.free else None
        print(json.dumps({"during": during[-1]}), flush=True)
        if progress.done():
            break
    progress.wait_done(args.max_prune_seconds)
    done_at = next((t for t, n in progress.samples if n >= args.runs), None)
    reclaimed_at = next((t for t, free in progress.free
                         if done_at and t >= done_at and free == 0), None)
    report["ingest_during"] = during
    report["prune_seconds"] = round(done_at - prune_started, 1) if done_at else None
    report["space_back_seconds"] = round(reclaimed_at - prune_started, 1) if reclaimed_at \
        else None
    report["peak_free_pages"] = max((free for _, free in progress.free), default=0)
    report["runs_removed_per_s"] = round(args.runs / (done_at - prune_started)) if done_at \
        else None
    # rows per run: the run, its attempt, its event, its claim (and one project_exports
    # row written for it)
    report["rows_removed_per_s"] = (report["runs_removed_per_s"] or 0) * 4
    server.stop()
    report["after"] = file_figures(path)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        kept = conn.execute("SELECT count(*), sum(length(run_id) + length(project) + "
                            "length(agent) + length(status) + 16 + coalesce(length(result), "
                            "0)) FROM project_exports").fetchone()
    report["project_exports"] = {"rows": kept[0],
                                 "payload_bytes_per_row": round((kept[1] or 0) / max(kept[0], 1))}
    print(json.dumps({"report": report}, indent=2), flush=True)


if __name__ == "__main__":
    main()
