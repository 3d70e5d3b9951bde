"""A lost lease stops the agent, a lease only overdue is renewed: the dispatcher
fences every running agent by its lease. In process, on a real SQLite file: the
process paused past the lease (its event loop blocked, as SIGSTOP or a stalled VM
would) goes on, its lease renewed; a lease another claim took is found by the
renewal at the fence, or by the next heartbeat, and cancels the agent."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from agentbox import portable
from agentbox.engine import dispatcher as dispatching
from agentbox.engine.dispatcher import Dispatcher, InFlight
from agentbox.events import parse_event
from agentbox.http.app import create_app
from agentbox.store import RunView
from agentbox.store.sqlite import SqliteStore
from tests.conftest import encode, in_process_settings, make_event, wait_until_async

DEADLINE = 20.0  # for each condition waited on: far above what any should take


def journal_of(path: Path, run_id: str) -> list[tuple[str, int, bool]]:
    """(kind, attempt, lease_lost) of the test agent's journal lines for `run_id`."""
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [(line["kind"], line["attempt"], line["lease_lost"])
            for line in lines if line["run_id"] == run_id]


def lease_lost_warnings(caplog: pytest.LogCaptureFixture) -> list[tuple[str, int]]:
    """(run_id, attempt) of each WARNING that said an attempt lost its lease."""
    return [(getattr(record, "run_id", ""), getattr(record, "attempt", 0))
            for record in caplog.records if record.levelno == logging.WARNING
            and getattr(record, "reason", None) == "lease_lost"]


