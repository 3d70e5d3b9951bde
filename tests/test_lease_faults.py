"""Leases across a pause, with real `agentbox serve` processes.

An instance paused (SIGSTOP, as a laptop sleeps or a VM stalls) past its lease
that nobody took renews it at resume and its agents go on (SQLite, and
PostgreSQL with no other instance). One whose runs another instance took on a
shared PostgreSQL has its stale agents cancelled at resume, before their next
step, so no side effect happens twice.
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests import postgres
from tests.conftest import Server, make_event, wait_until

DEADLINE = 60.0  # for each condition waited on: far above what any should take
OUTAGE_SECONDS = 2.5  # how long the crashed database stays down (plus its recovery)


def two_instances(factory: Callable[..., Server], tmp_path: Path, database_url: str,
                  **env: str) -> tuple[Server, Server, Path]:
    """Instances a and b on one database, writing one agent journal."""
    journal = tmp_path / "journal.jsonl"
    servers = []
    for name in ("a", "b"):
        home = tmp_path / name
        home.mkdir()
        servers.append(factory(env={"AGENTBOX_DATABASE_URL": database_url,
                                    "AGENTBOX_INSTANCE_ID": f"lease-{name}",
                                    "AGENTBOX_TEST_JOURNAL": str(journal), **env}, home=home))
    for server in servers:  # one after the other: the first migrates
        server.start()
    return servers[0], servers[1], journal


def journal_lines(journal: Path) -> list[dict[str, Any]]:
    if not journal.exists():
        return []
    return [json.loads(line) for line in journal.read_text().splitlines() if line.endswith("}")]


@pytest.mark.parametrize("engine", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_an_instance_paused_past_its_lease_that_nobody_took_runs_each_run_once(
        engine: str, server_factory: Callable[..., Server], tmp_path: Path,
        request: pytest.FixtureRequest) -> None:
    lease = 3.0
    env = {"AGENTBOX_LEASE_SECONDS": str(lease), "AGENTBOX_WORKER_CONCURRENCY": "4"}
    if engine == "postgres":
        env["AGENTBOX_DATABASE_URL"] = request.getfixturevalue("postgres_url")
    server = server_factory(env=env).start()
    assert server.process is not None
    run_ids = [server.post(make_event(project_id="sleep-4")).json()["run_id"] for _ in range(3)]
    wait_until(lambda: {line["run_id"] for line in journal_lines(server.journal)
                        if line["kind"] == "start"} == set(run_ids),
               DEADLINE, "the three runs to start")
    server.process.send_signal(signal.SIGSTOP)
    try:
        time.sleep(lease * 2)  # the pause itself: the leases' ends pass on every clock
    finally:
        resumed_at = time.time()
        server.process.send_signal(signal.SIGCONT)

    finished = [server.wait_terminal(run_id, timeout=DEADLINE) for run_id in run_ids]
    assert [(run["status"], run["attempt"]) for run in finished] == [("succeeded", 1)] * 3
    lines = journal_lines(server.journal)
    for run_id in run_ids:
        assert [(line["kind"], line["attempt"], line["lease_lost"]) for line in lines
                if line["run_id"] == run_id] == [("start", 1, False), ("return", 1, False)]
    # The agents' last step came after the resume: they went on, their leases renewed.
    assert all(line["t"] >= resumed_at for line in lines if line["kind"] == "return")
    assert "lease_lost" not in server.log_path.read_text()


@pytest.mark.postgres
def test_a_paused_instance_stale_agents_never_reach_their_end(
        server_factory: Callable[..., Server], tmp_path: Path, postgres_url: str) -> None:
    lease = 3.0
    a, b, journal = two_instances(server_factory, tmp_path, postgres_url,
                                  AGENTBOX_LEASE_SECONDS=str(lease),
                                  AGENTBOX_WORKER_CONCURRENCY="4")
    assert a.process is not None
    run_ids = [a.post(make_event(project_id="sleep-8")).json()["run_id"] for _ in range(3)]
    wait_until(lambda: {line["run_id"] for line in journal_lines(journal)
                        if line["kind"] == "start" and line["pid"] == a.process.pid  # type: ignore[union-attr]
                        } == set(run_ids), DEADLINE, "a to start the three runs")

    a.process.send_signal(signal.SIGSTOP)
    try:  # b takes the runs over once a's leases ran out
        wait_until(lambda: {line["run_id"] for line in journal_lines(journal)
                            if line["kind"] == "start" and line["attempt"] == 2} == set(run_ids),
                   DEADLINE, "b to start the runs as attempt 2")
    finally:
        a.process.send_signal(signal.SIGCONT)

    finished = [b.wait_terminal(run_id, timeout=DEADLINE) for run_id in run_ids]
    assert [(run["status"], run["attempt"]) for run in finished] == [("succeeded", 2)] * 3
    # a's agents, resumed, were cancelled as lease lost: the journal says so for each
    wait_until(lambda: sum(line["kind"] == "raise" for line in journal_lines(journal)) == 3,
               DEADLINE, "a's stale agents to be cancelled")
    by_run = {run_id: [(line["kind"], line["attempt"], line["lease_lost"])
                       for line in journal_lines(journal) if line["run_id"] == run_id]
              for run_id in run_ids}
    for run_id, lines in by_run.items():
        assert sorted(lines) == sorted([("start", 1, False), ("raise", 1, True),
                                        ("start", 2, False), ("return", 2, False)]), (run_id, lines)
    log = a.log_path.read_text()
    for run_id in run_ids:
        assert any(run_id in line and "lease_lost" in line and "WARNING" in line.upper()
                   for line in log.splitlines()), (run_id, log[-3000:])


@pytest.mark.postgres
def test_a_database_crash_shorter_than_the_lease_runs_no_finished_attempt_again(
        server_factory: Callable[..., Server], tmp_path: Path) -> None:
    """The server stopped as a crash would (`pg_ctl stop -m immediate`) while agents
    run and outcomes are being written: the outcomes that finished during the outage
    wait, their leases still this instance's, and land when the database is back."""
    try:
        database = postgres.start_server()  # its own: this test stops it
    except postgres.PostgresUnavailable as exc:
        postgres.skip_or_fail(str(exc))
    with database:
        url = postgres.fresh_database(database.admin_url)
        lease = 12.0  # renewed every 4 s: at least 8 s left when the outage begins
        a, b, journal = two_instances(server_factory, tmp_path, url,
                                      AGENTBOX_LEASE_SECONDS=str(lease),
                                      AGENTBOX_WORKER_CONCURRENCY="8")
        run_ids = [server.post(make_event(project_id="sleep-1")).json()["run_id"]
                   for _ in range(24) for server in (a, b)]
        wait_until(lambda: sum(line["kind"] == "start" for line in journal_lines(journal)) >= 16,
                   DEADLINE, "agents to be running on both instances")
        crashed_at = time.time()
        database.crash()
        time.sleep(max(0.0, crashed_at + OUTAGE_SECONDS - time.time()))  # the outage itself
        database.relaunch()
        back_at = time.time()
        finished = [a.wait_terminal(run_id, timeout=DEADLINE) for run_id in run_ids]

    outage = back_at - crashed_at  # 4 to 6 s here: the hold, then the crash recovery
    assert outage < lease * 2 / 3, f"the outage ({outage:.1f} s) outlasted the promise's bound"
    assert {(run["status"], run["attempt"]) for run in finished} == {("succeeded", 1)}
    lines = journal_lines(journal)
    starts = Counter(line["run_id"] for line in lines if line["kind"] == "start")
    assert starts == Counter({run_id: 1 for run_id in run_ids})  # no run ran twice
    waited = [line for line in lines if line["kind"] == "return"
              and crashed_at <= line["t"] <= back_at]
    assert waited, "no agent finished during the outage: the test saw no outcome wait"
