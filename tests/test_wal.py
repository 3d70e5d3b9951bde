"""The SQLite store's write-ahead log starts over under steady load.

SQLite appends each commit to the WAL and starts it over from its beginning only
once a checkpoint has copied every frame back into the database file. Run beside
the writer, a checkpoint never caught up while commits kept coming: the WAL grew
by every commit (some 20 MB a second at 16 connections), and each commit's fsync,
an append, had to write the file's size as well. The checkpoint thread now copies
the bulk and the writer the frames left over, between two batches, so the WAL
starts over once a second whatever the load: a restart is seen in its header's
checkpoint counter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import struct
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from agentbox.store import sqlite as sqlite_store
from agentbox.store.sqlite import SqliteStore
from tests.store.support import ingest

WRITERS = 8  # requests at once: the writer always has a batch waiting
MOST_EVENTS = 20_000  # about 6 s of writes here: the code before never got there


def restarts_of(wal: Path) -> int:
    """The WAL header's checkpoint sequence number: +1 at every start-over."""
    with open(wal, "rb") as f:
        header = f.read(16)
    return struct.unpack(">I", header[12:16])[0] if len(header) == 16 else 0


async def write_until_restarted(store: SqliteStore, wal: Path, times: int,
                                name: str) -> tuple[int, int]:
    """Ingest from WRITERS tasks at once until the WAL has started over `times` times
    (or MOST_EVENTS were written): (restarts seen, events written)."""
    first = restarts_of(wal)
    seen = {first}
    written = 0

    async def writer(n: int) -> None:
        nonlocal written
        i = 0
        while len(seen) <= times and written < MOST_EVENTS:
            await ingest(store, f"{name}-{n}-{i}", max_pending=10**9)
            written += 1
            i += 1
            seen.add(restarts_of(wal))

    await asyncio.wait_for(asyncio.gather(*(writer(n) for n in range(WRITERS))), 120)
    return len(seen) - 1, written


@contextlib.asynccontextmanager
async def a_reader_holding_a_snapshot(
        path: Path) -> AsyncIterator[tuple[SqliteStore, sqlite3.Connection]]:
    """An open store with one event, and a connection of another program reading
    it in a transaction (its snapshot pins the WAL until it commits)."""
    store = SqliteStore(path)
    await store.open()
    reader = sqlite3.connect(path, isolation_level=None)
    try:
        await ingest(store, "before")
        reader.execute("BEGIN")
        assert reader.execute("SELECT count(*) FROM events").fetchone() == (1,)
        yield store, reader
    finally:
        reader.close()
        await store.close()


@pytest.fixture
def quick_checkpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_store, "CHECKPOINT_INTERVAL_SECONDS", 0.05)


def test_the_wal_starts_over_while_commits_keep_coming(tmp_path: Path,
                                                      quick_checkpoints: None) -> None:
    async def scenario() -> tuple[int, int]:
        store = SqliteStore(tmp_path / "agentbox.sqlite3")
        await store.open()
        try:
            return await write_until_restarted(store, tmp_path / "agentbox.sqlite3-wal", 3,
                                               "w")
        finally:
            await store.close()

    restarts, written = asyncio.run(scenario())
    assert restarts >= 3, f"{written} events, the WAL started over {restarts} times"


def test_the_wal_starts_over_again_once_a_long_reader_lets_go(tmp_path: Path,
                                                             quick_checkpoints: None) -> None:
    """A reader holding an old snapshot (`agentbox verify` beside the server, a
    backup) keeps every later frame in the WAL; once it ends, checkpoints catch up
    and the WAL starts over again."""
    path = tmp_path / "agentbox.sqlite3"
    wal = tmp_path / "agentbox.sqlite3-wal"

    async def scenario() -> tuple[int, int]:
        async with a_reader_holding_a_snapshot(path) as (store, reader):
            for i in range(300):  # a few checkpoint intervals' writes behind the reader
                await ingest(store, f"pinned-{i}", max_pending=10**9)
            reader.execute("COMMIT")
            return await write_until_restarted(store, wal, 2, "after")

    restarts, written = asyncio.run(scenario())
    assert restarts >= 2, f"{written} events after the reader, the WAL started over " \
                          f"{restarts} times"


def test_a_wal_held_by_a_reader_is_said_and_cut_back_after(
        tmp_path: Path, quick_checkpoints: None, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A reader that never lets go (another program with the database open in a
    transaction) would keep the WAL growing without a word: the log says so once,
    and once the reader has gone, that the WAL starts over again; the file is cut
    back to the limit (journal_size_limit) instead of keeping its largest size."""
    limit = 4 * 1024 * 1024
    monkeypatch.setattr(sqlite_store, "WAL_WARN_BYTES", limit)
    caplog.set_level(logging.INFO, logger="agentbox.store")
    path = tmp_path / "agentbox.sqlite3"
    wal = tmp_path / "agentbox.sqlite3-wal"

    def said(text: str) -> int:
        return sum(text in record.getMessage() for record in caplog.records)

    async def write_until(store: SqliteStore, done: Callable[[], bool], name: str) -> None:
        for i in range(MOST_EVENTS):
            if done():
                return
            await ingest(store, f"{name}-{i}", max_pending=10**9)
        raise AssertionError(f"not after {MOST_EVENTS} events: {name}")

    async def scenario() -> None:
        async with a_reader_holding_a_snapshot(path) as (store, reader):
            await write_until(store, lambda: said("the WAL cannot start over") > 0, "held")
            assert wal.stat().st_size > limit
            reader.execute("COMMIT")
            await write_until(store, lambda: said("the WAL starts over again") > 0, "freed")
            await write_until(store, lambda: wal.stat().st_size <= limit, "cut-back")

    asyncio.run(scenario())
    assert said("the WAL cannot start over") == 1  # once, not every second
    warning = next(r for r in caplog.records if "cannot start over" in r.getMessage())
    assert warning.levelno == logging.WARNING and warning.wal_bytes > limit  # type: ignore[attr-defined]


@pytest.mark.parametrize(("seen", "said"), [
    # (frames in the WAL, frames copied back) at each checkpoint; 4 KiB pages
    ([(1_000, 990), (20_000, 19_990), (40_000, 39_000), (80_000, 79_000)], []),  # a load
    ([(30_000, 29_000), (1_000, 1_000), (40_000, 39_000), (2_000, 2_000)], []),  # restarts
    ([(1_000, 500), (20_000, 500), (40_000, 500), (80_000, 500), (90_000, 500),
      (100, 100)], ["the WAL cannot start over", "the WAL starts over again"]),  # held
    ([(1_000, 500), (2_000, 500), (3_000, 500), (4_000, 500)], []),  # held, still small
])
def test_only_a_held_wal_is_said(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                 seen: list[tuple[int, int]], said: list[str]) -> None:
    """Only a WAL that grows while not a frame more can be copied back is held: a
    load that grows second after second copies more each time."""
    caplog.set_level(logging.INFO, logger="agentbox.store")
    store = SqliteStore(tmp_path / "agentbox.sqlite3")  # not opened: the decision only
    for frames, copied in seen:
        store._watch_wal((frames, copied))
    assert [r.getMessage().split(":")[0] for r in caplog.records] == said
