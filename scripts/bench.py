"""scripts/bench: durable ingest and drain of a real agentbox server, against the ceiling.

For each concurrency, the same pre-signed unique events are fired with wrk at a
fresh ceiling server and at a fresh agentbox server (no-op agent), each for a
bounded time; at 16 and 64 connections also at a store already holding
--seed-runs runs, in the order empty, seeded, seeded, empty. Then, for
agentbox only: the drain (202 -> succeeded) at a steady offered load of half
the maximum, on both stores in the same order. Every request must be answered
202, and the store must hold exactly as many events and runs as there were
202s. All traffic stays on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SECRET = "bench-secret-" + uuid.uuid4().hex
ADMIN_TOKEN = "bench-admin-" + uuid.uuid4().hex  # the page and API need it on loopback too
LUA = HERE / "bench.lua"
MAX_EVENTS_PER_SECOND = 20_000  # enough pre-signed events for the fastest target
CALIBRATION_SECONDS = 2  # the drain's first run, which sets the pace of the measured one
RUNNING: set[Server] = set()  # servers started and not stopped: a failing bench kills them
WRK_PREFIX: list[str] = []  # e.g. taskset -c 1 (scripts/capacity.py pins wrk to a core)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# -- events -----------------------------------------------------------------------


def write_events(work: Path, name: str, count: int) -> Path:
    """`count` pre-signed requests, one per line: timestamp, signature, body (tab
    separated), in work/events-<name>.tsv. Their events are new to any store: the
    ids hold a random part, so no phase's events repeat another's."""
    path = work / f"events-{name}.tsv"
    key = SECRET.encode()
    ts = str(int(time.time()))
    unique = f"{name}-{uuid.uuid4().hex[:6]}"
    with open(path, "w") as f:
        for i in range(count):
            body = event_body(f"{unique}-{i}")
            signature = hmac.new(key, f"{ts}.{body}".encode(), hashlib.sha256).hexdigest()
            f.write(f"{ts}\t{signature}\t{body}\n")
    return path


def event_body(event_id: str) -> str:
    """The bench's event: a `session.exported` of the project "bench", with this id."""
    return (
        f'{{"schema_version":"v1","event_id":"{event_id}",'
        f'"idempotency_key":"bench:session.exported:{event_id}",'
        '"event_type":"session.exported","source":"bench",'
        '"timestamp":"2026-07-27T15:42:00Z","payload":{"project_id":"bench",'
        '"mix_url":"/tmp/bench.wav"}}'
    )


def server_environment(data_dir: Path, scripts: Path, log_level: str = "info",
                       database_url: str | None = None, floor: str = "",
                       settings: dict[str, str] | None = None) -> dict[str, str]:
    """The environment every agentbox the bench measures runs in: its data in
    `data_dir`, the no-op agent of `scripts`/bench_apps.py on `session.exported`."""
    return {
        **os.environ,
        # A copy of the package first on PYTHONPATH is what an A/B measures.
        "PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"),
                                                    str(scripts)])),
        "XDG_CONFIG_HOME": str(data_dir / "config"),
        "AGENTBOX_DATA_DIR": str(data_dir),
        "AGENTBOX_WEBHOOK_SECRET": SECRET,
        "AGENTBOX_ADMIN_TOKEN": ADMIN_TOKEN,
        "BENCH_SECRET": SECRET,
        "AGENTBOX_AGENTS": "session.exported=bench_apps:noop",
        "AGENTBOX_MAX_PENDING": "10000000",
        "AGENTBOX_LOG_LEVEL": log_level,
        **({"AGENTBOX_DATABASE_URL": database_url} if database_url else {}),
        "BENCH_FLOOR": floor,
        **(settings or {}),
    }


# -- servers ----------------------------------------------------------------------


