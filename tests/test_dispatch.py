"""How a real server starts runs: claimed as they are accepted when a slot is free,
in acceptance order, never more than AGENTBOX_WORKER_CONCURRENCY agents at once."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from agentbox.engine.dispatcher import Dispatcher
from agentbox.events import parse_event
from agentbox.http.app import AgentboxServer, create_app
from agentbox.store import IngestParams
from agentbox.store.sqlite import SqliteStore
from tests.conftest import (
    Server,
    encode,
    in_process_settings,
    make_event,
    wait_until,
    wait_until_async,
)


def starts_and_returns(server: Server) -> dict[str, tuple[float, float]]:
    """run_id -> (agent start, agent return), from the test agents' journal."""
    spans: dict[str, list[float]] = {}
    for line in server.journal_lines():
        span = spans.setdefault(line["run_id"], [0.0, 0.0])
        span[0 if line["kind"] == "start" else 1] = line["t"]
    return {run_id: (start, end) for run_id, (start, end) in spans.items()}


def post_all(server: Server, events: list[dict[str, Any]]) -> list[str]:
    run_ids = []
    for event in events:
        response = server.post(event)
        assert response.status_code == 202, response.text
        run_ids.append(response.json()["run_id"])
    return run_ids


def test_an_idle_server_claims_the_run_as_it_accepts_it(server: Server) -> None:
    # Idle: past its start, whose first claim round (looking for runs a previous life
    # left) may still be under way when /healthz first answers, on a busy machine.
    warm_up = server.post(make_event(project_id="ok"))
    assert server.wait_terminal(warm_up.json()["run_id"])["status"] == "succeeded"
    response = server.post(make_event(project_id="ok"))
    assert response.status_code == 202
    assert response.json()["runs"][0]["status"] == "accepted"  # the wire answer is unchanged
    run = server.wait_terminal(response.json()["run_id"])
    assert run["status"] == "succeeded"
    # Started in the transaction that accepted it: no claim in between.
    assert run["started_at"] == run["accepted_at"]
    history = server.client.get(f"/runs/{run['run_id']}", params={"history": 1}).json()
    assert [a["attempt"] for a in history["attempts"]] == [1]


def test_no_more_agents_run_at_once_than_the_concurrency(server_factory: Any) -> None:
    server = server_factory({"AGENTBOX_WORKER_CONCURRENCY": "2"}).start()
    events = [make_event(project_id="sleep-0.3") for _ in range(12)]
    with ThreadPoolExecutor(12) as pool:
        responses = list(pool.map(server.post, events))
    assert [r.status_code for r in responses] == [202] * 12
    for response in responses:
        assert server.wait_terminal(response.json()["run_id"])["status"] == "succeeded"
    spans = starts_and_returns(server)
    assert len(spans) == 12
    running_at_each_start = [sum(1 for s, e in spans.values() if s <= start < e)
                             for start, _ in spans.values()]
    assert max(running_at_each_start) == 2, running_at_each_start


def test_runs_start_in_the_order_they_were_accepted(server_factory: Any) -> None:
    # One slot: the first event's run starts at once, the next ones wait (some claimed
    # ahead, the rest accepted), and none overtakes an earlier one.
    server = server_factory({"AGENTBOX_WORKER_CONCURRENCY": "1"}).start()
    run_ids = post_all(server, [make_event(project_id="sleep-0.1") for _ in range(10)])
    for run_id in run_ids:
        server.wait_terminal(run_id)
    spans = starts_and_returns(server)
    assert sorted(spans, key=lambda run_id: spans[run_id][0]) == run_ids


