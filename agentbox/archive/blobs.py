"""The archive's files: each distinct audio file once, named by the SHA-256 of its
bytes, in the data directory's `archive` folder (`ab/abcdef…`, the first two hex
digits a folder of their own), private to the user (folders 0700, files 0600).

A review's copy is made while the review reads the mix, in the analysis process
(`copy_in`): the export is read once, in large blocks, into a new file in
`incoming/`, and the meter then measures that copy, so that the bytes kept are
the bytes reviewed, whatever the DAW does to its file afterwards. A hard link
would not do: a DAW that renders to the same name again often truncates and
rewrites the same file (inode), and a link's bytes would change with it. A
reflink (a copy-on-write clone) would, where the file system has them; the copy
costs a little more disk work and works everywhere.

A copy is made only when it fits: no bigger than the archive's whole size, and
leaving the disk its free-space margin afterwards (`Keep`). Both are judged by the
file's size, the bytes a copy writes, not by the blocks the source takes: a sparse
file costs what its copy will. A disk that fills anyway while the copy is written
leaves no partial copy: the file is then only hashed.

The copy becomes the archive's in `commit`: flushed to disk, then renamed to its
name, so that a file under a hash's name always holds bytes of that hash, even
after a power cut. With the archive off, `fingerprint` only hashes the file (the
identity the audio route checks later). A sender's file is opened as itself, never
through a symbolic link and never blocking on a FIFO swapped in
(portable.open_unfollowed). This module uses only the standard library: the
analysis processes import it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from agentbox import portable

READ_BYTES = 1 << 20  # read and written at a time: a few system calls per second of audio
# The errors of a disk that has no room (or a user over their quota).
FULL_DISK = (errno.ENOSPC, errno.EDQUOT)
INCOMING = "incoming"
PART = ".part"  # a copy being written (its hash not yet known)
# Copies in incoming/ older than this were left by a review that never finished
# (a crash, a stop): swept.
STALE_INCOMING_SECONDS = 3600.0
_SHA256 = re.compile(r"[0-9a-f]{64}")


class SourceChanged(OSError):
    """The file was written to while it was read: what was read is no one file."""


def disk_full(exc: BaseException) -> bool:
    """Whether an error is the disk (or the user's quota) having no room."""
    return isinstance(exc, OSError) and exc.errno in FULL_DISK


@dataclass(frozen=True)
class Keep:
    """Where a review copies the mix it reads, and when it may not: a file bigger
    than `max_bytes` (the archive's size), or one that would leave less than
    `min_free_bytes` free on the disk, is only hashed."""

    folder: Path
    max_bytes: int
    min_free_bytes: int

    def refusal(self, size: int) -> str | None:
        """Why a file of `size` bytes is not copied, in a few words; None: it may be."""
        if size > self.max_bytes:
            return too_big(self.max_bytes)
        if shutil.disk_usage(self.folder).free - size < self.min_free_bytes:
            return too_full(self.min_free_bytes)
        return None


def too_big(max_bytes: int) -> str:
    return f"it is bigger than the archive's whole size ({max_bytes / 1e9:g} GB)"


def too_full(min_free_bytes: int) -> str:
    return (f"keeping it would have left less than {min_free_bytes // 1_000_000} MB free on "
            "the disk")


@dataclass(frozen=True)
class Identity:
    """A file as it was read: the hash of its bytes, its size and modification time."""

    sha256: str
    size: int
    modified_ns: int
    kept: bool = False  # a copy waits in incoming/ under the hash's name


def is_hash(text: str) -> bool:
    return bool(_SHA256.fullmatch(text))


def copy_in(source: Path, keep: Keep) -> tuple[Identity, Path | None]:
    """Read the file at `source` once, into a new private file in `keep.folder`; its
    identity and the copy's path (to be measured, then `ready`). No copy (None)
    when it does not fit (Keep.refusal) or the disk fills while it is written: then
    only hashed. Raises OSError, SourceChanged."""
    fd = portable.open_unfollowed(source)
    try:
        before = os.fstat(fd)
        if keep.refusal(before.st_size) is not None:
            return _read(fd, before, None), None
        part = keep.folder / f"{uuid.uuid4().hex}{PART}"
        try:
            found = _copy(fd, before, part)
        except OSError as exc:
            if not disk_full(exc):
                raise
            os.lseek(fd, 0, os.SEEK_SET)  # the disk filled: hashed only, nothing kept
            return _read(fd, before, None), None
        return Identity(found.sha256, found.size, found.modified_ns, kept=True), part
    finally:
        os.close(fd)


def _copy(fd: int, before: os.stat_result, part: Path) -> Identity:
    out = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0),
                  portable.PRIVATE_FILE)
    try:
        with os.fdopen(out, "wb") as sink:
            return _read(fd, before, sink)
    except BaseException:
        with contextlib.suppress(OSError):
            part.unlink()
        raise


