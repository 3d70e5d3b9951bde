"""The archive of exports as the server holds it: an object the app makes, opens and
closes, and lends to the review agent (AgentContext.service).

A review copies the mix into `incoming` as it reads it (agentbox.archive.blobs);
`keep` then makes the copy the archive's, in the background (flushed to disk
first: a file under its hash's name always holds those bytes), and the review's
run does not wait for it. `audio` finds the bytes a review heard, for the page's
players: the archive's copy, or, with the archive off, the file at the review's
path if it is still the one reviewed (same size, modification time and SHA-256;
never a symlink swapped in since).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from agentbox import portable
from agentbox.archive.blobs import Blobs, hash_of, is_hash
from agentbox.config import Settings
from agentbox.logs import get_logger

log = get_logger("archive")

PENDING_WAIT_SECONDS = 30.0  # an audio request waits this long for a copy being kept
VERIFIED_FILES = 256  # files whose hash is remembered by identity (the archive off)


@dataclass(frozen=True)
class Reviewed:
    """What a review recorded of the file it heard (its result's `file`, `mix_url`)."""

    name: str
    sha256: str | None  # None: a review from before agentbox kept a hash
    size: int | None
    modified_ns: int | None
    path: Path | None  # where the event said the mix was


@dataclass(frozen=True)
class Playable:
    """An open descriptor of the reviewed bytes (the caller closes it)."""

    fd: int
    size: int
    sha256: str
    name: str


@dataclass(frozen=True)
class Gone:
    """Why the reviewed bytes cannot be played any more."""

    reason: str


class Archive:
    """The archive of exports (or, off, the check of a reviewed file's identity)."""

    def __init__(self, settings: Settings) -> None:
        self.on = settings.archive
        self.blobs = Blobs(settings.archive_path)
        self._ready = False  # the folders exist (made at open)
        self._pending: dict[str, asyncio.Task[bool]] = {}  # hash -> its commit
        self._verified: OrderedDict[tuple[int, ...], str] = OrderedDict()
        self._verifying = threading.Lock()  # _verified is used from worker threads

    # -- the server's life --------------------------------------------------------------

    async def open(self) -> None:
        """Make the folders and sweep what an unfinished review left (off the loop)."""
        if not self.on:
            return
        try:
            await asyncio.to_thread(self._prepare)
            self._ready = True
        except OSError as exc:  # reviews go on; nothing is kept
            log.warning("the archive's folder cannot be made: exports are not kept",
                        extra={"path": str(self.blobs.root), "reason": str(exc)})

    def _prepare(self) -> None:
        self.blobs.prepare()
        self.blobs.sweep_incoming()

    async def close(self) -> None:
        """Let the copies being kept finish (each is a flush and a rename)."""
        if self._pending:
            await asyncio.gather(*self._pending.values(), return_exceptions=True)

    # -- keeping ------------------------------------------------------------------------

    @property
    def incoming(self) -> Path | None:
        """Where a review copies the mix it reads; None: nothing is kept."""
        return self.blobs.incoming if self.on and self._ready else None

    def keep(self, sha256: str) -> None:
        """Make the copy a review left in incoming/ the archive's, in the background."""
        if self.incoming is None or not is_hash(sha256) or sha256 in self._pending:
            return
        task = asyncio.create_task(self._commit(sha256), name="agentbox-archive-keep")
        self._pending[sha256] = task
        task.add_done_callback(lambda _: self._pending.pop(sha256, None))

    async def _commit(self, sha256: str) -> bool:
        try:
            return await asyncio.to_thread(self.blobs.commit, sha256)
        except OSError as exc:
            log.warning("a reviewed export could not be kept",
                        extra={"sha256": sha256, "reason": str(exc)})
            return False

    async def settled(self) -> None:
        """Wait until every copy being kept is kept (tests, shutdown)."""
        await self.close()

    # -- playing ------------------------------------------------------------------------

    async def audio(self, reviewed: Reviewed) -> Playable | Gone:
        """The bytes a review heard, or why they cannot be played."""
        if reviewed.sha256 is None or not is_hash(reviewed.sha256):
            return Gone("this review was made before agentbox kept what it reviewed; "
                        "export the mix again to hear it here")
        if self.on:
            return await self._kept(reviewed.sha256, reviewed.name)
        return await asyncio.to_thread(self._unchanged, reviewed)

    async def _kept(self, sha256: str, name: str) -> Playable | Gone:
        pending = self._pending.get(sha256)
        if pending is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(pending), PENDING_WAIT_SECONDS)
        try:
            fd = await asyncio.to_thread(self.blobs.open, sha256)
        except OSError:
            return Gone("the archive no longer holds this export (it keeps the latest ones "
                        "within its size; see the manual's archive section)")
        return Playable(fd, os.fstat(fd).st_size, sha256, name)

    def _unchanged(self, reviewed: Reviewed) -> Playable | Gone:
        """With the archive off: the file at the review's path, if it is still the one
        reviewed. Runs in a thread (it may hash the file)."""
        moved = Gone("the reviewed file is no longer where it was, or has changed since "
                     "the review (the archive is off, so agentbox kept no copy)")
        if reviewed.path is None:
            return moved
        try:
            fd = portable.open_unfollowed(reviewed.path)
        except OSError:
            return moved
        try:
            found = os.fstat(fd)
            if (found.st_size, found.st_mtime_ns) != (reviewed.size, reviewed.modified_ns) \
                    or self._hash(fd, found) != reviewed.sha256:
                os.close(fd)
                return moved
        except OSError:
            os.close(fd)
            return moved
        assert reviewed.sha256 is not None
        return Playable(fd, found.st_size, reviewed.sha256, reviewed.name)

    def _hash(self, fd: int, found: os.stat_result) -> str:
        """The file's hash, remembered by everything that changes when it is written to
        (its change time included, which no program can set back)."""
        identity = (found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns,
                    found.st_ctime_ns)
        with self._verifying:
            known = self._verified.get(identity)
        if known is None:
            known = hash_of(fd)
            with self._verifying:
                self._verified[identity] = known
                while len(self._verified) > VERIFIED_FILES:
                    self._verified.popitem(last=False)
        return known
