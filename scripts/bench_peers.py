"""scripts/bench --peers: the designs agentbox is compared with, end to end, in the same run.

At each concurrency, after the ceiling and agentbox, the same pre-signed events
are fired with the same wrk load at each peer (apps in bench_apps.py):

- `reference` / `aof`: the reference design, a Starlette receiver deduplicating
  with Redis `SET key NX EX` and pushing onto a Redis list, one worker process
  popping it, running the no-op agent and recording the completion in Redis;
  redis-server with `appendonly yes`, `appendfsync always` (durable);
- `reference` / `memory`: the same with Redis in memory (no AOF, no RDB save);
- `huey` / `sqlite`: a Starlette receiver deduplicating with huey's
  `put_if_empty` and enqueuing a huey task into a SqliteHuey file (fsync on
  commit), run by one `huey_consumer` process (one worker thread).

When the load stops, the receiver is stopped and the peer is given until its
backlog has drained (a deadline) to run everything it accepted. Accepted/s and
latency are wrk's; end to end is the runs the peer recorded as completed over
the time from the load's start to the last completion; CPU per completed event
counts all the peer's processes (receiver, worker or consumer, redis-server).
Every process is started on 127.0.0.1 in the bench's work directory.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PEERS = [("reference", "aof"), ("reference", "memory"), ("huey", "sqlite")]
DRAIN_DEADLINE_S = 300  # the slowest peer's backlog after 10 s at 64 connections: ~30 s


def missing(which: Callable[[str], str | None] = shutil.which,
            find_spec: Callable[[str], Any] = importlib.util.find_spec) -> list[str]:
    """What --peers needs and this machine lacks, each as what to install."""
    need = [f"the Python package {name} (into agentbox's venv: "
            f".venv/bin/pip install -e '.[bench]')"
            for name in ("redis", "huey") if find_spec(name) is None]
    if which("redis-server") is None:
        need.append("redis-server (Debian: apt-get install redis-server; "
                    "macOS: brew install redis)")
    return need


def require() -> None:
    """Exit 2, before anything is measured, naming what to install, unless the
    peers can all run."""
    need = missing()
    if need:
        print("scripts/bench --peers needs:\n" + "".join(f"  - {item}\n" for item in need)
              + "nothing was measured", file=sys.stderr)
        raise SystemExit(2)


class Process:
    """One of a peer's processes, its output in its own log in the phase's directory."""

    def __init__(self, bench: Any, name: str, cmd: list[str], directory: Path,
                 env: dict[str, str]) -> None:
        self.name = name
        self.log = open(directory / f"{name}.log", "ab")  # noqa: SIM115
        self.process = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=self.log,
                                        cwd=bench.HERE)
        self.monitor: Any = None
        bench.RUNNING.add(self)  # a failing bench kills it

    def watch(self, bench: Any) -> None:
        self.monitor = bench.Monitor(self.process.pid)
        self.monitor.start()

    def measured(self) -> None:
        """Stop counting this process's CPU (while it still runs)."""
        if self.monitor is not None and self.monitor.is_alive():
            self.monitor.finish()

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise SystemExit(f"{self.name} exited; see {self.log.name}")

    def stop(self, bench: Any) -> None:
        self.measured()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()
        bench.RUNNING.discard(self)


def wait_for(condition: Callable[[], bool], what: str, processes: list[Process],
             timeout: float = 60, fatal: bool = True) -> bool:
    """Poll `condition` until it holds (True) or `timeout` passes (exit, or False if
    not `fatal`); a process of the peer that exits meanwhile ends the bench."""
    deadline = time.monotonic() + timeout
    while True:
        for process in processes:
            process.check_alive()
        try:
            if condition():
                return True
        except Exception:  # not answering yet
            pass
        if time.monotonic() > deadline:
            if fatal:
                raise SystemExit(f"{what} within {timeout} s")
            print(f"{what} within {timeout} s", file=sys.stderr)
            return False
        time.sleep(0.02)


