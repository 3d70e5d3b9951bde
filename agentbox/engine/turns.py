"""Turns: work on one name at a time, in this process (the receiver's admission and
storing of events an agent's check decides by the same name: `admission`'s
`serial`). A name's lock lives while someone holds or awaits it, no longer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager


class Turns:
    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}  # name: (lock, its users)

    @asynccontextmanager
    async def of(self, names: Iterable[str]) -> AsyncIterator[None]:
        """Hold each of `names` for the body of the `async with` (in sorted order, so
        that two holders of several names cannot each wait for the other)."""
        held: list[str] = []
        try:
            for name in sorted(set(names)):
                lock = self._use(name)
                try:
                    await lock.acquire()
                except BaseException:  # cancelled while waiting: never held
                    self._unuse(name)
                    raise
                held.append(name)
            yield
        finally:
            for name in reversed(held):
                self._locks[name][0].release()
                self._unuse(name)

    def __len__(self) -> int:
        """How many names are held or awaited now."""
        return len(self._locks)

    def _use(self, name: str) -> asyncio.Lock:
        lock, users = self._locks.get(name) or (asyncio.Lock(), 0)
        self._locks[name] = (lock, users + 1)
        return lock

    def _unuse(self, name: str) -> None:
        lock, users = self._locks[name]
        if users == 1:
            del self._locks[name]
        else:
            self._locks[name] = (lock, users - 1)
