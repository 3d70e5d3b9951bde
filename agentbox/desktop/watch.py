"""`agentbox watch DIR`: for DAWs that cannot POST a webhook.

The folder is polled (no platform-specific notification API needed). An audio
file counts as finished once its size and modification time have not changed
for `settle` seconds and, where the format says how much audio follows, once
that much is there: the data sizes of WAV, RF64, W64, AIFF and CAF, FLAC's
sample count (0 until written), the last Ogg page's end-of-stream flag, an MP3's
Xing/Info frame. A render that stalls longer than the settle time, half
written, is not taken for finished (after `incomplete_grace` seconds unchanged
it is sent all the same, and the review says it is cut short). A streamed file
that says nothing of its length (an MP3 without a Xing/Info frame, a CAF whose
data size is "to the end") must stay unchanged for `headerless_settle`
seconds instead. Then a `session.exported` event is sent for it.

One export is one run however its writer stalls. The event_id is derived from
the file's path, size and content when it was first sent, so a restart of the
watcher, or a `touch`, sends the same id again, which agentbox answers as a
duplicate. A file that grows after it was sent, its earlier bytes unchanged,
is the same export written on (`Watcher.continues`): it is sent again under the
same event_id (a duplicate: still one run), and when that run's review turns
out to be of the shorter file, the whole file is reviewed again by a follow-up
`mix.review_requested` that names the run (`causation_id`). A file rewritten
from the start (a new export under the same name) is a new export. Files
already in the folder when the watcher starts are left alone unless
`include_existing` is set.

A file agentbox could not take for a reason that heals (unreachable, busy,
unavailable, a signature refused while secrets are rotated) stays pending and
is tried again with backoff (`Pending`); only a refusal of the event itself
drops it.

What was sent is kept on disk (`state_file`: a small JSON file per folder in
the data directory, replaced whole with each change), so a watcher restarted
goes on where it stopped: a file sent before and written on since, while it
was stopped or after, is still that export (one run); one it had not yet
handed over, or had found still being written and not yet sent, is sent once
it is done.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from agentbox import portable
from agentbox.events import project_name, unfit_for_a_name

# What the review decodes (libsndfile: WAV and its RF64/W64/BWF kin, AIFF, FLAC,
# Ogg Vorbis/Opus, MP3, CAF). A test checks each against soundfile.
AUDIO_SUFFIXES = frozenset({".wav", ".wave", ".bwf", ".rf64", ".w64", ".flac", ".aif", ".aiff",
                            ".aifc", ".mp3", ".ogg", ".oga", ".opus", ".caf"})
DEFAULT_SETTLE_SECONDS = 2.0
# A streamed format whose file says nothing of its length (an MP3 without a
# Xing/Info frame, a CAF written "to the end") is sent after this long unchanged.
DEFAULT_HEADERLESS_SETTLE_SECONDS = 10.0
HEADERLESS_SUFFIXES = frozenset({".mp3", ".ogg", ".oga", ".opus", ".caf", ".w64"})
# How much of a sent file's end is kept to tell a file written on (those bytes
# unchanged) from a new export under the same name.
TAIL_BYTES = 65_536
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
    """Whether the file holds all the audio its header declares: False while a
    writer has not yet filled it in (or it was cut short), None when the file
    says nothing of its length (the time it stays unchanged has to decide).
    WAV, RF64, W64, AIFF and CAF: the audio chunk's size; FLAC: False while its
    sample count is 0; Ogg: the last page whole and flagged end-of-stream; MP3:
    the byte count of its Xing/Info frame."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(40)
            kind, form = head[:4], head[8:12]
            if kind in (b"RIFF", b"RF64") and form == b"WAVE":
                return _wave_complete(f, size, kind == b"RF64")
            if kind == b"FORM" and form in (b"AIFF", b"AIFC"):
                return _data_complete(f, size, b"SSND", big_endian=True)
            if kind == b"fLaC":
                return _flac_complete(head + f.read(30))
            if head[:16] == W64_RIFF and head[24:40] == W64_WAVE:
                return _w64_complete(f, size, int.from_bytes(head[16:24], "little"))
            if kind == b"caff":
                return _caf_complete(f, size)
            if kind == b"OggS":
                return _ogg_complete(f, size)
            if kind[:3] == b"ID3" or (kind[0] == 0xFF and kind[1] & 0xE0 == 0xE0):
                return _mp3_complete(f, size)
    except (OSError, ValueError, IndexError):
        return None
    return None


