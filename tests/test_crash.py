"""kill -9 of a real server at several points, then a restart: every run that had a
202 reaches a terminal state, no agent starts after its run was terminal, and no
event gets two runs."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import httpx

from tests.conftest import Server, make_event, wait_until

TERMINAL = ("succeeded", "failed_permanent", "dead_lettered")


def all_runs(server: Server) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = server.client.get("/runs", params={"limit": 500}).json()["runs"]
    return runs


def assert_promise_kept(server: Server, acknowledged: dict[str, str]) -> None:
    """`acknowledged` maps event_id -> run_id of every 202 the senders saw."""
    finished = {run_id: server.wait_terminal(run_id, timeout=60)
                for run_id in acknowledged.values()}
    runs = all_runs(server)
    per_event = Counter(run["event_id"] for run in runs)
    assert max(per_event.values(), default=1) == 1, per_event.most_common(3)
    for event_id, run_id in acknowledged.items():
        assert finished[run_id]["event_id"] == event_id
    # Restart once more and let the dispatcher settle: a terminal run must not start again.
    starts_before = Counter(j["run_id"] for j in server.journal_lines() if j["kind"] == "start")
    server.kill9()
    server.start()
    probe = server.post(make_event(project_id="ok")).json()["run_id"]
    server.wait_terminal(probe)
    starts_after = Counter(j["run_id"] for j in server.journal_lines() if j["kind"] == "start")
    starts_after.pop(probe)
    assert starts_after == starts_before
    for run in all_runs(server):
        if run["run_id"] != probe:
            completed = run["completed_at"]
            assert completed is not None
            assert run["status"] in TERMINAL


def test_kill_mid_agent(server: Server) -> None:
    acknowledged = {}
    for _ in range(12):
        event = make_event(project_id="sleep-1")
        response = server.post(event)
        assert response.status_code == 202
        acknowledged[event["event_id"]] = response.json()["run_id"]
    wait_until(lambda: sum(j["kind"] == "start" for j in server.journal_lines()) >= 12, 10,
               "the agents to start")
    server.kill9()
    server.start()
    assert_promise_kept(server, acknowledged)
    for run_id in acknowledged.values():
        run = server.run(run_id)
        assert run["status"] == "succeeded"
        assert run["retry_count"] == 1  # the killed attempt counts


def test_kill_between_agent_return_and_state_write(server: Server) -> None:
    event = make_event(project_id="slow-return-2")
    run_id = server.post(event).json()["run_id"]
    wait_until(lambda: any(j["kind"] == "return" for j in server.journal_lines()), 10,
               "the agent to return")
    server.kill9()
    server.start()
    run = server.wait_terminal(run_id)
    assert run["status"] == "succeeded" and run["attempt"] == 2
    assert_promise_kept(server, {event["event_id"]: run_id})


def test_kill_during_ingest_under_load(server: Server) -> None:
    acknowledged: dict[str, str] = {}
    sent: list[dict[str, Any]] = []
    lock = threading.Lock()
    stop = threading.Event()

    def sender() -> None:
        while not stop.is_set():
            event = make_event(project_id="ok")
            with lock:
                sent.append(event)
            try:
                response = server.post(event)
            except httpx.TransportError:
                return  # the server died mid-request: the sender does not know
            if response.status_code == 202:
                with lock:
                    acknowledged[event["event_id"]] = response.json()["run_id"]

    threads = [threading.Thread(target=sender) for _ in range(8)]
    for thread in threads:
        thread.start()
    wait_until(lambda: len(acknowledged) >= 150, 30, "150 acknowledged events")
    server.kill9()
    stop.set()
    for thread in threads:
        thread.join(30)
    server.start()
    # Senders retry whatever they sent: acknowledged ones must come back as duplicates.
    for event in sent:
        response = server.post(event)
        assert response.status_code in (200, 202), response.text
        if event["event_id"] in acknowledged:
            assert response.status_code == 200
            assert response.json()["run_id"] == acknowledged[event["event_id"]]
        else:
            acknowledged[event["event_id"]] = response.json()["run_id"]
    assert_promise_kept(server, acknowledged)
