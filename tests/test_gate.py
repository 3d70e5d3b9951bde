"""`Gated`: a step waits while the gate holds; the awaitable's value, its errors and
a cancellation pass through as they would without the gate."""

from __future__ import annotations

import asyncio

import pytest

from agentbox.engine.gate import Gated


def test_a_step_waits_for_the_gate_and_the_value_passes_through() -> None:
    async def scenario() -> None:
        steps: list[str] = []
        gate: list[asyncio.Future[None]] = []

        async def agent() -> str:
            steps.append("first")
            await asyncio.sleep(0)
            steps.append("second")
            await asyncio.sleep(0)
            return "done"

        def hold() -> asyncio.Future[None] | None:
            return gate[0] if gate and not gate[0].done() else None

        gate.append(asyncio.get_running_loop().create_future())
        task = asyncio.create_task(_await(Gated(agent(), hold)))
        for _ in range(5):
            await asyncio.sleep(0)
        assert steps == ["first"]  # the second step waits for the gate
        gate[0].set_result(None)
        assert await task == "done"
        assert steps == ["first", "second"]

    asyncio.run(scenario())


async def _await(gated: Gated[str]) -> str:
    return await gated


def test_a_cancellation_while_held_reaches_the_awaitable_where_it_waits() -> None:
    async def scenario() -> None:
        seen: list[str] = []
        held = asyncio.get_running_loop().create_future()

        async def agent() -> None:
            try:
                await asyncio.sleep(0)  # resumed into the gate: cancelled there
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise
            seen.append("went on")

        task = asyncio.create_task(_await(Gated(agent(), lambda: held)))  # type: ignore[arg-type]
        for _ in range(5):
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert seen == ["cancelled"]
        assert held.cancelled()  # the gate's future, as the task's awaited one

    asyncio.run(scenario())


def test_an_error_the_awaitable_raises_passes_through() -> None:
    async def failing() -> None:
        await asyncio.sleep(0)
        raise ValueError("the agent's own")

    async def scenario() -> None:
        with pytest.raises(ValueError, match="the agent's own"):
            await Gated(failing(), lambda: None)

    asyncio.run(scenario())


def test_within_puts_the_gate_on_the_steps_after_the_first() -> None:
    from agentbox.engine.timeouts import within

    async def scenario() -> None:
        asked: list[str] = []
        held = asyncio.get_running_loop().create_future()

        def hold() -> asyncio.Future[None] | None:
            asked.append("hold")
            return None if held.done() else held

        async def at_once() -> str:
            return "first step"

        assert await within(5, at_once(), hold) == "first step"
        assert asked == []  # it never waited: no gate

        async def waits() -> str:
            await asyncio.sleep(0)
            return "later step"

        task = asyncio.create_task(within(5, waits(), hold))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not task.done() and asked  # the second step waits for the gate
        held.set_result(None)
        assert await task == "later step"

    asyncio.run(scenario())
