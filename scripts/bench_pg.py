"""scripts/bench --peers --database-url URL: agentbox on PostgreSQL against the
PostgreSQL queues people pick, end to end, in the same run.

The same pre-signed events, the same wrk load, at each concurrency, in rounds
(each round takes the targets in a turned order, so a drift of the machine's
speed weighs on all alike); every target gets a fresh database on the server
of URL, dropped after:

- `agentbox xN`: N `agentbox serve` instances on the one database (its
  scale-out design), each loaded by its own wrk with its share of the
  connections and of the events;
- `procrastinate` and `pgqueuer`: a Starlette receiver that checks the same
  signature and validates the same event model with agentbox's code, then
  defers a job with the library; one worker process runs it (the no-op agent on
  the event parsed again). Each library in a virtual environment of its own,
  made here under .venv/bench-peers/ (bench_pg_apps.py);
- `ceiling`: the ceiling app, stores nothing (the machine's pace in that round).

The durability of each is its default: procrastinate and pgqueuer commit each
deferred job with PostgreSQL's default `synchronous_commit` (on), as agentbox
commits its group of events before answering 202.

When the load stops, a peer's receiver is stopped (its last requests finish)
and its worker gets until every job it took has run; agentbox's instances run
until every accepted run is terminal. End to end is the completed jobs or runs
over the time from the load's start to the last one. CPU per completed event is
split by process: the servers (agentbox instances, peer receivers), the peer's
worker, and the PostgreSQL server (postmaster and every child, reaped ones
included: bench_pgstat.py). Use a server nobody else loads meanwhile.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import bench_peers
from bench_pgstat import PgWatch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ENVS = ROOT / ".venv" / "bench-peers"
# What the receivers import of agentbox's own (signing, events) and serve with, at
# the versions agentbox's environment has: the same code on both sides.
SHARED = ["starlette", "uvicorn", "uvloop", "httptools", "pydantic", "pydantic-core",
          "platformdirs", "filelock"]
PEER_PACKAGES = {
    "procrastinate": ["procrastinate==3.10.0", "psycopg[binary]", "psycopg-pool"],
    "pgqueuer": ["pgqueuer[asyncpg]==1.6.0"],
}
# The settings each peer ran best with here (tried at 16 and 64 connections).
RECEIVER_POOL = 10  # connections each peer's receiver defers jobs over
PROCRASTINATE_CONCURRENCY = 10  # jobs a procrastinate worker runs at once (default 1)
PGQUEUER_BATCH = 10  # jobs a pgqueuer worker takes per dequeue (its default)
DRAIN_DEADLINE_S = 300


# -- the peers' environments ------------------------------------------------------------


def requirements(peer: str) -> list[str]:
    """The peer's package, and agentbox's own versions of what its receiver shares."""
    pinned = []
    for name in [*SHARED, "psycopg", "psycopg-binary", "psycopg-pool"]:
        try:
            pinned.append((name, importlib.metadata.version(name)))
        except importlib.metadata.PackageNotFoundError:
            continue
    versions = dict(pinned)
    wanted = [f"{name}=={version}" for name, version in pinned if name in SHARED]
    for spec in PEER_PACKAGES[peer]:
        base = spec.split("[")[0].split("=")[0]
        wanted.append(spec if "==" in spec or base not in versions
                      else f"{spec}=={versions[base]}")
    return wanted


def environment(peer: str) -> Path:
    """The peer's virtual environment's python, made (once per set of requirements)
    under .venv/bench-peers/; an install that fails ends the bench, naming its log."""
    wanted = requirements(peer)
    digest = hashlib.sha256("\n".join(wanted).encode()).hexdigest()[:10]
    venv = ENVS / f"{peer}-{digest}"
    python = venv / "bin" / "python"
    if (venv / "complete").exists():
        return python
    ENVS.mkdir(parents=True, exist_ok=True)
    log = ENVS / f"{peer}-{digest}.log"
    print(f"making {peer}'s environment ({venv}; pip's output: {log}) ...", file=sys.stderr)
    with open(log, "w") as out:
        steps = [[sys.executable, "-m", "venv", "--clear", str(venv)],
                 [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q",
                  *wanted]]
        for step in steps:
            if subprocess.run(step, stdout=out, stderr=subprocess.STDOUT).returncode:
                raise SystemExit(f"scripts/bench: making {peer}'s environment failed: "
                                 f"{' '.join(step)}\n{log.read_text()[-3000:]}")
    (venv / "complete").write_text("\n".join(wanted) + "\n")
    return python


# -- phases -----------------------------------------------------------------------------


def rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(sql).fetchall()  # type: ignore[arg-type]


def count(url: str, sql: str) -> int:
    return int(rows(url, sql)[0][0])


# Whether a target still has work to do: one cheap look (a partial index, or a table
# of the waiting jobs alone), every POLL_SECONDS while it drains.
PENDING = {
    "agentbox": "SELECT EXISTS (SELECT 1 FROM runs "
                "WHERE status IN ('accepted', 'processing', 'failed_retryable'))",
    "procrastinate": "SELECT EXISTS (SELECT 1 FROM procrastinate_jobs "
                     "WHERE status IN ('todo', 'doing'))",
    "pgqueuer": "SELECT EXISTS (SELECT 1 FROM pgqueuer)",  # done jobs move to its log
}


# How far each target got: (taken, completed), read from its own tables once it is done.
COUNTS = {
    "agentbox": ("SELECT count(*) FROM runs",
                 "SELECT count(*) FROM runs WHERE status = 'succeeded'"),
    "procrastinate": ("SELECT count(*) FROM procrastinate_jobs",
                      "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"),
    # a finished job leaves the queue table for the log
    "pgqueuer": ("SELECT (SELECT count(*) FROM pgqueuer) + (SELECT count(*) FROM pgqueuer_log "
                 "WHERE status = 'successful')",
                 "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"),
}


def peer_processes(bench: Any, peer: str, directory: Path, url: str
                   ) -> tuple[list[bench_peers.Process], str]:
    """The peer's schema, worker and receiver, started on `url`'s database."""
    python = environment(peer)
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{ROOT}",
           "BENCH_SECRET": bench.SECRET, "BENCH_DATABASE_URL": url,
           "BENCH_POOL": str(RECEIVER_POOL),
           "BENCH_CONCURRENCY": str(PROCRASTINATE_CONCURRENCY),
           "BENCH_BATCH": str(PGQUEUER_BATCH)}
    schema = subprocess.run([str(python), "bench_pg_apps.py", peer, "schema"], cwd=HERE,
                            env=env, capture_output=True, text=True)
    if schema.returncode:
        raise SystemExit(f"{peer}: installing its schema failed:\n{schema.stderr[-3000:]}")
    worker = bench_peers.Process(bench, "worker", [str(python), "bench_pg_apps.py", peer,
                                                   "worker"], directory, env)
    receiver, url = bench_peers.receiver(bench, f"bench_pg_apps:{peer}_app", directory, env,
                                         python=str(python))
    return [worker, receiver], url


def phase(bench: Any, pg: Any, work: Path, events: Path, connections: int,
          duration: float, target: str, instances: int = 1,
          against: Path | None = None) -> dict[str, Any]:
    """One target at one concurrency on a fresh database: the row of the table
    (`against xN`: the agentbox of the checkout `against`, bench_against.py)."""
    kind = "agentbox" if target.startswith(AGENTBOXES) else target
    checkout = against if target.startswith("against") else None
    directory = work / f"{target}-{connections}-{time.monotonic_ns()}"
    directory.mkdir(parents=True)
    url = pg.create()
    processes: list[Any] = []
    servers: list[Any] = []
    watch: PgWatch | None = None
    try:
        if kind == "agentbox":
            servers = [bench.Server("agentbox", directory / f"instance-{i}", url,
                                    checkout=checkout) for i in range(instances)]
            urls = [server.url for server in servers]
            watched = [(f"agentbox-{i}", server.process.pid)
                       for i, server in enumerate(servers)]
        else:
            processes, front = peer_processes(bench, kind, directory, url)
            urls = [front]
            watched = [(p.name, p.process.pid) for p in processes]
        monitors = {name: bench.Monitor(pid) for name, pid in watched}
        watch = PgWatch(url)
        for monitor in monitors.values():
            monitor.start()
        watch.start()
        wrk = bench.load_split(urls, events, connections, duration)
        loaded = time.monotonic()
        if processes:  # the receiver's last requests finish, then nothing more comes
            monitors["receiver"].finish()
            processes[-1].stop(bench)
        drained = bench_peers.wait_for(
            lambda: not watch.pending(PENDING[kind]), f"{target} did not finish the events "
            "it took", [p for p in processes if p in bench.RUNNING], DRAIN_DEADLINE_S,
            fatal=False)
        finished = time.monotonic()
        for monitor in monitors.values():
            if monitor.is_alive():
                monitor.finish()
        pg_figures = watch.finish()
        for server in servers:
            server.stop()
        servers = []
        for process in processes:
            if process in bench.RUNNING:
                process.stop(bench)
        pg_figures.update(watch.commits())  # the clients are gone: their counts are in
        taken_sql, done_sql = COUNTS[kind]
        taken, done = count(url, taken_sql), count(url, done_sql)
        pg_figures["statements"] = watch.top_statements(done)
        return row(target, instances, connections, wrk, loaded, finished, monitors,
                   pg_figures, taken, done, drained)
    finally:
        if watch is not None:
            watch.close()
        for server in servers:  # a phase that failed: leave nothing behind
            server.process.kill()
        for process in processes:
            if process in bench.RUNNING:
                process.stop(bench)
        pg.drop(url)


def row(target: str, instances: int, connections: int, wrk: dict[str, Any], loaded: float,
        finished: float, monitors: dict[str, Any], pg_figures: dict[str, Any], taken: int,
        done: int, drained: bool) -> dict[str, Any]:
    seconds = wrk["duration_us"] / 1e6 + finished - loaded
    cpu = {name: m.cpu_seconds for name, m in monitors.items()}
    cpu["postgres"] = pg_figures["cpu_seconds"]
    servers = sum(v for k, v in cpu.items() if k.startswith(("agentbox", "receiver")))

    def per_event(seconds: float) -> int:
        return round(seconds * 1e6 / max(done, 1))

    accepted = wrk["statuses"].get("202", 0)
    return {
        "target": target, "instances": instances, "connections": connections,
        "accepted_per_s": round(wrk["per_second"]), "completed_per_s": round(done / seconds),
        "p50_ms": wrk["p50_us"] / 1000, "p99_ms": wrk["p99_us"] / 1000,
        "statuses": wrk["statuses"], "errors": wrk["errors"],
        "drain_after_load_s": round(finished - loaded, 2),
        "cpu_seconds": {k: round(v, 3) for k, v in cpu.items()},
        "cpu_us_per_event": {"servers": per_event(servers),
                             "worker": per_event(cpu.get("worker", 0.0)),
                             "postgres": per_event(cpu["postgres"]),
                             "total": per_event(sum(cpu.values()))},
        "commits_per_event": round(pg_figures.get("commits", 0) / max(done, 1), 3),
        "wal_bytes_per_event": round(pg_figures["wal_bytes"] / max(done, 1)),
        "postgres": pg_figures,
        "store_check": {"accepted": accepted, "taken": taken, "completed": done,
                        "drained": drained,
                        "ok": drained and taken >= accepted and done >= taken},
    }


def ceiling_phase(bench: Any, work: Path, events: Path, connections: int,
                  duration: float) -> dict[str, Any]:
    figures = bench.load_phase("ceiling", work / f"ceiling-{time.monotonic_ns()}", events,
                               connections, duration)
    return {"target": "ceiling", "instances": 1, "connections": connections,
            "accepted_per_s": figures["accepted_per_s"], "completed_per_s": None,
            "p50_ms": figures["p50_ms"], "p99_ms": figures["p99_ms"],
            "statuses": figures["statuses"], "errors": figures["errors"],
            "cpu_us_per_event": {"servers": figures["cpu_us_per_request"]},
            "store_check": {"ok": True}}


AGENTBOXES = ("agentbox", "against")  # this checkout's, and --against DIR's


def targets(instances: list[int], against: bool = False) -> list[str]:
    return [*(f"{name} x{n}" for n in instances for name in AGENTBOXES[:1 + against]),
            "procrastinate", "pgqueuer", "ceiling"]


def run(bench: Any, database_url: str, work: Path, levels: list[int], duration: float,
        rounds: int, instances: list[int], report: dict[str, Any],
        against: Path | None = None) -> bool:
    """Every target at every concurrency, `rounds` times; True if anything failed."""
    for peer in PEER_PACKAGES:  # before anything is measured: an install that fails ends it
        environment(peer)
    pg = bench.Postgres(database_url)
    names = targets(instances, against is not None)
    count = int(bench.MAX_EVENTS_PER_SECOND * duration)
    failed = False
    for round_ in range(1, rounds + 1):
        order = names[round_ - 1:] + names[:round_ - 1]
        for connections in levels:
            for target in order:
                print(f"round {round_}, {connections} connections: {target} "
                      f"(load average {os.getloadavg()[0]:.2f}) ...", file=sys.stderr)
                events = bench.write_events(work, f"pg-{target.replace(' ', '')}-{connections}"
                                            f"-{round_}", count)
                load = os.getloadavg()[0]
                if target == "ceiling":
                    figures = ceiling_phase(bench, work, events, connections, duration)
                else:
                    n = int(target.rsplit("x", 1)[1]) if target.startswith(AGENTBOXES) else 1
                    figures = phase(bench, pg, work, events, connections, duration, target, n,
                                    against)
                events.unlink()
                figures.update(round=round_, load_average=round(load, 2))
                report["load"].append(figures)
                failed |= set(figures["statuses"]) != {"202"} or any(figures["errors"].values())
                failed |= not figures["store_check"]["ok"]
    report["pg_peers"] = summary(report["load"], names, levels)
    return failed


# -- the table ---------------------------------------------------------------------------


def summary(rows: list[dict[str, Any]], names: list[str], levels: list[int]
            ) -> list[dict[str, Any]]:
    """Medians over the rounds, and each agentbox row's end to end against each peer's
    in the same round."""
    out = []
    for connections in levels:
        for name in names:
            mine = [r for r in rows if r["target"] == name and r["connections"] == connections]
            if not mine:
                continue

            def median(key: str, part: str | None = None, of: list[dict[str, Any]] = mine
                       ) -> float | None:
                values = [(r[key] if part is None else r[key].get(part)) for r in of]
                values = [v for v in values if v is not None]
                return statistics.median(values) if values else None

            entry: dict[str, Any] = {
                "system": name, "connections": connections, "rounds": len(mine),
                "accepted_per_s": median("accepted_per_s"),
                "completed_per_s": median("completed_per_s"), "p99_ms": median("p99_ms"),
                "cpu_us_per_event": {part: median("cpu_us_per_event", part)
                                     for part in ("servers", "worker", "postgres", "total")},
                "load_averages": [r.get("load_average") for r in mine],
            }
            if name.startswith(AGENTBOXES):
                older = [f"against x{name.rsplit('x', 1)[1]}"] if name.startswith("agentbox") \
                    else []
                for peer in ("procrastinate", "pgqueuer", *older):
                    ratios = []
                    for r in mine:
                        other = next((p for p in rows if p["target"] == peer and p["round"]
                                      == r["round"] and p["connections"] == connections), None)
                        if other and other["completed_per_s"]:
                            ratios.append(round(r["completed_per_s"]
                                                / other["completed_per_s"], 2))
                    entry["x_against" if peer in older else f"x_{peer}"] = ratios
            out.append(entry)
    return out


def print_summary(report: dict[str, Any]) -> None:
    print("\nagentbox on PostgreSQL against the PostgreSQL queues (same run, same events, "
          "same wrk load; medians of the rounds):\n")
    print(f"{'system':<16} {'conns':>5} {'accepted/s':>10} {'end-to-end/s':>12} "
          f"{'p99 ms':>7}  {'CPU us per completed event: servers + worker + postgres = total':<64}"
          f" {'x procrastinate':>16} {'x pgqueuer':>12} {'x --against':>12}")
    for entry in report["pg_peers"]:
        cpu = entry["cpu_us_per_event"]
        split = (f"{cpu['servers'] or 0:.0f} + {cpu['worker'] or 0:.0f} + "
                 f"{cpu['postgres'] or 0:.0f} = {cpu['total'] or 0:.0f}"
                 if cpu.get("total") else f"{cpu['servers']:.0f} (per request)")
        done = entry["completed_per_s"]
        print(f"{entry['system']:<16} {entry['connections']:>5} {entry['accepted_per_s']:>10.0f}"
              f" {(f'{done:.0f}' if done else '-'):>12} {entry['p99_ms']:>7.1f}  {split:<64}"
              f" {'/'.join(map(str, entry.get('x_procrastinate', []))):>16}"
              f" {'/'.join(map(str, entry.get('x_pgqueuer', []))):>12}"
              f" {'/'.join(map(str, entry.get('x_against', []))) or '-':>12}")
