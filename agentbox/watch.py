"""`agentbox watch DIR`: for DAWs that cannot POST a webhook.

The folder is polled (no platform-specific notification API needed). An audio
file counts as finished once its size and modification time have not changed
for `settle` seconds and, for the formats whose header says how much audio
follows (WAV, RF64, AIFF; FLAC's sample count, 0 until written), once that much
is there: a render that stalls
longer than the settle time, half written, is not taken for finished (after
`incomplete_grace` seconds unchanged it is sent all the same, and the review
says it is cut short). Then a `session.exported` event is sent for it.

The event_id is derived from the file's path, size and content when it was
finished, so a restart of the watcher, or a `touch`, sends the same id again,
which agentbox answers as a duplicate instead of starting a second run. Files
already in the folder when the watcher starts are left alone unless
`include_existing` is set.

A file agentbox could not take for a reason that heals (unreachable, busy,
unavailable, a signature refused while secrets are rotated) stays pending and
is tried again with backoff (`Pending`); only a refusal of the event itself
drops it.
"""

from __future__ import annotations

import hashlib
import os
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from agentbox.events import project_name, unfit_for_a_name

# What the review decodes (libsndfile: WAV and its RF64/W64/BWF kin, AIFF, FLAC,
# Ogg Vorbis/Opus, MP3, CAF). A test checks each against soundfile.
AUDIO_SUFFIXES = frozenset({".wav", ".wave", ".bwf", ".rf64", ".w64", ".flac", ".aif", ".aiff",
                            ".aifc", ".mp3", ".ogg", ".oga", ".opus", ".caf"})
DEFAULT_SETTLE_SECONDS = 2.0
# A file whose header promises more audio than it holds is waited for this long
# (unchanged), then sent: the review then says it was cut short.
DEFAULT_INCOMPLETE_GRACE_SECONDS = 60.0
RETRY_FIRST_SECONDS = 1.0
RETRY_MAX_SECONDS = 60.0

Stamp = tuple[int, int]  # size, mtime_ns


def audio_files(folder: Path) -> Iterator[tuple[Path, Stamp]]:
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            path = Path(root, name)
            if name.startswith(".") or path.suffix.lower() not in AUDIO_SUFFIXES:
                continue
            try:
                found = path.stat()
            except OSError:
                continue  # gone meanwhile
            yield path, (found.st_size, found.st_mtime_ns)


def content_id(path: Path, size: int) -> str:
    """The event_id of a finished file: its absolute path, size and content."""
    digest = hashlib.sha256(f"{path.resolve()}\0{size}\0".encode())
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return "watch-" + digest.hexdigest()[:40]


def project_of(path: Path) -> str:
    """A project_id from the file name: its stem as written, in Unicode NFC (as
    `send --project` and the event contract keep names), characters a project
    name cannot hold (control and invisible ones) replaced by a space."""
    cleaned = "".join(" " if unfit_for_a_name(c) else c for c in project_name(path.stem))
    return cleaned.strip()[:256].strip() or "mix"


# -- is the audio all there? ------------------------------------------------------------


def _chunks(f: BinaryIO, start: int, end: int, big_endian: bool
            ) -> Iterator[tuple[bytes, int, int]]:
    """(id, offset of its data, declared size) of each RIFF/IFF chunk in [start, end)."""
    offset = start
    while offset + 8 <= end:
        f.seek(offset)
        header = f.read(8)
        if len(header) < 8:
            return
        size = struct.unpack(">I" if big_endian else "<I", header[4:])[0]
        yield header[:4], offset + 8, size
        offset += 8 + size + (size & 1)


