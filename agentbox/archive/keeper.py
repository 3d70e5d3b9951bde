"""The archive of exports as the server holds it: an object the app makes, opens and
closes, and lends to the review agent (AgentContext.service).

A review copies the mix into `incoming` as it reads it (agentbox.archive.blobs);
`keep` then makes the copy the archive's, in the background (flushed to disk
first: a file under its hash's name always holds those bytes) and records it in
the review's history; the run does not wait for it. After each keep, and with each
retention pass, `bound` lets the oldest go when the archive is over its bounds
(agentbox.archive.budget) and deletes the files nothing needs any more. Keeping
and bounding take turns (one lock): a file is never deleted between its copy and
its record.

`audio` finds the bytes a review heard, for the page's players: the archive's
copy, or, with the archive off, the file at the review's path if it is still the
one reviewed (same size, modification time and SHA-256; never a symlink swapped
in since). A project's reference track is kept in the same folder, whether the
archive keeps exports or not (it was given to be kept).

Instances that share a PostgreSQL database each keep their own folder: the
records name the `keeper` (an id made once per folder, in its `keeper` file), and
each instance bounds and serves what it keeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentbox import portable
from agentbox.archive import budget
from agentbox.archive.blobs import Blobs, Keep, disk_full, hash_of, is_hash, too_big, too_full
from agentbox.archive.history import History
from agentbox.archive.records import KeptAudio, ProjectReference
from agentbox.archive.settings import ArchiveSettings, archive_path
from agentbox.config import Settings
from agentbox.logs import get_logger

log = get_logger("archive")

PENDING_WAIT_SECONDS = 30.0  # an audio request waits this long for a copy being kept
VERIFIED_FILES = 256  # files whose hash is remembered by identity (the archive off)
KEEPER_FILE = "keeper"  # the folder's id, which the store's records name
PROJECT_REMOVED = "its project was removed"  # why a removed project's audio went


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
    """The archive of exports (or, off, the check of a reviewed file's identity), and
    the projects' reference tracks."""

    def __init__(self, settings: Settings, history: History,
                 clock: Callable[[], float] = time.time) -> None:
        kept = settings.of(ArchiveSettings)
        self.on = kept.archive
        self.history = history
        self.clock = clock
        self.bounds = budget.Bounds(kept.max_bytes, kept.archive_keep_per_project)
        self.blobs = Blobs(archive_path(settings.data_dir))
        self.min_free_bytes = kept.min_free_bytes  # left free on the archive's disk
        self.keeper = ""  # the folder's id, once it is made
        self._lock = asyncio.Lock()  # keeping and bounding take turns
        self._pending: dict[str, set[asyncio.Task[None]]] = {}  # hash -> keeps under way
        self._verified: OrderedDict[tuple[int, ...], str] = OrderedDict()
        self._verifying = threading.Lock()  # _verified is used from worker threads

    # -- the server's life --------------------------------------------------------------

    async def open(self) -> None:
        """Make the folder, if exports are kept, and sweep what an unfinished review
        left (off the loop). A folder that cannot be made keeps nothing: reviews go on."""
        if self.on:
            await self._ready()

    async def _ready(self) -> bool:
        if self.keeper:
            return True
        try:
            self.keeper = await asyncio.to_thread(self._prepare)
        except OSError as exc:
            log.warning("the archive's folder cannot be made: nothing is kept",
                        extra={"path": str(self.blobs.root), "reason": str(exc)})
        return bool(self.keeper)

    def _prepare(self) -> str:
        self.blobs.prepare()
        self.blobs.sweep_incoming()
        named = self.blobs.root / KEEPER_FILE
        if not named.is_file():
            made = f"{socket.gethostname()}-{uuid.uuid4().hex[:12]}"
            portable.write_durably(named, made + "\n", portable.PRIVATE_FILE)
        return named.read_text(encoding="utf-8").strip()

    async def close(self) -> None:
        """Let the copies being kept finish (each is a flush, a rename, a record)."""
        await self.settled()

    async def settled(self) -> None:
        """Wait until every copy being kept is kept (tests, shutdown)."""
        while self._pending:
            tasks = {task for tasks in self._pending.values() for task in tasks}
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- keeping ------------------------------------------------------------------------

    @property
    def incoming(self) -> Path | None:
        """Where a review copies the mix it reads; None: exports are not kept."""
        return self.blobs.incoming if self.on and self.keeper else None

    @property
    def keeping(self) -> Keep | None:
        """Where a review copies the mix it reads, and what fits there; None: exports
        are not kept."""
        incoming = self.incoming
        return None if incoming is None else Keep(incoming, self.bounds.max_bytes,
                                                  self.min_free_bytes)

    def keep(self, *, run_id: str, project: str, sha256: str, size: int,
             file_name: str) -> None:
        """Make the copy a review left in incoming/ the archive's, and record it, in
        the background; then hold the archive to its bounds."""
        if self.incoming is None or not is_hash(sha256):
            return
        kept = KeptAudio(run_id=run_id, project=project, sha256=sha256, size=size,
                         file_name=file_name, keeper=self.keeper, kept_at=self.clock())
        task = asyncio.create_task(self._keep(kept), name="agentbox-archive-keep")
        self._pending.setdefault(sha256, set()).add(task)
        task.add_done_callback(lambda done: self._done(sha256, done))

    def _done(self, sha256: str, task: asyncio.Task[None]) -> None:
        tasks = self._pending.get(sha256, set())
        tasks.discard(task)
        if not tasks:
            self._pending.pop(sha256, None)

    async def _keep(self, kept: KeptAudio) -> None:
        try:
            async with self._lock:
                try:
                    committed = await asyncio.to_thread(self.blobs.commit, kept.sha256)
                except OSError as exc:
                    if not disk_full(exc):
                        raise
                    committed = False
                if not committed:  # no copy was made: the review says why
                    await self._not_kept(kept)
                    return
                await self.history.keep_audio(kept)
            await self.bound()
        except Exception:  # never the review's failure: its export is just not kept
            log.warning("a reviewed export could not be kept", exc_info=True,
                        extra={"run_id": kept.run_id})

    async def _not_kept(self, kept: KeptAudio) -> None:
        """Record an export the archive could not copy as let go at once, with why (the
        size it is judged by is the one it was copied by: Keep.refusal)."""
        why = too_big(self.bounds.max_bytes) if kept.size > self.bounds.max_bytes \
            else too_full(self.min_free_bytes)
        await self.history.keep_audio(kept)
        await self.history.drop_audio([(kept.run_id, f"the archive kept no copy: {why}")],
                                      self.clock())
        log.warning("a reviewed export was not kept", extra={"run_id": kept.run_id,
                                                              "reason": why})

    async def bound(self) -> int:
        """Let go what is over the bounds, oldest first, and delete the files nothing
        needs any more; how many exports were let go."""
        if not self.keeper:
            return 0
        async with self._lock:
            live = await self.history.live_audio(self.keeper)
            references = await self._references()
            drops = budget.choose(live, references, self.bounds)
            if drops:
                await self.history.drop_audio(drops, self.clock())
                log.info("the archive let exports go",
                         extra={"count": len(drops), "reason": drops[0][1]})
            gone = {run_id for run_id, _ in drops}
            needed = {k.sha256 for k in live if k.run_id not in gone}
            needed |= {r.sha256 for r in references}
            await asyncio.to_thread(self._delete_unneeded, needed)
        return len(drops)

    async def forget_project(self, project: str) -> int:
        """A removed project's audio goes: its exports' kept copies are let go (as
        the bounds let copies go: recorded as dropped, the files deleted once nothing
        needs them) and its reference track is removed; how many copies went."""
        await self.history.remove_reference(project)
        if not self.keeper:
            return 0
        async with self._lock:
            kept = [k for k in await self.history.kept_audio(project, limit=100_000)
                    if k.dropped_at is None and k.keeper == self.keeper]
            dropped = await self.history.drop_audio(
                [(k.run_id, PROJECT_REMOVED) for k in kept], self.clock())
            needed = {k.sha256 for k in await self.history.live_audio(self.keeper)}
            needed |= {r.sha256 for r in await self._references()}
            await asyncio.to_thread(self._delete_unneeded, needed)
        return dropped

    async def _references(self) -> list[ProjectReference]:
        return [r for r in await self.history.references(limit=100_000)
                if r.keeper == self.keeper]

    def _delete_unneeded(self, needed: set[str]) -> None:
        for sha256, _ in list(self.blobs.committed()):
            if sha256 not in needed and sha256 not in self._pending:
                self.blobs.remove(sha256)

    async def usage(self) -> tuple[int, int]:
        """(bytes the kept files take, the bound), for the page."""
        if not self.keeper:
            return 0, self.bounds.max_bytes
        live = await self.history.live_audio(self.keeper)
        return budget.total_bytes(live, await self._references()), self.bounds.max_bytes

    # -- reference tracks ---------------------------------------------------------------

    async def upload_folder(self) -> Path | None:
        """Where an upload is written before it is measured; None: no folder."""
        return self.blobs.incoming if await self._ready() else None

    async def reference_refusal(self, project: str, size: int, arrived: bool = False
                                ) -> str | None:
        """Why a reference track of `size` bytes cannot be kept for `project`, in a
        sentence; None: it can. References are never let go, so they must fit in the
        archive's size together; and the upload must leave the disk its margin (once
        `arrived`, it was held to it as it was written)."""
        others = {r.sha256: r.size for r in await self._references() if r.project != project}
        if sum(others.values()) + size > self.bounds.max_bytes:
            return (f"the archive's size ({self.bounds.max_bytes / 1e9:g} GB, "
                    "AGENTBOX_ARCHIVE_MAX_GB) cannot hold it beside the other projects' "
                    "reference tracks")
        if arrived:
            return None
        free = (await asyncio.to_thread(shutil.disk_usage, self.blobs.root)).free
        if free - size < self.min_free_bytes:
            return (f"keeping it would leave less than {self.min_free_bytes // 1_000_000} MB "
                    "free on the disk (AGENTBOX_MIN_FREE_MB)")
        return None

    async def add_reference(self, *, project: str, name: str, upload: Path, sha256: str,
                            size: int, measurements: dict[str, Any]) -> ProjectReference:
        """Make the uploaded file (in incoming/, hashed, measured) the project's
        reference track; the one it replaces goes unless something else needs it."""
        reference = ProjectReference(project=project, name=name, sha256=sha256, size=size,
                                     keeper=self.keeper, measurements=measurements,
                                     added_at=self.clock())
        async with self._lock:
            await asyncio.to_thread(self.blobs.take, upload, sha256)
            await self.history.set_reference(reference)
        await self.bound()
        return reference

    async def remove_reference(self, project: str) -> ProjectReference | None:
        removed = await self.history.remove_reference(project)
        if removed is not None:
            await self.bound()
        return removed

    async def reference_audio(self, reference: ProjectReference) -> Playable | Gone:
        if not await self._ready():
            return Gone("the archive's folder cannot be read")
        if reference.keeper != self.keeper:
            return Gone(f"the reference track is kept by another agentbox instance "
                        f"({reference.keeper})")
        return await self._kept(reference.sha256, reference.name)

    # -- playing ------------------------------------------------------------------------

    async def audio(self, reviewed: Reviewed) -> Playable | Gone:
        """The bytes a review heard, or why they cannot be played."""
        if reviewed.sha256 is None or not is_hash(reviewed.sha256):
            return Gone("this review was made before agentbox kept what it reviewed; "
                        "export the mix again to hear it here")
        if self.on:
            return await self._kept(reviewed.sha256, reviewed.name)
        return await asyncio.to_thread(self._unchanged, reviewed)

    async def heard_at(self, reviewed: Reviewed) -> Path | Gone:
        """Where the bytes a review heard can be read again (to judge them at another
        stage): the archive's copy, or, with the archive off, the file itself while it
        is unchanged; or why they cannot."""
        played = await self.audio(reviewed)
        if isinstance(played, Gone):
            return played
        os.close(played.fd)
        if self.on:
            return self.blobs.path(played.sha256)
        assert reviewed.path is not None  # _unchanged found the file there
        return reviewed.path

    async def _kept(self, sha256: str, name: str) -> Playable | Gone:
        pending = self._pending.get(sha256)
        if pending:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True),
                                       PENDING_WAIT_SECONDS)
        try:
            fd = await asyncio.to_thread(self.blobs.open, sha256)
        except OSError:
            return Gone("the archive does not hold it any more (it keeps the latest "
                        "exports within its bounds, and copies nothing while the disk is "
                        "nearly full)")
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