def receiver(bench: Any, app: str, directory: Path, env: dict[str, str],
             python: str = sys.executable) -> tuple[Process, str]:
    """A uvicorn serving `app` (module:name) as the ceiling is served (uvloop, httptools,
    one process), by `python` (a peer's own environment's)."""
    import httpx

    port = bench.free_port()
    cmd = [python, "-m", "uvicorn", app, "--host", "127.0.0.1",
           "--port", str(port), "--loop", "uvloop", "--http", "httptools",
           "--no-access-log", "--log-level", "warning"]
    process = Process(bench, "receiver", cmd, directory, env)
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: httpx.post(url + "/webhooks/events", content=b"{}",
                                timeout=1).status_code == 401,
             "the receiver did not answer", [process])
    return process, url


def peer_phase(bench: Any, work: Path, events: Path, connections: int, duration: float,
               target: str, store: str, tag: str = "") -> dict[str, Any]:
    """`tag` names this phase's directory apart from others of the same peer (rounds)."""
    directory = work / f"{target}-{store}-{connections}{tag}"
    directory.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(bench.HERE), "BENCH_SECRET": bench.SECRET}
    processes: list[Process] = []
    try:
        if target == "reference":
            import redis

            port = bench.free_port()
            durable = ["--appendonly", "yes", "--appendfsync", "always"] if store == "aof" \
                else ["--appendonly", "no"]
            processes.append(Process(bench, "redis-server", [
                shutil.which("redis-server") or "redis-server", "--port", str(port),
                "--bind", "127.0.0.1", "--dir", str(directory), "--save", "",
                "--daemonize", "no", *durable], directory, env))
            env["BENCH_REDIS_URL"] = f"redis://127.0.0.1:{port}/0"
            client = redis.Redis.from_url(env["BENCH_REDIS_URL"])
            wait_for(client.ping, "redis-server did not answer", processes)
            processes.append(Process(bench, "worker", [sys.executable, "bench_apps.py"],
                                     directory, env))

            def enqueued() -> int:
                return sum(1 for _ in client.scan_iter("dedup:*", count=10_000))

            def completed() -> int:
                return int(client.get("bench:completed") or 0)
        else:
            env["BENCH_HUEY_FILE"] = str(directory / "huey.sqlite3")
            processes.append(Process(bench, "consumer", [
                sys.executable, "-m", "huey.bin.huey_consumer", "bench_apps.huey_queue",
                "--workers", "1", "--worker-type", "thread", "--delay", "0.01",
                "--max-delay", "0.1", "--quiet"], directory, env))
            huey_file = Path(env["BENCH_HUEY_FILE"])
            wait_for(huey_file.exists, "huey_consumer did not create its queue", processes)

            def kv_count(where: str) -> int:
                conn = sqlite3.connect(huey_file, timeout=30)
                try:
                    return int(conn.execute(f"SELECT count(*) FROM kv WHERE {where}")
                               .fetchone()[0])
                finally:
                    conn.close()

            def enqueued() -> int:
                return kv_count("key LIKE 'dedup:%'")

            def completed() -> int:
                return kv_count("key NOT LIKE 'dedup:%'")
        app = "bench_apps:" + ("reference_app" if target == "reference" else "huey_app")
        front, url = receiver(bench, app, directory, env)
        processes.append(front)
        for process in processes:
            process.watch(bench)
        wrk = bench.run_wrk(url, events, connections, duration)
        loaded = time.monotonic()
        # wrk stops without waiting for its last requests: stopping the receiver lets
        # them finish, and then nothing more is enqueued.
        front.stop(bench)
        accepted = wrk["statuses"].get("202", 0)
        total = enqueued()
        drained = wait_for(lambda: completed() >= total, f"{target} ({store}) did not run "
                           f"the {total} events it accepted", processes[:-1],
                           DRAIN_DEADLINE_S, fatal=False)
        finished = time.monotonic()
        for process in processes:
            process.measured()
        done = completed()
        cpu_seconds = sum(p.monitor.cpu_seconds for p in processes)
        # from the load's start (wrk's clock: it reads its events before) to the drain's end
        seconds = wrk["duration_us"] / 1e6 + finished - loaded
        return {
            "target": target, "store": store, "round": 1, "connections": connections,
            "accepted_per_s": round(wrk["per_second"]),
            "p50_ms": wrk["p50_us"] / 1000, "p99_ms": wrk["p99_us"] / 1000,
            "p999_ms": wrk["p999_us"] / 1000, "statuses": wrk["statuses"],
            "errors": wrk["errors"],
            "server_cpu_percent": round(100 * cpu_seconds / seconds),
            "max_rss_mb": round(sum(p.monitor.max_rss_mb for p in processes)),
            # per completed event, all the peer's processes, the drain included
            "cpu_us_per_request": round(cpu_seconds * 1e6 / max(done, 1)),
            "completed_per_s": round(done / seconds),
            "drain_after_load_s": round(finished - loaded, 2),
            "processes": {p.name: round(p.monitor.cpu_seconds, 2) for p in processes},
            "store_check": {"accepted": accepted, "enqueued": total, "completed": done,
                            "drained": drained, "ok": total >= accepted and done >= total},
        }
    finally:
        for process in reversed(processes):
            if process in bench.RUNNING:
                process.stop(bench)


