"""Power cuts under load: the data directory on lazyfs, a real server, real HTTP.

Each round mounts lazyfs (tests/support/lazyfs.py) over the same backing
directory at the server's data directory, starts a real `agentbox serve`,
checks that every event acknowledged before the previous cut is in the store
and that `agentbox verify` passes, then sends events from several threads
(each with its own connection) and, at a random moment, cuts the power: the
filesystem freezes and drops every unsynced write, and the server gets
SIGKILL, one right after the other. A last round checks every event
acknowledged during the whole run.

Used by tests/test_power_cut.py (a short form) and scripts/powercut.py (the
long form, with figures).
"""

from __future__ import annotations

import json
import os
import random
import select
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from agentbox.signing import sign_headers
from tests.conftest import ROOT, SECRET, Server, encode, make_event, wait_until

BROKEN_COMMIT_SITE = Path(__file__).resolve().parent / "broken_commit"
MOUNT_SECONDS = 20.0


REQUIRE_FUSE_ENV = "AGENTBOX_TEST_REQUIRE_FUSE"


def fuse_missing() -> str | None:
    """Why lazyfs cannot run here, or None."""
    if not sys.platform.startswith("linux"):
        return "the lazyfs tests (power cut, full disk) need FUSE (Linux)"
    if not os.path.exists("/dev/fuse"):
        return "the lazyfs tests (power cut, full disk) need /dev/fuse"
    if shutil.which("fusermount3") is None:
        return "the lazyfs tests (power cut, full disk) need fusermount3 (apt-get install fuse3)"
    try:
        import mfusepy  # type: ignore[import-untyped]  # noqa: F401
    except (ImportError, OSError) as exc:
        return f"the lazyfs tests (power cut, full disk) need mfusepy and libfuse3 ({exc})"
    return None


def skip_or_fail_without_fuse() -> None:
    """Skip without FUSE (not Linux, no /dev/fuse, no fusermount3, no mfusepy), or
    fail when AGENTBOX_TEST_REQUIRE_FUSE=1, as CI should."""
    import pytest  # only here: scripts/powercut.py runs without it

    missing = fuse_missing()
    if missing and os.environ.get(REQUIRE_FUSE_ENV, "") not in ("", "0"):
        pytest.fail(f"{REQUIRE_FUSE_ENV}=1 makes a missing FUSE a failure: {missing}",
                    pytrace=False)
    if missing:
        pytest.skip(missing)