class Server:
    log_level = "info"  # agentbox's (--log-level): the default configuration's

    def __init__(self, kind: str, data_dir: Path, database_url: str | None = None,
                 floor: str = "", settings: dict[str, str] | None = None,
                 checkout: Path | None = None) -> None:
        """`floor`: agentbox with parts taken out (bench_floor.py; scripts/floors);
        `settings`: AGENTBOX_* variables of this server's own; `checkout`: another
        checkout's agentbox, run by its own venv with its own scripts (--against)."""
        scripts = HERE if checkout is None else checkout / "scripts"
        python = sys.executable if checkout is None else str(checkout_python(checkout))
        self.kind = kind
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data_dir = data_dir
        env = server_environment(data_dir, scripts, self.log_level, database_url, floor,
                                 settings)
        if kind == "ceiling":
            cmd = [sys.executable, "-m", "uvicorn", "bench_apps:ceiling_app", "--host",
                   "127.0.0.1", "--port", str(self.port), "--loop", "uvloop", "--http",
                   "httptools", "--no-access-log", "--log-level", "warning"]
        else:
            cmd = [python, "-m", "bench_floor" if floor else "agentbox", "serve",
                   "--port", str(self.port)]
        data_dir.mkdir(parents=True, exist_ok=True)
        self.log = open(data_dir / f"{kind}.log", "ab")  # noqa: SIM115
        self.process = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=self.log,
                                        cwd=scripts)
        RUNNING.add(self)
        deadline = time.monotonic() + 60
        while True:
            if self.process.poll() is not None:
                raise SystemExit(f"{kind} server exited; see {data_dir / (kind + '.log')}")
            try:
                httpx.get(self.url + "/healthz", timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{kind} server did not start") from None
                time.sleep(0.05)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(60)
        self.log.close()
        RUNNING.discard(self)


class Monitor(threading.Thread):
    """Samples a process's CPU time and RSS while a load runs."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.stop_event = threading.Event()
        self.max_rss_mb = 0.0
        self.cpu_start = self._cpu()
        self.wall_start = time.monotonic()
        self.cpu_percent = 0.0
        self.cpu_seconds = 0.0

    def _cpu(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def run(self) -> None:
        while not self.stop_event.wait(0.2):
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    self.max_rss_mb = max(self.max_rss_mb, int(line.split()[1]) / 1024)

    def finish(self) -> None:
        self.stop_event.set()
        self.join()
        self.cpu_seconds = self._cpu() - self.cpu_start
        self.cpu_percent = 100 * self.cpu_seconds / (time.monotonic() - self.wall_start)


def us_per_request(cpu_seconds: float, statuses: dict[str, int]) -> int:
    """What one request cost the server's processes, whatever the machine's speed was."""
    return round(cpu_seconds * 1e6 / max(sum(statuses.values()), 1))


def wrk_seconds(duration: float) -> int:
    """How long wrk loads for a --duration: whole seconds, at least one."""
    return max(1, round(duration))


def run_wrk(url: str, events: Path, connections: int, duration: float,
            pace_ms: float = 0.0) -> dict[str, Any]:
    threads = 1 if connections == 1 else 2
    env = {**os.environ, **({"BENCH_PACE": "1"} if pace_ms else {})}
    cmd = [*WRK_PREFIX, "wrk", f"-t{threads}", f"-c{connections}", f"-d{wrk_seconds(duration)}s",
           "--timeout", "10s", "-s", str(LUA), url, "--", str(events), str(threads),
           str(pace_ms)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"wrk failed: {done.stderr or done.stdout}")
    line = next(text for text in done.stdout.splitlines() if text.startswith("BENCH_JSON "))
    result: dict[str, Any] = json.loads(line.removeprefix("BENCH_JSON "))
    seconds = result["duration_us"] / 1e6
    result["per_second"] = result["statuses"].get("202", 0) / seconds
    return result


# -- PostgreSQL -------------------------------------------------------------------


class Postgres:
    """Fresh databases on the server of --database-url (its user may CREATE DATABASE)."""

    def __init__(self, admin_url: str) -> None:
        import psycopg

        self.psycopg = psycopg
        self.admin_url = admin_url

    def create(self) -> str:
        name = f"agentbox_bench_{uuid.uuid4().hex[:12]}"
        with self.psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        parts = urlsplit(self.admin_url)
        return urlunsplit(parts._replace(path="/" + name))

    def drop(self, url: str) -> None:
        name = urlsplit(url).path.lstrip("/")
        with self.psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def split_events(events: Path, parts: int) -> list[Path]:
    """Every instance gets its own share of the unique events."""
    lines = events.read_text().splitlines(keepends=True)
    paths = []
    for index in range(parts):
        path = events.with_suffix(f".{index}.tsv")
        path.write_text("".join(lines[index::parts]))
        paths.append(path)
    return paths


def load_split(urls: list[str], events: Path, connections: int,
               duration: float) -> dict[str, Any]:
    """One wrk per server, each with its share of the connections and of the events,
    side by side: accepted/s adds up, latency is the worst server's."""
    loaded = min(len(urls), connections)  # 1 connection loads one server
    shares = split_events(events, loaded)
    results: list[dict[str, Any]] = [{} for _ in range(loaded)]

    def load(index: int) -> None:
        share = connections // loaded + (1 if index < connections % loaded else 0)
        results[index] = run_wrk(urls[index], shares[index], share, duration)

    threads = [threading.Thread(target=load, args=(i,)) for i in range(loaded)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for share in shares:
        share.unlink()
    if not all(results):
        raise SystemExit("a wrk run failed (its error is above)")
    statuses: dict[str, int] = {}
    errors: dict[str, int] = {}
    for result in results:
        for key, value in result["statuses"].items():
            statuses[key] = statuses.get(key, 0) + value
        for key, value in result["errors"].items():
            errors[key] = errors.get(key, 0) + value
    return {"per_second": sum(r["per_second"] for r in results),
            "duration_us": max(r["duration_us"] for r in results),
            **{key: max(r[key] for r in results) for key in ("p50_us", "p99_us", "p999_us")},
            "statuses": statuses, "errors": errors}


def postgres_load_phase(pg: Postgres, work: Path, events: Path, connections: int,
                        duration: float, instances: int) -> dict[str, Any]:
    """`instances` agentbox servers on one fresh database, each loaded by its own wrk
    with its share of the connections: accepted/s adds up, latency is the worst one's."""
    url = pg.create()
    servers: list[Server] = []
    try:
        servers += [Server("agentbox", work / f"pg-{instances}-{connections}-{i}", url)
                    for i in range(instances)]
        monitors = [Monitor(server.process.pid) for server in servers]
        for monitor in monitors:
            monitor.start()
        wrk = load_split([server.url for server in servers], events, connections, duration)
        for monitor in monitors:
            monitor.finish()
        statuses = wrk["statuses"]
        figures: dict[str, Any] = {
            "target": "agentbox", "store": f"pg x{instances}", "instances": instances,
            "connections": connections, "accepted_per_s": round(wrk["per_second"]),
            "p50_ms": wrk["p50_us"] / 1000, "p99_ms": wrk["p99_us"] / 1000,
            "p999_ms": wrk["p999_us"] / 1000, "statuses": statuses, "errors": wrk["errors"],
            "server_cpu_percent": round(sum(m.cpu_percent for m in monitors)),
            "max_rss_mb": round(max(m.max_rss_mb for m in monitors)),
            # agentbox's processes only: PostgreSQL's backends come on top
            "cpu_us_per_request": us_per_request(sum(m.cpu_seconds for m in monitors),
                                                 statuses),
        }
        figures.update(settle(servers[0]))
        for server in servers:
            server.stop()
        servers.clear()
        figures["store_check"] = check_store(work, statuses.get("202", 0), connections,
                                             database_url=url)
        return figures
    finally:
        for server in servers:  # a phase that failed: leave no server behind
            server.process.kill()
        pg.drop(url)


def postgres_drain_phase(pg: Postgres, work: Path, events: Path, rate: float,
                         duration: float, connections: int = 64) -> dict[str, Any]:
    url = pg.create()
    try:
        return drain_phase(work / "pg-drain", events, rate, duration, connections, url)
    finally:
        pg.drop(url)


# -- phases -----------------------------------------------------------------------


def checkout_python(checkout: Path, windows: bool = os.name == "nt") -> Path:
    """The python of another checkout's own venv (made by its scripts/_setup: --against)."""
    return checkout / ".venv" / ("Scripts/python.exe" if windows else "bin/python")


def load_phase(kind: str, data_dir: Path, events: Path, connections: int,
               duration: float, checkout: Path | None = None) -> dict[str, Any]:
    server = Server(kind, data_dir, checkout=checkout)
    monitor = Monitor(server.process.pid)
    monitor.start()
    wrk = run_wrk(server.url, events, connections, duration)
    monitor.finish()
    figures = {
        "target": kind, "connections": connections, "accepted_per_s": round(wrk["per_second"]),
        "p50_ms": wrk["p50_us"] / 1000, "p99_ms": wrk["p99_us"] / 1000,
        "p999_ms": wrk["p999_us"] / 1000, "statuses": wrk["statuses"], "errors": wrk["errors"],
        "server_cpu_percent": round(monitor.cpu_percent), "max_rss_mb": round(monitor.max_rss_mb),
        "cpu_us_per_request": us_per_request(monitor.cpu_seconds, wrk["statuses"]),
    }
    if kind == "agentbox":
        figures.update(settle(server))
    server.stop()
    if kind == "agentbox":
        figures["store_check"] = check_store(data_dir, wrk["statuses"].get("202", 0),
                                             connections)
    return figures


def settle(server: Server, timeout: float = 300) -> dict[str, Any]:
    """Wait until every run is terminal; report how long the drain took after the load."""
    started = time.monotonic()
    while True:
        health = httpx.get(server.url + "/healthz", timeout=10).json()
        if health["active"] == 0:
            return {"drain_after_load_s": round(time.monotonic() - started, 2)}
        if time.monotonic() - started > timeout:
            raise SystemExit(f"runs did not drain within {timeout} s: {health}")
        time.sleep(0.05)


def store_rows(data_dir: Path, database_url: str | None, sql: str,
               params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """A query's rows from the store: the SQLite file in `data_dir`, or PostgreSQL."""
    if database_url:
        import psycopg

        with psycopg.connect(database_url) as conn:
            return conn.execute(sql.replace("?", "%s"), params).fetchall()
    conn = sqlite3.connect(data_dir / "agentbox.sqlite3")
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def check_store(data_dir: Path, accepted: int, connections: int, baseline: int = 0,
                database_url: str | None = None) -> dict[str, Any]:
    (events, runs, not_done), = store_rows(data_dir, database_url, (
        "SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM runs), "
        "(SELECT count(*) FROM runs WHERE status != 'succeeded')"))
    events, runs = events - baseline, runs - baseline
    # wrk stops at its deadline without waiting for the requests still in flight: the
    # server may have stored (and answered) up to one per connection that wrk never counted.
    in_flight = events - accepted
    ok = 0 <= in_flight <= connections and runs == events and not_done == 0
    return {"events": events, "runs": runs, "accepted": accepted, "not_succeeded": not_done,
            "uncounted_in_flight": in_flight, "ok": ok}


def drain_phase(data_dir: Path, events: Path, rate: float, duration: float,
                connections: int = 64, database_url: str | None = None) -> dict[str, Any]:
    """Offer `rate` events/s and measure 202 -> succeeded from the store's own timestamps."""
    server = Server("agentbox", data_dir, database_url)
    # wrk waits the pace after each answer, so a connection sends once per pace plus
    # latency: a short first run at this load measures that latency, and the pace of
    # the measured run is shortened by it (else the offered load fell short by ~15 %).
    pace_ms = connections / rate * 1000
    calibration = write_events(events.parent, "calibration",
                               int(rate * CALIBRATION_SECONDS) + connections)
    first = run_wrk(server.url, calibration, connections, CALIBRATION_SECONDS, pace_ms)
    calibration.unlink()
    # The median: robust to a stall. wrk takes whole milliseconds (0 would be no pace).
    pace_ms = max(round(pace_ms - first["p50_us"] / 1000), 1)
    since = time.time()
    monitor = Monitor(server.process.pid)
    monitor.start()
    wrk = run_wrk(server.url, events, connections, duration, pace_ms)
    monitor.finish()
    settle(server)
    server.stop()
    rows = store_rows(data_dir, database_url, "SELECT accepted_at, completed_at FROM runs "
                      "WHERE accepted_at >= ? AND status = 'succeeded'", (since,))
    latencies = sorted((done - accepted) * 1000 for accepted, done in rows)
    span = max(d for _, d in rows) - min(a for a, _ in rows)
    return {
        "offered_per_s": round(rate), "accepted_per_s": round(wrk["per_second"]),
        "statuses": wrk["statuses"], "completed_per_s": round(len(rows) / span),
        "succeeded_p50_ms": round(statistics.median(latencies), 2),
        "succeeded_p99_ms": round(latencies[int(len(latencies) * 0.99) - 1], 2),
        "server_cpu_percent": round(monitor.cpu_percent), "max_rss_mb": round(monitor.max_rss_mb),
        "pace_ms": pace_ms, "calibration_p50_ms": first["p50_us"] / 1000,
        "calibration_statuses": first["statuses"],
    }


def seed(data_dir: Path, count: int, backlog: bool = False) -> None:
    """Fill a store with `count` runs: finished ones, as the history a long-lived box
    holds, or (`backlog`) accepted ones with valid events, waiting to be drained.

    Written with SQL for speed; the schema and the run id format are the store's own.
    """
    from agentbox.store.sqlite import migrate_file

    path = data_dir / "agentbox.sqlite3"
    migrate_file(path)  # the store's own schema, by its own migrations
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("BEGIN")
    now = time.time() - (0 if backlog else 86_400)
    status, result = ("accepted", None) if backlog else ("succeeded", '{"ok":true}')
    batch = 50_000
    for start in range(0, count, batch):
        ids = range(start, min(start + batch, count))
        conn.executemany(
            "INSERT INTO events (pk, event_id, idempotency_key, event_type, source, "
            "received_at, body) VALUES (?, ?, ?, 'session.exported', 'seed', ?, ?)",
            ((i + 1, f"seed-{i}", f"seed:session.exported:seed-{i}", now + i * 1e-3,
              _seed_body(i)) for i in ids))
        conn.executemany(
            "INSERT INTO idempotency_keys (key, event_pk, expires_at) VALUES (?, ?, ?)",
            ((f"seed:session.exported:seed-{i}", i + 1, now + 604_800) for i in ids))
        conn.executemany(
            "INSERT INTO runs (run_id, event_pk, ordinal, agent, status, attempt, accepted_at,"
            " started_at, updated_at, completed_at, result, next_attempt_at)"
            " VALUES (?, ?, 0, 'bench_apps:noop', ?, ?, ?, ?, ?, ?, ?, ?)",
            ((f"run_{int((now + i * 1e-3) * 1000):012x}{i:020x}", i + 1, status,
              0 if backlog else 1, now + i * 1e-3,
              None if backlog else now + i * 1e-3, now + i * 1e-3,
              None if backlog else now + i * 1e-3, result, now if backlog else None)
             for i in ids))
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def _seed_body(i: int) -> bytes:
    return (
        f'{{"schema_version":"v1","event_id":"seed-{i}","idempotency_key":'
        f'"seed:session.exported:seed-{i}","event_type":"session.exported","source":"seed",'
        '"timestamp":"2026-07-27T15:42:00Z","payload":{"project_id":"bench",'
        '"mix_url":"/tmp/bench.wav"}}'
    ).encode()


def backlog_phase(data_dir: Path, count: int) -> dict[str, Any]:
    """How fast no-op runs are completed when there is always work: start a server on
    a store holding `count` accepted runs and time it until all have succeeded."""
    seed(data_dir, count, backlog=True)
    server = Server("agentbox", data_dir)
    monitor = Monitor(server.process.pid)
    monitor.start()
    settle(server)
    monitor.finish()
    server.stop()
    conn = sqlite3.connect(data_dir / "agentbox.sqlite3")
    done, first, last = conn.execute(
        "SELECT count(*), min(started_at), max(completed_at) FROM runs "
        "WHERE status = 'succeeded'").fetchone()
    conn.close()
    return {"backlog": count, "succeeded": done, "completed_per_s": round(done / (last - first)),
            "server_cpu_percent": round(monitor.cpu_percent),
            "max_rss_mb": round(monitor.max_rss_mb), "ok": done == count}


def write_mix(path: Path, minutes: float, rate: int = 48_000) -> None:
    """A stereo 24-bit WAV of `minutes` (music-like: tones over noise), written in chunks."""
    import numpy as np
    import soundfile

    rng = np.random.default_rng(1)
    chunk = rate * 10
    with soundfile.SoundFile(path, "w", rate, 2, "PCM_24") as f:
        for start in range(0, int(minutes * 60 * rate), chunk):
            t = (start + np.arange(chunk)) / rate
            tone = 0.2 * np.sin(2 * np.pi * 110 * t) + 0.1 * np.sin(2 * np.pi * 440 * t)
            noise = rng.normal(0, 0.05, size=(chunk, 2))
            f.write(np.clip(tone[:, None] + noise, -1, 1))
    old = time.time() - 60  # finished writing a while ago
    os.utime(path, (old, old))


def mix_phase(work: Path, minutes: float, duration: float, rate: float = 200,
              connections: int = 16) -> dict[str, Any]:
    """Ingest latency at a steady `rate` before and while the built-in mix_review
    agent analyses a `minutes`-long mix (it runs in a process pool)."""
    from agentbox.signing import sign_headers

    mix = work / "long-mix.wav"
    print(f"writing a {minutes:g}-minute mix ...", file=sys.stderr)
    write_mix(mix, minutes)
    server = Server("agentbox", work / "mix")
    pace_ms = connections / rate * 1000
    before_events, during_events = (write_events(work, name, int(rate * duration * 2))
                                    for name in ("mix-before", "mix-during"))
    before = run_wrk(server.url, before_events, connections, duration, pace_ms)
    event_id = uuid.uuid4().hex
    body = json.dumps({
        "schema_version": "v1", "event_id": event_id,
        "idempotency_key": f"bench:mix.review_requested:{event_id}",
        "event_type": "mix.review_requested", "source": "bench",
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "payload": {"project_id": "long-mix", "mix_url": str(mix), "requested_by": "bench"},
    }).encode()
    response = httpx.post(server.url + "/webhooks/events", content=body, timeout=30,
                          headers=sign_headers(SECRET, body, int(time.time())))
    run_id = response.json()["run_id"]
    during = run_wrk(server.url, during_events, connections, duration, pace_ms)
    while True:
        run = httpx.get(f"{server.url}/runs/{run_id}", timeout=10,
                        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()
        if run["terminal"]:
            break
        time.sleep(0.2)
    server.stop()
    started = time.mktime(time.strptime(run["started_at"][:19], "%Y-%m-%dT%H:%M:%S"))
    finished = time.mktime(time.strptime(run["completed_at"][:19], "%Y-%m-%dT%H:%M:%S"))
    mix.unlink()
    return {
        "mix_minutes": minutes, "offered_per_s": rate, "review_status": run["status"],
        "analysis_seconds": round(finished - started),
        "integrated_lufs": (run["result"] or {}).get("metrics", {}).get("integrated_lufs"),
        "before": {"p50_ms": before["p50_us"] / 1000, "p99_ms": before["p99_us"] / 1000,
                   "statuses": before["statuses"]},
        "during": {"p50_ms": during["p50_us"] / 1000, "p99_ms": during["p99_us"] / 1000,
                   "statuses": during["statuses"]},
    }


# -- report -----------------------------------------------------------------------


def history_cost(report: dict[str, Any]) -> dict[str, Any]:
    """The seeded store's figures against the empty store's, each the mean of its
    two rounds (run empty, seeded, seeded, empty): the change in percent (the
    target: within 10 % either way)."""
    def mean(rows: list[dict[str, Any]], store: str, figure: str, **match: Any) -> float | None:
        found = [r[figure] for r in rows if r.get("store") == store and r.get(
            "target", "agentbox") == "agentbox" and all(r[k] == v for k, v in match.items())]
        return sum(found) / len(found) if len(found) == 2 else None

    changes: dict[str, float] = {}
    for rows, figure, match in [
            *((report["load"], f, {"connections": c}) for c in (16, 64)
              for f in ("accepted_per_s", "p99_ms")),
            (report["drain"], "completed_per_s", {}), (report["drain"], "succeeded_p50_ms", {})]:
        empty, seeded = mean(rows, "empty", figure, **match), mean(rows, "seeded", figure, **match)
        if empty and seeded is not None:
            name = figure + "".join(f"_{v}" for v in match.values())
            changes[name] = round(100 * (seeded - empty) / empty, 1)
    return changes


def print_table(report: dict[str, Any]) -> None:
    print(f"\nagentbox benchmark, {report['duration_s']} s per phase, {os.cpu_count()} cores\n")
    print(f"{'store':>8} {'conns':>5} {'target':>9} {'accepted/s':>10} {'ratio':>6} "
          f"{'p50 ms':>7} {'p99 ms':>7} {'p99.9 ms':>8} {'p99 x':>6} {'cpu %':>6} "
          f"{'cpu us/req':>10} {'rss MB':>6} "
          f"{'non-202':>7} {'store':>6}")
    for row in report["load"]:
        ceiling = next((c for c in report["load"] if c["target"] == "ceiling"
                        and c["connections"] == row["connections"]), None)
        ratio = p99x = ""
        if row["target"] == "agentbox" and ceiling:
            ratio = f"{row['accepted_per_s'] / max(ceiling['accepted_per_s'], 1):.2f}"
            p99x = f"{row['p99_ms'] / max(ceiling['p99_ms'], 1e-3):.1f}"
        non_202 = sum(n for s, n in row["statuses"].items() if s != "202") + sum(
            row["errors"].values())
        check = row.get("store_check", {}).get("ok", "")
        store = row.get("store", "-") + ("" if row.get("round", 1) == 1 else f"#{row['round']}")
        print(f"{store:>8} {row['connections']:>5} {row['target']:>9} "
              f"{row['accepted_per_s']:>10} {ratio:>6} {row['p50_ms']:>7.2f} "
              f"{row['p99_ms']:>7.2f} {row['p999_ms']:>8.2f} {p99x:>6} "
              f"{row['server_cpu_percent']:>6} {row.get('cpu_us_per_request', ''):>10} "
              f"{row['max_rss_mb']:>6} {non_202:>7} {check!s:>6}")
    if "backlog" in report:
        row = report["backlog"]
        print(f"\nbacklog drain: {row['succeeded']} of {row['backlog']} no-op runs succeeded at "
              f"{row['completed_per_s']} runs/s, cpu {row['server_cpu_percent']} %, "
              f"rss {row['max_rss_mb']} MB")
    if "mix" in report:
        row = report["mix"]
        print(f"\ningest while a {row['mix_minutes']:g}-minute mix is analysed "
              f"({row['analysis_seconds']} s, {row['review_status']}), {row['offered_per_s']:g}"
              f" events/s offered: p50 {row['before']['p50_ms']:.2f} -> "
              f"{row['during']['p50_ms']:.2f} ms, p99 {row['before']['p99_ms']:.2f} -> "
              f"{row['during']['p99_ms']:.2f} ms")
    if report.get("history"):
        print("\nseeded store against the empty one, back to back: " + ", ".join(
            f"{name} {value:+.1f} %"
            for name, value in report["history"].items()))
    for row in report["drain"]:
        store = row["store"] + ("" if row.get("round", 1) == 1 else f" #{row['round']}")
        print(f"\ndrain ({store} store): offered {row['offered_per_s']}/s, "
              f"accepted {row['accepted_per_s']}/s, completed {row['completed_per_s']}/s, "
              f"202->succeeded p50 {row['succeeded_p50_ms']} ms p99 {row['succeeded_p99_ms']} ms, "
              f"cpu {row['server_cpu_percent']} %, rss {row['max_rss_mb']} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--duration", type=float, default=10)
    parser.add_argument("--concurrency", default=None,
                        help="connections, comma separated (default 1,16,64,256; with "
                             "--peers and --database-url 16,64)")
    parser.add_argument("--seed-runs", type=int, default=1_000_000)
    parser.add_argument("--backlog", type=int, default=50_000,
                        help="runs to drain in the backlog phase (0: skip it)")
    parser.add_argument("--mix-minutes", type=float, default=10,
                        help="ingest latency while a mix this long is analysed (0: skip)")
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    parser.add_argument("--log-level", default="info",
                        help="agentbox's AGENTBOX_LOG_LEVEL (default info: the default "
                             "configuration's, what users get; warning leaves the log lines "
                             "out)")
    parser.add_argument("--database-url", default=None, metavar="URL",
                        help="also measure PostgreSQL: a server whose user may CREATE DATABASE "
                             "(each phase gets a fresh database, dropped after)")
    parser.add_argument("--instances", default=None,
                        help="PostgreSQL phases: how many agentbox instances share the database "
                             "(default 1,2,3; with --peers 1,2: a row each)")
    parser.add_argument("--postgres-only", action="store_true",
                        help="with --database-url: the ceiling and PostgreSQL phases only")
    parser.add_argument("--peers", action="store_true",
                        help="also measure the peers end to end (Redis reference design, "
                             "huey): scripts/bench_peers.py; with --database-url, only "
                             "agentbox on PostgreSQL against procrastinate and pgqueuer: "
                             "scripts/bench_pg.py")
    parser.add_argument("--rounds", type=int, default=3,
                        help="--peers with --database-url or --against: rounds, each taking "
                             "every target")
    parser.add_argument("--against", type=Path, default=None, metavar="DIR",
                        help="with --peers: also run the agentbox of the checkout in DIR (an "
                             "older commit: git worktree add DIR COMMIT; its own venv, made by "
                             "its scripts/_setup), alternated with this one in the same rounds, "
                             "each with its ratios to the peers of its round: "
                             "scripts/bench_against.py")
    args = parser.parse_args()
    Server.log_level = args.log_level
    if args.against is not None:
        import bench_against

        if not args.peers:
            parser.error("--against DIR compares with the peers: give --peers too")
        args.against = bench_against.prepare(args.against, bool(args.database_url))
        if not args.database_url:
            bench_against.main(sys.modules[__name__], args)
            return
    if args.peers and args.database_url:
        postgres_peers(args)
        return
    if args.peers:
        import bench_peers

        bench_peers.require()  # exits 2, naming what to install, before measuring anything
    levels = [int(c) for c in (args.concurrency or "1,16,64,256").split(",")]
    args.instances = args.instances or "1,2,3"
    work = Path(tempfile.mkdtemp(prefix="agentbox-bench-"))
    print(f"work directory (removed if the run passes): {work}", file=sys.stderr)
    report: dict[str, Any] = {"duration_s": args.duration, "log_level": args.log_level,
                              "load": [], "drain": [],
                              "cpus": os.cpu_count(), "started": time.strftime("%FT%TZ",
                                                                                time.gmtime())}
    failed = False
    count = int(MAX_EVENTS_PER_SECOND * args.duration)
    if args.postgres_only or not {16, 64} & set(levels):  # the seeded store's levels
        args.seed_runs = 0
    if args.postgres_only:
        args.backlog = args.mix_minutes = 0
    seeded_dir = work / "seeded"
    if args.seed_runs:
        # Seeded first, so that each concurrency's phases (ceiling, empty store, seeded
        # store) run back to back: this machine's speed drifts within minutes, and
        # neighbours compare fairly where phases minutes apart do not.
        print(f"seeding a store with {args.seed_runs} runs ...", file=sys.stderr)
        seed(seeded_dir, args.seed_runs)
    for connections in levels:
        phases = [("ceiling", "empty", 1)] + ([] if args.postgres_only else [
            ("agentbox", "empty", 1)])
        if args.seed_runs and connections in (16, 64):
            # In the order empty, seeded, seeded, empty: a drift of the machine's speed
            # over the four weighs on both stores alike.
            phases += [("agentbox", "seeded", 1), ("agentbox", "seeded", 2),
                       ("agentbox", "empty", 2)]
        events = {round_: write_events(work, f"load-{connections}-{round_}", count)
                  for round_ in {r for _, _, r in phases}}  # a store sees each event once
        for kind, store, round_ in phases:
            print(f"{store} store, {connections} connections: {kind} ...", file=sys.stderr)
            seeded = store == "seeded"
            data_dir = seeded_dir if seeded else work / f"{kind}-{connections}-{round_}"
            baseline = _count_runs(seeded_dir) if seeded else 0
            row = load_phase(kind, data_dir, events[round_], connections, args.duration)
            if seeded:
                row["store_check"] = check_store(
                    data_dir, row["statuses"].get("202", 0), connections, baseline)
            row["store"], row["round"] = store, round_
            report["load"].append(row)
            failed |= set(row["statuses"]) != {"202"} or any(row["errors"].values())
            failed |= not row.get("store_check", {"ok": True})["ok"]
        if args.peers and not args.postgres_only:  # the same events as the ceiling's
            failed |= bench_peers.load_phases(sys.modules[__name__], work, events[1],
                                              connections, args.duration, report)
        for path in events.values():
            path.unlink()
    best = max((r for r in report["load"] if r["target"] == "agentbox"
                and r["connections"] == 64 and r["store"] == "empty"), default=None,
               key=lambda r: r["accepted_per_s"])
    if best:
        # Both stores at the same offered load, in the same order as above.
        drains = [("empty", 1)] + ([("seeded", 1), ("seeded", 2), ("empty", 2)]
                                   if args.seed_runs else [])
        events = {round_: write_events(work, f"drain-{round_}", count)
                  for round_ in {r for _, r in drains}}
        for store, round_ in drains:
            print(f"{store} store: drain at half load ...", file=sys.stderr)
            data_dir = seeded_dir if store == "seeded" else work / f"drain-{round_}"
            row = drain_phase(data_dir, events[round_], best["accepted_per_s"] / 2,
                              args.duration)
            row["store"], row["round"] = store, round_
            report["drain"].append(row)
            failed |= {*row["statuses"], *row["calibration_statuses"]} != {"202"}
        for path in events.values():
            path.unlink()
    if args.seed_runs:
        report["history"] = history_cost(report)
    if args.database_url:
        failed |= postgres_phases(args, report, work, levels, count)
    if args.backlog:
        print(f"draining a backlog of {args.backlog} runs ...", file=sys.stderr)
        report["backlog"] = backlog_phase(work / "backlog", args.backlog)
        failed |= not report["backlog"]["ok"]
    if args.mix_minutes:
        report["mix"] = mix_phase(work, args.mix_minutes, args.duration)
        failed |= report["mix"]["review_status"] != "succeeded" or any(
            set(report["mix"][k]["statuses"]) != {"202"} for k in ("before", "during"))
    print_table(report)
    if args.peers and not args.postgres_only:
        report["peers"] = bench_peers.summary(report)
        bench_peers.print_summary(report)
    text = json.dumps(report, indent=2)
    print("\n" + text)
    if args.json:
        args.json.write_text(text)
    if failed:
        raise SystemExit("FAILED: a request was not answered 202, or the store does not "
                         f"hold exactly one event and one run per 202 (logs and stores: {work})")
    shutil.rmtree(work)  # a seeded store alone is most of a gigabyte


def finish(report: dict[str, Any], json_path: Path | None, work: Path, failed: bool) -> None:
    """Write the report (with --json), and fail naming the kept work directory, or remove it."""
    text = json.dumps(report, indent=2)
    if json_path:
        json_path.write_text(text)
    if failed:
        print("\n" + text)
        raise SystemExit("FAILED: a request was not answered 202, or a target did not run "
                         f"every event it accepted (logs: {work})")
    shutil.rmtree(work)


def postgres_peers(args: argparse.Namespace) -> None:
    """--peers --database-url: agentbox on PostgreSQL against procrastinate and pgqueuer,
    in rounds (bench_pg.py), and nothing else."""
    import bench_pg

    work = Path(tempfile.mkdtemp(prefix="agentbox-bench-"))
    print(f"work directory (removed if the run passes): {work}", file=sys.stderr)
    report: dict[str, Any] = {"duration_s": args.duration, "log_level": args.log_level,
                              "rounds": args.rounds, "load": [], "cpus": os.cpu_count(),
                              "started": time.strftime("%FT%TZ", time.gmtime())}
    if args.against is not None:
        report["against"] = str(args.against)
    failed = bench_pg.run(sys.modules[__name__], args.database_url, work,
                          [int(c) for c in (args.concurrency or "16,64").split(",")],
                          args.duration, args.rounds,
                          [int(n) for n in (args.instances or "1,2").split(",")], report,
                          against=args.against)
    bench_pg.print_summary(report)
    finish(report, args.json, work, failed)


def postgres_phases(args: argparse.Namespace, report: dict[str, Any], work: Path,
                    levels: list[int], count: int) -> bool:
    """The load phases on PostgreSQL with 1, 2, 3 ... instances, then the drain at half
    the single instance's load at 64 connections (as on SQLite). True if anything failed."""
    pg = Postgres(args.database_url)
    failed = False
    for instances in [int(n) for n in args.instances.split(",")]:
        for connections in levels:
            events = write_events(work, f"pg-{instances}-{connections}", count)
            print(f"postgresql, {instances} instance(s), {connections} connections ...",
                  file=sys.stderr)
            row = postgres_load_phase(pg, work, events, connections, args.duration, instances)
            report["load"].append(row)
            failed |= set(row["statuses"]) != {"202"} or any(row["errors"].values())
            failed |= not row["store_check"]["ok"]
            events.unlink()
    best = max((r for r in report["load"] if r.get("store") == "pg x1"
                and r["connections"] == 64), default=None, key=lambda r: r["accepted_per_s"])
    if best:
        events = write_events(work, "pg-drain", count)
        print("postgresql: drain at half load ...", file=sys.stderr)
        row = postgres_drain_phase(pg, work, events, best["accepted_per_s"] / 2, args.duration)
        row["store"] = "pg x1"
        report["drain"].append(row)
        failed |= {*row["statuses"], *row["calibration_statuses"]} != {"202"}
        events.unlink()
    return failed


def _count_runs(data_dir: Path) -> int:
    return int(store_rows(data_dir, None, "SELECT count(*) FROM runs")[0][0])


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        for server in list(RUNNING):  # a phase that failed leaves no server behind
            server.process.kill()
        raise