W64_RIFF = bytes.fromhex("726966662e91cf11a5d628db04c10000")
W64_WAVE = bytes.fromhex("77617665f3acd3118cd100c04f8edb8a")


def _w64_complete(f: BinaryIO, size: int, declared: int) -> bool:
    """Sony Wave64: GUID-named chunks, 64-bit sizes that count their own 24-byte
    header, 8-byte aligned; libsndfile leaves the file's size 0 until it closes."""
    if declared == 0 or declared > size:
        return False
    offset = 40
    while offset + 24 <= size:
        f.seek(offset)
        header = f.read(24)
        length = int.from_bytes(header[16:24], "little")
        if header[:4] == b"data":
            return length > 24 and offset + length <= size
        if length < 24:
            return False
        offset += (length + 7) // 8 * 8
    return False


def _caf_complete(f: BinaryIO, size: int) -> bool | None:
    """CAF: chunks of (type, big-endian int64 size); the audio data's size is -1
    when written "to the end" (then the file says nothing of its length)."""
    offset = 8
    while offset + 12 <= size:
        f.seek(offset)
        header = f.read(12)
        length = int.from_bytes(header[4:], "big", signed=True)
        start = offset + 12
        if header[:4] == b"data":
            if length == -1:
                return None
            end = start + length
            # A size the writer has not filled in yet is short of the audio after it.
            return end <= size and (end == size or _chunk_id(f, end))
        if length < 0:
            return False
        offset = start + length
    return False


def _chunk_id(f: BinaryIO, offset: int) -> bool:
    """Whether a chunk starts at `offset` (its type four printable characters)."""
    f.seek(offset)
    kind = f.read(4)
    return len(kind) == 4 and all(32 < c < 127 for c in kind)


def _ogg_complete(f: BinaryIO, size: int) -> bool:
    """Ogg: the stream's last page, whole and flagged end-of-stream, is written last."""
    start = max(0, size - 70_000)  # a page is at most 65,307 bytes
    f.seek(start)
    tail = f.read()
    at = tail.rfind(b"OggS")
    while at >= 0:
        page = tail[at:]
        if len(page) >= 27 and page[4] == 0 and len(page) >= 27 + page[26]:
            length = 27 + page[26] + sum(page[27:27 + page[26]])
            if at + length == len(tail):
                return bool(page[5] & 0x04)
        at = tail.rfind(b"OggS", 0, at)
    return False


def _mp3_complete(f: BinaryIO, size: int) -> bool | None:
    """MP3: a Xing/Info frame (or VBRI) at the start says how many bytes follow; an
    encoder fills its counts in when it finishes. Without one, None."""
    f.seek(0)
    head = f.read(10)
    start = 0
    if head[:3] == b"ID3":  # a tag first: its size is four 7-bit bytes
        start = 10 + sum((b & 0x7F) << (7 * (3 - i)) for i, b in enumerate(head[6:10]))
        start += 10 if head[5] & 0x10 else 0  # a footer too
    f.seek(start)
    frame = f.read(200)
    if len(frame) < 4 or frame[0] != 0xFF or frame[1] & 0xE0 != 0xE0:
        return None
    at = max(frame.find(b"Xing"), frame.find(b"Info"))
    if at >= 0:
        flags = int.from_bytes(frame[at + 4:at + 8], "big")
        fields = frame[at + 8:at + 16]
        frames = int.from_bytes(fields[:4], "big") if flags & 1 else None
        total = int.from_bytes(fields[4:8] if flags & 1 else fields[:4], "big") \
            if flags & 2 else None
        if frames == 0 or total == 0:
            return False
        return total is None or start + total <= size
    at = frame.find(b"VBRI")
    if at >= 0:
        total = int.from_bytes(frame[at + 10:at + 14], "big")
        return total > 0 and start + total <= size
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
class Export:
    """A file as it was sent: what tells the same export written on from a new one."""

    event_id: str
    size: int
    tail: bytes  # a digest of its last TAIL_BYTES (past the first half)
    stamp: Stamp | None = None  # its size and mtime when sent: changed since, if not now
    taken: bool = False  # agentbox answered for it (a run, or a refusal for good)

    def as_json(self) -> dict[str, Any]:
        return {"event_id": self.event_id, "size": self.size, "tail": self.tail.hex(),
                "stamp": list(self.stamp) if self.stamp else None, "taken": self.taken}

    @classmethod
    def of_json(cls, found: Any) -> Export:
        """One kept in the state file (ValueError, KeyError or TypeError if not one)."""
        stamp = found["stamp"]
        return cls(str(found["event_id"]), int(found["size"]), bytes.fromhex(found["tail"]),
                   (int(stamp[0]), int(stamp[1])) if stamp else None, bool(found["taken"]))


