"""`Turns`: work under one name waits for the work before it under that name; other
names go on; a waiter cancelled before its turn leaves none behind."""

from __future__ import annotations

import asyncio

from agentbox.engine.turns import Turns


def test_one_name_at_a_time_and_other_names_meanwhile() -> None:
    async def scenario() -> None:
        turns, order = Turns(), []
        first_in = asyncio.Event()
        go_on = asyncio.Event()

        async def first() -> None:
            async with turns.of(["a"]):
                first_in.set()
                await go_on.wait()
                order.append("first")

        async def second() -> None:
            async with turns.of(["a"]):
                order.append("second")

        async def other() -> None:
            async with turns.of(["b"]):
                order.append("other")

        one = asyncio.create_task(first())
        await first_in.wait()
        two, three = asyncio.create_task(second()), asyncio.create_task(other())
        await three
        assert order == ["other"]  # "b" did not wait for "a"
        go_on.set()
        await asyncio.gather(one, two)
        assert order == ["other", "first", "second"]
        assert len(turns) == 0  # nothing kept once no one holds or waits

    asyncio.run(scenario())


def test_a_waiter_cancelled_before_its_turn_leaves_the_name_to_the_holder() -> None:
    async def scenario() -> None:
        turns = Turns()
        held = asyncio.Event()
        release = asyncio.Event()

        async def holder() -> None:
            async with turns.of(["a", "b"]):
                held.set()
                await release.wait()

        task = asyncio.create_task(holder())
        await held.wait()
        waiter = asyncio.create_task(_enter(turns, ["b"]))
        await asyncio.sleep(0)  # let it start waiting
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        assert waiter.cancelled()
        release.set()
        await task
        assert len(turns) == 0
        await asyncio.wait_for(_enter(turns, ["a", "b"]), 5)  # free again

    asyncio.run(scenario())


async def _enter(turns: Turns, names: list[str]) -> None:
    async with turns.of(names):
        pass
