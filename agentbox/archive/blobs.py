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

The copy becomes the archive's in `commit`: flushed to disk, then renamed to its
name, so that a file under a hash's name always holds bytes of that hash, even
after a power cut. With the archive off, `fingerprint` only hashes the file (the
identity the audio route checks later). This module uses only the standard
library: the analysis processes import it.
"""

from __future__ import annotations

import contextlib
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
# A copy is not made when it would leave less than this free on the archive's disk:
# the database and the DAW's own renders come first.
MIN_FREE_BYTES = 1 << 30
INCOMING = "incoming"
PART = ".part"  # a copy being written (its hash not yet known)
# Copies in incoming/ older than this were left by a review that never finished
# (a crash, a stop): swept.
STALE_INCOMING_SECONDS = 3600.0
_SHA256 = re.compile(r"[0-9a-f]{64}")


class SourceChanged(OSError):
    """The file was written to while it was read: what was read is no one file."""


@dataclass(frozen=True)
class Identity:
    """A file as it was read: the hash of its bytes, its size and modification time."""

    sha256: str
    size: int
    modified_ns: int
    kept: bool = False  # a copy waits in incoming/ under the hash's name


def is_hash(text: str) -> bool:
    return bool(_SHA256.fullmatch(text))


def copy_in(source: Path, incoming: Path) -> tuple[Identity, Path | None]:
    """Read the file at `source` once, into a new private file in `incoming`; its
    identity and the copy's path (to be measured, then `ready`). No copy (None)
    when it would leave the disk too full: then only hashed. Raises OSError,
    SourceChanged."""
    fd = os.open(source, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    try:
        before = os.fstat(fd)
        if shutil.disk_usage(incoming).free - before.st_size < MIN_FREE_BYTES:
            return _read(fd, before, None), None
        part = incoming / f"{uuid.uuid4().hex}{PART}"
        out = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0),
                      portable.PRIVATE_FILE)
        try:
            with os.fdopen(out, "wb") as sink:
                found = _read(fd, before, sink)
        except BaseException:
            with contextlib.suppress(OSError):
                part.unlink()
            raise
        return Identity(found.sha256, found.size, found.modified_ns, kept=True), part
    finally:
        os.close(fd)


def ready(part: Path, sha256: str) -> None:
    """A copy measured: it waits in incoming/ under its hash, for `Blobs.commit`.
    (Each review measures a copy of its own: two reviews of the same audio at once
    never read a file the other moves.)"""
    os.replace(part, part.with_name(sha256))


def fingerprint(source: Path) -> Identity:
    """The identity of the file at `source` (its bytes hashed, nothing kept)."""
    fd = os.open(source, os.O_RDONLY | getattr(os, "O_BINARY", 0))
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
