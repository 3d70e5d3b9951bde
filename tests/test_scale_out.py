"""Scale-out: three real `agentbox serve` processes sharing one PostgreSQL database.

Every instance has its own home (config, data dir, log) but the same database and
one shared agent journal, so the tests can tell which process started which attempt.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import psycopg
import pytest

from agentbox.signing import sign_headers
from agentbox.store.postgres import MIGRATIONS
from tests.conftest import SECRET, Server, encode, make_event, wait_until

pytestmark = pytest.mark.postgres

INSTANCES = ("a", "b", "c")
FAKE_PASSWORD = "not-the-real-pw-4711"


# -- helpers ---------------------------------------------------------------------------------


class Cluster:
    """Three started instances on one database, writing one journal."""

    def __init__(self, servers: list[Server], journal: Path) -> None:
        self.servers = servers
        self.journal = journal

    def __iter__(self) -> Iterator[Server]:
        return iter(self.servers)

    def __getitem__(self, index: int) -> Server:
        return self.servers[index]

    def pids(self) -> dict[int, str]:
        """pid -> instance id."""
        return {s.process.pid: s.env["AGENTBOX_INSTANCE_ID"]
                for s in self.servers if s.process is not None}

    def journal_lines(self) -> list[dict[str, Any]]:
        if not self.journal.exists():
            return []
        lines = self.journal.read_text().splitlines()
        return [json.loads(line) for line in lines if line.endswith("}")]

    def starts(self) -> list[dict[str, Any]]:
        return [line for line in self.journal_lines() if line["kind"] == "start"]


def start_cluster(factory: Callable[..., Server], tmp_path: Path, database_url: str,
                  **extra_env: str) -> Cluster:
    journal = tmp_path / "journal.jsonl"
    servers = []
    for name in INSTANCES:
        home = tmp_path / name
        home.mkdir()
        servers.append(factory(env={
            "AGENTBOX_DATABASE_URL": database_url,
            "AGENTBOX_INSTANCE_ID": f"scale-{name}",
            "AGENTBOX_TEST_JOURNAL": str(journal),
            **extra_env,
        }, home=home))
    with ThreadPoolExecutor(len(servers)) as pool:  # they migrate under one advisory lock
        for started in [pool.submit(server.start) for server in servers]:
            started.result()
    return Cluster(servers, journal)


def signed_post(client: httpx.Client, server: Server, event: dict[str, Any]) -> httpx.Response:
    """POST an event with a signature made now (not shared between deliveries)."""
    body = encode(event)
    return client.post(f"{server.url}/webhooks/events", content=body, headers={
        "Content-Type": "application/json", **sign_headers(SECRET, body, int(time.time()))})


def all_runs(server: Server) -> list[dict[str, Any]]:
    response = server.client.get("/runs", params={"limit": 500})
    assert response.status_code == 200, response.text
    runs: list[dict[str, Any]] = response.json()["runs"]
    return runs


def healthz(server: Server) -> dict[str, Any]:
    response = server.client.get("/healthz")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def unix(iso_time: str) -> float:
    return datetime.fromisoformat(iso_time).timestamp()


def with_password(url: str) -> str:
    """`url` carrying a password, so the tests can check it is never shown. The test
    server trusts loopback connections and ignores it; a URL that has one keeps it."""
    parts = urlsplit(url)
    if parts.password is not None:
        return url
    user, _, host = parts.netloc.rpartition("@")
    candidate = parts._replace(netloc=f"{user or 'agentbox'}:{FAKE_PASSWORD}@{host}").geturl()
    try:
        with psycopg.connect(candidate, connect_timeout=5):
            return candidate
    except psycopg.OperationalError:  # a server that checks passwords: keep the URL given
        return url


def redacted(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user, _, host = parts.netloc.rpartition("@")
    return parts._replace(netloc=f"{user.split(':', 1)[0]}:***@{host}").geturl()


# -- 1. one event, three receivers at once -----------------------------------------------------


def test_one_event_delivered_to_three_instances_at_once_makes_one_run(
        server_factory: Callable[..., Server], tmp_path: Path, postgres_url: str) -> None:
    cluster = start_cluster(server_factory, tmp_path, postgres_url)
    event = make_event(project_id="ok")
    deliveries = 50
    barrier = threading.Barrier(deliveries)

    def deliver(index: int) -> httpx.Response:
        with httpx.Client(timeout=30) as client:
            barrier.wait(30)
            return signed_post(client, cluster[index % 3], event)

    with ThreadPoolExecutor(deliveries) as pool:
        answers = list(pool.map(deliver, range(deliveries)))

    bodies = [answer.json() for answer in answers]
    assert {answer.status_code for answer in answers} <= {200, 202}, \
        [(a.status_code, a.text) for a in answers if a.status_code not in (200, 202)]
    run_ids = {body["run_id"] for body in bodies}
    assert len(run_ids) == 1, run_ids
    (run_id,) = run_ids
    fresh = [(a.status_code, b["duplicate"]) for a, b in zip(answers, bodies, strict=True)
             if not b["duplicate"]]
    assert fresh == [(202, False)]
    duplicates = [(a.status_code, b["duplicate"]) for a, b in zip(answers, bodies, strict=True)
                  if b["duplicate"]]
    assert duplicates == [(200, True)] * (deliveries - 1)
    for body in bodies:
        assert [run["run_id"] for run in body["runs"]] == [run_id]
        assert body["status_url"] == f"/runs/{run_id}"

    finished = cluster[0].wait_terminal(run_id)
    assert finished["status"] == "succeeded" and finished["attempt"] == 1
    for server in cluster:
        runs = all_runs(server)
        assert [run["run_id"] for run in runs] == [run_id], server.url
        assert runs[0]["event_id"] == event["event_id"]
        assert server.run(run_id)["status"] == "succeeded"
    # The agent ran once, on one of the three (all three write this journal).
    starts = cluster.starts()
    assert [(s["run_id"], s["attempt"]) for s in starts] == [(run_id, 1)]
    assert starts[0]["pid"] in cluster.pids()


# -- 2. many events, three receivers, shared work ----------------------------------------------


def test_events_spread_over_three_instances_each_run_exactly_once(
        server_factory: Callable[..., Server], tmp_path: Path, postgres_url: str) -> None:
    cluster = start_cluster(server_factory, tmp_path, postgres_url)
    total = 2000
    events = [make_event(project_id="ok") for _ in range(total)]
    local = threading.local()
    clients: list[httpx.Client] = []
    lock = threading.Lock()

    def client() -> httpx.Client:
        found: httpx.Client | None = getattr(local, "client", None)
        if found is None:
            found = local.client = httpx.Client(timeout=30)  # keep-alive, one per thread
            with lock:
                clients.append(found)
        return found

    def deliver(index: int) -> tuple[int, int, str]:
        response = signed_post(client(), cluster[index % 3], events[index])
        return index, response.status_code, response.text

    started = time.monotonic()
    try:
        with ThreadPoolExecutor(12) as pool:
            answers = list(pool.map(deliver, range(total)))
    finally:
        for each in clients:
            each.close()
    posted = time.monotonic() - started

    refused = [(i, status, text) for i, status, text in answers if status != 202]
    assert not refused, refused[:5]
    run_of = {events[i]["event_id"]: json.loads(text)["run_id"] for i, _, text in answers}
    assert len(set(run_of.values())) == total

    def all_succeeded() -> dict[str, Any] | None:
        body = healthz(cluster[0])
        return body if body["runs"]["succeeded"] == total else None

    health = wait_until(all_succeeded, 60, f"{total} runs to succeed", interval=0.2)
    done = time.monotonic() - started
    assert {status: n for status, n in health["runs"].items() if n} == {"succeeded": total}
    assert health["active"] == 0

    starts = cluster.starts()
    per_run = Counter(s["run_id"] for s in starts)
    assert set(per_run) == set(run_of.values())
    assert per_run.most_common(1)[0][1] == 1, per_run.most_common(3)
    assert all(s["attempt"] == 1 for s in starts)
    by_pid = Counter(s["pid"] for s in starts)
    pids = cluster.pids()
    assert set(by_pid) <= set(pids), (by_pid, pids)
    assert len(by_pid) > 1, f"one instance ran every agent: {by_pid}"
    print(f"\n{total} events: posted in {posted:.1f} s, all succeeded after {done:.1f} s; "
          f"starts per instance: { {pids[p]: n for p, n in by_pid.items()} }")


# -- 3. kill -9 of one instance ----------------------------------------------------------------


def test_a_killed_instance_runs_are_finished_by_the_others(
        server_factory: Callable[..., Server], tmp_path: Path, postgres_url: str) -> None:
    lease = 2.0
    cluster = start_cluster(server_factory, tmp_path, postgres_url,
                            AGENTBOX_LEASE_SECONDS=str(lease))
    a, b, c = cluster
    for server, name in ((b, "scale-b"), (c, "scale-c")):
        health = healthz(server)
        assert (health["engine"], health["instance_id"]) == ("postgresql", name)
    pids = cluster.pids()
    a_pid = a.process.pid  # type: ignore[union-attr]

    # Posted to a only; b and c, told by NOTIFY, claim some too. Batches go in until a
    # has started some (and every run posted has started somewhere).
    run_ids: list[str] = []
    while not any(s["pid"] == a_pid for s in cluster.starts()):
        assert len(run_ids) < 48, f"a started none of {len(run_ids)} runs posted to it"
        for _ in range(6):
            response = a.post(make_event(project_id="sleep-3"))
            assert response.status_code == 202, response.text
            run_ids.append(response.json()["run_id"])
        try:
            wait_until(lambda: {s["run_id"] for s in cluster.starts()} >= set(run_ids), 10,
                       f"the {len(run_ids)} runs posted to start")
        except AssertionError as exc:
            started = {s["run_id"] for s in cluster.starts()}
            raise AssertionError(f"{exc}; not started: " + ", ".join(
                f"{r} {b.run(r)['status']}" for r in run_ids if r not in started)) from None
    a.kill9()
    started_by_a = {s["run_id"] for s in cluster.starts() if s["pid"] == a_pid}
    assert started_by_a

    finished = {run_id: b.wait_terminal(run_id, timeout=30) for run_id in run_ids}
    # One more run through each survivor: their dispatchers have looked for due work
    # after every run above was terminal (a terminal run started now would show).
    for server in (b, c):
        probe = server.post(make_event(project_id="ok")).json()["run_id"]
        assert server.wait_terminal(probe)["status"] == "succeeded"

    starts = [s for s in cluster.starts() if s["run_id"] in finished]
    by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in sorted(starts, key=lambda s: s["t"]):
        by_run[s["run_id"]].append(s)
    for run_id, run in finished.items():
        assert run["status"] == "succeeded", run
        attempts = [s["attempt"] for s in by_run[run_id]]
        # one holder per attempt, attempts only go up, the last one started is the run's
        assert attempts == sorted(set(attempts)), (run_id, attempts)
        assert attempts[-1] == run["attempt"], (run_id, attempts, run["attempt"])
        completed = unix(run["completed_at"])
        for s in by_run[run_id]:  # completed_at is shown to the millisecond, truncated
            assert s["t"] <= completed + 0.001, (run_id, s, run["completed_at"])
        if run_id in started_by_a:
            first, *later = by_run[run_id]
            assert first["pid"] == a_pid
            assert later, f"{run_id}, started on the killed instance, never started again"
            assert all(s["pid"] in pids and s["pid"] != a_pid for s in later)
            assert later[-1]["attempt"] > first["attempt"]
            history = b.client.get(f"/runs/{run_id}", params={"history": 1}).json()["attempts"]
            lost = history[first["attempt"] - 1]
            assert (lost["attempt"], lost["outcome"]) == (first["attempt"], "lease_expired")
            assert lost["worker"].startswith("scale-a:")
        else:  # the survivors kept their leases: their runs ran once
            assert [(s["pid"], s["attempt"]) for s in by_run[run_id]] == [
                (by_run[run_id][0]["pid"], 1)], (run_id, by_run[run_id])
            assert by_run[run_id][0]["pid"] != a_pid
    for server, name in ((b, "scale-b"), (c, "scale-c")):
        health = healthz(server)
        assert (health["engine"], health["instance_id"]) == ("postgresql", name)
        assert health["runs"]["succeeded"] == len(run_ids) + 2
        assert health["active"] == 0


# -- 4. the status page of another instance is live --------------------------------------------


def test_live_updates_reach_a_page_on_another_instance(
        server_factory: Callable[..., Server], tmp_path: Path, postgres_url: str) -> None:
    cluster = start_cluster(server_factory, tmp_path, postgres_url)
    a, b, _ = cluster
    b_pid = b.process.pid  # type: ignore[union-attr]
    deadline = time.monotonic() + 30
    seen: dict[str, set[str]] = defaultdict(set)  # run_id -> statuses seen on b's page
    posted: list[str] = []
    run_elsewhere: str | None = None

    with httpx.Client(timeout=httpx.Timeout(10.0), headers={
            "Authorization": f"Bearer {b.admin_token()}"}) as client, \
            client.stream("GET", f"{b.url}/ui/stream") as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        kind = None
        for line in stream.iter_lines():  # a stats message comes at least every 2 s
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out: b's page saw {dict(seen)} of {posted}")
            if line.startswith("event:"):
                kind = line.partition(":")[2].strip()
                continue
            if not line.startswith("data:"):
                continue
            data = json.loads(line.partition(":")[2])
            if kind == "run":
                seen[data["run_id"]].add(data["status"])
            if posted and "succeeded" not in seen[posted[-1]]:
                continue
            if posted:  # the last run reached b's page: who ran it?
                starts = [s for s in cluster.starts() if s["run_id"] == posted[-1]]
                assert len(starts) == 1
                if starts[0]["pid"] != b_pid:  # then b learnt of it from PostgreSQL only
                    run_elsewhere = posted[-1]
                    break
                if len(posted) == 40:
                    raise AssertionError("b ran all of 40 runs posted to a")
            # subscribed (the first message) or the last run seen: post to a
            response = a.post(make_event(project_id="ok"))
            assert response.status_code == 202, response.text
            posted.append(response.json()["run_id"])

    assert run_elsewhere is not None
    assert seen[run_elsewhere] == {"processing", "succeeded"}
    assert b.run(run_elsewhere)["status"] == "succeeded"


# -- 5. migrate, and a database newer than this agentbox ----------------------------------------


def test_migrate_command_and_newer_schema_refused(
        server_factory: Callable[..., Server], tmp_path: Path, postgres_url: str) -> None:
    known = len(MIGRATIONS)  # the newest schema version this agentbox knows
    url = with_password(postgres_url)
    shown = redacted(url)
    password = urlsplit(url).password
    server = server_factory(env={"AGENTBOX_INSTANCE_ID": "scale-migrate"}, home=tmp_path)

    def agentbox(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "agentbox", *args], env=server.env,
                              cwd=tmp_path, capture_output=True, text=True, timeout=timeout)

    def versions() -> list[int]:
        with psycopg.connect(postgres_url) as conn:
            return [row[0] for row in conn.execute(
                "SELECT version FROM agentbox_schema ORDER BY version")]

    first = agentbox("migrate", "--database-url", url)
    assert first.returncode == 0, first.stderr
    assert shown in first.stdout and f"schema version 0 -> {known}" in first.stdout, first.stdout
    assert versions() == list(range(1, known + 1))
    again = agentbox("migrate", "--database-url", url)
    assert again.returncode == 0, again.stderr
    assert shown in again.stdout and f"schema version {known}, up to date" in again.stdout, \
        again.stdout
    if password:
        assert password not in first.stdout + first.stderr + again.stdout + again.stderr
    with psycopg.connect(postgres_url) as conn:
        tables = {row[0] for row in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
    assert {"runs", "events", "attempts", "outbox", "agentbox_schema"} <= tables

    with psycopg.connect(postgres_url) as conn:
        conn.execute("INSERT INTO agentbox_schema (version, applied_at) VALUES (999, 0)")
    expected = (f"the database {shown} has schema version 999, newer than this agentbox "
                f"knows (up to {known})")

    started = time.monotonic()
    serve = agentbox("serve", "--port", str(server.port), "--database-url", url, timeout=30)
    took = time.monotonic() - started
    output = serve.stdout + serve.stderr
    assert serve.returncode != 0, output
    assert took < 15, f"serve took {took:.1f} s to refuse"
    assert expected in output, output
    assert "written by a newer agentbox" in output
    if password:
        assert password not in output
    with pytest.raises(httpx.TransportError):  # it never listened
        server.client.get("/healthz")

    refused = agentbox("migrate", "--database-url", url)
    assert refused.returncode != 0
    assert expected in refused.stderr, refused.stderr
    if password:
        assert password not in refused.stdout + refused.stderr
    assert versions() == [*range(1, known + 1), 999]  # nothing was changed
