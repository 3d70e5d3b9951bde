"""The SQLite store's write-ahead log starts over under steady load.

SQLite appends each commit to the WAL and starts it over from its beginning only
once a checkpoint has copied every frame back into the database file. Run beside
the writer, a checkpoint never catches up while commits keep coming: the WAL grew
by every commit (some 20 MB a second at 16 connections), and each commit's fsync,
an append, had to write the file's size as well. The writer now runs the
checkpoint between two batches, so the WAL starts over once a second whatever the
load: a restart is seen in its header's checkpoint counter.
"""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import pytest

from agentbox.store import sqlite as sqlite_store
from agentbox.store.sqlite import SqliteStore
from tests.store.support import ingest

WRITERS = 8  # requests at once: the writer always has a batch waiting


def restarts_of(wal: Path) -> int:
    """The WAL header's checkpoint sequence number: +1 at every start-over."""
    with open(wal, "rb") as f:
        header = f.read(16)
    return struct.unpack(">I", header[12:16])[0] if len(header) == 16 else 0


def test_the_wal_starts_over_while_commits_keep_coming(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_store, "CHECKPOINT_INTERVAL_SECONDS", 0.05)
    wal = tmp_path / "agentbox.sqlite3-wal"

    async def scenario() -> tuple[int, int]:
        store = SqliteStore(tmp_path / "agentbox.sqlite3")
        await store.open()
        seen: set[int] = set()
        committed = 0

        async def writer(n: int) -> None:
            nonlocal committed
            i = 0
            while len(seen) < 4 and committed < 20_000:  # 4 sequence numbers: 3 restarts
                await ingest(store, f"w{n}-{i}", max_pending=10**9)
                committed += 1
                i += 1
                seen.add(restarts_of(wal))

        try:
            await asyncio.wait_for(asyncio.gather(*(writer(n) for n in range(WRITERS))), 120)
        finally:
            await store.close()
        return len(seen), committed

    sequence_numbers, committed = asyncio.run(scenario())
    assert sequence_numbers >= 4, f"{committed} events, the WAL started over " \
                                  f"{sequence_numbers - 1} times"