def audio_complete(path: Path) -> bool | None:
    """Whether a WAV, RF64 or AIFF file holds all the audio its header declares:
    False while a writer has not yet filled it in (or it was cut short), None for
    formats without such a header (their stable size has to do). A FLAC file is
    False while its header's sample count is still 0 (being written), else None."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(12)
            kind, form = head[:4], head[8:12]
            if kind in (b"RIFF", b"RF64") and form == b"WAVE":
                return _wave_complete(f, size, kind == b"RF64")
            if kind == b"FORM" and form in (b"AIFF", b"AIFC"):
                return _data_complete(f, size, b"SSND", big_endian=True)
            if kind == b"fLaC":
                return _flac_complete(head + f.read(30))
    except OSError:
        return None
    return None


def _flac_complete(head: bytes) -> bool | None:
    """False while STREAMINFO's total samples is 0 (libFLAC fills it in when it
    finishes); otherwise unknown: FLAC's frames cannot be counted cheaply."""
    if len(head) < 8 + 18 or head[4] & 0x7F != 0:  # the first block must be STREAMINFO
        return None
    total = int.from_bytes(head[8 + 10:8 + 18], "big") & ((1 << 36) - 1)
    return False if total == 0 else None


def _wave_complete(f: BinaryIO, size: int, rf64: bool) -> bool:
    if not rf64:
        return _data_complete(f, size, b"data", big_endian=False)
    declared = None
    for chunk, start, length in _chunks(f, 12, size, big_endian=False):
        if chunk == b"ds64" and length >= 16:
            f.seek(start + 8)  # after the RIFF size: the data size
            declared = struct.unpack("<Q", f.read(8))[0]
        elif chunk == b"data":
            return declared is not None and start + declared <= size
    return False


def _data_complete(f: BinaryIO, size: int, data_id: bytes, big_endian: bool) -> bool:
    for chunk, start, length in _chunks(f, 12, size, big_endian):
        if chunk == data_id:
            # 0 or 0xFFFFFFFF with audio after it: a size the writer fills in at the end.
            placeholder = length in (0, 0xFFFFFFFF) and start < size
            return not placeholder and start + length <= size
    return False  # no audio chunk yet


# -- which files are finished ---------------------------------------------------------------


@dataclass
class Watcher:
    folder: Path
    settle: float = DEFAULT_SETTLE_SECONDS
    include_existing: bool = False
    clock: Callable[[], float] = time.monotonic
    incomplete_grace: float = DEFAULT_INCOMPLETE_GRACE_SECONDS
    _seen: dict[Path, tuple[Stamp, float]] = field(default_factory=dict)  # stamp, since when
    _done: dict[Path, Stamp] = field(default_factory=dict)  # last stamp sent (or skipped)
    _started: bool = False

    def poll(self) -> list[Path]:
        """Files that have just finished being written (each once per change)."""
        now = self.clock()
        current = dict(audio_files(self.folder))
        if not self._started:
            self._started = True
            if not self.include_existing:
                self._done.update(current)
        ready = []
        for path, stamp in current.items():
            if self._done.get(path) == stamp:
                continue
            previous = self._seen.get(path)
            if previous is None or previous[0] != stamp:
                self._seen[path] = (stamp, now)  # new or still changing
                continue
            unchanged = now - previous[1]
            if unchanged >= self.settle and stamp[0] > 0 and (
                    unchanged >= self.incomplete_grace or audio_complete(path) is not False):
                ready.append(path)
        for path in set(self._seen) - set(current):
            del self._seen[path]
        return ready

    @property
    def busy(self) -> bool:
        """Some file is still changing (or waiting to settle)."""
        return bool(self._seen)

    def sent(self, path: Path) -> None:
        """`path` was handed to agentbox (or refused for good): not again until it changes."""
        stamp = self._seen.pop(path, None)
        if stamp is not None:
            self._done[path] = stamp[0]


# -- files waiting to be taken ---------------------------------------------------------------


@dataclass
class Pending:
    """A finished file agentbox has not taken yet: tried again with backoff."""

    path: Path
    event_id: str
    due: float = 0.0  # clock time of the next attempt
    delay: float = RETRY_FIRST_SECONDS
    said: str | None = None  # the reason last printed: each reason is printed once

    def later(self, now: float) -> None:
        self.due = now + self.delay
        self.delay = min(self.delay * 2, RETRY_MAX_SECONDS)
