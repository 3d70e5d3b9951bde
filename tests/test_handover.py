"""The receiver's hand-over to the dispatcher (agentbox.engine.handover): every lease
asked for is settled by exactly one `started`, whatever becomes of the write —
committed, failed, or its request cancelled while it goes on. No lease is left
reserved, no run is started twice. A real app in process, on a real SQLite file."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from agentbox.engine.dispatcher import Dispatcher
from agentbox.engine.handover import Handover
from agentbox.events import Event, parse_event
from agentbox.http.app import create_app
from agentbox.store import IngestResult, Lease, StorageUnavailable
from agentbox.store.sqlite import SqliteStore
from tests.conftest import encode, in_process_settings, make_event, wait_until_async

DEADLINE = 10.0


class Settled:
    """The dispatcher's `started` calls, as (a lease was handed out, what was stored)."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.calls: list[tuple[bool, IngestResult | None]] = []
        started = dispatcher.started

        def record(event: Event, lease: Lease | None, runs: int,
                   result: IngestResult | None) -> None:
            self.calls.append((lease is not None, result))
            started(event, lease, runs, result)

        dispatcher.started = record  # type: ignore[method-assign]


def in_app(tmp_path: Path, monkeypatch: Any,
           scenario: Callable[[Any, Handover, Settled], Awaitable[None]]) -> list[dict[str, Any]]:
    """Run `scenario` in a started app whose dispatcher is idle (a new event's run is
    stored claimed); the test agents' journal lines after it stopped."""
    journal = tmp_path / "journal.jsonl"
    monkeypatch.setenv("AGENTBOX_TEST_JOURNAL", str(journal))
    settings = in_process_settings(tmp_path)

    async def run() -> None:
        app = create_app(settings, admin_token="t")
        async with app.router.lifespan_context(app):
            dispatcher: Dispatcher = app.state.dispatcher
            lease = await wait_until_async(lambda: dispatcher.lease_for(1), DEADLINE,
                                           "the dispatcher to know nothing waits")
            dispatcher.started(parse_event(encode(make_event())), lease, 1, None)  # unused
            await scenario(app, app.state.receiver.handover, Settled(dispatcher))
            assert dispatcher._reserved == 0  # no lease left reserved

    asyncio.run(asyncio.wait_for(run(), DEADLINE * 3))
    if not journal.exists():
        return []
    return [json.loads(line) for line in journal.read_text().splitlines()]


async def succeeded(store: SqliteStore, count: int) -> None:
    async def done() -> bool:
        return bool((await store.stats())["runs"]["succeeded"] >= count)

    await wait_until_async(done, DEADLINE, f"{count} runs to succeed")


def starts(journal: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(line["run_id"], line["attempt"]) for line in journal if line["kind"] == "start"]


def test_a_request_cancelled_mid_write_hands_its_runs_over_once(tmp_path: Path,
                                                                 monkeypatch: Any) -> None:
    async def scenario(app: Any, handover: Handover, settled: Settled) -> None:
        store: SqliteStore = app.state.store
        body = encode(make_event(project_id="ok"))
        request = asyncio.create_task(app.state.receiver._store(parse_event(body), body))
        await wait_until_async(lambda: store._queue, DEADLINE, "the write to be queued",
                               interval=0)
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        await handover.settle(DEADLINE)
        assert handover.writing == 0
        await succeeded(store, 1)
        [(leased, result)] = settled.calls
        assert leased and result is not None and len(result.claimed) == 1

    journal = in_app(tmp_path, monkeypatch, scenario)
    assert [attempt for _, attempt in starts(journal)] == [1]  # started once, not twice


@pytest.mark.parametrize("failure", [StorageUnavailable("the disk is full"),
                                     RuntimeError("a bug in the write")])
def test_a_failed_write_gives_its_lease_back_and_starts_nothing(
        tmp_path: Path, monkeypatch: Any, failure: Exception) -> None:
    async def scenario(app: Any, handover: Handover, settled: Settled) -> None:
        async def write(lease: Lease | None) -> IngestResult:
            assert lease is not None  # the runs would have been stored claimed
            await asyncio.sleep(0)
            raise failure

        event = parse_event(encode(make_event(project_id="ok")))
        with pytest.raises(type(failure)):
            await handover.store(event, 1, write)
        assert settled.calls == [(True, None)]
        assert handover.writing == 0

    assert starts(in_app(tmp_path, monkeypatch, scenario)) == []


def test_a_cancelled_request_whose_write_then_fails_settles_once(tmp_path: Path,
                                                                 monkeypatch: Any) -> None:
    async def scenario(app: Any, handover: Handover, settled: Settled) -> None:
        release = asyncio.Event()

        async def write(lease: Lease | None) -> IngestResult:
            await release.wait()
            raise StorageUnavailable("gone meanwhile")

        event = parse_event(encode(make_event(project_id="ok")))
        request = asyncio.create_task(handover.store(event, 1, write))
        await wait_until_async(lambda: handover.writing, DEADLINE, "the write to begin",
                               interval=0)
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        assert settled.calls == []  # the write goes on: not settled yet
        release.set()
        await handover.settle(DEADLINE)
        assert settled.calls == [(True, None)]
        assert handover.writing == 0

    assert starts(in_app(tmp_path, monkeypatch, scenario)) == []


def test_a_failing_listener_still_starts_the_runs(tmp_path: Path, monkeypatch: Any) -> None:
    async def scenario(app: Any, handover: Handover, settled: Settled) -> None:
        def stored(event: Event, result: IngestResult) -> None:
            raise RuntimeError("a bug in what is told of the write")

        handover.stored = stored
        body = encode(make_event(project_id="ok"))
        await app.state.receiver._store(parse_event(body), body)
        await succeeded(app.state.store, 1)
        [(leased, result)] = settled.calls
        assert leased and result is not None

    assert len(starts(in_app(tmp_path, monkeypatch, scenario))) == 1
