"""The capacity model of agentbox on PostgreSQL: measured, checked, and its table.

    scripts/capacity.py [--duration 10] [--connections 64] [--instances 1,2,3,4]
                        [--instance-cores 0.25] [--json FILE]

Each run loads agentbox instances with wrk (no-op agent, --connections each)
and measures what each completed event costs: CPU in the instances, in
PostgreSQL (the whole server, bench_pgstat.py) and in wrk, the commits, WAL
bytes, WAL flushes and the waits of the database. The runs of one and of two
instances calibrate the model: a, an event's CPU in the instance that takes it;
p, what it costs each other instance (each reads every other's notifications,
and takes over runs left waiting), from the run of two; d, its CPU in
PostgreSQL. The model is the bottleneck law (a resource that can
give c seconds of CPU per second, asked D per event, passes at most c / D
events per second):

    X(N, C, D) = min( N * min(C, k * g) / (a + (N * k - 1) * p),  D / d )

for N machines of C cores, k = ceil(C / g) instances on each, against a
database of D cores; g is the share of a core one instance can use (one
Python process: its event loop and writer threads share one GIL), measured in
a run where one instance had a core to itself. The smaller term names the
first bottleneck. The WAL's flushes, one at a time, are not CPU: their share
of the time (flushes/s x a flush's time) is given beside each prediction.

Every run (1, 2, 3 ... instances) stands for machines of --instance-cores
cores: each instance in a cgroup of its own with that CPU quota, loaded with
its own --connections, with four slots per connection (it runs what it can),
all pinned to the last CPU with wrk (that core adds its own limit: what wrk
leaves of it, (1 - w) / a_N, w being wrk's share of a core), against the
database pinned to the first CPU. In those runs a busy loop at the lowest
priority (SCHED_IDLE) keeps that CPU from idling (an idle virtual CPU makes each
event dearer; the run of one instance with a core to itself has none, its idle
time gives g), and the figures are taken over the load's steady part: from a second
after the first run is done to 1.5 s before the load ends (wrk reads its events
before it sends, and the last runs trail off). The report compares measured
with predicted for each: 1 and 2 calibrate, the rest check.
Linux only (taskset, cgroups, /proc). The PostgreSQL server is a throwaway one
started here (tests/postgres.py, with pg_stat_statements and WAL timing on)
unless --database-url names one on this machine (then not pinned).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bench
import bench_peers
import bench_pg
from bench_pgstat import PgWatch, children_of, process_cpu

ROOT = Path(__file__).resolve().parent.parent
CGROUP_V1 = Path("/sys/fs/cgroup/cpu")
CGROUP_V2 = Path("/sys/fs/cgroup")
PERIOD_US = 100_000
IDLE_ENOUGH = 0.05  # a core idle this much of the time was not what held an instance back
# Instances settled after starting: under QUIET_CORES of a core for QUIET_SECONDS (the
# CPU counts go by clock ticks of 10 ms), waited for at most QUIET_TIMEOUT_S.
QUIET_SECONDS, QUIET_CORES, QUIET_TIMEOUT_S = 1.0, 0.02, 20.0
# The load's steady part (Steady): from this long after the first run is done to this
# long before the load ends (of --duration).
STEADY_LEAD, STEADY_TAIL, STEADY_START_DEADLINE_S = 1.0, 1.5, 30.0
SIZES = {"machines": (1, 2, 4, 8, 16), "cores": (1, 2, 4), "database_cores": (2, 4, 8, 16)}


# -- placing processes ------------------------------------------------------------------


def idle_seconds(cpus: set[int]) -> float:
    """Seconds these CPUs have spent idle (and waiting on I/O) since boot (/proc/stat)."""
    total = 0
    for line in Path("/proc/stat").read_text().splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            total += int(fields[3]) + int(fields[4])
    return total / os.sysconf("SC_CLK_TCK")


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of `pid` onto `cpus` (threads made later inherit it)."""
    with contextlib.suppress(FileNotFoundError):  # it exited meanwhile
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(int(task.name), cpus)