class Disk:
    """A lazyfs process showing `backing` at `mount`; its stdin is the power switch."""

    def __init__(self, backing: Path, mount: Path, log_path: Path) -> None:
        self.backing, self.mount_point, self.log_path = backing, mount, log_path
        self.process: subprocess.Popen[bytes] | None = None

    def mount(self) -> None:
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mount_point.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.support.lazyfs", str(self.backing),
                 str(self.mount_point)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)})
        wait_until(self._mounted, MOUNT_SECONDS, f"lazyfs to mount {self.mount_point}")

    def _mounted(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"lazyfs exited with {self.process.returncode}:\n"
                                 + self.log_path.read_text())
        return self.mounted()

    def mounted(self) -> bool:
        with open("/proc/self/mounts") as mounts:
            return any(line.split()[1] == str(self.mount_point) for line in mounts)

    def cut(self) -> dict[str, Any]:
        """Freeze the filesystem and drop every unsynced write; answer its figures
        (those of the cut an `arm` made, if it came first)."""
        self._send("cut")
        return self._figures()

    def arm(self, suffix: str, writes: int) -> None:
        """Cut right after the `writes`-th write to a file whose name ends with `suffix`."""
        self._send(f"arm {suffix} {writes}")

    def room(self, more: int | None) -> dict[str, Any]:
        """Make the disk full once its files grow by `more` bytes (None: never);
        answers the space used and the capacity."""
        self._send(f"room {'none' if more is None else more}")
        return self._figures()

    def wait_cut(self, timeout: float) -> dict[str, Any] | None:
        """The figures of the cut an `arm` made, or None if it has not come in `timeout`."""
        assert self.process is not None and self.process.stdout
        readable, _, _ = select.select([self.process.stdout], [], [], timeout)
        return self._figures() if readable else None

    def _send(self, line: str) -> None:
        assert self.process is not None and self.process.stdin
        self.process.stdin.write(line.encode() + b"\n")
        self.process.stdin.flush()

    def _figures(self) -> dict[str, Any]:
        assert self.process is not None and self.process.stdout
        line = self.process.stdout.readline()
        if not line:
            raise AssertionError("lazyfs exited:\n" + self.log_path.read_text())
        figures: dict[str, Any] = json.loads(line)
        return figures

    def unmount(self) -> None:
        if self.mounted():  # not os.path.ismount: a frozen lazyfs answers EIO to stat
            done = subprocess.run(["fusermount3", "-u", str(self.mount_point)],
                                  capture_output=True, check=False)
            if done.returncode != 0:  # still busy: detach it now, it goes when idle
                subprocess.run(["fusermount3", "-u", "-z", str(self.mount_point)],
                               capture_output=True, check=False)
        if self.process is not None:
            try:
                self.process.wait(MOUNT_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
            for pipe in (self.process.stdin, self.process.stdout):
                if pipe is not None:
                    pipe.close()
            self.process = None


@dataclass
class Figures:
    cuts: int = 0
    at_wal_write: int = 0  # cuts that came right after a write to the WAL
    acknowledged: int = 0  # events answered 202
    lost: list[str] = field(default_factory=list)  # event ids answered 202, not in the store
    verify_failures: list[str] = field(default_factory=list)
    discarded_pages: Counter[str] = field(default_factory=Counter)  # unsynced, per file name
    fsyncs: int = 0  # fsyncs lazyfs received from the servers
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {"cuts": self.cuts, "at_wal_write": self.at_wal_write,
                "acknowledged": self.acknowledged, "lost": len(self.lost),
                "verify_failures": len(self.verify_failures),
                "discarded_pages": dict(self.discarded_pages), "fsyncs": self.fsyncs,
                "seconds": round(self.seconds, 1)}


class Sender(threading.Thread):
    """Posts new events on its own connection until stopped or `limit` are sent;
    keeps the run id of every one answered 202."""

    def __init__(self, server: Server, limit: int, acknowledged: dict[str, str],
                 lock: threading.Lock) -> None:
        super().__init__(daemon=True)
        self.server, self.limit = server, limit
        self.acknowledged, self.lock = acknowledged, lock
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.server.url, timeout=30) as client:
            for _ in range(self.limit):
                if self.stop.is_set():
                    return
                event = make_event(event_id=uuid.uuid4().hex, project_id="ok")
                body = encode(event)
                try:
                    response = client.post("/webhooks/events", content=body, headers={
                        "Content-Type": "application/json",
                        **sign_headers(SECRET, body, int(time.time()))})
                except httpx.TransportError:
                    return  # the server died mid-request: not acknowledged
                if response.status_code == 202:
                    with self.lock:
                        self.acknowledged[event["event_id"]] = response.json()["run_id"]