def load_phases(bench: Any, work: Path, events: Path, connections: int, duration: float,
                report: dict[str, Any]) -> bool:
    """Every peer at `connections`, on `events` (the ones the ceiling and agentbox
    were just given). True if one failed."""
    failed = False
    for target, store in PEERS:
        print(f"{connections} connections: {target} ({store}) ...", file=sys.stderr)
        row = peer_phase(bench, work, events, connections, duration, target, store)
        report["load"].append(row)
        failed |= set(row["statuses"]) != {"202"} or any(row["errors"].values())
        failed |= not row["store_check"]["ok"]
    return failed


NAMES = {("agentbox", "empty"): "agentbox (no-op agent)",
         ("reference", "aof"): "reference design, Redis AOF always + worker",
         ("reference", "memory"): "reference design, Redis in memory + worker",
         ("huey", "sqlite"): "Starlette + huey SqliteHuey + consumer",
         ("ceiling", "empty"): "ceiling (HMAC + pydantic, stores nothing)"}


def summary(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's table: each system at each concurrency, from this run's rows (the
    first round of each)."""
    rows = []
    for (target, store), name in NAMES.items():
        for row in report["load"]:
            if (row["target"], row.get("store"), row.get("round", 1)) != (target, store, 1):
                continue
            end_to_end = row.get("completed_per_s")
            if target == "agentbox" and "drain_after_load_s" in row:
                # its load phase waits for every run to finish after the load
                seconds = report["duration_s"]
                end_to_end = round(row["accepted_per_s"] * seconds
                                   / (seconds + row["drain_after_load_s"]))
            rows.append({"system": name, "connections": row["connections"],
                         "accepted_per_s": row["accepted_per_s"], "p99_ms": row["p99_ms"],
                         "completed_per_s": end_to_end,
                         "cpu_us_per_completed_event": row.get("cpu_us_per_request")})
    return rows


def print_summary(report: dict[str, Any]) -> None:
    print("\nend to end against the peers (same run, same events, same wrk load):\n")
    print(f"{'system':<44} {'conns':>5} {'accepted/s':>10} {'p99 ms':>7} "
          f"{'end-to-end runs/s':>17} {'cpu us per completed event':>26}")
    for row in report["peers"]:
        cpu = row["cpu_us_per_completed_event"]
        note = "" if "Redis" in row["system"] or "huey" in row["system"] else (
            " (per request)" if row["system"].startswith("ceiling") else " (load only)")
        print(f"{row['system']:<44} {row['connections']:>5} {row['accepted_per_s']:>10} "
              f"{row['p99_ms']:>7.1f} {row['completed_per_s'] or '-'!s:>17} "
              f"{(str(cpu) + note):>26}")