class Quota:
    """A cgroup with a CPU quota of `cores` (cgroup v2 cpu.max, or v1's CFS quota)."""

    def __init__(self, name: str, cores: float) -> None:
        v2 = (CGROUP_V2 / "cgroup.controllers").exists()
        self.path = (CGROUP_V2 if v2 else CGROUP_V1) / name
        try:
            self.path.mkdir(exist_ok=True)
            quota = round(cores * PERIOD_US)
            if v2:
                (self.path / "cpu.max").write_text(f"{quota} {PERIOD_US}")
            else:
                (self.path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
                (self.path / "cpu.cfs_quota_us").write_text(str(quota))
        except OSError as exc:
            raise SystemExit(f"capacity: cannot make the cgroup {self.path} ({exc}): the check "
                             "needs root and a writable cgroup cpu controller") from None

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        parent = self.path.parent / "cgroup.procs"
        with contextlib.suppress(OSError):
            for pid in (self.path / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    parent.write_text(pid)
        with contextlib.suppress(OSError):
            self.path.rmdir()


@contextlib.contextmanager
def database(url: str | None, cpus: set[int] | None) -> Iterator[str]:
    """The admin URL of the server to measure: a throwaway one started here, its
    postmaster and every process pinned to `cpus`, with WAL I/O timing on."""
    if url:
        yield url
        return
    sys.path.insert(0, str(ROOT))
    from tests.postgres import SERVER_SETTINGS, start_server

    SERVER_SETTINGS["track_wal_io_timing"] = "on"  # the WAL flush's time, for the lock
    SERVER_SETTINGS["shared_preload_libraries"] = "pg_stat_statements"  # time by statement
    server = start_server()
    try:
        if cpus is not None:
            assert server.process is not None
            for pid in [server.process.pid, *children_of(server.process.pid)]:
                pin(pid, cpus)
        yield server.admin_url
    finally:
        server.stop()


# -- one measured load ------------------------------------------------------------------


def quiet(pids: list[int], timeout: float = QUIET_TIMEOUT_S) -> bool:
    """Wait until these processes together use under QUIET_CORES of a core for
    QUIET_SECONDS (False: they were still busy at the deadline)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        start = sum(process_cpu(pid) for pid in pids)
        time.sleep(QUIET_SECONDS)
        if sum(process_cpu(pid) for pid in pids) - start < QUIET_CORES * QUIET_SECONDS:
            return True
    return False


class Steady(threading.Thread):
    """The load's steady part: wrk starts after reading its events, and the last
    requests and runs trail off, so the rate and the CPU per event are taken
    between two readings inside the load, from STEADY_LEAD seconds after the
    first run is done to STEADY_TAIL before the load ends: events taken and done,
    the instances' CPU, PostgreSQL's, the idle time of the instances' CPUs."""

    def __init__(self, url: str, pids: list[int], watch: PgWatch, cpus: set[int],
                 seconds: int) -> None:
        super().__init__(daemon=True)
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)
        self.pids, self.watch, self.cpus, self.seconds = pids, watch, cpus, seconds
        self.readings: list[tuple[float, int, int, list[float], float, float]] = []
        self.stopping = threading.Event()

    def _count(self, sql: str) -> int:
        return int(self.conn.execute(sql).fetchone()[0])  # type: ignore[index]

    def _reading(self) -> None:
        taken_sql, done_sql = bench_pg.COUNTS["agentbox"]
        self.readings.append((time.monotonic(), self._count(taken_sql), self._count(done_sql),
                              [process_cpu(pid) for pid in self.pids], self.watch.cpu(),
                              idle_seconds(self.cpus)))

    def run(self) -> None:
        try:
            deadline = time.monotonic() + STEADY_START_DEADLINE_S
            while self._count(bench_pg.COUNTS["agentbox"][1]) == 0:
                if time.monotonic() > deadline or self.stopping.wait(0.05):
                    return  # no reading: figures() says the load never got going
            started = time.monotonic()
            if self.stopping.wait(STEADY_LEAD):
                return
            self._reading()
            if self.stopping.wait(max(0.0, started + self.seconds - STEADY_TAIL
                                      - time.monotonic())):
                return
            self._reading()
        finally:
            self.conn.close()

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=10)

    def figures(self, load_ended: float) -> dict[str, Any]:
        if len(self.readings) != 2:
            raise SystemExit("capacity: the load's steady part was not measured (no run was "
                             f"done within {STEADY_START_DEADLINE_S:.0f} s of the start)")
        (t0, m0, n0, a0, d0, i0), (t1, m1, n1, a1, d1, i1) = self.readings
        if t1 > load_ended:
            raise SystemExit("capacity: the load's steady part ended after the load (the "
                             "first run was done late); run again with a longer --duration")
        done, seconds = n1 - n0, t1 - t0
        if done <= 0 or seconds <= 0:
            raise SystemExit("capacity: no run was done in the load's steady part")
        return {"seconds": round(seconds, 2), "completed_per_s": round(done / seconds),
                "taken_per_s": round((m1 - m0) / seconds),
                "a_us": round((sum(a1) - sum(a0)) * 1e6 / done),
                "d_us": round((d1 - d0) * 1e6 / done),
                "instance_cpu": [round((b - a) / seconds, 2) for a, b in zip(a0, a1, strict=True)],
                "app_cpu_idle": round((i1 - i0) / seconds / len(self.cpus), 2)}


