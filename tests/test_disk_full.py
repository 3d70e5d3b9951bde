"""A full disk: the data directory on a small filesystem (lazyfs with a capacity,
tests/support/lazyfs.py) that fills up while events keep coming.

agentbox must answer 503 with Retry-After (never a 500, never a 202 for an event
it did not store), keep every event it answered 202, go on serving reads, say
once in its log what is wrong, and take writes again by itself once there is
room; `agentbox verify` passes afterwards. The filesystem is FUSE: without it
these tests skip, or fail under AGENTBOX_TEST_REQUIRE_FUSE=1 (CI).
"""

from __future__ import annotations

import errno
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentbox.signing import sign_headers
from tests.conftest import ROOT, SECRET, Server, encode, make_event, wait_until
from tests.support.powercut import Disk, server_log, skip_or_fail_without_fuse

# Room for the files to grow once the server is up: the WAL takes whole pages, the
# database a few kB an event; about a thousand events fill it.
ROOM = 2 * 1024 * 1024
SENDERS = 4
FULL_SECONDS = 3.0  # events keep coming this long after the first 503
FULL = '"msg": "the store cannot take writes'  # the log line that says so
BACK = '"msg": "the store takes writes again"'

pytestmark = pytest.mark.slow  # FUSE, and a server subprocess


@pytest.fixture(scope="module", autouse=True)
def fuse_here() -> None:
    skip_or_fail_without_fuse()


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Disk]:
    disk = Disk(tmp_path / "disk", tmp_path / "data", tmp_path / "lazyfs.log")
    disk.mount()
    yield disk
    disk.unmount()


def test_a_small_lazyfs_refuses_growth_past_its_room_and_takes_it_back(disk: Disk) -> None:
    mnt = disk.mount_point
    (mnt / "file").write_bytes(b"a" * 1000)
    disk.room(500)
    with pytest.raises(OSError) as full, open(mnt / "more", "wb") as f:
        f.write(b"b" * 600)
        f.flush()
    assert full.value.errno == errno.ENOSPC
    with open(mnt / "file", "r+b") as f:  # what a file holds may be rewritten
        f.write(b"c" * 1000)
    (mnt / "file").unlink()  # and what goes gives room back
    (mnt / "more").write_bytes(b"d" * 1400)
    disk.room(None)
    (mnt / "big").write_bytes(b"e" * 100_000)


class Load:
    """Senders posting new events on their own connections until stopped; every
    answer's status, and the event and run ids of those answered 202."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.lock = threading.Lock()
        self.acknowledged: dict[str, str] = {}
        self.statuses: Counter[int] = Counter()
        self.refusals: list[httpx.Response] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._send, daemon=True)
                        for _ in range(SENDERS)]

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)

    def _send(self) -> None:
        with httpx.Client(base_url=self.server.url, timeout=30) as client:
            while not self.stop.is_set():
                event = make_event(event_id=uuid.uuid4().hex, project_id="ok")
                event["payload"]["mix_url"] = "/mixes/" + "m" * 1500  # fills it sooner
                body = encode(event)
                response = client.post("/webhooks/events", content=body, headers={
                    "Content-Type": "application/json",
                    **sign_headers(SECRET, body, int(time.time()))})
                with self.lock:
                    self.statuses[response.status_code] += 1
                    if response.status_code == 202:
                        self.acknowledged[event["event_id"]] = response.json()["run_id"]
                    else:
                        self.refusals.append(response)

    def refused(self) -> int:
        with self.lock:
            return len(self.refusals)


def test_a_full_disk_answers_503_keeps_every_202_and_recovers_by_itself(
        tmp_path: Path, disk: Disk) -> None:
    server = Server(tmp_path, {"AGENTBOX_LOG_LEVEL": "info"})
    try:
        server.start()
        first = server.post(make_event()).json()["run_id"]
        disk.room(ROOM)
        with Load(server) as load:
            wait_until(load.refused, 120, "the disk to fill up (a refusal)")
            refused_at = time.monotonic()
            _while_full(server, first)
            wait_until(lambda: time.monotonic() - refused_at > FULL_SECONDS, 30, "more events")
        assert set(load.statuses) == {202, 503}, load.statuses
        for response in load.refusals:
            assert response.json()["error_code"] == "storage_unavailable", response.text
            assert int(response.headers["Retry-After"]) > 0
        said = [line for line in server_log(tmp_path).splitlines() if FULL in line]
        assert len(said) == 1, said  # said once, however many events were refused

        disk.room(None)
        wait_until(lambda: server.client.get("/healthz").status_code == 200, 20,
                   "the store to take writes again, by itself")
        assert server.post(make_event()).status_code == 202
        wait_until(lambda: server.post(make_event()).status_code == 202
                   and BACK in server_log(tmp_path), 20, "the log to say so", interval=0.2)
        assert server_log(tmp_path).count(BACK) == 1
        assert server.stop() == -15  # uvicorn exits by the signal it stopped for
    finally:
        server.close()
    _every_acknowledged_event_is_stored(disk.mount_point, load.acknowledged)
    verify = subprocess.run(
        [sys.executable, "-m", "agentbox", "verify", "--data-dir", str(disk.mount_point)],
        env={**server.env, "PYTHONPATH": str(ROOT)}, cwd=tmp_path, capture_output=True,
        text=True, check=False)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def _while_full(server: Server, run_id: str) -> None:
    """What people and programs still get while nothing can be written."""
    health = server.client.get("/healthz")
    assert health.status_code == 503 and "full" in health.json()["reason"], health.text
    assert server.run(run_id)["run_id"] == run_id  # reads are served
    assert server.client.get("/runs", params={"limit": 5}).status_code == 200
    assert server.client.get("/").status_code == 200  # the page too


def _every_acknowledged_event_is_stored(data: Path, acknowledged: dict[str, Any]) -> None:
    assert len(acknowledged) > 20  # the disk filled under load, not at once (each event
    # keeps more beside it since the review keeps its own project rows: fewer fit)
    conn = sqlite3.connect(f"file:{data / 'agentbox.sqlite3'}?mode=ro", uri=True)
    try:
        stored = {row[0]: row[1] for row in conn.execute(
            "SELECT e.event_id, r.run_id FROM events e JOIN runs r ON r.event_pk = e.pk")}
    finally:
        conn.close()
    lost = {event_id for event_id, run_id in acknowledged.items()
            if stored.get(event_id) != run_id}
    assert not lost, f"{len(lost)} events answered 202 are not in the store"
