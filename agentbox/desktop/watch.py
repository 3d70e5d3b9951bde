"""`agentbox watch DIR`: for DAWs that cannot POST a webhook.

The folder is polled (no platform-specific notification API needed). An audio
file counts as finished once its size and modification time have not changed
for `settle` seconds and, where the format says how much audio follows, once
that much is there: the data sizes of WAV, RF64, W64, AIFF and CAF, FLAC's
sample count (0 until written), the last Ogg page's end-of-stream flag, an MP3's
Xing/Info frame. A render that stalls longer than the settle time, half
written, is not taken for finished: the watcher says so once (`stalled`: "still
being written…") and waits; after `incomplete_grace` seconds unchanged it is sent
all the same, and the review says it is cut short. A streamed file
that says nothing of its length (an MP3 without a Xing/Info frame, a CAF whose
data size is "to the end") must stay unchanged for `headerless_settle`
seconds instead. Then a `session.exported` event is sent for it.

One export is one run however its writer stalls. The event_id is derived from
the file's path, size, modification time and content when it was first sent, so
a restart of the watcher sends the same id again, which agentbox answers as the
same export. A file touched, or written again, gets a new id, and agentbox
decides what it is by its bytes, as for every door (agentbox.review.renders):
the very bytes of its project's latest export are that export; those of an older
one a new export of the same audio.
A file that grows after it was sent, its earlier bytes unchanged, is the same
export written on (`Watcher.continues`): it is sent again under the same
event_id (a duplicate: still one run), and when that run's review turns out to
be of the shorter file, the whole file is reviewed again by a follow-up
`mix.review_requested` that names the run (`causation_id`). A file rewritten
from the start (a new export under the same name) is a new export. Files
already in the folder when it is first watched are left alone unless
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
it is done. The file also keeps every file the folder held as last seen, and
since when the folder is watched: at start, a file not seen and written since
(a render made while no watcher ran) is sent, once, oldest first.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentbox import portable
from agentbox.models import RunView
from agentbox.review.containers import audio_complete

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
    """The audio files in `folder` and its folders (not hidden ones), with their
    stamps. A symbolic link is one of them only if it resolves inside the folder:
    one that leads out of it (to another of the user's files, planted by whoever
    may write here) is skipped, and links to folders are not walked. Only regular
    files: reading a FIFO named like a render would wait for ever."""
    inside = os.path.realpath(folder)
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            path = Path(root, name)
            if name.startswith(".") or path.suffix.lower() not in AUDIO_SUFFIXES:
                continue
            if path.is_symlink() and not _resolves_inside(path, inside):
                continue
            try:
                found = path.stat()
            except OSError:
                continue  # gone meanwhile
            if stat.S_ISREG(found.st_mode):
                yield path, (found.st_size, found.st_mtime_ns)


def _resolves_inside(link: Path, inside: str) -> bool:
    target = os.path.realpath(link)
    return os.path.commonpath([target, inside]) == inside and target != inside


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


STATE_VERSION = 2  # 2: what the folder held (`seen`) and since when it is watched
READ_VERSIONS = (1, STATE_VERSION)  # a version 1 file is read: it knew neither


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
    # A file unchanged for `settle` but not finished is waited for: said once per file
    # until it is sent (a minute of silence reads as a watcher that missed it).
    stalled: Callable[[Path], None] = lambda path: None
    _seen: dict[Path, tuple[Stamp, float]] = field(default_factory=dict)  # stamp, since when
    _done: dict[Path, Stamp] = field(default_factory=dict)  # last stamp sent (or skipped)
    _exports: dict[Path, Export] = field(default_factory=dict)  # what was sent, per file
    _found: set[Path] = field(default_factory=set)  # being written, not yet sent
    _waiting: set[Path] = field(default_factory=set)  # stalled, said so, not yet sent
    # Every file the folder held as it was last done with (sent, or left alone), and
    # since when the folder is watched (ns, wall clock; None: not known, a state file
    # of version 1): at start, a file written since and not seen is new.
    _known: dict[Path, Stamp] = field(default_factory=dict)
    _since: int | None = None
    _started: bool = False
    _warned: bool = False

    def poll(self) -> list[Path]:
        """Files that have just finished being written (each once per change)."""
        now = self.clock()
        current = dict(audio_files(self.folder))
        if not self._started:
            self._started = True
            first = not self._loaded(current)
            if not self.include_existing:
                # Except a file sent before and changed since, or not yet handed over,
                # or found being written and not yet sent when the last watcher stopped,
                # or written while no watcher ran (not seen, and newer than the watch).
                self._done.update((path, stamp) for path, stamp in current.items()
                                  if first or self._settled(path, stamp))
            if self._since is None:  # the first watch (or one of a version 1 file)
                self._since = time.time_ns()
            self._known.update(self._done)
            self._save()
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
            elif unchanged >= self.settle:
                self._stalls(path)
        for path in set(self._seen) - set(current):
            del self._seen[path]
        self._waiting &= set(current)
        gone = set(self._exports) - set(current)
        for path in gone:
            del self._exports[path]  # gone: what comes under its name is a new export
        self._found &= set(current)
        forgotten = set(self._known) - set(current)
        for path in forgotten:
            del self._known[path]
        if gone or forgotten or self._found != found:
            self._save()
        return ready

    def _stalls(self, path: Path) -> None:
        """`path` settled but is not finished: waited for, and said so once."""
        if path not in self._waiting:
            self._waiting.add(path)
            self.stalled(path)

    def _settled(self, path: Path, stamp: Stamp) -> bool:
        """A file found at start that needs nothing: sent, handed over and unchanged
        since; or not sent, and either seen as it is or older than the watch (or the
        state does not say when the watch began)."""
        if path in self._found:
            return False
        earlier = self._exports.get(path)
        if earlier is not None:
            return earlier.taken and earlier.stamp == stamp
        return (self._since is None or self._known.get(path) == stamp
                or stamp[1] < self._since)

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
        """The export `path` was sent as, if it is that file unchanged, or written on
        since (it grew, its header filled in, and the bytes before its old end are
        unchanged); None for a file never sent, or one written again as a new export
        (the same size at a new time: a new render, even of the same audio)."""
        earlier = self._exports.get(path)
        if earlier is None:
            return None
        try:
            found = path.stat()
            size = found.st_size
            unchanged = (size, found.st_mtime_ns) == earlier.stamp
            same = unchanged or (size > earlier.size
                                 and tail_digest(path, earlier.size) == earlier.tail)
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
            self._known[path] = stamp[0]
        self._found.discard(path)
        self._waiting.discard(path)
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

    def _loaded(self, current: dict[Path, Stamp]) -> bool:
        """Read what an earlier watcher of this folder kept, of the files still here;
        False when none did (in memory only, or this folder's first watch)."""
        if self.state is None:
            return False
        try:
            kept = json.loads(self.state.read_text(encoding="utf-8"))
            if kept.get("version") not in READ_VERSIONS:
                raise ValueError("another version")
            found = {self.folder / name: Export.of_json(export)
                     for name, export in kept["exports"].items()}
            self._found = {self.folder / str(name) for name in kept.get("found", [])
                           } & set(current)
            since = kept.get("since")
            self._since = None if since is None else int(since)
            known = {self.folder / str(name): (int(stamp[0]), int(stamp[1]))
                     for name, stamp in kept.get("seen", {}).items()}
        except FileNotFoundError:
            return False
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
            self._trouble(f"{self.state} cannot be read ({type(exc).__name__}); starting "
                          "afresh: a file written on since it was sent may be sent as new")
            return False
        self._exports.update((p, e) for p, e in found.items() if p in current)
        self._known.update((p, stamp) for p, stamp in known.items() if p in current)
        return True

    def _save(self) -> None:
        if self.state is None:
            return
        kept = {"version": STATE_VERSION, "folder": str(self.folder.resolve()),
                "exports": {str(path.relative_to(self.folder)): export.as_json()
                            for path, export in sorted(self._exports.items())},
                "found": sorted(str(path.relative_to(self.folder)) for path in self._found),
                "since": self._since,
                "seen": {str(path.relative_to(self.folder)): list(stamp)
                         for path, stamp in sorted(self._known.items())}}
        try:
            portable.private_directory(self.state.parent)
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


def reviewed_whole(run: RunView, size: int) -> bool:
    """Whether a finished run's review read `size` bytes (the file as last sent)."""
    file = run.result.get("file") if isinstance(run.result, dict) else None
    read = file.get("size_bytes") if isinstance(file, dict) else None
    return run.status == "succeeded" and read == size


def follow_up_id(event_id: str, size: int) -> str:
    """The event_id of the review of the whole file, `size` bytes, of an export
    whose run read less of it: one per size, so sending it again is a duplicate."""
    return "watch-" + hashlib.sha256(f"{event_id}\0whole\0{size}".encode()).hexdigest()[:40]