def busy_filler(cpus: set[int]) -> subprocess.Popen[bytes]:
    """A busy loop on `cpus` at SCHED_IDLE: it takes only what nothing else wants, and
    ends when this process does (however it ends)."""
    loop = f"import os\nwhile os.getppid() == {os.getpid()}: pass"
    filler = subprocess.Popen(["taskset", "-c", ",".join(map(str, sorted(cpus))),
                               sys.executable, "-c", loop], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        os.sched_setscheduler(filler.pid, os.SCHED_IDLE, os.sched_param(0))
    except OSError:
        filler.kill()
        filler.wait()
        raise
    return filler


def measure(pg: Any, work: Path, instances: int, connections: int, duration: float,
            cores: float | None, app_cpus: set[int]) -> dict[str, Any]:
    """`instances` agentbox instances on a fresh database, each in a cgroup of `cores`
    (None: no quota), all on `app_cpus`, loaded with `connections` in all."""
    url = pg.create()
    servers: list[Any] = []
    quotas: list[Quota] = []
    watch: PgWatch | None = None
    filler: subprocess.Popen[bytes] | None = None
    steady: Steady | None = None
    events = bench.write_events(work, f"capacity-{instances}-{time.monotonic_ns()}",
                                int(bench.MAX_EVENTS_PER_SECOND * duration))
    try:
        for i in range(instances):
            # Slots to spare, and an id that names the instance in the attempts.
            server = bench.Server("agentbox", work / f"n{instances}-{i}-{time.monotonic_ns()}",
                                  url, settings={
                                      "AGENTBOX_WORKER_CONCURRENCY": str(4 * connections),
                                      "AGENTBOX_INSTANCE_ID": f"capacity-{i}"})
            servers.append(server)
            pin(server.process.pid, app_cpus)
            if cores is not None:
                quotas.append(Quota(f"agentbox-capacity-{os.getpid()}-{i}", cores))
                quotas[-1].add(server.process.pid)
        # An instance that has just started is still settling (its first look at
        # the store, its imports); that CPU is no event's: start once all are quiet.
        settled = quiet([s.process.pid for s in servers])
        if not settled:
            print(f"capacity: the instances were still busy {QUIET_TIMEOUT_S:.0f} s after "
                  "starting; measuring anyway", file=sys.stderr)
        # A core a quota leaves mostly unused sits idle between bursts, and on a
        # virtual machine every wake-up from idle makes the next event dearer (one
        # instance at a quarter of a core: 385 us per event, against 305 with the
        # core kept busy). A machine near its capacity, what the model predicts,
        # has no idle core: a busy loop at the lowest priority (SCHED_IDLE: it
        # runs only when nothing else wants the core) keeps it busy.
        filler = busy_filler(app_cpus) if cores is not None else None
        watch = PgWatch(url)
        watch.start()
        monitors = [bench.Monitor(s.process.pid) for s in servers]
        for monitor in monitors:
            monitor.start()
        steady = Steady(url, [s.process.pid for s in servers], watch, app_cpus,
                        bench.wrk_seconds(duration))
        steady.start()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        wrk = bench.load_split([s.url for s in servers], events, connections, duration)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the wrk processes, reaped
        loaded = time.monotonic()
        steady.join()
        window = steady.figures(load_ended=loaded)
        bench_peers.wait_for(lambda: not watch.pending(bench_pg.PENDING["agentbox"]),
                             "the runs were not all done", [], bench_pg.DRAIN_DEADLINE_S)
        finished = time.monotonic()
        for monitor in monitors:
            monitor.finish()
        pg_figures = watch.finish()
        for server in servers:
            server.stop()
        servers = []
        pg_figures.update(watch.commits())
        done = bench_pg.count(url, bench_pg.COUNTS["agentbox"][1])
        ran = dict(bench_pg.rows(url, "SELECT owner, count(*) FROM attempts GROUP BY owner"))
        pg_figures["statements"] = watch.top_statements(done)
        wrk_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)

        return {
            "instances": instances, "instance_cores": cores,
            "connections": connections, "completed": done,
            # the model's figures come from the steady part of the load (see Steady)
            "completed_per_s": window["completed_per_s"], "window_s": window["seconds"],
            "a_us": window["a_us"], "d_us": window["d_us"],
            "taken_per_s": window["taken_per_s"],
            # each instance's share of a core over that window, and how much of the
            # instances' CPUs nobody wanted (the run without a quota: with one, the busy
            # loop takes what is left, and this is about 0)
            "instance_cpu": window["instance_cpu"], "app_cpu_idle": window["app_cpu_idle"],
            "accepted_per_s": round(wrk["per_second"]), "p99_ms": wrk["p99_us"] / 1000,
            "statuses": wrk["statuses"], "drain_after_load_s": round(finished - loaded, 2),
            # from here on, over the whole run (the load and its drain): the CPU per
            # event beside the steady part's, wrk's, and PostgreSQL's counts per event
            "whole_run": {"a_us": round(sum(m.cpu_seconds for m in monitors) * 1e6 / done),
                          "d_us": round(pg_figures["cpu_seconds"] * 1e6 / done)},
            "w_us": round(wrk_cpu * 1e6 / done),
            # wrk's share of a core: about the same whatever the rate (it keeps its
            # connections busy), so the shared core's limit takes it as a share
            "w_cores": round(wrk_cpu / (wrk["duration_us"] / 1e6), 3),
            "settled": settled,
            # the runs each instance ran (another with room takes over runs left waiting)
            "runs_by_instance": sorted(ran.values(), reverse=True),
            "commits_per_event": round(pg_figures["commits"] / done, 3),
            "wal_bytes_per_event": round(pg_figures["wal_bytes"] / done),
            "wal_syncs_per_event": round(pg_figures["wal_syncs"] / done, 3),
            "wal_sync_ms": pg_figures["wal_sync_ms"],
            "postgres": pg_figures,
        }
    finally:
        if steady is not None:
            steady.stop()
        if filler is not None:  # a busy loop left behind would never end
            filler.kill()
            filler.wait()
        if watch is not None:
            watch.close()
        for server in servers:
            server.process.kill()
        for quota in quotas:
            quota.remove()
        events.unlink(missing_ok=True)
        pg.drop(url)


