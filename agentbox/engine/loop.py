"""The one shape of a background loop: start, stop, wake, a due time, a test signal.

The dispatcher's claims, its lease renewals and upkeep, the callback deliverer
and the subscriptions' upkeep are each a `Loop`: a task that runs its `step`
again and again. A step does one round of work and says when the next round is
due: `AGAIN` (at once: more may be waiting), a time on the loop's clock, or
`IDLE` (nothing known: until woken). Between rounds the loop sleeps until that
time, or until `wake()` (new work, a finished one, another instance's notice)
or `due(at)` (a sooner due time, e.g. an attempt's lease end) cuts it short.

`max_wait` bounds every sleep: a net for what no wake-up reports. A loop with
no net (None) sets no timer while idle, so a quiet process stays asleep.
A failing round is retried after `retry` seconds (`RETRY_SECONDS` unless the
loop names its own), or sooner when woken:
`StorageUnavailable` quietly, anything else, a bug, with its traceback logged.

`rounds` counts the rounds done: tests wait on it (`rounds.past(n)`) instead
of sleeping.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from agentbox.logs import get_logger
from agentbox.store import StorageUnavailable

log = get_logger("loop")

AGAIN = -math.inf  # a step's answer: run the next round at once
IDLE: float | None = None  # a step's answer: nothing due; sleep until woken (or max_wait)
# A due time already past still yields this long: a store that keeps reporting a past
# due time it cannot serve (a bug) makes a slow poll, not a busy loop.
MIN_WAIT_SECONDS = 0.001
RETRY_SECONDS = 1.0  # after a failed round: the storage away, or a bug
DEFAULT_MAX_WAIT_SECONDS = 60.0  # the net for a loop that names none

Step = Callable[[], Awaitable[float | None]]


class Signal:
    """A count of what happened, that tests can wait on (with their own deadline)."""

    def __init__(self) -> None:
        self.count = 0
        self._changed: asyncio.Future[None] | None = None  # made only while someone waits

    def fire(self) -> None:
        self.count += 1
        if self._changed is not None:
            if not self._changed.done():
                self._changed.set_result(None)
            self._changed = None

    async def past(self, count: int) -> int:
        """Wait until the count is past `count`; the count then."""
        while self.count <= count:
            if self._changed is None:
                self._changed = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._changed)
        return self.count


class Loop:
    """One background loop (see the module's docstring)."""

    def __init__(self, name: str, step: Step, *, max_wait: float | None = DEFAULT_MAX_WAIT_SECONDS,
                 clock: Callable[[], float] = time.monotonic,
                 failure: str | None = None, retry: float = RETRY_SECONDS) -> None:
        self.name = name
        self.clock = clock  # what due times are read on
        self.max_wait = max_wait
        self.rounds = Signal()  # the test signal: one per round done
        self._step = step
        self._failure = failure or f"{name} failed"
        self._retry = retry
        self._woken = False
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._sleeper: asyncio.Future[None] | None = None  # while asleep
        self._timer: asyncio.TimerHandle | None = None
        self._until = math.inf  # when the current sleep ends (loop time)

    # -- life cycle -----------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        """End the loop, the round in progress included."""
        self._stopping = True
        self.wake()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    @property
    def stopping(self) -> bool:
        return self._stopping

    # -- being told ----------------------------------------------------------------------

    def wake(self) -> None:
        """Run a round soon: at once if asleep, else right after the one in progress."""
        self._woken = True
        if self._sleeper is not None and not self._sleeper.done():
            self._sleeper.set_result(None)

    @property
    def woken(self) -> bool:
        """Whether `wake()` was called since the current round began."""
        return self._woken

    def due(self, at: float) -> None:
        """Run a round by `at` (the loop's clock) at the latest: a sleep that would end
        later ends then. A round in progress answers for itself."""
        if self._sleeper is None or self._sleeper.done():
            return
        loop = asyncio.get_running_loop()
        until = loop.time() + max(MIN_WAIT_SECONDS, at - self.clock())
        if until < self._until:
            self._set_timer(loop, until)

    # -- running ------------------------------------------------------------------------

    async def _run(self) -> None:
        while not self._stopping:
            self._woken = False
            due = await self._round()
            self.rounds.fire()
            if due != AGAIN and not self._woken and not self._stopping:
                await self._sleep(due)

    async def _round(self) -> float | None:
        try:
            return await self._step()
        except StorageUnavailable:
            return self.clock() + self._retry
        except Exception:  # a bug: say so loudly, but keep the loop alive
            log.exception(self._failure)
            return self.clock() + self._retry

    async def _sleep(self, due: float | None) -> None:
        wait = self.max_wait if due is None else max(MIN_WAIT_SECONDS, due - self.clock())
        if self.max_wait is not None and wait is not None:
            wait = min(wait, self.max_wait)
        loop = asyncio.get_running_loop()
        self._sleeper = loop.create_future()
        if wait is not None:
            self._set_timer(loop, loop.time() + wait)
        try:
            await self._sleeper
        finally:
            self._sleeper = None
            self._until = math.inf
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def _set_timer(self, loop: asyncio.AbstractEventLoop, until: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._until = until
        self._timer = loop.call_at(until, self._ring)

    def _ring(self) -> None:
        if self._sleeper is not None and not self._sleeper.done():
            self._sleeper.set_result(None)


class Service(Protocol):
    """What the server starts after the store opens and stops before it closes."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class Services:
    """Background services started in order and stopped in the reverse order, each
    awaited (River's start/stop list). A start that fails stops those already
    started, then raises; a stop that fails is logged and the rest still stop."""

    def __init__(self, services: Sequence[tuple[str, Service]]) -> None:
        self._services = list(services)
        self._started: list[tuple[str, Service]] = []

    @property
    def started(self) -> list[str]:
        return [name for name, _ in self._started]

    async def start(self) -> None:
        for name, service in self._services:
            try:
                await service.start()
            except BaseException:
                await self.stop()
                raise
            self._started.append((name, service))

    async def stop(self) -> None:
        while self._started:
            name, service = self._started.pop()
            try:
                await service.stop()
            except Exception:
                log.exception(f"{name} failed to stop")