def test_new_events_are_not_claimed_ahead_of_runs_already_waiting(tmp_path: Path) -> None:
    """In-process, to see the moment a lease is asked for: runs left waiting in the
    store (by a previous process, say) go first; only an idle dispatcher that knows
    nothing is waiting claims new runs as they are accepted."""
    settings = in_process_settings(tmp_path)

    async def scenario() -> None:
        app = create_app(settings, admin_token="t")
        dispatcher: Dispatcher = app.state.dispatcher
        [agent] = dispatcher.registry.for_event_type("session.exported")
        body = encode(make_event(project_id="sleep-0.05"))
        waiting = SqliteStore(settings.database_path)
        await waiting.open()
        for _ in range(6):  # accepted while no dispatcher ran
            body = encode(make_event(project_id="sleep-0.05"))
            await waiting.ingest(IngestParams(event=parse_event(body), body=body,
                                              agents=[agent.name], now=time.time(), ttl=60,
                                              max_pending=100))
        await waiting.close()
        assert dispatcher.lease_for(1) is None  # not yet looked at the store
        async with app.router.lifespan_context(app):
            store: SqliteStore = app.state.store
            deadline = time.monotonic() + 20
            asked = 0
            while (await store.stats())["runs"]["accepted"]:  # older runs wait
                lease = dispatcher.lease_for(1)
                dispatcher.started(parse_event(body), lease, 1, None)
                assert lease is None
                asked += 1
                assert time.monotonic() < deadline, "the waiting runs were never claimed"
                await asyncio.sleep(0.005)
            assert asked  # the store did hold waiting runs
            while (await store.stats())["runs"]["succeeded"] < 6:
                assert time.monotonic() < deadline, await store.stats()
                await asyncio.sleep(0.01)
            lease = dispatcher.lease_for(1)  # idle, nothing waiting: claim as accepted
            assert lease is not None and lease.owner == dispatcher.owner
            dispatcher.started(parse_event(body), lease, 1, None)

    asyncio.run(scenario())


def test_claimed_runs_not_started_by_shutdown_run_after_the_restart_as_attempt_1(
        server_factory: Any) -> None:
    server = server_factory({"AGENTBOX_WORKER_CONCURRENCY": "1",
                             "AGENTBOX_SHUTDOWN_GRACE_SECONDS": "10"}).start()
    run_ids = post_all(server, [make_event(project_id="sleep-0.5") for _ in range(4)])
    # One agent runs; the other three are claimed here too, waiting for its slot.
    wait_until(lambda: all(server.run(run_id)["status"] == "processing" for run_id in run_ids),
               5, "the four runs to be claimed")
    assert server.stop() in (0, -signal.SIGTERM)
    assert [line["run_id"] for line in server.journal_lines() if line["kind"] == "start"] == [
        run_ids[0]]  # the running agent finished; the waiting ones did not start
    # Their last log line said processing: the log says where they are now.
    said = [json.loads(line) for line in server.log_path.read_text().splitlines()
            if line.startswith("{") and "are given back" in line]
    assert [line["runs"] for line in said] == [3]
    server.start()
    for run_id in run_ids:
        assert server.wait_terminal(run_id)["status"] == "succeeded"
    starts = [(line["run_id"], line["attempt"]) for line in server.journal_lines()
              if line["kind"] == "start"]
    # The waiting runs gave their attempt back: it is neither lost nor counted.
    assert starts == [(run_id, 1) for run_id in run_ids]
    for run_id in run_ids[1:]:
        history = server.client.get(f"/runs/{run_id}", params={"history": 1}).json()
        assert [(a["attempt"], a["outcome"]) for a in history["attempts"]] == [(1, "succeeded")]
        assert history["retry_count"] == 0


async def cancel_a_request_whose_write_is_queued(app: AgentboxServer) -> None:
    """Send an event in-process, its run to be stored claimed, and cancel its request
    once its write is queued."""
    store: SqliteStore = app.state.store
    dispatcher: Dispatcher = app.state.dispatcher
    body = encode(make_event(project_id="ok"))
    lease = await wait_until_async(lambda: dispatcher.lease_for(1), 5,
                                   "the dispatcher to know nothing waits")
    dispatcher.started(parse_event(body), lease, 1, None)  # given back unused
    request = asyncio.create_task(app.state.receiver._store(parse_event(body), body))
    # The event's write waits for the next batch.
    await wait_until_async(lambda: store._queue, 5, "the write to be queued", interval=0)
    assert dispatcher._reserved == 1  # its run is being stored claimed
    request.cancel()
    try:
        await request
        raise AssertionError("the request was not cancelled")
    except asyncio.CancelledError:
        pass


async def wait_for_succeeded(store: SqliteStore, count: int) -> list[dict[str, Any]]:
    async def succeeded() -> bool:
        return bool((await store.stats())["runs"]["succeeded"] >= count)

    await wait_until_async(succeeded, 10, f"{count} runs to succeed")
    return await store.list_runs(None, count)


