"""`within`: `asyncio.timeout` for work that usually finishes without waiting.

A request's body has normally arrived with its headers, and many agents return
without waiting on anything. A timeout can only cut work off where it waits
(the loop runs no timer while a task runs), so such work needs no timer at all:
`within` takes the first step itself and sets the timer, for the same deadline,
only if that step stopped to wait. The receiver (a body's deadline) and the
dispatcher (a run's) would otherwise each set and cancel a timer per event.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from agentbox.engine.gate import Hold, Rest

T = TypeVar("T")


async def within(seconds: float, awaitable: Awaitable[T], hold: Hold | None = None) -> T:
    """`await awaitable` under `asyncio.timeout(seconds)`: the same deadline (counted
    from this call), the same TimeoutError, the same cancellation; a timer only
    if it waits. With `hold`, its steps after the first pass that gate (gate.py)."""
    deadline = asyncio.get_running_loop().time() + seconds
    steps = awaitable.__await__()
    try:
        waits_on = steps.send(None)
    except StopIteration as done:
        value: T = done.value
        return value  # finished without waiting: nothing could have cut it off
    async with asyncio.timeout_at(deadline):
        return await Rest(steps, waits_on, hold)