# -- the model --------------------------------------------------------------------------


def g_cores(one_core: dict[str, Any]) -> float:
    """The share of a core one instance uses when it may have all of it: what it took,
    if its core had time to spare; if not (other programs took the rest), it might
    have used more, and one instance per core is assumed."""
    share = max(one_core["instance_cpu"])
    return min(1.0, share) if one_core["app_cpu_idle"] >= IDLE_ENOUGH else 1.0


def model(one: dict[str, Any], two: dict[str, Any], one_core: dict[str, Any]) -> dict[str, Any]:
    """The per-event demands, from the runs of one and of two instances (of the same
    quota, each with its own load): a, d, w from one; p, what each instance pays per
    event of another, from what an event cost the instances in all when there were two;
    g from the run where one instance had a core to itself."""
    return {
        "a_us": one["a_us"], "p_us": max(0, two["a_us"] - one["a_us"]), "d_us": one["d_us"],
        "w_cores": one["w_cores"], "g_cores": g_cores(one_core),
        "commits_per_event": one["commits_per_event"],
        "wal_bytes_per_event": one["wal_bytes_per_event"],
        "wal_syncs_per_event": one["wal_syncs_per_event"],
        "wal_sync_ms": one["wal_sync_ms"],
    }


def per_machine(m: dict[str, Any], cores: float) -> int:
    """Instances to run on a machine of `cores`: enough to use them all (one instance
    uses at most g of a core)."""
    return max(1, math.ceil(cores / m["g_cores"] - 1e-9))