def test_a_request_cancelled_while_its_write_commits_still_starts_its_runs(
        tmp_path: Path) -> None:
    """A write queued before the request was cancelled (a shutdown, a dropped
    connection) commits; its runs, stored claimed, must start now, not wait leased
    for the lease (60 s) to run out and then run as a second attempt."""
    settings = in_process_settings(tmp_path)

    async def scenario() -> None:
        app = create_app(settings, admin_token="t")
        async with app.router.lifespan_context(app):
            await cancel_a_request_whose_write_is_queued(app)
            [run] = await wait_for_succeeded(app.state.store, 1)
            assert run["attempt"] == 1

    asyncio.run(scenario())


def test_a_write_still_committing_at_shutdown_runs_its_event_once_as_attempt_1(
        tmp_path: Path) -> None:
    """The server's shutdown cancels a request whose write is queued: the shutdown
    waits for that write, so its run either runs now or is given back, and after a
    restart it has run exactly once, as attempt 1 (no lost attempt recorded)."""
    settings = in_process_settings(tmp_path)

    async def scenario() -> None:
        app = create_app(settings, admin_token="t")
        async with app.router.lifespan_context(app):
            await cancel_a_request_whose_write_is_queued(app)
        again = create_app(settings, admin_token="t")
        async with again.router.lifespan_context(again):
            [run] = await wait_for_succeeded(again.state.store, 1)
            assert [a["attempt"] for a in await again.state.store.attempts(run["run_id"])] == [1]

    asyncio.run(scenario())


@pytest.mark.parametrize("taken_by", ["another instance", "this instance"])
def test_a_run_whose_lease_ran_out_while_it_waited_for_a_slot_does_not_start(
        tmp_path: Path, monkeypatch: Any, taken_by: str) -> None:
    """Two runs claimed, one slot: while the first runs, the second's lease runs out
    unrenewed (the clock jumps past it, as in a storage outage that stops the
    heartbeats). Claimed again by another instance, the stale claim must not start
    when the slot frees: the agent would run twice for one attempt's worth of work.
    This instance's own claim loop takes neither back: it renews them first, and
    both run once, as attempt 1."""
    journal = tmp_path / "journal.jsonl"
    monkeypatch.setenv("AGENTBOX_TEST_JOURNAL", str(journal))
    settings = in_process_settings(tmp_path, AGENTBOX_LEASE_SECONDS="30")
    offset = [0.0]

    def clock() -> float:
        return time.time() + offset[0]

    async def scenario() -> None:
        app = create_app(settings, admin_token="t", clock=clock)
        async with app.router.lifespan_context(app):
            store: SqliteStore = app.state.store
            receiver = app.state.receiver
            # The first agent runs long enough for the claims below to land meanwhile.
            first, second = (encode(make_event(project_id=p)) for p in ("sleep-2", "ok"))
            await receiver._store(parse_event(first), first)
            await receiver._store(parse_event(second), second)  # waits for the slot
            await wait_until_async(journal.exists, 5, "the first agent to start")
            dispatcher = app.state.dispatcher
            await wait_until_async(lambda: len(dispatcher._inflight) == 2, 5,
                                   "the second run to be claimed, waiting for the slot")
            offset[0] = 31.0  # both leases ran out, unrenewed
            [waiting] = [run_id for run_id in dispatcher._inflight
                         if not any(run_id in line for line in journal.read_text().splitlines())]
            if taken_by == "another instance":
                other = await store.claim("other-instance", 2, clock(), 30, 10)
                assert len(other.claimed) == 2
                await wait_until_async(lambda: not dispatcher._held, 5,
                                       "the waiting run to leave")
                runs = await store.list_runs(None, 10)
                assert sorted((r["attempt"], r["status"]) for r in runs) == [
                    (2, "processing"), (2, "processing")]  # the other instance's attempts
            else:
                dispatcher.wake()  # this instance's claim loop renews both, claims neither
                await wait_for_succeeded(store, 2)
                runs = await store.list_runs(None, 10)
                assert sorted((r["attempt"], r["status"]) for r in runs) == [
                    (1, "succeeded"), (1, "succeeded")]
            starts = [json.loads(line) for line in journal.read_text().splitlines()
                      if '"start"' in line]
            # The waiting run never started under a claim it had lost.
            assert [s["attempt"] for s in starts if s["run_id"] == waiting] == (
                [] if taken_by == "another instance" else [1])

    asyncio.run(scenario())
