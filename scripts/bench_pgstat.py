"""What a measured load cost PostgreSQL: its processes' CPU, commits, WAL, waits.

`PgWatch(url)` is started before a load and finished after it; `report()` gives
- the CPU seconds of the whole server: the postmaster with every child it has
  reaped (cutime) plus the children alive now, so a backend that came and went
  in between is counted too; split, for the children alive at the end, into this
  database's backends and the server's own processes (WAL writer, checkpointer,
  autovacuum ...), and what the processes that exited meanwhile spent;
- the commits and rollbacks of this database (pg_stat_database), the WAL bytes
  written (pg_current_wal_lsn) and WAL records and syncs (pg_stat_wal);
- what this database's busy backends were waiting on, sampled every
  SAMPLE_SECONDS (pg_stat_activity), and the lock requests not granted
  (pg_locks), as shares of the samples;
- where the server loads pg_stat_statements (scripts/capacity.py's does), the
  statements that took the most of its time, with their calls and time
  (planning and execution, commit's WAL flush included) per completed event.

The server must be on this machine (its processes are read in /proc: Linux).
Another database's load on the same server would be counted in the CPU and WAL:
the bench gives each load a server of its own, or one nobody else uses.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

SAMPLE_SECONDS = 0.1
TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command name (field 3, state, first)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def process_cpu(pid: int, children: bool = False) -> float:
    """CPU seconds of a process (user + system), with its reaped children's if asked."""
    fields = _stat(pid)
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / TICK


def children_of(parent: int) -> list[int]:
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if int(_stat(int(entry.name))[1]) == parent:
                    pids.append(int(entry.name))
            except (OSError, IndexError, ValueError):  # gone meanwhile
                continue
    return pids