STATE_VERSION = 1


def state_file(data_dir: Path, folder: Path) -> Path:
    """Where the watcher of `folder` keeps what it sent: a file per folder, named by
    its absolute path."""
    key = hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:20]
    return data_dir / "watch" / f"{key}.json"


def tail_digest(path: Path, size: int) -> bytes:
    """A digest of the bytes before `size`: a writer that only appends (and fills in
    its header) leaves them as they were; a new export rewrites them."""
    start = max(size // 2, size - TAIL_BYTES)
    with open(path, "rb") as f:
        f.seek(start)
        return hashlib.sha256(f.read(size - start)).digest()


@dataclass
class Watcher:
    folder: Path
    settle: float = DEFAULT_SETTLE_SECONDS
    include_existing: bool = False
    clock: Callable[[], float] = time.monotonic
    incomplete_grace: float = DEFAULT_INCOMPLETE_GRACE_SECONDS
    headerless_settle: float = DEFAULT_HEADERLESS_SETTLE_SECONDS
    state: Path | None = None  # where what was sent is kept (None: in memory only)
    warn: Callable[[str], None] = lambda message: None  # the state file's trouble, once
    _seen: dict[Path, tuple[Stamp, float]] = field(default_factory=dict)  # stamp, since when
    _done: dict[Path, Stamp] = field(default_factory=dict)  # last stamp sent (or skipped)
    _exports: dict[Path, Export] = field(default_factory=dict)  # what was sent, per file
    _found: set[Path] = field(default_factory=set)  # being written, not yet sent
    _started: bool = False
    _warned: bool = False

    def poll(self) -> list[Path]:
        """Files that have just finished being written (each once per change)."""
        now = self.clock()
        current = dict(audio_files(self.folder))
        if not self._started:
            self._started = True
            self._exports.update(self._load(current))
            if not self.include_existing:
                # Except a file sent before and changed since, or not yet handed over,
                # or found being written and not yet sent when the last watcher stopped.
                self._done.update((path, stamp) for path, stamp in current.items()
                                  if self._settled(path, stamp))
        ready = []
        found = set(self._found)
        for path, stamp in current.items():
            if self._done.get(path) == stamp:
                continue
            previous = self._seen.get(path)
            if previous is None or previous[0] != stamp:
                self._seen[path] = (stamp, now)  # new or still changing
                if path not in self._exports:
                    self._found.add(path)  # a restart before it is sent still sends it
                continue
            unchanged = now - previous[1]
            if (self._finished(path, unchanged) if stamp[0] > 0
                    else unchanged >= self.incomplete_grace):  # a render that wrote nothing
                ready.append(path)
        for path in set(self._seen) - set(current):
            del self._seen[path]
        gone = set(self._exports) - set(current)
        for path in gone:
            del self._exports[path]  # gone: what comes under its name is a new export
        self._found &= set(current)
        if gone or self._found != found:
            self._save()
        return ready

    def _settled(self, path: Path, stamp: Stamp) -> bool:
        """A file found at start that needs nothing: not sent before, or sent, handed
        over and unchanged since."""
        if path in self._found:
            return False
        earlier = self._exports.get(path)
        return earlier is None or (earlier.taken and earlier.stamp == stamp)

    def _finished(self, path: Path, unchanged: float) -> bool:
        if unchanged < self.settle:
            return False
        if unchanged >= self.incomplete_grace:
            return True
        complete = audio_complete(path)
        if complete is None and path.suffix.lower() in HEADERLESS_SUFFIXES:
            return unchanged >= self.headerless_settle  # its length is known nowhere
        return complete is not False

    @property
    def busy(self) -> bool:
        """Some file is still changing (or waiting to settle)."""
        return bool(self._seen)

    def continues(self, path: Path) -> Export | None:
        """The export `path` was sent as, if it is that file written on since (it grew,
        or its header was filled in, and the bytes before its old end are unchanged);
        None for a file never sent, or one rewritten as a new export."""
        earlier = self._exports.get(path)
        if earlier is None:
            return None
        try:
            size = path.stat().st_size
            same = size >= earlier.size and tail_digest(path, earlier.size) == earlier.tail
        except OSError:
            same = False
        if not same:
            del self._exports[path]
            self._save()
        return earlier if same else None

    def sent(self, path: Path, event_id: str | None = None) -> None:
        """`path` is being handed to agentbox as `event_id` (or was refused for good):
        not again until it changes."""
        stamp = self._seen.pop(path, None)
        if stamp is not None:
            self._done[path] = stamp[0]
        self._found.discard(path)
        if event_id is not None:
            try:
                found = path.stat()
                self._exports[path] = Export(
                    event_id, found.st_size, tail_digest(path, found.st_size),
                    stamp[0] if stamp else (found.st_size, found.st_mtime_ns))
            except OSError:
                self._exports.pop(path, None)
        self._save()

    def taken(self, path: Path) -> None:
        """agentbox answered for `path` (a run, or a refusal for good): a restart does
        not send it again unless it changes."""
        earlier = self._exports.get(path)
        if earlier is not None and not earlier.taken:
            earlier.taken = True
            self._save()

    # -- the state file ---------------------------------------------------------------

    def _load(self, current: dict[Path, Stamp]) -> dict[Path, Export]:
        """What an earlier watcher of this folder sent, of the files still here."""
        if self.state is None:
            return {}
        try:
            kept = json.loads(self.state.read_text(encoding="utf-8"))
            if kept.get("version") != STATE_VERSION:
                raise ValueError("another version")
            found = {self.folder / name: Export.of_json(export)
                     for name, export in kept["exports"].items()}
            self._found = {self.folder / str(name) for name in kept.get("found", [])
                           } & set(current)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
            self._trouble(f"{self.state} cannot be read ({type(exc).__name__}); starting "
                          "afresh: a file written on since it was sent may be sent as new")
            return {}
        return {path: export for path, export in found.items() if path in current}

    def _save(self) -> None:
        if self.state is None:
            return
        kept = {"version": STATE_VERSION, "folder": str(self.folder.resolve()),
                "exports": {str(path.relative_to(self.folder)): export.as_json()
                            for path, export in sorted(self._exports.items())},
                "found": sorted(str(path.relative_to(self.folder)) for path in self._found)}
        try:
            self.state.parent.mkdir(parents=True, exist_ok=True)
            portable.write_durably(self.state, json.dumps(kept, indent=1) + "\n")
        except OSError as exc:
            self._trouble(f"{self.state} cannot be written ({exc.strerror}); what was sent "
                          "is kept in memory only")

    def _trouble(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            self.warn(message)


# -- files waiting to be taken ---------------------------------------------------------------


@dataclass
class Pending:
    """A finished file agentbox has not taken yet: tried again with backoff."""

    path: Path
    event_id: str
    grown: bool = False  # the file continues an export sent before (same event_id)
    again_of: str | None = None  # a follow-up: the whole file, for the run of its start
    due: float = 0.0  # clock time of the next attempt
    delay: float = RETRY_FIRST_SECONDS
    said: str | None = None  # the reason last printed: each reason is printed once

    def later(self, now: float) -> None:
        self.due = now + self.delay
        self.delay = min(self.delay * 2, RETRY_MAX_SECONDS)


@dataclass
class Reviewing:
    """A run whose review is awaited: printed when it finishes, or, when the file
    grew after it was sent and the review is of less than the whole file, followed
    up by a review of the whole file."""

    name: str
    path: Path
    event_id: str
    size: int  # the file's size when it was (last) sent
    grown: bool = False


def reviewed_whole(run: dict[str, object], size: int) -> bool:
    """Whether a finished run's review read `size` bytes (the file as last sent)."""
    result = run.get("result")
    file = result.get("file") if isinstance(result, dict) else None
    read = file.get("size_bytes") if isinstance(file, dict) else None
    return run.get("status") == "succeeded" and read == size


def follow_up_id(event_id: str, size: int) -> str:
    """The event_id of the review of the whole file, `size` bytes, of an export
    whose run read less of it: one per size, so sending it again is a duplicate."""
    return "watch-" + hashlib.sha256(f"{event_id}\0whole\0{size}".encode()).hexdigest()[:40]