def ready(part: Path, sha256: str) -> None:
    """A copy measured: it waits in incoming/ under its hash, for `Blobs.commit`.
    (Each review measures a copy of its own: two reviews of the same audio at once
    never read a file the other moves.)"""
    os.replace(part, part.with_name(sha256))


def fingerprint(source: Path) -> Identity:
    """The identity of the file at `source` (its bytes hashed, nothing kept)."""
    fd = portable.open_unfollowed(source)
    try:
        return _read(fd, os.fstat(fd), None)
    finally:
        os.close(fd)


def hash_of(fd: int) -> str:
    """The SHA-256 of an open file's bytes, read from its start."""
    os.lseek(fd, 0, os.SEEK_SET)
    return _read(fd, os.fstat(fd), None).sha256


def _read(fd: int, before: os.stat_result, sink: BinaryIO | None) -> Identity:
    digest = hashlib.sha256()
    buffer = bytearray(READ_BYTES)
    view = memoryview(buffer)
    size = 0
    with open(fd, "rb", buffering=0, closefd=False) as source:
        while n := source.readinto(buffer):
            digest.update(view[:n])
            if sink is not None:
                sink.write(view[:n])
            size += n
    after = os.fstat(fd)
    if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns) \
            or size != after.st_size:
        raise SourceChanged("the file was written to while it was read")
    return Identity(digest.hexdigest(), size, before.st_mtime_ns)


class Blobs:
    """The archive's folder: committed files by hash, and copies waiting in incoming/."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.incoming = root / INCOMING

    def prepare(self) -> None:
        """Make the folders (private) if they are missing."""
        portable.private_directory(self.root)
        portable.private_directory(self.incoming)

    def path(self, sha256: str) -> Path:
        if not is_hash(sha256):
            raise ValueError(f"{sha256[:80]!r} is not a SHA-256 in hex")
        return self.root / sha256[:2] / sha256

    def has(self, sha256: str) -> bool:
        return is_hash(sha256) and self.path(sha256).is_file()

    def open(self, sha256: str) -> int:
        """A read-only descriptor of a committed file (OSError when it is not there)."""
        return portable.open_unfollowed(self.path(sha256))

    def commit(self, sha256: str) -> bool:
        """Make the copy waiting in incoming/ under `sha256` the archive's: on disk
        first, then under its name. True when the archive holds the file afterwards
        (it may have had it already: the same audio is kept once)."""
        waiting = self.incoming / self.path(sha256).name
        final = self.path(sha256)
        if final.is_file():
            with contextlib.suppress(FileNotFoundError):
                waiting.unlink()
            return True
        try:  # (for writing: Windows flushes only what it may write to)
            fd = os.open(waiting, os.O_RDWR | getattr(os, "O_BINARY", 0))
        except FileNotFoundError:
            return final.is_file()  # another review of the same audio committed it
        try:
            portable.durable_flush(fd)
        finally:
            os.close(fd)
        portable.private_directory(final.parent)
        os.replace(waiting, final)
        portable.flush_directory(final.parent)
        return True

    def take(self, source: Path, sha256: str) -> None:
        """Move a file already hashed (an upload in incoming/) under its hash's name."""
        os.replace(source, self.incoming / self.path(sha256).name)
        self.commit(sha256)

    def remove(self, sha256: str) -> int:
        """Delete a committed file; the bytes it freed (0: it was not there)."""
        path = self.path(sha256)
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            return 0
        with contextlib.suppress(OSError):
            path.parent.rmdir()  # its folder, once empty
        return size

    def new_upload(self) -> Path:
        """A fresh name in incoming/ for bytes arriving by upload."""
        return self.incoming / f"{uuid.uuid4().hex}{PART}"

    def committed(self) -> Iterator[tuple[str, int]]:
        """(hash, size) of every committed file."""
        if not self.root.is_dir():
            return
        for folder in self.root.iterdir():
            if len(folder.name) != 2 or not folder.is_dir() or folder.is_symlink():
                continue
            for path in folder.iterdir():
                if is_hash(path.name) and path.name.startswith(folder.name):
                    with contextlib.suppress(FileNotFoundError):
                        yield path.name, path.stat().st_size

    def sweep_incoming(self, now: float | None = None) -> int:
        """Delete copies left in incoming/ by reviews that never finished; how many."""
        if not self.incoming.is_dir():
            return 0
        cutoff = (time.time() if now is None else now) - STALE_INCOMING_SECONDS
        swept = 0
        for path in self.incoming.iterdir():
            with contextlib.suppress(FileNotFoundError):
                if path.is_file() and path.stat().st_mtime < cutoff:
                    path.unlink()
                    swept += 1
        return swept