class PgWatch(threading.Thread):
    """Samples a PostgreSQL server while a load runs (see the module's docstring)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)
        self.own = 0  # transactions of our own (each statement here is one): not the load's
        backend = self._query("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
        self.postmaster = int(_stat(backend)[1])
        self.stop_event = threading.Event()
        self.samples = 0
        self.busy = 0  # backend-samples where a backend of this database was active
        self.waits: Counter[str] = Counter()
        self.locks: Counter[str] = Counter()
        self.kinds: dict[int, str] = {}
        self.statements = self._reset_statements()
        self.start_cpu = self.cpu()
        self.start_children = self._children_cpu()
        self.start_db = self._database_counts()
        self.own_at_start = self.own
        self.start_wal = self._wal()
        self.wall_start = time.monotonic()

    # -- readings --------------------------------------------------------------

    def _query(self, sql: str, params: tuple[Any, ...] | None = None) -> Any:
        self.own += 1
        return self.conn.execute(sql, params)  # type: ignore[arg-type]

    def pending(self, sql: str) -> bool:
        """Whether the load's target still has work (`sql`: one cheap EXISTS, on this
        connection: no new backend per look, and counted as our own)."""
        return bool(self._query(sql).fetchone()[0])

    def cpu(self) -> float:
        """The whole server's CPU so far: postmaster, reaped children, live children."""
        return process_cpu(self.postmaster, children=True) + sum(
            self._children_cpu().values())

    def _children_cpu(self) -> dict[int, float]:
        cpu = {}
        for pid in children_of(self.postmaster):
            try:
                cpu[pid] = process_cpu(pid)
            except OSError:
                continue
        return cpu

    def _database_counts(self) -> tuple[int, int]:
        row = self._query(
            "SELECT xact_commit, xact_rollback FROM pg_stat_database "
            "WHERE datname = current_database()").fetchone()
        return int(row[0]), int(row[1])  # type: ignore[index]

    def _wal(self) -> dict[str, float]:
        lsn, records, syncs, sync_ms = self._query(
            "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, wal_records, wal_sync, wal_sync_time "
            "FROM pg_stat_wal").fetchone()  # type: ignore[misc]
        # wal_sync_time: 0 unless the server has track_wal_io_timing on
        return {"bytes": float(lsn), "records": float(records), "syncs": float(syncs),
                "sync_ms": float(sync_ms)}

    def _reset_statements(self) -> bool:
        """Whether pg_stat_statements is there (then reset: the whole server's)."""
        import psycopg

        try:
            self._query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            self._query("SELECT pg_stat_statements_reset()")
            return True
        except psycopg.Error:  # not in shared_preload_libraries
            return False

    def top_statements(self, events: int, limit: int = 8) -> list[dict[str, Any]]:
        """This database's statements by the time they took, per completed event."""
        if not self.statements:
            return []
        rows = self.conn.execute(
            "SELECT query, calls, total_plan_time + total_exec_time FROM pg_stat_statements "
            "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND query NOT LIKE '%%pg_stat%%' ORDER BY 3 DESC LIMIT %s", (limit,)).fetchall()
        per = max(events, 1)
        return [{"statement": " ".join(query.split())[:90],
                 "calls_per_event": round(calls / per, 3),
                 "us_per_event": round(ms * 1000 / per)} for query, calls, ms in rows]

    # -- sampling --------------------------------------------------------------

    def run(self) -> None:
        while not self.stop_event.wait(SAMPLE_SECONDS):
            try:
                self._sample()
            except Exception:  # the database went (the phase is over): stop sampling
                return

    def _sample(self) -> None:
        rows = self._query(
            "SELECT pid, backend_type, state, wait_event_type, wait_event "
            "FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
            "AND (datname = current_database() OR datname IS NULL)").fetchall()
        self.samples += 1
        for pid, kind, state, wait_type, wait in rows:
            self.kinds[pid] = kind
            if kind == "client backend" and state not in (None, "idle"):
                self.busy += 1
                self.waits[f"{wait_type}:{wait}" if wait_type else "CPU"] += 1
        for locktype, mode, count in self._query(
                "SELECT locktype, mode, count(*) FROM pg_locks l "
                "JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE NOT l.granted AND a.datname = current_database() GROUP BY 1, 2"):
            self.locks[f"{locktype} {mode}"] += count

    # -- the end ---------------------------------------------------------------

    def finish(self) -> dict[str, Any]:
        """Stop sampling and take the CPU and WAL readings (the database's commit
        counts are read by `commits()`, after its clients have gone)."""
        self.stop_event.set()
        self.join()
        self.seconds = time.monotonic() - self.wall_start
        self.cpu_seconds = self.cpu() - self.start_cpu
        end = self._children_cpu()
        split: Counter[str] = Counter()
        for pid, cpu in end.items():
            kind = self.kinds.get(pid, "other")
            split["backends" if kind == "client backend" else kind] += (
                cpu - self.start_children.get(pid, 0.0))
        # what backends that exited meanwhile spent is in the postmaster's reaped time
        split["exited"] = self.cpu_seconds - sum(split.values())
        self.split = {kind: round(cpu, 3) for kind, cpu in split.most_common()}
        wal = self._wal()
        self.wal = {key: wal[key] - self.start_wal[key] for key in wal}
        return self.report()

    def commits(self) -> dict[str, int]:
        """Commits and rollbacks since the start: call once the load's clients have
        disconnected (a backend reports its counts when idle a while, or on exit)."""
        own = self.own  # before this reading's own statement
        commits, rollbacks = self._database_counts()
        self.committed = {"commits": commits - self.start_db[0] - (own - self.own_at_start),
                          "rollbacks": rollbacks - self.start_db[1]}
        return self.committed

    def close(self) -> None:
        self.conn.close()

    def report(self) -> dict[str, Any]:
        busy = max(self.busy, 1)
        return {
            "cpu_seconds": round(self.cpu_seconds, 3),
            "cpu_split_seconds": self.split,
            "wal_bytes": int(self.wal["bytes"]), "wal_records": int(self.wal["records"]),
            "wal_syncs": int(self.wal["syncs"]),
            "wal_sync_ms": (round(self.wal["sync_ms"] / self.wal["syncs"], 3)
                            if self.wal["sync_ms"] and self.wal["syncs"] else None),
            **getattr(self, "committed", {}),
            "samples": self.samples,
            "busy_backends_mean": round(self.busy / max(self.samples, 1), 2),
            # what a busy backend was doing: CPU, or waiting on a lock, I/O, the client
            "waits": {name: round(count / busy, 3)
                      for name, count in self.waits.most_common(8)},
            "lock_waits_per_sample": {name: round(count / max(self.samples, 1), 3)
                                      for name, count in self.locks.most_common(5)},
        }
