"""A 202 survives a power cut: the data directory on lazyfs (tests/support/lazyfs.py),
a FUSE filesystem that drops every write not yet fsynced when the power goes.

First lazyfs itself (its page cache against a model, and SQLite's WAL on a real
mount across a cut), then the promise: a real server under load, cut many
times at random moments, keeps every event it answered 202 and passes
`agentbox verify`; and the same check, run against a commit path that answers
202 before its fsync (tests/support/broken_commit), finds lost events, so it is
known to catch a loss. The long form is scripts/powercut.py.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT
from tests.support.powercut import (
    BROKEN_COMMIT_SITE,
    Disk,
    PowerCuts,
    server_log,
    skip_or_fail_without_fuse,
)


@pytest.fixture(scope="module", autouse=True)
def fuse_here() -> None:
    skip_or_fail_without_fuse()


PAGE = 4096


# -- lazyfs's page cache, against a model: the file as written, and as last synced --------

operations = st.lists(st.one_of(
    st.tuples(st.just("write"), st.integers(0, 3 * PAGE + 100), st.binary(min_size=1,
                                                                          max_size=PAGE + 10)),
    st.tuples(st.just("truncate"), st.integers(0, 4 * PAGE)),
    st.tuples(st.just("sync")),
), max_size=30)


@given(initial=st.binary(max_size=2 * PAGE + 10), ops=operations)
@settings(max_examples=150, deadline=None)
def test_node_keeps_unsynced_writes_off_the_disk(tmp_path_factory: pytest.TempPathFactory,
                                                  initial: bytes, ops: list[tuple]) -> None:
    from tests.support.lazyfs import Node

    path = tmp_path_factory.mktemp("node") / "file"
    path.write_bytes(initial)
    fd = os.open(path, os.O_RDWR)
    try:
        node, current, synced = Node(fd), bytearray(initial), bytes(initial)
        for op in ops:
            if op[0] == "write":
                offset, data = op[1], op[2]
                current.extend(bytes(max(0, offset - len(current))))
                current[offset:offset + len(data)] = data
                node.write(data, offset)
            elif op[0] == "truncate":
                del current[op[1]:]
                current.extend(bytes(op[1] - len(current)))
                node.truncate(op[1])
            else:
                node.sync()
                synced = bytes(current)
            assert node.size == len(current)
            assert node.read(len(current) + PAGE, 0) == current  # what readers see
            assert path.read_bytes() == synced  # what a cut leaves
    finally:
        os.close(fd)


# -- lazyfs mounted: files and SQLite's WAL across a cut -----------------------------------


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Disk]:
    disk = Disk(tmp_path / "disk", tmp_path / "mnt", tmp_path / "lazyfs.log")
    disk.mount()
    yield disk
    disk.unmount()


def test_a_cut_keeps_what_was_fsynced_and_drops_the_rest(disk: Disk) -> None:
    mnt = disk.mount_point
    (mnt / "never-synced").write_bytes(b"a" * 10_000)
    with open(mnt / "synced", "wb") as f:
        f.write(b"kept" * 1000)
        f.flush()
        os.fsync(f.fileno())
        f.write(b"lost")
    with open(mnt / "truncated", "wb") as f:
        f.write(b"b" * 9000)
        f.flush()
        os.fsync(f.fileno())
        f.truncate(10)  # not synced: the file comes back at 9000 bytes
    assert (mnt / "synced").read_bytes() == b"kept" * 1000 + b"lost"
    assert (mnt / "truncated").read_bytes() == b"b" * 10

    dropped = disk.cut()
    assert dropped["fsyncs"] == {"synced": 1, "truncated": 1}
    assert dropped["discarded_pages"] >= 3
    with pytest.raises(OSError):  # frozen: nothing gets through after the cut
        (mnt / "synced").read_bytes()
    disk.unmount()
    disk.mount()

    assert (mnt / "never-synced").read_bytes() == b""  # the name was kept: not modelled
    assert (mnt / "synced").read_bytes() == b"kept" * 1000
    assert (mnt / "truncated").read_bytes() == b"b" * 9000


def test_an_armed_cut_comes_right_after_the_chosen_write(disk: Disk) -> None:
    disk.arm("-wal", 2)
    other = os.open(disk.mount_point / "other", os.O_RDWR | os.O_CREAT)
    wal = os.open(disk.mount_point / "db-wal", os.O_RDWR | os.O_CREAT)
    try:
        os.write(other, b"x")  # not a file the cut waits for: not counted
        os.pwrite(wal, b"1" * PAGE, 0)
        os.fsync(wal)
        assert disk.wait_cut(0.2) is None
        os.pwrite(wal, b"2" * PAGE, PAGE)  # the second write: it goes through, then the cut
        dropped = disk.wait_cut(10)
        assert dropped is not None
        assert dropped["discarded_by_file"] == {"db-wal": 1, "other": 1}
        with pytest.raises(OSError):
            os.pwrite(wal, b"3", 0)
    finally:
        for fd in (other, wal):
            with contextlib.suppress(OSError):  # the power is off
                os.close(fd)
    disk.unmount()
    disk.mount()
    assert (disk.mount_point / "db-wal").read_bytes() == b"1" * PAGE
    assert (disk.mount_point / "other").read_bytes() == b""


def test_sqlite_wal_on_lazyfs_keeps_exactly_the_synced_commits(disk: Disk) -> None:
    """SQLite's WAL works here (its -shm is mmap'd: lazyfs mounts without direct_io),
    and a commit made without its fsync is gone after the cut."""
    path = disk.mount_point / "wal.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    assert conn.execute("PRAGMA journal_mode = WAL").fetchone()[0] == "wal"
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("CREATE TABLE t (n INTEGER)")
    for n in range(50):
        conn.execute("INSERT INTO t VALUES (?)", (n,))
    reader = sqlite3.connect(path)  # a second connection shares the WAL index (the mmap)
    assert reader.execute("SELECT count(*) FROM t").fetchone()[0] == 50
    conn.execute("PRAGMA synchronous = OFF")  # commits without an fsync
    for n in range(50, 80):
        conn.execute("INSERT INTO t VALUES (?)", (n,))
    assert reader.execute("SELECT count(*) FROM t").fetchone()[0] == 80

    dropped = disk.cut()
    assert dropped["fsyncs"]["wal.sqlite3-wal"] >= 50
    for c in (conn, reader):  # the power is off: whatever closing writes goes nowhere
        with contextlib.suppress(sqlite3.Error):
            c.close()
    disk.unmount()
    disk.mount()

    after = sqlite3.connect(path)
    try:
        assert after.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert [n for (n,) in after.execute("SELECT n FROM t ORDER BY n")] == list(range(50))
    finally:
        after.close()


def test_the_broken_commit_path_hooks_sqlite_and_fsync(tmp_path: Path) -> None:
    """What tests/support/broken_commit does to a process, whatever the store's code:
    no `PRAGMA synchronous` it sets takes effect, and os.fsync does nothing."""
    probe = (
        "import os, sqlite3, sys\n"
        "conn = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "conn.execute('PRAGMA journal_mode = WAL')\n"
        "conn.execute('PRAGMA synchronous = FULL')\n"
        "conn.execute('PRAGMA main.synchronous = EXTRA')\n"
        "print(conn.execute('PRAGMA synchronous').fetchone()[0], os.fsync.__name__)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BROKEN_COMMIT_SITE), str(ROOT)])}
    done = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "probe.sqlite3")],
                          env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["1", "_no_sync"]  # 1: NORMAL
    assert "broken commit path: synchronous=NORMAL" in done.stderr
    env["PYTHONPATH"] = str(ROOT)  # and without it, the same probe gets what it asked
    done = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "probe.sqlite3")],
                          env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["3", "fsync"]  # 3: EXTRA


# -- the promise, under load ----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_every_202_survives_power_cuts(tmp_path: Path) -> None:
    seed = random.randrange(2**32)
    figures = PowerCuts(tmp_path, seed).run(cuts=6)
    context = f"seed {seed}: {figures.summary()}"
    assert figures.lost == [], context
    assert figures.verify_failures == [], context
    assert figures.acknowledged >= 6 * 10, context  # there was load at every cut
    assert figures.at_wal_write >= 1, context
    wal = [name for name in figures.discarded_pages if name.endswith("-wal")]
    assert wal, context  # a cut came between a write to the WAL and its fsync
    assert figures.fsyncs > 0, context


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_power_cuts_catch_a_202_sent_before_its_fsync(tmp_path: Path) -> None:
    seed = random.randrange(2**32)
    figures = PowerCuts(tmp_path, seed, broken=True).run(cuts=4)
    assert "power-cut test: broken commit path" in server_log(tmp_path)
    assert len(figures.lost) >= 1, f"seed {seed}: {figures.summary()}"
