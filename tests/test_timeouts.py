"""`within`: asyncio.timeout's deadline, error and cancellation, but a timer only
for work that waits. Each case runs under both, on a real event loop that counts
the timers set."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest

from agentbox.engine.timeouts import within


class CountingLoop(asyncio.SelectorEventLoop):
    """asyncio's own loop, counting the timers set (asyncio.timeout sets one with call_at)."""

    timers = 0

    def call_at(self, when: float, callback: Callable[..., object], *args: Any,
                context: Any = None) -> asyncio.TimerHandle:
        self.timers += 1
        return super().call_at(when, callback, *args, context=context)


def run(main: Callable[[], Coroutine[Any, Any, Any]]) -> tuple[Any, int]:
    """What `main()` returned or raised, and how many timers its loop set."""
    with asyncio.Runner(loop_factory=CountingLoop) as runner:
        loop = runner.get_loop()
        assert isinstance(loop, CountingLoop)
        try:
            outcome: Any = runner.run(main())
        except Exception as exc:
            outcome = type(exc)
        return outcome, loop.timers


async def timeout(seconds: float, work: Awaitable[Any]) -> Any:
    async with asyncio.timeout(seconds):
        return await work


def work(busy: float = 0.0, wait: float | None = None, fail: bool = False
         ) -> Callable[[], Coroutine[Any, Any, str]]:
    """Work that is busy (does not yield) for `busy` s, then waits `wait` s (None:
    not at all), then returns "done" or raises KeyError."""
    async def doing() -> str:
        time.sleep(busy)
        if wait is not None:
            await asyncio.sleep(wait)
        if fail:
            raise KeyError("failed")
        return "done"
    return doing


CASES = [  # (work, seconds, outcome): the same under asyncio.timeout and within
    (work(), 0.5, "done"),
    (work(fail=True), 0.5, KeyError),
    (work(busy=0.1), 0.05, "done"),  # no await: nothing can cut it off
    (work(wait=0.01), 0.5, "done"),
    (work(wait=0.0), 0.5, "done"),  # sleep(0) yields once
    (work(wait=0.01, fail=True), 0.5, KeyError),
    (work(wait=5), 0.05, TimeoutError),
    (work(busy=0.15, wait=0.1), 0.2, TimeoutError),  # the deadline counts from the call
]


@pytest.mark.parametrize(("doing", "seconds", "expected"), CASES)
def test_within_ends_as_asyncio_timeout_does(
        doing: Callable[[], Coroutine[Any, Any, str]], seconds: float, expected: Any) -> None:
    assert run(lambda: timeout(seconds, doing()))[0] == expected
    assert run(lambda: within(seconds, doing()))[0] == expected


def test_a_timer_is_set_only_for_work_that_waits() -> None:
    assert run(lambda: timeout(1, work()()))[1] == 1  # the counter sees asyncio.timeout's
    assert run(lambda: within(1, work()()))[1] == 0
    assert run(lambda: within(1, work(busy=0.01)()))[1] == 0
    assert run(lambda: within(1, work(wait=0.0)()))[1] == 1
    # the work's own sleep is the other timer
    assert run(lambda: within(1, work(wait=0.01)()))[1] == 2


def test_work_cut_off_sees_its_cancellation_and_an_outside_cancel_stays_one() -> None:
    seen: list[str] = []

    async def waiting() -> None:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    async def cut_off() -> None:
        await within(0.01, waiting())

    async def cancelled_from_outside() -> str:
        task = asyncio.ensure_future(within(5, waiting()))
        await asyncio.sleep(0.01)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return "cancelled, not timed out"
        return "finished"

    assert run(cut_off)[0] is TimeoutError
    assert run(cancelled_from_outside)[0] == "cancelled, not timed out"
    assert seen == ["cancelled", "cancelled"]


def test_work_that_catches_its_cut_off_and_returns_gives_its_value() -> None:
    async def stubborn() -> str:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            return "wrapped up"
        return "slept"

    # as with asyncio.timeout: what the work returns once cut off is its value
    assert run(lambda: timeout(0.01, stubborn()))[0] == "wrapped up"
    assert run(lambda: within(0.01, stubborn()))[0] == "wrapped up"
