"""A gate before each step of an agent's coroutine (`Gated`; `Rest` for the steps
after a first that `within` took itself).

A task runs a coroutine in steps: it resumes it, the coroutine runs until it
waits on something, and the task resumes it again once that is done. The
dispatcher puts a gate before each resumption of an agent (its lease's fence,
`Dispatcher._hold`): after a pause of the machine, the agent's next step waits
for its lease's renewal, and never runs on a lease another instance took. A
check on a clock per step, and no timer: a pause stops every timer, and the
agent's own may be the first to fire after it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator
from typing import Any, Generic, TypeVar

T = TypeVar("T")

Hold = Callable[[], "asyncio.Future[None] | None"]


class Gated(Generic[T]):
    """`await Gated(awaitable, hold)` is `await awaitable`, except that before each
    step after the first, `hold()` may answer a future to wait for first (None:
    go on). A cancellation, while it waits there or elsewhere, reaches the
    awaitable where it waits, as it would without the gate."""

    def __init__(self, awaitable: Awaitable[T], hold: Hold) -> None:
        self._awaitable, self._hold = awaitable, hold

    def __await__(self) -> Generator[Any, None, T]:
        steps = self._awaitable.__await__()
        try:
            waits_on = steps.send(None)
        except StopIteration as done:  # returned at its first step
            value: T = done.value
            return value
        return (yield from gated(steps, waits_on, self._hold))


class Rest(Generic[T]):
    """The steps of an awaitable after its first (taken by `within`), through the gate
    if there is one (`hold`)."""

    def __init__(self, steps: Generator[Any, None, T], waits_on: Any,
                 hold: Hold | None) -> None:
        self._steps, self._waits_on, self._hold = steps, waits_on, hold

    def __await__(self) -> Generator[Any, None, T]:
        return gated(self._steps, self._waits_on, self._hold)


def gated(steps: Generator[Any, None, T], waits_on: Any,
          hold: Hold | None) -> Generator[Any, None, T]:
    """Hand the task what `steps` waits on; before resuming it, wait while `hold()`
    answers a future (no gate without `hold`); pass on what the task throws (what
    `await` itself does)."""
    try:
        while True:
            try:
                yield waits_on
                while hold is not None and (gate := hold()) is not None:
                    yield from gate.__await__()
            except GeneratorExit:
                steps.close()
                raise
            except BaseException as exc:  # a cancellation: where the awaitable waits
                waits_on = steps.throw(exc)
            else:
                waits_on = steps.send(None)
    except StopIteration as done:  # the awaitable returned
        value: T = done.value
        return value