class PowerCuts:
    """Rounds of load and power cuts over one data directory under `home`.

    Odd cuts come at a random moment 0.2-1.5 s (`cut_after`) after the round's
    first 202; even ones right after a random one of the next 400 writes to the
    WAL (often between a commit's write and its fsync, a window a random moment
    seldom hits), or at such a moment if that comes first. `broken` runs the
    server with the deliberately broken commit path (tests/support/broken_commit):
    202 before the commit's fsync."""

    def __init__(self, home: Path, seed: int, broken: bool = False, senders: int = 6,
                 per_sender: int = 300, cut_after: tuple[float, float] = (0.2, 1.5),
                 say: Callable[[str], None] = lambda line: None) -> None:
        self.home, self.rng, self.broken = home, random.Random(seed), broken
        self.senders, self.per_sender, self.cut_after, self.say = (
            senders, per_sender, cut_after, say)
        self.disk = Disk(home / "disk", home / "data", home / "lazyfs.log")
        env = {"AGENTBOX_LOG_LEVEL": "warning"}
        if broken:
            env["PYTHONPATH"] = os.pathsep.join([str(BROKEN_COMMIT_SITE), str(ROOT)])
        self.server = Server(home, env)  # its data directory: home / "data", the mount
        self.figures = Figures()
        self.everything: dict[str, str] = {}  # event id -> run id, every 202 of the run

    def run(self, cuts: int) -> Figures:
        started = time.monotonic()
        try:
            cut: dict[str, Any] | None = None
            for number in range(1, cuts + 1):
                self._power_on()
                if cut is not None:
                    self._report(cut)
                cut = self._load_and_cut(number)
            self._power_on()
            if cut is not None:
                self._report(cut)
            self._check(self.everything)  # the earlier rounds' events are still there
        finally:
            self.close()
            self.figures.seconds = time.monotonic() - started
        return self.figures

    def close(self) -> None:
        self.server.close()
        self.disk.unmount()

    def _power_on(self) -> None:
        self.disk.mount()
        self.server.start()

    def _report(self, cut: dict[str, Any]) -> None:
        """After the restart that follows a cut: its lost events, its line."""
        cut["lost"] = self._check(cut.pop("acknowledged_ids"))
        self.say(json.dumps(cut))

    def _check(self, acknowledged: dict[str, str]) -> int:
        """Count the events of `acknowledged` not in the store; run `agentbox verify`."""
        lost = 0
        for event_id, run_id in acknowledged.items():
            response = self.server.client.get(f"/runs/{run_id}")
            if response.status_code != 200 or response.json()["event_id"] != event_id:
                lost += 1
                if event_id not in self.figures.lost:
                    self.figures.lost.append(event_id)
        verify = subprocess.run(
            [sys.executable, "-m", "agentbox", "verify", "--data-dir",
             str(self.disk.mount_point)],
            env={**self.server.env, "PYTHONPATH": str(ROOT)}, cwd=self.home,
            capture_output=True, text=True, check=False)
        if verify.returncode != 0:
            self.figures.verify_failures.append(verify.stdout + verify.stderr)
        return lost

    def _load_and_cut(self, number: int) -> dict[str, Any]:
        acknowledged: dict[str, str] = {}
        lock = threading.Lock()
        senders = [Sender(self.server, self.per_sender, acknowledged, lock)
                   for _ in range(self.senders)]
        for sender in senders:
            sender.start()
        wait_until(lambda: acknowledged or not any(s.is_alive() for s in senders),
                   MOUNT_SECONDS, "the first 202 of the round")
        at, dropped = self._cut(at_write=number % 2 == 0)
        self.server.kill9()
        for sender in senders:
            sender.stop.set()
        for sender in senders:
            sender.join(30)
        self.disk.unmount()
        with lock:
            acknowledged = dict(acknowledged)
        self.everything.update(acknowledged)
        fsyncs = sum(dropped["fsyncs"].values())
        self.figures.cuts += 1
        self.figures.at_wal_write += at != "moment"
        self.figures.acknowledged += len(acknowledged)
        self.figures.discarded_pages.update(dropped["discarded_by_file"])
        self.figures.fsyncs += fsyncs
        return {"cut": number, "at": at, "acknowledged": len(acknowledged),
                "discarded_pages": dropped["discarded_by_file"], "fsyncs": fsyncs,
                "acknowledged_ids": acknowledged}

    def _cut(self, at_write: bool) -> tuple[str, dict[str, Any]]:
        """Cut the power at this round's random point: (where, lazyfs's figures)."""
        pause = self.rng.uniform(*self.cut_after)
        if at_write:
            writes = self.rng.randint(1, 400)
            self.disk.arm("-wal", writes)
            dropped = self.disk.wait_cut(pause)
            if dropped is not None:
                return f"WAL write {writes}", dropped
        else:
            time.sleep(pause)
        return "moment", self.disk.cut()


def server_log(home: Path) -> str:
    path = home / "server.log"
    return path.read_text() if path.exists() else ""