@pytest.mark.parametrize("first", ["agent", "claim"])
def test_a_pause_past_the_lease_renews_it_and_the_agent_goes_on(
        first: str, tmp_path: Path, monkeypatch: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Nobody took the lease while the process stood still: at resume it is renewed
    and attempt 1 runs to its end. With `first` "claim", the claim loop is the
    first to run at resume: it must not take the run from its own agent."""
    journal = tmp_path / "journal.jsonl"
    monkeypatch.setenv("AGENTBOX_TEST_JOURNAL", str(journal))
    lease = 1.0
    settings = in_process_settings(tmp_path, AGENTBOX_LEASE_SECONDS=str(lease))

    async def scenario() -> str:
        app = create_app(settings, admin_token="t")
        async with app.router.lifespan_context(app):
            store: SqliteStore = app.state.store
            dispatcher: Dispatcher = app.state.dispatcher
            body = encode(make_event(project_id="sleep-2"))
            run_id = (await app.state.receiver._store(parse_event(body), body)).runs[0].run_id
            await wait_until_async(lambda: journal_of(journal, run_id), DEADLINE,
                                   "the agent to start")
            if first == "claim":
                dispatcher.wake()  # ready before any timer when the loop runs again
            time.sleep(lease * 2.5)  # the whole process stalls: no heartbeat renews
            run = await wait_until_async(lambda: _succeeded(store, run_id), DEADLINE,
                                         "the run to succeed")
            assert run.attempt == 1
            assert journal_of(journal, run_id) == [("start", 1, False), ("return", 1, False)]
            return run_id

    with caplog.at_level(logging.WARNING, logger="agentbox"):
        asyncio.run(scenario())
    assert lease_lost_warnings(caplog) == []


def test_a_lease_taken_during_a_pause_cancels_the_agent_before_its_next_step(
        tmp_path: Path, monkeypatch: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Another instance took the run while this one stood still (its steady clock
    moved past the lease's end, its heartbeat far off): the agent's next step
    waits for the renewal, which finds the lease taken, and is never taken."""
    journal = tmp_path / "journal.jsonl"
    monkeypatch.setenv("AGENTBOX_TEST_JOURNAL", str(journal))
    lease = 60.0  # the next heartbeat is 20 s away: the renewal at the fence decides
    settings = in_process_settings(tmp_path, AGENTBOX_LEASE_SECONDS=str(lease))

    async def scenario() -> str:
        app = create_app(settings, admin_token="t")
        async with app.router.lifespan_context(app):
            store: SqliteStore = app.state.store
            body = encode(make_event(project_id="sleep-1"))
            run_id = (await app.state.receiver._store(parse_event(body), body)).runs[0].run_id
            await wait_until_async(lambda: journal_of(journal, run_id), DEADLINE,
                                   "the agent to start")
            taken = await store.claim("another-instance", 1, time.time() + lease * 2, lease, 10)
            assert [run.attempt for run in taken.claimed] == [2]
            since_boot = portable.since_boot
            monkeypatch.setattr(portable, "since_boot", lambda: since_boot() + lease * 2)
            await wait_until_async(lambda: len(journal_of(journal, run_id)) == 2, DEADLINE,
                                   "the agent to be cancelled")
            assert journal_of(journal, run_id) == [("start", 1, False), ("raise", 1, True)]
            run = await store.get_run(run_id)
            assert run is not None
            assert (run.status, run.attempt) == ("processing", 2)  # the other's
            return run_id

    with caplog.at_level(logging.WARNING, logger="agentbox"):
        run_id = asyncio.run(scenario())
    assert lease_lost_warnings(caplog) == [(run_id, 1)]


async def _succeeded(store: SqliteStore, run_id: str) -> RunView | None:
    run = await store.get_run(run_id)
    return run if run is not None and run.status == "succeeded" else None


def test_a_lease_taken_by_another_claim_cancels_the_agent_within_a_heartbeat(
        tmp_path: Path, monkeypatch: Any, caplog: pytest.LogCaptureFixture) -> None:
    journal = tmp_path / "journal.jsonl"
    monkeypatch.setenv("AGENTBOX_TEST_JOURNAL", str(journal))
    lease = 3.0
    settings = in_process_settings(tmp_path, AGENTBOX_LEASE_SECONDS=str(lease))

    async def scenario() -> str:
        app = create_app(settings, admin_token="t")
        async with app.router.lifespan_context(app):
            store: SqliteStore = app.state.store
            dispatcher: Dispatcher = app.state.dispatcher
            body = encode(make_event(project_id="sleep-30"))
            run_id = (await app.state.receiver._store(parse_event(body), body)).runs[0].run_id
            await wait_until_async(lambda: journal_of(journal, run_id), DEADLINE,
                                   "the agent to start")
            # Another instance whose clock is past this lease's end takes the run.
            taken = await store.claim("another-instance", 1, time.time() + lease * 2, lease, 10)
            assert [run.attempt for run in taken.claimed] == [2]
            beats = dispatcher.heartbeat.rounds.count
            await wait_until_async(lambda: len(journal_of(journal, run_id)) == 2, DEADLINE,
                                   "the agent to be cancelled")
            assert journal_of(journal, run_id) == [("start", 1, False), ("raise", 1, True)]
            # Found by the first heartbeat after the claim (or the one in progress).
            assert dispatcher.heartbeat.rounds.count <= beats + 2
            run = await store.get_run(run_id)
            assert run is not None
            assert (run.status, run.attempt) == ("processing", 2)  # the other's
            return run_id

    with caplog.at_level(logging.WARNING, logger="agentbox"):
        run_id = asyncio.run(scenario())
    assert lease_lost_warnings(caplog) == [(run_id, 1)]


def test_an_outcome_waiting_for_the_storage_is_tried_again_before_its_lease_ends(
        monkeypatch: Any) -> None:
    """The retry schedule of an outcome the storage refused (`_record`): whenever the
    storage comes back before the lease's end, the next try falls before that end too,
    however long the backoff had grown; past the end, tries stay frequent."""
    now = [1000.0]
    monkeypatch.setattr(portable, "since_boot", lambda: now[0])
    lease = 10.0
    attempt = InFlight(task=None, ctx=None, leased_until=0.0, fence=now[0] + lease)  # type: ignore[arg-type]
    tries, backoff = [now[0]], dispatching.RECORD_RETRY_SECONDS
    while now[0] < attempt.fence + 5:
        now[0] += dispatching._within_lease(backoff, attempt)
        backoff = min(backoff * 2, dispatching.RECORD_RETRY_MAX_SECONDS)
        tries.append(now[0])
    before_end = [t for t in tries if t < attempt.fence]
    for back in (attempt.fence - lease + step / 10 for step in range(int(lease * 10) - 1)):
        assert any(back <= t < attempt.fence for t in before_end), back  # lands in time
    gaps_after = [b - a for a, b in itertools.pairwise(tries) if a >= attempt.fence]
    assert gaps_after and max(gaps_after) <= dispatching.RECORD_RETRY_LATE_SECONDS
