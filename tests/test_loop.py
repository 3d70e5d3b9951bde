"""The one background-loop shape (agentbox.engine.loop): rounds run when due, when
woken, or at once when a round asks; a failing round is retried; stop ends it.
The tests wait on the loop's test signal (`rounds`), never on a sleep of their own."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from agentbox.engine.loop import AGAIN, IDLE, Loop, Services
from agentbox.store import StorageUnavailable

DEADLINE = 5.0  # far beyond any round here: a hang fails, a slow machine does not
NEVER = 3600.0  # a due time, or a net, no test waits out


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), DEADLINE))


def test_a_round_that_asks_runs_again_at_once_then_sleeps_until_woken() -> None:
    answers = [AGAIN, AGAIN, IDLE, IDLE]

    async def step() -> float | None:
        return answers.pop(0)

    async def scenario() -> None:
        loop = Loop("test", step, max_wait=NEVER)
        loop.start()
        await loop.rounds.past(2)  # the two AGAINs and the first IDLE
        assert loop.rounds.count == 3 and len(answers) == 1  # asleep: no fourth round
        loop.wake()
        await loop.rounds.past(3)
        assert answers == []
        await loop.stop()

    run(scenario)


def test_a_due_time_ends_the_sleep_and_due_brings_it_forward() -> None:
    now = [1000.0]

    async def step() -> float | None:
        return now[0] + NEVER  # by the clock, the next round is an hour away

    async def scenario() -> None:
        loop = Loop("test", step, clock=lambda: now[0], max_wait=NEVER)
        loop.start()
        await loop.rounds.past(0)
        loop.due(now[0] + 0.01)  # e.g. a lease that ends sooner
        await loop.rounds.past(1)
        loop.due(now[0] + NEVER * 2)  # later than the sleep's end: changes nothing
        assert loop.rounds.count == 2
        await loop.stop()

    run(scenario)


def test_a_due_time_already_past_runs_the_next_round_soon() -> None:
    async def step() -> float | None:
        return 0.0  # long past on the monotonic clock

    async def scenario() -> None:
        loop = Loop("test", step, max_wait=NEVER)
        loop.start()
        await loop.rounds.past(3)
        await loop.stop()

    run(scenario)


def test_a_wake_during_a_round_runs_another_round_after_it() -> None:
    entered, release = asyncio.Event(), asyncio.Event()

    async def step() -> float | None:
        entered.set()
        await release.wait()
        return IDLE

    async def scenario() -> None:
        loop = Loop("test", step, max_wait=NEVER)
        loop.start()
        await entered.wait()
        loop.wake()  # news the round in progress may have missed
        assert loop.woken
        release.set()
        await loop.rounds.past(1)  # the second round ran without another wake
        await loop.stop()

    run(scenario)


@pytest.mark.parametrize("failure", [StorageUnavailable("away"), ValueError("a bug")])
def test_a_failing_round_is_retried(failure: Exception, caplog: Any) -> None:
    calls = []

    async def step() -> float | None:
        calls.append(1)
        if len(calls) == 1:
            raise failure
        return IDLE

    async def scenario() -> None:
        loop = Loop("test", step, max_wait=NEVER, failure="testing failed", retry=0.01)
        loop.start()
        await loop.rounds.past(1)
        assert len(calls) == 2
        await loop.stop()

    with caplog.at_level(logging.ERROR, logger="agentbox"):
        run(scenario)
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert said == ([] if isinstance(failure, StorageUnavailable) else ["testing failed"])


def test_a_loop_without_a_net_sets_no_timer_while_idle() -> None:
    async def step() -> float | None:
        return IDLE

    async def scenario() -> None:
        loop = Loop("test", step, max_wait=None)
        loop.start()
        await loop.rounds.past(0)
        await asyncio.sleep(0)  # into its sleep
        assert loop._timer is None  # nothing wakes a quiet process
        loop.due(loop.clock() + NEVER)
        assert loop._timer is not None  # until it is told a due time
        await loop.stop()

    run(scenario)


def test_stop_ends_a_round_in_progress() -> None:
    entered = asyncio.Event()

    async def step() -> float | None:
        entered.set()
        await asyncio.Event().wait()  # never returns by itself
        return IDLE

    async def scenario() -> None:
        loop = Loop("test", step)
        loop.start()
        await entered.wait()
        await loop.stop()
        assert loop.stopping

    run(scenario)


# -- the server's list of services (loop.Services) -------------------------------------------


class Told:
    """A service that says when it starts and stops, in a shared diary."""

    def __init__(self, name: str, diary: list[str], fail: str = "") -> None:
        self.name, self.diary, self.fail = name, diary, fail

    async def start(self) -> None:
        await asyncio.sleep(0)  # awaited: the next one starts after this one has
        if self.fail == "start":
            raise RuntimeError(f"{self.name} cannot start")
        self.diary.append(f"start {self.name}")

    async def stop(self) -> None:
        await asyncio.sleep(0)
        self.diary.append(f"stop {self.name}")
        if self.fail == "stop":
            raise RuntimeError(f"{self.name} cannot stop")


def test_services_start_in_order_and_stop_in_reverse_each_awaited() -> None:
    diary: list[str] = []
    services = Services([(name, Told(name, diary)) for name in ("app", "callbacks",
                                                                "dispatcher")])

    async def scenario() -> None:
        await services.start()
        assert services.started == ["app", "callbacks", "dispatcher"]
        await services.stop()
        assert services.started == []
        await services.stop()  # twice: nothing more

    run(scenario)
    assert diary == ["start app", "start callbacks", "start dispatcher",
                     "stop dispatcher", "stop callbacks", "stop app"]


def test_a_start_that_fails_stops_those_started_and_raises() -> None:
    diary: list[str] = []
    services = Services([("app", Told("app", diary)), ("callbacks", Told("callbacks", diary)),
                         ("dispatcher", Told("dispatcher", diary, fail="start")),
                         ("retention", Told("retention", diary))])

    async def scenario() -> None:
        with pytest.raises(RuntimeError, match="dispatcher cannot start"):
            await services.start()

    run(scenario)
    assert diary == ["start app", "start callbacks", "stop callbacks", "stop app"]


def test_a_stop_that_fails_is_logged_and_the_rest_still_stop(
        caplog: pytest.LogCaptureFixture) -> None:
    diary: list[str] = []
    services = Services([("app", Told("app", diary)),
                         ("callbacks", Told("callbacks", diary, fail="stop")),
                         ("dispatcher", Told("dispatcher", diary))])

    async def scenario() -> None:
        await services.start()
        with caplog.at_level(logging.ERROR):
            await services.stop()

    run(scenario)
    assert diary[3:] == ["stop dispatcher", "stop callbacks", "stop app"]
    assert any("callbacks failed to stop" in record.getMessage() for record in caplog.records)