def predict(m: dict[str, Any], machines: int, cores: float, database_cores: float,
            shared_core: bool = False) -> dict[str, Any]:
    """Events/s for `machines` of `cores` each (per_machine() instances on each) against
    `database_cores`, and the first bottleneck. `shared_core`: the instances and wrk
    share one core (the check here)."""
    instances = machines * per_machine(m, cores)
    usable = min(per_machine(m, cores) * m["g_cores"], cores)
    # every instance pays p for each event another one handles (its notification)
    a = m["a_us"] + (instances - 1) * m["p_us"]
    limits = {"agentbox instances": machines * usable / a * 1e6,
              "database CPU": database_cores / m["d_us"] * 1e6}
    if shared_core:
        limits["the instances' core (with wrk)"] = (1 - m["w_cores"]) / a * 1e6
    bottleneck = min(limits, key=lambda k: limits[k])
    rate = limits[bottleneck]
    # WAL flushes happen one at a time: their share of the time at this rate. Not a
    # hard limit (more commits share a flush when they queue), but the latency's.
    flushing = (rate * m["wal_syncs_per_event"] * m["wal_sync_ms"] / 1e3
                if m["wal_sync_ms"] else None)
    return {"events_per_s": round(rate), "bottleneck": bottleneck,
            "limits": {k: round(v) for k, v in limits.items()},
            "wal_flush_use": None if flushing is None else round(flushing, 2)}


def table(m: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"machines": n, "cores": c, "instances_per_machine": per_machine(m, c),
             "database_cores": d, **predict(m, n, c, d)}
            for d in SIZES["database_cores"] for c in SIZES["cores"] for n in SIZES["machines"]]


# -- the command ------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=10)
    parser.add_argument("--connections", type=int, default=64,
                        help="wrk connections per instance (each 'machine' brings its load)")
    parser.add_argument("--instances", default="1,2,3,4",
                        help="instance counts (1 and 2 calibrate the model, the rest check it)")
    parser.add_argument("--instance-cores", type=float, default=0.25,
                        help="each instance's CPU quota (cgroup) in the calibration and "
                             "the check, in cores")
    parser.add_argument("--database-url", default=None,
                        help="a server on this machine whose user may CREATE DATABASE "
                             "(default: a throwaway one started here, pinned)")
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    shortest = STEADY_LEAD + STEADY_TAIL + 2
    if args.duration < shortest:
        raise SystemExit(f"capacity: --duration {args.duration:g} leaves no steady part to "
                         f"measure; give at least {shortest:g} (seconds)")
    bench.Server.log_level = args.log_level
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("capacity: the check needs two CPUs (one for the database)")
    db_cpus, app_cpus = {cpus[0]}, {cpus[-1]}
    bench.WRK_PREFIX[:] = ["taskset", "-c", str(cpus[-1])]
    work = Path(tempfile.mkdtemp(prefix="agentbox-capacity-"))
    print(f"work directory (removed if the run passes): {work}", file=sys.stderr)
    quota = args.instance_cores
    report: dict[str, Any] = {
        "started": time.strftime("%FT%TZ", time.gmtime()), "duration_s": args.duration,
        "connections_per_instance": args.connections, "instance_cores": quota,
        "placement": {"database": f"CPU {cpus[0]}", "instances and wrk": f"CPU {cpus[-1]}"}}

    def run(what: str, instances: int, cores: float | None) -> dict[str, Any]:
        load = os.getloadavg()[0]
        print(f"{what}: {instances} instance(s), quota {cores or 'none'} (load average "
              f"{load:.2f}) ...", file=sys.stderr)
        figures = measure(pg, work, instances, args.connections * instances, args.duration,
                          cores, app_cpus)
        figures["load_average"] = round(load, 2)
        return figures

    counts = sorted({1, 2, *(int(x) for x in args.instances.split(","))})
    with database(args.database_url, db_cpus if not args.database_url else None) as admin:
        pg = bench.Postgres(admin)
        report["one_core"] = run("one instance with the core to itself", 1, None)
        runs = {n: run("calibration" if n <= 2 else "check", n, quota) for n in counts}
    m = report["model"] = model(runs[1], runs[2], report["one_core"])
    report["calibration"] = runs[1]
    report["check"] = []
    for n in counts:
        predicted = predict(m, n, quota, 1, shared_core=True)
        demand = m["a_us"] + (n - 1) * m["p_us"]  # the instances' CPU per event
        report["check"].append({
            "instances": n, "calibrates": n <= 2, "predicted": predicted, "measured": runs[n],
            "error": round(predicted["events_per_s"] / max(runs[n]["completed_per_s"], 1)
                           - 1, 3),
            # the model's other half: what an event costs, whatever CPU the machine gave
            "predicted_a_us": demand,
            "a_error": round(demand / max(runs[n]["a_us"], 1) - 1, 3),
            # the CPU the instances had, of the quota's (a shared machine may give less)
            "quota_used": round(sum(runs[n]["instance_cpu"]) / (n * quota), 2)})
    report["table"] = table(m)
    print_report(report)
    text = json.dumps(report, indent=2)
    if args.json:
        args.json.write_text(text)
    shutil.rmtree(work)


def print_report(report: dict[str, Any]) -> None:
    c, m, one = report["calibration"], report["model"], report["one_core"]
    print(f"\none instance with a core to itself: {one['completed_per_s']}/s done, "
          f"{one['instance_cpu'][0]} of the core ({one['app_cpu_idle']} of it idle; g = "
          f"{m['g_cores']}), a = {one['a_us']} us, d = {one['d_us']} us")
    print(f"\ncalibration (one instance, {report['instance_cores']} cores, "
          f"{c['connections']} connections, {c['completed']} events, "
          f"{c['completed_per_s']}/s done in the load's steady part):")
    print(f"  a = {m['a_us']} us of agentbox CPU per event, p = {m['p_us']} us in each other "
          f"instance (from the run of two), d = {m['d_us']} us of PostgreSQL CPU; wrk took "
          f"{m['w_cores']} of a core")
    print(f"  over the whole run: {m['commits_per_event']} commits, "
          f"{m['wal_bytes_per_event']} WAL bytes, {m['wal_syncs_per_event']} WAL flushes per "
          f"event; a flush took {m['wal_sync_ms']} ms")
    print(f"  busy backends waited on: {c['postgres']['waits']}")
    print("  PostgreSQL's time by statement, per event over the whole run (us, calls):")
    for row in c["postgres"]["statements"]:
        print(f"    {row['us_per_event']:>6} {row['calls_per_event']:>6}  {row['statement']}")
    print("\ncheck (predicted against measured events done per second, in the load's steady "
          "part):")
    for row in report["check"]:
        p, got = row["predicted"], row["measured"]
        print(f"  {row['instances']} x {got['instance_cores']} cores"
              f"{' (calibration)' if row['calibrates'] else ''}: predicted "
              f"{p['events_per_s']}/s ({p['bottleneck']}), measured {got['completed_per_s']}/s "
              f"(taken {got['taken_per_s']}/s) "
              f"({100 * row['error']:+.0f} %); CPU per event predicted {row['predicted_a_us']} us,"
              f" measured {got['a_us']} us ({100 * row['a_error']:+.0f} %); the instances had "
              f"{row['quota_used']} of their quota (mean); d = {got['d_us']} us; load average "
              f"{got['load_average']}")
    print("\npredicted capacity (events/s; first bottleneck):")
    for row in report["table"]:
        print(f"  {row['machines']:>3} machines x {row['cores']} cores "
              f"({row['instances_per_machine']} instances each), database "
              f"{row['database_cores']:>2} cores: {row['events_per_s']:>7} ({row['bottleneck']}; "
              f"WAL flushing {row['wal_flush_use']} of the time)")


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        for server in list(bench.RUNNING):
            server.process.kill()
        raise
